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

// Largest block: the shared tile holds one source per thread.
#define P2P_MAX_BLOCK 256
// Most targets a thread owns at once.
#define P2P_MAX_TARGETS 4

// Adds one staged tile's `n` sources (x, y, z relative to the leaf centre, mass) to the f32
// sums of a thread's T targets. The kernel family and T are template arguments, so the
// inner loop carries no test of them; each source is one 16-byte shared-memory load, the
// same for every thread of the warp (a broadcast), used for all T targets.
template <int KERNEL, int T>
__device__ __forceinline__ void add_tile(const float4* tile, unsigned n, const float* xi,
                                         const float* yi, const float* zi, float eps2,
                                         float h, float* sx, float* sy, float* sz, float* sp) {
    for (unsigned k = 0; k < n; ++k) {
        const float4 s = tile[k];
#pragma unroll
        for (int t = 0; t < T; ++t) {
            const float dx = s.x - xi[t];
            const float dy = s.y - yi[t];
            const float dz = s.z - zi[t];
            const float r2 = dx * dx + dy * dy + dz * dz;
            // A zero separation (the particle itself) adds nothing: its mass is masked to
            // zero and its r2 replaced by a far one (finite factors, the spline's cheap
            // branch), by selects rather than a branch around the pair.
            const bool pair = r2 > 0.0f;
            const float m = pair ? s.w : 0.0f;
            float f, p;
            if (KERNEL == LEAPFMM_SPLINE) {
                spline_factors(pair ? r2 : 1e30f, h, &f, &p);
            } else {
                plummer_factors(pair ? r2 : 1e30f, eps2, &f, &p);
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
template <int KERNEL, int T>
__device__ __forceinline__ void p2p_targets(
    const double* __restrict__ pos, const double* __restrict__ mass,
    const unsigned* __restrict__ leaf_begin, const unsigned* __restrict__ leaf_end,
    const unsigned* __restrict__ sources, unsigned first, unsigned last, double cx, double cy,
    double cz, unsigned t_begin, unsigned t_end, float eps2, float h, double g,
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
                add_tile<KERNEL, T>(tile, n, xi, yi, zi, eps2, h, sx, sy, sz, sp);
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
template <int KERNEL>
__device__ __forceinline__ void p2p_sized(
    const double* __restrict__ pos, const double* __restrict__ mass,
    const unsigned* __restrict__ leaf_begin, const unsigned* __restrict__ leaf_end,
    const unsigned* __restrict__ sources, unsigned first, unsigned last, double cx, double cy,
    double cz, unsigned t_begin, unsigned t_end, float eps2, float h, double g,
    float4* tile, double* __restrict__ acc, double* __restrict__ pot)
{
    const unsigned targets = t_end - t_begin, width = blockDim.x;
    if (targets <= width) {
        p2p_targets<KERNEL, 1>(pos, mass, leaf_begin, leaf_end, sources, first, last, cx, cy,
                               cz, t_begin, t_end, eps2, h, g, tile, acc, pot);
    } else if (targets <= 2 * width) {
        p2p_targets<KERNEL, 2>(pos, mass, leaf_begin, leaf_end, sources, first, last, cx, cy,
                               cz, t_begin, t_end, eps2, h, g, tile, acc, pot);
    } else if (targets <= 3 * width) {
        p2p_targets<KERNEL, 3>(pos, mass, leaf_begin, leaf_end, sources, first, last, cx, cy,
                               cz, t_begin, t_end, eps2, h, g, tile, acc, pot);
    } else {
        p2p_targets<KERNEL, P2P_MAX_TARGETS>(pos, mass, leaf_begin, leaf_end, sources, first,
                                             last, cx, cy, cz, t_begin, t_end, eps2, h, g,
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
    // The spline needs a positive support; a zero one means Newtonian forces, which the
    // Plummer form gives with eps2 = 0.
    if (kernel == LEAPFMM_SPLINE && h > 0.0f) {
        p2p_sized<LEAPFMM_SPLINE>(pos, mass, leaf_begin, leaf_end, sources, first, last, cx,
                                  cy, cz, t_begin, t_end, eps2, h, g, tile, acc, pot);
    } else {
        p2p_sized<LEAPFMM_PLUMMER>(pos, mass, leaf_begin, leaf_end, sources, first, last, cx,
                                   cy, cz, t_begin, t_end, eps2, h, g, tile, acc, pot);
    }
}
