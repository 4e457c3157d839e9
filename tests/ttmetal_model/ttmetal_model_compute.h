/* ttmetal_model_compute.h — opgen's TT-Metal CPU model of the compute kernel API (0.81.1 spellings;
 * docs/ttmetal_model.md). Every api/compute/... header of the model includes this one file.
 *
 * One thread runs the whole compute kernel (the three TRISCs of silicon run the same code and each
 * ignores the others' calls; the model runs it once). DST holds 16 tiles of float; a tile is 1024
 * values in the 4-face layout of L1. Numerics (rule 6, documented, not checked against silicon):
 * FPU operands (add/sub/mul/bcast/reduce, and copy_tile unless UnpackToDestFp32 with fp32_dest_acc_en)
 * from a Float32 CB are truncated to TF32; Float16_b operands are exact; every value stored in DST is
 * rounded to bf16 (nearest even) unless fp32_dest_acc_en; SFPU ops compute in f32; pack_tile converts
 * to the CB's format (RNE). */
#ifndef OPGEN_TTMETAL_MODEL_COMPUTE_H
#define OPGEN_TTMETAL_MODEL_COMPUTE_H

#include <cstdint>
#include <string>

#include "ttmetal_model.h"

#ifndef DST_ACCUM_MODE
#define DST_ACCUM_MODE 0
#endif

using tt::DataFormat; /* the device headers' DataFormat is a global enum (tensix_types.h) */

namespace ckernel {
enum class PoolType : std::uint8_t { SUM, AVG, MAX, MIN };
enum class ReduceDim : std::uint8_t { REDUCE_ROW, REDUCE_COL, REDUCE_SCALAR };
enum class EltwiseBinaryType : std::uint8_t { ELWMUL, ELWDIV, ELWADD, ELWSUB };
enum class BroadcastType : std::uint8_t { NONE = 0, COL = 1, ROW = 2, SCALAR = 3 };
enum class VectorMode : std::uint8_t { None = 0, R = 1, C = 2, RC = 4, RC_custom = 6 };
enum class RsqrtMode { Default, Fast };
enum class SrcOrder : uint8_t { Regular = 0, Reverse = 1 };
enum class InputClamping : uint8_t { ClampToNegative = 1, None = 0 };
namespace p_sfpu {
constexpr std::uint32_t kCONST_1_FP16B = 0x3F80;
}
}  // namespace ckernel
using namespace ckernel;

namespace ttmodel {

/* the kernel line of an API call whose vendor signature has no call_line parameter: an explicit type, so a
 * stray extra integer argument does not compile (e.g. the removed 2-argument unary_bcast_init(icb, ocb)) */
struct CallLine {
    int v;
    explicit CallLine(int line) : v(line) {}
};

inline ComputeState &cstate(Thread &t, const char *fn) {
    if (!t.cs) fail(0, "model", "%s: a compute API called from a %s kernel", fn, role_name(t.role));
    return *t.cs;
}
/* a compute call other than CB calls: compute_kernel_hw_startup must have run (rule 5) */
inline ComputeState &started(Thread &t, const char *fn) {
    ComputeState &s = cstate(t, fn);
    if (!s.started) fail(5, "init", "%s before compute_kernel_hw_startup (it must be the first compute call)", fn);
    return s;
}
inline uint32_t tile_bytes(tt::DataFormat f) {
    switch (f) {
    case tt::DataFormat::Float32: return 4096;
    case tt::DataFormat::Float16_b: return 2048;
    default: fail(0, "model", "compute on CB format %s: the model computes with Float32 and Float16_b only", format_name(f));
    }
}
inline CB &tile_cb(Thread &t, uint32_t id, const char *fn) {
    CB &c = cb_of(t, id);
    if (c.page != tile_bytes(c.format))
        fail(1, "CB", "%s: CB %u holds %s tiles of %u B but its page size is %u B", fn, id, format_name(c.format),
             tile_bytes(c.format), c.page);
    return c;
}
/* tile `itile` of the pages waited for on CB `id` (rule 1: itile < waited) */
inline const uint8_t *in_tile(Thread &t, uint32_t id, uint32_t itile, const char *fn) {
    std::lock_guard<std::mutex> lk(t.core->m);
    CB &c = tile_cb(t, id, fn);
    if (itile >= c.waited) fail(1, "CB", "%s: tile %u of CB %u but only %u pages are waited for (cb_wait_front)", fn, itile, id, c.waited);
    return l1_ptr(c.rd_ptr() + itile * c.page);
}
inline float load(tt::DataFormat f, const uint8_t *p, uint32_t i) {
    if (f == tt::DataFormat::Float32) { float v; memcpy(&v, p + 4 * i, 4); return v; }
    uint16_t b;
    memcpy(&b, p + 2 * i, 2);
    return bf16_bits_to_f32(b);
}
inline void store(tt::DataFormat f, uint8_t *p, uint32_t i, float v) {
    if (f == tt::DataFormat::Float32) { memcpy(p + 4 * i, &v, 4); return; }
    uint16_t b = f32_to_bf16_bits(v);
    memcpy(p + 2 * i, &b, 2);
}
/* an FPU operand (SrcA/SrcB): TF32 for Float32 data [unchecked] */
inline float fpu_operand(tt::DataFormat f, const uint8_t *p, uint32_t i) {
    float v = load(f, p, i);
    return f == tt::DataFormat::Float32 ? trunc_tf32(v) : v;
}
inline float to_dst(const Core &c, float v) { return c.fp32_dest_acc ? v : round_bf16(v); }

/* a math op writing/reading DST[idst]: inside acquire..commit (rule 4), idst < capacity (rule 4) */
inline ComputeState &math(Thread &t, const char *fn, uint32_t idst) {
    ComputeState &s = started(t, fn);
    if (s.state != DST_ACQUIRED) fail(4, "DST protocol", "%s outside tile_regs_acquire ... tile_regs_commit", fn);
    if (idst >= t.core->dst_tiles())
        fail(4, "DST protocol", "%s: DST index %u out of range: DST holds %u tiles (%s, %s)", fn, idst, t.core->dst_tiles(),
             t.core->fp32_dest_acc ? "fp32_dest_acc_en" : "16-bit", t.core->dst_full_sync ? "full-sync" : "half-sync");
    return s;
}
inline void need_valid(Thread &t, ComputeState &s, uint32_t idst, const char *fn) {
    if (idst >= t.core->dst_tiles())
        fail(4, "DST protocol", "%s: DST index %u out of range: DST holds %u tiles", fn, idst, t.core->dst_tiles());
    if (!s.valid[idst]) fail(4, "DST protocol", "%s reads DST[%u], which was not written since tile_regs_acquire", fn, idst);
}
/* FPU init bookkeeping (rule 5) */
inline void fpu_init(Thread &t, const std::string &kind, uint32_t cb0, int cb1, const char *fn) {
    ComputeState &s = started(t, fn);
    if (s.tilize_active && kind != "tilize")
        fail(5, "init", "%s after tilize_init without tilize_uninit (the unpacker is still in tilize mode)", fn);
    s.fpu_init = kind;
    s.fpu_init_call = kind + "_init";
    s.fpu_cb = (int)cb0;
    s.fpu_cb1 = cb1;
    s.fpu_param = s.fpu_param2 = 0;
    s.fpu_ocb = -1;
    s.fpu_fmt[0] = cb_of(t, cb0).format;
    s.fpu_fmt[1] = cb1 >= 0 ? cb_of(t, (uint32_t)cb1).format : tt::DataFormat::Invalid;
    s.sfpu_init.clear();
}
inline void fpu_check(Thread &t, ComputeState &s, const std::string &kind, uint32_t cb0, int cb1, const char *fn) {
    if (s.fpu_init != kind)
        fail(5, "init", "%s needs %s_init since the last FPU init (the last one was %s)", fn, kind.c_str(),
             s.fpu_init.empty() ? "none" : s.fpu_init_call.c_str());
    tt::DataFormat f0 = cb_of(t, cb0).format, f1 = cb1 >= 0 ? cb_of(t, (uint32_t)cb1).format : tt::DataFormat::Invalid;
    if (f0 != s.fpu_fmt[0] || f1 != s.fpu_fmt[1])
        fail(5, "init", "%s: the CB data formats (%s, %s) differ from those of its %s_init (%s, %s)", fn, format_name(f0),
             cb1 >= 0 ? format_name(f1) : "-", kind.c_str(), format_name(s.fpu_fmt[0]),
             cb1 >= 0 ? format_name(s.fpu_fmt[1]) : "-");
}
inline void sfpu_init(Thread &t, const char *family, const char *fn) { started(t, fn).sfpu_init = family; }
inline ComputeState &sfpu(Thread &t, const char *family, const char *fn, uint32_t idst) {
    ComputeState &s = math(t, fn, idst);
    if (s.sfpu_init != family)
        fail(5, "init", "%s needs %s_init since the last FPU init or other SFPU init (the last SFPU init was %s)", fn, family,
             s.sfpu_init.empty() ? "none" : (s.sfpu_init + "_init").c_str());
    return s;
}

/* element-wise FPU ops, optional broadcast of B (dim: NONE / ROW = B's row 0 / COL = B's column 0 / SCALAR = B[0][0]) */
inline void fpu_binary(EltwiseBinaryType op, BroadcastType dim, uint32_t a, uint32_t b, uint32_t ia, uint32_t ib, uint32_t idst,
                       const std::string &kind, const char *fn, int line, uint32_t row_idx = 0) {
    Thread &t = self(line);
    ComputeState &s = math(t, fn, idst);
    fpu_check(t, s, kind, a, (int)b, fn);
    const uint8_t *pa = in_tile(t, a, ia, fn), *pb = in_tile(t, b, ib, fn);
    tt::DataFormat fa = cb_of(t, a).format, fb = cb_of(t, b).format;
    for (uint32_t r = 0; r < 32; r++)
        for (uint32_t c = 0; c < 32; c++) {
            uint32_t i = tile_index(r, c);
            uint32_t j = dim == BroadcastType::NONE ? i : dim == BroadcastType::ROW ? tile_index(row_idx, c)
                       : dim == BroadcastType::COL ? tile_index(r, 0) : tile_index(0, 0);
            float x = fpu_operand(fa, pa, i), y = fpu_operand(fb, pb, j);
            float v = op == EltwiseBinaryType::ELWADD ? x + y : op == EltwiseBinaryType::ELWSUB ? x - y : x * y;
            s.dst[idst][i] = to_dst(*t.core, v);
        }
    s.valid[idst] = true;
    s.from_reduce[idst] = false;
}
inline const char *op_name(EltwiseBinaryType op) {
    return op == EltwiseBinaryType::ELWADD ? "add" : op == EltwiseBinaryType::ELWSUB ? "sub" : op == EltwiseBinaryType::ELWMUL ? "mul" : "div";
}
inline std::string bcast_kind(EltwiseBinaryType op, BroadcastType dim) {
    return std::string(op_name(op)) + (dim == BroadcastType::ROW ? "_bcast_rows" : dim == BroadcastType::COL ? "_bcast_cols" : "_bcast_scalar");
}
inline void sfpu_unary(const char *family, const char *fn, uint32_t idst, int line, float (*f)(float, uint32_t), uint32_t param = 0) {
    Thread &t = self(line);
    ComputeState &s = sfpu(t, family, fn, idst);
    need_valid(t, s, idst, fn);
    for (uint32_t i = 0; i < kTileElems; i++) s.dst[idst][i] = to_dst(*t.core, f(s.dst[idst][i], param));
}
inline void sfpu_binary(const char *family, const char *fn, uint32_t i0, uint32_t i1, uint32_t o, int line, float (*f)(float, float)) {
    Thread &t = self(line);
    ComputeState &s = sfpu(t, family, fn, o);
    need_valid(t, s, i0, fn);
    need_valid(t, s, i1, fn);
    for (uint32_t i = 0; i < kTileElems; i++) s.dst[o][i] = to_dst(*t.core, f(s.dst[i0][i], s.dst[i1][i]));
    s.valid[o] = true;
    s.from_reduce[o] = false;
}

}  // namespace ttmodel

/* ---- startup, register protocol, pack ---- */
template <SrcOrder src_order = SrcOrder::Regular>
inline void compute_kernel_hw_startup(uint32_t icb0, uint32_t icb1, uint32_t ocb, int line = __builtin_LINE()) {
    ttmodel::Thread &t = ttmodel::self(line);
    ttmodel::ComputeState &s = ttmodel::cstate(t, "compute_kernel_hw_startup");
    ttmodel::cb_of(t, icb0), ttmodel::cb_of(t, icb1), ttmodel::cb_of(t, ocb);
    s.started = true;
}
inline void compute_kernel_hw_startup(uint32_t icb0, uint32_t ocb, int line = __builtin_LINE()) {
    compute_kernel_hw_startup(icb0, icb0, ocb, line);
}
inline void tile_regs_acquire(int line = __builtin_LINE()) {
    ttmodel::Thread &t = ttmodel::self(line);
    ttmodel::ComputeState &s = ttmodel::started(t, "tile_regs_acquire");
    if (s.state != ttmodel::DST_IDLE) ttmodel::fail(4, "DST protocol", "tile_regs_acquire before tile_regs_release of the previous section");
    s.state = ttmodel::DST_ACQUIRED;
    memset(s.dst, 0, sizeof s.dst); /* the packer leaves DST zeroed */
    for (int i = 0; i < 16; i++) s.valid[i] = s.from_reduce[i] = false;
}
inline void tile_regs_commit(int line = __builtin_LINE()) {
    ttmodel::Thread &t = ttmodel::self(line);
    ttmodel::ComputeState &s = ttmodel::started(t, "tile_regs_commit");
    if (s.state != ttmodel::DST_ACQUIRED) ttmodel::fail(4, "DST protocol", "tile_regs_commit without tile_regs_acquire");
    s.state = ttmodel::DST_COMMITTED;
}
inline void tile_regs_wait(int line = __builtin_LINE()) {
    ttmodel::Thread &t = ttmodel::self(line);
    ttmodel::ComputeState &s = ttmodel::started(t, "tile_regs_wait");
    if (s.state != ttmodel::DST_COMMITTED) ttmodel::fail(4, "DST protocol", "tile_regs_wait without tile_regs_commit");
    s.state = ttmodel::DST_WAITED;
}
inline void tile_regs_release(int line = __builtin_LINE()) {
    ttmodel::Thread &t = ttmodel::self(line);
    ttmodel::ComputeState &s = ttmodel::started(t, "tile_regs_release");
    if (s.state != ttmodel::DST_WAITED) ttmodel::fail(4, "DST protocol", "tile_regs_release without tile_regs_wait");
    s.state = ttmodel::DST_IDLE;
}
template <bool out_of_order_output = false, bool is_fp32_dest_acc_en = DST_ACCUM_MODE>
inline void pack_tile(uint32_t ifrom_dst, uint32_t icb, uint32_t output_tile_index = 0, int line = __builtin_LINE()) {
    using namespace ttmodel;
    Thread &t = self(line);
    ComputeState &s = started(t, "pack_tile");
    if (s.state != DST_WAITED) fail(4, "DST protocol", "pack_tile outside tile_regs_wait ... tile_regs_release");
    need_valid(t, s, ifrom_dst, "pack_tile");
    if (s.untilize_active)
        fail(5, "init", "pack_tile after pack_untilize_init without pack_untilize_uninit: the packer is still in untilize mode");
    if (s.reduce_mask >= 0 && !s.from_reduce[ifrom_dst])
        fail(5, "init", "pack_tile of DST[%u] (not a reduce result) after reduce_init without reduce_uninit: the packer still masks the reduce edge",
             ifrom_dst);
    uint8_t *p;
    tt::DataFormat f;
    {
        std::lock_guard<std::mutex> lk(t.core->m);
        CB &c = tile_cb(t, icb, "pack_tile");
        uint32_t pos = out_of_order_output ? output_tile_index : c.packed;
        if (pos >= c.reserved)
            fail(1, "CB", "pack_tile into position %u of CB %u but only %u pages are reserved (cb_reserve_back)", pos, icb, c.reserved);
        if (!out_of_order_output) c.packed++;
        p = l1_ptr(c.wr_ptr() + pos * c.page);
        f = c.format;
    }
    for (uint32_t r = 0; r < 32; r++)
        for (uint32_t cc = 0; cc < 32; cc++) {
            uint32_t i = tile_index(r, cc);
            float v = s.dst[ifrom_dst][i];
            if (s.reduce_mask == (int)ReduceDim::REDUCE_ROW && cc != 0) v = 0.0f;
            if (s.reduce_mask == (int)ReduceDim::REDUCE_COL && r != 0) v = 0.0f;
            store(f, p, i, v);
        }
}
inline void pack_init(uint32_t, int = __builtin_LINE()) {}

/* data-format reconfiguration: the model does not track unpacker/packer formats (docs: unchecked).
 * The 0.81.1 overloads: reconfig_data_format<SrcOrder>(a, b) / (a_old, a_new, b_old, b_new),
 * reconfig_data_format_src{a,b}(new) / (old, new), pack_reconfig_data_format(new) / (old, new). */
template <SrcOrder src_order = SrcOrder::Regular>
inline void reconfig_data_format(uint32_t, uint32_t) {}
template <SrcOrder src_order = SrcOrder::Regular>
inline void reconfig_data_format(uint32_t, uint32_t, uint32_t, uint32_t) {}
inline void reconfig_data_format_srca(uint32_t) {}
inline void reconfig_data_format_srca(uint32_t, uint32_t) {}
inline void reconfig_data_format_srcb(uint32_t) {}
inline void reconfig_data_format_srcb(uint32_t, uint32_t) {}
inline void pack_reconfig_data_format(uint32_t) {}
inline void pack_reconfig_data_format(uint32_t, uint32_t) {}

/* ---- copy ---- */
template <bool is_fp32_dest_acc_en = DST_ACCUM_MODE>
inline void copy_init(uint32_t cbid, uint32_t transpose = 0, uint32_t transpose_within_16x16_face = 0,
                      uint32_t call_line = __builtin_LINE()) {
    ttmodel::Thread &t = ttmodel::self((int)call_line);
    if (transpose || transpose_within_16x16_face) ttmodel::fail(0, "model", "copy_init with transpose is not modelled");
    ttmodel::fpu_init(t, "copy", cbid, -1, "copy_init");
}
inline void copy_tile(uint32_t in_cb_id, uint32_t in_tile_index, uint32_t dst_tile_index, int line = __builtin_LINE()) {
    using namespace ttmodel;
    Thread &t = self(line);
    ComputeState &s = math(t, "copy_tile", dst_tile_index);
    fpu_check(t, s, "copy", in_cb_id, -1, "copy_tile");
    const uint8_t *p = in_tile(t, in_cb_id, in_tile_index, "copy_tile");
    tt::DataFormat f = cb_of(t, in_cb_id).format;
    bool exact = t.core->fp32_dest_acc && t.core->unpack_to_dest_fp32[in_cb_id];
    for (uint32_t i = 0; i < kTileElems; i++) s.dst[dst_tile_index][i] = to_dst(*t.core, exact ? load(f, p, i) : fpu_operand(f, p, i));
    s.valid[dst_tile_index] = true;
    s.from_reduce[dst_tile_index] = false;
}

/* ---- unary broadcast (unpacker broadcast into DST; api/compute/bcast.h) ----
 * ROW: row 0 of the CB tile in every row; COL: column 0 in every column; SCALAR: element (0,0) everywhere;
 * NONE: a plain copy. A Float32 CB is unpacked straight to DST (the header's unpack-to-dest path for a
 * Float32 unpack destination format) and a Float16_b CB converts exactly, so no TF32 truncation here;
 * then DST's own rounding (bf16 unless fp32_dest_acc_en). Rule 5: unary_bcast<T>(cb, ...) needs
 * unary_bcast_init<T>(cb) as the last FPU/unpack init, same broadcast type and same CB. */
namespace ttmodel {
inline const char *bcast_type_name(BroadcastType b) {
    return b == BroadcastType::ROW ? "ROW" : b == BroadcastType::COL ? "COL" : b == BroadcastType::SCALAR ? "SCALAR" : "NONE";
}
inline std::string unary_bcast_kind(BroadcastType b) {
    return std::string("unary_bcast_") + (b == BroadcastType::ROW ? "row" : b == BroadcastType::COL ? "col"
                                          : b == BroadcastType::SCALAR ? "scalar" : "none");
}
}  // namespace ttmodel
template <BroadcastType bcast_type, bool is_fp32_dest_acc_en = DST_ACCUM_MODE>
inline void unary_bcast_init(uint32_t icb, ttmodel::CallLine line = ttmodel::CallLine(__builtin_LINE())) {
    using namespace ttmodel;
    Thread &t = self(line.v);
    fpu_init(t, unary_bcast_kind(bcast_type), icb, -1, "unary_bcast_init");
    char b[96];
    snprintf(b, sizeof b, "unary_bcast_init<%s>(%u)", bcast_type_name(bcast_type), icb);
    t.cs->fpu_init_call = b;
}
template <BroadcastType bcast_type, bool is_fp32_dest_acc_en = DST_ACCUM_MODE>
inline void unary_bcast(uint32_t icb, uint32_t in_tile_index, uint32_t dst_tile_index, ttmodel::CallLine line = ttmodel::CallLine(__builtin_LINE())) {
    using namespace ttmodel;
    Thread &t = self(line.v);
    char fn[64];
    snprintf(fn, sizeof fn, "unary_bcast<%s>", bcast_type_name(bcast_type));
    ComputeState &s = math(t, fn, dst_tile_index);
    if (s.fpu_init != unary_bcast_kind(bcast_type) || s.fpu_cb != (int)icb)
        fail(5, "init", "%s(%u, ...) needs unary_bcast_init<%s>(%u) as the last FPU init (the last one was %s)", fn, icb,
             bcast_type_name(bcast_type), icb, s.fpu_init.empty() ? "none" : s.fpu_init_call.c_str());
    fpu_check(t, s, unary_bcast_kind(bcast_type), icb, -1, fn); /* the CB data format of the init */
    const uint8_t *p = in_tile(t, icb, in_tile_index, fn);
    tt::DataFormat f = cb_of(t, icb).format;
    for (uint32_t r = 0; r < 32; r++)
        for (uint32_t c = 0; c < 32; c++) {
            uint32_t j = bcast_type == BroadcastType::ROW ? tile_index(0, c) : bcast_type == BroadcastType::COL ? tile_index(r, 0)
                       : bcast_type == BroadcastType::SCALAR ? tile_index(0, 0) : tile_index(r, c);
            s.dst[dst_tile_index][tile_index(r, c)] = to_dst(*t.core, load(f, p, j));
        }
    s.valid[dst_tile_index] = true;
    s.from_reduce[dst_tile_index] = false;
}
/* undoes the unpacker's broadcast mode: every later FPU op needs its own init again */
template <BroadcastType bcast_type>
inline void unary_bcast_uninit(uint32_t icb, ttmodel::CallLine line = ttmodel::CallLine(__builtin_LINE())) {
    using namespace ttmodel;
    Thread &t = self(line.v);
    ComputeState &s = started(t, "unary_bcast_uninit");
    cb_of(t, icb);
    s.fpu_init.clear();
    s.fpu_init_call.clear();
    s.fpu_cb = -1;
    s.sfpu_init.clear();
}

/* ---- element-wise binary (FPU) ---- */
inline void add_init(uint32_t a, uint32_t b, bool = false, uint32_t call_line = __builtin_LINE()) {
    ttmodel::fpu_init(ttmodel::self((int)call_line), "add", a, (int)b, "add_init");
}
inline void sub_init(uint32_t a, uint32_t b, bool = false, uint32_t call_line = __builtin_LINE()) {
    ttmodel::fpu_init(ttmodel::self((int)call_line), "sub", a, (int)b, "sub_init");
}
inline void mul_init(uint32_t a, uint32_t b, bool = true, uint32_t call_line = __builtin_LINE()) {
    ttmodel::fpu_init(ttmodel::self((int)call_line), "mul", a, (int)b, "mul_init");
}
#define OPGEN_TT_ELTWISE(NAME, OP)                                                                                           \
    template <bool is_fp32_dest_acc_en = DST_ACCUM_MODE>                                                                    \
    inline void NAME##_tiles(uint32_t icb0, uint32_t icb1, uint32_t itile0, uint32_t itile1, uint32_t idst,                  \
                             int line = __builtin_LINE()) {                                                                 \
        ttmodel::fpu_binary(EltwiseBinaryType::OP, BroadcastType::NONE, icb0, icb1, itile0, itile1, idst, #NAME,             \
                            #NAME "_tiles", line);                                                                          \
    }
OPGEN_TT_ELTWISE(add, ELWADD)
OPGEN_TT_ELTWISE(sub, ELWSUB)
OPGEN_TT_ELTWISE(mul, ELWMUL)
#undef OPGEN_TT_ELTWISE

/* ---- broadcast (FPU) ---- */
template <EltwiseBinaryType op, BroadcastType dim>
inline void bcast_init(uint32_t a, uint32_t b, uint32_t call_line = __builtin_LINE()) {
    ttmodel::fpu_init(ttmodel::self((int)call_line), ttmodel::bcast_kind(op, dim), a, (int)b, "bcast_init");
}
#define OPGEN_TT_BCAST(NAME, OP, DIMNAME, DIM)                                                                               \
    inline void NAME##_bcast_##DIMNAME##_init(uint32_t icb0, uint32_t icb1, uint32_t call_line = __builtin_LINE()) {          \
        ttmodel::fpu_init(ttmodel::self((int)call_line), #NAME "_bcast_" #DIMNAME, icb0, (int)icb1,                          \
                          #NAME "_bcast_" #DIMNAME "_init");                                                                \
    }
#define OPGEN_TT_BCAST_TILES(NAME, OP, DIMNAME, DIM)                                                                         \
    template <bool is_fp32_dest_acc_en = DST_ACCUM_MODE>                                                                    \
    inline void NAME##_tiles_bcast_##DIMNAME(uint32_t icb0, uint32_t icb1, uint32_t itile0, uint32_t itile1, uint32_t idst,  \
                                             int line = __builtin_LINE()) {                                                 \
        ttmodel::fpu_binary(EltwiseBinaryType::OP, BroadcastType::DIM, icb0, icb1, itile0, itile1, idst,                     \
                            #NAME "_bcast_" #DIMNAME, #NAME "_tiles_bcast_" #DIMNAME, line);                                \
    }
#define OPGEN_TT_BCAST_ALL(NAME, OP)                                                                                         \
    OPGEN_TT_BCAST(NAME, OP, rows, ROW)                                                                                      \
    OPGEN_TT_BCAST(NAME, OP, cols, COL)                                                                                      \
    OPGEN_TT_BCAST(NAME, OP, scalar, SCALAR)                                                                                 \
    OPGEN_TT_BCAST_TILES(NAME, OP, cols, COL)                                                                                \
    OPGEN_TT_BCAST_TILES(NAME, OP, scalar, SCALAR)                                                                           \
    template <bool is_fp32_dest_acc_en = DST_ACCUM_MODE>                                                                    \
    inline void NAME##_tiles_bcast_rows(uint32_t icb0, uint32_t icb1, uint32_t itile0, uint32_t itile1, uint32_t idst,       \
                                        uint32_t bcast_row_idx = 0, int line = __builtin_LINE()) {                          \
        ttmodel::fpu_binary(EltwiseBinaryType::OP, BroadcastType::ROW, icb0, icb1, itile0, itile1, idst,                     \
                            #NAME "_bcast_rows", #NAME "_tiles_bcast_rows", line, bcast_row_idx);                           \
    }                                                                                                                       \
    template <BroadcastType dim, bool is_fp32_dest_acc_en = DST_ACCUM_MODE>                                                 \
    inline void NAME##_tiles_bcast(uint32_t icb0, uint32_t icb1, uint32_t itile0, uint32_t itile1, uint32_t idst,            \
                                   int line = __builtin_LINE()) {                                                           \
        ttmodel::fpu_binary(EltwiseBinaryType::OP, dim, icb0, icb1, itile0, itile1, idst,                                    \
                            ttmodel::bcast_kind(EltwiseBinaryType::OP, dim), #NAME "_tiles_bcast", line);                   \
    }
OPGEN_TT_BCAST_ALL(add, ELWADD)
OPGEN_TT_BCAST_ALL(sub, ELWSUB)
OPGEN_TT_BCAST_ALL(mul, ELWMUL)
#undef OPGEN_TT_BCAST_ALL
#undef OPGEN_TT_BCAST_TILES
#undef OPGEN_TT_BCAST

/* ---- reduce (FPU): SUM over rows (result in column 0) or columns (result in row 0), times the scaler ---- */
template <PoolType reduce_type, ReduceDim reduce_dim, bool is_fp32_dest_acc_en = DST_ACCUM_MODE>
inline void reduce_init(uint32_t icb, uint32_t icb_scaler, uint32_t ocb, uint32_t call_line = __builtin_LINE()) {
    ttmodel::Thread &t = ttmodel::self((int)call_line);
    static_assert(reduce_type == PoolType::SUM, "opgen TT model: reduce models PoolType::SUM only");
    static_assert(reduce_dim != ReduceDim::REDUCE_SCALAR, "opgen TT model: reduce models REDUCE_ROW and REDUCE_COL only");
    ttmodel::cb_of(t, ocb);
    ttmodel::fpu_init(t, reduce_dim == ReduceDim::REDUCE_ROW ? "reduce_sum_row" : "reduce_sum_col", icb, (int)icb_scaler, "reduce_init");
    t.cs->reduce_mask = (int)reduce_dim;
}
inline void reduce_uninit(uint32_t = 0, int line = __builtin_LINE()) {
    ttmodel::Thread &t = ttmodel::self(line);
    ttmodel::started(t, "reduce_uninit").reduce_mask = -1;
}
template <PoolType reduce_type, ReduceDim reduce_dim, bool is_fp32_dest_acc_en = DST_ACCUM_MODE>
inline void reduce_tile(uint32_t icb, uint32_t icb_scaler, uint32_t itile, uint32_t itile_scaler, uint32_t idst,
                        int line = __builtin_LINE()) {
    using namespace ttmodel;
    Thread &t = self(line);
    ComputeState &s = math(t, "reduce_tile", idst);
    const bool row = reduce_dim == ReduceDim::REDUCE_ROW;
    fpu_check(t, s, row ? "reduce_sum_row" : "reduce_sum_col", icb, (int)icb_scaler, "reduce_tile");
    const uint8_t *pa = in_tile(t, icb, itile, "reduce_tile"), *ps = in_tile(t, icb_scaler, itile_scaler, "reduce_tile");
    tt::DataFormat fa = cb_of(t, icb).format;
    float scaler = fpu_operand(cb_of(t, icb_scaler).format, ps, 0); /* element (0,0) [unchecked: silicon uses row 0 of each face] */
    bool first = !s.from_reduce[idst];
    for (uint32_t k = 0; k < 32; k++) {
        float acc = 0.0f;
        for (uint32_t j = 0; j < 32; j++) acc += fpu_operand(fa, pa, row ? tile_index(k, j) : tile_index(j, k)) * scaler;
        uint32_t o = row ? tile_index(k, 0) : tile_index(0, k);
        s.dst[idst][o] = to_dst(*t.core, s.dst[idst][o] + acc); /* DST accumulates (zero after acquire) */
    }
    if (first) /* outside the result column/row DST holds no defined value: NaN */
        for (uint32_t r = 0; r < 32; r++)
            for (uint32_t c = 0; c < 32; c++)
                if (row ? c != 0 : r != 0) s.dst[idst][tile_index(r, c)] = NAN;
    s.valid[idst] = true;
    s.from_reduce[idst] = true;
}

/* ---- SFPU unary ---- */
template <bool legacy = false, bool fast = false>
inline void rsqrt_tile_init(int line = __builtin_LINE()) { ttmodel::sfpu_init(ttmodel::self(line), "rsqrt_tile", "rsqrt_tile_init"); }
template <RsqrtMode mode = RsqrtMode::Default, bool is_fp32_dest_acc_en = DST_ACCUM_MODE>
inline void rsqrt_tile(uint32_t idst, int line = __builtin_LINE()) {
    ttmodel::sfpu_unary("rsqrt_tile", "rsqrt_tile", idst, line, [](float x, uint32_t) { return 1.0f / sqrtf(x); });
}
template <bool legacy = false>
inline void recip_tile_init(int line = __builtin_LINE()) { ttmodel::sfpu_init(ttmodel::self(line), "recip_tile", "recip_tile_init"); }
template <bool legacy = false>
inline void recip_tile(uint32_t idst, VectorMode = VectorMode::RC, int line = __builtin_LINE()) {
    ttmodel::sfpu_unary("recip_tile", "recip_tile", idst, line, [](float x, uint32_t) { return 1.0f / x; });
}
inline void binop_with_scalar_tile_init(int line = __builtin_LINE()) {
    ttmodel::sfpu_init(ttmodel::self(line), "binop_with_scalar_tile", "binop_with_scalar_tile_init");
}
#define OPGEN_TT_UNARY_SCALAR(NAME, EXPR)                                                                                    \
    inline void NAME##_unary_tile(uint32_t idst, uint32_t param1, int line = __builtin_LINE()) {                             \
        ttmodel::sfpu_unary("binop_with_scalar_tile", #NAME "_unary_tile", idst, line, [](float x, uint32_t p) {             \
            float s = ttmodel::bits_f32(p);                                                                                 \
            return EXPR;                                                                                                    \
        }, param1);                                                                                                         \
    }
OPGEN_TT_UNARY_SCALAR(add, x + s)
OPGEN_TT_UNARY_SCALAR(sub, x - s)
OPGEN_TT_UNARY_SCALAR(mul, x * s)
OPGEN_TT_UNARY_SCALAR(div, x / s)
OPGEN_TT_UNARY_SCALAR(rsub, s - x)
#undef OPGEN_TT_UNARY_SCALAR
inline void fill_tile_init(int line = __builtin_LINE()) { ttmodel::sfpu_init(ttmodel::self(line), "fill_tile", "fill_tile_init"); }
inline void fill_tile_bitcast(uint32_t idst, uint32_t bits, int line = __builtin_LINE()) {
    using namespace ttmodel;
    Thread &t = self(line);
    ComputeState &s = sfpu(t, "fill_tile", "fill_tile", idst);
    for (uint32_t i = 0; i < kTileElems; i++) s.dst[idst][i] = to_dst(*t.core, bits_f32(bits));
    s.valid[idst] = true;
    s.from_reduce[idst] = false;
}
inline void fill_tile(uint32_t idst, float param0, int line = __builtin_LINE()) { fill_tile_bitcast(idst, ttmodel::f32_bits(param0), line); }

/* exp (api/compute/eltwise_unary/exp.h): expf in f32; with scale_en the input is first multiplied by the
 * bf16 `scale`. approx and input_clamping are ignored (the exact path); iterations must be 8 and the
 * vector mode RC (the whole tile) */
template <bool approx = false, uint32_t scale = 0x3F800000, InputClamping input_clamping = InputClamping::ClampToNegative,
          bool is_fp32_dest_acc_en = DST_ACCUM_MODE>
inline void exp_tile_init(ttmodel::CallLine line = ttmodel::CallLine(__builtin_LINE())) { ttmodel::sfpu_init(ttmodel::self(line.v), "exp_tile", "exp_tile_init"); }
template <bool approx = false, bool scale_en = false, InputClamping input_clamping = InputClamping::ClampToNegative,
          int iterations = 8, bool is_fp32_dest_acc_en = DST_ACCUM_MODE>
inline void exp_tile(uint32_t idst, VectorMode vector_mode = VectorMode::RC, uint16_t scale = p_sfpu::kCONST_1_FP16B,
                     ttmodel::CallLine line = ttmodel::CallLine(__builtin_LINE())) {
    static_assert(iterations == 8, "opgen TT model: exp_tile models iterations = 8 (the whole tile) only");
    if (vector_mode != VectorMode::RC) {
        ttmodel::self(line.v);
        ttmodel::fail(0, "model", "exp_tile with a vector mode other than VectorMode::RC is not modelled");
    }
    ttmodel::sfpu_unary("exp_tile", "exp_tile", idst, line.v, [](float x, uint32_t sc) {
        return expf(scale_en ? x * ttmodel::bf16_bits_to_f32((uint16_t)sc) : x);
    }, scale);
}

/* mask (api/compute/mask.h): DST[d] = 0 where the mask DST[d+1] is 0 (+0 or -0), else unchanged: a select,
 * so NaN/inf data under a zero mask become 0. The hardware takes the mask from DST[d+1] whatever
 * idst2_mask says, so the model aborts unless idst2_mask == d+1. Only Float16_b/Float16 (the float compare)
 * are modelled: the 0.81.1 header does nothing at all for DataFormat::Float32, so that aborts too. */
inline void mask_tile_init(ttmodel::CallLine line = ttmodel::CallLine(__builtin_LINE())) { ttmodel::sfpu_init(ttmodel::self(line.v), "mask_tile", "mask_tile_init"); }
inline void mask_tile(uint32_t idst_data, uint32_t idst2_mask, DataFormat data_format = DataFormat::Float16_b,
                      ttmodel::CallLine line = ttmodel::CallLine(__builtin_LINE())) {
    using namespace ttmodel;
    Thread &t = self(line.v);
    ComputeState &s = sfpu(t, "mask_tile", "mask_tile", idst_data);
    if (idst2_mask != idst_data + 1)
        fail(0, "model", "mask_tile(%u, %u): the hardware reads the mask from DST[%u] (idst_data + 1) and ignores idst2_mask; "
             "put the mask in DST[%u] and pass %u", idst_data, idst2_mask, idst_data + 1, idst_data + 1, idst_data + 1);
    if (data_format != DataFormat::Float16_b && data_format != DataFormat::Float16)
        fail(0, "model", "mask_tile with data_format %s: the model handles Float16_b/Float16 (the 0.81.1 header does nothing "
             "for Float32 and an integer compare for Int32)", format_name(data_format));
    need_valid(t, s, idst_data, "mask_tile");
    need_valid(t, s, idst2_mask, "mask_tile");
    for (uint32_t i = 0; i < kTileElems; i++)
        if (s.dst[idst2_mask][i] == 0.0f) s.dst[idst_data][i] = 0.0f;
}

/* ---- SFPU binary (DST op DST -> DST, f32) ---- */
#define OPGEN_TT_SFPU_BINARY(NAME, EXPR)                                                                                     \
    inline void NAME##_binary_tile_init(int line = __builtin_LINE()) {                                                       \
        ttmodel::sfpu_init(ttmodel::self(line), #NAME "_binary_tile", #NAME "_binary_tile_init");                            \
    }                                                                                                                       \
    inline void NAME##_binary_tile(uint32_t idst0, uint32_t idst1, uint32_t odst, int line = __builtin_LINE()) {             \
        ttmodel::sfpu_binary(#NAME "_binary_tile", #NAME "_binary_tile", idst0, idst1, odst, line,                           \
                             [](float x, float y) { return EXPR; });                                                        \
    }
OPGEN_TT_SFPU_BINARY(add, x + y)
OPGEN_TT_SFPU_BINARY(sub, x - y)
OPGEN_TT_SFPU_BINARY(mul, x * y)
OPGEN_TT_SFPU_BINARY(div, x / y)
OPGEN_TT_SFPU_BINARY(rsub, y - x)
/* f32 comparisons (calculate_binary_comp_fp32): 1.0 where x P y holds, else 0.0; NaN holds for ne
 * only; a subnormal compares as a zero of its sign (the kernels reject |x| + |y| == 0 first) */
OPGEN_TT_SFPU_BINARY(eq, ttmodel::flush(x) == ttmodel::flush(y) ? 1.0f : 0.0f)
OPGEN_TT_SFPU_BINARY(ne, ttmodel::flush(x) == ttmodel::flush(y) ? 0.0f : 1.0f)
OPGEN_TT_SFPU_BINARY(lt, ttmodel::flush(x) < ttmodel::flush(y) ? 1.0f : 0.0f)
OPGEN_TT_SFPU_BINARY(gt, ttmodel::flush(x) > ttmodel::flush(y) ? 1.0f : 0.0f)
OPGEN_TT_SFPU_BINARY(le, ttmodel::flush(x) <= ttmodel::flush(y) ? 1.0f : 0.0f)
OPGEN_TT_SFPU_BINARY(ge, ttmodel::flush(x) >= ttmodel::flush(y) ? 1.0f : 0.0f)
#undef OPGEN_TT_SFPU_BINARY

/* ---- more SFPU unary ops (api/compute/compute_kernel_api.h, eltwise_unary/{sqrt,negative}.h) ----
 * Exact f32 libm results: silicon's SFPU computes sigmoid/tanh/log/sqrt with approximations whose
 * accuracy the model does not reproduce [unchecked]. */
namespace ttmodel {
inline void unary_init(const char *op, int line) {
    std::string f = std::string(op) + "_tile";
    sfpu_init(self(line), op == std::string("sigmoid") ? "sigmoid_tile" : op == std::string("tanh") ? "tanh_tile"
                          : op == std::string("log") ? "log_tile" : op == std::string("sqrt") ? "sqrt_tile"
                          : op == std::string("negative") ? "negative_tile" : op == std::string("erf") ? "erf_tile"
                          : "abs_tile", (f + "_init").c_str());
}
}  // namespace ttmodel
template <bool fast_and_approx = false>
inline void sigmoid_tile_init(int line = __builtin_LINE()) { ttmodel::unary_init("sigmoid", line); }
template <VectorMode vec_mode = VectorMode::RC, bool fast_and_approx = false, bool is_fp32_dest_acc_en = DST_ACCUM_MODE>
inline void sigmoid_tile(uint32_t idst, int line = __builtin_LINE()) {
    ttmodel::sfpu_unary("sigmoid_tile", "sigmoid_tile", idst, line, [](float x, uint32_t) { return 1.0f / (1.0f + expf(-x)); });
}
template <bool fast_and_approx = false, bool is_fp32_dest_acc_en = DST_ACCUM_MODE>
inline void tanh_tile_init(int line = __builtin_LINE()) { ttmodel::unary_init("tanh", line); }
template <bool fast_and_approx = false, bool is_fp32_dest_acc_en = DST_ACCUM_MODE>
inline void tanh_tile(uint32_t idst, int line = __builtin_LINE()) {
    ttmodel::sfpu_unary("tanh_tile", "tanh_tile", idst, line, [](float x, uint32_t) { return tanhf(x); });
}
/* erf (api/compute/eltwise_unary/erf_erfc.h): erff in f32. The header's default is the fast
 * approximation; opgen asks for the accurate one (<false>), and the model refuses the other. */
template <bool fast_and_approx = true>
inline void erf_tile_init(int line = __builtin_LINE()) {
    static_assert(!fast_and_approx, "opgen uses the accurate erf (erf_tile_init<false>)");
    ttmodel::unary_init("erf", line);
}
template <bool fast_and_approx = true>
inline void erf_tile(uint32_t idst, int line = __builtin_LINE()) {
    static_assert(!fast_and_approx, "opgen uses the accurate erf (erf_tile<false>)");
    ttmodel::sfpu_unary("erf_tile", "erf_tile", idst, line, [](float x, uint32_t) { return erff(x); });
}
template <bool fast_and_approx = false, bool is_fp32_dest_acc_en = DST_ACCUM_MODE>
inline void log_tile_init(int line = __builtin_LINE()) { ttmodel::unary_init("log", line); }
template <bool fast_and_approx = false, bool is_fp32_dest_acc_en = DST_ACCUM_MODE>
inline void log_tile(uint32_t idst, int line = __builtin_LINE()) {
    ttmodel::sfpu_unary("log_tile", "log_tile", idst, line, [](float x, uint32_t) { return logf(x); });
}
inline void sqrt_tile_init(int line = __builtin_LINE()) { ttmodel::unary_init("sqrt", line); }
inline void sqrt_tile(uint32_t idst, int line = __builtin_LINE()) {
    ttmodel::sfpu_unary("sqrt_tile", "sqrt_tile", idst, line, [](float x, uint32_t) { return sqrtf(x); });
}
inline void negative_tile_init(int line = __builtin_LINE()) { ttmodel::unary_init("negative", line); }
inline void negative_tile(uint32_t idst, int line = __builtin_LINE()) {
    ttmodel::sfpu_unary("negative_tile", "negative_tile", idst, line, [](float x, uint32_t) { return -x; });
}
inline void abs_tile_init(int line = __builtin_LINE()) { ttmodel::unary_init("abs", line); }
inline void abs_tile(uint32_t idst, int line = __builtin_LINE()) {
    ttmodel::sfpu_unary("abs_tile", "abs_tile", idst, line, [](float x, uint32_t) { return fabsf(x); });
}

/* ---- comparisons with zero (api/compute/eltwise_unary/comp.h): 1.0 where x == 0 (eqz) or x != 0
 * (nez), else 0.0; +-0 are zero; NaN is not (the 0.81.1 kernels test |x| == 0) */
inline void eqz_tile_init(int line = __builtin_LINE()) { ttmodel::sfpu_init(ttmodel::self(line), "eqz_tile", "eqz_tile_init"); }
inline void eqz_tile(uint32_t idst, int line = __builtin_LINE()) {
    ttmodel::sfpu_unary("eqz_tile", "eqz_tile", idst, line, [](float x, uint32_t) { return x == 0.0f ? 1.0f : 0.0f; });
}
inline void nez_tile_init(int line = __builtin_LINE()) { ttmodel::sfpu_init(ttmodel::self(line), "nez_tile", "nez_tile_init"); }
inline void nez_tile(uint32_t idst, int line = __builtin_LINE()) {
    ttmodel::sfpu_unary("nez_tile", "nez_tile", idst, line, [](float x, uint32_t) { return x == 0.0f ? 0.0f : 1.0f; });
}

/* ---- where (api/compute/eltwise_unary/where.h): DST[odst] = DST[c] != 0 ? DST[a] : DST[b], bits
 * moved, not computed (NaN and inf pass through). The header takes Float32, Float16_b, Int32 and
 * UInt32; the model, holding DST as f32, takes the float formats (Float32 needs fp32_dest_acc_en). */
inline void where_tile_init(int line = __builtin_LINE()) { ttmodel::sfpu_init(ttmodel::self(line), "where_tile", "where_tile_init"); }
template <DataFormat data_format>
inline void where_tile(uint32_t idst0, uint32_t idst1, uint32_t idst2, uint32_t odst, int line = __builtin_LINE()) {
    using namespace ttmodel;
    static_assert(data_format == DataFormat::Float32 || data_format == DataFormat::Float16_b,
                  "opgen TT model: where_tile models the float formats (Float32, Float16_b)");
    Thread &t = self(line);
    ComputeState &s = sfpu(t, "where_tile", "where_tile", odst);
    if (data_format == DataFormat::Float32 && !t.core->fp32_dest_acc)
        fail(0, "model", "where_tile<DataFormat::Float32> on a 16-bit DST (the kernel's fp32_dest_acc_en is off)");
    need_valid(t, s, idst0, "where_tile");
    need_valid(t, s, idst1, "where_tile");
    need_valid(t, s, idst2, "where_tile");
    for (uint32_t i = 0; i < kTileElems; i++)
        s.dst[odst][i] = s.dst[idst0][i] != 0.0f ? s.dst[idst1][i] : s.dst[idst2][i];
    s.valid[odst] = true;
    s.from_reduce[odst] = false;
}

/* ---- DST -> DST copy (api/compute/copy_dest_values.h) ---- */
inline void copy_dest_values_init(int line = __builtin_LINE()) {
    ttmodel::sfpu_init(ttmodel::self(line), "copy_dest_values", "copy_dest_values_init");
}
template <DataFormat DATA_FORMAT>
inline void copy_dest_values(uint32_t idst_in, uint32_t idst_out, int line = __builtin_LINE()) {
    ttmodel::sfpu_binary("copy_dest_values", "copy_dest_values", idst_in, idst_in, idst_out, line,
                         [](float x, float) { return x; });
}

/* ---- bitwise AND with a scalar on the 32 bits of each DST element (eltwise_unary/bitwise.h) ----
 * [unchecked] the vendor documents integer inputs; on f32 DST data the model ANDs the IEEE bits
 * (the kernels use it to clear low mantissa bits: any result with them cleared, whatever the sign
 * handling, is what they need). */
inline void bitwise_and_tile_init(int line = __builtin_LINE()) {
    ttmodel::sfpu_init(ttmodel::self(line), "bitwise_and_tile", "bitwise_and_tile_init");
}
template <DataFormat data_format>
inline void bitwise_and_tile(uint32_t idst, uint32_t param0, int line = __builtin_LINE()) {
    static_assert(data_format == DataFormat::Int32 || data_format == DataFormat::UInt32 || data_format == DataFormat::UInt16,
                  "bitwise_and_tile: integer data formats only");
    ttmodel::sfpu_unary("bitwise_and_tile", "bitwise_and_tile", idst, line,
                        [](float x, uint32_t p) { return ttmodel::bits_f32(ttmodel::f32_bits(x) & p); }, param0);
}

/* ==== CB tile addresses and values for the compute kernel (api/compute/cb_api.h) ====
 * 0.81.1: get_tile_address(cb, i) = (fifo_rd_ptr + fifo_page_size * i) << 4, the plain byte address of tile i of
 * the front (no header), and read_tile_value(cb, i, k) = the uint32_t at that address + 4 * k; UNPACK reads them and
 * hands them to MATH and PACK through the mailboxes. The model allows them only on a tile the compute kernel waited
 * for (cb_wait_front, not yet popped). */
namespace ttmodel {
inline uint32_t front_tile_addr(Thread &t, uint32_t cb, uint32_t itile, const char *fn) {
    cstate(t, fn);
    std::lock_guard<std::mutex> lk(t.core->m);
    CB &c = cb_of(t, cb);
    if (itile >= c.waited || c.waiter != COMPUTE)
        fail(1, "CB", "%s(%u, %u): tile %u of CB %u but the compute kernel waited for only %u pages (cb_wait_front, not yet popped)",
             fn, cb, itile, itile, cb, c.waiter == COMPUTE ? c.waited : 0);
    return c.rd_ptr() + itile * c.page;
}
}  // namespace ttmodel
inline uint32_t get_tile_address(uint32_t cb_id, uint32_t tile_index, ttmodel::CallLine line = ttmodel::CallLine(__builtin_LINE())) {
    return ttmodel::front_tile_addr(ttmodel::self(line.v), cb_id, tile_index, "get_tile_address");
}
inline uint32_t read_tile_value(uint32_t cb_id, uint32_t tile_index, uint32_t element_offset,
                                ttmodel::CallLine line = ttmodel::CallLine(__builtin_LINE())) {
    using namespace ttmodel;
    Thread &t = self(line.v);
    uint32_t a = front_tile_addr(t, cb_id, tile_index, "read_tile_value");
    uint32_t page = cb_of(t, cb_id).page;
    if ((uint64_t)element_offset * 4 + 4 > page)
        fail(0, "model", "read_tile_value(%u, %u, %u): uint32_t element %u lies outside the %u-B page", cb_id, tile_index,
             element_offset, element_offset, page);
    uint32_t v;
    memcpy(&v, l1_ptr(a + 4 * element_offset), 4);
    return v;
}

/* ==== row reshuffle (api/compute/reshuffle.h; LLK ckernel_sfpu_reshuffle_rows.h, wormhole_b0) ====
 * reshuffle_rows_tile(idst, idx_addr): the SFPU scatter-add of the rows of DST[idst] into DST[idst + 1]:
 *     for row = 0 .. 31 in order: d = L1 byte at idx_addr + 16 + row; if d >= 32 skip (the vendor writes 255);
 *                                  else DST[idst+1] row d += DST[idst] row `row` (all 32 columns, both faces)
 * The LLK skips a 16-B "tile header" (idx_addr + 16) that CB pages do not have, so kernels pass
 * get_tile_address(cb, 0) - 16. DST[idst+1] is not cleared; each add is an f32 add (SFPADD of 1.0 * in + out) stored
 * back to DST (rounded to bf16 unless fp32_dest_acc_en [unchecked: SFPSTORE rounding]), so rows mapping to the same
 * destination accumulate in increasing source-row order. The 32 bytes must lie in a CB page the compute kernel
 * holds (cb_wait_front, not yet popped): rule 1. */
inline void reshuffle_rows_tile_init(ttmodel::CallLine line = ttmodel::CallLine(__builtin_LINE())) {
    ttmodel::sfpu_init(ttmodel::self(line.v), "reshuffle_rows_tile", "reshuffle_rows_tile_init");
}
inline void reshuffle_rows_tile(uint32_t idst, uint32_t idx_addr, ttmodel::CallLine line = ttmodel::CallLine(__builtin_LINE())) {
    using namespace ttmodel;
    Thread &t = self(line.v);
    ComputeState &s = sfpu(t, "reshuffle_rows_tile", "reshuffle_rows_tile", idst);
    const uint32_t out = idst + 1;
    if (out >= t.core->dst_tiles())
        fail(4, "DST protocol", "reshuffle_rows_tile(%u, ...) writes DST[%u] (idst + 1), out of range: DST holds %u tiles (%s, %s)", idst,
             out, t.core->dst_tiles(), t.core->fp32_dest_acc ? "fp32_dest_acc_en" : "16-bit",
             t.core->dst_full_sync ? "full-sync" : "half-sync");
    need_valid(t, s, idst, "reshuffle_rows_tile");
    need_valid(t, s, out, "reshuffle_rows_tile");
    const uint64_t lo = (uint64_t)idx_addr + 16, hi = lo + 32;
    bool held = false;
    {
        std::lock_guard<std::mutex> lk(t.core->m);
        for (const CB &c : t.core->cbs)
            if (c.configured && c.waited && c.waiter == COMPUTE && lo >= c.rd_ptr() &&
                hi <= (uint64_t)c.rd_ptr() + (uint64_t)c.waited * c.page)
                held = true;
    }
    if (!held)
        fail(1, "CB", "reshuffle_rows_tile(%u, 0x%x): the LLK reads the 32 mask bytes at idx_addr + 16 = [0x%llx, 0x%llx), which is not inside "
             "a CB page the compute kernel waited for (cb_wait_front, not yet popped); pass get_tile_address(cb, i) - 16", idst, idx_addr,
             (unsigned long long)lo, (unsigned long long)hi);
    uint8_t mask[32];
    memcpy(mask, l1_ptr((uint32_t)lo), 32);
    for (uint32_t row = 0; row < 32; row++) {
        const uint32_t d = mask[row];
        if (d >= 32) continue;
        for (uint32_t c = 0; c < 32; c++) {
            float &o = s.dst[out][tile_index(d, c)];
            o = to_dst(*t.core, o + s.dst[idst][tile_index(row, c)]);
        }
    }
    s.valid[out] = true;
    s.from_reduce[out] = false;
}

/* ==== matmul (api/compute/matmul.h) ====
 * matmul_init(in0, in1, transpose = 0): in0 -> SrcB, in1 -> SrcA (compute_kernel_hw_startup<SrcOrder::Reverse> is
 * the vendor's documented startup for matmul kernels; the model does not check it). transpose != 0 transposes each
 * in1 tile (within-face transpose by the unpacker plus faces 1 and 2 swapped by the math MOP: the full 32x32
 * transpose). matmul_tiles(in0, in1, i0, i1, idst): DST[idst] += A x B (B^T when transposed), A = tile i0 of in0,
 * B = tile i1 of in1, operands as the other FPU ops (TF32 from Float32 CBs). Each output element: for each half of
 * the inner dimension (k in 0..15, then 16..31: one MVMUL per inner face) the 16 products are summed in order in f32
 * and added into DST, rounded by DST (bf16 unless fp32_dest_acc_en) [unchecked: the FPU's internal dot-product
 * precision; HiFi4 is taken as exact]. */
inline void matmul_init(uint32_t in0_cb_id, uint32_t in1_cb_id, const uint32_t transpose = 0, uint32_t call_line = __builtin_LINE()) {
    using namespace ttmodel;
    Thread &t = self((int)call_line);
    fpu_init(t, "matmul", in0_cb_id, (int)in1_cb_id, "matmul_init");
    char b[96];
    snprintf(b, sizeof b, "matmul_init(%u, %u, %u)", in0_cb_id, in1_cb_id, transpose);
    t.cs->fpu_init_call = b;
    t.cs->fpu_param = transpose ? 1 : 0;
}
inline void matmul_tiles(uint32_t in0_cb_id, uint32_t in1_cb_id, uint32_t in0_tile_index, uint32_t in1_tile_index, uint32_t idst,
                         ttmodel::CallLine line = ttmodel::CallLine(__builtin_LINE())) {
    using namespace ttmodel;
    Thread &t = self(line.v);
    ComputeState &s = math(t, "matmul_tiles", idst);
    if (s.fpu_init != "matmul" || s.fpu_cb != (int)in0_cb_id || s.fpu_cb1 != (int)in1_cb_id)
        fail(5, "init", "matmul_tiles(%u, %u, ...) needs matmul_init(%u, %u) as the last FPU init (the last one was %s)", in0_cb_id,
             in1_cb_id, in0_cb_id, in1_cb_id, s.fpu_init.empty() ? "none" : s.fpu_init_call.c_str());
    fpu_check(t, s, "matmul", in0_cb_id, (int)in1_cb_id, "matmul_tiles");
    const uint8_t *pa = in_tile(t, in0_cb_id, in0_tile_index, "matmul_tiles");
    const uint8_t *pb = in_tile(t, in1_cb_id, in1_tile_index, "matmul_tiles");
    tt::DataFormat fa = cb_of(t, in0_cb_id).format, fb = cb_of(t, in1_cb_id).format;
    const bool tr = s.fpu_param != 0;
    float a[32][32], b[32][32];
    for (uint32_t r = 0; r < 32; r++)
        for (uint32_t c = 0; c < 32; c++) {
            a[r][c] = fpu_operand(fa, pa, tile_index(r, c));
            b[r][c] = fpu_operand(fb, pb, tr ? tile_index(c, r) : tile_index(r, c));
        }
    for (uint32_t i = 0; i < 32; i++)
        for (uint32_t j = 0; j < 32; j++) {
            float &o = s.dst[idst][tile_index(i, j)];
            for (uint32_t h = 0; h < 2; h++) {
                float acc = 0.0f;
                for (uint32_t k = 16 * h; k < 16 * h + 16; k++) acc += a[i][k] * b[k][j];
                o = to_dst(*t.core, o + acc);
            }
        }
    s.valid[idst] = true;
    s.from_reduce[idst] = false;
}

/* ==== tilize / pack untilize (api/compute/tilize.h, api/compute/pack_untilize.h) ==== */
namespace ttmodel {
/* UNPACK -> DST of one datum: exact for Float16_b; Float32 goes to DST unchanged only through the unpack-to-dest
 * path (UnpackToDestFp32 on that CB with fp32_dest_acc_en), else through SrcA as TF32 (as copy_tile) */
inline float unpack_a(const Core &core, uint32_t cb, tt::DataFormat f, const uint8_t *p, uint32_t i) {
    bool exact = core.fp32_dest_acc && core.unpack_to_dest_fp32[cb];
    return to_dst(core, exact ? load(f, p, i) : fpu_operand(f, p, i));
}
inline uint32_t datum_bytes(tt::DataFormat f) { return tile_bytes(f) / kTileElems; }
/* tilize_block / pack_untilize_block acquire and release DST themselves */
inline void dst_idle(ComputeState &s, const char *fn) {
    if (s.state != DST_IDLE)
        fail(4, "DST protocol", "%s inside a tile_regs_acquire ... tile_regs_release section (it acquires and releases DST itself)", fn);
}
/* [lo, hi) bytes from the front of CB `cb` must lie in the pages the compute kernel waited for */
inline const uint8_t *front_bytes(Thread &t, uint32_t cb, uint64_t lo, uint64_t hi, const char *fn) {
    std::lock_guard<std::mutex> lk(t.core->m);
    CB &c = tile_cb(t, cb, fn);
    uint32_t w = c.waiter == COMPUTE ? c.waited : 0;
    if (hi > (uint64_t)w * c.page)
        fail(1, "CB", "%s reads bytes [%llu, %llu) of the front of CB %u (%u pages) but only %u pages are waited for (cb_wait_front)", fn,
             (unsigned long long)lo, (unsigned long long)hi, cb, (unsigned)((hi + c.page - 1) / c.page), w);
    return l1_ptr(c.rd_ptr());
}
/* [lo, hi) bytes from the write pointer of CB `cb` must lie in its open reservation */
inline uint8_t *back_bytes(Thread &t, uint32_t cb, uint64_t hi, const char *fn) {
    std::lock_guard<std::mutex> lk(t.core->m);
    CB &c = tile_cb(t, cb, fn);
    if (hi > (uint64_t)c.reserved * c.page)
        fail(1, "CB", "%s writes %u pages of CB %u but only %u pages are reserved (cb_reserve_back)", fn,
             (unsigned)((hi + c.page - 1) / c.page), cb, c.reserved);
    return l1_ptr(c.wr_ptr());
}
}  // namespace ttmodel

/* tilize_init(icb, block, ocb): the unpacker reads row-major data with a row of `block` tiles (block * 32 datums);
 * it stays in tilize mode until tilize_uninit (the model rejects any other FPU init before it). */
template <bool is_fp32_dest_acc_en = DST_ACCUM_MODE>
inline void tilize_init(uint32_t icb, uint32_t block, uint32_t ocb, uint32_t call_line = __builtin_LINE()) {
    using namespace ttmodel;
    Thread &t = self((int)call_line);
    if (block == 0) fail(0, "model", "tilize_init(%u, 0, %u): block must be > 0", icb, ocb);
    tile_cb(t, icb, "tilize_init");
    tile_cb(t, ocb, "tilize_init");
    ComputeState &s = started(t, "tilize_init");
    s.tilize_active = false;
    fpu_init(t, "tilize", icb, -1, "tilize_init");
    char b[96];
    snprintf(b, sizeof b, "tilize_init(%u, %u, %u)", icb, block, ocb);
    s.fpu_init_call = b;
    s.fpu_param = block;
    s.fpu_ocb = (int)ocb;
    s.tilize_active = true;
}
/* tilize_block(icb, block, ocb, input_tile_index = 0, output_tile_index = 0): for t < block, output tile
 * output_tile_index + t of ocb's reservation (out of order, from the write pointer) gets element (r, c) =
 * row-major datum (e + t) * 32 + r * block * 32 + c from icb's read pointer, e = (input_tile_index / block) *
 * block * 32 + input_tile_index % block (llk_unpack_tilize_block). It neither waits, pops, reserves nor pushes: the
 * kernel does (cb_wait_front(icb, block), cb_reserve_back(ocb, block), ..., cb_push_back, cb_pop_front). Each tile
 * goes through DST (its own acquire/release, outside any tile_regs section) and the packer (CB format). */
template <bool is_fp32_dest_acc_en = DST_ACCUM_MODE>
inline void tilize_block(uint32_t icb, uint32_t block, uint32_t ocb, uint32_t input_tile_index = 0, uint32_t output_tile_index = 0,
                         ttmodel::CallLine line = ttmodel::CallLine(__builtin_LINE())) {
    using namespace ttmodel;
    Thread &t = self(line.v);
    ComputeState &s = started(t, "tilize_block");
    dst_idle(s, "tilize_block");
    if (s.fpu_init != "tilize" || s.fpu_cb != (int)icb || s.fpu_param != block || !s.tilize_active)
        fail(5, "init", "tilize_block(%u, %u, %u) needs tilize_init(%u, %u, ...) as the last FPU init (the last one was %s)", icb, block,
             ocb, icb, block, s.fpu_init.empty() || !s.tilize_active ? "none" : s.fpu_init_call.c_str());
    fpu_check(t, s, "tilize", icb, -1, "tilize_block");
    const tt::DataFormat fi = cb_of(t, icb).format, fo = cb_of(t, ocb).format;
    const uint64_t e = (uint64_t)(input_tile_index / block) * block * 32 + input_tile_index % block;
    const uint64_t row = (uint64_t)block * 32;
    const uint64_t last = (e + block - 1) * 32 + 31 * row + 32; /* one past the last datum read */
    const uint8_t *pi = front_bytes(t, icb, e * 32 * datum_bytes(fi), last * datum_bytes(fi), "tilize_block");
    const uint32_t opage = cb_of(t, ocb).page;
    uint8_t *po = back_bytes(t, ocb, (uint64_t)(output_tile_index + block) * opage, "tilize_block");
    for (uint32_t tt_ = 0; tt_ < block; tt_++) {
        uint8_t *dst = po + (size_t)(output_tile_index + tt_) * opage;
        for (uint32_t r = 0; r < 32; r++)
            for (uint32_t c = 0; c < 32; c++)
                store(fo, dst, tile_index(r, c), unpack_a(*t.core, icb, fi, pi, (uint32_t)((e + tt_) * 32 + r * row + c)));
    }
}
inline void tilize_uninit(uint32_t icb, uint32_t ocb, ttmodel::CallLine line = ttmodel::CallLine(__builtin_LINE())) {
    using namespace ttmodel;
    Thread &t = self(line.v);
    ComputeState &s = started(t, "tilize_uninit");
    cb_of(t, icb), cb_of(t, ocb);
    if (!s.tilize_active) fail(5, "init", "tilize_uninit(%u, %u) without tilize_init", icb, ocb);
    s.tilize_active = false;
    s.fpu_init.clear(); /* the unpacker is reprogrammed: the next FPU op needs its own init */
    s.fpu_init_call.clear();
    s.fpu_cb = s.fpu_cb1 = -1;
}

/* pack_untilize_init<block_ct_dim, full_ct_dim>(icb, ocb): unpack A + datacopy from icb, packer in untilize mode for
 * ocb until pack_untilize_uninit(ocb) (pack_tile is rejected meanwhile). */
template <uint32_t block_ct_dim = 8, uint32_t full_ct_dim = block_ct_dim, bool is_fp32_dest_acc_en = DST_ACCUM_MODE>
inline void pack_untilize_init(uint32_t icb, uint32_t ocb, uint32_t call_line = __builtin_LINE()) {
    static_assert(block_ct_dim >= 1 && full_ct_dim % block_ct_dim == 0, "pack_untilize: full_ct_dim must be a multiple of block_ct_dim");
    using namespace ttmodel;
    Thread &t = self((int)call_line);
    tile_cb(t, icb, "pack_untilize_init");
    tile_cb(t, ocb, "pack_untilize_init");
    fpu_init(t, "pack_untilize", icb, -1, "pack_untilize_init");
    ComputeState &s = *t.cs;
    char b[96];
    snprintf(b, sizeof b, "pack_untilize_init<%u, %u>(%u, %u)", block_ct_dim, full_ct_dim, icb, ocb);
    s.fpu_init_call = b;
    s.fpu_param = block_ct_dim;
    s.fpu_param2 = full_ct_dim;
    s.fpu_ocb = (int)ocb;
    s.untilize_active = true;
}
/* pack_untilize_block<block_ct_dim, full_ct_dim>(icb, block_rt_dim, ocb, block_c_index = 0): per r < block_rt_dim,
 * tiles 0 .. block_ct_dim - 1 of icb's front go through DST (block_ct_dim tiles: at most the DST capacity, rule 4) and
 * the packer writes them row-major into ocb from its write pointer: tile c's element (r, j) at datum
 * r * full_ct_dim * 32 + (block_c_index * block_ct_dim + c) * 32 + j. Neither pointer advances between the r
 * iterations (llk_unpack_A reads from fifo_rd_ptr, llk_pack_untilize writes from fifo_wr_ptr), so block_rt_dim > 1
 * repeats the same strip, as the 0.81.1 LLK does. No wait/pop/reserve/push inside. */
template <uint32_t block_ct_dim = 8, uint32_t full_ct_dim = block_ct_dim, bool is_fp32_dest_acc_en = DST_ACCUM_MODE>
inline void pack_untilize_block(uint32_t icb, uint32_t block_rt_dim, uint32_t ocb, uint32_t block_c_index = 0,
                                ttmodel::CallLine line = ttmodel::CallLine(__builtin_LINE())) {
    static_assert(block_ct_dim >= 1 && full_ct_dim % block_ct_dim == 0, "pack_untilize: full_ct_dim must be a multiple of block_ct_dim");
    using namespace ttmodel;
    Thread &t = self(line.v);
    char fn[64];
    snprintf(fn, sizeof fn, "pack_untilize_block<%u, %u>", block_ct_dim, full_ct_dim);
    ComputeState &s = started(t, fn);
    dst_idle(s, fn);
    if (block_ct_dim > t.core->dst_tiles())
        fail(4, "DST protocol", "%s: block_ct_dim %u exceeds DST: it holds %u tiles (%s, %s)", fn, block_ct_dim, t.core->dst_tiles(),
             t.core->fp32_dest_acc ? "fp32_dest_acc_en" : "16-bit", t.core->dst_full_sync ? "full-sync" : "half-sync");
    if (s.fpu_init != "pack_untilize" || s.fpu_cb != (int)icb || s.fpu_param != block_ct_dim || s.fpu_param2 != full_ct_dim ||
        s.fpu_ocb != (int)ocb || !s.untilize_active)
        fail(5, "init", "%s(%u, ..., %u) needs pack_untilize_init<%u, %u>(%u, %u) as the last FPU init and packer init (the last one was %s)",
             fn, icb, ocb, block_ct_dim, full_ct_dim, icb, ocb, s.fpu_init.empty() ? "none" : s.fpu_init_call.c_str());
    fpu_check(t, s, "pack_untilize", icb, -1, fn);
    if (block_c_index >= full_ct_dim / block_ct_dim)
        fail(0, "model", "%s: block_c_index %u out of range [0, %u)", fn, block_c_index, full_ct_dim / block_ct_dim);
    const tt::DataFormat fi = cb_of(t, icb).format, fo = cb_of(t, ocb).format;
    const uint32_t ipage = cb_of(t, icb).page;
    const uint8_t *pi = front_bytes(t, icb, 0, (uint64_t)block_ct_dim * ipage, fn);
    const uint64_t row = (uint64_t)full_ct_dim * 32, col0 = (uint64_t)block_c_index * block_ct_dim * 32;
    uint8_t *po = back_bytes(t, ocb, (31 * row + col0 + block_ct_dim * 32) * datum_bytes(fo), fn);
    for (uint32_t r = 0; r < block_rt_dim; r++)
        for (uint32_t c = 0; c < block_ct_dim; c++)
            for (uint32_t i = 0; i < 32; i++)
                for (uint32_t j = 0; j < 32; j++)
                    store(fo, po, (uint32_t)(i * row + col0 + c * 32 + j),
                          unpack_a(*t.core, icb, fi, pi + (size_t)c * ipage, tile_index(i, j)));
}
template <bool is_fp32_dest_acc_en = DST_ACCUM_MODE>
inline void pack_untilize_uninit(uint32_t ocb, ttmodel::CallLine line = ttmodel::CallLine(__builtin_LINE())) {
    using namespace ttmodel;
    Thread &t = self(line.v);
    ComputeState &s = started(t, "pack_untilize_uninit");
    cb_of(t, ocb);
    if (!s.untilize_active) fail(5, "init", "pack_untilize_uninit(%u) without pack_untilize_init", ocb);
    s.untilize_active = false;
}

#endif /* OPGEN_TTMETAL_MODEL_COMPUTE_H */
