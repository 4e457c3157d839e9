/* The runtime's opgen_prefetch_share (sched.prefetch_share: tile-transposes' next tile, a share of
 * its lines an iteration of the row loop) with its hints recorded instead of issued: for blocks
 * of several shapes (row lengths within, at and across line boundaries; row strides positive,
 * negative and shorter than a line's worth of rows) and several numbers of shares, the hints of
 * shares 0 .. parts-1 together name every 64-byte line of the block exactly once, in order (row
 * by row, each row's lines from its start), none outside the block's rows; out-of-range
 * arguments (part < 0 or >= parts, no rows, no bytes, no shares, a line count past int64) give none.
 * Prints: checked mismatches. */
#include <stdint.h>
#include <stdio.h>

static int64_t hint[1 << 16];
static int n_hints;
#define OPGEN_SHARE_HINT(p, off) ((void)(p), n_hints < (1 << 16) ? (void)(hint[n_hints++] = (int64_t)(off)) : (void)0)
#include "opgen_rt.h"

int main(void) {
    const int64_t rows_of[] = {1, 2, 7, 16, 128};
    const int64_t bytes_of[] = {1, 63, 64, 65, 200, 2048};
    const int64_t stride_of[] = {4096, -4096, 2048, 32};
    const int64_t parts_of[] = {1, 3, 16, 512, 5000};
    long long checked = 0, bad = 0;
    for (size_t a = 0; a < sizeof rows_of / sizeof *rows_of; a++)
        for (size_t b = 0; b < sizeof bytes_of / sizeof *bytes_of; b++)
            for (size_t c = 0; c < sizeof stride_of / sizeof *stride_of; c++)
                for (size_t d = 0; d < sizeof parts_of / sizeof *parts_of; d++) {
                    const int64_t rows = rows_of[a], bytes = bytes_of[b], stride = stride_of[c], parts = parts_of[d];
                    n_hints = 0;
                    for (int64_t part = 0; part < parts; part++) opgen_prefetch_share(NULL, stride, rows, bytes, part, parts);
                    const int64_t per_row = (bytes + 63) / 64;
                    if (n_hints != rows * per_row) bad++;
                    for (int64_t r = 0, k = 0; r < rows && k < n_hints; r++)
                        for (int64_t l = 0; l < per_row && k < n_hints; l++, k++, checked++)
                            if (hint[k] != r * stride + l * 64 || l * 64 >= bytes) bad++;
                    n_hints = 0; /* (out of range: nothing) */
                    opgen_prefetch_share(NULL, stride, rows, bytes, -1, parts);
                    opgen_prefetch_share(NULL, stride, rows, bytes, parts, parts);
                    opgen_prefetch_share(NULL, stride, 0, bytes, 0, parts);
                    opgen_prefetch_share(NULL, stride, rows, 0, 0, parts);
                    opgen_prefetch_share(NULL, stride, rows, bytes, 0, 0);
                    opgen_prefetch_share(NULL, stride, INT64_MAX, bytes, 0, 1000); /* (its line count overflows) */
                    if (n_hints) bad++;
                    checked++;
                }
    printf("%lld %lld\n", checked, bad);
    return 0;
}
