// Near field (P2P): one block per target leaf. Source leaves of the target's P2P list are
// staged tile by tile in shared memory, relative to the target leaf's centre in f32 (the
// mixed-precision near field of design §5.7); each thread owns targets threadIdx.x,
// threadIdx.x + blockDim.x, ... (leaves may be larger than a block), sums one tile in f32
// and adds the tile's sum into f64 accumulators: a fixed order, so the results are the same
// bits on every run (no atomics). Zero separations (a particle with itself) add nothing.
#include "common.cuh"

// Largest block: the shared tile holds one source per thread.
#define P2P_MAX_BLOCK 256

// Adds one staged tile's `n` sources (x, y, z relative to the leaf centre, mass) to a
// target's f32 sums. The kernel family is a template argument, so the inner loop carries
// no test of it; each source is one 16-byte shared-memory load, the same for every thread
// of the warp (a broadcast).
template <int KERNEL>
__device__ __forceinline__ void add_tile(const float4* tile, unsigned n, float xi, float yi,
                                         float zi, float eps2, float h, float* sx, float* sy,
                                         float* sz, float* sp) {
    for (unsigned k = 0; k < n; ++k) {
        const float4 s = tile[k];
        const float dx = s.x - xi;
        const float dy = s.y - yi;
        const float dz = s.z - zi;
        const float r2 = dx * dx + dy * dy + dz * dz;
        // A zero separation (the particle itself) adds nothing: its mass is masked to zero
        // and its r2 replaced by a far one (finite factors, the spline's cheap branch), by
        // selects rather than a branch around the pair.
        const bool pair = r2 > 0.0f;
        const float m = pair ? s.w : 0.0f;
        float f, p;
        if (KERNEL == LEAPFMM_SPLINE) {
            spline_factors(pair ? r2 : 1e30f, h, &f, &p);
        } else {
            plummer_factors(pair ? r2 : 1e30f, eps2, &f, &p);
        }
        const float mf = m * f;
        *sx += mf * dx;
        *sy += mf * dy;
        *sz += mf * dz;
        *sp += m * p;
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
    // The spline needs a positive support; a zero one means Newtonian forces, which the
    // Plummer form gives with eps2 = 0.
    const bool spline = kernel == LEAPFMM_SPLINE && h > 0.0f;

    const unsigned leaf = targets[blockIdx.x];
    const unsigned t_begin = leaf_begin[leaf];
    const unsigned t_end = leaf_end[leaf];
    const double cx = leaf_centre[3 * leaf];
    const double cy = leaf_centre[3 * leaf + 1];
    const double cz = leaf_centre[3 * leaf + 2];
    const unsigned width = blockDim.x;
    const unsigned long long span = spans[leaf];
    const unsigned first = (unsigned)(span >> 32);
    const unsigned last = first + (unsigned)(span & 0xffffffffu);

    // Targets in rounds of one per thread; every thread takes part in every tile load.
    for (unsigned round = t_begin; round < t_end; round += width) {
        const unsigned i = round + threadIdx.x;
        const bool active = i < t_end;
        float xi = 0.0f, yi = 0.0f, zi = 0.0f;
        if (active) {
            xi = (float)(pos[3 * i] - cx);
            yi = (float)(pos[3 * i + 1] - cy);
            zi = (float)(pos[3 * i + 2] - cz);
        }
        double ax = 0.0, ay = 0.0, az = 0.0, ph = 0.0;
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
                                                    (float)(pos[3 * j + 2] - cz),
                                                    (float)mass[j]);
                }
                __syncthreads();
                const unsigned n = min(width, s_end - base);
                if (active) {
                    float sx = 0.0f, sy = 0.0f, sz = 0.0f, sp = 0.0f;
                    if (spline) {
                        add_tile<LEAPFMM_SPLINE>(tile, n, xi, yi, zi, eps2, h, &sx, &sy, &sz, &sp);
                    } else {
                        add_tile<LEAPFMM_PLUMMER>(tile, n, xi, yi, zi, eps2, h, &sx, &sy, &sz, &sp);
                    }
                    ax += sx;
                    ay += sy;
                    az += sz;
                    ph += sp;
                }
            }
        }
        if (active) {
            acc[3 * i] += g * ax;
            acc[3 * i + 1] += g * ay;
            acc[3 * i + 2] += g * az;
            pot[i] -= g * ph;
        }
    }
}
