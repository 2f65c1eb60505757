// Near field (P2P): one block per target leaf. Source leaves of the target's P2P list are
// staged tile by tile in shared memory, relative to the target leaf's centre in f32 (the
// mixed-precision near field of design §5.7). Each thread owns up to P2P_MAX_TARGETS
// targets at once: with a block of `width` threads, a leaf of at most k width targets
// (k = 1, 2, 3) gives each thread k, a larger one four, and a leaf larger than 4 width is
// taken in rounds. The GPU launches one warp per leaf, so most leaves (tens of particles)
// keep their lanes busy, and a full leaf of 128 reads each staged source once for four
// targets, in four independent chains of sums. A thread sums one tile in f32 for each of
// its targets and adds the tile's sums into f64 accumulators: a fixed order, so the
// results are the same bits on every run (no atomics). Zero separations (a particle with
// itself) add nothing.
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
};

// Largest block: the shared tile holds one source per thread.
#define P2P_MAX_BLOCK 256
// Most targets a thread owns at once.
#define P2P_MAX_TARGETS 4

// Adds one staged tile's `n` sources (x, y, z relative to the leaf centre, mass) to the f32
// sums of a thread's T targets. The pair family and T are template arguments, so the
// inner loop carries no test of them; each source is one 16-byte shared-memory load, the
// same for every thread of the warp (a broadcast), used for all T targets.
//
// A zero separation (the particle itself, or one at the same place) adds nothing, as in the
// CPU's pair sums. Where the factors stay finite at r = 0 that is one select of the mass
// (Plummer: ε² > 0). The spline floors r² at 1e-30 so that they do; such a pair lies inside
// the support, so its factors are zeroed on the polynomials' branch and the Newtonian
// branch, where most pairs go, masks nothing. Newtonian pairs also replace r² = 0 by a far
// one.
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
                    p = r2 > 0.0f ? p : 0.0f;
                }
            } else if (FAMILY == LEAPFMM_PLUMMER) {
                plummer_factors(r2, soft.eps2, &f, &p);
                m = r2 > 0.0f ? m : 0.0f;
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

// A leaf's targets in rounds of T width: in a round thread x owns targets round + x + t
// width, t < T (those past t_end are computed at the centre and not written). Every thread
// takes part in every round and every tile load, active or not.
template <int FAMILY, int T>
__device__ __forceinline__ void p2p_targets(
    const double* __restrict__ pos, const double* __restrict__ mass,
    const unsigned* __restrict__ leaf_begin, const unsigned* __restrict__ leaf_end,
    const unsigned* __restrict__ sources, unsigned first, unsigned last, double cx, double cy,
    double cz, unsigned t_begin, unsigned t_end, const PairSoftening& soft, double g,
    float4* tile, double* __restrict__ acc, double* __restrict__ pot)
{
    const unsigned width = blockDim.x;
    for (unsigned round = t_begin; round < t_end; round += T * width) {
        float xi[T], yi[T], zi[T];
        double ax[T], ay[T], az[T], ph[T];
#pragma unroll
        for (int t = 0; t < T; ++t) {
            const unsigned i = round + threadIdx.x + t * width;
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
        for (unsigned s = first; s < last; ++s) {
            const unsigned src = sources[s];
            const unsigned s_begin = leaf_begin[src];
            const unsigned s_end = leaf_end[src];
            for (unsigned base = s_begin; base < s_end; base += width) {
                const unsigned j = base + threadIdx.x;
                __syncthreads();
                if (j < s_end) {
                    tile[threadIdx.x] = make_float4((float)(pos[3 * j] - cx),
                                                    (float)(pos[3 * j + 1] - cy),
                                                    (float)(pos[3 * j + 2] - cz), (float)mass[j]);
                }
                __syncthreads();
                const unsigned n = min(width, s_end - base);
                float sx[T], sy[T], sz[T], sp[T];
#pragma unroll
                for (int t = 0; t < T; ++t) {
                    sx[t] = 0.0f;
                    sy[t] = 0.0f;
                    sz[t] = 0.0f;
                    sp[t] = 0.0f;
                }
                add_tile<FAMILY, T>(tile, n, xi, yi, zi, soft, sx, sy, sz, sp);
#pragma unroll
                for (int t = 0; t < T; ++t) {
                    ax[t] += sx[t];
                    ay[t] += sy[t];
                    az[t] += sz[t];
                    ph[t] += sp[t];
                }
            }
        }
#pragma unroll
        for (int t = 0; t < T; ++t) {
            const unsigned i = round + threadIdx.x + t * width;
            if (i < t_end) {
                acc[3 * i] += g * ax[t];
                acc[3 * i + 1] += g * ay[t];
                acc[3 * i + 2] += g * az[t];
                pot[i] -= g * ph[t];
            }
        }
    }
}

// The leaf's targets with as many per thread as its size needs (the same for the whole
// block, so no thread waits for another's branch).
template <int FAMILY>
__device__ __forceinline__ void p2p_sized(
    const double* __restrict__ pos, const double* __restrict__ mass,
    const unsigned* __restrict__ leaf_begin, const unsigned* __restrict__ leaf_end,
    const unsigned* __restrict__ sources, unsigned first, unsigned last, double cx, double cy,
    double cz, unsigned t_begin, unsigned t_end, const PairSoftening& soft, double g,
    float4* tile, double* __restrict__ acc, double* __restrict__ pot)
{
    const unsigned targets = t_end - t_begin, width = blockDim.x;
    if (targets <= width) {
        p2p_targets<FAMILY, 1>(pos, mass, leaf_begin, leaf_end, sources, first, last, cx, cy,
                               cz, t_begin, t_end, soft, g, tile, acc, pot);
    } else if (targets <= 2 * width) {
        p2p_targets<FAMILY, 2>(pos, mass, leaf_begin, leaf_end, sources, first, last, cx, cy,
                               cz, t_begin, t_end, soft, g, tile, acc, pot);
    } else if (targets <= 3 * width) {
        p2p_targets<FAMILY, 3>(pos, mass, leaf_begin, leaf_end, sources, first, last, cx, cy,
                               cz, t_begin, t_end, soft, g, tile, acc, pot);
    } else {
        p2p_targets<FAMILY, P2P_MAX_TARGETS>(pos, mass, leaf_begin, leaf_end, sources, first,
                                             last, cx, cy, cz, t_begin, t_end, soft, g,
                                             tile, acc, pot);
    }
}

extern "C" __global__ void p2p_leaves(
    const double* __restrict__ pos,        // 3 per particle, sorted by leaf
    const double* __restrict__ mass,       // per particle
    const unsigned* __restrict__ leaf_begin,  // per leaf: first particle
    const unsigned* __restrict__ leaf_end,    // per leaf: one past the last
    const double* __restrict__ leaf_centre,   // 3 per leaf
    const unsigned* __restrict__ targets,     // the target leaves, one per block
    const unsigned long long* __restrict__ spans,  // per leaf: (start << 32 | len) in `sources`
    const unsigned* __restrict__ sources,          // source leaves
    int kernel, float eps2, float h, double g,
    double* __restrict__ acc,   // 3 per particle (+=)
    double* __restrict__ pot)   // per particle (+=)
{
    __shared__ float4 tile[P2P_MAX_BLOCK];
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
    const PairSoftening soft = {eps2, h, 1.0f / h, h * h};
    if (kernel == LEAPFMM_SPLINE && h > 0.0f) {
        p2p_sized<LEAPFMM_SPLINE>(pos, mass, leaf_begin, leaf_end, sources, first, last, cx,
                                  cy, cz, t_begin, t_end, soft, g, tile, acc, pot);
    } else if (kernel == LEAPFMM_PLUMMER && eps2 > 0.0f) {
        p2p_sized<LEAPFMM_PLUMMER>(pos, mass, leaf_begin, leaf_end, sources, first, last, cx,
                                   cy, cz, t_begin, t_end, soft, g, tile, acc, pot);
    } else {
        p2p_sized<P2P_NEWTONIAN>(pos, mass, leaf_begin, leaf_end, sources, first, last, cx, cy,
                                 cz, t_begin, t_end, soft, g, tile, acc, pot);
    }
}
