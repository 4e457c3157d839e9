/* The runtime's strip lookup (opgen_table_load_strip: map-cpu's staged table lookups of a bf16
 * or f16 row, opgen/lower/tabulate.py) against the plain lookup tab[src[l]]: a table of 65536
 * distinct bit patterns (NaN payloads, infinities and denormals among them: the lookup copies
 * bits, it never rounds), every 16-bit index in turn and then random ones, in strips of every
 * length from 1 to 64 at every alignment of src within a line (the vector paths take lengths
 * of 4 and 16 at a time, the loop the rest); nothing past a strip is written.
 * Prints: checked mismatches vector_path (2: the AVX-512 path compiled in, 1: the SSE4.1 one,
 * 0: the loop only). */
#include "opgen_rt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static float tab[65536];
static uint16_t idx[65536 + 64];

int main(void) {
    for (uint32_t b = 0; b < 65536; b++) {
        uint32_t u = b * 0x9E3779B1u ^ (b << 7); /* (distinct per b: odd multiplier, then a bijective xor-shift) */
        memcpy(&tab[b], &u, sizeof u);
    }
    for (uint32_t i = 0; i < 65536 + 64; i++) idx[i] = (uint16_t)(i < 65536 ? i : (uint32_t)rand());
    uint64_t checked = 0, bad = 0;
    _Alignas(64) float dst[64 + 16];
    for (int n = 1; n <= 64; n++)
        for (int a = 0; a < 32; a++)
            for (uint32_t i = (uint32_t)a; i + (uint32_t)n <= 65536 + 64; i += 61) {
                for (int l = 0; l < 64 + 16; l++) dst[l] = -0.0f;
                opgen_table_load_strip(dst, tab, idx + i, n);
                for (int l = 0; l < n; l++, checked++)
                    if (memcmp(&dst[l], &tab[idx[i + l]], sizeof(float))) bad++;
                for (int l = n; l < 64 + 16; l++)
                    if (memcmp(&dst[l], &(float){-0.0f}, sizeof(float))) bad++;
            }
#if defined(__AVX512F__)
    const int path = 2;
#elif defined(__SSE4_1__)
    const int path = 1;
#else
    const int path = 0;
#endif
    printf("%llu %llu %d\n", (unsigned long long)checked, (unsigned long long)bad, path);
    return 0;
}
