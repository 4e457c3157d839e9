/* Maximum ulp error of the runtime's vectorisable f32 math (opgen_rt.h) against the correctly
 * rounded result (the double-precision libm value rounded to f32), over every STRIDE-th f32 bit
 * pattern plus the special values (tests/test_vector_math.py; STRIDE 1: all 2^32 inputs).
 * Usage: ulp_check FUNCTION STRIDE   (FUNCTION: exp, erf, tanh or log)
 * Prints: max_ulp worst_input_bits checked special_failures */
#include "opgen_rt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static float from_bits(uint32_t b) {
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

/* distance in ulps between f32 y and the exact value r (double) */
static double ulps(float y, double r) {
    const float rf = (float)r;
    if (isinf(rf) || isinf(y)) return y == rf ? 0.0 : 1e9;
    const double u = nextafterf(fabsf(rf), INFINITY) - fabsf(rf);
    return fabs((double)y - r) / (u > 0 ? u : 1.4e-45) - 0.5; /* 0: correctly rounded */
}

#define BATCH 4096

int main(int argc, char **argv) {
    const int is_erf = argc == 3 && strcmp(argv[1], "erf") == 0;
    const int is_tanh = argc == 3 && strcmp(argv[1], "tanh") == 0;
    const int is_log = argc == 3 && strcmp(argv[1], "log") == 0;
    if (argc != 3 || (!is_erf && !is_tanh && !is_log && strcmp(argv[1], "exp") != 0)) {
        fprintf(stderr, "usage: %s exp|erf|tanh|log STRIDE\n", argv[0]);
        return 2;
    }
    const uint64_t stride = strtoull(argv[2], NULL, 10);
    if (stride == 0) return 2;
    static float in[BATCH], out[BATCH];
    double worst = 0.0;
    uint32_t worst_bits = 0;
    uint64_t checked = 0;
    int n = 0, bad_negative = 0;
    for (uint64_t b = 0; b <= 0xffffffffull; b += stride) {
        in[n++] = from_bits((uint32_t)b);
        if (n == BATCH || b + stride > 0xffffffffull) {
            if (is_erf)
                for (int i = 0; i < n; i++) out[i] = opgen_erff(in[i]); /* (the loop vectorises) */
            else if (is_tanh)
                for (int i = 0; i < n; i++) out[i] = opgen_tanhf(in[i]);
            else if (is_log)
                for (int i = 0; i < n; i++) out[i] = opgen_logf(in[i]);
            else
                for (int i = 0; i < n; i++) out[i] = opgen_expf(in[i]);
            for (int i = 0; i < n; i++) {
                if (isnan(in[i])) continue;
                const double x = (double)in[i];
                if (is_log && signbit(in[i]) && in[i] != 0.0f) { /* log(x < 0) is NaN */
                    bad_negative += !isnan(out[i]);
                    continue;
                }
                const double e = ulps(out[i], is_erf ? erf(x) : is_tanh ? tanh(x) : is_log ? log(x) : exp(x));
                if (e > worst) {
                    worst = e;
                    memcpy(&worst_bits, &in[i], sizeof worst_bits);
                }
            }
            checked += (uint64_t)n;
            n = 0;
        }
    }
    int special = bad_negative;
    const float nan_ = from_bits(0x7fc00000u);
    if (is_log) {
        special += !isnan(opgen_logf(nan_)) || !isnan(opgen_logf(-1.0f)) || !isnan(opgen_logf(-INFINITY));
        special += opgen_logf(INFINITY) != INFINITY;
        special += opgen_logf(0.0f) != -INFINITY || opgen_logf(-0.0f) != -INFINITY;
        special += opgen_logf(1.0f) != 0.0f || signbit(opgen_logf(1.0f));
        special += opgen_logf(from_bits(1u)) != logf(from_bits(1u)); /* the smallest subnormal */
        printf("%.4f %08x %llu %d\n", worst + 0.5, worst_bits, (unsigned long long)checked, special);
        return 0;
    }
    if (is_erf || is_tanh) {
        float (*f)(float) = is_erf ? opgen_erff : opgen_tanhf;
        special += !isnan(f(nan_));
        special += f(INFINITY) != 1.0f || f(-INFINITY) != -1.0f;
        special += f(0.0f) != 0.0f || !signbit(f(-0.0f));
        printf("%.4f %08x %llu %d\n", worst + 0.5, worst_bits, (unsigned long long)checked, special);
        return 0;
    }
    special += !isnan(opgen_expf(nan_));
    special += opgen_expf(INFINITY) != INFINITY;
    special += opgen_expf(-INFINITY) != 0.0f;
    special += opgen_expf(0.0f) != 1.0f || opgen_expf(-0.0f) != 1.0f;
    special += opgen_expf(88.72283935546875f) != expf(88.72283935546875f);
    special += opgen_expf(88.7228469848632812f) != INFINITY;
    special += opgen_expf(-104.0f) != 0.0f;
    printf("%.4f %08x %llu %d\n", worst + 0.5, worst_bits, (unsigned long long)checked, special);
    return 0;
}
