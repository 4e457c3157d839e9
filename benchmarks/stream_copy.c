/* The copy benchmarks/timing.py's copier also times: a STREAM-style copy whose stores go around
 * the caches (streaming stores: a destination line is written whole, never read first), split
 * in one contiguous block per OpenMP thread. A numpy copy or PyTorch's copy_ store through the
 * caches, reading each destination line before writing it (a third of the traffic, uncounted):
 * on the Zen 5 VM they copied at 40-45 GB/s where this copy moved 55-65, so a bandwidth
 * percentage against them alone flattered every kernel with streaming stores.
 *
 * stream_copy(src, dst, n): n bytes, a multiple of 64; src and dst 64-byte aligned.
 *
 * stream_read(src, n): the sum of the n / 4 floats at src (n a multiple of 64, src 64-byte aligned),
 * read in one contiguous block per OpenMP thread, each line prefetched into L2 2 KiB ahead: the
 * read-only reference (a pass that reads and writes nothing is bound by the misses a core keeps in
 * flight; on the Zen 5 VM it reached 70-75% of the streaming copy's bandwidth). */
#include <omp.h>
#include <stddef.h>
#include <string.h>
#if defined(__AVX512F__) || defined(__AVX__)
#include <immintrin.h>
#endif

void stream_copy(const void *src, void *dst, size_t n) {
    const char *s = (const char *)src;
    char *d = (char *)dst;
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i += 64) {
#if defined(__AVX512F__)
        _mm512_stream_si512((void *)(d + i), _mm512_load_si512((const void *)(s + i)));
#elif defined(__AVX__)
        _mm256_stream_si256((__m256i *)(void *)(d + i), _mm256_load_si256((const __m256i *)(const void *)(s + i)));
        _mm256_stream_si256((__m256i *)(void *)(d + i + 32), _mm256_load_si256((const __m256i *)(const void *)(s + i + 32)));
#else
        memcpy(d + i, s + i, 64);
#endif
    }
#if defined(__AVX512F__) || defined(__AVX__)
    _mm_sfence();
#endif
}

double stream_read(const void *src, size_t n) {
    const float *s = (const float *)src;
    const size_t lines = n / 64;
    double total = 0.0;
    #pragma omp parallel reduction(+ : total)
    {
        const size_t t = (size_t)omp_get_thread_num(), nt = (size_t)omp_get_num_threads();
        const size_t lo = lines * t / nt, hi = lines * (t + 1) / nt;
#if defined(__AVX512F__)
        __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
        for (size_t i = lo; i < hi; i++) { /* (four chains: the adds keep up with memory) */
            __builtin_prefetch((const char *)(s + 16 * i) + 2048, 0, 1); /* (never faults past the end) */
            acc[i % 4] = _mm512_add_ps(acc[i % 4], _mm512_load_ps(s + 16 * i));
        }
        total += (double)_mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
#else
        for (size_t i = lo; i < hi; i++) {
            __builtin_prefetch((const char *)(s + 16 * i) + 2048, 0, 1);
            float part = 0.0f;
            for (int l = 0; l < 16; l++) part += s[16 * i + l];
            total += part;
        }
#endif
    }
    return total;
}
