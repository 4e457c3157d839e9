/* opgen_cuda_rt.cuh — internal runtime shared by the generated CUDA kernels (not installed). Generated. */
#ifndef OPGEN_CUDA_RT_CUH
#define OPGEN_CUDA_RT_CUH

#include "opgen_cuda.h"
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

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
                                          const opgen_scalar_t *sc, char *ws, cudaStream_t stream);
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

/* Threads per block of every generated kernel. A compile-time constant: each block reduction
 * combines exactly this many partials in one fixed tree, so results never depend on timing. */
#define OPGEN_CUDA_THREADS 256
/* Workspace regions (temporaries, per-block scratch, segment buffers) of one kernel instance. */
#define OPGEN_CUDA_MAX_WS 32
/* A kernel whose per-block scratch fits in this many bytes keeps it in dynamic shared memory
 * (below the 48 KiB every device grants without opting in); otherwise in workspace slices. */
#define OPGEN_CUDA_SMEM_MAX ((size_t)32 << 10)

/* Everything a generated kernel reads, passed by value (it lives in the kernel's parameter
 * space): the bound buffers, dims, scalar parameters, workspace regions and status words. */
typedef struct {
    opgen_buf_t bufs[OPGEN_MAX_PARAMS];
    int64_t dims[OPGEN_MAX_DIMS];
    opgen_scalar_t sc[OPGEN_MAX_PARAMS];
    char *wsp[OPGEN_CUDA_MAX_WS];
    unsigned int *err;    /* this call's status word (workspace offset 0): nonzero = stop */
    unsigned int *sticky; /* the device's sticky status word (opgen_cuda_device_status), or NULL */
    unsigned int smem;    /* nonzero: this launch's per-block scratch is in dynamic shared memory */
} opgen_cuda_args_t;

/* ---- host side (opgen_cuda_rt.cu) ---- */
opgen_status_t opgen_cuda_run(const opgen_op_t *op, const opgen_tensor_t *const *tensors,
                              const opgen_scalar_t *scalars, void *ws, size_t ws_size,
                              size_t *ws_needed, int validate_only, void *stream);
opgen_status_t opgen_fail(opgen_status_t st, const char *fmt, ...);
/* Blocks of a grid-stride launch over `iters` iterations (0 when there is nothing to do); with
 * per-block scratch of `scratch` bytes the grid is capped so that scratch stays bounded. The
 * result only depends on the arguments and the device's SM count. */
int64_t opgen_cuda_grid(int64_t iters, size_t scratch);
/* Device address of the sticky status word of the current device (NULL if unavailable). */
unsigned int *opgen_cuda_sticky(void);
/* Stable radix sort of n indices in [0, rows) on the device (see sched.segments): the segment
 * table `seg` (opgen_seg_words(rows, n) words, layout below) and order (n). keys/vals are
 * n-element scratch; tmp of opgen_cuda_segments_tmp() bytes is the radix sort's scratch.
 * Deterministic: a stable sort has one result. */
size_t opgen_cuda_segments_tmp(int64_t n, int64_t rows);
opgen_status_t opgen_cuda_segments(const int64_t *idx, int64_t n, int64_t rows, int64_t *seg, int64_t *order,
                                   int64_t *keys, int64_t *vals, void *tmp, size_t tmp_bytes,
                                   cudaStream_t stream);/* A segment table describes n indices in [0, rows) sorted by value (ties by position):
 * - dense layout (rows <= 64 n + 4096): start[0..rows], rows + 1 words;
 * - sparse layout (rows >> n): the n sorted indices (start(v) = first position whose index
 *   is >= v, by bisection), then 2n words of sorting scratch: 3n words.
 * Both sizes are saturated at INT64_MAX (a workspace that large is refused, never wrapped). */
static inline __host__ __device__ int opgen_seg_dense(int64_t rows, int64_t n) {
    return rows <= 4096 || (rows - 4096) / 64 <= n;
}
static inline __host__ __device__ int64_t opgen_seg_words(int64_t rows, int64_t n) {
    if (opgen_seg_dense(rows, n)) return rows < INT64_MAX ? rows + 1 : INT64_MAX;
    return n <= INT64_MAX / 3 ? 3 * n : INT64_MAX;
}
/* The first position of segment v (0 <= v <= rows; v == rows gives n). */
static inline __host__ __device__ int64_t opgen_seg_start(const int64_t *seg, int64_t v, int64_t rows, int64_t n) {
    if (opgen_seg_dense(rows, n)) return seg[v];
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (seg[mid] < v) lo = mid + 1; else hi = mid;
    }
    return lo;
}

/* OPGEN_SUCCESS, or OPGEN_ERR_INTERNAL with the CUDA error of the last launch. */
opgen_status_t opgen_cuda_launched(const char *what);

/* Round up to 256 bytes; saturates (SIZE_MAX stays SIZE_MAX: a workspace that does not fit). */
static inline __host__ __device__ size_t opgen_align(size_t x) {
    return x > SIZE_MAX - 255 ? SIZE_MAX : (x + 255) & ~(size_t)255;
}

/* ---- device side ---- */
#ifndef OPGEN_HOST_MODEL /* (the CPU model used by the tests provides its own) */
/* The block's dynamic shared memory (the launch's third parameter). */
static __device__ __forceinline__ unsigned char *opgen_dyn_smem(void) {
    extern __shared__ __align__(16) unsigned char opgen_smem[];
    return opgen_smem;
}
#endif
/* f16 / bf16 <-> f32 with round-to-nearest-even (NaN stays NaN), as the CPU runtime. */
static __device__ __forceinline__ float opgen_bf16_to_f32(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
/* Round to nearest even; NaN gives the canonical NaN 0x7fff. On sm_80+ one instruction (the bit
 * manipulation below took 11 and made the bf16 scatter compute-bound on an H100); the same
 * function in software elsewhere (the CPU model of CUDA in the tests). */
static __device__ __forceinline__ uint16_t opgen_f32_to_bf16(float f) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    uint16_t r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
    return r;
#else
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)0x7fffu;
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
#endif
}
static __device__ __forceinline__ float opgen_f16_to_f32(uint16_t h) { return __half2float(__ushort_as_half(h)); }
static __device__ __forceinline__ uint16_t opgen_f32_to_f16(float f) { return __half_as_ushort(__float2half_rn(f)); }
/* float -> integer: truncation toward zero; NaN or out of range gives the type's minimum
 * (for signed types, so it fails any index range check) or maximum (unsigned). */
#define OPGEN_F2I(T, x, lo, hi, bad) \
    ((x) == (x) && (double)(x) > (double)(lo) - 1.0 && (double)(x) < (double)(hi) + 1.0 ? (T)(x) : (T)(bad))

/* A failed run-time check on the device (an index out of range): record the status for this
 * call (every later kernel of the call then returns at once: nothing more is written) and in the
 * device's sticky word. Integer atomics: the recorded value does not depend on timing. */
static __device__ __forceinline__ void opgen_dev_fail(unsigned int *err, unsigned int *sticky, unsigned int code) {
    atomicCAS(err, 0u, code);
    if (sticky) atomicCAS(sticky, 0u, code);
}

/* N consecutive elements moved as one (8- or 16-byte) access by the unit-stride flavour. */
template <typename T, int N>
struct __align__(sizeof(T) * N) opgen_vec {
    T v[N];
};

/* Combining two partials of a sum (0), max (1) or min (2); max/min propagate NaN like the CPU. */
template <int K, typename T>
static __device__ __forceinline__ T opgen_combine(T a, T b) {
    if (K == 0) return a + b;
    if (K == 1) return (b > a || b != b) ? b : a;
    return (b < a || b != b) ? b : a;
}

/* Block-wide reductions of N partials per thread, in one fixed tree each (warp shuffles, then the
 * warp results in shared memory) and one set of barriers. Every thread gets the N results. All
 * threads must call it. */
template <int K, typename T, int N>
static __device__ void opgen_block_reduce_n(T (&v)[N]) {
    __shared__ T part[N][OPGEN_CUDA_THREADS / 32];
    const int lane = (int)(threadIdx.x & 31u), warp = (int)(threadIdx.x >> 5);
#pragma unroll
    for (int i = 0; i < N; i++)
        for (int o = 16; o > 0; o >>= 1) v[i] = opgen_combine<K, T>(v[i], __shfl_down_sync(0xffffffffu, v[i], o));
    __syncthreads(); /* the previous call's readers of part are done */
    if (lane == 0)
        for (int i = 0; i < N; i++) part[i][warp] = v[i];
    __syncthreads();
    if (warp == 0) {
#pragma unroll
        for (int i = 0; i < N; i++) {
            T x = part[i][lane < OPGEN_CUDA_THREADS / 32 ? lane : 0];
            for (int o = OPGEN_CUDA_THREADS / 64; o > 0; o >>= 1)
                x = opgen_combine<K, T>(x, __shfl_down_sync(0xffffffffu, x, o));
            __syncwarp(); /* every lane's read of part[i][.] is done (a shuffle orders no memory) */
            if (lane == 0) part[i][0] = x;
        }
    }
    __syncthreads();
    for (int i = 0; i < N; i++) v[i] = part[i][0];
}

/* A `columns` kernel (opgen/lower/gpu_map.py): lane l of warp w holds its partial of column l
 * over the slice iterations w, w + W, ... (W warps); warp 0 gets each column's W partials
 * combined in warp order (other threads get their own value back). All threads must call it. */
#define OPGEN_CUDA_COLUMNS 32
template <int K, typename T>
static __device__ T opgen_column_combine(T v) {
    __shared__ T part[OPGEN_CUDA_THREADS / OPGEN_CUDA_COLUMNS][OPGEN_CUDA_COLUMNS];
    const int lane = (int)(threadIdx.x % OPGEN_CUDA_COLUMNS), warp = (int)(threadIdx.x / OPGEN_CUDA_COLUMNS);
    part[warp][lane] = v;
    __syncthreads();
    if (warp == 0)
        for (int w = 1; w < OPGEN_CUDA_THREADS / OPGEN_CUDA_COLUMNS; w++) v = opgen_combine<K, T>(v, part[w][lane]);
    __syncthreads(); /* part is free for the next call */
    return v;
}

/* One block-wide reduction (the tree of opgen_block_reduce_n). */
template <int K, typename T>
static __device__ T opgen_block_reduce(T v) {
    T a[1] = {v};
    opgen_block_reduce_n<K, T, 1>(a);
    return a[0];
}

/* dst[r * ld + c] = src[r * rs + c * cs] for r < rl, c < cl, else 0 (rows x cols), by the whole
 * block; consecutive threads walk the source's unit-stride dimension (coalesced reads). */
template <typename T, int ROWS, int COLS>
static __device__ __forceinline__ void opgen_gemm_stage(T *dst, int ld, const T *src, int64_t rs, int64_t cs,
                                                        int64_t rl, int64_t cl) {
    for (int e = (int)threadIdx.x; e < ROWS * COLS; e += OPGEN_CUDA_THREADS) {
        const int r = rs == 1 ? e % ROWS : e / COLS, c = rs == 1 ? e / ROWS : e % COLS;
        dst[r * ld + c] = (r < rl && c < cl) ? src[r * rs + c * cs] : (T)0;
    }
}

/* C[m x n] (= or +=) op(A) @ op(B) by the whole block: element (i, k) of op(A) is
 * A[i * ars + k * acs], (k, j) of op(B) is B[k * brs + j * bcs]; C row-major with leading
 * dimension ldc. 64 x 64 tiles of C, 4 x 4 per thread; each element sums k in increasing order
 * (deterministic). All threads must call it; it ends with a barrier. The f32 case uses the tensor
 * cores instead (opgen_block_gemm_tc); this one serves the other types. */
#define OPGEN_GEMM_BM 64
#define OPGEN_GEMM_BN 64
#define OPGEN_GEMM_BK 16
template <typename T>
static __device__ __noinline__ void opgen_block_gemm(int64_t m, int64_t n, int64_t k, const T *A, int64_t ars, int64_t acs,
                                        const T *B, int64_t brs, int64_t bcs, T *C, int64_t ldc, int accumulate) {
    __shared__ T As[OPGEN_GEMM_BM][OPGEN_GEMM_BK + 1];
    __shared__ T Bs[OPGEN_GEMM_BK][OPGEN_GEMM_BN + 1];
    const int tid = (int)threadIdx.x, tx = tid % 16, ty = tid / 16;
    for (int64_t i0 = 0; i0 < m; i0 += OPGEN_GEMM_BM) {
        for (int64_t j0 = 0; j0 < n; j0 += OPGEN_GEMM_BN) {
            T acc[4][4];
            for (int a = 0; a < 4; a++)
                for (int b = 0; b < 4; b++) acc[a][b] = (T)0;
            for (int64_t k0 = 0; k0 < k; k0 += OPGEN_GEMM_BK) {
                __syncthreads();
                opgen_gemm_stage<T, OPGEN_GEMM_BM, OPGEN_GEMM_BK>(&As[0][0], OPGEN_GEMM_BK + 1, A + i0 * ars + k0 * acs,
                                                                  ars, acs, m - i0, k - k0);
                opgen_gemm_stage<T, OPGEN_GEMM_BK, OPGEN_GEMM_BN>(&Bs[0][0], OPGEN_GEMM_BN + 1, B + k0 * brs + j0 * bcs,
                                                                  brs, bcs, k - k0, n - j0);
                __syncthreads();
                const int kc = (int)(k - k0 < OPGEN_GEMM_BK ? k - k0 : OPGEN_GEMM_BK);
                for (int q = 0; q < kc; q++)
                    for (int a = 0; a < 4; a++)
                        for (int b = 0; b < 4; b++) acc[a][b] += As[ty * 4 + a][q] * Bs[q][tx * 4 + b];
            }
            for (int a = 0; a < 4; a++) {
                const int64_t i = i0 + ty * 4 + a;
                for (int b = 0; b < 4; b++) {
                    const int64_t j = j0 + tx * 4 + b;
                    if (i < m && j < n) C[i * ldc + j] = accumulate ? C[i * ldc + j] + acc[a][b] : acc[a][b];
                }
            }
        }
    }
    __syncthreads();
}

/* x -> (hi, lo), both TF32, x = hi + lo to about 2^-22 relative ("error-compensated TF32", the
 * idea of CUTLASS's 3xTF32). A non-finite difference (x infinite, or hi rounded to infinity)
 * leaves lo = 0, so hi carries x's infinity alone. */
template <typename Frag>
static __device__ __forceinline__ void opgen_tf32_split(Frag &hi, Frag &lo) {
    for (int t = 0; t < hi.num_elements; t++) {
        const float x = hi.x[t], h = nvcuda::wmma::__float_to_tf32(x), d = x - h;
        hi.x[t] = h;
        lo.x[t] = d - d == 0.0f ? nvcuda::wmma::__float_to_tf32(d) : 0.0f;
    }
}
template <typename Frag>
static __device__ __forceinline__ void opgen_tf32_round(Frag &f) {
    for (int t = 0; t < f.num_elements; t++) f.x[t] = nvcuda::wmma::__float_to_tf32(f.x[t]);
}

/* opgen_block_gemm for f32 on the tensor cores: TF32 WMMA (16 x 16 x 8) with f32 accumulation.
 * An operand whose values may not be exact in TF32 (SA / SB: the printer proves exactness for
 * tiles loaded from bf16/f16 data) is split into hi + lo and multiplied twice (lo terms first),
 * so results keep f32-level accuracy; exact operands are multiplied once. 64 x 64 tiles of C,
 * each of the 8 warps owns a 16 x 32 part; k runs in increasing steps of 16 staged through shared
 * memory. Fixed tiles and order: the same bits on every run. Same contract as opgen_block_gemm. */
#define OPGEN_TC_LDA (OPGEN_GEMM_BK + 4)
#define OPGEN_TC_LDB (OPGEN_GEMM_BN + 4)
/* The A and B tiles; after the k loop, each warp's 16 x 16 staging area for the epilogue. One
 * array for every instantiation (a kernel using several pays for it once). */
static __device__ __forceinline__ float *opgen_gemm_tc_smem(void) {
    __shared__ __align__(32) float sm[OPGEN_GEMM_BM * OPGEN_TC_LDA + OPGEN_GEMM_BK * OPGEN_TC_LDB];
    return sm;
}
template <bool SA, bool SB>
static __device__ __noinline__ void opgen_block_gemm_tc(int64_t m, int64_t n, int64_t k, const float *A, int64_t ars,
                                                        int64_t acs, const float *B, int64_t brs, int64_t bcs, float *C,
                                                        int64_t ldc, int accumulate) {
    using namespace nvcuda;
    typedef wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major> frag_a;
    typedef wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::row_major> frag_b;
    float *const sm = opgen_gemm_tc_smem(), *const As = sm, *const Bs = sm + OPGEN_GEMM_BM * OPGEN_TC_LDA;
    const int warp = (int)(threadIdx.x >> 5), lane = (int)(threadIdx.x & 31u);
    const int wr = (warp % 4) * 16, wc = (warp / 4) * 32;
    for (int64_t i0 = 0; i0 < m; i0 += OPGEN_GEMM_BM) {
        for (int64_t j0 = 0; j0 < n; j0 += OPGEN_GEMM_BN) {
            wmma::fragment<wmma::accumulator, 16, 16, 8, float> acc[2];
            wmma::fill_fragment(acc[0], 0.0f);
            wmma::fill_fragment(acc[1], 0.0f);
            for (int64_t k0 = 0; k0 < k; k0 += OPGEN_GEMM_BK) {
                __syncthreads();
                opgen_gemm_stage<float, OPGEN_GEMM_BM, OPGEN_GEMM_BK>(As, OPGEN_TC_LDA, A + i0 * ars + k0 * acs, ars,
                                                                      acs, m - i0, k - k0);
                opgen_gemm_stage<float, OPGEN_GEMM_BK, OPGEN_GEMM_BN>(Bs, OPGEN_TC_LDB, B + k0 * brs + j0 * bcs, brs,
                                                                      bcs, k - k0, n - j0);
                __syncthreads();
#pragma unroll
                for (int kk = 0; kk < OPGEN_GEMM_BK; kk += 8) {
                    frag_a a_hi, a_lo;
                    wmma::load_matrix_sync(a_hi, As + wr * OPGEN_TC_LDA + kk, OPGEN_TC_LDA);
                    if (SA) opgen_tf32_split(a_hi, a_lo);
                    else opgen_tf32_round(a_hi);
#pragma unroll
                    for (int f = 0; f < 2; f++) {
                        frag_b b_hi, b_lo;
                        wmma::load_matrix_sync(b_hi, Bs + kk * OPGEN_TC_LDB + wc + f * 16, OPGEN_TC_LDB);
                        if (SB) opgen_tf32_split(b_hi, b_lo);
                        else opgen_tf32_round(b_hi);
                        if (SA) wmma::mma_sync(acc[f], a_lo, b_hi, acc[f]);
                        if (SB) wmma::mma_sync(acc[f], a_hi, b_lo, acc[f]);
                        wmma::mma_sync(acc[f], a_hi, b_hi, acc[f]);
                    }
                }
            }
            __syncthreads(); /* every warp is done with the tiles: reuse sm for staging */
            float *const st = sm + warp * 256;
#pragma unroll
            for (int f = 0; f < 2; f++) {
                wmma::store_matrix_sync(st, acc[f], 16, wmma::mem_row_major);
                __syncwarp();
                for (int e = lane; e < 256; e += 32) {
                    const int64_t i = i0 + wr + e / 16, j = j0 + wc + f * 16 + e % 16;
                    if (i < m && j < n) C[i * ldc + j] = accumulate ? C[i * ldc + j] + st[e] : st[e];
                }
                __syncwarp();
            }
        }
    }
    __syncthreads();
}

#endif /* OPGEN_CUDA_RT_CUH */
