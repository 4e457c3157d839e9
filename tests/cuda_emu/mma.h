/* mma.h — the CPU model of the nvcuda::wmma subset the generated kernels use (TF32 16x16x8).
 *
 * A fragment is warp-collective on a GPU, each lane holding an unspecified part of the tile. Here
 * every thread holds the whole A/B tile (loads only read), while each lane owns 8 consecutive
 * accumulator elements (row-major e with (e / 8) % 32 == lane; not the e % 32 a kernel's lane loop
 * would use): mma_sync computes only those, store_matrix_sync writes only those. Reading another
 * lane's stored elements therefore needs a __syncwarp() (or a barrier), exactly as on the GPU,
 * and ThreadSanitizer reports it when one is missing. Products and sums
 * are f32 in increasing k (the tensor cores' internal order differs: only the oracle tolerance
 * is assumed, never these bits). */
#ifndef OPGEN_CUDA_EMU_MMA_H
#define OPGEN_CUDA_EMU_MMA_H

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cuda_emu.h"

namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
namespace precision {
struct tf32 {};
}  // namespace precision
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K>
struct fragment_shape;
template <int M, int N, int K>
struct fragment_shape<matrix_a, M, N, K> {
    static const int rows = M, cols = K;
};
template <int M, int N, int K>
struct fragment_shape<matrix_b, M, N, K> {
    static const int rows = K, cols = N;
};
template <int M, int N, int K>
struct fragment_shape<accumulator, M, N, K> {
    static const int rows = M, cols = N;
};

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
    static const int rows = fragment_shape<Use, M, N, K>::rows, cols = fragment_shape<Use, M, N, K>::cols;
    static const int num_elements = rows * cols;
    float x[rows * cols];
};

/* PTX cvt.rna.tf32.f32: round to 10 explicit mantissa bits, ties away from zero */
inline float __float_to_tf32(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0x7f800000u) return f;
    u = (u + 0x1000u) & ~0x1fffu;
    memcpy(&f, &u, 4);
    return f;
}

template <typename Use, int M, int N, int K, typename T, typename L>
inline void load_matrix_sync(fragment<Use, M, N, K, T, L> &a, const float *p, unsigned ldm) {
    for (int r = 0; r < a.rows; r++)
        for (int c = 0; c < a.cols; c++)
            a.x[r * a.cols + c] = std::is_same<L, col_major>::value ? p[(size_t)c * ldm + r] : p[(size_t)r * ldm + c];
}

template <int M, int N, int K, typename T>
inline void fill_fragment(fragment<accumulator, M, N, K, T> &a, float v) {
    for (int e = 0; e < a.num_elements; e++) a.x[e] = v;
}

/* the lane owning accumulator element e (row-major) */
inline bool emu_owns(int e) { return ((e >> 3) & 31) == (int)(threadIdx.x & 31u); }

template <int M, int N, int K, typename TA, typename LA, typename TB, typename LB, typename T>
inline void mma_sync(fragment<accumulator, M, N, K, T> &d, const fragment<matrix_a, M, N, K, TA, LA> &a,
                     const fragment<matrix_b, M, N, K, TB, LB> &b, const fragment<accumulator, M, N, K, T> &c) {
    for (int e = 0; e < M * N; e++) {
        if (!emu_owns(e)) continue;
        const int r = e / N, col = e % N;
        float s = c.x[e];
        for (int q = 0; q < K; q++) s += a.x[r * K + q] * b.x[q * N + col];
        d.x[e] = s;
    }
}

template <int M, int N, int K, typename T>
inline void store_matrix_sync(float *p, const fragment<accumulator, M, N, K, T> &a, unsigned ldm, layout_t layout) {
    for (int e = 0; e < M * N; e++) {
        if (!emu_owns(e)) continue;
        const int r = e / N, c = e % N;
        p[layout == mem_row_major ? (size_t)r * ldm + c : (size_t)c * ldm + r] = a.x[e];
    }
}
}  // namespace wmma
}  // namespace nvcuda

#endif /* OPGEN_CUDA_EMU_MMA_H */
