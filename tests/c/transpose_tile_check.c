/* The runtime's staged-tile transposes (sched.transpose_tile: opgen_<dtype>_transpose_tile, d[c *
 * ld + r] = widened s[r * rs + c * cs]; opgen_bits16_transpose_tile, the 16-bit words as they are,
 * into a stage tile of bf16) against that definition, element by element: f32, bf16, f16 and
 * 16-bit tiles of random bits (NaNs, infinities and denormals among them: a widening that rounds or
 * quiets would differ), rows and columns within, at and across the in-register blocks' edges (16
 * rows; 16 columns, 32 for bf16 and the words with AVX512-BW), row strides longer than a row, and
 * a column stride of 2 (the scalar path); the destination's entries outside the tile untouched.
 * Prints: checked mismatches vector-path (2: AVX-512 with BW, 1: AVX-512 without it, 0: none). */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "opgen_rt.h"

enum { MAXR = 70, MAXC = 140, LD = 80, RS = 150 };
static float dst[MAXC * LD];
static uint16_t dst16[MAXC * LD];
static uint32_t src32[MAXR * RS * 2];
static uint16_t src16[MAXR * RS * 2];

static uint32_t state = 12345u;
static uint32_t next_bits(void) { /* (xorshift32) */
    state ^= state << 13, state ^= state >> 17, state ^= state << 5;
    return state;
}

static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

int main(void) {
    const int64_t rows_of[] = {1, 15, 16, 17, 32, 33, 64, 70};
    const int64_t cols_of[] = {1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 140};
    long long checked = 0, bad = 0;
    for (size_t i = 0; i < sizeof src32 / sizeof *src32; i++) src32[i] = next_bits();
    for (size_t i = 0; i < sizeof src16 / sizeof *src16; i++) src16[i] = (uint16_t)next_bits();
    for (int dt = 0; dt < 4; dt++)
        for (size_t a = 0; a < sizeof rows_of / sizeof *rows_of; a++)
            for (size_t b = 0; b < sizeof cols_of / sizeof *cols_of; b++)
                for (int64_t cs = 1; cs <= 2; cs++) {
                    const int64_t rows = rows_of[a], cols = cols_of[b], rs = cs == 1 ? RS : 2 * RS;
                    const int64_t ld = rows > 64 ? LD : 64 + (int64_t)(b % 3); /* (a leading dimension past the rows) */
                    memset(dst, 0x5a, sizeof dst);
                    memset(dst16, 0x5a, sizeof dst16);
                    if (dt == 0) opgen_f32_transpose_tile(dst, ld, (const float *)(const void *)src32, rs, cs, rows, cols);
                    if (dt == 1) opgen_bf16_transpose_tile(dst, ld, src16, rs, cs, rows, cols);
                    if (dt == 2) opgen_f16_transpose_tile(dst, ld, src16, rs, cs, rows, cols);
                    if (dt == 3) opgen_bits16_transpose_tile(dst16, ld, src16, rs, cs, rows, cols);
                    for (int64_t c = 0; c < MAXC; c++)
                        for (int64_t r = 0; r < ld && c * ld + r < MAXC * LD; r++, checked++) {
                            const uint32_t got = dt == 3 ? dst16[c * ld + r] : bits(dst[c * ld + r]);
                            uint32_t want = dt == 3 ? 0x5a5au : 0x5a5a5a5au;
                            if (r < rows && c < cols) {
                                const int64_t k = r * rs + c * cs;
                                want = dt == 0 ? src32[k] : dt == 1 ? bits(opgen_bf16_to_f32(src16[k]))
                                     : dt == 2 ? bits(opgen_f16_to_f32(src16[k])) : src16[k];
                            }
                            if (got != want) /* (the same bits: f16 NaNs keep their payloads too) */
                                bad++;
                        }
                }
#if defined(__AVX512F__) && defined(__AVX512BW__)
    const int path = 2;
#elif defined(__AVX512F__)
    const int path = 1;
#else
    const int path = 0;
#endif
    printf("%lld %lld %d\n", checked, bad, path);
    return 0;
}
