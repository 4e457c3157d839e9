/* ascendc_model_core.h — the part of opgen's Ascend C CPU model shared by the kernel side
 * (kernel_operator.h), the host side (ascendc_model_host.h, tiling/platform/platform_ascendc.h)
 * and the runtime (ascendc_model_runtime.cpp): error reporting, the per-block context, the
 * model parameters (environment variables) and the scalar types half / bfloat16_t.
 *
 * Test harness only. See docs/ascendc_model.md for what is modelled and where each spelling was
 * checked. Every violation of a hardware rule prints
 *     ascend-model: rule N (<short name>): <what, with values> [block b/n of kernel k]
 * to stderr and calls abort(). Rule 0 is the model's own: out-of-bounds accesses ("bounds") and
 * anything the modelled subset does not cover ("model"). */
#ifndef OPGEN_ASCENDC_MODEL_CORE_H
#define OPGEN_ASCENDC_MODEL_CORE_H

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>

namespace ascend_model {

/* Report a rule violation and abort (defined in ascendc_model_runtime.cpp). */
[[noreturn]] void fail(int rule, const char *name, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* One running block (a thread of a launch). The runtime owns it; kernel_operator.h reads it. */
struct Block {
    int64_t idx = 0;   /* GetBlockIdx(): in [0, num * ration) */
    int64_t num = 1;   /* GetBlockNum(): numBlocks of the launch (AI Core groups in a MIX launch) */
    int64_t ration = 1; /* GetTaskRation(): 2 in a MIX launch (1 AIC : 2 AIV), else 1 */
    bool mix = false;   /* launched as KERNEL_TYPE_MIX_AIC_1_2 (build.py saw the macro in the kernel body) */
    int task_type = -1; /* the KERNEL_TASK_TYPE_DEFAULT value this block executed, -1: none */
    bool sys_ws_set = false; /* SetSysWorkspace() called */
    uint8_t *sys_ws = nullptr;
    int mm_objs = 0; /* Matmul objects registered (REGIST_MATMUL_OBJ, rule 11: at most 4) */
    uint8_t *ub = nullptr; /* this block's private Unified Buffer arena */
    uint32_t ub_size = 0;
    void *launch = nullptr; /* runtime-private */
    void *pipe = nullptr;   /* the live AscendC::TPipe, if any */
    int atomic = 0;         /* 0: off; else the AtomicKind of SetAtomicAdd<T>() */
    const char *atomic_type = nullptr;
    int outstanding[32] = {}; /* allocated (not freed) queue tensors per TPosition (rule 6) */
};

/* The calling thread's block; aborts (rule 0) outside a kernel launch. */
Block *block();
/* The calling thread's block or nullptr. */
Block *block_or_null();
/* SyncAll(): barrier over every block of the launch (rule 10 checks). */
void sync_all();
/* The lock that makes atomic-add copies to GM read-modify-write atomic. */
void gm_atomic_lock();
void gm_atomic_unlock();

/* A model parameter from the environment: unsigned decimal, else `dflt`. Bad values abort. */
inline uint64_t env_u64(const char *name, uint64_t dflt) {
    const char *s = getenv(name);
    if (!s || !*s) return dflt;
    char *end = nullptr;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end != '\0' || s[0] == '-') fail(0, "model", "environment variable %s=%s is not an unsigned integer", name, s);
    return v;
}
/* OPGEN_ASCEND_AIV_CORES: vector cores (default 48, Atlas A2 / 910B). */
inline uint32_t aiv_cores() {
    uint64_t v = env_u64("OPGEN_ASCEND_AIV_CORES", 48);
    if (v == 0 || v > 4096) fail(0, "model", "OPGEN_ASCEND_AIV_CORES=%llu is out of range [1, 4096]", (unsigned long long)v);
    return (uint32_t)v;
}
/* OPGEN_ASCEND_UB_SIZE: Unified Buffer bytes per vector core (default 196608 = 192 KiB). */
inline uint32_t ub_size() {
    uint64_t v = env_u64("OPGEN_ASCEND_UB_SIZE", 196608);
    if (v == 0 || v % 32 != 0 || v > (1u << 30))
        fail(0, "model", "OPGEN_ASCEND_UB_SIZE=%llu must be a positive multiple of 32 up to 1 GiB", (unsigned long long)v);
    return (uint32_t)v;
}

/* Sizes of A2 (dav-2201) the model fixes (not parameters): the library API's system workspace
 * (PlatformAscendC::GetLibApiWorkSpaceSize on 910B) and the cube unit's buffers. */
constexpr uint32_t kLibApiWorkspace = 16u * 1024 * 1024;
constexpr uint32_t kL1Size = 512u * 1024;
constexpr uint32_t kL0ASize = 64u * 1024;
constexpr uint32_t kL0BSize = 64u * 1024;
constexpr uint32_t kL0CSize = 128u * 1024;

/* ---- bfloat16: round-to-nearest-even from float, NaN kept (quiet, sign and top payload) ---- */
inline uint16_t f32_to_bf16_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
inline float bf16_bits_to_f32(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

}  // namespace ascend_model

/* `half`: IEEE binary16 (g++'s _Float16: conversions round to nearest even). */
using half = _Float16;

/* `bfloat16_t`: storage plus conversions (the model computes in float; A2's vector unit has no
 * bf16 arithmetic either, only Cast/Duplicate/copies). */
struct bfloat16_t {
    uint16_t bits_;
    bfloat16_t() = default;
    bfloat16_t(float f) : bits_(ascend_model::f32_to_bf16_bits(f)) {}
    operator float() const { return ascend_model::bf16_bits_to_f32(bits_); }
};
static_assert(sizeof(bfloat16_t) == 2 && sizeof(half) == 2, "2-byte half / bfloat16_t");

namespace ascend_model {

template <typename T, typename... Us>
inline constexpr bool is_one_of = (std::is_same_v<T, Us> || ...);

template <typename T>
inline constexpr bool is_float_like = is_one_of<T, half, bfloat16_t, float, double>;

template <typename T>
constexpr const char *type_name() {
    if constexpr (std::is_same_v<T, float>) return "float";
    else if constexpr (std::is_same_v<T, half>) return "half";
    else if constexpr (std::is_same_v<T, bfloat16_t>) return "bfloat16_t";
    else if constexpr (std::is_same_v<T, double>) return "double";
    else if constexpr (std::is_same_v<T, int8_t>) return "int8_t";
    else if constexpr (std::is_same_v<T, uint8_t>) return "uint8_t";
    else if constexpr (std::is_same_v<T, int16_t>) return "int16_t";
    else if constexpr (std::is_same_v<T, uint16_t>) return "uint16_t";
    else if constexpr (std::is_same_v<T, int32_t>) return "int32_t";
    else if constexpr (std::is_same_v<T, uint32_t>) return "uint32_t";
    else if constexpr (std::is_same_v<T, int64_t>) return "int64_t";
    else if constexpr (std::is_same_v<T, uint64_t>) return "uint64_t";
    else return "T";
}

}  // namespace ascend_model

#endif /* OPGEN_ASCENDC_MODEL_CORE_H */
