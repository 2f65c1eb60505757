// A CPU emulation of the CUDA execution model, enough to run leapfmm's kernels as C++ (the
// CI check without a GPU): the blocks of a launch run one after another (in the order
// LEAPFMM_EMULATED_SCHEDULE names, see `schedule`), each block's threads as fibers on the
// calling thread (switched by a few instructions of x86-64 assembly, or by
// ucontext elsewhere), `__shared__` variables are shared by them, and
// `__syncthreads` hands over to the next fiber until every thread of the block has reached it.
// A barrier that some of a block's threads never reach (they returned) stops the program
// with a message: on a GPU that is undefined behaviour. Fibers rather than threads: a launch
// costs microseconds, not a thread per GPU thread, and the interleaving is the same every run.
#pragma once
#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <sys/mman.h>
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

// A fiber's saved state: where to resume it.
#if defined(__x86_64__)
struct Context {
    void* sp = nullptr;
};

// Saves the callee-saved registers and the floating-point control words on the current
// stack, stores its pointer in *save and resumes the stack saved at `load` (all a switch
// between two calls of it needs: the System V ABI has the caller save everything else).
// Defined here, so a program includes this header in one translation unit only.
extern "C" void emu_switch(void** save, void* load);
asm(R"(
    .text
    .p2align 4
    .globl emu_switch
    .hidden emu_switch
    .type emu_switch, @function
emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_switch, .-emu_switch
)");

inline void switch_to(Context& save, Context& resume) { emu_switch(&save.sp, resume.sp); }

// Makes `c` start `entry` (which never returns) on the stack [stack, stack + bytes): the
// frame emu_switch pops, with this thread's control words and `entry` as its return address.
inline void prepare(Context& c, char* stack, size_t bytes, void (*entry)()) {
    const uintptr_t top = (reinterpret_cast<uintptr_t>(stack) + bytes) & ~uintptr_t(15);
    uint64_t* slot = reinterpret_cast<uint64_t*>(top);
    uint16_t fcw;
    asm volatile("fnstcw %0" : "=m"(fcw));
    slot[-1] = 0;  // entry's own return address (so its stack is aligned as after a call)
    slot[-2] = reinterpret_cast<uint64_t>(entry);
    for (int k = 3; k <= 8; ++k) slot[-k] = 0;  // rbp, rbx, r12 to r15
    slot[-9] = uint64_t(__builtin_ia32_stmxcsr()) | (uint64_t(fcw) << 32);
    c.sp = &slot[-9];
}
#else
struct Context {
    ucontext_t uc;
};

inline void switch_to(Context& save, Context& resume) { swapcontext(&save.uc, &resume.uc); }

inline void prepare(Context& c, char* stack, size_t bytes, void (*entry)()) {
    getcontext(&c.uc);
    c.uc.uc_stack.ss_sp = stack;
    c.uc.uc_stack.ss_size = bytes;
    c.uc.uc_link = nullptr;
    makecontext(&c.uc, entry, 0);
}
#endif

// One GPU thread of the running block: its context and stack (kept for the next launch),
// with an inaccessible page below the stack, so that an overflow faults.
struct Fiber {
    static constexpr size_t STACK_BYTES = 256 << 10;
    static constexpr size_t GUARD_BYTES = 64 << 10;  // a whole page on any Linux
    Context context;
    char* mapping;
    bool done = false;
    Fiber() {
        void* p = mmap(nullptr, GUARD_BYTES + STACK_BYTES, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            std::fprintf(stderr, "emulation: no memory for a thread's stack\n");
            std::abort();
        }
        mapping = static_cast<char*>(p);
        mprotect(mapping, GUARD_BYTES, PROT_NONE);
    }
    ~Fiber() { munmap(mapping, GUARD_BYTES + STACK_BYTES); }
    Fiber(const Fiber&) = delete;
    Fiber& operator=(const Fiber&) = delete;
};

struct Block {
    std::vector<std::unique_ptr<Fiber>> fibers;
    Context scheduler;
    Fiber* running = nullptr;
    const std::function<void()>* body = nullptr;
};
inline thread_local Block block;

[[noreturn]] inline void fiber_entry() {
    (*block.body)();
    block.running->done = true;
    switch_to(block.running->context, block.scheduler);
    std::abort();  // a finished fiber is never resumed
}

// The order in which the blocks of a launch run, and the threads of a block between two
// barriers: LEAPFMM_EMULATED_SCHEDULE = `in-order` (the default), `reversed`, or `shuffled`
// (a new permutation for every launch and every round between barriers, the same each run
// of a program). A GPU runs them in no fixed order: a kernel whose results change with the
// order reads what another thread writes without a barrier between (or what another block
// writes), or lets integer atomics order its output; the tests run the kernels in all three.
enum class Schedule { in_order, reversed, shuffled };

inline Schedule schedule() {
    static const Schedule chosen = [] {
        const char* v = std::getenv("LEAPFMM_EMULATED_SCHEDULE");
        if (v == nullptr || std::strcmp(v, "in-order") == 0) return Schedule::in_order;
        if (std::strcmp(v, "reversed") == 0) return Schedule::reversed;
        if (std::strcmp(v, "shuffled") == 0) return Schedule::shuffled;
        std::fprintf(stderr,
                     "emulation: LEAPFMM_EMULATED_SCHEDULE is '%s'; it takes in-order, "
                     "reversed or shuffled\n",
                     v);
        std::exit(2);
    }();
    return chosen;
}

// Sets `order` to 0..count-1 in the schedule's order (`draws`: the shuffle's generator).
inline void schedule_order(std::vector<unsigned>& order, unsigned count, uint64_t& draws) {
    order.resize(count);
    for (unsigned k = 0; k < count; ++k) order[k] = k;
    switch (schedule()) {
        case Schedule::in_order: break;
        case Schedule::reversed: std::reverse(order.begin(), order.end()); break;
        case Schedule::shuffled:
            for (unsigned k = count; k > 1; --k) {
                // splitmix64: a portable generator, seeded the same every run.
                uint64_t z = (draws += 0x9e3779b97f4a7c15ull);
                z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
                z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
                z ^= z >> 31;
                std::swap(order[k - 1], order[z % k]);
            }
            break;
    }
}

// Runs `body` as `threads` threads in each of `blocks` blocks, in the schedule's order.
inline void run_blocks(unsigned blocks, unsigned threads, const std::function<void()>& body) {
    Block& b = block;
    while (b.fibers.size() < threads) b.fibers.push_back(std::make_unique<Fiber>());
    b.body = &body;
    static thread_local uint64_t draws = 0;
    static thread_local std::vector<unsigned> block_order, thread_order;
    schedule_order(block_order, blocks, draws);
    for (unsigned i : block_order) {
        block_idx = uint3{i, 0, 0};
        for (unsigned t = 0; t < threads; ++t) {
            Fiber& f = *b.fibers[t];
            prepare(f.context, f.mapping + Fiber::GUARD_BYTES, Fiber::STACK_BYTES, fiber_entry);
            f.done = false;
        }
        // Each round runs every thread to its next barrier or its end.
        for (unsigned finished = 0; finished < threads;) {
            unsigned waiting = 0;
            schedule_order(thread_order, threads, draws);
            for (unsigned t : thread_order) {
                Fiber& f = *b.fibers[t];
                if (f.done) continue;
                thread_idx = uint3{t, 0, 0};
                b.running = &f;
                switch_to(b.scheduler, f.context);
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

inline void __syncthreads() { emu::switch_to(emu::block.running->context, emu::block.scheduler); }
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
