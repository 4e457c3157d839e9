/* The machine's f32 fused multiply-add peak, as benchmarks/cpu.py's "% FMA peak" column
 * divides by: every OpenMP thread runs 12 independent chains of multiply-adds of the widest
 * vectors -march=native gives (16 lanes with AVX-512, 8 otherwise: 16-lane vectors split in two
 * on a Zen 3 spilled to the stack and read 16 of its 205 GFLOP/s) and the program prints
 * GFLOP/s (2 per lane and multiply-add) over all threads, best of 5.
 * With the argument "bf16": the bf16 dot-product peak the same way (12 chains of VDPBF16PS, 64
 * flops each: 16 lanes of two products and their sums), or "nan" without AVX512-BF16.
 * With "amx": the AMX bf16 tile-product peak (6 chains of TDPBF16PS on 16 x 16 f32 tiles, 16384
 * flops each: 16 x 16 sums of 32 products), or "nan" without AMX-BF16 or without Linux's grant of
 * the tile data state (the units opgen_bgemm uses on such a machine). */
#include <omp.h>
#include <stdio.h>
#include <string.h>
#if defined(__AVX512BF16__) || defined(__AMX_BF16__)
#include <immintrin.h>
#endif
#if defined(__AMX_BF16__) && defined(__linux__)
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>
#define HAVE_AMX 1
#endif

#if defined(__AVX512F__)
#define LANES 16
#else
#define LANES 8
#endif
typedef float vf __attribute__((vector_size(4 * LANES)));

#define ITERS 20000000L /* steps of 12 chains per thread and repetition */

/* one repetition of one thread: 12 chains of ITERS steps of f32 multiply-adds; their sum */
static float fma_chains(void) {
    vf m, a;
    for (int i = 0; i < LANES; i++) {
        m[i] = 0.999999f;
        a[i] = 1e-7f * (float)(i + omp_get_thread_num());
    }
    vf c0 = a, c1 = a * 2, c2 = a * 3, c3 = a * 4, c4 = a * 5, c5 = a * 6, c6 = a * 7, c7 = a * 8,
        c8 = a * 9, c9 = a * 10, c10 = a * 11, c11 = a * 12;
    for (long it = 0; it < ITERS; it++) { /* (contracted to multiply-adds: -ffp-contract=fast) */
        c0 = c0 * m + a; c1 = c1 * m + a; c2 = c2 * m + a; c3 = c3 * m + a;
        c4 = c4 * m + a; c5 = c5 * m + a; c6 = c6 * m + a; c7 = c7 * m + a;
        c8 = c8 * m + a; c9 = c9 * m + a; c10 = c10 * m + a; c11 = c11 * m + a;
    }
    const vf s = c0 + c1 + c2 + c3 + c4 + c5 + c6 + c7 + c8 + c9 + c10 + c11;
    float sum = 0;
    for (int i = 0; i < LANES; i++) sum += s[i];
    return sum;
}

#if defined(__AVX512BF16__)
/* the same with VDPBF16PS */
static float dp_chains(void) {
    const __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80 + omp_get_thread_num()); /* (bf16 pairs near 1) */
    const __m512bh b = (__m512bh)_mm512_set1_epi32(0x33d633d6); /* (1e-7) */
    __m512 c[12];
    for (int i = 0; i < 12; i++) c[i] = _mm512_set1_ps((float)i);
    for (long it = 0; it < ITERS; it++) {
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++) c[i] = _mm512_dpbf16_ps(c[i], a, b); /* (in registers) */
    }
    __m512 s = c[0];
    for (int i = 1; i < 12; i++) s = _mm512_add_ps(s, c[i]);
    return _mm512_reduce_add_ps(s);
}
#endif

#ifdef HAVE_AMX
#define AMX_ITERS 1000000L /* steps of 6 tile products per thread and repetition */
/* the same with TDPBF16PS: tiles 0-5 the chains' f32 sums, 6 and 7 the bf16 operands (in registers) */
static float amx_chains(void) {
    struct {
        uint8_t palette, start_row, reserved[14];
        uint16_t colsb[16];
        uint8_t rows[16];
    } cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.colsb[t] = 64;
        cfg.rows[t] = 16;
    }
    _tile_loadconfig(&cfg);
    static const uint16_t ops[16 * 32] = {0}; /* (zeros: the sums stay finite) */
    float out[16 * 16];
    _tile_loadd(6, ops, 64);
    _tile_loadd(7, ops, 64);
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3); _tile_zero(4); _tile_zero(5);
    for (long it = 0; it < AMX_ITERS; it++) {
        _tile_dpbf16ps(0, 6, 7); _tile_dpbf16ps(1, 6, 7); _tile_dpbf16ps(2, 6, 7);
        _tile_dpbf16ps(3, 6, 7); _tile_dpbf16ps(4, 6, 7); _tile_dpbf16ps(5, 6, 7);
    }
    _tile_stored(0, out, 64);
    _tile_release();
    return out[omp_get_thread_num() % 256];
}
#endif

/* GFLOP/s over all threads, best of 5, of `chains` run by every thread (flops: each thread's) */
static double best_gflops(float (*chains)(void), double flops) {
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = omp_get_wtime();
        float sink = 0;
#pragma omp parallel reduction(+ : sink)
        sink += chains();
        double dt = omp_get_wtime() - t0, gf = flops * omp_get_max_threads() / dt / 1e9;
        if (gf > best) best = gf;
        if (sink == 12345.0f) printf("(unreachable)\n");
    }
    return best;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "amx") == 0) {
#ifdef HAVE_AMX
        if (syscall(SYS_arch_prctl, 0x1023, 18) == 0) { /* ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA */
            printf("%.1f\n", best_gflops(amx_chains, 16384.0 * 6 * AMX_ITERS));
            return 0;
        }
#endif
        printf("nan\n");
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "bf16") == 0) {
#if defined(__AVX512BF16__)
        printf("%.1f\n", best_gflops(dp_chains, 64.0 * 12 * ITERS));
#else
        printf("nan\n");
#endif
        return 0;
    }
    printf("%.1f\n", best_gflops(fma_chains, 2.0 * LANES * 12 * ITERS));
    return 0;
}
