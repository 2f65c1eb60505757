// The leapfrog's kick and drift on device-resident state, and what the step loop needs
// around the force passes (f64, one thread per particle): the gather of positions and
// masses into tree order, the scatter of the forces back, the per-block maxima of |a| for
// the time step criterion, and the conserved sums of the diagnostics.
//
// Kick and drift round each product and sum separately (__dmul_rn, __dadd_rn: no fused
// multiply-add), so that the device integrates with exactly the host's bits.

extern "C" __global__ void kick(double* __restrict__ vel, const double* __restrict__ acc,
                                double dt, unsigned n) {
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        for (int k = 0; k < 3; ++k) {
            vel[3 * i + k] = __dadd_rn(vel[3 * i + k], __dmul_rn(acc[3 * i + k], dt));
        }
    }
}

// The block scheme's kick: v += a h[k] for the k-th of `count` particles, each its own
// step: the particle of row rows[k] when `listed` (a sub-step's active ones), else the
// k-th (everybody). As the host's `leapfrog::kick_each`.
extern "C" __global__ void kick_each(double* __restrict__ vel, const double* __restrict__ acc,
                                     const unsigned* __restrict__ rows, unsigned listed,
                                     const double* __restrict__ h, unsigned count) {
    const unsigned k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k < count) {
        const unsigned i = listed ? rows[k] : k;
        for (int c = 0; c < 3; ++c) {
            vel[3 * i + c] = __dadd_rn(vel[3 * i + c], __dmul_rn(acc[3 * i + c], h[k]));
        }
    }
}

extern "C" __global__ void drift(double* __restrict__ pos, const double* __restrict__ vel,
                                 double dt, unsigned n) {
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        for (int k = 0; k < 3; ++k) {
            pos[3 * i + k] = __dadd_rn(pos[3 * i + k], __dmul_rn(vel[3 * i + k], dt));
        }
    }
}

// sorted[s] = state[order_of[s]]: positions and masses in the tree order of the host's plan.
extern "C" __global__ void gather_tree_order(const double* __restrict__ pos,
                                             const double* __restrict__ mass,
                                             const unsigned* __restrict__ order_of, unsigned n,
                                             double* __restrict__ pos_sorted,
                                             double* __restrict__ mass_sorted) {
    const unsigned s = blockIdx.x * blockDim.x + threadIdx.x;
    if (s < n) {
        const unsigned i = order_of[s];
        for (int k = 0; k < 3; ++k) pos_sorted[3 * s + k] = pos[3 * i + k];
        mass_sorted[s] = mass[i];
    }
}

// out[r * width + k] = in[rows[r] * width + k], one thread per value: rows of a table
// gathered by index (the multipoles a rank's device sends another, `PayloadRoutes`).
extern "C" __global__ void gather_rows(const double* __restrict__ in,
                                       const unsigned* __restrict__ rows, unsigned count,
                                       unsigned width, double* __restrict__ out) {
    const unsigned long long t = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t < (unsigned long long)count * width) {
        const unsigned long long r = t / width, k = t % width;
        out[t] = in[(unsigned long long)rows[r] * width + k];
    }
}

// The rows a migration keeps, in order, from the rows that leave (`leaving`, strictly
// increasing, all below n): one thread per row, which finds by binary search how many leave
// before it and, unless it leaves itself, writes itself there. So only the few leaving rows
// go up, not one index per staying particle.
extern "C" __global__ void staying_rows(const unsigned* __restrict__ leaving,
                                        unsigned leaving_count, unsigned n,
                                        unsigned* __restrict__ stays) {
    const unsigned r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= n) return;
    unsigned lo = 0, hi = leaving_count;
    while (lo < hi) {
        const unsigned mid = lo + (hi - lo) / 2;
        if (leaving[mid] < r) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    if (lo < leaving_count && leaving[lo] == r) return;
    stays[r - lo] = r;
}

// The ids and components of the rows a migration keeps, gathered into the new set's first
// rows (one thread per row): what `gather_rows` does for the f64 state, for the labels.
extern "C" __global__ void gather_labels(const unsigned long long* __restrict__ id,
                                         const unsigned char* __restrict__ component,
                                         const unsigned* __restrict__ rows, unsigned count,
                                         unsigned long long* __restrict__ id_out,
                                         unsigned char* __restrict__ component_out) {
    const unsigned r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r < count) {
        id_out[r] = id[rows[r]];
        component_out[r] = component[rows[r]];
    }
}

// acc[order_of[s]] = acc_sorted[s] (a permutation: every particle written once).
extern "C" __global__ void scatter_forces(const double* __restrict__ acc_sorted,
                                          const double* __restrict__ pot_sorted,
                                          const unsigned* __restrict__ order_of, unsigned n,
                                          double* __restrict__ acc, double* __restrict__ pot) {
    const unsigned s = blockIdx.x * blockDim.x + threadIdx.x;
    if (s < n) {
        const unsigned i = order_of[s];
        for (int k = 0; k < 3; ++k) acc[3 * i + k] = acc_sorted[3 * s + k];
        pot[i] = pot_sorted[s];
    }
}

// Largest block size of max_acceleration_blocks.
#define MAX_ACC_BLOCK 256

// block_max[4 b + c]: the largest |a|^2 among block b's particles of component c (0 where it
// has none). A maximum does not depend on the order it is taken in, so the host's final
// maximum over blocks is the same on every run. blockDim.x: a power of two <= MAX_ACC_BLOCK.
extern "C" __global__ void max_acceleration_blocks(const double* __restrict__ acc,
                                                   const unsigned char* __restrict__ component,
                                                   unsigned n, double* __restrict__ block_max) {
    __shared__ double best[4 * MAX_ACC_BLOCK];
    const unsigned t = threadIdx.x, i = blockIdx.x * blockDim.x + t;
    for (int c = 0; c < 4; ++c) best[4 * t + c] = 0.0;
    if (i < n) {
        const double a2 = __dadd_rn(__dadd_rn(__dmul_rn(acc[3 * i], acc[3 * i]),
                                              __dmul_rn(acc[3 * i + 1], acc[3 * i + 1])),
                                    __dmul_rn(acc[3 * i + 2], acc[3 * i + 2]));
        best[4 * t + (component[i] & 3)] = a2;
    }
    __syncthreads();
    for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
        if (t < half) {
            for (int c = 0; c < 4; ++c) {
                best[4 * t + c] = fmax(best[4 * t + c], best[4 * (t + half) + c]);
            }
        }
        __syncthreads();
    }
    if (t == 0) {
        for (int c = 0; c < 4; ++c) block_max[4 * blockIdx.x + c] = best[c];
    }
}

// Particles per chunk of the conserved sums (src/sum.rs: CHUNK) and values per particle
// (src/integrate/diagnostics.rs: CONSERVED_SUMS).
#define SUM_CHUNK 4096
#define CONSERVED_SUMS 12

// partial[12 c + k]: sum k of chunk c (particles c SUM_CHUNK .. (c + 1) SUM_CHUNK) of the
// conserved quantities, written term by term and summed in order exactly as
// Conserved::sums and sum_indexed do on the host (no fused multiply-add), one thread per
// chunk: the host adds the chunks in order and has the host's bits.
extern "C" __global__ void conserved_chunks(const double* __restrict__ pos,
                                            const double* __restrict__ vel,
                                            const double* __restrict__ mass,
                                            const double* __restrict__ pot, unsigned n,
                                            double* __restrict__ partial) {
    const unsigned c = blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned lo = c * SUM_CHUNK;
    if (lo >= n) return;
    const unsigned hi = min(lo + SUM_CHUNK, n);
    double acc[CONSERVED_SUMS];
    for (int k = 0; k < CONSERVED_SUMS; ++k) acc[k] = 0.0;
    for (unsigned i = lo; i < hi; ++i) {
        const double m = mass[i];
        const double x0 = pos[3 * i], x1 = pos[3 * i + 1], x2 = pos[3 * i + 2];
        const double v0 = vel[3 * i], v1 = vel[3 * i + 1], v2 = vel[3 * i + 2];
        const double vv = __dadd_rn(__dadd_rn(__dmul_rn(v0, v0), __dmul_rn(v1, v1)),
                                    __dmul_rn(v2, v2));
        const double half_m = __dmul_rn(0.5, m);
        const double term[CONSERVED_SUMS] = {
            __dmul_rn(half_m, vv),
            __dmul_rn(half_m, pot[i]),
            __dmul_rn(m, v0),
            __dmul_rn(m, v1),
            __dmul_rn(m, v2),
            __dmul_rn(m, __dsub_rn(__dmul_rn(x1, v2), __dmul_rn(x2, v1))),
            __dmul_rn(m, __dsub_rn(__dmul_rn(x2, v0), __dmul_rn(x0, v2))),
            __dmul_rn(m, __dsub_rn(__dmul_rn(x0, v1), __dmul_rn(x1, v0))),
            __dmul_rn(m, x0),
            __dmul_rn(m, x1),
            __dmul_rn(m, x2),
            m,
        };
        for (int k = 0; k < CONSERVED_SUMS; ++k) acc[k] = __dadd_rn(acc[k], term[k]);
    }
    for (int k = 0; k < CONSERVED_SUMS; ++k) partial[CONSERVED_SUMS * c + k] = acc[k];
}
