/* cuda_emu.h — a CPU model of the small CUDA subset opgen's generated kernels use, so that they
 * can RUN (and be checked against the oracle) on a machine without a GPU. Test harness only.
 *
 * A launch runs its blocks one after another; each block runs OPGEN's 256 (blockDim) threads as
 * real std::threads, so barriers, block reductions, warp shuffles and races are real:
 *   __syncthreads()       a barrier over the block (a thread that returns drops out, as on
 *                         Volta+ GPUs, where exited threads no longer count);
 *   __syncwarp()          a barrier over the warp (opgen_emu_barrier: std::barrier's semantics);
 *   __shfl_down_sync      an exchange through a per-warp slot array between two warp barriers;
 *   __shared__            static storage (one block at a time runs, so it is the block's);
 *   atomics               __atomic builtins; device memory is host memory;
 *   nvcuda::wmma          see mma.h (lane-owned accumulator elements).
 * `kernel<<<grid, block, shmem, stream>>>(args)` is rewritten by tests/cuda_emu/emu_build.py into
 * `opgen_emu_launch(grid, block, shmem, [&] { kernel(args); })` before compiling with g++. Run under
 * ThreadSanitizer, missing barriers show up as data races. */
#ifndef OPGEN_CUDA_EMU_H
#define OPGEN_CUDA_EMU_H

#include <algorithm>
#include <atomic>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <math.h>
#include <memory>
#include <numeric>
#include <optional>
#include <stdint.h>
#include <string.h>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(n)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

struct dim3 {
    unsigned int x = 1, y = 1, z = 1;
};
inline thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

/* A barrier over a block's (or a warp's) threads, with std::barrier's arrive_and_wait and
 * arrive_and_drop and an optional completion run by the last thread to arrive, while the others
 * wait. A waiting thread sleeps on a futex at once: std::barrier spins and yields first, and with a
 * block's 256 threads on a core or two (one busy with another test, as in CI) the yields starved
 * the threads it waited for: a launch of 6000 barrier phases took 2 s alone and 13 s beside one
 * busy core with std::barrier, 4 s either way with this one (also 12 s when it yields 4 times first). */
class opgen_emu_barrier {
  public:
    explicit opgen_emu_barrier(std::ptrdiff_t count, std::function<void()> completion = {})
        : expected_(count), left_(count), completion_(std::move(completion)) {}
    opgen_emu_barrier(const opgen_emu_barrier &) = delete;
    opgen_emu_barrier &operator=(const opgen_emu_barrier &) = delete;

    void arrive_and_wait() {
        const uint32_t phase = phase_.load(std::memory_order_acquire);  // (cannot advance before we arrive)
        if (left_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
            advance();
            return;
        }
        while (phase_.load(std::memory_order_acquire) == phase)
            syscall(SYS_futex, &phase_, FUTEX_WAIT_PRIVATE, phase, nullptr, nullptr, 0);
    }
    /* arrive, and leave the barrier's later phases (a thread that returned) */
    void arrive_and_drop() {
        expected_.fetch_sub(1, std::memory_order_relaxed);  // (ordered before the release below)
        if (left_.fetch_sub(1, std::memory_order_acq_rel) == 1) advance();
    }

  private:
    void advance() {
        if (completion_) completion_();
        left_.store(expected_.load(std::memory_order_relaxed), std::memory_order_relaxed);
        phase_.fetch_add(1, std::memory_order_release);
        syscall(SYS_futex, &phase_, FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr, nullptr, 0);
    }
    std::atomic<std::ptrdiff_t> expected_, left_;
    std::atomic<uint32_t> phase_{0};
    std::function<void()> completion_;
};
inline thread_local opgen_emu_barrier *opgen_emu_block = nullptr;
inline thread_local opgen_emu_barrier *opgen_emu_warp = nullptr;
inline thread_local uint64_t *opgen_emu_slots = nullptr;
inline thread_local unsigned char *opgen_emu_smem = nullptr;

/* dynamic shared memory: a fresh buffer per block, filled with garbage (no kernel may rely on
 * its initial contents) */
#define OPGEN_HOST_MODEL 1
inline unsigned char *opgen_dyn_smem(void) { return opgen_emu_smem; }

inline void __syncthreads() { opgen_emu_block->arrive_and_wait(); }
/* the whole warp (every generated __syncwarp() is reached by all 32 lanes) */
inline void __syncwarp(unsigned int = 0xffffffffu) { opgen_emu_warp->arrive_and_wait(); }

template <typename T>
inline T __shfl_down_sync(unsigned int, T v, int offset) {
    static_assert(sizeof(T) <= 8, "shuffle of a type wider than 8 bytes");
    const unsigned lane = threadIdx.x & 31u;
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof(T));
    opgen_emu_slots[lane] = bits;
    opgen_emu_warp->arrive_and_wait();
    const unsigned src = lane + (unsigned)offset < 32u ? lane + (unsigned)offset : lane;
    uint64_t got = opgen_emu_slots[src];
    opgen_emu_warp->arrive_and_wait();
    T r;
    memcpy(&r, &got, sizeof(T));
    return r;
}

inline int atomicAdd(int *p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
inline unsigned int atomicAdd(unsigned int *p, unsigned int v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v) {
    return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
inline unsigned int atomicCAS(unsigned int *p, unsigned int cmp, unsigned int v) {
    __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return cmp;
}

/* Run a launch: blocks in order, each block's threads concurrently. The launch's `block` threads
 * are made once and run every block in turn: between two blocks they all wait on `next`, whose
 * completion (run while every thread waits) gives the next block fresh barriers (a thread that
 * returned early dropped out of the last ones) and fresh garbage in its dynamic shared memory. */
inline void opgen_emu_launch(unsigned int grid, unsigned int block, size_t shmem, const std::function<void()> &body) {
    if (grid == 0 || block == 0) return;
    const unsigned int warps = (block + 31) / 32;
    const size_t smem_bytes = (shmem + 255) / 256 * 256 + 256;
    std::unique_ptr<unsigned char, decltype(&free)> sm((unsigned char *)aligned_alloc(256, smem_bytes), &free);
    std::vector<uint64_t> slots((size_t)warps * 32);
    std::optional<opgen_emu_barrier> bar;
    std::vector<std::optional<opgen_emu_barrier>> wbar(warps);
    auto fresh = [&] {
        memset(sm.get(), 0xA5, smem_bytes);
        bar.emplace((std::ptrdiff_t)block);
        for (unsigned int w = 0; w < warps; w++) wbar[w].emplace((std::ptrdiff_t)std::min(32u, block - 32 * w));
    };
    fresh();
    opgen_emu_barrier next((std::ptrdiff_t)block, fresh);
    std::vector<std::thread> ts;
    ts.reserve(block);
    for (unsigned int t = 0; t < block; t++)
        ts.emplace_back([&, t] {
            threadIdx = {t, 0, 0};
            blockDim = {block, 1, 1};
            gridDim = {grid, 1, 1};
            opgen_emu_slots = &slots[(size_t)(t / 32) * 32];
            opgen_emu_smem = sm.get();
            for (unsigned int b = 0; b < grid; b++) {
                blockIdx = {b, 0, 0};
                opgen_emu_block = &*bar;
                opgen_emu_warp = &*wbar[t / 32];
                body();
                opgen_emu_warp->arrive_and_drop();
                opgen_emu_block->arrive_and_drop();
                next.arrive_and_wait();
            }
        });
    for (auto &th : ts) th.join();
}

/* ---- the runtime API subset ---- */
typedef struct CUstream_st *cudaStream_t;
typedef enum { cudaSuccess = 0, cudaErrorMemoryAllocation = 2 } cudaError_t;
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16 };

inline cudaError_t cudaGetLastError(void) { return cudaSuccess; }
inline const char *cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "emulated error"; }
inline cudaError_t cudaGetDevice(int *d) {
    *d = 0;
    return cudaSuccess;
}
/* one "SM": grids stay small (at most 16 blocks), so emulated launches are quick */
inline cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr, int) {
    *v = 1;
    return cudaSuccess;
}
template <typename T>
inline cudaError_t cudaMallocAsync(T **p, size_t n, cudaStream_t) {
    *p = (T *)malloc(n ? n : 1);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
inline cudaError_t cudaFreeAsync(void *p, cudaStream_t) {
    free(p);
    return cudaSuccess;
}
inline cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t = nullptr) {
    memset(p, v, n);
    return cudaSuccess;
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
template <typename T>
inline cudaError_t cudaGetSymbolAddress(void **p, T &sym) {
    *p = (void *)&sym;
    return cudaSuccess;
}
template <typename T>
inline cudaError_t cudaMemcpyFromSymbol(void *dst, T &sym, size_t n) {
    memcpy(dst, &sym, n);
    return cudaSuccess;
}
template <typename T>
inline cudaError_t cudaMemcpyToSymbol(T &sym, const void *src, size_t n) {
    memcpy(&sym, src, n);
    return cudaSuccess;
}

/* ---- cuda_fp16.h subset ---- */
struct __half {
    uint16_t bits;
};
inline float __uint_as_float(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
inline uint32_t __float_as_uint(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
inline __half __ushort_as_half(uint16_t h) { return __half{h}; }
inline uint16_t __half_as_ushort(__half h) { return h.bits; }
inline float __half2float(__half h) {
    _Float16 x;
    memcpy(&x, &h.bits, 2);
    return (float)x;
}
inline __half __float2half_rn(float f) {
    _Float16 x = (_Float16)f;
    __half h;
    memcpy(&h.bits, &x, 2);
    return h;
}

/* ---- cub::DeviceRadixSort::SortPairs: a stable sort on key bits [begin, end) ---- */
namespace cub {
struct DeviceRadixSort {
    template <typename K, typename V>
    static cudaError_t SortPairs(void *tmp, size_t &bytes, const K *kin, K *kout, const V *vin, V *vout, int n,
                                 int begin = 0, int end = (int)sizeof(K) * 8, cudaStream_t = nullptr) {
        if (!tmp) {
            bytes = 16;
            return cudaSuccess;
        }
        const uint64_t mask = (end - begin >= 64 ? ~0ull : ((1ull << (end - begin)) - 1)) << begin;
        std::vector<int> p((size_t)n);
        std::iota(p.begin(), p.end(), 0);
        std::stable_sort(p.begin(), p.end(), [&](int a, int b) {
            return ((uint64_t)kin[a] & mask) < ((uint64_t)kin[b] & mask);
        });
        for (int i = 0; i < n; i++) {
            kout[i] = kin[p[(size_t)i]];
            vout[i] = vin[p[(size_t)i]];
        }
        return cudaSuccess;
    }
};
}  // namespace cub

#endif /* OPGEN_CUDA_EMU_H */
