// A CPU emulation of the CUDA execution model, enough to run leapfmm's kernels as C++ (the
// CI check without a GPU): the blocks of a launch run one after another, each block's threads
// as fibers (ucontext) on the calling thread, `__shared__` variables are shared by them, and
// `__syncthreads` hands over to the next fiber until every thread of the block has reached it.
// A barrier that some of a block's threads never reach (they returned) stops the program
// with a message: on a GPU that is undefined behaviour. Fibers rather than threads: a launch
// costs microseconds, not a thread per GPU thread, and the interleaving is the same every run.
#pragma once
#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <ucontext.h>
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
// Per host thread: a program may launch from several threads (the emulated driver takes
// one launch at a time, since `__shared__` variables are static).
inline thread_local uint3 thread_idx{0, 0, 0};
inline thread_local uint3 block_idx{0, 0, 0};
inline thread_local dim3 block_dim;
inline thread_local dim3 grid_dim;

// One GPU thread of the running block: its context and stack (kept for the next launch).
struct Fiber {
    static constexpr size_t STACK_BYTES = 256 << 10;
    ucontext_t context;
    std::unique_ptr<char[]> stack{new char[STACK_BYTES]};
    bool done = false;
};

struct Block {
    std::vector<std::unique_ptr<Fiber>> fibers;
    ucontext_t scheduler;
    Fiber* running = nullptr;
    const std::function<void()>* body = nullptr;
};
inline thread_local Block block;

inline void fiber_entry() {
    (*block.body)();
    block.running->done = true;
    // Returning resumes `scheduler` (uc_link).
}

// Runs `body` as `threads` threads in each of `blocks` blocks, in block order.
inline void run_blocks(unsigned blocks, unsigned threads, const std::function<void()>& body) {
    Block& b = block;
    while (b.fibers.size() < threads) b.fibers.push_back(std::make_unique<Fiber>());
    b.body = &body;
    for (unsigned i = 0; i < blocks; ++i) {
        block_idx = uint3{i, 0, 0};
        for (unsigned t = 0; t < threads; ++t) {
            Fiber& f = *b.fibers[t];
            getcontext(&f.context);
            f.context.uc_stack.ss_sp = f.stack.get();
            f.context.uc_stack.ss_size = Fiber::STACK_BYTES;
            f.context.uc_link = &b.scheduler;
            makecontext(&f.context, fiber_entry, 0);
            f.done = false;
        }
        // Each round runs every thread to its next barrier or its end.
        for (unsigned finished = 0; finished < threads;) {
            unsigned waiting = 0;
            for (unsigned t = 0; t < threads; ++t) {
                Fiber& f = *b.fibers[t];
                if (f.done) continue;
                thread_idx = uint3{t, 0, 0};
                b.running = &f;
                swapcontext(&b.scheduler, &f.context);
                if (f.done) {
                    ++finished;
                } else {
                    ++waiting;
                }
            }
            if (waiting > 0 && finished > 0) {
                std::fprintf(stderr,
                             "emulation: in block %u, %u threads wait at __syncthreads that %u "
                             "returned threads never reach\n",
                             i, waiting, finished);
                std::abort();
            }
        }
    }
    b.running = nullptr;
}
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

inline void __syncthreads() { swapcontext(&emu::block.running->context, &emu::block.scheduler); }
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
// Integer atomics in shared or global memory (fibers never interleave within one, but the
// atomic forms cost nothing here).
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
    emu::run_blocks(grid, block, [&] { kernel(args...); });
}
