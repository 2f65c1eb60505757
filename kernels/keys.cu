// The tree order of a step found where the particles are (design §5 steps 1–2 on the
// device): the bounding box of the positions, their Morton keys, and a stable radix sort of
// (key, particle index) records. The host then only splits the sorted keys into cells.
//
// Keys are those of src/fmm/morton.rs, bit for bit: each coordinate's offset and scaling
// rounded separately (__dsub_rn, __dmul_rn: no fused multiply-add), truncated toward zero
// and clamped to 21 bits, the three interleaved with x most significant.
//
// The sort is a least-significant-digit radix sort on 8-bit digits, stable, with no
// floating point and no atomics whose order could show: a pass counts each block's digits
// (radix_count), one block turns the counts into output offsets (radix_offsets), and each
// block writes its records in input order (radix_scatter), ranking each record among the
// equal digits before it in its block. Starting from the identity index, equal keys come out
// in particle-index order; the host orders those rare runs by id as its own sort does.

// Threads of a sort block: one per digit value.
#define RADIX_THREADS 256
// Records per thread and pass: a block handles RADIX_THREADS * RADIX_ITEMS consecutive
// records.
#define RADIX_ITEMS 16
#define RADIX_TILE (RADIX_THREADS * RADIX_ITEMS)
// Most threads of a bounds_blocks block.
#define BOUNDS_MAX_THREADS 256

// Per-block extremes of the positions: out[7 b + k] the smallest coordinate k, out[7 b + 3 + k]
// the largest (non-finite values ignored, as `f64::min` and `max` ignore NaN), out[7 b + 6]
// 1 when a position or mass of the block is not finite, else 0. Blocks stride over the
// particles; blockDim.x must be a power of two no larger than BOUNDS_MAX_THREADS.
extern "C" __global__ void bounds_blocks(const double* __restrict__ pos,
                                         const double* __restrict__ mass, unsigned n,
                                         double* __restrict__ out) {
    __shared__ double lo[3][BOUNDS_MAX_THREADS];
    __shared__ double hi[3][BOUNDS_MAX_THREADS];
    __shared__ int bad[BOUNDS_MAX_THREADS];
    const unsigned t = threadIdx.x;
    // f64::MAX and f64::MIN, the host's extremes of no particle.
    const double largest = 1.7976931348623157e308;
    double l[3] = {largest, largest, largest};
    double h[3] = {-largest, -largest, -largest};
    int not_finite = 0;
    for (unsigned i = blockIdx.x * blockDim.x + t; i < n; i += gridDim.x * blockDim.x) {
        for (int k = 0; k < 3; ++k) {
            const double x = pos[3 * i + k];
            if (isfinite(x)) {
                l[k] = fmin(l[k], x);
                h[k] = fmax(h[k], x);
            } else {
                not_finite = 1;
            }
        }
        if (!isfinite(mass[i])) not_finite = 1;
    }
    for (int k = 0; k < 3; ++k) {
        lo[k][t] = l[k];
        hi[k][t] = h[k];
    }
    bad[t] = not_finite;
    __syncthreads();
    for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
        if (t < half) {
            for (int k = 0; k < 3; ++k) {
                lo[k][t] = fmin(lo[k][t], lo[k][t + half]);
                hi[k][t] = fmax(hi[k][t], hi[k][t + half]);
            }
            bad[t] = bad[t] | bad[t + half];
        }
        __syncthreads();
    }
    if (t == 0) {
        for (int k = 0; k < 3; ++k) {
            out[7 * blockIdx.x + k] = lo[k][0];
            out[7 * blockIdx.x + 3 + k] = hi[k][0];
        }
        out[7 * blockIdx.x + 6] = bad[0] ? 1.0 : 0.0;
    }
}

// The low 21 bits of v spread so that bit i moves to bit 3i (morton.rs: spread).
__device__ __forceinline__ unsigned long long spread21(unsigned long long v) {
    unsigned long long x = v & 0x1fffffull;
    x = (x | (x << 32)) & 0x001f00000000ffffull;
    x = (x | (x << 16)) & 0x001f0000ff0000ffull;
    x = (x | (x << 8)) & 0x100f00f00f00f00full;
    x = (x | (x << 4)) & 0x10c30c30c30c30c3ull;
    x = (x | (x << 2)) & 0x1249249249249249ull;
    return x;
}

// The cell coordinate along one axis (morton.rs: BoundingCube::key's `q`).
__device__ __forceinline__ unsigned long long grid_coordinate(double x, double lo, double scale) {
    const double scaled = __dmul_rn(__dsub_rn(x, lo), scale);
    long long q = (long long)scaled;
    q = q < 0 ? 0 : q;
    q = q > 0x1fffffll ? 0x1fffffll : q;
    return (unsigned long long)q;
}

// keys[i] = the Morton key of particle i in the cube with lower corner lo and
// scale = 2^21 / side; index[i] = i.
extern "C" __global__ void morton_keys(const double* __restrict__ pos, unsigned n, double lo_x,
                                       double lo_y, double lo_z, double scale,
                                       unsigned long long* __restrict__ keys,
                                       unsigned* __restrict__ index) {
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const unsigned long long qx = grid_coordinate(pos[3 * i], lo_x, scale);
        const unsigned long long qy = grid_coordinate(pos[3 * i + 1], lo_y, scale);
        const unsigned long long qz = grid_coordinate(pos[3 * i + 2], lo_z, scale);
        keys[i] = spread21(qz) | (spread21(qy) << 1) | (spread21(qx) << 2);
        index[i] = i;
    }
}

// Pass `shift` of the sort, step 1: counts[d * gridDim.x + b] = how many of block b's records
// have digit d. RADIX_THREADS threads per block.
extern "C" __global__ void radix_count(const unsigned long long* __restrict__ keys, unsigned n,
                                       unsigned shift, unsigned* __restrict__ counts) {
    __shared__ unsigned histogram[RADIX_THREADS];
    const unsigned t = threadIdx.x;
    histogram[t] = 0;
    __syncthreads();
    const unsigned base = blockIdx.x * RADIX_TILE;
    for (unsigned s = 0; s < RADIX_ITEMS; ++s) {
        const unsigned i = base + s * RADIX_THREADS + t;
        if (i < n) atomicAdd(&histogram[(unsigned)(keys[i] >> shift) & 255u], 1u);
    }
    __syncthreads();
    counts[t * gridDim.x + blockIdx.x] = histogram[t];
}

// Step 2: the exclusive prefix sum of the `len` counts in place (digit-major, so that each
// (digit, block) gets the output position of its first record). One block of blockDim.x
// threads (a power of two no larger than 1024), each over one stretch of the counts.
extern "C" __global__ void radix_offsets(unsigned* __restrict__ counts, unsigned len) {
    __shared__ unsigned sums[1024];
    const unsigned t = threadIdx.x;
    const unsigned stretch = (len + blockDim.x - 1) / blockDim.x;
    const unsigned begin = min(t * stretch, len), end = min(begin + stretch, len);
    unsigned total = 0;
    for (unsigned i = begin; i < end; ++i) total += counts[i];
    sums[t] = total;
    __syncthreads();
    // Inclusive scan of the stretch totals (Hillis–Steele), each step read then written.
    for (unsigned step = 1; step < blockDim.x; step *= 2) {
        const unsigned add = t >= step ? sums[t - step] : 0u;
        __syncthreads();
        sums[t] += add;
        __syncthreads();
    }
    unsigned running = sums[t] - total;
    for (unsigned i = begin; i < end; ++i) {
        const unsigned c = counts[i];
        counts[i] = running;
        running += c;
    }
}

// Step 3: block b writes its records, in input order within each digit, from the offsets of
// step 2. RADIX_THREADS threads per block, as in radix_count.
extern "C" __global__ void radix_scatter(const unsigned long long* __restrict__ keys_in,
                                         const unsigned* __restrict__ index_in, unsigned n,
                                         unsigned shift, const unsigned* __restrict__ offsets,
                                         unsigned long long* __restrict__ keys_out,
                                         unsigned* __restrict__ index_out) {
    __shared__ unsigned next[RADIX_THREADS];
    __shared__ unsigned digit[RADIX_THREADS];
    __shared__ unsigned taken[RADIX_THREADS];
    const unsigned t = threadIdx.x;
    next[t] = offsets[t * gridDim.x + blockIdx.x];
    const unsigned base = blockIdx.x * RADIX_TILE;
    for (unsigned s = 0; s < RADIX_ITEMS; ++s) {
        const unsigned i = base + s * RADIX_THREADS + t;
        unsigned long long key = 0;
        unsigned d = RADIX_THREADS;  // no record
        if (i < n) {
            key = keys_in[i];
            d = (unsigned)(key >> shift) & 255u;
        }
        digit[t] = d;
        taken[t] = 0;
        __syncthreads();
        if (i < n) {
            unsigned rank = 0;
            for (unsigned j = 0; j < t; ++j) rank += digit[j] == d ? 1u : 0u;
            const unsigned at = next[d] + rank;
            keys_out[at] = key;
            index_out[at] = index_in[i];
            atomicAdd(&taken[d], 1u);
        }
        __syncthreads();
        next[t] += taken[t];
        __syncthreads();
    }
}
