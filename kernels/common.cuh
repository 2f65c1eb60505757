// Shared device helpers of the leapfmm kernels: the softened pair factors, written exactly as
// src/gravity/softening.rs writes them (f32 here), so that GPU and CPU evaluate one function:
//   a_i += G m_j f(r) (x_j - x_i),   phi_i -= G m_j p(r).
#pragma once

// Softening kernel families (src/gravity/softening.rs: SofteningKernel).
#define LEAPFMM_PLUMMER 0
#define LEAPFMM_SPLINE 1

// Plummer factors for squared separation r2 and squared softening eps2.
__device__ __forceinline__ void plummer_factors(float r2, float eps2, float* f, float* p) {
    float inv = rsqrtf(r2 + eps2);
    *f = inv * inv * inv;
    *p = inv;
}

// GADGET-2 cubic-spline factors for squared separation r2 and support h: the CPU's
// formulas for each region, but with a branch to the Newtonian one beyond the support, where
// most pairs of a P2P list lie: a warp whose pairs all lie there skips the ~40 flops of the
// polynomials (the CPU evaluates every region and selects, for its SIMD lanes).
__device__ __forceinline__ void spline_factors(float r2, float h, float* f, float* p) {
    float inv_r = rsqrtf(r2);
    float r = r2 * inv_r;
    if (r >= h) {
        *f = inv_r * inv_r * inv_r;
        *p = inv_r;
        return;
    }
    float h_inv = 1.0f / h;
    float h3_inv = h_inv * h_inv * h_inv;
    float u = r * h_inv;
    float u2 = u * u;
    float inner_f = h3_inv * (32.0f / 3.0f + u2 * (32.0f * u - 192.0f / 5.0f));
    float inner_p = -h_inv * (-14.0f / 5.0f + u2 * (16.0f / 3.0f + u2 * (32.0f / 5.0f * u - 48.0f / 5.0f)));
    float inv_u = h * inv_r;
    float outer_f = h3_inv * (64.0f / 3.0f - 48.0f * u + 192.0f / 5.0f * u2
                              - 32.0f / 3.0f * u2 * u - 1.0f / 15.0f * inv_u * inv_u * inv_u);
    float outer_p = -h_inv * (-16.0f / 5.0f + 1.0f / 15.0f * inv_u
                              + u2 * (32.0f / 3.0f + u * (-16.0f + u * (48.0f / 5.0f - 32.0f / 15.0f * u))));
    *f = u < 0.5f ? inner_f : outer_f;
    *p = u < 0.5f ? inner_p : outer_p;
}
