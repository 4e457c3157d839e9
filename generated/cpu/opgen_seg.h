/* opgen_seg.h — segment tables of scatter-adds and index counts (sched.segments). Generated. */
#ifndef OPGEN_SEG_H
#define OPGEN_SEG_H

#include <stdint.h>
#include <string.h>

/* A segment table describes n indices in [0, rows) sorted by value (ties by position):
 * - dense layout (rows <= 4 n + 4096): start[0..rows], rows + 1 words;
 * - sparse layout (rows >> n): the n sorted indices (start(v) = first position whose index
 *   is >= v, by bisection), then 2n words of sorting scratch: 3n words.
 * Both sizes are saturated at INT64_MAX (a workspace that large is refused, never wrapped). */
static inline int opgen_seg_dense(int64_t rows, int64_t n) {
    return rows <= 4096 || (rows - 4096) / 4 <= n;
}
static inline int64_t opgen_seg_words(int64_t rows, int64_t n) {
    if (opgen_seg_dense(rows, n)) return rows < INT64_MAX ? rows + 1 : INT64_MAX;
    return n <= INT64_MAX / 3 ? 3 * n : INT64_MAX;
}
/* The first position of segment v (0 <= v <= rows; v == rows gives n). */
static inline int64_t opgen_seg_start(const int64_t *seg, int64_t v, int64_t rows, int64_t n) {
    if (opgen_seg_dense(rows, n)) return seg[v];
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (seg[mid] < v) lo = mid + 1; else hi = mid;
    }
    return lo;
}

/* Build the table and `order` for n range-checked indices: a stable counting sort (dense) or
 * a stable LSD radix sort on the index bits (sparse), so positions with equal indices stay in
 * increasing order either way. */
static inline void opgen_seg_build(const int64_t *idx, int64_t n, int64_t rows, int64_t *seg, int64_t *order) {
    if (opgen_seg_dense(rows, n)) {
        int64_t *start = seg;
        for (int64_t v = 0; v <= rows; v++) start[v] = 0;
        for (int64_t i = 0; i < n; i++) start[idx[i] + 1]++;
        for (int64_t v = 0; v < rows; v++) start[v + 1] += start[v];
        /* fill each segment from its end backwards: positions inside a segment increase with i */
        for (int64_t i = n - 1; i >= 0; i--) order[--start[idx[i] + 1]] = i;
        /* start[v + 1] now holds the beginning of segment v */
        for (int64_t v = 0; v < rows; v++) start[v] = start[v + 1];
        start[rows] = n;
        return;
    }
    int64_t *k0 = seg, *k1 = seg + n, *v0 = order, *v1 = seg + 2 * n;
    for (int64_t i = 0; i < n; i++) {
        k0[i] = idx[i];
        v0[i] = i;
    }
    int bits = 0;
    while (bits < 63 && ((int64_t)1 << bits) < rows) bits++;
    for (int shift = 0; shift < bits; shift += 8) {
        int64_t count[257];
        for (int d = 0; d <= 256; d++) count[d] = 0;
        for (int64_t i = 0; i < n; i++) count[((k0[i] >> shift) & 255) + 1]++;
        for (int d = 0; d < 256; d++) count[d + 1] += count[d];
        for (int64_t i = 0; i < n; i++) {
            const int64_t p = count[(k0[i] >> shift) & 255]++;
            k1[p] = k0[i];
            v1[p] = v0[i];
        }
        int64_t *t = k0;
        k0 = k1;
        k1 = t;
        t = v0;
        v0 = v1;
        v1 = t;
    }
    if (k0 != seg) { /* an odd number of passes: the result is in the scratch halves */
        memcpy(seg, k0, sizeof(int64_t) * (size_t)n);
        memcpy(order, v0, sizeof(int64_t) * (size_t)n);
    }
}

#endif /* OPGEN_SEG_H */
