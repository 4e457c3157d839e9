/* The saturating size helpers of the internal runtime header (generated/cpu/opgen_rt.h) that the
 * generated *_ws(dims) functions use: SIZE_MAX means "does not fit in size_t" and is sticky.
 * Exit status 0 when every expectation holds; each failure is printed. */
#include "opgen_rt.h"

#include <stdio.h>

static int failures = 0;

#define EXPECT(cond)                                             \
    do {                                                         \
        if (!(cond)) {                                           \
            printf("%s:%d: %s\n", __FILE__, __LINE__, #cond);   \
            failures++;                                          \
        }                                                        \
    } while (0)

int main(void) {
    const size_t M = SIZE_MAX;
    EXPECT(opgen_sz_mul(3, 5) == 15);
    EXPECT(opgen_sz_mul(0, 12345) == 0);
    EXPECT(opgen_sz_mul((size_t)1 << 32, (size_t)1 << 31) == (size_t)1 << 63);
    EXPECT(opgen_sz_mul((size_t)1 << 32, (size_t)1 << 32) == M); /* 2^64 */
    EXPECT(opgen_sz_mul(sizeof(int32_t), (size_t)1 << 62) == M);
    EXPECT(opgen_sz_mul(M, 0) == M && opgen_sz_mul(0, M) == M && opgen_sz_mul(M, 1) == M); /* sticky */
    EXPECT(opgen_sz_add(M - 1, 1) == M && opgen_sz_add(M - 1, 2) == M && opgen_sz_add(M, 0) == M);
    EXPECT(opgen_sz_add(7, 8) == 15);
    EXPECT(opgen_sz_dim(0) == 0 && opgen_sz_dim(INT64_MAX) == (size_t)INT64_MAX);
    EXPECT(opgen_sz_dim(-1) == M && opgen_sz_dim(INT64_MIN) == M);
    EXPECT(opgen_align(0) == 0 && opgen_align(1) == 64 && opgen_align(64) == 64 && opgen_align(65) == 128);
    EXPECT(opgen_align(M - 63) == M - 63); /* a multiple of 64 */
    EXPECT(opgen_align(M - 62) == M && opgen_align(M - 1) == M && opgen_align(M) == M);
    /* the generated pattern: off += align(size * n) for a table of 2^62 + 1 int64 rows */
    size_t off = opgen_align(opgen_sz_mul(sizeof(int64_t), opgen_sz_dim(16)));
    off = opgen_sz_add(off, opgen_align(opgen_sz_mul(sizeof(int64_t), opgen_sz_add(opgen_sz_dim((int64_t)1 << 62), 1))));
    EXPECT(off == M);
    if (!failures) printf("sz helpers ok\n");
    return failures != 0;
}
