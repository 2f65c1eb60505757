// An emulated CUDA driver, NVRTC and NCCL for the CI machines without a GPU: built as a
// shared library and found as libcuda.so, libnvrtc.so and libnccl.so (tests/gpu_emulated.rs
// puts it first on LD_LIBRARY_PATH of the binary it runs), it answers the calls cudarc
// makes, so that the binary's GPU backend runs whole (buffers, copies, launches, the
// resident pipeline, the payload between the ranks' GPUs) with every kernel executed under
// the CPU emulation (cuda_shim.h) on host memory.
//
// What it is not: a GPU. Device memory is host memory (a device pointer is a host address),
// streams and events are synchronous, "PTX" is a stub naming no code (cuModuleGetFunction
// finds the kernels compiled in here by name), the devices it reports say they are an
// emulation, and NCCL's messages go through files. Launches run one at a time (the
// kernels' `__shared__` variables are static). Only the calls the binary makes are here (and
// the error texts): one it starts to make stops it in cudarc with "Missing symbol NAME", the
// cue to add NAME.
#include "cuda_shim.h"
#include "../p2p.cu"
#include "../integrate.cu"
#include "../expansions.cu"
#include "../m2l_rotated.cu"
#include "../keys.cu"
#include "../moments.cu"
#include "../walk.cu"
#include "../split.cu"
#include "../external.cu"
#include <csignal>
#include <cstdint>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <sys/mman.h>
#include <sys/stat.h>
#include <thread>
#include <type_traits>
#include <unistd.h>
#include <utility>

namespace {

// CUresult and nvrtcResult values (cuda.h, nvrtc.h).
constexpr int CUDA_SUCCESS = 0;
constexpr int CUDA_ERROR_INVALID_VALUE = 1;
constexpr int CUDA_ERROR_OUT_OF_MEMORY = 2;
constexpr int CUDA_ERROR_INVALID_DEVICE = 101;
constexpr int CUDA_ERROR_NOT_FOUND = 500;
constexpr int NVRTC_SUCCESS = 0;

// CUdevice_attribute values it answers; every other attribute reads 0.
constexpr int ATTRIBUTE_MAX_THREADS_PER_BLOCK = 1;
constexpr int ATTRIBUTE_WARP_SIZE = 10;
constexpr int ATTRIBUTE_MULTIPROCESSOR_COUNT = 16;
constexpr int ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75;
constexpr int ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76;

// The device's memory as reported and granted (host memory): LEAPFMM_EMULATED_MEMORY bytes,
// 16 GiB by default; an allocation beyond it fails as on a full GPU.
size_t total_memory() {
    static const size_t bytes = [] {
        const char* v = std::getenv("LEAPFMM_EMULATED_MEMORY");
        return v ? size_t(std::strtoull(v, nullptr, 10)) : size_t(16) << 30;
    }();
    return bytes;
}

// An allocation's whole mapping (its pages and the guard page after them).
struct Mapping {
    char* base;
    size_t bytes;
    size_t asked;  // the allocation's own size
};

std::mutex lock;  // allocations and launches
std::map<uintptr_t, Mapping> allocations;
size_t allocated = 0;  // bytes asked for by the live allocations
// The kernel running now, for `report_fault`.
const char* volatile running_kernel = nullptr;

// With LEAPFMM_EMULATED_TRACE set, what a process asked of the devices, printed when it
// ends: the traffic between host and device a real GPU would see, its waits, and the most
// device memory it held at once (all devices together).
struct Traffic {
    std::atomic<uint64_t> launches{0}, waits{0}, allocations{0}, peak_bytes{0};
    std::atomic<uint64_t> up{0}, up_bytes{0}, down{0}, down_bytes{0}, within{0}, within_bytes{0};
    ~Traffic() {
        if (!std::getenv("LEAPFMM_EMULATED_TRACE")) return;
        std::fprintf(stderr,
                     "emulated devices: %llu launches, %llu waits (stream or event), %llu "
                     "allocations (at most %llu bytes at once); host to device %llu copies, "
                     "%llu bytes; device to host %llu copies, %llu bytes; device to device "
                     "%llu copies, %llu bytes\n",
                     (unsigned long long)launches, (unsigned long long)waits,
                     (unsigned long long)allocations, (unsigned long long)peak_bytes,
                     (unsigned long long)up,
                     (unsigned long long)up_bytes, (unsigned long long)down,
                     (unsigned long long)down_bytes, (unsigned long long)within,
                     (unsigned long long)within_bytes);
    }
};
Traffic traffic;

size_t page() {
    static const size_t bytes = size_t(sysconf(_SC_PAGESIZE));
    return bytes;
}

// A kernel by name, and how to call it from cuLaunchKernel's parameter array.
struct Kernel {
    const char* name;
    void (*run)(unsigned grid, unsigned block, void** params);
};

template <class... P, size_t... I>
void launch_from(unsigned grid, unsigned block, void (*kernel)(P...), void** params,
                 std::index_sequence<I...>) {
    launch(grid, block, kernel, *static_cast<std::remove_cv_t<P>*>(params[I])...);
}

template <class... P>
constexpr size_t arity(void (*)(P...)) {
    return sizeof...(P);
}

template <auto K>
void run_any(unsigned grid, unsigned block, void** params) {
    launch_from(grid, block, K, params, std::make_index_sequence<arity(K)>{});
}

// Every kernel the binary loads (GpuFmm::open), by its name: one missing here makes the
// binary's start fail with CUDA_ERROR_NOT_FOUND.
#define KERNEL(name) Kernel{#name, run_any<name>}
const Kernel KERNELS[] = {
    KERNEL(p2p_leaves),        KERNEL(p2m_leaves),      KERNEL(m2m_cells),
    KERNEL(m2l_cells),         KERNEL(m2l_cells_p8),    KERNEL(m2l_rotated_1),
    KERNEL(m2l_rotated_2),     KERNEL(m2l_rotated_3),   KERNEL(m2l_rotated_4),
    KERNEL(m2l_rotated_5),     KERNEL(m2l_rotated_6),   KERNEL(m2l_rotated_7),
    KERNEL(m2l_rotated_8),     KERNEL(l2l_cells),       KERNEL(l2p_particles),
    KERNEL(kick),              KERNEL(kick_each),       KERNEL(drift),
    KERNEL(gather_tree_order),
    KERNEL(scatter_forces),    KERNEL(gather_rows),     KERNEL(max_acceleration_blocks),
    KERNEL(gather_labels),     KERNEL(staying_rows),
    KERNEL(conserved_chunks),  KERNEL(bounds_blocks),   KERNEL(morton_keys),
    KERNEL(radix_count),       KERNEL(radix_offsets),   KERNEL(radix_scatter),
    KERNEL(leaf_of_particles), KERNEL(level_moments),   KERNEL(ancestor_r2),
    KERNEL(finish_moments),    KERNEL(walk_level),      KERNEL(sort_scan),
    KERNEL(mark_rows),         KERNEL(flag_cells_holding),
    KERNEL(order_equal_runs),  KERNEL(split_count),     KERNEL(split_write),
    KERNEL(add_external),      KERNEL(external_energy_chunks),
};
#undef KERNEL

// Opaque handles: a context, a stream, an event, a module are addresses of these.
struct Handle {
    int device = 0;
};
// How many devices it reports: LEAPFMM_EMULATED_GPUS (1 to 8, default 1), all of them
// the same host memory; thread ranks take one each, as on a machine with several GPUs.
constexpr int MAX_DEVICES = 8;
int devices() {
    static const int count = [] {
        const char* v = std::getenv("LEAPFMM_EMULATED_GPUS");
        const int k = v ? std::atoi(v) : 1;
        return std::clamp(k, 1, MAX_DEVICES);
    }();
    return count;
}
Handle context_of_device[MAX_DEVICES] = {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}};
Handle the_module;
thread_local Handle* current_context = nullptr;

// Zeroes [p, p + bytes): whole pages of an allocation are handed back to the operating
// system (they read as zeros again and cost no memory until written), the rest is written.
void zero(char* p, size_t bytes) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    const uintptr_t lo = (a + page() - 1) / page() * page();
    const uintptr_t hi = (a + bytes) / page() * page();
    if (hi > lo + 16 * page()) {
        std::memset(p, 0, lo - a);
        madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
        std::memset(reinterpret_cast<char*>(hi), 0, a + bytes - hi);
    } else {
        std::memset(p, 0, bytes);
    }
}

// Each allocation gets pages of its own with an inaccessible page after them, and sits at
// their end (16-byte aligned, as the kernels' widest loads need): a kernel or a copy that
// runs past the end of a buffer faults at once (see `report_fault`), where a GPU would read
// another buffer or stop with an illegal address.
constexpr size_t ALIGN = 16;

int allocate(unsigned long long* dptr, size_t bytes) {
    std::lock_guard<std::mutex> g(lock);
    if (bytes > total_memory() - allocated) return CUDA_ERROR_OUT_OF_MEMORY;
    const size_t used = std::max<size_t>(ALIGN, (bytes + ALIGN - 1) / ALIGN * ALIGN);
    const size_t pages = (used + page() - 1) / page() * page();
    void* p = mmap(nullptr, pages + page(), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    ++traffic.allocations;
    if (std::getenv("LEAPFMM_EMULATED_COPIES")) std::fprintf(stderr, "allocate %zu\n", bytes);
    char* base = static_cast<char*>(p);
    mprotect(base + pages, page(), PROT_NONE);
    const uintptr_t start = reinterpret_cast<uintptr_t>(base + pages - used);
    allocations[start] = Mapping{base, pages + page(), bytes};
    allocated += bytes;
    traffic.peak_bytes = std::max<uint64_t>(traffic.peak_bytes, allocated);
    *dptr = start;
    return CUDA_SUCCESS;
}

int release(unsigned long long dptr) {
    std::lock_guard<std::mutex> g(lock);
    auto it = allocations.find(uintptr_t(dptr));
    if (it == allocations.end()) return CUDA_ERROR_INVALID_VALUE;
    munmap(it->second.base, it->second.bytes);
    allocated -= it->second.asked;
    allocations.erase(it);
    return CUDA_SUCCESS;
}

// A fault inside a launch names the kernel, block and thread (then the default action: a
// core dump); outside one, it is the program's own.
void report_fault(int signal) {
    if (const char* name = running_kernel) {
        char text[256];
        const int len = std::snprintf(
            text, sizeof text,
            "emulation: kernel %s, block %u, thread %u touched memory outside its buffers\n",
            name, emu::block_idx.x, emu::thread_idx.x);
        if (len > 0) (void)!write(2, text, size_t(len));
    }
    std::signal(signal, SIG_DFL);
    std::raise(signal);
}

void* at(unsigned long long dptr) { return reinterpret_cast<void*>(uintptr_t(dptr)); }

struct Program {
    std::string ptx;
};

// NCCL's state. The ranks of one id meet in a folder of their own under
// $TMPDIR/leapfmm-emulated-nccl (a file per rank that joined, a file per message), so ranks
// in other processes (MPI) meet as well as threads of one.
constexpr int NCCL_SUCCESS = 0;
constexpr int NCCL_SYSTEM_ERROR = 2;
constexpr int NCCL_INTERNAL_ERROR = 3;
constexpr int NCCL_INVALID_ARGUMENT = 4;
constexpr int NCCL_INVALID_USAGE = 5;
constexpr auto NCCL_PATIENCE = std::chrono::minutes(1);

struct NcclId {
    char internal[128];
};

struct NcclComm {
    std::string folder;
    int ranks;
    int rank;
    // Messages sent to and received from each peer so far: the next one's number.
    std::vector<uint64_t> sent, received;
};

struct NcclOp {
    bool send;
    void* data;
    size_t bytes;
    int peer;
    NcclComm* comm;
};

// The operations of this thread's open group (ncclGroupStart … ncclGroupEnd).
struct NcclPending {
    int depth = 0;
    std::vector<NcclOp> ops;
};
thread_local NcclPending nccl_pending;

size_t nccl_size(int type) {
    switch (type) {
        case 0: case 1: return 1;          // int8, uint8
        case 6: case 9: return 2;          // float16, bfloat16
        case 4: case 5: case 8: return 8;  // int64, uint64, float64
        default: return 4;                 // int32, uint32, float32
    }
}

std::string nccl_message(const NcclComm& c, int from, int to, uint64_t number) {
    return c.folder + "/message." + std::to_string(from) + "." + std::to_string(to) + "." +
           std::to_string(number);
}

// Waits until `path` exists; false after NCCL_PATIENCE.
bool nccl_wait_for(const std::string& path) {
    const auto start = std::chrono::steady_clock::now();
    while (access(path.c_str(), F_OK) != 0) {
        if (std::chrono::steady_clock::now() - start > NCCL_PATIENCE) return false;
        std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    return true;
}

// Runs the group's operations: every send written (under a temporary name, then renamed,
// so a receiver never reads half a message), then every receive waits for its peer's next
// message to it, which must be as long, and takes it.
int nccl_flush() {
    std::vector<NcclOp> ops;
    ops.swap(nccl_pending.ops);
    for (const NcclOp& op : ops) {
        if (!op.send) continue;
        NcclComm& c = *op.comm;
        const std::string path = nccl_message(c, c.rank, op.peer, c.sent[size_t(op.peer)]++);
        const std::string tmp = path + ".tmp";
        FILE* f = std::fopen(tmp.c_str(), "wb");
        if (!f) return NCCL_SYSTEM_ERROR;
        const bool written = op.bytes == 0 || std::fwrite(op.data, 1, op.bytes, f) == op.bytes;
        if (std::fclose(f) != 0 || !written || std::rename(tmp.c_str(), path.c_str()) != 0) {
            return NCCL_SYSTEM_ERROR;
        }
    }
    for (const NcclOp& op : ops) {
        if (op.send) continue;
        NcclComm& c = *op.comm;
        const std::string path = nccl_message(c, op.peer, c.rank, c.received[size_t(op.peer)]++);
        if (!nccl_wait_for(path)) {
            std::fprintf(stderr, "emulation: NCCL rank %d waited in vain for rank %d\n", c.rank,
                         op.peer);
            return NCCL_INTERNAL_ERROR;
        }
        FILE* f = std::fopen(path.c_str(), "rb");
        if (!f) return NCCL_SYSTEM_ERROR;
        std::fseek(f, 0, SEEK_END);
        const size_t bytes = size_t(std::ftell(f));
        std::fseek(f, 0, SEEK_SET);
        if (bytes != op.bytes) {
            std::fprintf(stderr,
                         "emulation: NCCL rank %d receives %zu bytes from rank %d, which sent "
                         "%zu\n",
                         c.rank, op.bytes, op.peer, bytes);
            std::abort();
        }
        const bool read = bytes == 0 || std::fread(op.data, 1, bytes, f) == bytes;
        std::fclose(f);
        std::remove(path.c_str());
        if (!read) return NCCL_SYSTEM_ERROR;
    }
    return NCCL_SUCCESS;
}

int nccl_post(const NcclOp& op) {
    if (op.peer < 0 || op.peer >= op.comm->ranks) return NCCL_INVALID_ARGUMENT;
    nccl_pending.ops.push_back(op);
    return nccl_pending.depth == 0 ? nccl_flush() : NCCL_SUCCESS;
}

}  // namespace

extern "C" {

// ---- the driver API (cuda.h), the calls cudarc makes ----

int cuInit(unsigned) {
    static std::once_flag once;
    std::call_once(once, [] {
        // The fibers run on their own stacks; the handler gets one of its own too.
        static char stack[64 << 10];
        stack_t s{};
        s.ss_sp = stack;
        s.ss_size = sizeof stack;
        sigaltstack(&s, nullptr);
        struct sigaction action{};
        action.sa_handler = report_fault;
        action.sa_flags = SA_ONSTACK;
        sigaction(SIGSEGV, &action, nullptr);
        sigaction(SIGBUS, &action, nullptr);
    });
    return CUDA_SUCCESS;
}
int cuDeviceGetCount(int* count) {
    *count = devices();
    return CUDA_SUCCESS;
}
int cuDeviceGet(int* device, int ordinal) {
    if (ordinal < 0 || ordinal >= devices()) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}
int cuDeviceGetName(char* name, int len, int) {
    std::snprintf(name, size_t(len), "leapfmm CPU emulation (not a GPU)");
    return CUDA_SUCCESS;
}
int cuDeviceGetAttribute(int* value, int attribute, int) {
    switch (attribute) {
        case ATTRIBUTE_MAX_THREADS_PER_BLOCK: *value = 1024; break;
        case ATTRIBUTE_WARP_SIZE: *value = 32; break;
        case ATTRIBUTE_MULTIPROCESSOR_COUNT: *value = 1; break;
        case ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *value = 9; break;
        case ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *value = 0; break;
        default: *value = 0;
    }
    return CUDA_SUCCESS;
}
int cuDeviceTotalMem_v2(size_t* bytes, int) {
    *bytes = total_memory();
    return CUDA_SUCCESS;
}

int cuDevicePrimaryCtxRetain(void** context, int device) {
    if (device < 0 || device >= devices()) return CUDA_ERROR_INVALID_DEVICE;
    *context = &context_of_device[device];
    return CUDA_SUCCESS;
}
int cuDevicePrimaryCtxRelease_v2(int) { return CUDA_SUCCESS; }
int cuCtxSetCurrent(void* context) {
    current_context = static_cast<Handle*>(context);
    return CUDA_SUCCESS;
}
int cuCtxGetCurrent(void** context) {
    *context = current_context;
    return CUDA_SUCCESS;
}

int cuStreamSynchronize(void*) {
    ++traffic.waits;
    return CUDA_SUCCESS;
}

int cuEventCreate(void** event, unsigned) {
    *event = new Handle;
    return CUDA_SUCCESS;
}
int cuEventDestroy_v2(void* event) {
    delete static_cast<Handle*>(event);
    return CUDA_SUCCESS;
}
int cuEventSynchronize(void*) {
    ++traffic.waits;
    return CUDA_SUCCESS;
}

int cuMemAlloc_v2(unsigned long long* dptr, size_t bytes) { return allocate(dptr, bytes); }
int cuMemFree_v2(unsigned long long dptr) { return release(dptr); }
int cuMemHostAlloc(void** p, size_t bytes, unsigned) {
    *p = std::malloc(std::max<size_t>(bytes, 1));
    return *p ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
int cuMemFreeHost(void* p) {
    std::free(p);
    return CUDA_SUCCESS;
}

int cuMemcpyHtoD_v2(unsigned long long dst, const void* src, size_t bytes) {
    ++traffic.up;
    traffic.up_bytes += bytes;
    if (std::getenv("LEAPFMM_EMULATED_COPIES")) std::fprintf(stderr, "copy up %zu\n", bytes);
    std::memcpy(at(dst), src, bytes);
    return CUDA_SUCCESS;
}
int cuMemcpyHtoDAsync_v2(unsigned long long dst, const void* src, size_t bytes, void*) {
    return cuMemcpyHtoD_v2(dst, src, bytes);
}
int cuMemcpyDtoH_v2(void* dst, unsigned long long src, size_t bytes) {
    ++traffic.down;
    traffic.down_bytes += bytes;
    if (std::getenv("LEAPFMM_EMULATED_COPIES")) std::fprintf(stderr, "copy down %zu\n", bytes);
    std::memcpy(dst, at(src), bytes);
    return CUDA_SUCCESS;
}
int cuMemcpyDtoHAsync_v2(void* dst, unsigned long long src, size_t bytes, void*) {
    return cuMemcpyDtoH_v2(dst, src, bytes);
}
int cuMemcpyDtoD_v2(unsigned long long dst, unsigned long long src, size_t bytes) {
    ++traffic.within;
    traffic.within_bytes += bytes;
    std::memmove(at(dst), at(src), bytes);
    return CUDA_SUCCESS;
}
int cuMemcpyDtoDAsync_v2(unsigned long long dst, unsigned long long src, size_t bytes, void*) {
    return cuMemcpyDtoD_v2(dst, src, bytes);
}
int cuMemsetD8_v2(unsigned long long dst, unsigned char value, size_t count) {
    if (value == 0) {
        zero(static_cast<char*>(at(dst)), count);
    } else {
        std::memset(at(dst), value, count);
    }
    return CUDA_SUCCESS;
}
int cuMemsetD8Async(unsigned long long dst, unsigned char value, size_t count, void*) {
    return cuMemsetD8_v2(dst, value, count);
}

int cuModuleLoadData(void** module, const void*) {
    *module = &the_module;
    return CUDA_SUCCESS;
}
int cuModuleUnload(void*) { return CUDA_SUCCESS; }
int cuModuleGetFunction(void** function, void*, const char* name) {
    for (const Kernel& k : KERNELS) {
        if (std::strcmp(k.name, name) == 0) {
            *function = const_cast<Kernel*>(&k);
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_NOT_FOUND;
}

int cuLaunchKernel(void* function, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                   unsigned by, unsigned bz, unsigned shared_bytes, void*, void** params,
                   void** extra) {
    // The kernels are 1-D and declare their shared memory statically.
    if (gy != 1 || gz != 1 || by != 1 || bz != 1 || shared_bytes != 0 || extra != nullptr ||
        gx == 0 || bx == 0 || bx > 1024) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    std::lock_guard<std::mutex> g(lock);
    const Kernel* kernel = static_cast<const Kernel*>(function);
    running_kernel = kernel->name;
    ++traffic.launches;
    kernel->run(gx, bx, params);
    running_kernel = nullptr;
    return CUDA_SUCCESS;
}

int cuGetErrorName(int error, const char** name) {
    switch (error) {
        case CUDA_SUCCESS: *name = "CUDA_SUCCESS"; break;
        case CUDA_ERROR_INVALID_VALUE: *name = "CUDA_ERROR_INVALID_VALUE"; break;
        case CUDA_ERROR_OUT_OF_MEMORY: *name = "CUDA_ERROR_OUT_OF_MEMORY"; break;
        case CUDA_ERROR_INVALID_DEVICE: *name = "CUDA_ERROR_INVALID_DEVICE"; break;
        case CUDA_ERROR_NOT_FOUND: *name = "CUDA_ERROR_NOT_FOUND"; break;
        default: *name = "CUDA_ERROR_UNKNOWN";  // it returns no other
    }
    return CUDA_SUCCESS;
}
int cuGetErrorString(int error, const char** text) { return cuGetErrorName(error, text); }

// ---- NVRTC (nvrtc.h): "compiles" to a stub naming the source ----

int nvrtcVersion(int* major, int* minor) {
    // No real NVRTC has version 0.0, so the on-disk PTX cache never mixes the two.
    *major = 0;
    *minor = 0;
    return NVRTC_SUCCESS;
}
int nvrtcCreateProgram(Program** program, const char*, const char* name, int,
                       const char* const*, const char* const*) {
    *program = new Program{std::string("// leapfmm CPU emulation: ") + (name ? name : "") + "\n"};
    return NVRTC_SUCCESS;
}
int nvrtcCompileProgram(Program*, int, const char* const*) { return NVRTC_SUCCESS; }
int nvrtcGetPTXSize(Program* program, size_t* bytes) {
    *bytes = program->ptx.size() + 1;
    return NVRTC_SUCCESS;
}
int nvrtcGetPTX(Program* program, char* ptx) {
    std::memcpy(ptx, program->ptx.c_str(), program->ptx.size() + 1);
    return NVRTC_SUCCESS;
}
int nvrtcGetProgramLogSize(Program*, size_t* bytes) {
    *bytes = 1;
    return NVRTC_SUCCESS;
}
int nvrtcGetProgramLog(Program*, char* log) {
    *log = 0;
    return NVRTC_SUCCESS;
}
int nvrtcDestroyProgram(Program** program) {
    delete *program;
    *program = nullptr;
    return NVRTC_SUCCESS;
}
const char* nvrtcGetErrorString(int) { return "NVRTC emulation error"; }

// ---- NCCL (nccl.h): point-to-point between ranks, through files ----

const char* ncclGetErrorString(int) { return "NCCL emulation error"; }

// An id no other process or run shares: this process, a count, the time.
int ncclGetUniqueId(NcclId* id) {
    static std::atomic<uint64_t> count{0};
    const auto now = std::chrono::system_clock::now().time_since_epoch().count();
    std::memset(id->internal, 0, sizeof id->internal);
    std::snprintf(id->internal, sizeof id->internal, "%d-%llu-%lld", int(getpid()),
                  (unsigned long long)count++, (long long)now);
    return NCCL_SUCCESS;
}

// Waits, as NCCL does, until every rank has joined (after NCCL_PATIENCE it gives up).
int ncclCommInitRank(NcclComm** comm, int ranks, NcclId id, int rank) {
    if (ranks < 1 || rank < 0 || rank >= ranks) return NCCL_INVALID_ARGUMENT;
    const char* tmp = std::getenv("TMPDIR");
    const std::string base = std::string(tmp && *tmp ? tmp : "/tmp") + "/leapfmm-emulated-nccl";
    id.internal[sizeof id.internal - 1] = 0;
    const std::string folder = base + "/" + id.internal;
    mkdir(base.c_str(), 0700);
    mkdir(folder.c_str(), 0700);
    const std::string mine = folder + "/joined." + std::to_string(rank);
    FILE* f = std::fopen(mine.c_str(), "w");
    if (!f) return NCCL_SYSTEM_ERROR;
    std::fclose(f);
    for (int r = 0; r < ranks; ++r) {
        if (!nccl_wait_for(folder + "/joined." + std::to_string(r))) {
            std::fprintf(stderr, "emulation: NCCL rank %d of %d: rank %d never joined\n", rank,
                         ranks, r);
            return NCCL_INTERNAL_ERROR;
        }
    }
    *comm = new NcclComm{folder, ranks, rank, std::vector<uint64_t>(size_t(ranks)),
                         std::vector<uint64_t>(size_t(ranks))};
    return NCCL_SUCCESS;
}
// The last rank to leave removes the folder (rmdir fails while others' files are there).
int ncclCommDestroy(NcclComm* comm) {
    std::remove((comm->folder + "/joined." + std::to_string(comm->rank)).c_str());
    rmdir(comm->folder.c_str());
    delete comm;
    return NCCL_SUCCESS;
}
int ncclCommAbort(NcclComm* comm) { return ncclCommDestroy(comm); }

int ncclGroupStart() {
    ++nccl_pending.depth;
    return NCCL_SUCCESS;
}
int ncclGroupEnd() {
    if (nccl_pending.depth == 0) return NCCL_INVALID_USAGE;
    if (--nccl_pending.depth == 0) return nccl_flush();
    return NCCL_SUCCESS;
}
int ncclSend(const void* data, size_t count, int type, int peer, NcclComm* comm, void*) {
    return nccl_post(NcclOp{true, const_cast<void*>(data), count * nccl_size(type), peer, comm});
}
int ncclRecv(void* data, size_t count, int type, int peer, NcclComm* comm, void*) {
    return nccl_post(NcclOp{false, data, count * nccl_size(type), peer, comm});
}

}  // extern "C"
