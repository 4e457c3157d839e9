/* The CPU runtime's f16 <-> f32 conversions (generated/cpu/opgen_rt.h), for
 * tests/test_vector_math.py to hold against numpy:
 *   f16_check h2f OUT     the f32 value of each of the 2^16 f16 bit patterns, in order
 *   f16_check f2h IN OUT  the f16 bits of each f32 bit pattern in IN (native uint32 words)
 * The two loops are the ones the test also asks the compiler to vectorise. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "opgen_rt.h"

__attribute__((noinline)) static void h2f(float *restrict out, const uint16_t *restrict in, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = opgen_f16_to_f32(in[i]);
}

__attribute__((noinline)) static void f2h(uint16_t *restrict out, const float *restrict in, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = opgen_f32_to_f16(in[i]);
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "h2f")) {
        static uint16_t in[1 << 16];
        static float out[1 << 16];
        for (size_t i = 0; i < 1 << 16; i++) in[i] = (uint16_t)i;
        h2f(out, in, 1 << 16);
        FILE *f = fopen(argv[2], "wb");
        if (!f || fwrite(out, sizeof out, 1, f) != 1 || fclose(f)) return 2;
        return 0;
    }
    if (argc == 4 && !strcmp(argv[1], "f2h")) {
        FILE *f = fopen(argv[2], "rb");
        if (!f || fseek(f, 0, SEEK_END)) return 2;
        const size_t n = (size_t)ftell(f) / sizeof(float);
        float *in = malloc(n * sizeof *in);
        uint16_t *out = malloc(n * sizeof *out);
        rewind(f);
        if (!in || !out || fread(in, sizeof *in, n, f) != n) return 2;
        fclose(f);
        f2h(out, in, n);
        f = fopen(argv[3], "wb");
        if (!f || fwrite(out, sizeof *out, n, f) != n || fclose(f)) return 2;
        free(in);
        free(out);
        return 0;
    }
    fprintf(stderr, "usage: f16_check h2f OUT | f2h IN OUT\n");
    return 1;
}
