// The sorted keys split into cells where they are (design §5 step 2 on the device): the
// cells of src/fmm/tree.rs's `Tree::build_cells`, numbered as it numbers them, so that only
// the cells (16 bytes each) come back to the host instead of every key and index (12 bytes
// a particle).
//
// Before that, sort_scan sums up keys.cu's sort for the host's checks (tree.rs: SortScan):
// keys out of order, equal neighbours, and the largest index, the sum of the indices and of
// their squares. Integer sums and maxima, so the order of the atomics cannot show. Where
// there are equal neighbours, order_equal_runs puts each run of equal keys in increasing id,
// as the host's sort by (key, id) orders them.
//
// The split runs level by level, twice per level as walk.cu does: split_count finds how many
// children each cell of the level has (binary searches for its octants' boundaries in the
// sorted keys), keys.cu's radix_offsets turns the counts into prefix sums, and split_write
// writes the children at the next level's start plus those sums: breadth first, in the order
// of their parents, octants in order.

// Deepest level of a key (src/fmm/morton.rs: MAX_LEVEL): 21 bits per coordinate.
#define SPLIT_MAX_LEVEL 21u
// Threads of a sort_scan block (a power of two).
#define SCAN_THREADS 256
// sort_scan's results, in this order.
#define SCAN_OUT_OF_ORDER 0
#define SCAN_EQUAL 1
#define SCAN_LARGEST 2
#define SCAN_SUM 3
#define SCAN_SQUARES 4
#define SCAN_VALUES 5
// Longest run of equal keys order_equal_runs orders (a longer one is left to the host).
#define RUN_LIMIT 1024

// The octant of `key` at `level` (morton.rs: digit).
__device__ __forceinline__ unsigned key_digit(unsigned long long key, unsigned level) {
    return (unsigned)(key >> (3u * (SPLIT_MAX_LEVEL - level))) & 7u;
}

// The first index in [lo, hi) whose key's digit at `level` exceeds d (the host's
// partition_point: the digits of one cell's sorted keys do not decrease).
__device__ __forceinline__ unsigned digit_end(const unsigned long long* __restrict__ keys,
                                              unsigned lo, unsigned hi, unsigned level,
                                              unsigned d) {
    while (lo < hi) {
        const unsigned mid = lo + (hi - lo) / 2;
        if (key_digit(keys[mid], level) <= d) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo;
}

// Whether a cell of `count` particles at `level` splits (tree.rs: Split::of).
__device__ __forceinline__ bool splits(unsigned count, unsigned level, unsigned leaf_size) {
    return count > leaf_size && level < SPLIT_MAX_LEVEL;
}

// out[SCAN_*] over the n sorted keys and their particle indices (out zeroed before):
// adjacent keys out of order, adjacent keys equal, the largest index, and the sums of the
// indices and of their squares modulo 2^64. SCAN_THREADS per block; blocks stride.
extern "C" __global__ void sort_scan(const unsigned long long* __restrict__ keys,
                                     const unsigned* __restrict__ order, unsigned n,
                                     unsigned long long* __restrict__ out) {
    __shared__ unsigned long long part[SCAN_VALUES][SCAN_THREADS];
    const unsigned t = threadIdx.x;
    unsigned long long v[SCAN_VALUES] = {0, 0, 0, 0, 0};
    for (unsigned i = blockIdx.x * blockDim.x + t; i < n; i += gridDim.x * blockDim.x) {
        const unsigned long long o = order[i];
        v[SCAN_LARGEST] = max(v[SCAN_LARGEST], o);
        v[SCAN_SUM] += o;
        v[SCAN_SQUARES] += o * o;
        if (i > 0) {
            v[SCAN_OUT_OF_ORDER] += keys[i - 1] > keys[i] ? 1u : 0u;
            v[SCAN_EQUAL] += keys[i - 1] == keys[i] ? 1u : 0u;
        }
    }
    for (int k = 0; k < SCAN_VALUES; ++k) part[k][t] = v[k];
    __syncthreads();
    for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
        if (t < half) {
            for (int k = 0; k < SCAN_VALUES; ++k) {
                const unsigned long long other = part[k][t + half];
                part[k][t] = k == SCAN_LARGEST ? max(part[k][t], other) : part[k][t] + other;
            }
        }
        __syncthreads();
    }
    if (t == 0) {
        for (int k = 0; k < SCAN_VALUES; ++k) {
            if (k == SCAN_LARGEST) {
                atomicMax(&out[k], part[k][0]);
            } else {
                atomicAdd(&out[k], part[k][0]);
            }
        }
    }
}

// Each run of equal keys among the n sorted ones put in increasing id of its particles
// (tree.rs: Tree::adopt_sorted): the thread of the run's first record insertion-sorts the
// run's particle indices by id. A run longer than RUN_LIMIT is left as it is and counted in
// `problems` (the host then orders it). One thread per record.
extern "C" __global__ void order_equal_runs(const unsigned long long* __restrict__ keys,
                                            const unsigned long long* __restrict__ id,
                                            unsigned n, unsigned* __restrict__ index,
                                            unsigned* __restrict__ problems) {
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i + 1 >= n) return;
    const unsigned long long key = keys[i];
    if (keys[i + 1] != key || (i > 0 && keys[i - 1] == key)) return;
    unsigned end = i + 2;
    while (end < n && keys[end] == key && end - i <= RUN_LIMIT) ++end;
    if (end - i > RUN_LIMIT) {
        atomicAdd(problems, 1u);
        return;
    }
    for (unsigned j = i + 1; j < end; ++j) {
        const unsigned record = index[j];
        const unsigned long long record_id = id[record];
        unsigned k = j;
        while (k > i && id[index[k - 1]] > record_id) {
            index[k] = index[k - 1];
            --k;
        }
        index[k] = record;
    }
}

// counts[i] = how many children cell first + i of the level (`count` cells at `level`) has:
// its non-empty octants, none when it is a leaf. One thread per cell.
extern "C" __global__ void split_count(unsigned first, unsigned count, unsigned level,
                                       unsigned leaf_size,
                                       const unsigned long long* __restrict__ keys,
                                       const unsigned* __restrict__ begin,
                                       const unsigned* __restrict__ end,
                                       unsigned* __restrict__ counts) {
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    const unsigned c = first + i, e = end[c];
    unsigned children = 0, start = begin[c];
    if (splits(e - start, level, leaf_size)) {
        for (unsigned d = 0; d < 8; ++d) {
            const unsigned stop = digit_end(keys, start, e, level + 1, d);
            children += stop > start ? 1u : 0u;
            start = stop;
        }
    }
    counts[i] = children;
}

// The children of the level's cells, from split_count's counts turned into prefix sums
// (`offsets`): cell first + i's go from cell first + count + offsets[i] on, with their
// particle ranges and parent; each cell of the level gets its first child and child count
// (a leaf 0 and 0, as the host's).
extern "C" __global__ void split_write(unsigned first, unsigned count, unsigned level,
                                       unsigned leaf_size,
                                       const unsigned long long* __restrict__ keys,
                                       const unsigned* __restrict__ offsets,
                                       unsigned* __restrict__ begin, unsigned* __restrict__ end,
                                       unsigned* __restrict__ first_child,
                                       unsigned* __restrict__ child_count,
                                       unsigned* __restrict__ parent) {
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    const unsigned c = first + i, e = end[c], next = first + count + offsets[i];
    unsigned children = 0, start = begin[c];
    if (splits(e - start, level, leaf_size)) {
        for (unsigned d = 0; d < 8; ++d) {
            const unsigned stop = digit_end(keys, start, e, level + 1, d);
            if (stop > start) {
                const unsigned child = next + children;
                begin[child] = start;
                end[child] = stop;
                parent[child] = c;
                ++children;
            }
            start = stop;
        }
    }
    first_child[c] = children > 0 ? next : 0u;
    child_count[c] = children;
}
