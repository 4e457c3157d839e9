/* The copy benchmarks/timing.py's copier also times: a STREAM-style copy whose stores go around
 * the caches (streaming stores: a destination line is written whole, never read first), split
 * in one contiguous block per OpenMP thread. A numpy copy or PyTorch's copy_ store through the
 * caches, reading each destination line before writing it (a third of the traffic, uncounted):
 * on the Zen 5 VM they copied at 40-45 GB/s where this copy moved 55-65, so a bandwidth
 * percentage against them alone flattered every kernel with streaming stores.
 *
 * stream_copy(src, dst, n): n bytes, a multiple of 64; src and dst 64-byte aligned. */
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
