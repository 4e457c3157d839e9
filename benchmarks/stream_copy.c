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
 * one contiguous block per OpenMP thread read as READ_STREAMS streams side by side (runs of
 * READ_RUN lines, a line of each run in turn, as a kernel summing 8 rows at a time reads them): the
 * read-only reference. A pass that reads and writes nothing is bound by the misses a core keeps in
 * flight: on the Zen 5 VM one stream a thread read at 70-75% of the streaming copy's bandwidth,
 * 8 runs of 64 KiB side by side 10-20% faster, 8 streams an eighth of the block apart no faster
 * than one (2 threads, 256 MiB, GB/s in one window: 24.8, 29.7, 25.1). */
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

#if !defined(__AVX512F__)
static float line_sum(const float *p) { /* (the 16 floats of a line) */
    float part = 0.0f;
    for (int l = 0; l < 16; l++) part += p[l];
    return part;
}
#endif
#define READ_STREAMS 8
#define READ_RUN 1024 /* lines of a stream before the next READ_STREAMS runs (64 KiB) */
double stream_read(const void *src, size_t n) {
    const float *s = (const float *)src;
    const size_t lines = n / 64;
    double total = 0.0;
    #pragma omp parallel reduction(+ : total)
    {
        const size_t t = (size_t)omp_get_thread_num(), nt = (size_t)omp_get_num_threads();
        const size_t lo = lines * t / nt, hi = lines * (t + 1) / nt;
        size_t c = lo; /* (the start of the next READ_STREAMS runs) */
#if defined(__AVX512F__)
        __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
        for (; c + READ_STREAMS * READ_RUN <= hi; c += READ_STREAMS * READ_RUN) /* (four chains: the adds keep up) */
            for (size_t j = 0; j < READ_RUN; j++)
                for (size_t k = 0; k < READ_STREAMS; k++)
                    acc[k % 4] = _mm512_add_ps(acc[k % 4], _mm512_load_ps(s + 16 * (c + k * READ_RUN + j)));
        for (size_t i = c; i < hi; i++) /* (the lines left over) */
            acc[i % 4] = _mm512_add_ps(acc[i % 4], _mm512_load_ps(s + 16 * i));
        total += (double)_mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
#else
        for (; c + READ_STREAMS * READ_RUN <= hi; c += READ_STREAMS * READ_RUN)
            for (size_t j = 0; j < READ_RUN; j++)
                for (size_t k = 0; k < READ_STREAMS; k++) total += line_sum(s + 16 * (c + k * READ_RUN + j));
        for (size_t i = c; i < hi; i++) total += line_sum(s + 16 * i);
#endif
    }
    return total;
}
