/* opgen_rt.c — argument binding, validation and dispatch shared by every op. Generated. */
#include "opgen_rt.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static _Thread_local char opgen_err[256];

const char *opgen_last_error(void) { return opgen_err; }

const char *opgen_status_string(opgen_status_t status) {
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

void opgen_segments(const int64_t *idx, int64_t n, int64_t rows, int64_t *start, int64_t *order) {
    for (int64_t v = 0; v <= rows; v++) start[v] = 0;
    for (int64_t i = 0; i < n; i++) start[idx[i] + 1]++;
    for (int64_t v = 0; v < rows; v++) start[v + 1] += start[v];
    /* fill each segment from its end backwards: positions inside a segment increase with i */
    for (int64_t i = n - 1; i >= 0; i--) order[--start[idx[i] + 1]] = i;
    /* start[v + 1] now holds the beginning of segment v */
    for (int64_t v = 0; v < rows; v++) start[v] = start[v + 1];
    start[rows] = n;
}

/* ---- f32 GEMM: packed panels and an MR x NR register tile (auto-vectorised) ---- */
#define OPGEN_MR 8
#define OPGEN_NR 32
#define OPGEN_KC 256

static void pack_a(int64_t mr, int64_t kc, const float *A, int64_t ars, int64_t acs, float *restrict p) {
    if (mr < OPGEN_MR) memset(p, 0, sizeof(float) * OPGEN_MR * (size_t)kc);
    if (acs == 1) { /* rows contiguous: stream each row */
        for (int64_t i = 0; i < mr; i++)
            for (int64_t k = 0; k < kc; k++) p[k * OPGEN_MR + i] = A[i * ars + k];
    } else {
        for (int64_t k = 0; k < kc; k++)
            for (int64_t i = 0; i < mr; i++) p[k * OPGEN_MR + i] = A[i * ars + k * acs];
    }
}

static void pack_b(int64_t nr, int64_t kc, const float *B, int64_t brs, int64_t bcs, float *restrict p) {
    if (nr < OPGEN_NR) memset(p, 0, sizeof(float) * OPGEN_NR * (size_t)kc);
    if (bcs == 1) { /* rows of B contiguous: vector copies */
        for (int64_t k = 0; k < kc; k++)
            for (int64_t j = 0; j < nr; j++) p[k * OPGEN_NR + j] = B[k * brs + j];
    } else { /* B transposed: stream each column */
        for (int64_t j = 0; j < nr; j++)
            for (int64_t k = 0; k < kc; k++) p[k * OPGEN_NR + j] = B[k * brs + j * bcs];
    }
}

#if defined(__AVX512F__)
__attribute__((target("prefer-vector-width=512")))
#endif
static void ukernel(int64_t kc, const float *restrict a, const float *restrict b, float *restrict c,
                    int64_t ldc, int64_t mr, int64_t nr, int acc) {
    float t[OPGEN_MR][OPGEN_NR];
    for (int i = 0; i < OPGEN_MR; i++)
        for (int j = 0; j < OPGEN_NR; j++) t[i][j] = 0.0f;
    for (int64_t k = 0; k < kc; k++) {
        const float *bk = b + k * OPGEN_NR;
        _Pragma("GCC unroll 8") for (int i = 0; i < OPGEN_MR; i++) {
            const float ai = a[k * OPGEN_MR + i];
            _Pragma("GCC unroll 32") for (int j = 0; j < OPGEN_NR; j++) t[i][j] += ai * bk[j];
        }
    }
    for (int64_t i = 0; i < mr; i++)
        for (int64_t j = 0; j < nr; j++) c[i * ldc + j] = acc ? c[i * ldc + j] + t[i][j] : t[i][j];
}

void opgen_sgemm(int64_t m, int64_t n, int64_t k, const float *A, int64_t ars, int64_t acs,
                 const float *B, int64_t brs, int64_t bcs, float *C, int64_t ldc, int accumulate) {
    if (m <= 0 || n <= 0) return;
    if (k <= 0) {
        if (!accumulate)
            for (int64_t i = 0; i < m; i++) memset(C + i * ldc, 0, sizeof(float) * (size_t)n);
        return;
    }
    int64_t kc_max = k < OPGEN_KC ? k : OPGEN_KC;
    int64_t npan = (n + OPGEN_NR - 1) / OPGEN_NR;
    float *pa = (float *)malloc(sizeof(float) * OPGEN_MR * (size_t)kc_max);
    float *pb = (float *)malloc(sizeof(float) * OPGEN_NR * (size_t)kc_max * (size_t)npan);
    if (!pa || !pb) { /* fall back to the plain triple loop */
        free(pa);
        free(pb);
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                float s = accumulate ? C[i * ldc + j] : 0.0f;
                for (int64_t q = 0; q < k; q++) s += A[i * ars + q * acs] * B[q * brs + j * bcs];
                C[i * ldc + j] = s;
            }
        return;
    }
    for (int64_t k0 = 0; k0 < k; k0 += OPGEN_KC) {
        int64_t kc = k - k0 < OPGEN_KC ? k - k0 : OPGEN_KC;
        int acc = accumulate || k0 > 0;
        for (int64_t j0 = 0; j0 < n; j0 += OPGEN_NR)
            pack_b(n - j0 < OPGEN_NR ? n - j0 : OPGEN_NR, kc, B + k0 * brs + j0 * bcs, brs, bcs,
                   pb + (j0 / OPGEN_NR) * OPGEN_NR * kc);
        for (int64_t i0 = 0; i0 < m; i0 += OPGEN_MR) {
            int64_t mr = m - i0 < OPGEN_MR ? m - i0 : OPGEN_MR;
            pack_a(mr, kc, A + i0 * ars + k0 * acs, ars, acs, pa);
            for (int64_t j0 = 0; j0 < n; j0 += OPGEN_NR)
                ukernel(kc, pa, pb + (j0 / OPGEN_NR) * OPGEN_NR * kc, C + i0 * ldc + j0, ldc, mr,
                        n - j0 < OPGEN_NR ? n - j0 : OPGEN_NR, acc);
        }
    }
    free(pa);
    free(pb);
}

typedef struct {
    int64_t lo, hi; /* byte extent [lo, hi) of a tensor's elements, hi == lo when empty */
} opgen_extent_t;

static opgen_extent_t extent_of(const opgen_tensor_t *t, size_t itemsize, const int64_t *strides) {
    opgen_extent_t e = {(int64_t)(intptr_t)t->data, (int64_t)(intptr_t)t->data};
    int64_t lo = 0, hi = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] == 0) return e;
        int64_t span = (t->shape[i] - 1) * strides[i];
        if (span < 0) lo += span; else hi += span;
    }
    e.lo += lo * (int64_t)itemsize;
    e.hi += (hi + 1) * (int64_t)itemsize;
    return e;
}

static const size_t opgen_itemsize[OPGEN_DTYPE_COUNT] = { 1, 1, 2, 4, 8, 1, 2, 4, 8, 2, 2, 4, 8, };

opgen_status_t opgen_run(const opgen_op_t *op, const opgen_tensor_t *const *tensors,
                         const opgen_scalar_t *scalars, void *ws, size_t ws_size,
                         size_t *ws_needed, int validate_only) {
    int64_t dims[OPGEN_MAX_DIMS];
    int dim_bound[OPGEN_MAX_DIMS] = {0};
    int dtypes[OPGEN_MAX_VARS];
    int64_t bshape_rank[OPGEN_MAX_DIMS];
    const int64_t *bshape[OPGEN_MAX_DIMS];
    int64_t strides_buf[OPGEN_MAX_PARAMS][OPGEN_MAX_RANK];
    opgen_buf_t bufs[OPGEN_MAX_PARAMS];
    int n_batch_rows[OPGEN_MAX_PARAMS]; /* params whose rows need an offset table: their nb */
    uint32_t present = 0;
    int opt_k = 0;
    opgen_err[0] = 0;
    for (int v = 0; v < OPGEN_MAX_VARS; v++) dtypes[v] = -1;
    for (int d = 0; d < OPGEN_MAX_DIMS; d++) bshape_rank[d] = -1;
    memset(bufs, 0, sizeof bufs);

    for (int k = 0; k < op->n_params; k++) {
        const opgen_param_t *p = &op->params[k];
        n_batch_rows[k] = 0;
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
        /* strides: given or contiguous */
        int64_t *st = strides_buf[k];
        int64_t numel = 1;
        for (int i = t->ndim - 1; i >= 0; i--) {
            if (t->shape[i] < 0) return opgen_fail(OPGEN_ERR_SHAPE, "%s: %s has a negative dim", op->name, p->name);
            st[i] = t->strides ? t->strides[i] : numel;
            if (__builtin_mul_overflow(numel, t->shape[i], &numel))
                return opgen_fail(OPGEN_ERR_SHAPE, "%s: %s has too many elements", op->name, p->name);
        }
        /* an empty tensor's strides mean nothing (numpy gives them as 0): no stride rules */
        if (p->last_contig && t->ndim > 0 && numel > 0 && t->shape[t->ndim - 1] > 1 && st[t->ndim - 1] != 1)
            return opgen_fail(OPGEN_ERR_STRIDES, "%s: %s's last dim must be contiguous", op->name, p->name);
        if (p->is_output && numel > 0) {
            for (int i = 0; i < t->ndim; i++)
                if (st[i] == 0 && t->shape[i] > 1)
                    return opgen_fail(OPGEN_ERR_STRIDES, "%s: output %s has a broadcast (0) stride",
                                      op->name, p->name);
        }
        if (!t->data && numel > 0 && !validate_only)
            return opgen_fail(OPGEN_ERR_NULL, "%s: %s has no data", op->name, p->name);
        /* dims */
        int64_t rows = 1;
        if (p->batch) {
            for (int i = 0; i < nb; i++) rows *= t->shape[i];
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
            if (last >= 0 && st[last] != st[i] * t->shape[i]) coalesced = 0;
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
        if (p->kind != OPGEN_P_TENSOR || !p->is_output || !tensors[k]) continue;
        opgen_extent_t eo = extent_of(tensors[k], opgen_itemsize[tensors[k]->dtype], strides_buf[k]);
        for (int j = 0; j < op->n_params; j++) {
            if (j == k || op->params[j].kind != OPGEN_P_TENSOR || !tensors[j]) continue;
            opgen_extent_t ei = extent_of(tensors[j], opgen_itemsize[tensors[j]->dtype], strides_buf[j]);
            if (eo.hi <= ei.lo || ei.hi <= eo.lo || eo.hi == eo.lo || ei.hi == ei.lo) continue;
            int ok = 0;
            for (int a = 0; a < op->n_alias; a++)
                if (op->alias[a][0] == k && op->alias[a][1] == j && tensors[j]->data == tensors[k]->data &&
                    !memcmp(strides_buf[j], strides_buf[k], sizeof(int64_t) * (size_t)tensors[k]->ndim))
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
        for (int v = 0; v < op->n_vars; v++) match &= var->kernels[i].dtypes[v] == dtypes[v];
        if (match) ke = &var->kernels[i];
    }
    if (!ke) return opgen_fail(OPGEN_ERR_DTYPE, "%s: no kernel for this dtype combination", op->name);
    /* workspace: kernel temporaries, then row-offset tables */
    size_t need = opgen_align(ke->ws(dims));
    for (int k = 0; k < op->n_params; k++)
        if (n_batch_rows[k]) need += opgen_align(sizeof(int64_t) * (size_t)dims[op->params[k].dims[0]]);
    opgen_status_t pre = ke->pre(bufs, dims, scalars);
    if (pre != OPGEN_SUCCESS) return pre;
    if (ws_needed) *ws_needed = need;
    if (validate_only) return OPGEN_SUCCESS;
    void *own = NULL;
    if (!ws && ws_size == 0 && need > 0) {
        own = ws = aligned_alloc(64, need);
        if (!ws) return opgen_fail(OPGEN_ERR_ALLOC, "%s: cannot allocate %zu bytes of workspace", op->name, need);
        ws_size = need;
    }
    if (ws_size < need) {
        return opgen_fail(OPGEN_ERR_WORKSPACE, "%s: workspace of %zu bytes, %zu needed", op->name, ws_size, need);
    }
    char *w = (char *)ws;
    size_t off = opgen_align(ke->ws(dims));
    for (int k = 0; k < op->n_params; k++) {
        int nb = n_batch_rows[k];
        if (!nb) continue;
        const opgen_tensor_t *t = tensors[k];
        int64_t *ro = (int64_t *)(w + off);
        int64_t rows = dims[op->params[k].dims[0]];
        if (nb < 0) {
            for (int64_t r = 0; r < rows; r++) ro[r] = r * bufs[k].st[0];
            nb = 0;
        }
        for (int64_t r = 0; nb > 0 && r < rows; r++) {
            int64_t rem = r, o = 0;
            for (int i = nb - 1; i >= 0; i--) {
                o += (rem % t->shape[i]) * strides_buf[k][i];
                rem /= t->shape[i];
            }
            ro[r] = o;
        }
        bufs[k].ro = ro;
        off += opgen_align(sizeof(int64_t) * (size_t)rows);
    }
    opgen_status_t st = ke->fn(bufs, dims, scalars, w);
    free(own);
    return st;
}
