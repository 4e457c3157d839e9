/* Driver for tests/test_gemm.py: runs one of the CPU runtime's GEMMs (opgen_rt.c) on operands
 * read from a file and writes C to another; prints opgen_bf16_units() (2: opgen_bgemm runs on AMX tiles, 1: on AVX512-BF16 dot products,
 * 0: it is opgen_sgemm).
 *
 *   gemm_check IN OUT m n k ta tb accumulate ldc_pad fn
 *
 * IN holds A (m x k; k x m when ta is 1; m x 2k when 2), B (k x n; n x k when tb is 1; k x 2n
 * when 2) and C (m x (n + ldc_pad)), f32, row-major, one after the other; op(A) and op(B) are read through strides (a transposed
 * operand is a strided view), C is updated in place with leading dimension n + ldc_pad and
 * written to OUT whole (the padding columns must come back untouched). fn: 0 opgen_sgemm,
 * 1 opgen_sgemm_par, 2 opgen_bgemm, 3 opgen_bgemm_par, 4 opgen_gemm_bf16, 5 opgen_gemm_bf16_par
 * (A and B passed as bf16: their values must be bf16 numbers, whose top 16 bits are taken),
 * 6 opgen_gemm_bf16_out, 7 opgen_gemm_bf16_out_par (C too: bf16 in, bf16 out, written back as f32),
 * 8 opgen_bpack then opgen_bgemm_pb, 9 opgen_spack then opgen_sgemm_pb (B packed ahead; the pack
 * buffer filled with 0xff first, so a word the GEMM reads but the pack did not write shows),
 * 10 opgen_gemm_f16, 11 opgen_gemm_f16_par, 12 opgen_gemm_f16_out, 13 opgen_gemm_f16_out_par
 * (as 4 to 7 with f16: the values must be f16 numbers, converted by the compiler's _Float16).
 * Built with GEMM_CHECK_FAIL_ALLOC defined: the runtime's large allocations can be made to fail
 * (below). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void opgen_sgemm(int64_t m, int64_t n, int64_t k, const float *A, int64_t ars, int64_t acs,
                 const float *B, int64_t brs, int64_t bcs, float *C, int64_t ldc, int accumulate);
void opgen_sgemm_par(int64_t m, int64_t n, int64_t k, const float *A, int64_t ars, int64_t acs,
                     const float *B, int64_t brs, int64_t bcs, float *C, int64_t ldc, int accumulate);
void opgen_bgemm(int64_t m, int64_t n, int64_t k, const float *A, int64_t ars, int64_t acs,
                 const float *B, int64_t brs, int64_t bcs, float *C, int64_t ldc, int accumulate);
void opgen_bgemm_par(int64_t m, int64_t n, int64_t k, const float *A, int64_t ars, int64_t acs,
                     const float *B, int64_t brs, int64_t bcs, float *C, int64_t ldc, int accumulate);
void opgen_gemm_bf16(int64_t m, int64_t n, int64_t k, const uint16_t *A, int64_t ars, int64_t acs,
                     const uint16_t *B, int64_t brs, int64_t bcs, float *C, int64_t ldc, int accumulate);
void opgen_gemm_bf16_par(int64_t m, int64_t n, int64_t k, const uint16_t *A, int64_t ars, int64_t acs,
                         const uint16_t *B, int64_t brs, int64_t bcs, float *C, int64_t ldc, int accumulate);
void opgen_gemm_bf16_out(int64_t m, int64_t n, int64_t k, const uint16_t *A, int64_t ars, int64_t acs,
                         const uint16_t *B, int64_t brs, int64_t bcs, uint16_t *C, int64_t ldc, int accumulate);
void opgen_gemm_bf16_out_par(int64_t m, int64_t n, int64_t k, const uint16_t *A, int64_t ars, int64_t acs,
                             const uint16_t *B, int64_t brs, int64_t bcs, uint16_t *C, int64_t ldc, int accumulate);
void opgen_gemm_f16(int64_t m, int64_t n, int64_t k, const uint16_t *A, int64_t ars, int64_t acs,
                    const uint16_t *B, int64_t brs, int64_t bcs, float *C, int64_t ldc, int accumulate);
void opgen_gemm_f16_par(int64_t m, int64_t n, int64_t k, const uint16_t *A, int64_t ars, int64_t acs,
                        const uint16_t *B, int64_t brs, int64_t bcs, float *C, int64_t ldc, int accumulate);
void opgen_gemm_f16_out(int64_t m, int64_t n, int64_t k, const uint16_t *A, int64_t ars, int64_t acs,
                        const uint16_t *B, int64_t brs, int64_t bcs, uint16_t *C, int64_t ldc, int accumulate);
void opgen_gemm_f16_out_par(int64_t m, int64_t n, int64_t k, const uint16_t *A, int64_t ars, int64_t acs,
                            const uint16_t *B, int64_t brs, int64_t bcs, uint16_t *C, int64_t ldc, int accumulate);
void opgen_bpack(int64_t k, int64_t n, const float *B, int64_t brs, int64_t bcs, uint16_t *p);
void opgen_bgemm_pb(int64_t m, int64_t n, int64_t k, const float *A, int64_t ars, int64_t acs, const float *B,
                    int64_t brs, int64_t bcs, const uint16_t *pb, float *C, int64_t ldc, int accumulate);
void opgen_spack(int64_t k, int64_t n, const float *B, int64_t brs, int64_t bcs, float *p);
void opgen_sgemm_pb(int64_t m, int64_t n, int64_t k, const float *A, int64_t ars, int64_t acs, const float *B,
                    int64_t brs, int64_t bcs, const float *pb, float *C, int64_t ldc, int accumulate);
int opgen_bf16_units(void);

#ifdef GEMM_CHECK_FAIL_ALLOC
/* Built with -Dmalloc=gemm_check_malloc -Daligned_alloc=gemm_check_aligned_alloc, so opgen_rt.c's
 * allocations come here: with GEMM_CHECK_FAIL_ALLOC=1 in the environment every request of 4 KiB or
 * more fails (the GEMMs' panels, their f32 C), and the GEMMs must fall back to their plain loops.
 * The number of failed requests goes to stderr. */
#undef malloc
#undef aligned_alloc
void *malloc(size_t n);
void *aligned_alloc(size_t align, size_t n);
static int fail_big;
static long failed;
static int refused(size_t n) { /* (counted: the test checks the fallback really ran) */
    if (!fail_big || n < 4096) return 0;
    #pragma omp atomic
    failed++;
    return 1;
}
void *gemm_check_malloc(size_t n);
void *gemm_check_aligned_alloc(size_t align, size_t n);
void *gemm_check_malloc(size_t n) { return refused(n) ? NULL : malloc(n); }
void *gemm_check_aligned_alloc(size_t align, size_t n) { return refused(n) ? NULL : aligned_alloc(align, n); }
#endif

typedef void gemm_fn(int64_t, int64_t, int64_t, const float *, int64_t, int64_t, const float *, int64_t, int64_t,
                     float *, int64_t, int);

int main(int argc, char **argv) {
    if (argc != 11) {
        fprintf(stderr, "usage: gemm_check IN OUT m n k ta tb accumulate ldc_pad fn\n");
        return 2;
    }
#ifdef GEMM_CHECK_FAIL_ALLOC
    fail_big = getenv("GEMM_CHECK_FAIL_ALLOC") && *getenv("GEMM_CHECK_FAIL_ALLOC") == '1';
#endif
    const int64_t m = atoll(argv[3]), n = atoll(argv[4]), k = atoll(argv[5]);
    const int ta = atoi(argv[6]), tb = atoi(argv[7]), acc = atoi(argv[8]), fn = atoi(argv[10]);
    const int64_t ldc = n + atoll(argv[9]);
    /* ta/tb 2: every other column of an m x 2k (k x 2n) array, neither stride 1 */
    const size_t na = (size_t)(m * k * (ta == 2 ? 2 : 1)), nb = (size_t)(k * n * (tb == 2 ? 2 : 1));
    const size_t nc = (size_t)(m * ldc);
    float *buf = malloc(sizeof(float) * (na + nb + nc + 1));
    FILE *f = fopen(argv[1], "rb");
    if (!buf || !f || fread(buf, sizeof(float), na + nb + nc, f) != na + nb + nc) {
        fprintf(stderr, "gemm_check: cannot read %s\n", argv[1]);
        return 2;
    }
    fclose(f);
    const float *A = buf, *B = buf + na;
    float *C = buf + na + nb;
    /* op(A)[i][q] = A[i * ars + q * acs]; op(B)[q][j] = B[q * brs + j * bcs] */
    const int64_t ars = ta == 2 ? 2 * k : ta ? 1 : k, acs = ta == 2 ? 2 : ta ? m : 1;
    const int64_t brs = tb == 2 ? 2 * n : tb ? 1 : n, bcs = tb == 2 ? 2 : tb ? k : 1;
    gemm_fn *const fns[] = {opgen_sgemm, opgen_sgemm_par, opgen_bgemm, opgen_bgemm_par};
    if (fn < 0 || fn > 13) {
        fprintf(stderr, "gemm_check: fn must be 0 to 13\n");
        return 2;
    }
    if (fn == 9) {
        const size_t elems = (size_t)k * (size_t)((n + 31) / 32 * 32);
        float *pb = malloc(sizeof(float) * (elems + 1));
        if (!pb) return 2;
        memset(pb, 0xff, sizeof(float) * (elems + 1));
        opgen_spack(k, n, B, brs, bcs, pb);
        opgen_sgemm_pb(m, n, k, A, ars, acs, B, brs, bcs, pb, C, ldc, acc);
        uint32_t last;
        memcpy(&last, &pb[elems], 4);
        if (last != 0xffffffffu) {
            fprintf(stderr, "gemm_check: opgen_spack wrote past k x round32(n) floats\n");
            return 3;
        }
        free(pb);
    } else if (fn == 8) {
        const size_t words = (size_t)((k + 31) / 32 * 32) * (size_t)((n + 31) / 32 * 32);
        uint16_t *pb = malloc(sizeof(uint16_t) * (words + 1));
        if (!pb) return 2;
        memset(pb, 0xff, sizeof(uint16_t) * (words + 1));
        opgen_bpack(k, n, B, brs, bcs, pb);
        opgen_bgemm_pb(m, n, k, A, ars, acs, B, brs, bcs, pb, C, ldc, acc);
        if (pb[words] != 0xffff) {
            fprintf(stderr, "gemm_check: opgen_bpack wrote past round32(k) x round32(n) words\n");
            return 3;
        }
        free(pb);
    } else if (fn >= 10) {
        uint16_t *h = malloc(sizeof(uint16_t) * (na + nb + nc + 1));
        if (!h) return 2;
        for (size_t i = 0; i < na + nb + nc; i++) {
            const _Float16 v = (_Float16)buf[i];
            memcpy(&h[i], &v, 2);
        }
        if (fn < 12) {
            (fn == 10 ? opgen_gemm_f16 : opgen_gemm_f16_par)(m, n, k, h, ars, acs, h + na, brs, bcs, C, ldc, acc);
        } else {
            (fn == 12 ? opgen_gemm_f16_out : opgen_gemm_f16_out_par)(m, n, k, h, ars, acs, h + na, brs, bcs,
                                                                     h + na + nb, ldc, acc);
            for (size_t i = 0; i < nc; i++) {
                _Float16 v;
                memcpy(&v, &h[na + nb + i], 2);
                C[i] = (float)v;
            }
        }
        free(h);
    } else if (fn >= 4) {
        uint16_t *h = malloc(sizeof(uint16_t) * (na + nb + nc + 1));
        if (!h) return 2;
        for (size_t i = 0; i < na + nb + nc; i++) {
            uint32_t u;
            memcpy(&u, &buf[i], 4);
            h[i] = (uint16_t)(u >> 16);
        }
        if (fn < 6) {
            (fn == 4 ? opgen_gemm_bf16 : opgen_gemm_bf16_par)(m, n, k, h, ars, acs, h + na, brs, bcs, C, ldc, acc);
        } else {
            (fn == 6 ? opgen_gemm_bf16_out : opgen_gemm_bf16_out_par)(m, n, k, h, ars, acs, h + na, brs, bcs,
                                                                      h + na + nb, ldc, acc);
            for (size_t i = 0; i < nc; i++) {
                uint32_t u = (uint32_t)h[na + nb + i] << 16;
                memcpy(&C[i], &u, 4);
            }
        }
        free(h);
    } else {
        fns[fn](m, n, k, A, ars, acs, B, brs, bcs, C, ldc, acc);
    }
    printf("%d\n", opgen_bf16_units());
#ifdef GEMM_CHECK_FAIL_ALLOC
    fprintf(stderr, "failed allocations: %ld\n", failed);
#endif
    f = fopen(argv[2], "wb");
    if (!f || fwrite(C, sizeof(float), nc, f) != nc) {
        fprintf(stderr, "gemm_check: cannot write %s\n", argv[2]);
        return 2;
    }
    fclose(f);
    free(buf);
    return 0;
}
