/* opgen_cuda_rt.cu — argument binding, validation and launch shared by every CUDA op. Generated.
 * The binder (descriptor checks, dims, strides, variant and kernel choice, workspace size) is the
 * CPU runtime's, rendered from the same template; only the tail differs: device workspace,
 * row-offset tables filled on the device, kernels launched on the caller's stream. */
#include "opgen_cuda_rt.cuh"

#include <cub/device/device_radix_sort.cuh>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static thread_local char opgen_err[256];

extern "C" OPGEN_API const char *opgen_cuda_last_error(void) { return opgen_err; }

extern "C" OPGEN_API const char *opgen_cuda_status_string(opgen_status_t status) {
    switch (status) {
    case OPGEN_SUCCESS: return "OPGEN_SUCCESS";
    case OPGEN_ERR_NULL: return "OPGEN_ERR_NULL";
    case OPGEN_ERR_PARAM: return "OPGEN_ERR_PARAM";
    case OPGEN_ERR_SHAPE: return "OPGEN_ERR_SHAPE";
    case OPGEN_ERR_DTYPE: return "OPGEN_ERR_DTYPE";
    case OPGEN_ERR_STRIDES: return "OPGEN_ERR_STRIDES";
    case OPGEN_ERR_INDEX: return "OPGEN_ERR_INDEX";
    case OPGEN_ERR_WORKSPACE: return "OPGEN_ERR_WORKSPACE";
    case OPGEN_ERR_ALLOC: return "OPGEN_ERR_ALLOC";
    case OPGEN_ERR_INTERNAL: return "OPGEN_ERR_INTERNAL";
    }
    return "OPGEN_UNKNOWN_STATUS";
}

opgen_status_t opgen_fail(opgen_status_t st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(opgen_err, sizeof opgen_err, fmt, ap);
    va_end(ap);
    return st;
}

opgen_status_t opgen_cuda_launched(const char *what) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return opgen_fail(OPGEN_ERR_INTERNAL, "%s: CUDA: %s", what, cudaGetErrorString(e));
    return OPGEN_SUCCESS;
}

#define OPGEN_CUDA_MAX_DEVICES 64

static int opgen_cuda_sms(void) {
    static int cache[OPGEN_CUDA_MAX_DEVICES];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= OPGEN_CUDA_MAX_DEVICES) {
        cudaGetLastError();
        return 132;
    }
    if (!cache[dev]) {
        int n = 0;
        if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0) {
            cudaGetLastError();
            n = 132;
        }
        cache[dev] = n;
    }
    return cache[dev];
}

/* $OPGEN_CUDA_MAX_GRID (a positive integer) caps every grid: results must not change with it
 * (benchmarks/gpu.py checks them bitwise under several caps). Read at each call. */
static int64_t opgen_cuda_grid_limit(void) {
    const char *s = getenv("OPGEN_CUDA_MAX_GRID");
    if (!s || !*s) return 0;
    char *end = NULL;
    long long v = strtoll(s, &end, 10);
    return (end && *end == '\0' && v > 0) ? (int64_t)v : 0;
}

int64_t opgen_cuda_grid(int64_t iters, size_t scratch) {
    if (iters <= 0) return 0;
    int64_t cap = 16 * (int64_t)opgen_cuda_sms();
    if (scratch > 0) {
        int64_t fit = (int64_t)(((size_t)256 << 20) / scratch); /* ~256 MiB of scratch in all */
        if (fit < opgen_cuda_sms()) fit = opgen_cuda_sms();
        if (fit < cap) cap = fit;
    }
    const int64_t limit = opgen_cuda_grid_limit();
    if (limit > 0 && limit < cap) cap = limit;
    return iters < cap ? iters : cap;
}

__device__ unsigned int opgen_cuda_sticky_word;

unsigned int *opgen_cuda_sticky(void) {
    static unsigned int *cache[OPGEN_CUDA_MAX_DEVICES];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= OPGEN_CUDA_MAX_DEVICES) {
        cudaGetLastError();
        return NULL;
    }
    if (!cache[dev]) {
        void *p = NULL;
        if (cudaGetSymbolAddress(&p, opgen_cuda_sticky_word) != cudaSuccess) {
            cudaGetLastError();
            return NULL;
        }
        cache[dev] = (unsigned int *)p;
    }
    return cache[dev];
}

extern "C" OPGEN_API opgen_status_t opgen_cuda_device_status(void *stream, int clear) {
    unsigned int word = 0;
    cudaStream_t s = (cudaStream_t)stream;
    if (cudaStreamSynchronize(s) != cudaSuccess ||
        cudaMemcpyFromSymbol(&word, opgen_cuda_sticky_word, sizeof word) != cudaSuccess)
        return opgen_cuda_launched("opgen_cuda_device_status");
    if (clear) {
        const unsigned int zero = 0;
        if (cudaMemcpyToSymbol(opgen_cuda_sticky_word, &zero, sizeof zero) != cudaSuccess)
            return opgen_cuda_launched("opgen_cuda_device_status");
    }
    return word ? opgen_fail((opgen_status_t)word, "an index was out of range on the device: the call wrote nothing")
                : OPGEN_SUCCESS;
}

/* ---- segments: a stable radix sort of (index, position) pairs, then each row's start ---- */
static int opgen_key_bits(int64_t rows) {
    int bits = 1;
    while (bits < 63 && ((int64_t)1 << bits) < rows) bits++;
    return bits;
}

static __global__ void opgen_iota_k(int64_t *v, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        v[i] = i;
}

/* start[r] = first position whose sorted key is >= r (a binary search: keys are sorted). */
static __global__ void opgen_starts_k(const int64_t *keys, int64_t n, int64_t rows, int64_t *start) {
    for (int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; r <= rows; r += (int64_t)gridDim.x * blockDim.x) {
        int64_t lo = 0, hi = n;
        while (lo < hi) {
            const int64_t mid = lo + (hi - lo) / 2;
            if (keys[mid] < r) lo = mid + 1; else hi = mid;
        }
        start[r] = r == rows ? n : lo;
    }
}

size_t opgen_cuda_segments_tmp(int64_t n, int64_t rows) {
    size_t bytes = 0;
    if (n <= 0 || n > INT32_MAX) return 0;
    if (cub::DeviceRadixSort::SortPairs(NULL, bytes, (const int64_t *)NULL, (int64_t *)NULL, (const int64_t *)NULL,
                                        (int64_t *)NULL, (int)n, 0, opgen_key_bits(rows)) != cudaSuccess) {
        cudaGetLastError();
        return (size_t)n * 32 + ((size_t)1 << 20); /* no device to ask: a generous guess */
    }
    return bytes;
}

opgen_status_t opgen_cuda_segments(const int64_t *idx, int64_t n, int64_t rows, int64_t *seg, int64_t *order,
                                   int64_t *keys, int64_t *vals, void *tmp, size_t tmp_bytes,
                                   cudaStream_t stream) {
    if (n > INT32_MAX) return opgen_fail(OPGEN_ERR_SHAPE, "segments: more than 2^31 - 1 indices");
    const int dense = opgen_seg_dense(rows, n);
    if (n > 0) {
        opgen_iota_k<<<(unsigned)opgen_cuda_grid((n + OPGEN_CUDA_THREADS - 1) / OPGEN_CUDA_THREADS, 0),
                       OPGEN_CUDA_THREADS, 0, stream>>>(vals, n);
        size_t bytes = tmp_bytes;
        /* sparse layout: the sorted indices are the table itself */
        if (cub::DeviceRadixSort::SortPairs(tmp, bytes, idx, dense ? keys : seg, vals, order, (int)n, 0,
                                            opgen_key_bits(rows), stream) != cudaSuccess)
            return opgen_cuda_launched("segments: radix sort");
    }
    if (dense) {
        const int64_t blocks = opgen_cuda_grid((rows + OPGEN_CUDA_THREADS) / OPGEN_CUDA_THREADS, 0);
        opgen_starts_k<<<(unsigned)blocks, OPGEN_CUDA_THREADS, 0, stream>>>(keys, n, rows, seg);
    }
    return opgen_cuda_launched("segments");
}

/* ---- row-offset tables of Batch dims spread over several physical axes ---- */
typedef struct {
    int64_t shape[OPGEN_MAX_RANK];
    int64_t st[OPGEN_MAX_RANK];
} opgen_rows_desc_t;

/* The element offset of row r of the leading n axes of d, rows counted in row-major order. */
static __device__ __forceinline__ int64_t opgen_row_offset(const opgen_rows_desc_t &d, int n, int64_t r) {
    int64_t o = 0;
    for (int i = n - 1; i >= 0; i--) {
        o += (r % d.shape[i]) * d.st[i];
        r /= d.shape[i];
    }
    return o;
}

static __global__ void opgen_rows_k(int64_t *ro, int64_t rows, int nb, opgen_rows_desc_t d, int64_t st0) {
    for (int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; r < rows; r += (int64_t)gridDim.x * blockDim.x)
        ro[r] = nb <= 0 ? r * st0 : opgen_row_offset(d, nb, r);
}

/* ---- parameters converted at the boundary (opgen/lower/boundary.py): the kernels' cast C ---- */
static __global__ void opgen_convert_k(void *dst, const void *src, int from, int to, int64_t n, int nd,
                                       opgen_rows_desc_t d) {
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t o = opgen_row_offset(d, nd, e);
        switch (from) {
        case OPGEN_BOOL: {
            const bool *s = (const bool *)src;
            if (to == OPGEN_I64) ((int64_t *)dst)[e] = (int64_t)((s[o] != 0));
            if (to == OPGEN_BOOL) ((bool *)dst)[e] = (s[o] != 0);
            break;
        }
        case OPGEN_I8: {
            const int8_t *s = (const int8_t *)src;
            if (to == OPGEN_I64) ((int64_t *)dst)[e] = (int64_t)(s[o]);
            if (to == OPGEN_BOOL) ((bool *)dst)[e] = (s[o] != 0);
            break;
        }
        case OPGEN_I16: {
            const int16_t *s = (const int16_t *)src;
            if (to == OPGEN_I64) ((int64_t *)dst)[e] = (int64_t)(s[o]);
            if (to == OPGEN_BOOL) ((bool *)dst)[e] = (s[o] != 0);
            break;
        }
        case OPGEN_I32: {
            const int32_t *s = (const int32_t *)src;
            if (to == OPGEN_I64) ((int64_t *)dst)[e] = (int64_t)(s[o]);
            if (to == OPGEN_BOOL) ((bool *)dst)[e] = (s[o] != 0);
            break;
        }
        case OPGEN_I64: {
            const int64_t *s = (const int64_t *)src;
            if (to == OPGEN_I64) ((int64_t *)dst)[e] = s[o];
            if (to == OPGEN_BOOL) ((bool *)dst)[e] = (s[o] != 0);
            break;
        }
        case OPGEN_U8: {
            const uint8_t *s = (const uint8_t *)src;
            if (to == OPGEN_I64) ((int64_t *)dst)[e] = (int64_t)(s[o]);
            if (to == OPGEN_BOOL) ((bool *)dst)[e] = (s[o] != 0);
            break;
        }
        case OPGEN_U16: {
            const uint16_t *s = (const uint16_t *)src;
            if (to == OPGEN_I64) ((int64_t *)dst)[e] = (int64_t)(s[o]);
            if (to == OPGEN_BOOL) ((bool *)dst)[e] = (s[o] != 0);
            break;
        }
        case OPGEN_U32: {
            const uint32_t *s = (const uint32_t *)src;
            if (to == OPGEN_I64) ((int64_t *)dst)[e] = (int64_t)(s[o]);
            if (to == OPGEN_BOOL) ((bool *)dst)[e] = (s[o] != 0);
            break;
        }
        case OPGEN_U64: {
            const uint64_t *s = (const uint64_t *)src;
            if (to == OPGEN_I64) ((int64_t *)dst)[e] = (int64_t)(s[o]);
            if (to == OPGEN_BOOL) ((bool *)dst)[e] = (s[o] != 0);
            break;
        }
        case OPGEN_F16: {
            const uint16_t *s = (const uint16_t *)src;
            if (to == OPGEN_I64) ((int64_t *)dst)[e] = OPGEN_F2I(int64_t, opgen_f16_to_f32(s[o]), INT64_MIN, 9223372036854775807ll, INT64_MIN);
            if (to == OPGEN_BOOL) ((bool *)dst)[e] = (opgen_f16_to_f32(s[o]) != 0);
            break;
        }
        case OPGEN_BF16: {
            const uint16_t *s = (const uint16_t *)src;
            if (to == OPGEN_I64) ((int64_t *)dst)[e] = OPGEN_F2I(int64_t, opgen_bf16_to_f32(s[o]), INT64_MIN, 9223372036854775807ll, INT64_MIN);
            if (to == OPGEN_BOOL) ((bool *)dst)[e] = (opgen_bf16_to_f32(s[o]) != 0);
            break;
        }
        case OPGEN_F32: {
            const float *s = (const float *)src;
            if (to == OPGEN_I64) ((int64_t *)dst)[e] = OPGEN_F2I(int64_t, s[o], INT64_MIN, 9223372036854775807ll, INT64_MIN);
            if (to == OPGEN_BOOL) ((bool *)dst)[e] = (s[o] != 0);
            break;
        }
        case OPGEN_F64: {
            const double *s = (const double *)src;
            if (to == OPGEN_I64) ((int64_t *)dst)[e] = OPGEN_F2I(int64_t, s[o], INT64_MIN, 9223372036854775807ll, INT64_MIN);
            if (to == OPGEN_BOOL) ((bool *)dst)[e] = (s[o] != 0);
            break;
        }
        default:
            break;
        }
    }
}

#define OPGEN_WS_ALIGN ((size_t)256)

/* Byte extent [lo, hi) of a non-empty tensor's elements relative to its data pointer. */
typedef struct {
    int64_t lo, hi;
} opgen_span_t;

/* The extent of a tensor with no dim 0 (strides st, in elements); 0 when it does not fit in int64.
 * Every element offset of the tensor lies inside it, so once it fits, offset arithmetic on
 * in-range indices (row tables, kernels) cannot overflow either. */
static int opgen_span_of(const opgen_tensor_t *t, const int64_t *st, size_t itemsize, opgen_span_t *out) {
    int64_t lo = 0, hi = 0, span;
    for (int i = 0; i < t->ndim; i++) {
        if (__builtin_mul_overflow(t->shape[i] - 1, st[i], &span)) return 0;
        if (span < 0 ? __builtin_add_overflow(lo, span, &lo) : __builtin_add_overflow(hi, span, &hi)) return 0;
    }
    if (__builtin_mul_overflow(lo, (int64_t)itemsize, &out->lo) || __builtin_add_overflow(hi, 1, &hi) ||
        __builtin_mul_overflow(hi, (int64_t)itemsize, &out->hi))
        return 0;
    return 1;
}

/* 1 when no two index tuples of a tensor (shape, strides st; no dim 0; extent known to fit) map
 * to the same element. Sufficient test: ordered by |stride|, each dim of size > 1 must step past
 * the farthest offset the smaller dims reach, |st_k| > sum_{j<k} |st_j| * (size_j - 1). It is
 * exact for every layout made by permuting, slicing, padding or flipping a dense tensor; a layout
 * it cannot prove free of overlaps (some interleavings are) is refused. */
static int opgen_distinct(int ndim, const int64_t *shape, const int64_t *st) {
    uint64_t mag[OPGEN_MAX_RANK];
    int64_t len[OPGEN_MAX_RANK];
    int n = 0;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] <= 1) continue;
        uint64_t m = st[i] < 0 ? (uint64_t)0 - (uint64_t)st[i] : (uint64_t)st[i];
        int j = n++;
        for (; j > 0 && mag[j - 1] > m; j--) {
            mag[j] = mag[j - 1];
            len[j] = len[j - 1];
        }
        mag[j] = m;
        len[j] = shape[i];
    }
    uint64_t reach = 0; /* <= the extent in elements: no overflow */
    for (int j = 0; j < n; j++) {
        if (mag[j] <= reach) return 0;
        reach += mag[j] * (uint64_t)(len[j] - 1);
    }
    return 1;
}

/* x rounded up to a multiple of OPGEN_WS_ALIGN; SIZE_MAX (sticky) when it does not fit. */
static size_t opgen_ws_round(size_t x) {
    return x > SIZE_MAX - (OPGEN_WS_ALIGN - 1) ? SIZE_MAX : (x + (OPGEN_WS_ALIGN - 1)) & ~(OPGEN_WS_ALIGN - 1);
}

/* Two descriptors of one address name the same elements in the same order: equal shapes and
 * equal strides on every axis with more than one element (a size-1 axis's stride is unused). */
static int same_elements(const opgen_tensor_t *a, const int64_t *sa, const opgen_tensor_t *b, const int64_t *sb) {
    if (a->ndim != b->ndim) return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i] || (a->shape[i] > 1 && sa[i] != sb[i])) return 0;
    return 1;
}

static const size_t opgen_itemsize[OPGEN_DTYPE_COUNT] = { 1, 1, 2, 4, 8, 1, 2, 4, 8, 2, 2, 4, 8, };
static const char *const opgen_dtype_names[OPGEN_DTYPE_COUNT] = { "bool", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "f16", "bf16", "f32", "f64", };

/* OPGEN_ERR_DTYPE naming the bound dtypes (the first tensor of each dtype variable), e.g.
   "embedding_dense_backward: no kernel for grad f32, indices f64 in this library" */
static opgen_status_t no_kernel(const opgen_op_t *op, const int *dtypes) {
    char said[256] = "";
    size_t used = 0;
    int named[OPGEN_MAX_VARS] = {0};
    for (int k = 0; k < op->n_params; k++) {
        const opgen_param_t *p = &op->params[k];
        if (p->kind != OPGEN_P_TENSOR || p->dtype_var < 0 || dtypes[p->dtype_var] < 0 || named[p->dtype_var])
            continue;
        named[p->dtype_var] = 1;
        int n = snprintf(said + used, sizeof said - used, "%s%s %s", used ? ", " : "", p->name,
                         opgen_dtype_names[dtypes[p->dtype_var]]);
        if (n < 0 || (size_t)n >= sizeof said - used) break;
        used += (size_t)n;
    }
    return opgen_fail(OPGEN_ERR_DTYPE, "%s: no kernel for %s in this library", op->name, used ? said : "these dtypes");
}

opgen_status_t opgen_cuda_run(const opgen_op_t *op, const opgen_tensor_t *const *tensors,
                         const opgen_scalar_t *scalars, void *ws, size_t ws_size,
                         size_t *ws_needed, int validate_only, void *stream) {
    int64_t dims[OPGEN_MAX_DIMS];
    int dim_bound[OPGEN_MAX_DIMS] = {0};
    int dtypes[OPGEN_MAX_VARS];
    int64_t bshape_rank[OPGEN_MAX_DIMS];
    const int64_t *bshape[OPGEN_MAX_DIMS];
    int64_t strides_buf[OPGEN_MAX_PARAMS][OPGEN_MAX_RANK];
    opgen_buf_t bufs[OPGEN_MAX_PARAMS];
    int n_batch_rows[OPGEN_MAX_PARAMS]; /* params whose rows need an offset table: their nb */
    int nonempty[OPGEN_MAX_PARAMS];     /* a present tensor with at least one element */
    int64_t numel_of[OPGEN_MAX_PARAMS];
    int cvt[OPGEN_MAX_PARAMS];          /* dtype it is converted to, or -1 */
    size_t cvt_off[OPGEN_MAX_PARAMS];   /* workspace offset of its converted copy */
    opgen_span_t span[OPGEN_MAX_PARAMS];
    uintptr_t abs_lo[OPGEN_MAX_PARAMS], abs_hi[OPGEN_MAX_PARAMS]; /* its bytes (run calls only) */
    size_t tbl_off[OPGEN_MAX_PARAMS];   /* workspace offset of its row-offset table */
    uint32_t present = 0;
    int opt_k = 0;
    opgen_err[0] = 0;
    for (int v = 0; v < OPGEN_MAX_VARS; v++) dtypes[v] = -1;
    for (int d = 0; d < OPGEN_MAX_DIMS; d++) bshape_rank[d] = -1;
    memset(bufs, 0, sizeof bufs);
    memset(span, 0, sizeof span);
    memset(abs_lo, 0, sizeof abs_lo);
    memset(abs_hi, 0, sizeof abs_hi);

    for (int k = 0; k < op->n_params; k++) {
        const opgen_param_t *p = &op->params[k];
        n_batch_rows[k] = 0;
        nonempty[k] = 0;
        numel_of[k] = 0;
        cvt[k] = -1;
        if (p->kind == OPGEN_P_SIZE) {
            int64_t v = scalars[k].i;
            if (v < 0) return opgen_fail(OPGEN_ERR_PARAM, "%s: %s must be >= 0", op->name, p->name);
            if (dim_bound[p->size_dim] && dims[p->size_dim] != v)
                return opgen_fail(OPGEN_ERR_SHAPE, "%s: %s=%lld disagrees with dim %s=%lld", op->name,
                                  p->name, (long long)v, op->dim_names[p->size_dim],
                                  (long long)dims[p->size_dim]);
            dims[p->size_dim] = v;
            dim_bound[p->size_dim] = 1;
            continue;
        }
        if (p->kind != OPGEN_P_TENSOR) continue;
        const opgen_tensor_t *t = tensors[k];
        if (p->optional) {
            if (t) present |= 1u << opt_k;
            opt_k++;
        }
        if (!t) {
            if (p->optional) continue;
            return opgen_fail(OPGEN_ERR_NULL, "%s: %s is required", op->name, p->name);
        }
        if ((int)t->dtype < 0 || t->dtype >= OPGEN_DTYPE_COUNT || !(p->dtype_mask >> t->dtype & 1u))
            return opgen_fail(OPGEN_ERR_DTYPE, "%s: %s has an unsupported dtype", op->name, p->name);
        if (p->dtype_var >= 0) {
            if (dtypes[p->dtype_var] < 0) dtypes[p->dtype_var] = (int)t->dtype;
            else if (dtypes[p->dtype_var] != (int)t->dtype)
                return opgen_fail(OPGEN_ERR_DTYPE, "%s: %s's dtype differs from another tensor of the same type",
                                  op->name, p->name);
        }
        const size_t itemsize = opgen_itemsize[t->dtype];
        int nb = 1;  /* physical axes of logical dim 0 */
        if (p->batch) {
            nb = t->ndim - (p->rank - 1);
            if (nb < p->batch_min || nb > p->batch_max)
                return opgen_fail(OPGEN_ERR_SHAPE, "%s: %s has rank %d", op->name, p->name, t->ndim);
        } else if (t->ndim != p->rank) {
            return opgen_fail(OPGEN_ERR_SHAPE, "%s: %s must have rank %d, got %d", op->name, p->name,
                              p->rank, t->ndim);
        }
        if (t->ndim > OPGEN_MAX_RANK || (t->ndim > 0 && !t->shape))
            return opgen_fail(OPGEN_ERR_SHAPE, "%s: %s has a bad shape", op->name, p->name);
        /* element count: exact (0 when a dim is 0, whatever the others) */
        int64_t numel = 1;
        for (int i = 0; i < t->ndim; i++) {
            if (t->shape[i] < 0) return opgen_fail(OPGEN_ERR_SHAPE, "%s: %s has a negative dim", op->name, p->name);
            if (t->shape[i] == 0) numel = 0;
        }
        for (int i = 0; i < t->ndim && numel; i++)
            if (__builtin_mul_overflow(numel, t->shape[i], &numel))
                return opgen_fail(OPGEN_ERR_SHAPE, "%s: %s has too many elements", op->name, p->name);
        /* strides: given or contiguous; an empty tensor's strides mean nothing (numpy gives them
           as 0): they are taken as 0, and no stride rule applies */
        int64_t *st = strides_buf[k], step = 1;
        for (int i = t->ndim - 1; i >= 0; i--) {
            st[i] = numel == 0 ? 0 : t->strides ? t->strides[i] : step;
            if (numel) step *= t->shape[i]; /* a suffix product of a non-empty tensor: fits */
        }
        numel_of[k] = numel;
        if (numel > 0) {
            nonempty[k] = 1;
            int64_t nbytes;
            if (!opgen_span_of(t, st, itemsize, &span[k])) {
                if (__builtin_mul_overflow(numel, (int64_t)itemsize, &nbytes)) /* too big whatever the layout */
                    return opgen_fail(OPGEN_ERR_SHAPE, "%s: %s has more bytes than int64 can count", op->name,
                                      p->name);
                return opgen_fail(OPGEN_ERR_STRIDES, "%s: %s's strides reach beyond the int64 range", op->name,
                                  p->name);
            }
        }
        if (p->last_contig && t->ndim > 0 && numel > 0 && t->shape[t->ndim - 1] > 1 && st[t->ndim - 1] != 1)
            return opgen_fail(OPGEN_ERR_STRIDES, "%s: %s's last dim must be contiguous", op->name, p->name);
        if (p->is_output && numel > 0) {
            for (int i = 0; i < t->ndim; i++)
                if (st[i] == 0 && t->shape[i] > 1)
                    return opgen_fail(OPGEN_ERR_STRIDES, "%s: output %s has a broadcast (0) stride",
                                      op->name, p->name);
            if (!opgen_distinct(t->ndim, t->shape, st))
                return opgen_fail(OPGEN_ERR_STRIDES, "%s: output %s has overlapping elements (its strides "
                                  "do not give each element its own address)", op->name, p->name);
        }
        if (numel > 0 && !validate_only) {
            if (!t->data) return opgen_fail(OPGEN_ERR_NULL, "%s: %s has no data", op->name, p->name);
            if ((uintptr_t)t->data % itemsize)
                return opgen_fail(OPGEN_ERR_PARAM, "%s: %s data is not aligned to its element size (%zu bytes)",
                                  op->name, p->name, itemsize);
            uintptr_t base = (uintptr_t)t->data, down = (uintptr_t)0 - (uintptr_t)span[k].lo;
            if (down > base || (uintptr_t)span[k].hi > UINTPTR_MAX - base)
                return opgen_fail(OPGEN_ERR_PARAM, "%s: %s's elements wrap around the address space", op->name,
                                  p->name);
            abs_lo[k] = base - down;
            abs_hi[k] = base + (uintptr_t)span[k].hi;
        }
        /* dims */
        int64_t rows = 1;
        if (p->batch) {
            for (int i = 0; i < nb; i++)
                if (__builtin_mul_overflow(rows, t->shape[i], &rows))
                    return opgen_fail(OPGEN_ERR_SHAPE, "%s: %s has too many rows", op->name, p->name);
            int d = p->dims[0];
            if (bshape_rank[d] < 0) {
                bshape_rank[d] = nb;
                bshape[d] = t->shape;
            } else {
                int same = bshape_rank[d] == nb;
                for (int i = 0; same && i < nb; i++) same = bshape[d][i] == t->shape[i];
                if (!same)
                    return opgen_fail(OPGEN_ERR_SHAPE, "%s: %s's leading shape differs from another tensor's",
                                      op->name, p->name);
            }
        }
        for (int i = 0; i < p->rank; i++) {
            int64_t size = (p->batch && i == 0) ? rows : t->shape[i + nb - 1];
            int d = p->dims[i];
            if (d < 0) {
                if (size != p->lit[i])
                    return opgen_fail(OPGEN_ERR_SHAPE, "%s: %s dim %d must be %lld", op->name, p->name, i,
                                      (long long)p->lit[i]);
            } else if (dim_bound[d] && dims[d] != size) {
                return opgen_fail(OPGEN_ERR_SHAPE, "%s: %s dim %d is %lld but %s is %lld", op->name, p->name,
                                  i, (long long)size, op->dim_names[d], (long long)dims[d]);
            } else {
                dims[d] = size;
                dim_bound[d] = 1;
            }
        }
        /* logical strides; try to coalesce the batch axes into one stride */
        bufs[k].data = t->data;
        /* the batch axes coalesce when each non-unit axis steps over the next non-unit one */
        int coalesced = 1, last = -1;
        int64_t s0 = 0;
        for (int i = 0; i < nb; i++) {
            if (t->shape[i] == 1) continue;
            int64_t step;
            if (last >= 0 && (__builtin_mul_overflow(st[i], t->shape[i], &step) || st[last] != step)) coalesced = 0;
            last = i;
            s0 = st[i];
        }
        if (p->rank > 0) bufs[k].st[0] = coalesced ? s0 : 0;
        for (int i = 1; i < p->rank; i++) bufs[k].st[i] = st[i + nb - 1];
        /* a Batch dim always gets a row-offset table (kernels index rows through it without a
           branch); coalesced layouts fill it with a single stride */
        if (p->batch) n_batch_rows[k] = coalesced ? -1 : nb;
    }
    /* every present tensor and size bound its dims: a dim still unbound belongs only to absent
       optional tensors (e.g. N2 of an absent second table), which this variant never touches */
    for (int d = 0; d < op->n_dims; d++)
        if (!dim_bound[d]) dims[d] = 0;
    /* outputs must not overlap inputs (unless declared as may-alias and identical) */
    for (int k = 0; k < op->n_params && !validate_only; k++) {
        const opgen_param_t *p = &op->params[k];
        if (p->kind != OPGEN_P_TENSOR || !p->is_output || !nonempty[k]) continue;
        for (int j = 0; j < op->n_params; j++) {
            if (j == k || op->params[j].kind != OPGEN_P_TENSOR || !nonempty[j]) continue;
            if (abs_hi[k] <= abs_lo[j] || abs_hi[j] <= abs_lo[k]) continue;
            int ok = 0;
            for (int a = 0; a < op->n_alias; a++)
                if (op->alias[a][0] == k && op->alias[a][1] == j && tensors[j]->data == tensors[k]->data &&
                    tensors[j]->dtype == tensors[k]->dtype &&
                    same_elements(tensors[j], strides_buf[j], tensors[k], strides_buf[k]))
                    ok = 1;
            if (!ok)
                return opgen_fail(OPGEN_ERR_PARAM, "%s: output %s overlaps %s", op->name, p->name,
                                  op->params[j].name);
        }
    }
    /* variant and kernel */
    const opgen_variant_t *var = NULL;
    for (int v = 0; v < op->n_variants; v++)
        if (op->variants[v].present == present) var = &op->variants[v];
    if (!var) return opgen_fail(OPGEN_ERR_INTERNAL, "%s: no variant for these optional tensors", op->name);
    if (var->rejected != OPGEN_SUCCESS) return opgen_fail(var->rejected, "%s: %s", op->name, var->message);
    const opgen_kernel_entry_t *ke = NULL;
    for (int i = 0; i < var->n_kernels && !ke; i++) {
        int match = 1;
        for (int v = 0; v < op->n_vars; v++)
            match &= var->kernels[i].dtypes[v] == OPGEN_ANY_DTYPE || var->kernels[i].dtypes[v] == dtypes[v];
        if (match) ke = &var->kernels[i];
    }
    if (!ke) return no_kernel(op, dtypes);
    /* parameters the kernels read in another dtype (index tensors as int64, masks as bool):
       converted once, before the kernels run, into a dense copy in the workspace unless the
       caller's tensor already has that dtype and a contiguous last dim */
    for (int k = 0; k < op->n_params && var->convert; k++) {
        const opgen_param_t *p = &op->params[k];
        if (var->convert[k] < 0 || !nonempty[k]) continue;
        int r = p->rank;
        int64_t last = r == 0 ? 1 : p->dims[r - 1] >= 0 ? dims[p->dims[r - 1]] : p->lit[r - 1];
        if ((int)tensors[k]->dtype == var->convert[k] && (r == 0 || last <= 1 || bufs[k].st[r - 1] == 1))
            continue;
        cvt[k] = var->convert[k];
        int64_t step = 1; /* dense logical strides: suffix products of the element count */
        for (int i = r - 1; i >= 0; i--) {
            bufs[k].st[i] = step;
            step *= p->dims[i] >= 0 ? dims[p->dims[i]] : p->lit[i];
        }
        if (p->batch) n_batch_rows[k] = -1;
    }
    /* workspace layout from an aligned base: kernel temporaries, then the row-offset tables, each at
       a multiple of OPGEN_WS_ALIGN. `need` adds OPGEN_WS_ALIGN - 1 bytes of slack, so that a
       workspace at any address holds the layout once its base is rounded up. All in saturating
       arithmetic: a size that does not fit is a shape error, never a short workspace. */
    const size_t kws = ke->ws(dims);
    size_t total = opgen_ws_round(kws);
    for (int k = 0; k < op->n_params; k++) {
        tbl_off[k] = total;
        if (n_batch_rows[k])
            total = opgen_sz_add(total, opgen_ws_round(opgen_sz_mul(sizeof(int64_t),
                                                                     opgen_sz_dim(dims[op->params[k].dims[0]]))));
    }
    for (int k = 0; k < op->n_params; k++) {
        cvt_off[k] = total;
        if (cvt[k] >= 0)
            total = opgen_sz_add(total, opgen_ws_round(opgen_sz_mul(opgen_itemsize[cvt[k]], (size_t)numel_of[k])));
    }
    const size_t need = total ? opgen_sz_add(total, OPGEN_WS_ALIGN - 1) : 0;
    if (kws == SIZE_MAX || need > (size_t)PTRDIFF_MAX)
        return opgen_fail(OPGEN_ERR_SHAPE, "%s: workspace size overflows size_t", op->name);
    opgen_status_t pre = ke->pre(bufs, dims, scalars);
    if (pre != OPGEN_SUCCESS) return pre;
    if (ws_needed) *ws_needed = need;
    if (validate_only) return OPGEN_SUCCESS;
    cudaStream_t s = (cudaStream_t)stream;
    /* the workspace: the caller's (base rounded up to OPGEN_WS_ALIGN), or, given NULL and size 0,
       our own (device allocations are 256-byte aligned) */
    void *own = NULL;
    char *w = NULL;
    if (need > 0) {
        if (!ws && ws_size == 0) {
            if (cudaMallocAsync(&own, total, s) != cudaSuccess) {
                cudaError_t e = cudaGetLastError();
                return opgen_fail(OPGEN_ERR_ALLOC, "%s: cannot allocate %zu bytes of device workspace (%s)",
                                  op->name, total, cudaGetErrorString(e));
            }
            w = (char *)own;
        } else if (ws_size < need) {
            return opgen_fail(OPGEN_ERR_WORKSPACE, "%s: workspace of %zu bytes, %zu needed", op->name, ws_size, need);
        } else if (!ws) {
            return opgen_fail(OPGEN_ERR_NULL, "%s: workspace is NULL but workspace_size is %zu", op->name, ws_size);
        } else {
            w = (char *)ws + (OPGEN_WS_ALIGN - (uintptr_t)ws % OPGEN_WS_ALIGN) % OPGEN_WS_ALIGN;
        }
    }
    /* the call's status word: kernels of this call stop once a device-side check fails */
    if (w) cudaMemsetAsync(w, 0, sizeof(unsigned int), s);
    for (int k = 0; k < op->n_params; k++) {
        if (cvt[k] < 0) continue;
        const opgen_tensor_t *t = tensors[k];
        opgen_rows_desc_t d;
        memset(&d, 0, sizeof d);
        for (int i = 0; i < t->ndim; i++) {
            d.shape[i] = t->shape[i];
            d.st[i] = strides_buf[k][i];
        }
        bufs[k].data = w + cvt_off[k];
        opgen_convert_k<<<(unsigned)opgen_cuda_grid((numel_of[k] + OPGEN_CUDA_THREADS - 1) / OPGEN_CUDA_THREADS, 0),
                          OPGEN_CUDA_THREADS, 0, s>>>(bufs[k].data, t->data, (int)t->dtype, cvt[k], numel_of[k],
                                                     t->ndim, d);
    }
    for (int k = 0; k < op->n_params; k++) {
        int nb = n_batch_rows[k];
        if (!nb) continue;
        const opgen_tensor_t *t = tensors[k];
        int64_t *ro = (int64_t *)(void *)(w + tbl_off[k]);
        int64_t rows = dims[op->params[k].dims[0]];
        opgen_rows_desc_t d;
        memset(&d, 0, sizeof d);
        for (int i = 0; i < nb; i++) {
            d.shape[i] = t->shape[i];
            d.st[i] = strides_buf[k][i];
        }
        if (rows > 0)
            opgen_rows_k<<<(unsigned)opgen_cuda_grid((rows + OPGEN_CUDA_THREADS - 1) / OPGEN_CUDA_THREADS, 0),
                           OPGEN_CUDA_THREADS, 0, s>>>(ro, rows, nb < 0 ? 0 : nb, d, bufs[k].st[0]);
        bufs[k].ro = ro;
    }
    opgen_status_t st = opgen_cuda_launched(op->name);
    if (st == OPGEN_SUCCESS) st = ke->fn(bufs, dims, scalars, w, s);
    if (own) cudaFreeAsync(own, s);
    return st;
}
