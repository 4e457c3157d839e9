/* opgen_rt.h — internal runtime shared by the generated kernels (not installed). Generated. */
#ifndef OPGEN_RT_H
#define OPGEN_RT_H

#include "opgen_types.h"
#include <math.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#define OPGEN_MAX_RANK 8
#define OPGEN_MAX_PARAMS 24
#define OPGEN_MAX_DIMS 16
#define OPGEN_MAX_VARS 8

/* A bound buffer as a kernel sees it: logical strides (elements); `ro`, when not NULL, holds
 * the element offset of each row of a Batch dim spread over several physical axes. */
typedef struct {
    void *data;
    int64_t st[OPGEN_MAX_RANK];
    const int64_t *ro;
} opgen_buf_t;

/* saturating size arithmetic: SIZE_MAX means "does not fit in size_t" and is sticky (an operand
 * of SIZE_MAX gives SIZE_MAX, even times 0). Workspace sizes are computed with these; the binder
 * turns a SIZE_MAX size into OPGEN_ERR_SHAPE. */
static inline size_t opgen_sz_mul(size_t a, size_t b) {
    size_t r;
    if (a == SIZE_MAX || b == SIZE_MAX || __builtin_mul_overflow(a, b, &r)) return SIZE_MAX;
    return r;
}
static inline size_t opgen_sz_add(size_t a, size_t b) {
    size_t r;
    if (__builtin_add_overflow(a, b, &r)) return SIZE_MAX;
    return r;
}
static inline size_t opgen_sz_dim(int64_t d) { return d < 0 ? SIZE_MAX : (size_t)d; }
static inline size_t opgen_sz_round64(size_t n) { return n > SIZE_MAX - 63 ? SIZE_MAX : (n + 63) / 64 * 64; }

typedef union {
    float f;
    int64_t i;
    bool b;
} opgen_scalar_t;

typedef opgen_status_t (*opgen_kernel_fn)(const opgen_buf_t *bufs, const int64_t *dims,
                                          const opgen_scalar_t *sc, char *ws);
typedef size_t (*opgen_ws_fn)(const int64_t *dims);
typedef opgen_status_t (*opgen_pre_fn)(const opgen_buf_t *bufs, const int64_t *dims, const opgen_scalar_t *sc);

enum { OPGEN_P_TENSOR = 0, OPGEN_P_F32 = 1, OPGEN_P_I64 = 2, OPGEN_P_BOOL = 3, OPGEN_P_SIZE = 4 };

typedef struct {
    const char *name;
    uint8_t kind, is_output, optional, last_contig, batch;
    int8_t dtype_var;       /* -1: fixed dtype (only one bit set in dtype_mask) */
    uint32_t dtype_mask;    /* allowed opgen_dtype_t values */
    int8_t rank;            /* logical rank (a Batch dim counts once) */
    int8_t dims[OPGEN_MAX_RANK]; /* dim id, or -1 for a literal size in lit[] */
    int64_t lit[OPGEN_MAX_RANK];
    int8_t batch_min, batch_max;
    int8_t size_dim;        /* OPGEN_P_SIZE: the dim it gives */
} opgen_param_t;

/* a kernel entry's dtype for a variable its kernel is not instantiated over: matches any */
#define OPGEN_ANY_DTYPE 0xffu

typedef struct {
    uint8_t dtypes[OPGEN_MAX_VARS];
    opgen_kernel_fn fn;
    opgen_ws_fn ws;
    opgen_pre_fn pre;  /* the op's run-time checks on scalars and sizes (no data read) */
} opgen_kernel_entry_t;

typedef struct {
    uint32_t present;       /* bit k: k-th optional parameter given */
    opgen_status_t rejected;  /* != SUCCESS: this combination is refused with this status */
    const char *message;
    int n_kernels;
    const opgen_kernel_entry_t *kernels;
    /* per parameter: the dtype the kernels read it in, converted by the binder into a dense
       workspace copy when the caller's tensor differs (-1: read as given); NULL: none */
    const int8_t *convert;
} opgen_variant_t;

typedef struct {
    const char *name;
    int n_params, n_dims, n_vars, n_variants, n_alias;
    const opgen_param_t *params;
    const char *const *dim_names;
    const opgen_variant_t *variants;
    const int8_t (*alias)[2]; /* (output param, input param) pairs that may share memory */
} opgen_op_t;

/* Validate and run (or, with validate_only, just size) one call. tensors[k] is the k-th
 * parameter's descriptor (NULL if absent or not a tensor); scalars[k] its scalar value. */
opgen_status_t opgen_run(const opgen_op_t *op, const opgen_tensor_t *const *tensors,
                         const opgen_scalar_t *scalars, void *ws, size_t ws_size,
                         size_t *ws_needed, int validate_only);

opgen_status_t opgen_fail(opgen_status_t st, const char *fmt, ...);

/* Segment tables (scatter-add, counts): opgen_seg.h. */

/* C[m x n] (= or +=) op(A) @ op(B) in f32; element (i, k) of op(A) is A[i * ars + k * acs],
 * (k, j) of op(B) is B[k * brs + j * bcs]; C row-major with leading dimension ldc. The k sum runs
 * in a fixed order (blocks of OPGEN_KC), so results do not depend on threads or alignment. */
void opgen_sgemm(int64_t m, int64_t n, int64_t k, const float *A, int64_t ars, int64_t acs,
                 const float *B, int64_t brs, int64_t bcs, float *C, int64_t ldc, int accumulate);
/* opgen_sgemm with its blocks of rows spread over the threads of a parallel region it opens
 * (opgen_team()): B is packed once per k block for all of them. Bitwise the same result. */
void opgen_sgemm_par(int64_t m, int64_t n, int64_t k, const float *A, int64_t ars, int64_t acs,
                     const float *B, int64_t brs, int64_t bcs, float *C, int64_t ldc, int accumulate);

/* opgen_sgemm with op(A) and op(B) rounded to bf16 for the products where the CPU has bf16 units
 * (AMX tiles, or AVX512-BF16 dot products: opgen_bf16_units()): sched.matmul's `products` bf16.
 * Per machine deterministic, independent of threads; not the f32 GEMM's bits where the units run;
 * exactly opgen_sgemm elsewhere or with OPGEN_BF16_UNITS=none. */
void opgen_bgemm(int64_t m, int64_t n, int64_t k, const float *A, int64_t ars, int64_t acs,
                 const float *B, int64_t brs, int64_t bcs, float *C, int64_t ldc, int accumulate);
void opgen_bgemm_par(int64_t m, int64_t n, int64_t k, const float *A, int64_t ars, int64_t acs,
                     const float *B, int64_t brs, int64_t bcs, float *C, int64_t ldc, int accumulate);
/* opgen_sgemm's right-hand operand packed ahead (sched.pack of f32 products): op(B) (k x n) into
 * p, which holds k x round32(n) floats; opgen_sgemm_pb: opgen_sgemm (one thread, the same bits)
 * reading B from p. */
void opgen_spack(int64_t k, int64_t n, const float *B, int64_t brs, int64_t bcs, float *p);
void opgen_sgemm_pb(int64_t m, int64_t n, int64_t k, const float *A, int64_t ars, int64_t acs, const float *B,
                    int64_t brs, int64_t bcs, const float *pb, float *C, int64_t ldc, int accumulate);
/* opgen_bgemm's right-hand operand packed ahead (sched.pack): op(B) (k x n) into p, which holds
 * round32(k) x round32(n) words; nothing where opgen_bgemm does not run on bf16 units.
 * opgen_bgemm_pb: opgen_bgemm (one thread, the same bits) reading B from p where opgen_bpack
 * packed it, else from B (the same B: a matmul given both, hoist-packing). */
void opgen_bpack(int64_t k, int64_t n, const float *B, int64_t brs, int64_t bcs, uint16_t *p);
void opgen_bgemm_pb(int64_t m, int64_t n, int64_t k, const float *A, int64_t ars, int64_t acs, const float *B,
                    int64_t brs, int64_t bcs, const uint16_t *pb, float *C, int64_t ldc, int accumulate);
/* opgen_sgemm for bf16 operands in memory (caller tensors): on the bf16 units where opgen_bgemm runs
 * there, else the f32 GEMM on their exact f32 values (bitwise opgen_sgemm's result on them). */
void opgen_gemm_bf16(int64_t m, int64_t n, int64_t k, const uint16_t *A, int64_t ars, int64_t acs,
                     const uint16_t *B, int64_t brs, int64_t bcs, float *C, int64_t ldc, int accumulate);
void opgen_gemm_bf16_par(int64_t m, int64_t n, int64_t k, const uint16_t *A, int64_t ars, int64_t acs,
                         const uint16_t *B, int64_t brs, int64_t bcs, float *C, int64_t ldc, int accumulate);
/* opgen_gemm_bf16 into a bf16 C (a caller's output): each element's f32 sum rounded once. */
void opgen_gemm_bf16_out(int64_t m, int64_t n, int64_t k, const uint16_t *A, int64_t ars, int64_t acs,
                         const uint16_t *B, int64_t brs, int64_t bcs, uint16_t *C, int64_t ldc, int accumulate);
void opgen_gemm_bf16_out_par(int64_t m, int64_t n, int64_t k, const uint16_t *A, int64_t ars, int64_t acs,
                             const uint16_t *B, int64_t brs, int64_t bcs, uint16_t *C, int64_t ldc, int accumulate);
/* The same for f16 operands in memory: the f32 GEMM on their exact f32 values (bitwise
 * opgen_sgemm's result on them), into an f32 C or, each element rounded once, an f16 one. */
void opgen_gemm_f16(int64_t m, int64_t n, int64_t k, const uint16_t *A, int64_t ars, int64_t acs,
                    const uint16_t *B, int64_t brs, int64_t bcs, float *C, int64_t ldc, int accumulate);
void opgen_gemm_f16_par(int64_t m, int64_t n, int64_t k, const uint16_t *A, int64_t ars, int64_t acs,
                        const uint16_t *B, int64_t brs, int64_t bcs, float *C, int64_t ldc, int accumulate);
void opgen_gemm_f16_out(int64_t m, int64_t n, int64_t k, const uint16_t *A, int64_t ars, int64_t acs,
                        const uint16_t *B, int64_t brs, int64_t bcs, uint16_t *C, int64_t ldc, int accumulate);
void opgen_gemm_f16_out_par(int64_t m, int64_t n, int64_t k, const uint16_t *A, int64_t ars, int64_t acs,
                            const uint16_t *B, int64_t brs, int64_t bcs, uint16_t *C, int64_t ldc, int accumulate);
/* Whether a batched parameter's row table ro (n offsets, in elements) is evenly spaced,
 * ro[i] = *base + i * *stride (then both are set; n <= 1: the first offset and stride 0): its rows
 * then read as one strided matrix (a sched.matmul's GEMM). */
int opgen_rows_even(const int64_t *ro, int64_t n, int64_t *base, int64_t *stride);
/* The bf16 units opgen_bgemm runs on in this process (decided once): 2 AMX tiles, 1 AVX512-BF16
 * dot products, 0 none (the f32 GEMM). OPGEN_BF16_UNITS=amx, dp or none caps the choice. */
int opgen_bf16_units(void);

/* A hint that the line `ahead` bytes past element `off` of p will be read soon (map-cpu's
 * `stream` loops). The address is integer arithmetic, so no pointer past an object is formed;
 * a prefetch reads nothing and never faults. */
#define OPGEN_PREFETCH_ADDR(p, off, ahead) ((const void *)((uintptr_t)(p) + (uintptr_t)(off) * sizeof *(p) + (uintptr_t)(ahead)))
#define OPGEN_PREFETCH(p, off, ahead) __builtin_prefetch(OPGEN_PREFETCH_ADDR(p, off, ahead))
/* the same, into the second-level cache only (prefetcht2 on x86): sched.prefetch l2, the streams of
 * a pass that writes no row of a caller's tensor */
#define OPGEN_PREFETCH_L2(p, off, ahead) __builtin_prefetch(OPGEN_PREFETCH_ADDR(p, off, ahead), 0, 1)
/* the same, for bytes about to be written: the line fetched for ownership (prefetchw) */
#define OPGEN_PREFETCH_W(p, off, ahead) __builtin_prefetch(OPGEN_PREFETCH_ADDR(p, off, ahead), 1)

/* exp(x) in f32, branch-free so that loops calling it vectorise (libm's expf does not: a call).
 * x = n ln2 + r with |r| <= ln2 / 2 (ln2 in two parts, fused multiply-adds), e^r as
 * 1 + r + r^2 Q(r), Q of degree 4 (a minimax fit of the relative error made for opgen: 3.6e-9 with
 * its f32 coefficients, where the degree-7 Taylor polynomial before it had 5.2e-9 and one more
 * multiply-add: exp 5% and GELU backward's loop 2-3% less time in cache on a Zen 5; 0.89 ulp at
 * most over every input, was 0.94), 2^n built in two halves (results down to the subnormals); overflow gives
 * +inf, underflow 0, NaN NaN. Each step is a vector instruction on the float's bits where a float
 * select would be a compare, a mask and a blend on the ports the fused multiply-adds need (GCC
 * does not turn `x < lo ? lo : x` into min/max while signed zeros and NaNs count):
 *  - the clamp to [-103.972084, 88.7228394] is one unsigned and one signed integer min on the
 *    bits (as unsigned, every negative is above every positive and a larger magnitude above a
 *    smaller; as signed, every negative is below every positive); NaN goes to one end, and exp
 *    of either end comes out as 0 or +inf by itself, so only NaN needs a select at the end;
 *  - n = rint(x log2 e) by adding and taking off 1.5 * 2^23 + 254 (round to nearest even, as
 *    rintf: the f32 product rounded first; the constant is even), and the two halves of 2^n with
 *    their exponent bias from the sum's bits by a shift, a subtraction and two shifts: no
 *    float-to-integer conversion.
 * (Against three selects before and after, then a clamp on order-preserving bits, rintf and
 * a conversion: the same bits over every f32 input at each step; the last step took 17% off
 * GELU backward's loop in cache and 18% off SiLU's on an AVX-512 Xeon.) Maximum error 1 ulp
 * against the correctly rounded result, measured over every f32 input (tests/test_vector_math.py,
 * docs/backend_cpu.md). The same bits on every machine with FMA: no table, no data-dependent
 * branch. */
static inline float opgen_expf(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    u = u < 0xc2cff1b5u ? u : 0xc2cff1b5u;        /* -103.97208404541015625f and every negative beyond */
    int32_t k = (int32_t)u;
    k = k < 0x42b17218 ? k : 0x42b17218;          /* 88.72283935546875f and every positive beyond */
    float xc;
    memcpy(&xc, &k, sizeof xc);
    /* 1.5 * 2^23 + 254: the sum is an integer, and its bits are 0x4b4000fe + n (n in [-150, 128]) */
    const float t = xc * 1.44269504088896341f + 12583166.0f;
    const float n = t - 12583166.0f;
    float r = fmaf(n, -0.693145751953125f, xc);
    r = fmaf(n, -1.428606765330187045e-06f, r);
    float p = 0.0013814539879282838f;
    p = fmaf(p, r, 0.00836874512710635f);
    p = fmaf(p, r, 0.04166839078966848f);
    p = fmaf(p, r, 0.1666652039884673f);
    p = fmaf(p, r, 0.4999999343209917f);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    int32_t tb;
    memcpy(&tb, &t, sizeof tb);
    const int32_t h = tb >> 1; /* 0x25a00000 + 127 + floor(n / 2); tb - h = 0x25a00000 + 127 + n - floor(n / 2) */
    /* shifted by 23, 0x25a00000 leaves the word: the biased exponent fields of 2^floor(n/2) and
     * 2^(n - floor(n/2)), each in [52, 191] */
    const uint32_t b1 = (uint32_t)h << 23, b2 = (uint32_t)(tb - h) << 23;
    float s1, s2;
    memcpy(&s1, &b1, sizeof s1);
    memcpy(&s2, &b2, sizeof s2);
    const float y = p * s1 * s2;
    return x != x ? x : y;
}

/* erf(x) in f32, branch-free like opgen_expf (loops calling it vectorise). |x| <= 0.875:
 * x (c0 + t Q(t)), t = x^2, Q of degree 4 (a least-squares fit of erf(x)/x made for opgen);
 * 0.875 < |x| < 3.925: erf(|x|) itself as a degree-14 polynomial in u = (|x| - 2.4) / 1.525,
 * with x's sign (Chebyshev interpolation made for opgen: 1.1e-9 in exact arithmetic, the f32
 * evaluation's rounding dominates; no exp and no division, where erf(|x|) = 1 - exp(-x^2) R(1/|x|)
 * needed both: 2-3x the time); beyond, +-1; NaN NaN. (Clamped on the bits, with no select for
 * the +-1 beyond or for NaN: the same bits as three selects, 27% less time in cache on AVX2.)
 * Maximum error measured over every f32 input: docs/backend_cpu.md (tests/test_vector_math.py). */
static inline float opgen_erff(float x) { /* (coefficients: opgen/vmath.py, shared with Ascend C's expansion) */
    const float ax = fabsf(x), t = x * x;
    float q = -0.000621850333703725f;
    q = fmaf(q, t, 0.005035122163087297f);
    q = fmaf(q, t, -0.02679345258632669f);
    q = fmaf(q, t, 0.11282510452903068f);
    q = fmaf(q, t, -0.3761255583914355f);
    const float small = copysignf(fmaf(x, 1.1283791583388356f, x * (t * q)), x); /* (-0 stays -0) */
    int32_t ab; /* |x| clamped to [0.875, 3.925] on its bits (non-negative floats order as integers) */
    memcpy(&ab, &ax, sizeof ab);
    ab = ab < 0x3f600000 ? 0x3f600000 : ab; /* 0.875f */
    ab = ab > 0x407b3333 ? 0x407b3333 : ab; /* 3.925f */
    float a;
    memcpy(&a, &ab, sizeof a);
    const float u = fmaf(a, 0.655737698f, -1.57377052f);
    float r = 0.000506156648f;
    r = fmaf(r, u, -0.000278549502f);
    r = fmaf(r, u, -0.00300504407f);
    r = fmaf(r, u, 0.00407216279f);
    r = fmaf(r, u, 0.0041298815f);
    r = fmaf(r, u, -0.0153747909f);
    r = fmaf(r, u, 0.0152648911f);
    r = fmaf(r, u, 0.00487277936f);
    r = fmaf(r, u, -0.0387865752f);
    r = fmaf(r, u, 0.0650214553f);
    r = fmaf(r, u, -0.0655373856f);
    r = fmaf(r, u, 0.0442272201f);
    r = fmaf(r, u, -0.019845888f);
    r = fmaf(r, u, 0.00542218378f);
    r = fmaf(r, u, 0.999311507f);
    /* (r is 1 at a = 3.925 exactly: no select for the +-1 beyond; NaN takes the small branch,
     * whose polynomial carries it through) */
    return ax > 0.875f ? copysignf(r, x) : small;
}

/* tanh(x) in f32, branch-free like opgen_expf: |x| < 0.55: x + x^3 Q(x^2) (Q a least-squares fit made
 * for opgen, degree 5); beyond, 1 - 2 / (exp(2|x|) + 1) with x's sign (exactly +-1 from 9.0109 on);
 * NaN NaN. Maximum error measured over every f32 input: docs/backend_cpu.md
 * (tests/test_vector_math.py). */
static inline float opgen_tanhf(float x) { /* (coefficients: opgen/vmath.py) */
    const float ax = fabsf(x), t = x * x;
    float q = 0.0025284624216840666f;
    q = fmaf(q, t, -0.008527901334843942f);
    q = fmaf(q, t, 0.021818864535928895f);
    q = fmaf(q, t, -0.05396474530547813f);
    q = fmaf(q, t, 0.1333332436867869f);
    q = fmaf(q, t, -0.3333333329599166f);
    const float small = copysignf(fmaf(x * t, q, x), x); /* (-0 stays -0) */
    /* (1 by itself from |x| = 9.0109, where 2 e^-2|x| falls below half an ulp of 1; NaN through
     * exp: no select for either) */
    const float big = 1.0f - 2.0f / (opgen_expf(2.0f * ax) + 1.0f);
    return ax < 0.55f ? small : copysignf(big, x);
}

/* The bits of b where cond holds, else those of a: a mask blend rather than a select, so that the
 * compiler does not turn it into a branch and sink the work before it into one side (a division
 * there may trap, so it would not be speculated again and the calling loop would stay scalar). */
static inline uint32_t opgen_bits_select(int cond, uint32_t b, uint32_t a) {
    const uint32_t m = (uint32_t)0 - (uint32_t)(cond != 0);
    return (b & m) | (a & ~m);
}

/* log(x) in f32, branch-free like opgen_expf: x = 2^k m with m in [sqrt(1/2), sqrt(2)) read from
 * the bits (subnormals scaled by 2^23 first), log(m) = log(1 + f) = f - f^2/2 + s (f^2/2 + R(s^2)),
 * s = f / (2 + f), R of degree 4 in s^2 (the classic fdlibm coefficients), k ln2 in two parts.
 * +inf for +inf, -inf for +-0, NaN for NaN and x < 0. Maximum error measured over every f32 input:
 * docs/backend_cpu.md (tests/test_vector_math.py). */
static inline float opgen_logf(float x) {
    uint32_t ix, is, mb, yb;
    memcpy(&ix, &x, sizeof ix);
    const int sub = ix < 0x00800000u; /* +0 and the positive subnormals */
    const float xs = sub ? x * 8388608.0f : x;
    memcpy(&is, &xs, sizeof is);
    const uint32_t t = is - 0x3f3504f3u; /* 0x3f3504f3: sqrt(1/2) */
    const int32_t k = (int32_t)(t >> 23) - (int32_t)((t >> 31) << 9) - (sub ? 23 : 0); /* t >> 23 signed */
    mb = (t & 0x007fffffu) + 0x3f3504f3u;
    float m;
    memcpy(&m, &mb, sizeof m);
    const float f = m - 1.0f, s = f / (2.0f + f), z = s * s, w = z * z;
    const float r = fmaf(w, fmaf(w, 0.24279078841f, 0.40000972152f), z * fmaf(w, 0.28498786688f, 0.66666662693f));
    const float hfsq = 0.5f * f * f, kf = (float)k;
    const float y = fmaf(kf, 0.693145751953125f, -((hfsq - fmaf(s, hfsq + r, kf * 1.428606765330187045e-06f)) - f));
    memcpy(&yb, &y, sizeof yb);
    uint32_t rb = opgen_bits_select(ix >= 0x7f800000u, opgen_bits_select(ix == 0x7f800000u, ix, 0x7fc00000u), yb);
    rb = opgen_bits_select((ix << 1) == 0, 0xff800000u, rb);
    float out;
    memcpy(&out, &rb, sizeof out);
    return out;
}

/* x rounded up to a multiple of 64 (workspace temporaries start at such offsets); saturating:
 * SIZE_MAX for x > SIZE_MAX - 63, never a wrap. */
static inline size_t opgen_align(size_t x) { return x > SIZE_MAX - 63 ? SIZE_MAX : (x + 63) & ~(size_t)63; }

/* Threads of the generated kernels' parallel regions.
 * opgen_team_cap(): a process-wide upper bound on the threads of any parallel region, fixed once
 *   (omp_get_max_threads() when the library is loaded, i.e. OMP_NUM_THREADS or the core count).
 *   Per-thread scratch in a workspace is sized with it, so a workspace size does not depend on
 *   the thread that asked for it or the one that runs the op.
 * opgen_team(): the threads for a parallel region started now by the calling thread:
 *   min(omp_get_max_threads(), opgen_team_cap()); 1 in a process forked after this library ran
 *   a region with several threads (libgomp's thread pool does not survive fork(): a child that
 *   starts a region of 2+ threads hangs; one of 1 thread does not).
 * Kernels open regions with `#pragma omp parallel for schedule(static) num_threads(opgen_team())`
 * and index per-thread scratch with omp_get_thread_num() < opgen_team() <= opgen_team_cap(). */
int opgen_team_cap(void);
int opgen_team(void);

/* f16 / bf16 <-> f32 with round-to-nearest-even (NaN stays NaN). */
static inline float opgen_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint16_t opgen_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
/* With nt (opgen_nt), the 64-byte line at src (64-byte aligned) to dst around the caches (a
 * streaming store), when dst is a whole aligned line and the machine has the instruction; 1 when
 * it did, 0 (nothing written) otherwise. The strip stores below call it. */
static inline int opgen_stream_line(void *dst, const void *src, int nt) {
#if defined(__AVX512F__)
    if (nt && !((uintptr_t)dst & 63)) {
        _mm512_stream_si512(dst, _mm512_load_si512(src));
        return 1;
    }
#elif defined(__AVX__)
    if (nt && !((uintptr_t)dst & 63)) {
        _mm256_stream_si256((__m256i *)dst, _mm256_load_si256((const __m256i *)src));
        _mm256_stream_si256((__m256i *)dst + 1, _mm256_load_si256((const __m256i *)src + 1));
        return 1;
    }
#endif
    (void)dst, (void)src, (void)nt;
    return 0;
}
#if defined(__AVX512BF16__)
/* The 32 f32 values at src (64-byte aligned) rounded to bf16 as opgen_f32_to_bf16, in order: one
 * vcvtne2ps2bf16 (round to nearest even, a NaN quieted), with the denormal fix described below. */
static inline __m512i opgen_bf16_round32(const float *src) {
    const __m512i one = _mm512_set1_epi32(0x00800000);
    __m512i lo = _mm512_load_si512((const void *)src), hi = _mm512_load_si512((const void *)(src + 16));
    const __mmask16 dlo = _mm512_fpclass_ps_mask(_mm512_castsi512_ps(lo), 0x20); /* 0x20: denormal */
    const __mmask16 dhi = _mm512_fpclass_ps_mask(_mm512_castsi512_ps(hi), 0x20);
    if (__builtin_expect(_kortestz_mask16_u8(dlo, dhi), 1))
        return (__m512i)_mm512_cvtne2ps_pbh(_mm512_castsi512_ps(hi), _mm512_castsi512_ps(lo));
    lo = _mm512_mask_add_epi32(lo, dlo, lo, one);
    hi = _mm512_mask_add_epi32(hi, dhi, hi, one);
    const __m512i r = (__m512i)_mm512_cvtne2ps_pbh(_mm512_castsi512_ps(hi), _mm512_castsi512_ps(lo));
    return _mm512_mask_sub_epi16(r, ((__mmask32)dhi << 16) | dlo, r, _mm512_set1_epi16(0x80));
}
/* The 64 bytes r at dst: around the caches where nt and dst is a whole aligned line. */
static inline void opgen_bf16_line(uint16_t *dst, __m512i r, int nt) {
    if (nt && !((uintptr_t)dst & 63))
        _mm512_stream_si512((void *)dst, r);
    else
        _mm512_storeu_si512((void *)dst, r);
}
#endif
/* n f32 values (src, 64-byte aligned) to bf16 at dst, element stride st, each rounded as
 * opgen_f32_to_bf16: map-cpu's staged stores, a stream loop's strip at a time. With AVX512-BF16
 * a contiguous strip of 32 takes one vcvtne2ps2bf16 (round to nearest even, a NaN quieted as
 * above). That instruction reads denormal inputs as zero; such a lane (exponent field 0) gets 2^23
 * added to its bits first, which makes it normal without changing the 16 bits that are
 * rounded away, and its result 0x80 taken off again: the bits of the scalar rounding. The fix
 * runs only for a strip that holds a denormal (one kortest, predicted not taken): it costs more
 * than the conversion (docs/backend_cpu.md, `staged`).
 * With AVX2 a contiguous strip takes the scalar rounding's integer steps 8 lanes at a time and
 * one pack per 16 (GCC's vectorisation of the scalar loop blends after packing, twice the work).
 * nt (map-cpu's `nontemporal` stores, opgen_nt): a contiguous strip of one whole aligned 64-byte
 * line goes around the caches (opgen_f32_store_strip). */
static inline void opgen_bf16_store_strip(uint16_t *dst, int64_t st, const float *src, int n, int nt) {
#if defined(__AVX512BF16__)
    if (st == 1 && n == 32) {
        opgen_bf16_line(dst, opgen_bf16_round32(src), nt);
        return;
    }
#elif defined(__AVX2__)
    if (st == 1 && n % 16 == 0) {
        const int stream = nt && n == 32 && !((uintptr_t)dst & 63);
        for (int h = 0; h < n; h += 16) {
            __m256i r[2];
            for (int q = 0; q < 2; q++) {
                const __m256 x = _mm256_load_ps(src + h + 8 * q);
                const __m256i u = _mm256_castps_si256(x);
                const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
                const __m256i v = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb);
                const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)); /* quieted */
                r[q] = _mm256_srli_epi32(_mm256_blendv_epi8(v, _mm256_or_si256(u, _mm256_set1_epi32(0x400000)), nan), 16);
            }
            const __m256i w = _mm256_permute4x64_epi64(_mm256_packus_epi32(r[0], r[1]), 0xd8);
            if (stream)
                _mm256_stream_si256((__m256i *)(void *)(dst + h), w);
            else
                _mm256_storeu_si256((__m256i *)(void *)(dst + h), w);
        }
        return;
    }
#endif
    (void)nt;
    for (int l = 0; l < n; l++) dst[l * st] = opgen_f32_to_bf16(src[l]);
}
/* Sixteen-bit pairs (map-cpu's `pairs` loops: a strip's first and second elements of each pair
 * as two vectors of their own). A bf16 element is the high half of an f32, so the 32-bit word
 * holding a pair widens to its two f32 values by one shift (the first) and one mask (the second):
 * two instructions per 32 elements, the load folded in, where widening them in order takes a
 * load, an extract, two vpmovzxwd and two shifts (a bf16 dot product 0.080 -> 0.039 ns an
 * element in cache, one thread: docs/backend_cpu.md, `pairs`). opgen_bf16_first(p): the element
 * at p, the first of its pair; opgen_bf16_second(p): the element at p, the second of its pair
 * (the word starts at p - 1). Exact: the bits of opgen_bf16_to_f32. */
static inline float opgen_bf16_first(const uint16_t *p) {
    uint32_t u;
    memcpy(&u, p, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    u &= 0xffff0000u;
#else
    u <<= 16;
#endif
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline float opgen_bf16_second(const uint16_t *p) {
    uint32_t u;
    memcpy(&u, p - 1, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    u <<= 16;
#else
    u &= 0xffff0000u;
#endif
    float f;
    memcpy(&f, &u, 4);
    return f;
}
/* opgen_bf16_store_strip of a `pairs` strip: src holds the n/2 first elements of the strip's
 * pairs, then the n/2 second ones (n even); dst, st, nt and the bits as opgen_bf16_store_strip.
 * With AVX512-BF16 a contiguous strip of 32 takes one vcvtne2ps2bf16 (the same denormal fix)
 * and one vpermw that interleaves the halves. */
static inline void opgen_bf16_store_strip_pairs(uint16_t *dst, int64_t st, const float *src, int n, int nt) {
#if defined(__AVX512BF16__)
    if (st == 1 && n == 32) {
        /* word 2j <- word j (a first), word 2j + 1 <- word 16 + j (a second) */
        const __m512i pairs = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                               23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
        opgen_bf16_line(dst, _mm512_permutexvar_epi16(pairs, opgen_bf16_round32(src)), nt);
        return;
    }
#endif
    for (int c = 0; c < n; c += 64) { /* (in order, 64 at a time, through opgen_bf16_store_strip) */
        _Alignas(64) float v[64];
        const int m = n - c < 64 ? n - c : 64;
        for (int j = 0; j < m / 2; j++) {
            v[2 * j] = src[c / 2 + j];
            v[2 * j + 1] = src[n / 2 + c / 2 + j];
        }
        opgen_bf16_store_strip(dst + (int64_t)c * st, st, v, m, nt);
    }
}
/* n f32 values (src, 64-byte aligned) to dst, element stride st: map-cpu's `nontemporal` stores
 * of an f32 buffer. With nt (opgen_nt) a contiguous strip of 16 on one aligned 64-byte line goes
 * around the caches (a streaming store): a line written whole is not read first, so an output
 * larger than the caches costs its bytes once, not twice (embedding backward's rows, a norm's
 * grad_x: docs/backend_cpu.md). Other strips are stored as they are; the values are the same. */
static inline void opgen_f32_store_strip(float *dst, int64_t st, const float *src, int n, int nt) {
    if (st == 1 && n == 16 && opgen_stream_line(dst, src, nt)) return;
    if (st == 1) {
        memcpy(dst, src, sizeof(float) * (size_t)n);
        return;
    }
    for (int l = 0; l < n; l++) dst[l * st] = src[l];
}
/* Whether a kernel's `nontemporal` stores into the output at p of `bytes` stream around the
 * caches: from opgen_nt_bytes() on (an output that large would leave the last-level cache before
 * anyone read it back), and only into memory already resident (its first, middle and last pages:
 * mincore on Linux). A freshly allocated output — what numpy and PyTorch's CPU allocator hand out
 * for large tensors — is zeroed by the OS through the cache page by page as the kernel first
 * touches it, and streaming past those lines then costs more than it saves (embedding backward
 * f32: 7.8 -> 9.2 ms into fresh pages, 5.3 -> 3.6 ms into resident ones). */
size_t opgen_nt_bytes(void);
int opgen_nt(const void *p, size_t bytes);

/* Zero hints: the caller promises that each of the n ranges [p[i], p[i] + bytes[i]) holds only
 * zero bytes until its next opgen_zero_hint call on this thread (n = 0 withdraws every promise:
 * call it after the op). A kernel then skips the stores of +0 map-cpu marked `zero_fill` into an
 * output inside such a range — the rows of an embedding gradient no index hits — so the pages
 * only they would touch are never faulted in. The Python API makes the promise for the large
 * outputs it allocates zeroed (fresh pages from the OS); nothing else does. opgen_known_zero:
 * whether [p, p + bytes) lies inside one of this thread's ranges (read before a kernel's parallel
 * region, on the calling thread). */
void opgen_zero_hint(const void *const *p, const size_t *bytes, int n);
int opgen_known_zero(const void *p, size_t bytes);
/* After a thread's streaming stores, before another thread may read what they wrote: they are
 * weakly ordered (the end of each parallel loop that has them, inside its region). */
static inline void opgen_stream_fence(void) {
#if defined(__x86_64__) || defined(__i386__)
    _mm_sfence();
#endif
}
/* f16 <-> f32 in integer and exact f32 steps, without branches, so that loops calling them
 * vectorise: GCC converts a _Float16 with one scalar F16C instruction per value where the CPU
 * lacks AVX512-FP16, and no loop holding one vectorised (SiLU backward f16 on the Zen 5: 7.8 ns
 * an element in cache, 30 times bf16's time). The bits are the IEEE conversion's, a NaN quieted,
 * round to nearest even (the F16C instructions' for every one of the 2^16 and 2^32 inputs:
 * tests/test_vector_math.py). opgen_f32_to_f16 rounds an f16 subnormal by an f32 addition of 0.5
 * (ulp 2^-24), in the default rounding mode; a subnormal f32 (DAZ or not) rounds to zero either way. */
static inline float opgen_f16_to_f32(uint16_t h) {
    const uint32_t e = h & 0x7c00u, m = h & 0x03ffu;
    const uint32_t normal = ((uint32_t)(h & 0x7fffu) << 13) + 0x38000000u; /* the exponent rebiased */
    const uint32_t special = 0x7f800000u | (m << 13) | (m ? 0x00400000u : 0u); /* Inf, or a NaN quieted */
    const float tiny = (float)m * 5.9604644775390625e-08f; /* zero or subnormal: m * 2^-24, exact */
    uint32_t t;
    memcpy(&t, &tiny, 4);
    const uint32_t u = ((uint32_t)(h & 0x8000u) << 16) | (e == 0x7c00u ? special : e == 0 ? t : normal);
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint16_t opgen_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    const uint32_t s = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    /* [2^-14, 65520): the 13 dropped bits rounded to nearest even, the exponent rebiased */
    const uint32_t normal = (a + 0x0fffu + ((a >> 13) & 1u) - 0x38000000u) >> 13;
    /* below 2^-14: multiples of 2^-24, rounded by the f32 addition of 0.5 (its ulp 2^-24) */
    float af;
    memcpy(&af, &a, 4);
    const float t = af + 0.5f;
    uint32_t tu;
    memcpy(&tu, &t, 4);
    const uint32_t tiny = tu - 0x3f000000u;
    const uint32_t big = a > 0x7f800000u ? (0x7e00u | ((a >> 13) & 0x3ffu)) : 0x7c00u; /* NaN quieted; Inf */
    const uint32_t r = a >= 0x477ff000u ? big : a < 0x38800000u ? tiny : normal;
    return (uint16_t)(s | r);
}
/* n f32 values (src, 64-byte aligned) rounded to f16 at dst, element stride st, each as
 * opgen_f32_to_f16: map-cpu's `nontemporal` stores of an f16 buffer (nt: as
 * opgen_f32_store_strip, a strip of 32 on one aligned line). With AVX-512 a contiguous strip of
 * 32 takes two vcvtps2ph (round to nearest even by the immediate, whatever MXCSR says: the bits of
 * opgen_f32_to_f16, tests/test_vector_math.py). */
static inline void opgen_f16_store_strip(uint16_t *dst, int64_t st, const float *src, int n, int nt) {
#if defined(__AVX512F__)
    if (st == 1 && n == 32) {
        const int rne = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
        const __m512i r = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtps_ph(_mm512_load_ps(src), rne)),
                                             _mm512_cvtps_ph(_mm512_load_ps(src + 16), rne), 1);
        if (nt && !((uintptr_t)dst & 63))
            _mm512_stream_si512((void *)dst, r);
        else
            _mm512_storeu_si512((void *)dst, r);
        return;
    }
#endif
    if (nt && st == 1 && n == 32 && !((uintptr_t)dst & 63)) {
        _Alignas(64) uint16_t h[32];
#pragma omp simd
        for (int l = 0; l < 32; l++) h[l] = opgen_f32_to_f16(src[l]);
        if (opgen_stream_line(dst, h, nt)) return;
    }
    if (st == 1) { /* (a loop of its own, vectorised) */
#pragma omp simd
        for (int l = 0; l < n; l++) dst[l] = opgen_f32_to_f16(src[l]);
        return;
    }
    for (int l = 0; l < n; l++) dst[l * st] = opgen_f32_to_f16(src[l]);
}
/* n f16 values from src (contiguous) widened to f32 at dst (64-byte aligned): map-cpu's staged
 * loads of an f16 row, a stream loop's strip at a time (two vcvtph2ps per 32 with AVX-512,
 * exact: the bits of opgen_f16_to_f32, tests/test_interleave.py). */
static inline void opgen_f16_load_strip(float *dst, const uint16_t *src, int n) {
#if defined(__AVX512F__)
    if (n == 32) {
        _mm512_store_ps(dst, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)src)));
        _mm512_store_ps(dst + 16, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(src + 16))));
        return;
    }
#endif
#pragma omp simd
    for (int l = 0; l < n; l++) dst[l] = opgen_f16_to_f32(src[l]);
}
/* tab[src[l]] for the n 16-bit elements from src (contiguous) at dst (64-byte aligned): map-cpu's
 * staged table lookups (a sched.load_fn of a bf16 or f16 row, opgen/lower/tabulate.py), a stream
 * loop's strip at a time. Four indices are read at once and each looked-up value inserted into a
 * 4-lane vector (a load and a shuffle), four of those joined into one 16-lane store: on the Zen 5
 * machine a loop of these took 0.25 ns an element where vpgatherdd took 0.38, and GELU backward
 * bf16 0.42 -> 0.26 ns an element (one thread, data and table in cache; docs/backend_cpu.md). */
static inline void opgen_table_load_strip(float *dst, const float *tab, const uint16_t *src, int n) {
#if defined(__AVX512F__)
    if (n % 16 == 0) {
        for (int l = 0; l < n; l += 16) {
            __m128 p[4];
            for (int k = 0; k < 4; k++) {
                uint64_t q;
                memcpy(&q, src + l + 4 * k, sizeof q);
                __m128 v = _mm_load_ss(&tab[q & 0xffff]);
                v = _mm_insert_ps(v, _mm_load_ss(&tab[(q >> 16) & 0xffff]), 0x10);
                v = _mm_insert_ps(v, _mm_load_ss(&tab[(q >> 32) & 0xffff]), 0x20);
                p[k] = _mm_insert_ps(v, _mm_load_ss(&tab[q >> 48]), 0x30);
            }
            __m512 w = _mm512_insertf32x4(_mm512_castps128_ps512(p[0]), p[1], 1);
            w = _mm512_insertf32x4(_mm512_insertf32x4(w, p[2], 2), p[3], 3);
            _mm512_store_ps(dst + l, w);
        }
        return;
    }
#endif
#if defined(__SSE4_1__)
    if (n % 4 == 0) {
        for (int l = 0; l < n; l += 4) {
            uint64_t q;
            memcpy(&q, src + l, sizeof q);
            __m128 v = _mm_load_ss(&tab[q & 0xffff]);
            v = _mm_insert_ps(v, _mm_load_ss(&tab[(q >> 16) & 0xffff]), 0x10);
            v = _mm_insert_ps(v, _mm_load_ss(&tab[(q >> 32) & 0xffff]), 0x20);
            v = _mm_insert_ps(v, _mm_load_ss(&tab[q >> 48]), 0x30);
            _mm_store_ps(dst + l, v);
        }
        return;
    }
#endif
    for (int l = 0; l < n; l++) dst[l] = tab[src[l]];
}
/* n bool flags from src (contiguous bytes, 0 or 1) as 0.0f / 1.0f at dst (64-byte aligned): map-cpu's
 * staged loads of a mask row, so that a strip's loop holds 4-byte lanes only (GCC 12 gives a loop
 * mixing 1-byte flags with floats 8-byte vectors). */
static inline void opgen_bool_load_strip(float *dst, const uint8_t *src, int n) {
#if defined(__AVX512BW__) && defined(__AVX512VL__)
    if (n % 16 == 0) { /* (the loop below, with n = 16 or 32 known, moves 8 bytes at a time) */
        for (int l = 0; l < n; l += 16) {
            const __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(src + l));
            _mm512_store_ps(dst + l, _mm512_maskz_mov_ps(_mm_test_epi8_mask(b, b), _mm512_set1_ps(1.0f)));
        }
        return;
    }
#endif
    for (int l = 0; l < n; l++) dst[l] = src[l] != 0 ? 1.0f : 0.0f;
}
/* A strip of n copies of v at dst (element stride st), rounded once (bf16, f16): a staged store
 * whose value is the same all along its loop (an embedding gradient's rows of zeros); nt as in
 * opgen_f32_store_strip. */
static inline void opgen_f32_fill_strip(float *dst, int64_t st, float v, int n, int nt) {
    if (nt && st == 1 && n == 16) {
        _Alignas(64) float line[16];
        for (int l = 0; l < 16; l++) line[l] = v;
        if (opgen_stream_line(dst, line, nt)) return;
    }
    for (int l = 0; l < n; l++) dst[l * st] = v;
}
static inline void opgen_bits16_fill_strip(uint16_t *dst, int64_t st, uint16_t b, int n, int nt) {
    if (nt && st == 1 && n == 32) {
        _Alignas(64) uint16_t line[32];
        for (int l = 0; l < 32; l++) line[l] = b;
        if (opgen_stream_line(dst, line, nt)) return;
    }
    for (int l = 0; l < n; l++) dst[l * st] = b;
}
/* n bytes of zeros at p (a kernel's zeroed scratch: sched.alloc zero) in vector stores. glibc's
 * memset turns to `rep stosb` from 2 KiB on, which, on the Zen 5 machine, waited behind the
 * kernel's streaming stores still in flight: the embedding gradient's 4 KiB accumulator row,
 * cleared for each output row hit, took 36% of the kernel's samples (bf16 V = 32,000, N = 8192,
 * D = 1024, outputs given, 2 threads: 2.14 -> 1.30 ms; f32 3.66 -> 2.91). */
static inline void opgen_zero(void *p, size_t n) {
    char *c = (char *)p;
    size_t i = 0;
#if defined(__AVX512F__)
    for (; i + 64 <= n; i += 64) _mm512_storeu_si512((void *)(c + i), _mm512_setzero_si512());
#elif defined(__AVX__)
    for (; i + 32 <= n; i += 32) _mm256_storeu_si256((__m256i *)(void *)(c + i), _mm256_setzero_si256());
#endif
    if (i < n) memset(c + i, 0, n - i); /* (the tail: under a vector's width) */
}
static inline void opgen_bf16_fill_strip(uint16_t *dst, int64_t st, float v, int n, int nt) {
    opgen_bits16_fill_strip(dst, st, opgen_f32_to_bf16(v), n, nt);
}
static inline void opgen_f16_fill_strip(uint16_t *dst, int64_t st, float v, int n, int nt) {
    opgen_bits16_fill_strip(dst, st, opgen_f32_to_f16(v), n, nt);
}
/* tile-transposes' staged tiles (sched.transpose_tile): d[c * ld + r] = s[r * rs + c * cs], widened
 * to f32, for r < rows and c < cols (in blocks of 16 rows): a tile of a caller's tensor read along
 * its columns, staged so that the loop walking them reads rows. With AVX-512 a full 16 x 16 block of
 * unit column stride moves in registers: 16 row loads (widened: f16 by vcvtph2ps), four rounds of 16
 * shuffles, 16 row stores; bf16 with AVX512-BW in 16 x 32 blocks (opgen_bf16_tr16x32, below). The
 * loop reading a column of the tensor had one scalar load a row apart per element instead
 * (8192x4096 y = 2 x^T, 2 threads, outputs given: 48 -> 60% of the copy's bandwidth in f32,
 * 18 -> 34% in bf16, with tile-transposes' longer tiles). Each block
 * prefetches the same columns of the next 16 rows into L2 (prefetcht2): a tile reads each of its
 * rows of x for only 512 elements, too short a stream for the hardware's prefetchers (bf16
 * 8192x4096 6.2 -> 5.7 ms, 16384x1000 4.7 -> 3.6; f32 16384x1000 5.2 -> 4.5, 8192x4096 unchanged). */
#if defined(__AVX512F__) || (defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__))
/* (also for opgen_rt.c's packing of GEMM operands, compiled for AVX-512 by a target pragma) */
__attribute__((target("avx512f"))) static inline void opgen_tr16x16(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        r[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i + 0], t[4 * i + 2]);
        r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i + 0], t[4 * i + 2]);
        r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int h = 0; h < 2; h++)
        for (int q = 0; q < 4; q++) {
            t[8 * h + q] = _mm512_shuffle_i32x4(r[8 * h + q], r[8 * h + q + 4], 0x88);
            t[8 * h + q + 4] = _mm512_shuffle_i32x4(r[8 * h + q], r[8 * h + q + 4], 0xdd);
        }
    for (int q = 0; q < 8; q++) {
        r[q] = _mm512_shuffle_i32x4(t[q], t[q + 8], 0x88);
        r[q + 8] = _mm512_shuffle_i32x4(t[q], t[q + 8], 0xdd);
    }
}
#endif
#if defined(__AVX512F__)
#define OPGEN_TR16 1
#define OPGEN_TR16_ROW_f32(p) _mm512_castps_si512(_mm512_loadu_ps(p))
#define OPGEN_TR16_ROW_bf16(p) _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(p))), 16)
#define OPGEN_TR16_ROW_f16(p) _mm512_castps_si512(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(p))))
#define OPGEN_TR16_BLOCK(dt, d, s)                                                            \
    do {                                                                                      \
        __m512i r_[16];                                                                       \
        for (int i_ = 0; i_ < 16; i_++) r_[i_] = OPGEN_TR16_ROW_##dt((s) + i_ * rs);          \
        opgen_tr16x16(r_);                                                                    \
        for (int i_ = 0; i_ < 16; i_++) _mm512_storeu_si512((void *)((d) + i_ * ld), r_[i_]); \
    } while (0)
#define OPGEN_TR_COLS_f32 16
#define OPGEN_TR_COLS_f16 16
#define OPGEN_TR_BLOCK_f32(d, s) OPGEN_TR16_BLOCK(f32, d, s)
#define OPGEN_TR_BLOCK_f16(d, s) OPGEN_TR16_BLOCK(f16, d, s)
#if defined(__AVX512BW__)
/* 16 rows of 32 sixteen-bit columns (a 64-byte line each) transposed as words: 16-bit then 32-bit
 * unpacks turn each 4 rows into lanes of 2 columns x 4 rows, and a 4 x 4 transpose of 128-bit
 * lanes gathers the 16 rows of 2 columns into one register: x[4 q + m] holds, in its 128-bit lane
 * g, rows 4g..4g+3 of column 8m + 2q (words 0-3) and of column 8m + 2q + 1 (words 4-7). */
static inline void opgen_w16_tr16x32(const uint16_t *s, int64_t rs, __m512i x[16]) {
    __m512i r[16], u[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_si512((const void *)(s + i * rs));
    for (int g = 0; g < 4; g++) { /* rows 4g..4g+3; lane m of u[4g + q]: columns 8m + 2q and 8m + 2q + 1 */
        const __m512i lo0 = _mm512_unpacklo_epi16(r[4 * g], r[4 * g + 1]), hi0 = _mm512_unpackhi_epi16(r[4 * g], r[4 * g + 1]);
        const __m512i lo1 = _mm512_unpacklo_epi16(r[4 * g + 2], r[4 * g + 3]), hi1 = _mm512_unpackhi_epi16(r[4 * g + 2], r[4 * g + 3]);
        u[4 * g + 0] = _mm512_unpacklo_epi32(lo0, lo1);
        u[4 * g + 1] = _mm512_unpackhi_epi32(lo0, lo1);
        u[4 * g + 2] = _mm512_unpacklo_epi32(hi0, hi1);
        u[4 * g + 3] = _mm512_unpackhi_epi32(hi0, hi1);
    }
    for (int q = 0; q < 4; q++) {
        const __m512i a = _mm512_shuffle_i32x4(u[q], u[4 + q], 0x44), b = _mm512_shuffle_i32x4(u[q], u[4 + q], 0xee);
        const __m512i c = _mm512_shuffle_i32x4(u[8 + q], u[12 + q], 0x44), e = _mm512_shuffle_i32x4(u[8 + q], u[12 + q], 0xee);
        x[4 * q + 0] = _mm512_shuffle_i32x4(a, c, 0x88);
        x[4 * q + 1] = _mm512_shuffle_i32x4(a, c, 0xdd);
        x[4 * q + 2] = _mm512_shuffle_i32x4(b, e, 0x88);
        x[4 * q + 3] = _mm512_shuffle_i32x4(b, e, 0xdd);
    }
}
/* bf16 widened by the last shuffle: unpacking x with zeros puts each word in the high half of a
 * 32-bit lane (an f32). 96 shuffles for 512 elements against 64 shuffles, 16 widening loads and
 * 16 shifts for 256 (a 128 x 512 tile in L1/L2, one thread, the Zen 5 VM: 0.131 -> 0.089 ns an
 * element). */
static inline void opgen_bf16_tr16x32(float *d, int64_t ld, const uint16_t *s, int64_t rs) {
    __m512i x[16];
    opgen_w16_tr16x32(s, rs, x);
    const __m512i z = _mm512_setzero_si512();
    for (int q = 0; q < 4; q++)
        for (int m = 0; m < 4; m++) {
            _mm512_storeu_si512((void *)(d + (8 * m + 2 * q) * ld), _mm512_unpacklo_epi16(z, x[4 * q + m]));
            _mm512_storeu_si512((void *)(d + (8 * m + 2 * q + 1) * ld), _mm512_unpackhi_epi16(z, x[4 * q + m]));
        }
}
/* The words as they are (opgen_bits16_transpose_tile): one vpermw puts a register's first column
 * in its low 256 bits and its second in the high ones, a 32-byte store each. */
static inline void opgen_bits16_tr16x32(uint16_t *d, int64_t ld, const uint16_t *s, int64_t rs) {
    __m512i x[16];
    opgen_w16_tr16x32(s, rs, x);
    const __m512i cols = _mm512_set_epi16(31, 30, 29, 28, 23, 22, 21, 20, 15, 14, 13, 12, 7, 6, 5, 4,
                                          27, 26, 25, 24, 19, 18, 17, 16, 11, 10, 9, 8, 3, 2, 1, 0);
    for (int q = 0; q < 4; q++)
        for (int m = 0; m < 4; m++) {
            const __m512i w = _mm512_permutexvar_epi16(cols, x[4 * q + m]);
            _mm256_storeu_si256((__m256i *)(void *)(d + (8 * m + 2 * q) * ld), _mm512_castsi512_si256(w));
            _mm256_storeu_si256((__m256i *)(void *)(d + (8 * m + 2 * q + 1) * ld), _mm512_extracti64x4_epi64(w, 1));
        }
}
#define OPGEN_TR_COLS_bits16 32
#define OPGEN_TR_BLOCK_bits16(d, s) opgen_bits16_tr16x32(d, ld, s, rs)
#define OPGEN_TR_COLS_bf16 32
#define OPGEN_TR_BLOCK_bf16(d, s) opgen_bf16_tr16x32(d, ld, s, rs)
#else /* (AVX-512 without BW: bf16 widened as it loads, like f16; 16-bit words one by one) */
#define OPGEN_TR_COLS_bf16 16
#define OPGEN_TR_BLOCK_bf16(d, s) OPGEN_TR16_BLOCK(bf16, d, s)
#define OPGEN_TR_COLS_bits16 0
#define OPGEN_TR_BLOCK_bits16(d, s) (void)0
#endif
#else
#define OPGEN_TR16 0
#define OPGEN_TR_COLS_f32 16
#define OPGEN_TR_COLS_f16 16
#define OPGEN_TR_COLS_bf16 16
#define OPGEN_TR_BLOCK_f32(d, s) (void)0
#define OPGEN_TR_BLOCK_f16(d, s) (void)0
#define OPGEN_TR_BLOCK_bf16(d, s) (void)0
#define OPGEN_TR_COLS_bits16 0
#define OPGEN_TR_BLOCK_bits16(d, s) (void)0
#endif
/* Share part of parts (equal shares, in order) of the 64-byte lines of a block of rows rows of
 * row_bytes bytes each, row_stride bytes apart, from p, prefetched into L2: sched.prefetch_share,
 * a row loop of parts iterations bringing the next transposed tile in while it writes (the
 * reads of the next tile then overlap the current tile's streaming stores: 8192x4096 f32,
 * 2 threads, a C harness on the Zen 5 VM: 62% -> 79% of the copy's bandwidth). */
#ifndef OPGEN_SHARE_HINT /* (tests/c/prefetch_share_check.c defines it: it records the hints) */
#define OPGEN_SHARE_HINT(p, off) OPGEN_PREFETCH_L2(p, off, 0)
#endif
static inline void opgen_prefetch_share(const void *p, int64_t row_stride, int64_t rows, int64_t row_bytes,
                                        int64_t part, int64_t parts) {
    if (rows <= 0 || row_bytes <= 0 || parts <= 0 || part < 0 || part >= parts || row_bytes > INT64_MAX - 63)
        return;
    const int64_t per_row = (row_bytes + 63) / 64;
    if (rows > INT64_MAX / per_row / parts) return; /* (a tile's block: never; lines * (part + 1) fits) */
    const int64_t lines = rows * per_row;
    const int64_t lo = lines * part / parts, hi = lines * (part + 1) / parts;
    int64_t r = lo / per_row, c = lo - r * per_row;
    for (int64_t l = lo; l < hi; l++) {
        OPGEN_SHARE_HINT((const char *)p, r * row_stride + c * 64);
        __asm__ __volatile__(""); /* (GCC 12 deletes a loop of prefetches alone with its count unknown) */
        if (++c == per_row) c = 0, r++;
    }
}
/* d[c * ld + r] = widen(s[r * rs + c * cs]) for r < rows, c < cols: in-register blocks of 16 rows
 * by OPGEN_TR_COLS_<dt> columns where the columns are unit-stride (0: none), element by element
 * around them */
#define OPGEN_TRANSPOSE_TILE(dt, D, T, widen)                                                               \
    static inline void opgen_##dt##_transpose_tile(D *d, int64_t ld, const T *s, int64_t rs, int64_t cs,    \
                                                    int64_t rows, int64_t cols) {                           \
        const int64_t w = OPGEN_TR_COLS_##dt > 0 ? OPGEN_TR_COLS_##dt : 1; /* (a block's columns) */       \
        const int vec = OPGEN_TR16 && OPGEN_TR_COLS_##dt > 0 && cs == 1;                                    \
        int64_t r0 = 0;                                                                                     \
        if (vec)                                                                                            \
            for (; r0 + 16 <= rows; r0 += 16)                                                               \
                for (int64_t c0 = 0; c0 + w <= cols; c0 += w) {                                            \
                    if (r0 + 32 <= rows)                                                                    \
                        for (int p_ = 16; p_ < 32; p_++) OPGEN_PREFETCH_L2(s, (r0 + p_) * rs + c0, 0);      \
                    OPGEN_TR_BLOCK_##dt(d + c0 * ld + r0, s + r0 * rs + c0);                                \
                }                                                                                           \
        const int64_t c1 = vec ? cols - cols % w : 0; /* (the blocks' rows: columns from c1 left) */       \
        if (c1 < cols)                                                                                      \
            for (int64_t r = 0; r < r0; r++)                                                                \
                for (int64_t c = c1; c < cols; c++) d[c * ld + r] = widen(s[r * rs + c * cs]);             \
        for (int64_t r = r0; r < rows; r++)                                                                 \
            for (int64_t c = 0; c < cols; c++) d[c * ld + r] = widen(s[r * rs + c * cs]);                  \
    }
#define OPGEN_AS_IS(x) (x)
OPGEN_TRANSPOSE_TILE(f32, float, float, OPGEN_AS_IS)
OPGEN_TRANSPOSE_TILE(bf16, float, uint16_t, opgen_bf16_to_f32)
OPGEN_TRANSPOSE_TILE(f16, float, uint16_t, opgen_f16_to_f32)
/* sched.transpose_tile into a `stage` tile of bf16 (sched.STAGE_HELD): the 16-bit words moved as
 * they are, the loads reading the tile widening them (8192x4096 y = 2 x^T bf16, 2 threads, the
 * Zen 5 VM: a 512 x 128 tile of 128 KiB instead of 256 KiB of f32; docs/backend_cpu.md) */
OPGEN_TRANSPOSE_TILE(bits16, uint16_t, uint16_t, OPGEN_AS_IS)
/* float -> integer: truncation toward zero; NaN or out of range gives the type's minimum
 * (for signed types, so it fails any index range check) or maximum (unsigned). */
#define OPGEN_F2I(T, x, lo, hi, bad) \
    ((x) == (x) && (double)(x) > (double)(lo) - 1.0 && (double)(x) < (double)(hi) + 1.0 ? (T)(x) : (T)(bad))

#endif /* OPGEN_RT_H */
