/* opgen_rt.c — argument binding, validation and dispatch shared by every op. Generated. */
#define _DEFAULT_SOURCE /* syscall(): the AMX tile-state request */
#include "opgen_rt.h"

#include <omp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h> /* sysconf */
#ifdef __linux__
#include <sys/mman.h> /* madvise, mincore */
#endif

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

/* ---- threads: a fixed per-process cap; 1 thread in a fork() child once a pool has run ---- */
static atomic_int opgen_cap;       /* 0 until decided */
static atomic_int opgen_pool_used; /* this library has opened a region of 2+ threads */
static atomic_int opgen_forked;    /* a fork() child of a process where that happened */

int opgen_team_cap(void) {
    int cap = atomic_load_explicit(&opgen_cap, memory_order_acquire);
    if (cap > 0) return cap;
    int n = omp_get_max_threads();
    int limit = omp_get_thread_limit();
    if (limit > 0 && n > limit) n = limit;
    if (n < 1) n = 1;
    int expected = 0;
    if (!atomic_compare_exchange_strong(&opgen_cap, &expected, n)) n = expected; /* another thread won */
    return n;
}

int opgen_team(void) {
    if (atomic_load_explicit(&opgen_forked, memory_order_relaxed)) return 1;
    int n = omp_get_max_threads(), cap = opgen_team_cap();
    if (n > cap) n = cap;
    if (n <= 1) return 1;
    if (!atomic_load_explicit(&opgen_pool_used, memory_order_relaxed))
        atomic_store_explicit(&opgen_pool_used, 1, memory_order_relaxed);
    return n;
}

/* libgomp's thread pool does not survive fork(): in the child, a region of 2+ threads waits
   forever for the parent's workers; a region of one thread never touches the pool. */
static void opgen_atfork_child(void) {
    if (atomic_load_explicit(&opgen_pool_used, memory_order_relaxed))
        atomic_store_explicit(&opgen_forked, 1, memory_order_relaxed);
}

/* Decide the cap while the library is loaded (OMP_NUM_THREADS, else the cores libgomp sees),
   before any caller can change its own thread's omp_set_num_threads. */
__attribute__((constructor)) static void opgen_rt_init(void) {
    (void)opgen_team_cap();
    pthread_atfork(NULL, NULL, opgen_atfork_child);
}

/* ---- cache sizes, as the C library reports them (sysconf) ----
 * The last-level cache up to 32 MiB, else 32 MiB: a VM reports its host's whole L3 (384 MiB on
 * the Zen 5 machine, whose cores share 32 MiB), and a core's share of a big L3 is smaller
 * still. A core's L2, else 1 MiB. */
static size_t opgen_llc_bytes(void) {
    long llc = -1;
#ifdef _SC_LEVEL3_CACHE_SIZE
    llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
#endif
    return llc > 0 && llc < (32l << 20) ? (size_t)llc : (size_t)32 << 20;
}
static size_t opgen_l2_bytes(void) {
    long l2 = -1;
#ifdef _SC_LEVEL2_CACHE_SIZE
    l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
    return l2 > 0 ? (size_t)l2 : (size_t)1 << 20;
}

/* ---- streaming stores: from which output size (opgen_nt) ----
 * OPGEN_NT_BYTES (bytes; 0: always), else the last-level cache (opgen_llc_bytes). Decided once
 * per process. */
static atomic_size_t opgen_nt_from; /* 0 until decided (a decided 0 is kept as 1) */

size_t opgen_nt_bytes(void) {
    size_t b = atomic_load_explicit(&opgen_nt_from, memory_order_relaxed);
    if (b) return b;
    const char *env = getenv("OPGEN_NT_BYTES");
    char *end = NULL;
    unsigned long long v = env && *env ? strtoull(env, &end, 10) : 0;
    if (env && *env && end && !*end) {
        b = v > SIZE_MAX ? SIZE_MAX : (size_t)v;
    } else {
        b = opgen_llc_bytes();
    }
    if (!b) b = 1; /* (every output of at least one byte) */
    atomic_store_explicit(&opgen_nt_from, b, memory_order_relaxed);
    return b;
}

int opgen_nt(const void *p, size_t bytes) {
    if (!p || bytes < opgen_nt_bytes()) return 0;
#ifdef __linux__
    const long ps = sysconf(_SC_PAGESIZE);
    if (ps <= 0) return 0;
    const uintptr_t at[3] = {(uintptr_t)p, (uintptr_t)p + bytes / 2, (uintptr_t)p + (bytes - 1)};
    for (int i = 0; i < 3; i++) {
        unsigned char v = 0;
        if (mincore((void *)(at[i] & ~(uintptr_t)(ps - 1)), 1, &v) != 0 || !(v & 1)) return 0;
    }
#endif
    return 1;
}

/* ---- zero hints (opgen_zero_hint) ----
 * Up to OPGEN_ZERO_HINTS ranges per thread, replaced by each opgen_zero_hint call on it. */
#define OPGEN_ZERO_HINTS 8
static _Thread_local struct { const char *p; size_t n; } opgen_zero_ranges[OPGEN_ZERO_HINTS];
static _Thread_local int opgen_zero_count;

void opgen_zero_hint(const void *const *p, const size_t *bytes, int n) {
    opgen_zero_count = 0;
    for (int i = 0; i < n && p && bytes && opgen_zero_count < OPGEN_ZERO_HINTS; i++)
        if (p[i] && bytes[i]) {
            opgen_zero_ranges[opgen_zero_count].p = (const char *)p[i];
            opgen_zero_ranges[opgen_zero_count++].n = bytes[i];
        }
}

int opgen_known_zero(const void *p, size_t bytes) {
    const char *q = (const char *)p;
    for (int i = 0; p && i < opgen_zero_count; i++)
        if (q >= opgen_zero_ranges[i].p && bytes <= opgen_zero_ranges[i].n &&
            (size_t)(q - opgen_zero_ranges[i].p) <= opgen_zero_ranges[i].n - bytes)
            return 1;
    return 0;
}

/* ---- f32 GEMM: packed panels and an MR x NR register tile ----
 * Loops: k blocks of OPGEN_KC; B's block packed in NR-column panels; row blocks of OPGEN_MC
 * packed in MR-row panels; then (sgemm_block) column blocks of OPGEN_NC, each A panel, each B
 * panel. Every element of C sums its k terms in increasing k within a block (one fused
 * multiply-add each) and adds the blocks in order, whatever the tile sizes, the loop order or the
 * instruction set: results are bitwise the same on every path and thread count. With AVX-512 the
 * register tile is 14 x 32 (28 accumulators), with AVX2 and FMA 6 x 16 (12; both intrinsics);
 * otherwise 8 x 32, auto-vectorised. */
#if defined(__AVX512F__)
#include <immintrin.h>
#define OPGEN_MR 14
#define OPGEN_NR 32
#define OPGEN_VEC(x) _mm512_##x /* (the kernel's vector intrinsics: OPGEN_VEC(fmadd_ps), ...) */
typedef __m512 opgen_vec;
#elif defined(__AVX2__) && defined(__FMA__)
/* 16 ymm registers: 6 x 16 (12 accumulators, two B vectors, one broadcast) */
#include <immintrin.h>
#define OPGEN_MR 6
#define OPGEN_NR 16
#define OPGEN_VEC(x) _mm256_##x
typedef __m256 opgen_vec;
#else
#define OPGEN_MR 8
#define OPGEN_NR 32
#endif
#define OPGEN_KC 256 /* sched.matmul's k blocks (opgen/lower/sched.py: GEMM_KC) */
#define OPGEN_MC (18 * OPGEN_MR) /* rows of a block: whole panels */
#define OPGEN_NC 1024 /* (128 to 1024 within noise of each other on a Zen 3) */

/* Operands are f32 (bf 0), or 16-bit storage widened exactly while packing (opgen_gemm_bf16's and
 * opgen_gemm_f16's caller tensors): bf16 (bf 1) or f16 (bf 2, ST_F16); offsets in elements */
#define ST_F16 2
static inline const void *at(const void *p, int64_t n, int bf) { return (const char *)p + n * (bf ? 2 : 4); }
static inline float ld1(const void *p, int bf) {
    return bf == ST_F16 ? opgen_f16_to_f32(*(const uint16_t *)p)
           : bf          ? opgen_bf16_to_f32(*(const uint16_t *)p)
                         : *(const float *)p;
}

/* A's mr rows (k columns k0.., kc of them) as an OPGEN_MR-row panel: row i at p + i * OPGEN_KC.
 * Rows a constant OPGEN_KC floats apart, not A's ars, so that the kernel's 14 row streams fall
 * in different cache sets and are addressed by constant displacements. */
static void pack_a(int64_t mr, int64_t kc, const void *A, int64_t ars, int64_t acs, int bf, float *restrict p) {
    if (mr < OPGEN_MR) memset(p + mr * OPGEN_KC, 0, sizeof(float) * OPGEN_KC * (size_t)(OPGEN_MR - mr));
    if (acs == 1 && !bf) { /* rows contiguous: copies */
        for (int64_t i = 0; i < mr; i++) memcpy(p + i * OPGEN_KC, at(A, i * ars, 0), sizeof(float) * (size_t)kc);
    } else if (acs == 1 && bf == ST_F16) { /* (16-bit rows: vector widening) */
        const uint16_t *a = A;
        for (int64_t i = 0; i < mr; i++)
            for (int64_t k = 0; k < kc; k++) p[i * OPGEN_KC + k] = opgen_f16_to_f32(a[i * ars + k]);
    } else if (acs == 1) {
        const uint16_t *a = A;
        for (int64_t i = 0; i < mr; i++)
            for (int64_t k = 0; k < kc; k++) p[i * OPGEN_KC + k] = opgen_bf16_to_f32(a[i * ars + k]);
    } else {
        for (int64_t i = 0; i < mr; i++)
            for (int64_t k = 0; k < kc; k++) p[i * OPGEN_KC + k] = ld1(at(A, i * ars + k * acs, bf), bf);
    }
}

static void pack_b(int64_t nr, int64_t kc, const void *B, int64_t brs, int64_t bcs, int bf, float *restrict p) {
    if (nr < OPGEN_NR) memset(p, 0, sizeof(float) * OPGEN_NR * (size_t)kc);
    if (bcs == 1 && !bf) { /* rows of B contiguous: vector copies */
        const float *b = B;
#if defined(OPGEN_VEC)
        if (nr == OPGEN_NR) { /* two vectors a row (the plain loop became a call to memmove per row:
                                 a tenth of an in-cache f32 GEMM's time) */
            enum { H = OPGEN_NR / 2 };
            for (int64_t k = 0; k < kc; k++) {
                OPGEN_VEC(storeu_ps)(p + k * OPGEN_NR, OPGEN_VEC(loadu_ps)(b + k * brs));
                OPGEN_VEC(storeu_ps)(p + k * OPGEN_NR + H, OPGEN_VEC(loadu_ps)(b + k * brs + H));
            }
            return;
        }
#endif
        for (int64_t k = 0; k < kc; k++)
            for (int64_t j = 0; j < nr; j++) p[k * OPGEN_NR + j] = b[k * brs + j];
    } else if (bcs == 1 && bf == ST_F16) {
        const uint16_t *b = B;
        for (int64_t k = 0; k < kc; k++)
            for (int64_t j = 0; j < nr; j++) p[k * OPGEN_NR + j] = opgen_f16_to_f32(b[k * brs + j]);
    } else if (bcs == 1) {
        const uint16_t *b = B;
        for (int64_t k = 0; k < kc; k++)
            for (int64_t j = 0; j < nr; j++) p[k * OPGEN_NR + j] = opgen_bf16_to_f32(b[k * brs + j]);
    } else { /* B transposed or strided: its columns staged as the panel's rows by tile-transposes'
                helper (16 x 16 blocks transposed in registers where k runs along a column: element by
                element, packing B of a linear layer's x W^T took 3-5% of the f32 GEMM) */
        if (bf == ST_F16) opgen_f16_transpose_tile(p, OPGEN_NR, B, bcs, brs, nr, kc);
        else if (bf) opgen_bf16_transpose_tile(p, OPGEN_NR, B, bcs, brs, nr, kc);
        else opgen_f32_transpose_tile(p, OPGEN_NR, B, bcs, brs, nr, kc);
    }
}

/* C (mr x nr of the tile, leading dimension ldc) = or += t (an OPGEN_MR x OPGEN_NR tile) */
static void store_tile(float t[OPGEN_MR][OPGEN_NR], float *restrict c, int64_t ldc, int64_t mr, int64_t nr,
                       int acc) {
    for (int64_t i = 0; i < mr; i++)
        for (int64_t j = 0; j < nr; j++) c[i * ldc + j] = acc ? c[i * ldc + j] + t[i][j] : t[i][j];
}

#if defined(OPGEN_VEC)
/* OPGEN_MR rows x two vectors of B (OPGEN_NR columns), in registers: every loop over the
 * accumulators is unrolled (not unrolled, GCC kept them in arrays stored to the stack every k).
 * Aligned to 64 bytes, so that where its k loop falls against the fetch lines is fixed per build,
 * not by the size of the code before it: 16 bytes more code earlier in this file once put the
 * loop's last instruction across a 64-byte line and made FLCE's GEMMs 15-20% slower on a Zen 3. */
__attribute__((aligned(64))) static void ukernel(int64_t kc, const float *restrict a, const float *restrict b, float *restrict c,
                    int64_t ldc, int64_t mr, int64_t nr, int acc) {
    enum { H = OPGEN_NR / 2 }; /* (one vector) */
    opgen_vec t0[OPGEN_MR], t1[OPGEN_MR];
    _Pragma("GCC unroll 16") for (int i = 0; i < OPGEN_MR; i++) {
        t0[i] = OPGEN_VEC(setzero_ps)();
        t1[i] = OPGEN_VEC(setzero_ps)();
    }
    for (int64_t i = 0; i < mr; i++) { /* C's tile, needed after the k loop: fetched meanwhile */
        OPGEN_PREFETCH(c, i * ldc, 0);
        OPGEN_PREFETCH(c, i * ldc + nr - 1, 0);
    }
    for (int64_t k = 0; k < kc; k++) {
        /* B's panel comes from L2 (the row block's A panel stays in L1): 512 bytes ahead */
        _Pragma("GCC unroll 2") for (int q = 0; q < OPGEN_NR * (int)sizeof(float); q += 64)
            OPGEN_PREFETCH(b, k * OPGEN_NR, 512 + q);
        const opgen_vec b0 = OPGEN_VEC(loadu_ps)(b + k * OPGEN_NR), b1 = OPGEN_VEC(loadu_ps)(b + k * OPGEN_NR + H);
        _Pragma("GCC unroll 16") for (int i = 0; i < OPGEN_MR; i++) {
            const opgen_vec ai = OPGEN_VEC(set1_ps)(a[i * OPGEN_KC + k]);
            t0[i] = OPGEN_VEC(fmadd_ps)(ai, b0, t0[i]);
            t1[i] = OPGEN_VEC(fmadd_ps)(ai, b1, t1[i]);
        }
    }
    if (mr == OPGEN_MR && nr == OPGEN_NR) {
        _Pragma("GCC unroll 16") for (int i = 0; i < OPGEN_MR; i++) {
            float *ci = c + i * ldc;
            if (acc) {
                t0[i] = OPGEN_VEC(add_ps)(OPGEN_VEC(loadu_ps)(ci), t0[i]);
                t1[i] = OPGEN_VEC(add_ps)(OPGEN_VEC(loadu_ps)(ci + H), t1[i]);
            }
            OPGEN_VEC(storeu_ps)(ci, t0[i]);
            OPGEN_VEC(storeu_ps)(ci + H, t1[i]);
        }
        return;
    }
    float t[OPGEN_MR][OPGEN_NR];
    _Pragma("GCC unroll 16") for (int i = 0; i < OPGEN_MR; i++) {
        OPGEN_VEC(storeu_ps)(t[i], t0[i]);
        OPGEN_VEC(storeu_ps)(t[i] + H, t1[i]);
    }
    store_tile(t, c, ldc, mr, nr, acc);
}
#else
static void ukernel(int64_t kc, const float *restrict a, const float *restrict b, float *restrict c,
                    int64_t ldc, int64_t mr, int64_t nr, int acc) {
    float t[OPGEN_MR][OPGEN_NR];
    for (int i = 0; i < OPGEN_MR; i++)
        for (int j = 0; j < OPGEN_NR; j++) t[i][j] = 0.0f;
    for (int64_t k = 0; k < kc; k++) {
        const float *bk = b + k * OPGEN_NR;
        _Pragma("GCC unroll 8") for (int i = 0; i < OPGEN_MR; i++) {
            const float ai = a[i * OPGEN_KC + k];
            _Pragma("GCC unroll 32") for (int j = 0; j < OPGEN_NR; j++) t[i][j] = fmaf(ai, bk[j], t[i][j]);
        }
    }
    store_tile(t, c, ldc, mr, nr, acc);
}
#endif

/* C's element (i, j) as the GEMM sums it (its k blocks in order, one FMA per term within a block),
 * added to c when accumulating: the plain loops' sums when panels cannot be allocated, so the
 * same bits */
static float loop_sum(int64_t i, int64_t j, int64_t k, const void *A, int64_t ars, int64_t acs, int abf,
                      const void *B, int64_t brs, int64_t bcs, int bbf, float c, int accumulate) {
    float s = accumulate ? c : 0.0f;
    for (int64_t k0 = 0; k0 < k; k0 += OPGEN_KC) {
        float t = 0.0f;
        for (int64_t q = k0; q < k && q < k0 + OPGEN_KC; q++)
            t = fmaf(ld1(at(A, i * ars + q * acs, abf), abf), ld1(at(B, q * brs + j * bcs, bbf), bbf), t);
        s = (k0 == 0 && !accumulate) ? t : s + t;
    }
    return s;
}

/* The plain triple loop when panels cannot be allocated */
static void sgemm_loop(int64_t m, int64_t n, int64_t k, const void *A, int64_t ars, int64_t acs, int abf,
                       const void *B, int64_t brs, int64_t bcs, int bbf, float *C, int64_t ldc, int accumulate) {
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++)
            C[i * ldc + j] = loop_sum(i, j, k, A, ars, acs, abf, B, brs, bcs, bbf,
                                      accumulate ? C[i * ldc + j] : 0.0f, accumulate);
}

/* One row block (mc <= OPGEN_MC rows) of C against the packed B block pb (kc x n): A's panels
 * packed into pa; then, for each OPGEN_NC columns of B (kept in L2), each A panel (kept in L1)
 * meets each of their B panels. (B panels outermost, kept in L1 with A's panels streaming from
 * L2, ran at 0.75x MKL; this order, A packed by rows and B prefetched, at about 0.9x.) */
static void sgemm_block(int64_t mc, int64_t n, int64_t kc, const void *A, int64_t ars, int64_t acs, int abf,
                        const float *pb, float *C, int64_t ldc, int acc, float *pa) {
    for (int64_t i0 = 0; i0 < mc; i0 += OPGEN_MR) {
        /* the next panel's rows fetched into L2 meanwhile (rows of A are pages apart, each a few
           lines: an f16 linear 4096 x 2048 x 2048 on 2 threads of the Sapphire Rapids VM spent a
           tenth of its time loading them; 238 -> 252 GFLOP/s; f32 within noise) */
        if (acs == 1)
            for (int64_t r = i0 + OPGEN_MR; r < mc && r < i0 + 2 * OPGEN_MR; r++)
                for (int64_t q = 0; q < kc * (abf ? 2 : 4); q += 64) OPGEN_PREFETCH_L2((const char *)at(A, r * ars, abf), q, 0);
        pack_a(mc - i0 < OPGEN_MR ? mc - i0 : OPGEN_MR, kc, at(A, i0 * ars, abf), ars, acs, abf,
               pa + (i0 / OPGEN_MR) * OPGEN_MR * OPGEN_KC);
    }
    for (int64_t jc = 0; jc < n; jc += OPGEN_NC)
        for (int64_t i0 = 0; i0 < mc; i0 += OPGEN_MR)
            for (int64_t j0 = jc; j0 < n && j0 < jc + OPGEN_NC; j0 += OPGEN_NR)
                ukernel(kc, pa + (i0 / OPGEN_MR) * OPGEN_MR * OPGEN_KC, pb + (j0 / OPGEN_NR) * OPGEN_NR * kc,
                        C + i0 * ldc + j0, ldc, mc - i0 < OPGEN_MR ? mc - i0 : OPGEN_MR,
                        n - j0 < OPGEN_NR ? n - j0 : OPGEN_NR, acc);
}

/* Panels per row block of opgen_sgemm on `threads` threads (`panels` MR-row panels in all): OPGEN_MC
 * rows on one thread; on several, blocks small enough that each thread takes about 16 of them,
 * handed out as threads finish (4096 x 2048 x 2048 f32 on 2 threads of a noisy 2-vCPU VM: whole
 * shares 199-206 GFLOP/s median, blocks of 18 panels handed out 231-255, of 9 235-269; the
 * k block's barrier waits for at most one small block) */
static int64_t sgemm_block_panels(int64_t panels, int threads) {
    const int64_t most = OPGEN_MC / OPGEN_MR, want = (panels + 16 * (int64_t)threads - 1) / (16 * (int64_t)threads);
    return threads <= 1 || want >= most ? most : want;
}

/* opgen_sgemm, its rows spread over `threads` OpenMP threads (1: an inactive region, so none):
 * for each k block, B is packed once (its panels split over the threads), then row blocks of whole
 * MR-row panels (sgemm_block_panels) go to the threads as they finish (each element's sums are the
 * same whichever thread computes it, so the bits do not depend on the schedule). A and B may be
 * bf16 (abf, bbf: widened exactly in their panels, so the bits of the f32 GEMM on their values). */
static void sgemm_x(int64_t m, int64_t n, int64_t k, const void *A, int64_t ars, int64_t acs, int abf, const void *B,
                    int64_t brs, int64_t bcs, int bbf, float *C, int64_t ldc, int accumulate, int threads) {
    if (m <= 0 || n <= 0) return;
    if (k <= 0) {
        if (!accumulate)
            for (int64_t i = 0; i < m; i++) memset(C + i * ldc, 0, sizeof(float) * (size_t)n);
        return;
    }
    int64_t kc_max = k < OPGEN_KC ? k : OPGEN_KC;
    int64_t npan = (n + OPGEN_NR - 1) / OPGEN_NR;
    const int64_t panels = (m + OPGEN_MR - 1) / OPGEN_MR;
    if (threads > panels) threads = (int)panels;
    const int64_t bp = sgemm_block_panels(panels, threads), blocks = (panels + bp - 1) / bp;
    /* saturating sizes: panels that do not fit fall back to the triple loop */
    size_t na = opgen_sz_mul(sizeof(float) * OPGEN_MR * OPGEN_KC, (size_t)(bp < panels ? bp : panels));
    size_t nb = opgen_sz_mul(opgen_sz_mul(sizeof(float) * OPGEN_NR, (size_t)kc_max), (size_t)npan);
    size_t na_all = opgen_sz_mul(na, (size_t)threads);
    float *pa = na_all == SIZE_MAX ? NULL : (float *)malloc(na_all);
    float *pb = nb == SIZE_MAX ? NULL : (float *)malloc(nb);
    if (!pa || !pb) {
        free(pa);
        free(pb);
        sgemm_loop(m, n, k, A, ars, acs, abf, B, brs, bcs, bbf, C, ldc, accumulate);
        return;
    }
    /* (one thread: an inactive region, whose loops bind to it, not to a caller's region) */
    #pragma omp parallel num_threads(threads) if (threads > 1)
    {
        float *pa_t = pa + (size_t)omp_get_thread_num() * (na / sizeof(float));
        for (int64_t k0 = 0; k0 < k; k0 += OPGEN_KC) {
            const int64_t kc = k - k0 < OPGEN_KC ? k - k0 : OPGEN_KC;
            #pragma omp for schedule(static)
            for (int64_t p = 0; p < npan; p++)
                pack_b(n - p * OPGEN_NR < OPGEN_NR ? n - p * OPGEN_NR : OPGEN_NR, kc,
                       at(B, k0 * brs + p * OPGEN_NR * bcs, bbf), brs, bcs, bbf, pb + p * OPGEN_NR * kc);
            #pragma omp for schedule(dynamic, 1)
            for (int64_t q = 0; q < blocks; q++) {
                const int64_t i = q * bp * OPGEN_MR, rows = m - i < bp * OPGEN_MR ? m - i : bp * OPGEN_MR;
                sgemm_block(rows, n, kc, at(A, i * ars + k0 * acs, abf), ars, acs, abf, pb, C + i * ldc, ldc,
                            accumulate || k0 > 0, pa_t);
            }
        }
    }
    free(pa);
    free(pb);
}

static void sgemm(int64_t m, int64_t n, int64_t k, const float *A, int64_t ars, int64_t acs, const float *B,
                  int64_t brs, int64_t bcs, float *C, int64_t ldc, int accumulate, int threads) {
    sgemm_x(m, n, k, A, ars, acs, 0, B, brs, bcs, 0, C, ldc, accumulate, threads);
}

void opgen_sgemm(int64_t m, int64_t n, int64_t k, const float *A, int64_t ars, int64_t acs,
                 const float *B, int64_t brs, int64_t bcs, float *C, int64_t ldc, int accumulate) {
    sgemm(m, n, k, A, ars, acs, B, brs, bcs, C, ldc, accumulate, 1);
}

/* op(B) (k x n) packed as sgemm packs it, every k block: block k0 at p + k0 * npan * OPGEN_NR,
 * its panels OPGEN_NR * kc floats apart (k * round32(n) floats in all) */
void opgen_spack(int64_t k, int64_t n, const float *B, int64_t brs, int64_t bcs, float *p) {
    const int64_t npan = (n + OPGEN_NR - 1) / OPGEN_NR;
    for (int64_t k0 = 0; k0 < k; k0 += OPGEN_KC) {
        const int64_t kc = k - k0 < OPGEN_KC ? k - k0 : OPGEN_KC;
        for (int64_t q = 0; q < npan; q++)
            pack_b(n - q * OPGEN_NR < OPGEN_NR ? n - q * OPGEN_NR : OPGEN_NR, kc, B + k0 * brs + q * OPGEN_NR * bcs, brs,
                   bcs, 0, p + k0 * npan * OPGEN_NR + q * OPGEN_NR * kc);
    }
}

/* opgen_sgemm (one thread: the same blocks, so the same bits) with B packed by opgen_spack */
void opgen_sgemm_pb(int64_t m, int64_t n, int64_t k, const float *A, int64_t ars, int64_t acs, const float *B,
                    int64_t brs, int64_t bcs, const float *pb, float *C, int64_t ldc, int accumulate) {
    const int64_t npan = (n + OPGEN_NR - 1) / OPGEN_NR, mpan = ((m < OPGEN_MC ? m : OPGEN_MC) + OPGEN_MR - 1) / OPGEN_MR;
    float *pa = m > 0 && n > 0 && k > 0 ? (float *)malloc(sizeof(float) * OPGEN_MR * OPGEN_KC * (size_t)mpan) : NULL;
    if (!pa) { /* (nothing to multiply, or no memory for A's panels: sgemm decides) */
        sgemm(m, n, k, A, ars, acs, B, brs, bcs, C, ldc, accumulate, 1);
        return;
    }
    for (int64_t k0 = 0; k0 < k; k0 += OPGEN_KC) {
        const int64_t kc = k - k0 < OPGEN_KC ? k - k0 : OPGEN_KC;
        for (int64_t i = 0; i < m; i += OPGEN_MC)
            sgemm_block(m - i < OPGEN_MC ? m - i : OPGEN_MC, n, kc, A + i * ars + k0 * acs, ars, acs, 0,
                        pb + k0 * npan * OPGEN_NR, C + i * ldc, ldc, accumulate || k0 > 0, pa);
    }
    free(pa);
}

void opgen_sgemm_par(int64_t m, int64_t n, int64_t k, const float *A, int64_t ars, int64_t acs,
                     const float *B, int64_t brs, int64_t bcs, float *C, int64_t ldc, int accumulate) {
    sgemm(m, n, k, A, ars, acs, B, brs, bcs, C, ldc, accumulate, opgen_team());
}
/* ---- bf16 products (sched.matmul's `products` bf16): AMX tiles or AVX512-BF16 dot products ----
 * opgen_bgemm rounds op(A) and op(B) to bf16 (round to nearest even) while packing them (pairs of
 * k interleaved) and multiplies them on the CPU's bf16 units, C accumulated in f32 in k blocks of
 * OPGEN_KC added in order, pairs of k in order within a block:
 *   2 AMX: the tile units (TDPBF16PS: 16 x 16 f32 accumulators, k in steps of 32);
 *   1 AVX512-BF16: VDPBF16PS (16 f32 lanes, one pair of k per instruction) on the same packed
 *     panels, 8 rows x 32 columns of C in registers (Zen 4/5, Cooper Lake: no AMX there);
 *   0 none: opgen_sgemm on the f32 operands, unrounded.
 * The bits are fixed per machine and units and do not depend on the threads or the row split (each
 * element sees the same instructions), but they are not the f32 GEMM's: the units' internal
 * rounding is their own. Chosen once per process: the best the CPU (CPUID) and the OS (the
 * AVX-512 state saved; Linux's permission for the tile data) allow, or OPGEN_BF16_UNITS=amx, dp or
 * none (the best up to that; another value: the best). Compiled by a target pragma, so every
 * build of the library has them. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define OPGEN_HAVE_BF16_UNITS 1
#define BKC OPGEN_KC /* k block (elements) */
#define BMC 256      /* rows of A packed at once */
static atomic_int opgen_units_state; /* 0 undecided, else 1 + opgen_bf16_units() */

/* AVX512F, BW, VL and AVX512_BF16, and the OS saves the AVX-512 state */
static int cpu_dpbf16(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    if (!(b & (1u << 16)) || !(b & (1u << 30)) || !(b & (1u << 31))) return 0; /* EBX 16, 30, 31 */
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d) || !(a & (1u << 5))) return 0; /* EAX 5 */
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (lo & 0xe6u) == 0xe6u;
}

/* AMX-BF16 (EDX 22) and AMX-TILE (24), and Linux grants the tile data state
 * (ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) */
static int cpu_amx(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 22)) || !(d & (1u << 24))) return 0;
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
}

static int units_detect(void) {
    const char *want = getenv("OPGEN_BF16_UNITS");
    const int cap = !want ? 2 : !strcmp(want, "none") ? 0 : !strcmp(want, "dp") ? 1 : 2;
    if (cap == 0 || !cpu_dpbf16()) return 0;
    return cap == 2 && cpu_amx() ? 2 : 1;
}

int opgen_bf16_units(void) {
    int s = atomic_load_explicit(&opgen_units_state, memory_order_relaxed);
    if (!s) {
        s = 1 + units_detect();
        atomic_store_explicit(&opgen_units_state, s, memory_order_relaxed);
    }
    return s - 1;
}

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16,amx-tile,amx-bf16")
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} opgen_tilecfg_t;

/* eight 16 x 64-byte tiles: 0-3 C (2 x 2 of 16 x 16 f32), 4-5 A (16 rows x 32 bf16), 6-7 B */
static void tile_config(void) {
    opgen_tilecfg_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.colsb[t] = 64;
        cfg.rows[t] = 16;
    }
    _tile_loadconfig(&cfg);
}

static inline uint16_t b16(float f) { return (uint16_t)_mm_cvtsi128_si32((__m128i)_mm_cvtneps_pbh(_mm_set_ss(f))); }

/* 16 x 16 32-bit words: d[j * dst + i] = s[i * src + j] */
static inline void tr16(const uint32_t *s, int64_t src, uint32_t *d, int64_t dst) {
    __m512i r[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_si512(s + i * src);
    opgen_tr16x16(r);
    for (int i = 0; i < 16; i++) _mm512_storeu_si512(d + i * dst, r[i]);
}
/* the f32 elements of p under mask m */
static inline __m512 ld16(const void *p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
/* n (<= 16) elements of row a (k even) and of row b (k odd) -> 16 words (a[j], b[j]), zero past n.
 * bf16 rows are interleaved as they are (their words are already the products' operands); f32
 * rows are rounded to bf16 first. */
static inline __m512i pairs16(const void *a, const void *b, int64_t n, int bf) {
    const __mmask16 m = (__mmask16)(n >= 16 ? 0xffff : (1u << n) - 1);
    const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                         23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    if (bf) {
        const __m256i wa = _mm256_maskz_loadu_epi16(m, a), wb = b ? _mm256_maskz_loadu_epi16(m, b) : _mm256_setzero_si256();
        return _mm512_permutexvar_epi16(idx, _mm512_inserti64x4(_mm512_castsi256_si512(wa), wb, 1));
    }
    __m512 va = ld16(a, m), vb = b ? ld16(b, m) : _mm512_setzero_ps();
    return _mm512_permutexvar_epi16(idx, (__m512i)_mm512_cvtne2ps_pbh(vb, va));
}
/* n (<= 32) elements -> bf16, zero past n, 32 lanes (bf16 elements: as they are) */
static inline __m512i bf16x32(const void *s, int64_t n, int bf) {
    if (bf) return _mm512_maskz_loadu_epi16(n >= 32 ? ~(__mmask32)0 : n <= 0 ? 0 : ((__mmask32)1 << n) - 1, s);
    const __mmask16 m0 = (__mmask16)(n >= 16 ? 0xffff : n <= 0 ? 0 : (1u << n) - 1);
    const __mmask16 m1 = (__mmask16)(n >= 32 ? 0xffff : n <= 16 ? 0 : (1u << (n - 16)) - 1);
    return (__m512i)_mm512_cvtne2ps_pbh(m1 ? ld16(at(s, 16, 0), m1) : _mm512_setzero_ps(), ld16(s, m0));
}
/* A (mr x kc; rows padded to 32, k to kcp, with zeros) as the tile loads read it: rows in groups of
 * 16 (16 * BKC elements apart), each group one 16-row x 32-k tile (1 KB, contiguous) per 32 of k,
 * element (i, k) at p[APOS(i, k)]. (Rows BKC apart made each tile load 16 strided lines: the bf16
 * linear layer 4096x2048 @ 2048x2048 took 21.0 ms that way, 18.3 ms this way.) */
#define APOS(i, k) (((i) / 16) * 16 * BKC + ((k) / 32) * 512 + ((i) % 16) * 32 + (k) % 32)
static void bpack_a(int64_t mr, int64_t kc, int64_t kcp, const void *A, int64_t ars, int64_t acs, int bf,
                    uint16_t *restrict p) {
    int64_t mrp = (mr + 31) & ~31;
    if (acs == 1) {
        for (int64_t i = 0; i < mr; i++)
            for (int64_t k = 0; k < kcp; k += 32) _mm512_storeu_si512(p + APOS(i, k), bf16x32(at(A, i * ars + k, bf), kc - k, bf));
        for (int64_t i = mr; i < mrp; i++)
            for (int64_t k = 0; k < kcp; k += 32) _mm512_storeu_si512(p + APOS(i, k), _mm512_setzero_si512());
    } else if (ars == 1) { /* A's columns contiguous: pairs of k rows, then 16 x 16 word transposes */
        uint32_t t[BKC / 2 * 16] __attribute__((aligned(64)));
        for (int64_t i0 = 0; i0 < mrp; i0 += 16) {
            int64_t ni = mr - i0 < 0 ? 0 : mr - i0 < 16 ? mr - i0 : 16;
            for (int64_t r = 0; r < kcp / 2; r++) {
                const void *a = 2 * r < kc ? at(A, 2 * r * acs + i0, bf) : NULL;
                const void *b = 2 * r + 1 < kc ? at(A, (2 * r + 1) * acs + i0, bf) : NULL;
                _mm512_store_si512(t + r * 16, a && ni ? pairs16(a, b, ni, bf) : _mm512_setzero_si512());
            }
            for (int64_t r = 0; r < kcp / 2; r += 16) tr16(t + r * 16, 16, (uint32_t *)p + APOS(i0, 2 * r) / 2, 16);
        }
    } else {
        for (int64_t i = 0; i < mrp; i++)
            for (int64_t k = 0; k < kcp; k++) p[APOS(i, k)] = i < mr && k < kc ? b16(ld1(at(A, i * ars + k * acs, bf), bf)) : 0;
    }
}
/* B (kc x nr) in VNNI groups of 16 columns: group g, pair r: words w[g * kcp * 8 + r * 16 + jj] = (B[2r][j], B[2r+1][j]) */
static void bpack_b(int64_t nr, int64_t kc, int64_t kcp, const void *B, int64_t brs, int64_t bcs, int bf,
                    uint16_t *restrict p) {
    int64_t groups = (nr + 15) / 16;
    uint32_t *w = (uint32_t *)p;
    if (bcs == 1) {
        for (int64_t g = 0; g < groups; g++)
            for (int64_t r = 0; r < kcp / 2; r++) {
                const void *a = 2 * r < kc ? at(B, 2 * r * brs + 16 * g, bf) : NULL;
                const void *b = 2 * r + 1 < kc ? at(B, (2 * r + 1) * brs + 16 * g, bf) : NULL;
                _mm512_storeu_si512(w + g * kcp * 8 + r * 16, a ? pairs16(a, b, nr - 16 * g, bf) : _mm512_setzero_si512());
            }
    } else if (brs == 1) { /* B's columns contiguous (k runs along them): convert, then 16 x 16 word transposes */
        uint32_t t[16 * BKC / 2] __attribute__((aligned(64)));
        for (int64_t g = 0; g < groups; g++) {
            for (int64_t jj = 0; jj < 16; jj++)
                for (int64_t k = 0; k < kcp; k += 32)
                    _mm512_store_si512(t + jj * (BKC / 2) + k / 2, 16 * g + jj < nr ? bf16x32(at(B, (16 * g + jj) * bcs + k, bf), kc - k, bf)
                                                                                 : _mm512_setzero_si512());
            for (int64_t r = 0; r < kcp / 2; r += 16) tr16(t + r, BKC / 2, w + g * kcp * 8 + r * 16, 16);
        }
    } else {
        memset(p, 0, 2 * (size_t)(groups * kcp * 16));
        for (int64_t j = 0; j < nr; j++)
            for (int64_t k = 0; k < kc; k++) p[(j / 16) * kcp * 16 + (k / 2) * 32 + 2 * (j % 16) + (k & 1)] = b16(ld1(at(B, k * brs + j * bcs, bf), bf));
    }
}
/* 16-column group g of B's k block at k0 (kc of k, padded to kcp) at dst; past n (the second
 * group of the last 32 columns): zeros, so no tile reads memory nothing wrote */
static void bpack_group(int64_t n, int64_t k0, int64_t kc, int64_t kcp, int64_t g, const void *B, int64_t brs,
                        int64_t bcs, int bf, uint16_t *restrict dst) {
    if (16 * g < n)
        bpack_b(n - 16 * g < 16 ? n - 16 * g : 16, kc, kcp, at(B, k0 * brs + 16 * g * bcs, bf), brs, bcs, bf, dst);
    else
        memset(dst, 0, sizeof(uint16_t) * 16 * (size_t)kcp);
}
/* op(B) (k x n; bf: bf16 elements) packed whole, every k block, as the AMX kernels read it: k
 * block kb at p + kb * BKC * npad (npad: n rounded up to 32), its 16-column groups kcp * 16 words
 * apart. bpack_whole_group packs group q (k block q / groups, group q % groups) of that layout. */
static void bpack_whole_group(int64_t q, int64_t k, int64_t n, const void *B, int64_t brs, int64_t bcs, int bf,
                              uint16_t *p) {
    const int64_t npad = (n + 31) & ~(int64_t)31, groups = npad / 16, kb = q / groups, g = q % groups;
    const int64_t k0 = kb * BKC, kc = k - k0 < BKC ? k - k0 : BKC, kcp = (kc + 31) & ~(int64_t)31;
    bpack_group(n, k0, kc, kcp, g, B, brs, bcs, bf, p + (size_t)kb * BKC * npad + g * kcp * 16);
}
/* The same groups in panel-major order (bgemm_out's layout): the 32-column panel P at
 * p + P * nkb * 32 * BKC, its k block kb 32 * BKC further on each, the panel's two groups there
 * kcp * 16 words apart; group q here: panel q / (2 nkb), k block (q / 2) % nkb, group q % 2.
 * The kernel then reads one panel over all of k as a single stream (hardware prefetchers follow
 * it), where the k blocks of the whole-B layout are npad * BKC words apart. */
static void bpack_panel_group(int64_t q, int64_t k, int64_t n, const void *B, int64_t brs, int64_t bcs, int bf,
                              uint16_t *p) {
    const int64_t nkb = (k + BKC - 1) / BKC, panel = q / (2 * nkb), kb = (q / 2) % nkb, g = 2 * panel + q % 2;
    const int64_t k0 = kb * BKC, kc = k - k0 < BKC ? k - k0 : BKC, kcp = (kc + 31) & ~(int64_t)31;
    bpack_group(n, k0, kc, kcp, g, B, brs, bcs, bf, p + (size_t)(panel * nkb + kb) * 32 * BKC + (q % 2) * kcp * 16);
}
static void bpack_all(int64_t k, int64_t n, const void *B, int64_t brs, int64_t bcs, int bf, uint16_t *p) {
    const int64_t q_all = (k + BKC - 1) / BKC * (((n + 31) & ~(int64_t)31) / 16);
    for (int64_t q = 0; q < q_all; q++) bpack_whole_group(q, k, n, B, brs, bcs, bf, p);
}
/* C[32 x 32] (= or +=) 32 rows of A times 32 columns of B over every k block: A's block kb at
 * pa + kb * sa (bpack_a's tiles), B's at pb + kb * sb (16-column groups), C kept in the tiles */
static void amx_kernel_all_k(int64_t k, const uint16_t *pa, int64_t sa, const uint16_t *pb, int64_t sb, int64_t g,
                             float *c, int64_t ldc, int load) {
    if (load) {
        _tile_loadd(0, c, ldc * 4); _tile_loadd(1, c + 16, ldc * 4);
        _tile_loadd(2, c + 16 * ldc, ldc * 4); _tile_loadd(3, c + 16 * ldc + 16, ldc * 4);
    } else { _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3); }
    for (int64_t kb = 0, k0 = 0; k0 < k; kb++, k0 += BKC) {
        const int64_t kcp = ((k - k0 < BKC ? k - k0 : BKC) + 31) & ~(int64_t)31;
        const uint16_t *a = pa + kb * sa, *b0 = pb + kb * sb + g * kcp * 16, *b1 = b0 + kcp * 16;
        for (int64_t s = 0; s < kcp / 32; s++) {
            _tile_loadd(4, a + s * 512, 64);
            _tile_loadd(5, a + 16 * BKC + s * 512, 64);
            _tile_loadd(6, b0 + s * 512, 64);
            _tile_loadd(7, b1 + s * 512, 64);
            _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
        }
    }
    _tile_stored(0, c, ldc * 4); _tile_stored(1, c + 16, ldc * 4);
    _tile_stored(2, c + 16 * ldc, ldc * 4); _tile_stored(3, c + 16 * ldc + 16, ldc * 4);
}

/* amx_kernel_all_k on AVX512-BF16 dot products: C's 32 rows 8 at a time (16 f32 registers: 8
 * rows x 2 column groups; one pair of k per VDPBF16PS, A's pair broadcast from its packed row),
 * each pass over DPKB k blocks at once with C in the registers, through memory between groups of
 * DPKB (each element's sum is the same chain of pairs either way: the same bits); B's 32 columns
 * of a group (256 KB at most) stay in L2 over the four passes. (One k block per pass, its 16 KB
 * of B in L1, stored and reloaded C 2 x 8 times per 2048 VDPBF16PS: bf16 linear 4096 x 2048 x
 * 2048 on 2 Zen 5 threads 847-905 -> 881-920 GFLOP/s, one thread 473 -> 487, alternating runs.) */
#define DPR 8
#define DPKB 16
typedef int32_t __attribute__((may_alias)) opgen_pair_t; /* (a pair of bf16, read as one word) */
/* acc0 += A's pair at p . v0 and acc1 += the pair . v1: the pair broadcast into a register once
 * (VPBROADCASTD, a load), read by both VDPBF16PS. (Each VDPBF16PS broadcasting the pair from
 * memory itself ({1to16}, inline asm) had measured 1-4% faster on the Zen 5 VM while its units ran
 * at half their rate; at full rate the kernel in L1 ran 85% of the dot-product peak that way and
 * 95-99% this way, and bf16 linear 4096 x 2048 x 2048 on one thread 275-316 -> 341-364 GFLOP/s,
 * on two 562 -> 651, alternating in one process; the same bits.) */
#define DP_PAIR(acc0, acc1, v0, v1, p)                                                 \
    do {                                                                              \
        const __m512bh w_ = (__m512bh)_mm512_set1_epi32(*(const opgen_pair_t *)(p)); \
        acc0 = _mm512_dpbf16_ps(acc0, w_, v0);                                        \
        acc1 = _mm512_dpbf16_ps(acc1, w_, v1);                                        \
    } while (0)
/* DPR rows of the kernel's body (below) over DPKB k blocks from kg, C in registers: row i's pair
 * q of its k values s of k block kb at a + kb * sa + i * rs + s * ss + 2 q, its C at c + i * ldc.
 * One function, not inlined: inlined into its callers four times, GCC spilled a B vector to the
 * stack inside two of the copies' loops (a store and a reload every 16 dot products). */
static __attribute__((noinline)) void dp_rows(int64_t kg, int64_t k, const uint16_t *a, int64_t sa, int64_t rs,
                                              int64_t ss, const uint16_t *pb, int64_t sb, int64_t g, float *c,
                                              int64_t ldc, int ld) {
    __m512 acc[2 * DPR];
#pragma GCC unroll 8
    for (int i = 0; i < DPR; i++) {
        acc[2 * i] = ld ? _mm512_loadu_ps(c + i * ldc) : _mm512_setzero_ps();
        acc[2 * i + 1] = ld ? _mm512_loadu_ps(c + i * ldc + 16) : _mm512_setzero_ps();
    }
    for (int64_t kb = kg; kb < kg + DPKB && kb * BKC < k; kb++) {
        const int64_t kcp = ((k - kb * BKC < BKC ? k - kb * BKC : BKC) + 31) & ~(int64_t)31;
        const uint16_t *b0 = pb + kb * sb + g * kcp * 16, *b1 = b0 + kcp * 16;
        for (int64_t s = 0; s < kcp / 32; s++) /* 32 of k: 16 pairs */
            for (int q = 0; q < 16; q++) {
                const __m512bh v0 = (__m512bh)_mm512_loadu_si512(b0 + (s * 16 + q) * 32);
                const __m512bh v1 = (__m512bh)_mm512_loadu_si512(b1 + (s * 16 + q) * 32);
                _mm_prefetch((const char *)(b0 + (s * 16 + q + 16) * 32), _MM_HINT_T0); /* (no fault) */
                _mm_prefetch((const char *)(b1 + (s * 16 + q + 16) * 32), _MM_HINT_T0);
#pragma GCC unroll 8
                for (int i = 0; i < DPR; i++)
                    DP_PAIR(acc[2 * i], acc[2 * i + 1], v0, v1, a + kb * sa + i * rs + s * ss + 2 * q);
            }
    }
#pragma GCC unroll 8
    for (int i = 0; i < DPR; i++) {
        _mm512_storeu_ps(c + i * ldc, acc[2 * i]);
        _mm512_storeu_ps(c + i * ldc + 16, acc[2 * i + 1]);
    }
}
/* the kernel's body for A at a + kb * sa + (r / 16) * g16 + (r % 16) * rs + s * ss + k's pair (row
 * r, k block kb, its 32 k values s): bpack_a's tiles (rs 32, g16 16 BKC, ss 512, sa the block's
 * pack) or a row-major bf16 A read in place (rs = g16 / 16 = its row stride, ss 32, sa BKC); a
 * group of DPR rows never straddles 16 rows (DPR divides 16) */
static inline __attribute__((always_inline)) void dp_kernel_body(int64_t k, const uint16_t *a, int64_t sa, int64_t rs,
                                                                 int64_t g16, int64_t ss, const uint16_t *pb,
                                                                 int64_t sb, int64_t g, float *c, int64_t ldc,
                                                                 int load) {
    for (int64_t kg = 0; kg * BKC < k; kg += DPKB) { /* (a group of DPKB k blocks) */
        const int ld = load || kg > 0;
        for (int r0 = 0; r0 < 32; r0 += DPR)
            dp_rows(kg, k, a + (r0 / 16) * g16 + (r0 % 16) * rs, sa, rs, ss, pb, sb, g, c + r0 * ldc, ldc, ld);
    }
}
static void dp_kernel_all_k(int64_t k, const uint16_t *pa, int64_t sa, const uint16_t *pb, int64_t sb, int64_t g,
                            float *c, int64_t ldc, int load) {
    dp_kernel_body(k, pa, sa, 32, 16 * BKC, 512, pb, sb, g, c, ldc, load);
}
/* dp_kernel_all_k on 32 rows of a row-major bf16 A read in place (row stride ars; each k pair
 * adjacent): no packing, for rows and k blocks that need no padding (bgemm_out). The same pairs
 * in the same order: the same bits. bf16 linear 4096 x 2048 x 2048, Zen 5, one thread: 490-506
 * -> 512-523 GFLOP/s (packing A had been 2.3% of the time); on two threads no change beyond the
 * noise (about 990 either way) */
static void dp_kernel_rows(int64_t k, const uint16_t *a, int64_t ars, const uint16_t *pb, int64_t sb, float *c,
                           int64_t ldc, int load) {
    dp_kernel_body(k, a, BKC, ars, 16 * ars, 32, pb, sb, 0, c, ldc, load);
}
#undef DPR
#undef DPKB
#undef DP_PAIR

/* the kernel of this process's units (opgen_bf16_units() > 0), and their per-thread set-up around
 * a run of its calls (the tile configuration on AMX) */
typedef void (*bkernel_t)(int64_t, const uint16_t *, int64_t, const uint16_t *, int64_t, int64_t, float *, int64_t, int);
static bkernel_t units_begin(void) {
    if (opgen_bf16_units() != 2) return dp_kernel_all_k;
    tile_config();
    return amx_kernel_all_k;
}
static void units_end(void) {
    if (opgen_bf16_units() == 2) _tile_release();
}

/* rows [r0, r1) of C over the k block at k0 (B's block packed in pb); pa: this thread's A pack */
static void bgemm_rows(int64_t r0, int64_t r1, int64_t n, int64_t k0, int64_t kc, const void *A, int64_t ars,
                       int64_t acs, int abf, const uint16_t *pb, float *C, int64_t ldc, int load, uint16_t *pa) {
    const int64_t kcp = (kc + 31) & ~(int64_t)31;
    float tmp[32 * 32];
    const bkernel_t kernel = units_begin();
    for (int64_t i0 = r0; i0 < r1; i0 += BMC) {
        const int64_t mc = r1 - i0 < BMC ? r1 - i0 : BMC;
        bpack_a(mc, kc, kcp, at(A, i0 * ars + k0 * acs, abf), ars, acs, abf, pa);
        for (int64_t i = 0; i < mc; i += 32)
            for (int64_t j = 0; j < n; j += 32) {
                float *c = C + (i0 + i) * ldc + j;
                if (mc - i >= 32 && n - j >= 32) {
                    kernel(kc, pa + i * BKC, 0, pb, 0, j / 16, c, ldc, load);
                    continue;
                }
                /* an edge block: through a 32 x 32 copy (A's and B's padding are zeros) */
                const int64_t r = mc - i < 32 ? mc - i : 32, q = n - j < 32 ? n - j : 32;
                if (load)
                    for (int64_t a = 0; a < r; a++) memcpy(tmp + a * 32, c + a * ldc, sizeof(float) * (size_t)q);
                kernel(kc, pa + i * BKC, 0, pb, 0, j / 16, tmp, 32, load);
                for (int64_t a = 0; a < r; a++) memcpy(c + a * ldc, tmp + a * 32, sizeof(float) * (size_t)q);
            }
    }
    units_end();
}

/* Rows per block of bgemm_out, for B packed in b_bytes and nkb k blocks: where packed B fits in
 * half the last-level cache, blocks whose packed A (every k block) takes an eighth of a core's
 * L2, at least 32 rows and at most OUT_RB: that A stays in L2 while B's 32-column panels stream
 * past it from the last-level cache (the kernel's broadcasts of A's pairs, eight rows apart,
 * keep fewer misses in flight than its sequential reads of B). Otherwise OUT_RB rows: B then
 * comes from memory once per block. (bf16 linear 4096 x 2048 x 2048, Zen 5, 2 threads: 256 rows
 * 850-903 GFLOP/s, 64 rows 906-930, 32 rows 935-941; docs/backend_cpu.md.) The dot-product kernel
 * only: the AMX kernel's tile loads were measured at 256 rows and keep them. */
#define OUT_RB 256
static int64_t out_rows(size_t b_bytes, int64_t nkb) {
    if (opgen_bf16_units() != 1 || b_bytes > opgen_llc_bytes() / 2) return OUT_RB; /* (AMX: measured at 256) */
    const int64_t rows = (int64_t)(opgen_l2_bytes() / 8 / (sizeof(uint16_t) * BKC * (size_t)nkb)) / 32 * 32;
    return rows < 32 ? 32 : rows > OUT_RB ? OUT_RB : rows;
}

/* C (bf16, leading dimension ldc) = (or +=) op(A) op(B) of bf16 operands, each element rounded
 * once. B is packed whole, panel-major (bpack_panel_group; bf16 linear 4096 x 2048 x 2048 on
 * 2 Zen 5 threads: 939-952 -> 956-967 GFLOP/s); the threads take blocks of out_rows() rows as they
 * finish, pack their A for every k block (kept in L2; the dot-product kernel reads a row-major A in place
 * instead where no padding is needed: dp_kernel_rows), then for each 32 columns (B's panel)
 * sums each 32 x 32 block of C over all of k in the tiles and rounds it into C. The same
 * instructions per element as opgen_bgemm (k blocks in order), so its f32 sums, whatever the
 * block. 0 when its buffers cannot be had. */
static int bgemm_out(int64_t m, int64_t n, int64_t k, const uint16_t *A, int64_t ars, int64_t acs, const uint16_t *B,
                     int64_t brs, int64_t bcs, uint16_t *C, int64_t ldc, int accumulate, int threads) {
    const int64_t npad = (n + 31) & ~(int64_t)31, groups = npad / 16, nkb = (k + BKC - 1) / BKC;
    const size_t sb = opgen_sz_mul((size_t)npad, BKC); /* elements per k block of B */
    const int64_t rb_rows = out_rows(opgen_sz_mul(opgen_sz_mul(sb, (size_t)nkb), sizeof(uint16_t)), nkb);
    const int64_t blocks = (m + rb_rows - 1) / rb_rows;
    if (threads > blocks) threads = (int)blocks;
    const size_t sa = (size_t)rb_rows * BKC; /* elements per k block of a row block's A */
    const size_t nb = opgen_sz_mul(opgen_sz_mul(sb, (size_t)nkb), sizeof(uint16_t));
    const size_t nt = opgen_sz_mul(opgen_sz_mul(sa, (size_t)nkb), sizeof(uint16_t)); /* a thread's A */
    const size_t nt_all = opgen_sz_mul(nt, (size_t)threads);
    uint16_t *pb = nb == SIZE_MAX ? NULL : (uint16_t *)aligned_alloc(64, nb); /* (multiples of 64 bytes) */
    uint16_t *pt = nt_all == SIZE_MAX ? NULL : (uint16_t *)aligned_alloc(64, nt_all);
    if (!pb || !pt) {
        free(pb);
        free(pt);
        return 0;
    }
    /* (one thread: an inactive region, whose loops bind to it, not to a caller's region) */
    #pragma omp parallel num_threads(threads) if (threads > 1)
    {
        uint16_t *pa = pt + (size_t)omp_get_thread_num() * (nt / sizeof(uint16_t));
        _Alignas(64) float tmp[32 * 32];
        #pragma omp for schedule(static)
        for (int64_t q = 0; q < nkb * groups; q++) bpack_panel_group(q, k, n, B, brs, bcs, 1, pb);
        const bkernel_t kernel = units_begin();
        #pragma omp for schedule(dynamic, 1) /* (row blocks as threads finish: the same sums whichever) */
        for (int64_t rb = 0; rb < blocks; rb++) {
            const int64_t i0 = rb * rb_rows, rows = m - i0 < rb_rows ? m - i0 : rb_rows;
            const int direct = kernel == dp_kernel_all_k && acs == 1 && k % 32 == 0 && rows % 32 == 0;
            for (int64_t kb = 0; kb < nkb && !direct; kb++) { /* (read in place: nothing to pack) */
                const int64_t k0 = kb * BKC, kc = k - k0 < BKC ? k - k0 : BKC;
                bpack_a(rows, kc, (kc + 31) & ~(int64_t)31, at(A, i0 * ars + k0 * acs, 1), ars, acs, 1, pa + (size_t)kb * sa);
            }
            for (int64_t j = 0; j < n; j += 32)
                for (int64_t i = 0; i < rows; i += 32) {
                    const int64_t r = rows - i < 32 ? rows - i : 32, q = n - j < 32 ? n - j : 32;
                    uint16_t *c = C + (i0 + i) * ldc + j;
                    const uint16_t *panel = pb + (size_t)(j / 32) * nkb * 32 * BKC; /* (B's 32 columns, all of k) */
                    if (accumulate)
                        for (int64_t a = 0; a < 32; a++)
                            for (int64_t b = 0; b < 32; b++)
                                tmp[a * 32 + b] = a < r && b < q ? opgen_bf16_to_f32(c[a * ldc + b]) : 0.0f;
                    if (direct)
                        dp_kernel_rows(k, A + (i0 + i) * ars, ars, panel, 32 * BKC, tmp, 32, accumulate);
                    else
                        kernel(k, pa + i * BKC, (int64_t)sa, panel, 32 * BKC, 0, tmp, 32, accumulate);
                    for (int64_t a = 0; a < r; a++) /* (rounded a row of 32 at a time: vcvtne2ps2bf16) */
                        opgen_bf16_store_strip(c + a * ldc, 1, tmp + a * 32, (int)q, 0);
                }
        }
        units_end();
    }
    free(pb);
    free(pt);
    return 1;
}
#undef OUT_RB
#pragma GCC pop_options

/* Whole 32-row strips per row block of bgemm on `threads` threads (`strips` in all): BMC rows on
 * one thread; on several, about 16 blocks per thread, handed out as threads finish (as
 * sgemm_block_panels) */
static int64_t bgemm_block_strips(int64_t strips, int threads) {
    const int64_t most = BMC / 32, want = (strips + 16 * (int64_t)threads - 1) / (16 * (int64_t)threads);
    return threads <= 1 || want >= most ? most : want;
}

/* opgen_bgemm on `threads` threads (abf, bbf: bf16 operands): B packed once per k block, then row
 * blocks of whole 32-row strips handed out as threads finish; 0 when its buffers cannot be had */
static int bgemm(int64_t m, int64_t n, int64_t k, const void *A, int64_t ars, int64_t acs, int abf, const void *B,
                 int64_t brs, int64_t bcs, int bbf, float *C, int64_t ldc, int accumulate, int threads) {
    const int64_t strips = (m + 31) / 32, kcm = k < BKC ? (k + 31) & ~(int64_t)31 : BKC, groups = (n + 31) / 32 * 2;
    if (threads > strips) threads = (int)strips;
    const int64_t sp = bgemm_block_strips(strips, threads), blocks = (strips + sp - 1) / sp;
    const size_t na = sizeof(uint16_t) * BMC * BKC;
    const size_t nb = opgen_sz_mul(opgen_sz_mul(sizeof(uint16_t), (size_t)((n + 31) & ~(int64_t)31)), (size_t)kcm);
    const size_t na_all = opgen_sz_mul(na, (size_t)threads);
    uint16_t *pa = na_all == SIZE_MAX ? NULL : (uint16_t *)aligned_alloc(64, na_all);
    uint16_t *pb = nb == SIZE_MAX ? NULL : (uint16_t *)aligned_alloc(64, nb); /* (nb, na: multiples of 64) */
    if (!pa || !pb) {
        free(pa);
        free(pb);
        return 0;
    }
    /* (one thread: an inactive region, whose loops bind to it, not to a caller's region) */
    #pragma omp parallel num_threads(threads) if (threads > 1)
    {
        uint16_t *pa_t = pa + (size_t)omp_get_thread_num() * (na / sizeof(uint16_t));
        for (int64_t k0 = 0; k0 < k; k0 += BKC) {
            const int64_t kc = k - k0 < BKC ? k - k0 : BKC, kcp = (kc + 31) & ~(int64_t)31;
            #pragma omp for schedule(static)
            for (int64_t g = 0; g < groups; g++) bpack_group(n, k0, kc, kcp, g, B, brs, bcs, bbf, pb + g * kcp * 16);
            #pragma omp for schedule(dynamic, 1)
            for (int64_t q = 0; q < blocks; q++) {
                const int64_t r0 = 32 * sp * q, r1 = r0 + 32 * sp < m ? r0 + 32 * sp : m;
                bgemm_rows(r0, r1, n, k0, kc, A, ars, acs, abf, pb, C, ldc, accumulate || k0 > 0, pa_t);
            }
        }
    }
    free(pa);
    free(pb);
    return 1;
}

/* opgen_bgemm on one thread with B packed by bpack_all (the same instructions: the same bits);
 * 0 when its A buffer cannot be had */
static int bgemm_packed(int64_t m, int64_t n, int64_t k, const float *A, int64_t ars, int64_t acs, const uint16_t *pb,
                        float *C, int64_t ldc, int accumulate) {
    const int64_t npad = (n + 31) & ~(int64_t)31;
    uint16_t *pa = (uint16_t *)aligned_alloc(64, sizeof(uint16_t) * BMC * BKC);
    if (!pa) return 0;
    for (int64_t kb = 0, k0 = 0; k0 < k; kb++, k0 += BKC)
        bgemm_rows(0, m, n, k0, k - k0 < BKC ? k - k0 : BKC, A, ars, acs, 0, pb + (size_t)kb * BKC * npad, C, ldc,
                   accumulate || k0 > 0, pa);
    free(pa);
    return 1;
}
#undef BKC
#undef BMC
#else
int opgen_bf16_units(void) { return 0; }
#endif

static void bgemm_any(int64_t m, int64_t n, int64_t k, const float *A, int64_t ars, int64_t acs, const float *B,
                      int64_t brs, int64_t bcs, float *C, int64_t ldc, int accumulate, int threads) {
#ifdef OPGEN_HAVE_BF16_UNITS
    if (m > 0 && n > 0 && k > 0 && opgen_bf16_units() && bgemm(m, n, k, A, ars, acs, 0, B, brs, bcs, 0, C, ldc, accumulate,
                                                        threads))
        return;
#endif
    sgemm(m, n, k, A, ars, acs, B, brs, bcs, C, ldc, accumulate, threads);
}

void opgen_bgemm(int64_t m, int64_t n, int64_t k, const float *A, int64_t ars, int64_t acs,
                 const float *B, int64_t brs, int64_t bcs, float *C, int64_t ldc, int accumulate) {
    bgemm_any(m, n, k, A, ars, acs, B, brs, bcs, C, ldc, accumulate, 1);
}

void opgen_bgemm_par(int64_t m, int64_t n, int64_t k, const float *A, int64_t ars, int64_t acs,
                     const float *B, int64_t brs, int64_t bcs, float *C, int64_t ldc, int accumulate) {
    bgemm_any(m, n, k, A, ars, acs, B, brs, bcs, C, ldc, accumulate, opgen_team());
}

void opgen_bpack(int64_t k, int64_t n, const float *B, int64_t brs, int64_t bcs, uint16_t *p) {
#ifdef OPGEN_HAVE_BF16_UNITS
    if (k > 0 && n > 0 && opgen_bf16_units()) bpack_all(k, n, B, brs, bcs, 0, p);
#else
    (void)k, (void)n, (void)B, (void)brs, (void)bcs, (void)p;
#endif
}

void opgen_bgemm_pb(int64_t m, int64_t n, int64_t k, const float *A, int64_t ars, int64_t acs, const float *B,
                    int64_t brs, int64_t bcs, const uint16_t *pb, float *C, int64_t ldc, int accumulate) {
#ifdef OPGEN_HAVE_BF16_UNITS
    if (m > 0 && n > 0 && k > 0 && opgen_bf16_units() && bgemm_packed(m, n, k, A, ars, acs, pb, C, ldc, accumulate))
        return;
#else
    (void)pb;
#endif
    sgemm(m, n, k, A, ars, acs, B, brs, bcs, C, ldc, accumulate, 1);
}

/* opgen_sgemm's loop (its k order, so its bits) on 16-bit operands into 16-bit C (bf: their
 * storage, bf16 or ST_F16), each element rounded once from its f32 sum (when there is no memory
 * for an f32 copy of C) */
static void gemm16_loop(int64_t m, int64_t n, int64_t k, const uint16_t *A, int64_t ars, int64_t acs,
                        const uint16_t *B, int64_t brs, int64_t bcs, uint16_t *C, int64_t ldc, int accumulate, int bf) {
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            const float s = loop_sum(i, j, k, A, ars, acs, bf, B, brs, bcs, bf,
                                     accumulate ? ld1(&C[i * ldc + j], bf) : 0.0f, accumulate);
            C[i * ldc + j] = bf == ST_F16 ? opgen_f32_to_f16(s) : opgen_f32_to_bf16(s);
        }
}

/* 16-bit A and B (bf: bf16 or ST_F16), f32 C */
static void gemm16(int64_t m, int64_t n, int64_t k, const uint16_t *A, int64_t ars, int64_t acs, const uint16_t *B,
                   int64_t brs, int64_t bcs, float *C, int64_t ldc, int accumulate, int threads, int bf) {
    if (m <= 0 || n <= 0) return;
#ifdef OPGEN_HAVE_BF16_UNITS
    if (bf != ST_F16 && k > 0 && opgen_bf16_units() &&
        bgemm(m, n, k, A, ars, acs, 1, B, brs, bcs, 1, C, ldc, accumulate, threads)) return;
#endif
    /* the exact f32 values through the f32 GEMM (widened in its panels: its k order, so its bits) */
    sgemm_x(m, n, k, A, ars, acs, bf, B, brs, bcs, bf, C, ldc, accumulate, threads);
}

/* row i of 16-bit C (ldc; bf as above) <-> row i of f32 c (n): rounded (to16) or widened */
static void row16(int64_t i, int64_t n, float *c, uint16_t *C, int64_t ldc, int to16, int bf) {
    if (to16 && bf == ST_F16)
        for (int64_t j = 0; j < n; j++) C[i * ldc + j] = opgen_f32_to_f16(c[i * n + j]);
    else if (to16)
        for (int64_t j = 0; j < n; j++) C[i * ldc + j] = opgen_f32_to_bf16(c[i * n + j]);
    else if (bf == ST_F16)
        for (int64_t j = 0; j < n; j++) c[i * n + j] = opgen_f16_to_f32(C[i * ldc + j]);
    else
        for (int64_t j = 0; j < n; j++) c[i * n + j] = opgen_bf16_to_f32(C[i * ldc + j]);
}

static void rows16(int64_t m, int64_t n, float *c, uint16_t *C, int64_t ldc, int to16, int threads, int bf) {
    if (threads > 1) { /* (no parallel region at all for one thread: callers may be inside one) */
        #pragma omp parallel for schedule(static) num_threads(threads)
        for (int64_t i = 0; i < m; i++) row16(i, n, c, C, ldc, to16, bf);
    } else {
        for (int64_t i = 0; i < m; i++) row16(i, n, c, C, ldc, to16, bf);
    }
}

/* Memory for a large temporary of the runtime that is written whole (the f32 copy of a 16-bit
 * GEMM's C, kept between calls: scratch_take), aligned to `align` (a power of two dividing 2 MiB):
 * from 2 MiB on, 2 MiB-aligned and advised to transparent huge pages where Linux has them, as
 * numpy does for its large arrays (and PyTorch with THP_MEM_ALLOC_ENABLE): one page fault per
 * 2 MiB instead of 512. A fresh 32 MiB
 * buffer written once took 21-28 ms on 4 KiB pages against 4-5 ms on huge pages (the 2-core AVX2
 * VM, defrag "madvise"). Not for buffers only partly touched (the GEMM panels, a workspace of our
 * own): each huge page is zeroed whole (on the panels, FLCE's tile GEMMs lost 14%). NULL when it
 * cannot be had (sizes saturate: never a wrap). Freed with free(). */
static void *opgen_big_alloc(size_t align, size_t n) {
    const size_t huge = (size_t)2 << 20;
    if (n > SIZE_MAX - huge) return NULL;
    if (n < huge) return aligned_alloc(align, (n + align - 1) & ~(align - 1));
    const size_t whole = (n + huge - 1) & ~(huge - 1);
    void *p = aligned_alloc(huge, whole);
#ifdef MADV_HUGEPAGE
    if (p) (void)madvise(p, whole, MADV_HUGEPAGE); /* (advice only: without it, ordinary pages) */
#endif
    return p;
}

/* gemm16_out's f32 copy of C, kept between calls: a fresh one is zeroed by the kernel page by page
 * at every call (an f16 linear 4096 x 2048 x 2048 on 2 threads of the Sapphire Rapids VM: 244 ->
 * 262 GFLOP/s kept, PyTorch's f16 270 in the same run), as PyTorch's caching allocator keeps its
 * blocks. One buffer is kept, its usable bytes in a header of OPGEN_KEPT_HEAD bytes; a call takes
 * it by an atomic exchange (so concurrent calls never share one: a call that finds none, or one too
 * small, allocates its own) and gives its buffer back the same way, freeing what it displaces.
 * Buffers above OPGEN_KEPT_MAX bytes are not kept. Reachable until the process ends. */
#define OPGEN_KEPT_HEAD 64
#define OPGEN_KEPT_MAX ((size_t)256 << 20)
static _Atomic(char *) opgen_kept;

/* n bytes (64-byte aligned) of the kept buffer or a new one; NULL when none can be had */
static float *scratch_take(size_t n) {
    char *b = atomic_exchange(&opgen_kept, NULL);
    if (b && *(size_t *)(void *)b >= n) return (float *)(void *)(b + OPGEN_KEPT_HEAD);
    free(b);
    b = n > SIZE_MAX - OPGEN_KEPT_HEAD ? NULL : (char *)opgen_big_alloc(64, n + OPGEN_KEPT_HEAD);
    if (!b) return NULL;
    *(size_t *)(void *)b = n;
    return (float *)(void *)(b + OPGEN_KEPT_HEAD);
}

/* p (from scratch_take) kept for the next call, or freed */
static void scratch_give(float *p) {
    char *b = (char *)p - OPGEN_KEPT_HEAD;
    if (*(size_t *)(void *)b > OPGEN_KEPT_MAX) {
        free(b);
        return;
    }
    free(atomic_exchange(&opgen_kept, b));
}

/* gemm16 into 16-bit C: each element rounded once from its f32 sum */
static void gemm16_out(int64_t m, int64_t n, int64_t k, const uint16_t *A, int64_t ars, int64_t acs,
                       const uint16_t *B, int64_t brs, int64_t bcs, uint16_t *C, int64_t ldc, int accumulate,
                       int threads, int bf) {
    if (m <= 0 || n <= 0) return;
#ifdef OPGEN_HAVE_BF16_UNITS
    if (bf != ST_F16 && k > 0 && opgen_bf16_units() &&
        bgemm_out(m, n, k, A, ars, acs, B, brs, bcs, C, ldc, accumulate, threads)) return;
#endif
    /* the f32 GEMM into an f32 copy of C, then rounded; without memory for it, its loop (the
       same k order, so the same bits) */
    const size_t nc = opgen_sz_mul(opgen_sz_mul((size_t)m, (size_t)n), sizeof(float));
    float *c = nc == SIZE_MAX ? NULL : scratch_take(nc);
    if (!c) {
        gemm16_loop(m, n, k, A, ars, acs, B, brs, bcs, C, ldc, accumulate, bf);
        return;
    }
    if (accumulate) rows16(m, n, c, C, ldc, 0, threads, bf);
    gemm16(m, n, k, A, ars, acs, B, brs, bcs, c, n, accumulate, threads, bf);
    rows16(m, n, c, C, ldc, 1, threads, bf);
    scratch_give(c);
}

void opgen_gemm_bf16_out(int64_t m, int64_t n, int64_t k, const uint16_t *A, int64_t ars, int64_t acs,
                         const uint16_t *B, int64_t brs, int64_t bcs, uint16_t *C, int64_t ldc, int accumulate) {
    gemm16_out(m, n, k, A, ars, acs, B, brs, bcs, C, ldc, accumulate, 1, 1);
}

void opgen_gemm_bf16(int64_t m, int64_t n, int64_t k, const uint16_t *A, int64_t ars, int64_t acs,
                     const uint16_t *B, int64_t brs, int64_t bcs, float *C, int64_t ldc, int accumulate) {
    gemm16(m, n, k, A, ars, acs, B, brs, bcs, C, ldc, accumulate, 1, 1);
}

void opgen_gemm_bf16_out_par(int64_t m, int64_t n, int64_t k, const uint16_t *A, int64_t ars, int64_t acs,
                             const uint16_t *B, int64_t brs, int64_t bcs, uint16_t *C, int64_t ldc, int accumulate) {
    gemm16_out(m, n, k, A, ars, acs, B, brs, bcs, C, ldc, accumulate, opgen_team(), 1);
}

void opgen_gemm_bf16_par(int64_t m, int64_t n, int64_t k, const uint16_t *A, int64_t ars, int64_t acs,
                         const uint16_t *B, int64_t brs, int64_t bcs, float *C, int64_t ldc, int accumulate) {
    gemm16(m, n, k, A, ars, acs, B, brs, bcs, C, ldc, accumulate, opgen_team(), 1);
}

void opgen_gemm_f16_out(int64_t m, int64_t n, int64_t k, const uint16_t *A, int64_t ars, int64_t acs,
                        const uint16_t *B, int64_t brs, int64_t bcs, uint16_t *C, int64_t ldc, int accumulate) {
    gemm16_out(m, n, k, A, ars, acs, B, brs, bcs, C, ldc, accumulate, 1, ST_F16);
}

void opgen_gemm_f16(int64_t m, int64_t n, int64_t k, const uint16_t *A, int64_t ars, int64_t acs,
                    const uint16_t *B, int64_t brs, int64_t bcs, float *C, int64_t ldc, int accumulate) {
    gemm16(m, n, k, A, ars, acs, B, brs, bcs, C, ldc, accumulate, 1, ST_F16);
}

void opgen_gemm_f16_out_par(int64_t m, int64_t n, int64_t k, const uint16_t *A, int64_t ars, int64_t acs,
                            const uint16_t *B, int64_t brs, int64_t bcs, uint16_t *C, int64_t ldc, int accumulate) {
    gemm16_out(m, n, k, A, ars, acs, B, brs, bcs, C, ldc, accumulate, opgen_team(), ST_F16);
}

void opgen_gemm_f16_par(int64_t m, int64_t n, int64_t k, const uint16_t *A, int64_t ars, int64_t acs,
                        const uint16_t *B, int64_t brs, int64_t bcs, float *C, int64_t ldc, int accumulate) {
    gemm16(m, n, k, A, ars, acs, B, brs, bcs, C, ldc, accumulate, opgen_team(), ST_F16);
}

int opgen_rows_even(const int64_t *ro, int64_t n, int64_t *base, int64_t *stride) {
    *base = n > 0 ? ro[0] : 0;
    *stride = n > 1 ? ro[1] - ro[0] : 0;
    for (int64_t i = 2; i < n; i++)
        if (ro[i] - ro[i - 1] != *stride) return 0;
    return 1;
}

/* The element offset of row r of a tensor's leading n axes (shape, strides st), rows counted
   in row-major order: a row-offset table's entry, or the start of a row to convert. */
static inline int64_t opgen_row_offset(const int64_t *shape, const int64_t *st, int n, int64_t r) {
    int64_t o = 0;
    for (int i = n - 1; i >= 0; i--) {
        o += (r % shape[i]) * st[i];
        r /= shape[i];
    }
    return o;
}


/* ---- parameters converted at the boundary (opgen/lower/boundary.py) ---- */
/* n elements of a caller's tensor (dtype `from`; element offsets o, o + st, ...) converted to
   dtype `to` into dst: the kernels' own cast C, so results equal a kernel per dtype's. */
static void opgen_convert_row(const void *src, int from, int64_t o, int64_t st, int64_t n, int to, void *dst) {
    switch (from) {
    case OPGEN_BOOL: {
        const bool *s = (const bool *)src;
        if (to == OPGEN_I64)
            for (int64_t j = 0; j < n; j++, o += st) ((int64_t *)dst)[j] = (int64_t)((s[o] != 0));
        if (to == OPGEN_BOOL)
            for (int64_t j = 0; j < n; j++, o += st) ((bool *)dst)[j] = (s[o] != 0);
        return;
    }
    case OPGEN_I8: {
        const int8_t *s = (const int8_t *)src;
        if (to == OPGEN_I64)
            for (int64_t j = 0; j < n; j++, o += st) ((int64_t *)dst)[j] = (int64_t)(s[o]);
        if (to == OPGEN_BOOL)
            for (int64_t j = 0; j < n; j++, o += st) ((bool *)dst)[j] = (s[o] != 0);
        return;
    }
    case OPGEN_I16: {
        const int16_t *s = (const int16_t *)src;
        if (to == OPGEN_I64)
            for (int64_t j = 0; j < n; j++, o += st) ((int64_t *)dst)[j] = (int64_t)(s[o]);
        if (to == OPGEN_BOOL)
            for (int64_t j = 0; j < n; j++, o += st) ((bool *)dst)[j] = (s[o] != 0);
        return;
    }
    case OPGEN_I32: {
        const int32_t *s = (const int32_t *)src;
        if (to == OPGEN_I64)
            for (int64_t j = 0; j < n; j++, o += st) ((int64_t *)dst)[j] = (int64_t)(s[o]);
        if (to == OPGEN_BOOL)
            for (int64_t j = 0; j < n; j++, o += st) ((bool *)dst)[j] = (s[o] != 0);
        return;
    }
    case OPGEN_I64: {
        const int64_t *s = (const int64_t *)src;
        if (to == OPGEN_I64)
            for (int64_t j = 0; j < n; j++, o += st) ((int64_t *)dst)[j] = s[o];
        if (to == OPGEN_BOOL)
            for (int64_t j = 0; j < n; j++, o += st) ((bool *)dst)[j] = (s[o] != 0);
        return;
    }
    case OPGEN_U8: {
        const uint8_t *s = (const uint8_t *)src;
        if (to == OPGEN_I64)
            for (int64_t j = 0; j < n; j++, o += st) ((int64_t *)dst)[j] = (int64_t)(s[o]);
        if (to == OPGEN_BOOL)
            for (int64_t j = 0; j < n; j++, o += st) ((bool *)dst)[j] = (s[o] != 0);
        return;
    }
    case OPGEN_U16: {
        const uint16_t *s = (const uint16_t *)src;
        if (to == OPGEN_I64)
            for (int64_t j = 0; j < n; j++, o += st) ((int64_t *)dst)[j] = (int64_t)(s[o]);
        if (to == OPGEN_BOOL)
            for (int64_t j = 0; j < n; j++, o += st) ((bool *)dst)[j] = (s[o] != 0);
        return;
    }
    case OPGEN_U32: {
        const uint32_t *s = (const uint32_t *)src;
        if (to == OPGEN_I64)
            for (int64_t j = 0; j < n; j++, o += st) ((int64_t *)dst)[j] = (int64_t)(s[o]);
        if (to == OPGEN_BOOL)
            for (int64_t j = 0; j < n; j++, o += st) ((bool *)dst)[j] = (s[o] != 0);
        return;
    }
    case OPGEN_U64: {
        const uint64_t *s = (const uint64_t *)src;
        if (to == OPGEN_I64)
            for (int64_t j = 0; j < n; j++, o += st) ((int64_t *)dst)[j] = (int64_t)(s[o]);
        if (to == OPGEN_BOOL)
            for (int64_t j = 0; j < n; j++, o += st) ((bool *)dst)[j] = (s[o] != 0);
        return;
    }
    case OPGEN_F16: {
        const uint16_t *s = (const uint16_t *)src;
        if (to == OPGEN_I64)
            for (int64_t j = 0; j < n; j++, o += st) ((int64_t *)dst)[j] = OPGEN_F2I(int64_t, opgen_f16_to_f32(s[o]), INT64_MIN, 9223372036854775807ll, INT64_MIN);
        if (to == OPGEN_BOOL)
            for (int64_t j = 0; j < n; j++, o += st) ((bool *)dst)[j] = (opgen_f16_to_f32(s[o]) != 0);
        return;
    }
    case OPGEN_BF16: {
        const uint16_t *s = (const uint16_t *)src;
        if (to == OPGEN_I64)
            for (int64_t j = 0; j < n; j++, o += st) ((int64_t *)dst)[j] = OPGEN_F2I(int64_t, opgen_bf16_to_f32(s[o]), INT64_MIN, 9223372036854775807ll, INT64_MIN);
        if (to == OPGEN_BOOL)
            for (int64_t j = 0; j < n; j++, o += st) ((bool *)dst)[j] = (opgen_bf16_to_f32(s[o]) != 0);
        return;
    }
    case OPGEN_F32: {
        const float *s = (const float *)src;
        if (to == OPGEN_I64)
            for (int64_t j = 0; j < n; j++, o += st) ((int64_t *)dst)[j] = OPGEN_F2I(int64_t, s[o], INT64_MIN, 9223372036854775807ll, INT64_MIN);
        if (to == OPGEN_BOOL)
            for (int64_t j = 0; j < n; j++, o += st) ((bool *)dst)[j] = (s[o] != 0);
        return;
    }
    case OPGEN_F64: {
        const double *s = (const double *)src;
        if (to == OPGEN_I64)
            for (int64_t j = 0; j < n; j++, o += st) ((int64_t *)dst)[j] = OPGEN_F2I(int64_t, s[o], INT64_MIN, 9223372036854775807ll, INT64_MIN);
        if (to == OPGEN_BOOL)
            for (int64_t j = 0; j < n; j++, o += st) ((bool *)dst)[j] = (s[o] != 0);
        return;
    }
    default:
        return;
    }
}

/* A non-empty tensor (strides st) converted to dtype `to` (item size `isz`) into a dense copy,
   in row-major order of its axes. */
static void opgen_convert(const opgen_tensor_t *t, const int64_t *st, int to, size_t isz, void *dst) {
    const int nd = t->ndim;
    const int64_t inner = nd ? t->shape[nd - 1] : 1, ist = nd ? st[nd - 1] : 0;
    int64_t rows = 1;
    for (int i = 0; i + 1 < nd; i++) rows *= t->shape[i]; /* divides the element count: fits */
    for (int64_t r = 0; r < rows; r++)
        opgen_convert_row(t->data, (int)t->dtype, opgen_row_offset(t->shape, st, nd - 1, r), ist, inner, to,
                          (char *)dst + (size_t)(r * inner) * isz);
}

#define OPGEN_WS_ALIGN ((size_t)64)

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
    /* the workspace: the caller's (base rounded up to OPGEN_WS_ALIGN), or, given NULL and size 0,
       our own */
    void *own = NULL;
    char *w = NULL;
    if (need > 0) {
        if (!ws && ws_size == 0) {
            own = aligned_alloc(OPGEN_WS_ALIGN, total); /* total: a multiple of the alignment */
            if (!own) return opgen_fail(OPGEN_ERR_ALLOC, "%s: cannot allocate %zu bytes of workspace", op->name, total);
            w = (char *)own;
        } else if (ws_size < need) {
            return opgen_fail(OPGEN_ERR_WORKSPACE, "%s: workspace of %zu bytes, %zu needed", op->name, ws_size, need);
        } else if (!ws) {
            return opgen_fail(OPGEN_ERR_NULL, "%s: workspace is NULL but workspace_size is %zu", op->name, ws_size);
        } else {
            w = (char *)ws + (OPGEN_WS_ALIGN - (uintptr_t)ws % OPGEN_WS_ALIGN) % OPGEN_WS_ALIGN;
        }
    }
    for (int k = 0; k < op->n_params; k++)
        if (cvt[k] >= 0) {
            bufs[k].data = w + cvt_off[k];
            opgen_convert(tensors[k], strides_buf[k], cvt[k], opgen_itemsize[cvt[k]], bufs[k].data);
        }
    for (int k = 0; k < op->n_params; k++) {
        int nb = n_batch_rows[k];
        if (!nb) continue;
        const opgen_tensor_t *t = tensors[k];
        int64_t *ro = (int64_t *)(void *)(w + tbl_off[k]);
        int64_t rows = dims[op->params[k].dims[0]];
        /* every offset below is one of the tensor's element offsets (or 0 for an empty tensor,
           whose strides are 0): inside its checked extent, no overflow */
        if (nb < 0) {
            for (int64_t r = 0; r < rows; r++) ro[r] = r * bufs[k].st[0];
            nb = 0;
        }
        for (int64_t r = 0; nb > 0 && r < rows; r++) ro[r] = opgen_row_offset(t->shape, strides_buf[k], nb, r);
        bufs[k].ro = ro;
    }
    opgen_status_t st = ke->fn(bufs, dims, scalars, w);
    free(own);
    return st;
}
