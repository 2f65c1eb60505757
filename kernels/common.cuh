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

// GADGET-2 cubic-spline factors inside the support (r < h), at separation r = r2 / sqrt(r2)
// with inv_r = 1 / r, support h and h_inv = 1 / h: the CPU's formulas for the two inner
// regions. Beyond the support the factors are Newtonian (1/r³, 1/r), which the caller
// takes without coming here, as most pairs of a P2P list lie there: a warp whose pairs all
// lie there skips the ~40 flops of the polynomials (the CPU evaluates every region and
// selects, for its SIMD lanes).
__device__ __forceinline__ void spline_inside(float r, float inv_r, float h, float h_inv, float* f,
                                              float* p) {
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
