// A CPU emulation of the CUDA execution model, enough to run leapfmm's kernels as C++ (the
// CI check without a GPU): every block runs its threads as real threads, `__shared__`
// variables are shared by them (blocks run one after another), and `__syncthreads` is a
// barrier among the block's threads. Index variables are thread-local.
#pragma once
#include <algorithm>
#include <atomic>
#include <barrier>
#include <bit>
#include <cmath>
#include <thread>
#include <vector>

struct uint3 {
    unsigned x, y, z;
};

struct alignas(16) float4 {
    float x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }

struct alignas(16) double2 {
    double x, y;
};
inline double2 make_double2(double x, double y) { return double2{x, y}; }

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

namespace emu {
inline thread_local uint3 thread_idx{0, 0, 0};
inline thread_local uint3 block_idx{0, 0, 0};
inline dim3 block_dim;
inline dim3 grid_dim;
inline std::barrier<>* block_barrier = nullptr;
}  // namespace emu

#define threadIdx (emu::thread_idx)
#define blockIdx (emu::block_idx)
#define blockDim (emu::block_dim)
#define gridDim (emu::grid_dim)
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __shared__ static
#define __constant__ const
// Register limits are the GPU compiler's business.
#define __launch_bounds__(...)

inline void __syncthreads() { emu::block_barrier->arrive_and_wait(); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
// Round-to-nearest product and sum, never fused (x86-64 without FMA flags never fuses).
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline float __double2float_rn(double x) { return static_cast<float>(x); }
inline int __float_as_int(float x) { return std::bit_cast<int>(x); }
inline float __int_as_float(int x) { return std::bit_cast<float>(x); }
inline long long __double_as_longlong(double x) { return std::bit_cast<long long>(x); }
inline double __longlong_as_double(long long x) { return std::bit_cast<double>(x); }
// Integer atomics in shared or global memory: the block's threads really run at once here.
inline unsigned atomicAdd(unsigned* address, unsigned v) {
    return std::atomic_ref<unsigned>(*address).fetch_add(v);
}
inline unsigned long long atomicAdd(unsigned long long* address, unsigned long long v) {
    return std::atomic_ref<unsigned long long>(*address).fetch_add(v);
}
inline unsigned long long atomicMax(unsigned long long* address, unsigned long long v) {
    std::atomic_ref<unsigned long long> a(*address);
    unsigned long long old = a.load();
    while (old < v && !a.compare_exchange_weak(old, v)) {
    }
    return old;
}
using std::fmax;
using std::fmin;
using std::isfinite;
using std::max;
using std::min;

// Runs `kernel<<<grid, block>>>(args...)` (1-D grids and blocks).
template <class... P, class... A>
void launch(unsigned grid, unsigned block, void (*kernel)(P...), A... args) {
    emu::grid_dim = dim3(grid);
    emu::block_dim = dim3(block);
    for (unsigned b = 0; b < grid; ++b) {
        std::barrier<> barrier(block);
        emu::block_barrier = &barrier;
        std::vector<std::thread> threads;
        threads.reserve(block);
        for (unsigned t = 0; t < block; ++t) {
            threads.emplace_back([=] {
                emu::thread_idx = uint3{t, 0, 0};
                emu::block_idx = uint3{b, 0, 0};
                kernel(args...);
            });
        }
        for (auto& th : threads) th.join();
    }
}
