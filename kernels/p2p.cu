// Near field (P2P): one block per target leaf. The particles of the source leaves of the
// target's P2P list are staged tile by tile in shared memory, relative to the target leaf's
// centre in f32 (the mixed-precision near field of design §5.7), packed: a tile holds
// P2P_TILE sources from as many leaves of the list as it takes, so a tile is full whatever
// the leaves' sizes. The block's lanes are split into G groups of L lanes: each lane owns T
// targets of a round (L T targets a round), and the groups share out each tile's sources
// (group g its segments g, g + G, ...). `p2p_shape` picks L and T by the leaf's size: a
// leaf of 5 targets takes L = 2, T = 3 (16 groups of 2 lanes, each group a sixteenth of
// the sources), so few lanes idle on small leaves, while a leaf of 96 on a warp takes
// L = 32, T = 3 (each staged source used for three targets of every lane). A thread sums a
// segment of up to P2P_RUN sources in f32 for each of its targets and adds those sums into
// f64 accumulators, and the groups' f64 sums of a target are added in group order at the
// end of the round: a fixed order, so the results are the same bits on every run (no
// atomics). A zero separation (a particle with itself, or another at exactly its place)
// adds no force and the kernel's central potential m/ε; each target's own term is taken
// back out when its leaf is on its own list, as the CPU's near field does.
#include "common.cuh"

// The pair families of the tile loop: the two softened ones of common.cuh, and Newtonian
// (Plummer with no softening, or a spline of no support).
#define P2P_NEWTONIAN 2

// The softening of a launch, with what the tile loop needs of it worked out once.
struct PairSoftening {
    float eps2;   // Plummer: ε²
    float h;      // spline: the support, its inverse and its square
    float h_inv;
    float h2;
    float p0;     // the central potential factor p(0) = 1/ε (0: Newtonian)
    double self_p0;  // p(0) in f64 when the target leaf is on its own list, else 0
};

// Largest block (a power of two): a block scans that many leaves of its list at once, and
// the groups' sums of a round pass through shared memory, 4 values a thread.
#define P2P_MAX_BLOCK 64
// Sources a tile holds (a multiple of the block's width).
#define P2P_TILE 256
// Most targets a thread owns at once.
#define P2P_MAX_TARGETS 3
// The sources of a tile in segments of P2P_RUN, or fewer when there are more groups than
// P2P_TILE / P2P_RUN (so that every group has a segment): a group sums one segment at a
// time in f32 (the rounding of the f32 sums stays that of a warp-wide tile) and adds the
// sums into its f64 accumulators. In shared memory each segment is followed by one unused
// slot, so that the groups' segments start on different banks (4 banks further each).
#define P2P_RUN 32
// Slots of the tile: a gap after each segment (a tile has at most max(8, G) segments, so
// no more than a block has threads).
#define P2P_TILE_SLOTS (P2P_TILE + P2P_MAX_BLOCK)

// The block's shared memory: the staged tile, the scanned leaves of the list, and the
// groups' sums at the end of a round.
struct P2pShared {
    float4* tile;       // P2P_TILE sources, in segments each followed by a gap
    unsigned* start;    // width + 1: where each scanned leaf starts among the staged sources
    unsigned* first;    // width: each scanned leaf's first particle
    double* sums;       // 4 width: a round's sums, one target per thread
};

// Adds `n` staged sources (x, y, z relative to the leaf centre, mass) to the f32 sums of a
// thread's T targets. The pair family and T are template arguments, so the inner loop
// carries no test of them; each source is one 16-byte shared-memory load, the same for
// every thread of a group (a broadcast), used for all T targets.
//
// A zero separation (the particle itself, or one at the same place) adds no force and the
// central potential p(0), as in the CPU's pair sums. Plummer's factors are finite at r = 0
// (ε² > 0) and its p(0) is 1/ε already; the force vanishes with the separation. The spline
// floors r² at 1e-30 so that its factors stay finite; such a pair lies inside the support,
// so the polynomials' branch zeroes its force and puts p(0) in its potential, and the
// Newtonian branch, where most pairs go, masks nothing. Newtonian pairs replace r² = 0 by
// a far one and add nothing.
template <int FAMILY, int T>
__device__ __forceinline__ void add_tile(const float4* tile, unsigned n, const float* xi,
                                         const float* yi, const float* zi,
                                         const PairSoftening& soft, float* sx, float* sy,
                                         float* sz, float* sp) {
    // Sources per pass of the loop: its own instructions (the shared address, the count,
    // the branch) shared out over 4 pairs or more.
    [[maybe_unused]] constexpr int SOURCES_PER_PASS = T == 1 ? 4 : 2;
#pragma unroll SOURCES_PER_PASS
    for (unsigned k = 0; k < n; ++k) {
        const float4 s = tile[k];
#pragma unroll
        for (int t = 0; t < T; ++t) {
            const float dx = s.x - xi[t];
            const float dy = s.y - yi[t];
            const float dz = s.z - zi[t];
            const float r2 = dx * dx + dy * dy + dz * dz;
            float m = s.w, f, p;
            if (FAMILY == LEAPFMM_SPLINE) {
                const float r2s = fmaxf(r2, 1e-30f);
                const float inv_r = rsqrtf(r2s);
                if (r2s >= soft.h2) {
                    f = inv_r * inv_r * inv_r;
                    p = inv_r;
                } else {
                    spline_inside(r2s * inv_r, inv_r, soft.h, soft.h_inv, &f, &p);
                    f = r2 > 0.0f ? f : 0.0f;
                    p = r2 > 0.0f ? p : soft.p0;
                }
            } else if (FAMILY == LEAPFMM_PLUMMER) {
                plummer_factors(r2, soft.eps2, &f, &p);
            } else {
                const bool pair = r2 > 0.0f;
                m = pair ? m : 0.0f;
                const float inv_r = rsqrtf(pair ? r2 : 1e30f);
                f = inv_r * inv_r * inv_r;
                p = inv_r;
            }
            const float mf = m * f;
            sx[t] += mf * dx;
            sy[t] += mf * dy;
            sz[t] += mf * dz;
            sp[t] += m * p;
        }
    }
}

// Scans the leaves sources[chunk .. chunk + min(width, last - chunk)] of a list: on return
// sh.first[j] is leaf j's first particle and sh.start[j] where its particles start among
// the chunk's (sh.start[j] = the total for j past the chunk's leaves, and sh.start[width]);
// returns the total. Every thread of the block takes part.
__device__ __forceinline__ unsigned scan_leaves(const unsigned* __restrict__ leaf_begin,
                                                const unsigned* __restrict__ leaf_end,
                                                const unsigned* __restrict__ sources,
                                                unsigned chunk, unsigned last,
                                                const P2pShared& sh) {
    const unsigned width = blockDim.x, lane = threadIdx.x;
    unsigned len = 0, begin = 0;
    if (chunk + lane < last) {
        const unsigned src = sources[chunk + lane];
        begin = leaf_begin[src];
        len = leaf_end[src] - begin;
    }
    // Inclusive sums of the lengths (Hillis-Steele), in sh.start[1 ..].
    __syncthreads();
    sh.first[lane] = begin;
    unsigned sum = len;
    for (unsigned off = 1; off < width; off <<= 1) {
        sh.start[lane + 1] = sum;
        __syncthreads();
        if (lane >= off) sum += sh.start[lane + 1 - off];
        __syncthreads();
    }
    sh.start[lane + 1] = sum;
    if (lane == 0) sh.start[0] = 0;
    __syncthreads();
    return sh.start[width];
}

// Stages the chunk's sources base .. base + n (n ≤ P2P_TILE) into sh.tile in segments of
// 2^shift (source e at slot e + e / 2^shift), relative to (cx, cy, cz). Each thread finds
// the leaf of each of its sources by a binary search of sh.start (the last leaf that starts
// at or before it: empty leaves are skipped), so its loads are independent of one another.
__device__ __forceinline__ void stage_tile(const double* __restrict__ pos,
                                           const double* __restrict__ mass, unsigned base,
                                           unsigned n, unsigned shift, double cx, double cy,
                                           double cz, const P2pShared& sh) {
    const unsigned width = blockDim.x;
#pragma unroll 4
    for (unsigned e = threadIdx.x; e < n; e += width) {
        const unsigned at = base + e;
        unsigned leaf = 0;
        for (unsigned step = width >> 1; step > 0; step >>= 1) {
            if (sh.start[leaf + step] <= at) leaf += step;
        }
        const unsigned j = sh.first[leaf] + (at - sh.start[leaf]);
        sh.tile[e + (e >> shift)] =
            make_float4((float)(pos[3 * j] - cx), (float)(pos[3 * j + 1] - cy),
                        (float)(pos[3 * j + 2] - cz), (float)mass[j]);
    }
}

// A leaf's targets in rounds of `lanes` T: in a round, thread x + g lanes (group g) owns
// targets round + x + t lanes, t < T (those past t_end are computed at the centre and not
// written), and sums the segments g, g + G, ... of every tile (G = width / lanes groups).
// Every thread takes part in every round, tile load and barrier, active or not.
template <int FAMILY, int T>
__device__ __forceinline__ void p2p_targets(
    const double* __restrict__ pos, const double* __restrict__ mass,
    const unsigned* __restrict__ leaf_begin, const unsigned* __restrict__ leaf_end,
    const unsigned* __restrict__ sources, unsigned first, unsigned last, double cx, double cy,
    double cz, unsigned t_begin, unsigned t_end, unsigned lanes, const PairSoftening& soft,
    double g, const P2pShared& sh, double* __restrict__ acc, double* __restrict__ pot)
{
    const unsigned width = blockDim.x, lane = threadIdx.x;
    const unsigned groups = width / lanes, group = lane / lanes, x = lane - group * lanes;
    // Segments of 2^shift sources: P2P_RUN, or less so that a tile has one for every group.
    const unsigned segment = min((unsigned)P2P_RUN, (unsigned)P2P_TILE / groups);
    unsigned shift = 0;
    while ((1u << shift) < segment) ++shift;
    for (unsigned round = t_begin; round < t_end; round += T * lanes) {
        float xi[T], yi[T], zi[T];
        double ax[T], ay[T], az[T], ph[T];
#pragma unroll
        for (int t = 0; t < T; ++t) {
            const unsigned i = round + x + t * lanes;
            xi[t] = 0.0f;
            yi[t] = 0.0f;
            zi[t] = 0.0f;
            if (i < t_end) {
                xi[t] = (float)(pos[3 * i] - cx);
                yi[t] = (float)(pos[3 * i + 1] - cy);
                zi[t] = (float)(pos[3 * i + 2] - cz);
            }
            ax[t] = 0.0;
            ay[t] = 0.0;
            az[t] = 0.0;
            ph[t] = 0.0;
        }
        for (unsigned chunk = first; chunk < last; chunk += width) {
            const unsigned total = scan_leaves(leaf_begin, leaf_end, sources, chunk, last, sh);
            for (unsigned base = 0; base < total; base += P2P_TILE) {
                const unsigned n = min((unsigned)P2P_TILE, total - base);
                __syncthreads();
                stage_tile(pos, mass, base, n, shift, cx, cy, cz, sh);
                __syncthreads();
                for (unsigned seg = group; seg * segment < n; seg += groups) {
                    float sx[T], sy[T], sz[T], sp[T];
#pragma unroll
                    for (int t = 0; t < T; ++t) {
                        sx[t] = 0.0f;
                        sy[t] = 0.0f;
                        sz[t] = 0.0f;
                        sp[t] = 0.0f;
                    }
                    add_tile<FAMILY, T>(sh.tile + seg * (segment + 1),
                                        min(segment, n - seg * segment), xi, yi, zi, soft, sx,
                                        sy, sz, sp);
#pragma unroll
                    for (int t = 0; t < T; ++t) {
                        ax[t] += sx[t];
                        ay[t] += sy[t];
                        az[t] += sz[t];
                        ph[t] += sp[t];
                    }
                }
            }
        }
        // Group 0 adds the other groups' sums of its targets, in group order, and writes.
#pragma unroll
        for (int t = 0; t < T; ++t) {
            const unsigned i = round + x + t * lanes;
            if (groups > 1) {
                __syncthreads();
                sh.sums[lane] = ax[t];
                sh.sums[width + lane] = ay[t];
                sh.sums[2 * width + lane] = az[t];
                sh.sums[3 * width + lane] = ph[t];
                __syncthreads();
                if (group == 0) {
                    for (unsigned o = 1; o < groups; ++o) {
                        const unsigned from = x + o * lanes;
                        ax[t] += sh.sums[from];
                        ay[t] += sh.sums[width + from];
                        az[t] += sh.sums[2 * width + from];
                        ph[t] += sh.sums[3 * width + from];
                    }
                }
            }
            if (group == 0 && i < t_end) {
                acc[3 * i] += g * ax[t];
                acc[3 * i + 1] += g * ay[t];
                acc[3 * i + 2] += g * az[t];
                pot[i] -= g * ph[t];
                if (soft.self_p0 != 0.0) pot[i] += g * (mass[i] * soft.self_p0);
            }
        }
    }
}

// Instructions per pair of the tile loop at T targets a thread, x100 (the sm_90 SASS of the
// Plummer loop: 19.5, 19.0 and 18.33 at one, two and three).
__device__ __forceinline__ unsigned pair_cost(int t) {
    return t == 1 ? 1950u : t == 2 ? 1900u : 1833u;
}

// The shape of a leaf of `targets` targets on a block of `width` threads (a power of two):
// the lanes per group and the targets per thread whose rounds take the fewest instructions,
// each round costing its pairs' (lanes T pair_cost(T) per source) and a weight of 3 per
// source for staging the sources again (a round more reads every source again; the weight
// keeps that to ~1.1-1.5x the reads of one round on the galaxy model's leaves). Ties go
// to more lanes, then more targets a thread.
__device__ __forceinline__ void p2p_shape(unsigned targets, unsigned width, unsigned* lanes,
                                          int* per_thread) {
    unsigned long long best = ~0ull;
    *lanes = width;
    *per_thread = 1;
    for (unsigned l = width; l >= 1; l >>= 1) {
        for (int t = P2P_MAX_TARGETS; t >= 1; --t) {
            const unsigned long long rounds = (targets + l * t - 1) / (l * t);
            const unsigned long long cost =
                rounds * ((unsigned long long)l * t * pair_cost(t) + 300ull * width);
            if (cost < best) {
                best = cost;
                *lanes = l;
                *per_thread = t;
            }
        }
    }
}

// The leaf's targets in the shape `p2p_shape` picks (the same for the whole block, so no
// thread waits for another's branch).
template <int FAMILY>
__device__ __forceinline__ void p2p_sized(
    const double* __restrict__ pos, const double* __restrict__ mass,
    const unsigned* __restrict__ leaf_begin, const unsigned* __restrict__ leaf_end,
    const unsigned* __restrict__ sources, unsigned first, unsigned last, double cx, double cy,
    double cz, unsigned t_begin, unsigned t_end, const PairSoftening& soft, double g,
    const P2pShared& sh, double* __restrict__ acc, double* __restrict__ pot)
{
    unsigned lanes;
    int per_thread;
    p2p_shape(t_end - t_begin, blockDim.x, &lanes, &per_thread);
    if (per_thread == 1) {
        p2p_targets<FAMILY, 1>(pos, mass, leaf_begin, leaf_end, sources, first, last, cx, cy,
                               cz, t_begin, t_end, lanes, soft, g, sh, acc, pot);
    } else if (per_thread == 2) {
        p2p_targets<FAMILY, 2>(pos, mass, leaf_begin, leaf_end, sources, first, last, cx, cy,
                               cz, t_begin, t_end, lanes, soft, g, sh, acc, pot);
    } else if (per_thread == 3) {
        p2p_targets<FAMILY, 3>(pos, mass, leaf_begin, leaf_end, sources, first, last, cx, cy,
                               cz, t_begin, t_end, lanes, soft, g, sh, acc, pot);
    } else {
        p2p_targets<FAMILY, P2P_MAX_TARGETS>(pos, mass, leaf_begin, leaf_end, sources, first,
                                             last, cx, cy, cz, t_begin, t_end, lanes, soft, g,
                                             sh, acc, pot);
    }
}

// The launch bounds hold ptxas to 96 registers (65536 / (10 P2P_MAX_BLOCK)), without
// spills: 21 blocks of a warp per SM. Left to itself it takes 119 for the three-target
// loop (17 blocks).
extern "C" __global__ void __launch_bounds__(P2P_MAX_BLOCK, 10) p2p_leaves(
    const double* __restrict__ pos,        // 3 per particle, sorted by leaf
    const double* __restrict__ mass,       // per particle
    const unsigned* __restrict__ leaf_begin,  // per leaf: first particle
    const unsigned* __restrict__ leaf_end,    // per leaf: one past the last
    const double* __restrict__ leaf_centre,   // 3 per leaf
    const unsigned* __restrict__ targets,     // the target leaves, one per block
    const unsigned long long* __restrict__ spans,  // per leaf: (start << 32 | len) in `sources`
    const unsigned* __restrict__ sources,          // source leaves
    int kernel, float eps2, float h,
    double p0,  // the central potential factor 1/ε in f64, as the CPU has it
    double g,
    double* __restrict__ acc,   // 3 per particle (+=)
    double* __restrict__ pot)   // per particle (+=)
{
    __shared__ float4 tile[P2P_TILE_SLOTS];
    __shared__ unsigned start[P2P_MAX_BLOCK + 1];
    __shared__ unsigned first_particle[P2P_MAX_BLOCK];
    __shared__ double sums[4 * P2P_MAX_BLOCK];
    const P2pShared sh = {tile, start, first_particle, sums};
    const unsigned leaf = targets[blockIdx.x];
    const unsigned t_begin = leaf_begin[leaf];
    const unsigned t_end = leaf_end[leaf];
    const double cx = leaf_centre[3 * leaf];
    const double cy = leaf_centre[3 * leaf + 1];
    const double cz = leaf_centre[3 * leaf + 2];
    const unsigned long long span = spans[leaf];
    const unsigned first = (unsigned)(span >> 32);
    const unsigned last = first + (unsigned)(span & 0xffffffffu);
    // The spline needs a positive support and Plummer softening a positive ε²; without
    // them the forces are Newtonian.
    // Every thread reads the list (the same addresses: broadcasts) for the leaf itself.
    bool self_listed = false;
    for (unsigned k = first; k < last; ++k) self_listed |= sources[k] == leaf;
    const bool spline = kernel == LEAPFMM_SPLINE && h > 0.0f;
    const bool plummer = kernel == LEAPFMM_PLUMMER && eps2 > 0.0f;
    const double central = spline || plummer ? p0 : 0.0;
    const PairSoftening soft = {eps2, h, 1.0f / h, h * h, (float)central,
                                self_listed ? central : 0.0};
    if (spline) {
        p2p_sized<LEAPFMM_SPLINE>(pos, mass, leaf_begin, leaf_end, sources, first, last, cx,
                                  cy, cz, t_begin, t_end, soft, g, sh, acc, pot);
    } else if (plummer) {
        p2p_sized<LEAPFMM_PLUMMER>(pos, mass, leaf_begin, leaf_end, sources, first, last, cx,
                                   cy, cz, t_begin, t_end, soft, g, sh, acc, pot);
    } else {
        p2p_sized<P2P_NEWTONIAN>(pos, mass, leaf_begin, leaf_end, sources, first, last, cx, cy,
                                 cz, t_begin, t_end, soft, g, sh, acc, pot);
    }
}
