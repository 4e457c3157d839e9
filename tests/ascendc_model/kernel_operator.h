/* kernel_operator.h — opgen's CPU model of the Ascend C (Atlas A2 / 910B, dav-2201) kernel API
 * subset that opgen's compiler emits. Same spellings as CANN's asc-devkit, so an emitted kernel
 * compiles unchanged against this header (g++) and against the real one (bisheng).
 *
 * A launch runs its blocks as threads, each with a private Unified Buffer arena; the model
 * ENFORCES the hardware rules of shared/tools/ASCENDC.md and aborts with
 *     ascend-model: rule N (<short name>): <what, with values>
 * instead of emulating silent hardware misbehaviour. Every signature, and where it was checked,
 * is listed in docs/ascendc_model.md. Test harness only: not a product. */
#ifndef OPGEN_ASCENDC_MODEL_KERNEL_OPERATOR_H
#define OPGEN_ASCENDC_MODEL_KERNEL_OPERATOR_H

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "ascendc_model_core.h"

/* ---- qualifiers: meaningful to bisheng only ---- */
#ifdef OPGEN_ASCENDC_MODEL_SCAN /* build.py preprocesses with this to find the kernels */
#define __global__ __opgen_global__
#define __gm__ __opgen_gm__
#else
#define __global__
#define __gm__
#endif
#define __aicore__
#define __ubuf__
#define __vector__
#define __mix__(...)
#define GM_ADDR __gm__ uint8_t *

/* ---- kernel task type (KERNEL_TASK_TYPE_DEFAULT) and core type (ASCEND_IS_AIV / ASCEND_IS_AIC) ---- */
/* enum KernelMetaType: names and order as in asc-devkit's kernel_utils_macros.h (values unconfirmed) */
enum KernelMetaType {
    KERNEL_TYPE_AIV_ONLY,
    KERNEL_TYPE_AIC_ONLY,
    KERNEL_TYPE_MIX_AIV_1_0,
    KERNEL_TYPE_MIX_AIC_1_0,
    KERNEL_TYPE_MIX_AIC_1_1,
    KERNEL_TYPE_MIX_AIC_1_2,
    KERNEL_TYPE_AICORE,
    KERNEL_TYPE_VECTORCORE,
    KERNEL_TYPE_MIX_AICORE,
    KERNEL_TYPE_MIX_VECTOR_CORE,
    KERNEL_TYPE_MAX,
};
/* A statement in the kernel body. build.py looks for KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2)
 * in the body of each kernel and launches it as MIX; at run time the macro checks that the launch
 * agrees (rule 10) and records the type that the Matmul API checks (rule 11). */
#ifdef OPGEN_ASCENDC_MODEL_SCAN
#define KERNEL_TASK_TYPE_DEFAULT(value) __opgen_task_type__(value)
#else
#define KERNEL_TASK_TYPE_DEFAULT(value) ascend_model::kernel_task_type(value, #value)
#endif
namespace AscendC {
constexpr int32_t MIX = 0;
constexpr int32_t AIC = 1;
constexpr int32_t AIV = 2;
}  // namespace AscendC
/* every block of the model is a vector core (AIV): `if ASCEND_IS_AIC { ... }` never runs */
constexpr int32_t g_coreType = AscendC::AIV;
#define ASCEND_IS_AIV constexpr(g_coreType == AscendC::AIV)
#define ASCEND_IS_AIC constexpr(g_coreType == AscendC::AIC)
#define ASCEND_IS_NOT_AIV constexpr(g_coreType != AscendC::AIV)
#define ASCEND_IS_NOT_AIC constexpr(g_coreType != AscendC::AIC)

/* bisheng builtins (values as in asc-devkit's PIPE enum; the model ignores them) */
enum pipe_t {
    PIPE_S = 1,
    PIPE_V = 2,
    PIPE_M = 3,
    PIPE_MTE1 = 4,
    PIPE_MTE2 = 5,
    PIPE_MTE3 = 6,
    PIPE_MTE4 = 7,
    PIPE_MTE5 = 8,
    PIPE_V2 = 9,
    PIPE_ALL = 10,
};
enum event_t { EVENT_ID0 = 0, EVENT_ID1, EVENT_ID2, EVENT_ID3, EVENT_ID4, EVENT_ID5, EVENT_ID6, EVENT_ID7 };

namespace AscendC {

enum class TPosition : uint8_t {
    GM,
    A1,
    A2,
    B1,
    B2,
    C1,
    C2,
    CO1,
    CO2,
    VECIN,
    VECOUT,
    VECCALC,
    LCM = VECCALC,
    SPM,
    SHM = SPM,
    TSCM,
    C2PIPE2GM,
    C2PIPE2LOCAL,
    MAX,
};
using QuePosition = TPosition;

enum class HardEvent : uint8_t {
    MTE2_MTE1,
    MTE1_MTE2,
    MTE1_M,
    M_MTE1,
    MTE2_V,
    V_MTE2,
    MTE3_V,
    V_MTE3,
    M_V,
    V_M,
    V_V,
    MTE3_MTE1,
    MTE1_MTE3,
    MTE1_V,
    MTE2_M,
    M_MTE2,
    V_MTE1,
    M_FIX,
    FIX_M,
    MTE3_MTE2,
    MTE2_MTE3,
    S_V,
    V_S,
    S_MTE2,
    MTE2_S,
    S_MTE3,
    MTE3_S,
};
using TEventID = int8_t;

enum class RoundMode : uint8_t {
    CAST_NONE = 0,
    CAST_RINT,
    CAST_FLOOR,
    CAST_CEIL,
    CAST_ROUND,
    CAST_TRUNC,
    CAST_ODD,
    UNKNOWN = 0xFF,
};
enum class CMPMODE : uint8_t { LT = 0, GT, EQ, LE, GE, NE };
enum class SELMODE : uint8_t { VSEL_CMPMASK_SPR = 0, VSEL_TENSOR_SCALAR_MODE, VSEL_TENSOR_TENSOR_MODE };

}  // namespace AscendC

/* ======================================================================================== */
namespace ascend_model {

inline const char *pos_name(uint8_t p) {
    switch ((AscendC::TPosition)p) {
        case AscendC::TPosition::VECIN: return "VECIN";
        case AscendC::TPosition::VECOUT: return "VECOUT";
        case AscendC::TPosition::VECCALC: return "VECCALC";
        default: return "?";
    }
}

enum class BufKind : uint8_t { Queue, TBuf };
enum class BufState : uint8_t { Free, Allocated, Enqueued, Dequeued };

/* One InitBuffer'd UB buffer: a queue slot or a TBuf. LocalTensors point at it (rule 6). */
struct BufRec {
    uint32_t addr = 0; /* UB byte offset */
    uint32_t len = 0;  /* bytes, 32-B rounded */
    uint32_t gen = 0;  /* bumped by FreeTensor: older tensors of this buffer are stale */
    BufKind kind = BufKind::Queue;
    BufState state = BufState::Free;
    uint8_t pos = 0;
    const void *owner = nullptr;
};

inline uint64_t align32(uint64_t n) { return (n + 31) / 32 * 32; }

}  // namespace ascend_model

namespace AscendC {

/* ======================================================================================== */
/* LocalTensor: a typed view of this block's UB.                                            */
template <typename T>
class LocalTensor {
public:
    using PrimType = T;
    LocalTensor() = default;

    /* elements */
    uint32_t GetSize() const { return len_ / (uint32_t)sizeof(T); }
    int32_t GetPosition() const { return pos_; }
    /* the UB byte address (the NPU build's spelling returns uint64_t) */
    uint64_t GetPhyAddr() const { return addr_; }
    uint64_t GetPhyAddr(const uint32_t offset) const { return addr_ + (uint64_t)offset * sizeof(T); }

    /* the sub-tensor `offset` elements in; its start must be 32-B aligned when DataCopy or a
     * vector op uses it (rule 2), which is checked there */
    LocalTensor operator[](const uint32_t offset) const {
        live("LocalTensor::operator[]");
        uint64_t b = (uint64_t)offset * sizeof(T);
        if (b > len_)
            ascend_model::fail(0, "bounds", "LocalTensor<%s>[%u]: offset %llu B is past the end of the tensor (%u B)",
                               ascend_model::type_name<T>(), offset, (unsigned long long)b, len_);
        LocalTensor r = *this;
        r.addr_ += (uint32_t)b;
        r.len_ -= (uint32_t)b;
        return r;
    }

    template <typename U>
    LocalTensor<U> ReinterpretCast() const {
        live("LocalTensor::ReinterpretCast");
        LocalTensor<U> r;
        r.ub_ = ub_;
        r.addr_ = addr_;
        r.len_ = len_;
        r.rec_ = rec_;
        r.gen_ = gen_;
        r.pos_ = pos_;
        return r;
    }

    T GetValue(const uint32_t index) const {
        at(index, "LocalTensor::GetValue");
        return ptr()[index];
    }
    template <typename S>
    void SetValue(const uint32_t index, const S value) const {
        at(index, "LocalTensor::SetValue");
        ptr()[index] = static_cast<T>(value);
    }

    /* ---- model internals ---- */
    uint8_t *ub_ = nullptr;
    uint32_t addr_ = 0;
    uint32_t len_ = 0;
    ascend_model::BufRec *rec_ = nullptr;
    uint32_t gen_ = 0;
    uint8_t pos_ = 0;

    T *ptr() const { return reinterpret_cast<T *>(ub_ + addr_); }
    /* rule 6: the tensor's buffer must be allocated and not sitting in its queue */
    void live(const char *api) const {
        if (!ub_) ascend_model::fail(0, "model", "%s: the LocalTensor was never allocated (default-constructed)", api);
        if (rec_ && rec_->kind == ascend_model::BufKind::Queue) {
            if (rec_->gen != gen_ || rec_->state == ascend_model::BufState::Free)
                ascend_model::fail(6, "queue protocol", "%s: tensor (UB %u, %u B) used after FreeTensor", api, addr_,
                                   len_);
            if (rec_->state == ascend_model::BufState::Enqueued)
                ascend_model::fail(6, "queue protocol",
                                   "%s: tensor (UB %u) used while it is in its queue (after EnQue, before DeQue)", api,
                                   addr_);
        }
    }
    void at(uint32_t index, const char *api) const {
        live(api);
        if (index >= GetSize())
            ascend_model::fail(0, "bounds", "%s(%u): index out of range (the LocalTensor<%s> has %u elements)", api,
                               index, ascend_model::type_name<T>(), GetSize());
    }
};

/* ======================================================================================== */
/* GlobalTensor: a typed view of GM (host memory in the model) with the size given to          */
/* SetGlobalBuffer; every access outside [buffer, buffer + size) aborts (rule 0, bounds).       */
template <typename T>
class GlobalTensor {
public:
    using PrimType = T;
    GlobalTensor() = default;

    void SetGlobalBuffer(__gm__ T *buffer, uint64_t bufferSize) {
        addr_ = origin_ = buffer;
        size_ = bufferSize;
        set_ = true;
    }
    /* The one-argument form exists in CANN; the model needs the size to bounds-check GM. */
    void SetGlobalBuffer(__gm__ T *) {
        ascend_model::fail(0, "model",
                           "GlobalTensor<%s>::SetGlobalBuffer(buffer) without a size is not modelled: pass the element "
                           "count so that GM accesses can be bounds-checked",
                           ascend_model::type_name<T>());
    }
    const __gm__ T *GetPhyAddr() const { return addr_; }
    __gm__ T *GetPhyAddr(const uint64_t offset) const { return addr_ + offset; }
    /* as in CANN: the size given to SetGlobalBuffer, also for a sub-tensor g[off] */
    uint64_t GetSize() const { return size_; }

    T GetValue(const uint64_t offset) const {
        check(offset * sizeof(T), sizeof(T), "GlobalTensor::GetValue");
        return addr_[offset];
    }
    void SetValue(const uint64_t offset, T value) {
        check(offset * sizeof(T), sizeof(T), "GlobalTensor::SetValue");
        addr_[offset] = value;
    }
    GlobalTensor operator[](const uint64_t offset) const {
        GlobalTensor r = *this;
        r.addr_ += offset;
        return r;
    }

    /* ---- model internals ---- */
    T *addr_ = nullptr;
    T *origin_ = nullptr;
    uint64_t size_ = 0; /* elements from origin_ */
    bool set_ = false;

    /* bytes [off, off + n) from addr_ must lie inside [origin_, origin_ + size_) */
    void check(uint64_t off, uint64_t n, const char *api) const {
        if (!set_) ascend_model::fail(0, "model", "%s: GlobalTensor used before SetGlobalBuffer", api);
        int64_t start = (int64_t)((const uint8_t *)addr_ - (const uint8_t *)origin_) + (int64_t)off;
        uint64_t cap = size_ * sizeof(T);
        if (start < 0 || (uint64_t)start + n > cap)
            ascend_model::fail(0, "bounds",
                               "%s: GM bytes [%lld, %lld) of a GlobalTensor<%s> whose SetGlobalBuffer size is %llu "
                               "elements (%llu B)",
                               api, (long long)start, (long long)(start + (int64_t)n), ascend_model::type_name<T>(),
                               (unsigned long long)size_, (unsigned long long)cap);
        if (n && !origin_) ascend_model::fail(0, "bounds", "%s: GlobalTensor over a null GM pointer", api);
    }
};

/* DataCacheCleanAndInvalid: writes back (and drops) the scalar unit's data-cache line holding a
 * GM element it wrote with GlobalTensor::SetValue, so that the copy engine and the host see it.
 * The model's GM is host memory, coherent already: the call only checks its operand's bounds. */
enum class CacheLine { SINGLE_CACHE_LINE = 0, ENTIRE_DATA_CACHE };
enum class DcciDst { CACHELINE_ALL = 0, CACHELINE_UB, CACHELINE_OUT, CACHELINE_ATOMIC };
template <typename T, CacheLine entireType, DcciDst dcciDst>
inline void DataCacheCleanAndInvalid(const GlobalTensor<T> &dst) {
    (void)dst.GetValue(0);
}

/* ======================================================================================== */
/* system variables, synchronisation                                                        */
/* In a MIX (KERNEL_TYPE_MIX_AIC_1_2) launch of numBlocks B, the AIV blocks see GetBlockIdx() in
 * [0, 2B), GetBlockNum() == B and GetTaskRation() == 2; otherwise GetTaskRation() == 1. */
inline int64_t GetBlockIdx() { return ascend_model::block()->idx; }
inline int64_t GetBlockNum() { return ascend_model::block()->num; }
inline int64_t GetTaskRation() { return ascend_model::block()->ration; }

/* The system workspace the library APIs (Matmul) use: the first GetLibApiWorkSpaceSize() (16 MiB)
 * bytes of the kernel's workspace argument; the user's part follows it. */
inline void SetSysWorkspace(GM_ADDR workspace) {
    ascend_model::Block *b = ascend_model::block();
    b->sys_ws = workspace;
    b->sys_ws_set = true;
}
inline GM_ADDR GetSysWorkSpacePtr() {
    ascend_model::Block *b = ascend_model::block();
    if (!b->sys_ws_set || !b->sys_ws)
        ascend_model::fail(11, "matmul",
                           "GetSysWorkSpacePtr() before SetSysWorkspace(workspace)%s: it returns nullptr on hardware "
                           "(call SetSysWorkspace with the kernel's workspace argument first)",
                           b->sys_ws_set ? " (SetSysWorkspace was given nullptr)" : "");
    return b->sys_ws;
}
inline GM_ADDR GetUserWorkspace(GM_ADDR workspace) {
    return workspace ? workspace + ascend_model::kLibApiWorkspace : workspace;
}

/* In-core pipeline synchronisation: the model executes every instruction in program order, so
 * these are no-ops (missing ones are NOT detected, see docs/ascendc_model.md). */
template <pipe_t pipe>
inline void PipeBarrier() {}
template <HardEvent event>
inline void SetFlag(int32_t) {}
template <HardEvent event>
inline void WaitFlag(int32_t) {}

/* Barrier across all blocks of the launch (rule 10: needs numBlocks <= AIV cores). */
template <bool isAIVOnly = true>
inline void SyncAll() {
    if (!isAIVOnly)
        ascend_model::fail(10, "blocks", "SyncAll<false>() in a vector-only kernel hangs on hardware (use SyncAll())");
    ascend_model::sync_all();
}

/* Rule 9: atomic add to GM, integer types only (A2 also has half/bfloat16_t/float atomics; the
 * project forbids them: the sum would depend on the order the blocks arrive in). Checked at run
 * time, so that the violation aborts with the usual message. */
template <typename T>
inline void SetAtomicAdd() {
    if constexpr (ascend_model::is_one_of<T, half, bfloat16_t, float>)
        ascend_model::fail(9, "atomic",
                           "SetAtomicAdd<%s>(): float atomic add is forbidden (the result would depend on block "
                           "order); use an integer type or a deterministic reduction",
                           ascend_model::type_name<T>());
    else if constexpr (!ascend_model::is_one_of<T, int8_t, int16_t, int32_t>)
        ascend_model::fail(9, "atomic", "SetAtomicAdd<%s>(): not an atomic-add type on A2 (int8_t, int16_t, int32_t)",
                           ascend_model::type_name<T>());
    ascend_model::Block *b = ascend_model::block();
    b->atomic = (int)sizeof(T);
    b->atomic_type = ascend_model::type_name<T>();
}
inline void SetAtomicNone() {
    ascend_model::Block *b = ascend_model::block();
    b->atomic = 0;
    b->atomic_type = nullptr;
}
inline void DisableDmaAtomic() { SetAtomicNone(); }

/* ======================================================================================== */
/* TPipe / TQue / TBuf                                                                      */
class TPipe;
template <TPosition pos, int32_t depth, auto mask = 0>
class TQue;
template <TPosition pos = TPosition::LCM>
class TBuf;

class TPipe {
public:
    TPipe() {
        blk_ = ascend_model::block();
        if (blk_->pipe)
            ascend_model::fail(0, "model", "a second TPipe while another is alive in the same block is not modelled");
        blk_->pipe = this;
    }
    ~TPipe() {
        if (blk_ && blk_->pipe == this) blk_->pipe = nullptr;
    }
    TPipe(const TPipe &) = delete;
    TPipe &operator=(const TPipe &) = delete;

    void Init() {}

    /* Rules 1 and 5. CANN: `bool InitBuffer(T& que, uint8_t num, uint32_t len)`; the model takes
     * wider integers so that a computed num/len that would wrap is caught instead. */
    template <class Q>
    bool InitBuffer(Q &que, uint64_t num, uint64_t len);
    template <TPosition pos>
    bool InitBuffer(TBuf<pos> &buf, uint64_t len);

    /* event ids for SetFlag/WaitFlag (no-ops in the model) */
    template <HardEvent evt>
    TEventID FetchEventID() {
        return 0;
    }
    TEventID FetchEventID(HardEvent) { return 0; }
    template <HardEvent evt>
    TEventID AllocEventID() {
        return 0;
    }
    template <HardEvent evt>
    void ReleaseEventID(TEventID) {}

    /* ---- model internals ---- */
    ascend_model::Block *blk_ = nullptr;
    uint64_t used_ = 0;  /* UB bytes handed out (32-B rounded) */
    uint32_t nbufs_ = 0; /* buffers handed out (a queue counts num, a TBuf 1) */

    uint32_t take(uint64_t num, uint64_t len, const char *what) {
        if (len == 0) ascend_model::fail(5, "initbuffer", "InitBuffer(%s): len is 0", what);
        uint64_t rounded = ascend_model::align32(len);
        uint64_t need = used_ + num * rounded;
        if (need > blk_->ub_size)
            ascend_model::fail(1, "ub capacity",
                               "InitBuffer(%s, num %llu, len %llu -> %llu B each): %llu B of UB in use + %llu B = %llu B "
                               "> UB size %u B",
                               what, (unsigned long long)num, (unsigned long long)len, (unsigned long long)rounded,
                               (unsigned long long)used_, (unsigned long long)(num * rounded),
                               (unsigned long long)need, blk_->ub_size);
        if (nbufs_ + num > 64)
            ascend_model::fail(5, "initbuffer",
                               "InitBuffer(%s): %u buffers already + %llu = %llu > 64 buffers in one kernel", what,
                               nbufs_, (unsigned long long)num, (unsigned long long)(nbufs_ + num));
        uint32_t addr = (uint32_t)used_;
        used_ = need;
        nbufs_ += (uint32_t)num;
        return addr;
    }
};

/* Queues between pipeline stages. Rule 6 state machine per buffer:
 *   Free --AllocTensor--> Allocated --EnQue--> Enqueued --DeQue--> Dequeued --FreeTensor--> Free
 * `num` (InitBuffer) buffers; at most `depth` tensors in the queue (consecutive EnQue). */
template <TPosition pos, int32_t depth, auto mask>
class TQue {
    static_assert(pos == TPosition::VECIN || pos == TPosition::VECOUT,
                  "ascend-model: rule 0 (model): only TQue<TPosition::VECIN|VECOUT, depth> is modelled");
    static_assert(depth == 1 || depth == 2, "ascend-model: rule 0 (model): only TQue depth 1 or 2 is modelled");

public:
    static constexpr bool is_model_tque = true;
    static constexpr int32_t queue_depth = depth;
    static constexpr TPosition pos_value = pos;
    TQue() = default;
    TQue(const TQue &) = delete;
    TQue &operator=(const TQue &) = delete;

    template <typename T>
    LocalTensor<T> AllocTensor() {
        ready("AllocTensor");
        int found = -1;
        for (int k = 0; k < num_; k++) {
            int i = (cursor_ + k) % num_;
            if (recs_[i].state == ascend_model::BufState::Free) {
                found = i;
                break;
            }
        }
        if (found < 0)
            ascend_model::fail(6, "queue protocol",
                               "AllocTensor on TQue<%s, %d>: all %d buffer(s) from InitBuffer are allocated (FreeTensor "
                               "one first; on hardware this AllocTensor waits forever)",
                               ascend_model::pos_name((uint8_t)pos), depth, num_);
        ascend_model::Block *b = ascend_model::block();
        if (b->outstanding[(int)pos] >= 8)
            ascend_model::fail(6, "queue protocol",
                               "AllocTensor: a 9th tensor allocated at once on TPosition::%s (A2 allows 8 per position)",
                               ascend_model::pos_name((uint8_t)pos));
        b->outstanding[(int)pos]++;
        cursor_ = (found + 1) % num_;
        ascend_model::BufRec &r = recs_[found];
        r.state = ascend_model::BufState::Allocated;
        return tensor<T>(r);
    }

    template <typename T>
    bool EnQue(const LocalTensor<T> &t) {
        ascend_model::BufRec *r = mine(t, "EnQue");
        if (r->state == ascend_model::BufState::Enqueued)
            ascend_model::fail(6, "queue protocol", "EnQue of a tensor (UB %u) that is already in the queue", t.addr_);
        if (count_ >= depth)
            ascend_model::fail(6, "queue protocol", "EnQue on TQue<%s, %d>: the queue already holds %d tensor(s)",
                               ascend_model::pos_name((uint8_t)pos), depth, count_);
        fifo_[(head_ + count_) % 2] = r;
        count_++;
        r->state = ascend_model::BufState::Enqueued;
        return true;
    }

    template <typename T>
    LocalTensor<T> DeQue() {
        ready("DeQue");
        if (count_ == 0)
            ascend_model::fail(6, "queue protocol", "DeQue on an empty TQue<%s, %d> (no EnQue before it)",
                               ascend_model::pos_name((uint8_t)pos), depth);
        ascend_model::BufRec *r = fifo_[head_];
        head_ = (head_ + 1) % 2;
        count_--;
        r->state = ascend_model::BufState::Dequeued;
        return tensor<T>(*r);
    }

    template <typename T>
    void FreeTensor(LocalTensor<T> &t) {
        ascend_model::BufRec *r = mine(t, "FreeTensor");
        if (r->state == ascend_model::BufState::Enqueued)
            ascend_model::fail(6, "queue protocol", "FreeTensor of a tensor (UB %u) that is still in the queue", t.addr_);
        r->state = ascend_model::BufState::Free;
        r->gen++;
        ascend_model::block()->outstanding[(int)pos]--;
    }

    bool VacantInQue() { return count_ < depth; }
    bool HasTensorInQue() { return count_ > 0; }
    int32_t GetTensorCountInQue() { return count_; }
    bool HasIdleBuffer() {
        for (int i = 0; i < num_; i++)
            if (recs_[i].state == ascend_model::BufState::Free) return true;
        return false;
    }

    /* ---- model internals ---- */
    ascend_model::BufRec recs_[2];
    int num_ = 0;
    int cursor_ = 0;
    ascend_model::BufRec *fifo_[2] = {nullptr, nullptr};
    int head_ = 0;
    int count_ = 0;
    uint8_t *ub_ = nullptr;

    void ready(const char *api) const {
        if (num_ == 0) ascend_model::fail(5, "initbuffer", "%s on a TQue that InitBuffer has not set up", api);
    }
    template <typename T>
    LocalTensor<T> tensor(ascend_model::BufRec &r) const {
        LocalTensor<T> t;
        t.ub_ = ub_;
        t.addr_ = r.addr;
        t.len_ = r.len;
        t.rec_ = &r;
        t.gen_ = r.gen;
        t.pos_ = (uint8_t)pos;
        return t;
    }
    /* the buffer record of `t`, which must be a live tensor of this queue */
    template <typename T>
    ascend_model::BufRec *mine(const LocalTensor<T> &t, const char *api) const {
        ready(api);
        if (!t.ub_) ascend_model::fail(0, "model", "%s of a default-constructed LocalTensor", api);
        ascend_model::BufRec *r = t.rec_;
        if (!r || r->kind == ascend_model::BufKind::TBuf)
            ascend_model::fail(6, "queue protocol", "%s of a TBuf tensor (UB %u): TBuf tensors are never queued", api,
                               t.addr_);
        if (r->owner != this)
            ascend_model::fail(6, "queue protocol", "%s of a tensor (UB %u) that belongs to another queue", api,
                               t.addr_);
        if (r->gen != t.gen_ || r->state == ascend_model::BufState::Free)
            ascend_model::fail(6, "queue protocol", "%s of a tensor (UB %u) that was already freed (double free?)", api,
                               t.addr_);
        return r;
    }
};

/* Scratch UB for computation: Get<T>() is never queued. */
template <TPosition pos>
class TBuf {
public:
    TBuf() = default;
    TBuf(const TBuf &) = delete;
    TBuf &operator=(const TBuf &) = delete;

    template <typename T>
    LocalTensor<T> Get() {
        return Get<T>(rec_.len / (uint32_t)sizeof(T));
    }
    /* `len` elements */
    template <typename T>
    LocalTensor<T> Get(uint32_t len) {
        if (!ub_) ascend_model::fail(5, "initbuffer", "TBuf::Get on a TBuf that InitBuffer has not set up");
        if ((uint64_t)len * sizeof(T) > rec_.len)
            ascend_model::fail(0, "bounds", "TBuf::Get<%s>(%u): %llu B > the TBuf's %u B", ascend_model::type_name<T>(),
                               len, (unsigned long long)len * sizeof(T), rec_.len);
        LocalTensor<T> t;
        t.ub_ = ub_;
        t.addr_ = rec_.addr;
        t.len_ = len * (uint32_t)sizeof(T);
        t.rec_ = &rec_;
        t.pos_ = (uint8_t)pos;
        return t;
    }

    /* ---- model internals ---- */
    ascend_model::BufRec rec_;
    uint8_t *ub_ = nullptr;
};

template <class Q>
inline bool TPipe::InitBuffer(Q &que, uint64_t num, uint64_t len) {
    static_assert(Q::is_model_tque, "ascend-model: rule 0 (model): InitBuffer(que, num, len) takes a TQue");
    if (que.num_ != 0) ascend_model::fail(5, "initbuffer", "InitBuffer called twice on the same TQue");
    if (num != 1 && num != 2)
        ascend_model::fail(5, "initbuffer", "InitBuffer(que, num %llu, len %llu): num must be 1 or 2 (double buffer)",
                           (unsigned long long)num, (unsigned long long)len);
    uint32_t addr = take(num, len, "TQue");
    uint32_t rounded = (uint32_t)ascend_model::align32(len);
    que.ub_ = blk_->ub;
    que.num_ = (int)num;
    for (int i = 0; i < (int)num; i++) {
        que.recs_[i] = ascend_model::BufRec{};
        que.recs_[i].addr = addr + (uint32_t)i * rounded;
        que.recs_[i].len = rounded;
        que.recs_[i].pos = (uint8_t)que.pos_value;
        que.recs_[i].owner = &que;
    }
    return true;
}

template <TPosition pos>
inline bool TPipe::InitBuffer(TBuf<pos> &buf, uint64_t len) {
    if (buf.ub_) ascend_model::fail(5, "initbuffer", "InitBuffer called twice on the same TBuf");
    uint32_t addr = take(1, len, "TBuf");
    buf.rec_ = ascend_model::BufRec{};
    buf.rec_.addr = addr;
    buf.rec_.len = (uint32_t)ascend_model::align32(len);
    buf.rec_.kind = ascend_model::BufKind::TBuf;
    buf.rec_.state = ascend_model::BufState::Allocated;
    buf.rec_.pos = (uint8_t)pos;
    buf.ub_ = blk_->ub;
    return true;
}

}  // namespace AscendC

namespace ascend_model {
/* KERNEL_TASK_TYPE_DEFAULT(value) at run time */
inline void kernel_task_type(int value, const char *spelled) {
    Block *b = block();
    if (value == KERNEL_TYPE_MIX_AIC_1_2) {
        if (!b->mix)
            fail(10, "blocks",
                 "KERNEL_TASK_TYPE_DEFAULT(%s) but the kernel was launched as vector-only: the launch stub is MIX only "
                 "when the macro is written in the body of the extern \"C\" __global__ kernel itself",
                 spelled);
    } else if (value == KERNEL_TYPE_AIV_ONLY || value == KERNEL_TYPE_MIX_AIV_1_0) {
        if (b->mix) fail(10, "blocks", "KERNEL_TASK_TYPE_DEFAULT(%s) in a kernel launched as MIX_AIC_1_2", spelled);
    } else {
        fail(0, "model", "KERNEL_TASK_TYPE_DEFAULT(%s): only AIV_ONLY, MIX_AIV_1_0 and MIX_AIC_1_2 are modelled",
             spelled);
    }
    if (b->task_type >= 0 && b->task_type != value)
        fail(10, "blocks", "KERNEL_TASK_TYPE_DEFAULT(%s) after another KERNEL_TASK_TYPE_DEFAULT in the same kernel",
             spelled);
    b->task_type = value;
}
}  // namespace ascend_model

/* CANN spells it outside the namespace (basic_api/kernel_common.h). */
inline AscendC::TPipe *GetTPipePtr() {
    void *p = ascend_model::block()->pipe;
    if (!p) ascend_model::fail(0, "model", "GetTPipePtr(): no TPipe is alive in this block");
    return static_cast<AscendC::TPipe *>(p);
}

#include "ascendc_model_copy.h"
#include "ascendc_model_vector.h"

#endif /* OPGEN_ASCENDC_MODEL_KERNEL_OPERATOR_H */
