/* Driver for tests/test_gemm.py: runs the CPU runtime's f32 GEMM (opgen_rt.c) on operands read
 * from a file and writes C to another.
 *
 *   gemm_check IN OUT m n k ta tb accumulate ldc_pad par
 *
 * IN holds A (m x k, or k x m when ta), B (k x n, or n x k when tb) and C (m x (n + ldc_pad)),
 * f32, row-major, one after the other; op(A) and op(B) are read through strides (a transposed
 * operand is a strided view), C is updated in place with leading dimension n + ldc_pad and
 * written to OUT whole (the padding columns must come back untouched). par: opgen_sgemm_par. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

void opgen_sgemm(int64_t m, int64_t n, int64_t k, const float *A, int64_t ars, int64_t acs,
                 const float *B, int64_t brs, int64_t bcs, float *C, int64_t ldc, int accumulate);
void opgen_sgemm_par(int64_t m, int64_t n, int64_t k, const float *A, int64_t ars, int64_t acs,
                     const float *B, int64_t brs, int64_t bcs, float *C, int64_t ldc, int accumulate);

int main(int argc, char **argv) {
    if (argc != 11) {
        fprintf(stderr, "usage: gemm_check IN OUT m n k ta tb accumulate ldc_pad par\n");
        return 2;
    }
    const int64_t m = atoll(argv[3]), n = atoll(argv[4]), k = atoll(argv[5]);
    const int ta = atoi(argv[6]), tb = atoi(argv[7]), acc = atoi(argv[8]), par = atoi(argv[10]);
    const int64_t ldc = n + atoll(argv[9]);
    const size_t na = (size_t)(m * k), nb = (size_t)(k * n), nc = (size_t)(m * ldc);
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
    const int64_t ars = ta ? 1 : k, acs = ta ? m : 1, brs = tb ? 1 : n, bcs = tb ? k : 1;
    (par ? opgen_sgemm_par : opgen_sgemm)(m, n, k, A, ars, acs, B, brs, bcs, C, ldc, acc);
    f = fopen(argv[2], "wb");
    if (!f || fwrite(C, sizeof(float), nc, f) != nc) {
        fprintf(stderr, "gemm_check: cannot write %s\n", argv[2]);
        return 2;
    }
    fclose(f);
    free(buf);
    return 0;
}
