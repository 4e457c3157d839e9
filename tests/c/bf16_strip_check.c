/* The runtime's strip stores (map-cpu's staged and nontemporal stores) against the scalar
 * conversions: opgen_bf16_store_strip against opgen_f32_to_bf16 (round to nearest even, NaN
 * quieted, denormals kept), opgen_f16_store_strip against opgen_f32_to_f16 and
 * opgen_f32_store_strip against the f32 bits themselves (and the fills opgen_*_fill_strip of the
 * strip's first value), each with nt 0 and 1 (1: the strip of a
 * whole aligned line streams around the caches where the machine can): every STRIDE-th f32 bit
 * pattern, and every pattern with the low 16 bits of EDGES (all exponents, signs, NaN payloads
 * and the rounding ties), 32 to a strip; then strips of 16 and a strided strip, which take the
 * scalar path. opgen_bf16_store_strip_pairs the same way (a `pairs` strip: the values of
 * its pairs' first elements staged first, then the second ones), and opgen_bf16_first/second
 * against opgen_bf16_to_f32 for every bf16 pattern in either place of a pair.
 * Usage: bf16_strip_check STRIDE (1: all 2^32 patterns).
 * Prints: checked mismatches first_mismatch_bits vector_path (1: vcvtne2ps2bf16 compiled in, 2: the
 * AVX2 integer steps, 0: the scalar loop only). */
#include "opgen_rt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const uint32_t EDGES[] = {0x0000, 0x0001, 0x3fff, 0x4000, 0x7ffe, 0x7fff, 0x8000, 0x8001, 0xbfff, 0xc000,
                                 0xfffe, 0xffff};

static uint64_t checked, bad;
static uint32_t first_bad;
static _Alignas(64) float src[32];
static uint32_t bits[32];
static int fill;

static void mismatch(int mine, int l, int64_t st) {
    if (!bad++) first_bad = mine ? bits[l / st] : 0xFFFFFFFFu;
}

static void check(int n, int64_t st) {
    _Alignas(64) uint16_t dst[64], dh[64];
    _Alignas(64) float df[64];
    uint16_t want[32], wanth[32];
    for (int l = 0; l < n; l++) {
        want[l] = opgen_f32_to_bf16(src[l]);
        wanth[l] = opgen_f32_to_f16(src[l]);
    }
    for (int nt = 0; nt < 2; nt++) {
        memset(dst, 0xA5, sizeof dst);
        memset(dh, 0xA5, sizeof dh);
        memset(df, 0xA5, sizeof df);
        opgen_bf16_store_strip(dst, st, src, n, nt);
        /* a `pairs` strip: the first elements of its pairs staged first, then the second ones */
        _Alignas(64) uint16_t dp[64];
        _Alignas(64) float sp[32];
        for (int j = 0; j < n / 2; j++) {
            sp[j] = src[2 * j];
            sp[n / 2 + j] = src[2 * j + 1];
        }
        memset(dp, 0xA5, sizeof dp);
        opgen_bf16_store_strip_pairs(dp, st, sp, n, nt);
        opgen_f16_store_strip(dh, st, src, n, nt);
        opgen_f32_store_strip(df, st, src, n, nt);
        opgen_stream_fence();
        for (int l = 0; l < 64; l++) {
            const int mine = l % st == 0 && l / st < n;
            uint32_t f;
            memcpy(&f, &df[l], 4);
            if (mine ? dst[l] != want[l / st] : dst[l] != 0xA5A5) mismatch(mine, l, st); /* (and nothing between) */
            if (mine ? dp[l] != want[l / st] : dp[l] != 0xA5A5) mismatch(mine, l, st);
            if (mine ? dh[l] != wanth[l / st] : dh[l] != 0xA5A5) mismatch(mine, l, st);
            if (mine ? f != bits[l / st] : f != 0xA5A5A5A5u) mismatch(mine, l, st);
        }
        /* the fills: n copies of src[0], each rounded as one */
        memset(dst, 0xA5, sizeof dst);
        memset(dh, 0xA5, sizeof dh);
        memset(df, 0xA5, sizeof df);
        opgen_bf16_fill_strip(dst, st, src[0], n, nt);
        opgen_f16_fill_strip(dh, st, src[0], n, nt);
        opgen_f32_fill_strip(df, st, src[0], n, nt);
        opgen_stream_fence();
        for (int l = 0; l < 64; l++) {
            const int mine = l % st == 0 && l / st < n;
            uint32_t f;
            memcpy(&f, &df[l], 4);
            if (mine ? dst[l] != want[0] : dst[l] != 0xA5A5) mismatch(mine, 0, st);
            if (mine ? dh[l] != wanth[0] : dh[l] != 0xA5A5) mismatch(mine, 0, st);
            if (mine ? f != bits[0] : f != 0xA5A5A5A5u) mismatch(mine, 0, st);
        }
    }
    checked += (uint64_t)n;
}

static void add(uint32_t b) {
    memcpy(&src[fill], &b, 4);
    bits[fill++] = b;
    if (fill == 32) {
        check(32, 1);
        fill = 0;
    }
}

int main(int argc, char **argv) {
    const uint64_t stride = argc == 2 ? strtoull(argv[1], NULL, 10) : 0;
    if (stride == 0) {
        fprintf(stderr, "usage: bf16_strip_check STRIDE\n");
        return 2;
    }
    for (uint64_t b = 0; b < (1ull << 32); b += stride) add((uint32_t)b);
    for (uint32_t hi = 0; hi < 0x10000; hi++)
        for (size_t e = 0; e < sizeof EDGES / sizeof EDGES[0]; e++) add(hi << 16 | EDGES[e]);
    while (fill) add(0x7fc00001u); /* (a NaN with a payload fills the last strip) */
    for (uint32_t hi = 0; hi < 0x10000; hi += 97) { /* strips of 16 and strided strips */
        for (int l = 0; l < 32; l++) {
            const uint32_t b = (hi + (uint32_t)l) << 16 | EDGES[l % 12];
            memcpy(&src[l], &b, 4);
            bits[l] = b;
        }
        check(16, 1);
        check(32, 2);
    }
    for (uint32_t h = 0; h < 0x10000; h++) { /* the pair widening: every bf16 pattern first and second */
        const uint16_t pair[2] = {(uint16_t)h, (uint16_t)(h * 0x9E37u + 1u)};
        const float a = opgen_bf16_first(&pair[0]), b = opgen_bf16_second(&pair[1]);
        const float wa = opgen_bf16_to_f32(pair[0]), wb = opgen_bf16_to_f32(pair[1]);
        if (memcmp(&a, &wa, 4) || memcmp(&b, &wb, 4)) {
            if (!bad++) first_bad = h << 16;
        }
        checked += 2;
    }
#if defined(__AVX512BF16__)
    const int vector_path = 1;
#elif defined(__AVX2__)
    const int vector_path = 2;
#else
    const int vector_path = 0;
#endif
    printf("%llu %llu %08x %d\n", (unsigned long long)checked, (unsigned long long)bad, first_bad, vector_path);
    return 0;
}
