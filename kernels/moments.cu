// The cells' moments where the particles are (design §5 step 3 on the device): each cell's
// mass, centre of mass (rounded to the nearest f32) and radius r_max (the largest distance
// of its particles from that centre, rounded up to an f32), the values of
// src/fmm/tree.rs's `Tree::compute_moments` bit for bit, from the particles in tree order
// that keys.cu's sort left on the device. The host then needs only the cells (40 bytes
// each) instead of every position and mass.
//
// Bit for bit: every sum runs serially in the host's order (a leaf over its particles, a
// cell over its children) with round-to-nearest operations that are never fused
// (__dadd_rn, __dmul_rn); division, square root and the rounding to f32 are IEEE-exact on
// both sides. The radius of a cell with children is a maximum over all its particles, which
// no order can change: each particle's squared distance from each ancestor's centre goes in
// with an integer atomic maximum on its bits (non-negative doubles order like their bits),
// a block first taking the maximum of its particles when they share the ancestor.

// Threads of an ancestor_r2 block (a power of two): consecutive particles in tree order.
#define ANCESTOR_THREADS 256
// No cell.
#define NO_CELL 0xffffffffu

// |x - c|^2 as the host computes it: ((dx dx + dy dy) + dz dz).
__device__ __forceinline__ double squared_distance(const double* x, const double* c) {
    const double dx = __dsub_rn(x[0], c[0]);
    const double dy = __dsub_rn(x[1], c[1]);
    const double dz = __dsub_rn(x[2], c[2]);
    return __dadd_rn(__dadd_rn(__dmul_rn(dx, dx), __dmul_rn(dy, dy)), __dmul_rn(dz, dz));
}

// The nearest f32 of v, as a double (the host's `f64::from(v as f32)`).
__device__ __forceinline__ double nearest_f32(double v) { return (double)__double2float_rn(v); }

// The smallest f32 not below x >= 0, as a double (tree.rs: f32_at_least).
__device__ __forceinline__ double f32_at_least(double x) {
    float y = __double2float_rn(x);
    if ((double)y < x) y = __int_as_float(__float_as_int(y) + 1);
    return (double)y;
}

// leaf_of[i] = the leaf holding particle i: one thread per leaf fills its particle range.
extern "C" __global__ void leaf_of_particles(const unsigned* __restrict__ leaves,
                                             unsigned n_leaves,
                                             const unsigned* __restrict__ begin,
                                             const unsigned* __restrict__ end,
                                             unsigned* __restrict__ leaf_of) {
    const unsigned l = blockIdx.x * blockDim.x + threadIdx.x;
    if (l < n_leaves) {
        const unsigned leaf = leaves[l];
        for (unsigned i = begin[leaf]; i < end[leaf]; ++i) leaf_of[i] = leaf;
    }
}

// marked[rows[k]] = 1 for the `count` rows listed (a block sub-step's active particles, in
// the state's order; marked zeroed before). One thread per row.
extern "C" __global__ void mark_rows(const unsigned* __restrict__ rows, unsigned count,
                                     unsigned char* __restrict__ marked) {
    const unsigned k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k < count) marked[rows[k]] = 1;
}

// flags[c] = 1 for every cell holding a marked particle (tree.rs: cells_holding; flags
// zeroed before): one thread per leaf looks at its particles (`order`: the state's row of
// each particle in tree order), and a leaf holding one flags itself and its ancestors up to
// the root (its own parent), stopping at a cell flagged already: whoever flagged that goes
// on up. Every write stores 1, so the flags do not depend on the order of the threads.
extern "C" __global__ void flag_cells_holding(const unsigned* __restrict__ leaves,
                                              unsigned n_leaves,
                                              const unsigned* __restrict__ begin,
                                              const unsigned* __restrict__ end,
                                              const unsigned* __restrict__ parent,
                                              const unsigned* __restrict__ order,
                                              const unsigned char* __restrict__ marked,
                                              unsigned char* __restrict__ flags) {
    const unsigned l = blockIdx.x * blockDim.x + threadIdx.x;
    if (l >= n_leaves) return;
    unsigned cell = leaves[l];
    bool holds = false;
    for (unsigned i = begin[cell]; i < end[cell] && !holds; ++i) holds = marked[order[i]] != 0;
    if (!holds) return;
    while (flags[cell] == 0) {
        flags[cell] = 1;
        const unsigned up = parent[cell];
        if (up == cell) return;
        cell = up;
    }
}

// Mass and centre of the `count` cells from `first` (one level; deeper levels done before),
// one thread per cell: a leaf sums its particles, a cell with children its children. A
// leaf's squared radius too (r2, as bits); a cell with children gets 0 there, for
// ancestor_r2 to raise.
extern "C" __global__ void level_moments(unsigned first, unsigned count,
                                         const unsigned* __restrict__ begin,
                                         const unsigned* __restrict__ end,
                                         const unsigned* __restrict__ first_child,
                                         const unsigned* __restrict__ child_count,
                                         const double* __restrict__ pos,
                                         const double* __restrict__ mass,
                                         double* __restrict__ cell_mass,
                                         double* __restrict__ centre,
                                         unsigned long long* __restrict__ r2) {
    const unsigned k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= count) return;
    const unsigned c = first + k;
    double m = 0.0, s[3] = {0.0, 0.0, 0.0};
    const bool leaf = child_count[c] == 0;
    if (leaf) {
        for (unsigned i = begin[c]; i < end[c]; ++i) {
            const double mi = mass[i];
            m = __dadd_rn(m, mi);
            for (int d = 0; d < 3; ++d) s[d] = __dadd_rn(s[d], __dmul_rn(mi, pos[3 * i + d]));
        }
    } else {
        const unsigned ch0 = first_child[c], ch1 = ch0 + child_count[c];
        for (unsigned ch = ch0; ch < ch1; ++ch) {
            const double mc = cell_mass[ch];
            m = __dadd_rn(m, mc);
            for (int d = 0; d < 3; ++d) s[d] = __dadd_rn(s[d], __dmul_rn(mc, centre[3 * ch + d]));
        }
    }
    cell_mass[c] = m;
    double x[3];
    for (int d = 0; d < 3; ++d) {
        x[d] = nearest_f32(__ddiv_rn(s[d], m));
        centre[3 * c + d] = x[d];
    }
    double far = 0.0;
    if (leaf) {
        for (unsigned i = begin[c]; i < end[c]; ++i) far = fmax(far, squared_distance(&pos[3 * i], x));
    }
    r2[c] = (unsigned long long)__double_as_longlong(far);
}

// Raises each cell's r2 (bits of a squared distance) to the largest squared distance of
// its particles from its centre, for every ancestor of every particle's leaf: block b takes
// particles b * ANCESTOR_THREADS onwards, one per thread, and goes up the levels together
// (`levels` of them, level l's cells at level_start[l] .. level_start[l + 1]; cell 0 is the
// root). Where the block's first and last particle share the ancestor, all between do
// (a cell's particles are contiguous): the block reduces and one atomic goes in.
extern "C" __global__ void ancestor_r2(const double* __restrict__ pos, unsigned n,
                                       const unsigned* __restrict__ leaf_of,
                                       const unsigned* __restrict__ parent,
                                       const unsigned* __restrict__ level_start, unsigned levels,
                                       const double* __restrict__ centre,
                                       unsigned long long* __restrict__ r2) {
    __shared__ unsigned cell_of[ANCESTOR_THREADS];
    __shared__ double far[ANCESTOR_THREADS];
    const unsigned t = threadIdx.x;
    const unsigned base = blockIdx.x * blockDim.x;
    const unsigned i = base + t;
    const unsigned last = min(blockDim.x, n - base) - 1;
    unsigned c = NO_CELL;
    double x[3] = {0.0, 0.0, 0.0};
    if (i < n) {
        const unsigned leaf = leaf_of[i];
        c = leaf == 0 ? NO_CELL : parent[leaf];
        for (int d = 0; d < 3; ++d) x[d] = pos[3 * i + d];
    }
    for (int level = (int)levels - 1; level >= 0; --level) {
        const bool here = c != NO_CELL && c >= level_start[level] && c < level_start[level + 1];
        const unsigned mine = here ? c : NO_CELL;
        const double d2 = here ? squared_distance(x, &centre[3 * c]) : 0.0;
        cell_of[t] = mine;
        far[t] = d2;
        __syncthreads();
        const bool whole = cell_of[0] != NO_CELL && cell_of[0] == cell_of[last];
        if (whole) {
            // Threads past `last` hold 0, below every squared distance.
            for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
                if (t < half) far[t] = fmax(far[t], far[t + half]);
                __syncthreads();
            }
            if (t == 0) atomicMax(&r2[mine], (unsigned long long)__double_as_longlong(far[0]));
        } else if (here) {
            atomicMax(&r2[mine], (unsigned long long)__double_as_longlong(d2));
        }
        __syncthreads();
        if (here) c = mine == 0 ? NO_CELL : parent[mine];
    }
}

// out[5 c ..] = mass, centre (3), r_max of each of the `count` cells.
extern "C" __global__ void finish_moments(unsigned count, const double* __restrict__ cell_mass,
                                          const double* __restrict__ centre,
                                          const unsigned long long* __restrict__ r2,
                                          double* __restrict__ out) {
    const unsigned c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= count) return;
    out[5 * c] = cell_mass[c];
    for (int d = 0; d < 3; ++d) out[5 * c + 1 + d] = centre[3 * c + d];
    out[5 * c + 4] = f32_at_least(sqrt(__longlong_as_double((long long)r2[c])));
}
