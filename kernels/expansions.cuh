// Solid harmonics for the expansion kernels, as src/fmm/expansion.rs computes them
// (Dehnen's normalisation; coefficients for 0 <= m <= n <= p stored as (re, im) pairs at
// complex index n(n+1)/2 + m).
#pragma once

// Largest expansion order the kernels support (src/fmm/expansion.rs: MAX_ORDER).
#define LEAPFMM_MAX_ORDER 12
// Values of an expansion of order LEAPFMM_MAX_ORDER: (p + 1)(p + 2).
#define LEAPFMM_MAX_LEN ((LEAPFMM_MAX_ORDER + 1) * (LEAPFMM_MAX_ORDER + 2))

__device__ __forceinline__ int cidx(int n, int m) { return n * (n + 1) / 2 + m; }

// Calls visit(n, m, re, im) with each regular solid harmonic R_n^m(x), n <= p, m >= 0, as
// the recurrence makes it: by columns of order m (from the diagonal R_m^m down to R_p^m).
// Kernels that use each value once take it here and keep no array of them (an array of
// them would live in local memory).
template <class Visit>
__device__ __forceinline__ void for_each_regular(int p, double x, double y, double z, Visit visit) {
    const double r2 = x * x + y * y + z * z;
    double diag_r = 1.0, diag_i = 0.0;
    for (int m = 0; m <= p; ++m) {
        if (m > 0) {
            const double f = -1.0 / (2.0 * m);
            const double re = f * (x * diag_r - y * diag_i), im = f * (x * diag_i + y * diag_r);
            diag_r = re;
            diag_i = im;
        }
        // (a, b): R_{n-1}^m and R_{n-2}^m.
        double a_r = diag_r, a_i = diag_i, b_r = 0.0, b_i = 0.0;
        visit(m, m, diag_r, diag_i);
        for (int n = m + 1; n <= p; ++n) {
            double re, im;
            if (n == m + 1) {
                re = z * a_r;
                im = z * a_i;
            } else {
                const double inv = 1.0 / (double)((n - m) * (n + m));
                const double cz = (double)(2 * n - 1) * z;
                re = (cz * a_r - r2 * b_r) * inv;
                im = (cz * a_i - r2 * b_i) * inv;
            }
            b_r = a_r;
            b_i = a_i;
            a_r = re;
            a_i = im;
            visit(n, m, re, im);
        }
    }
}

// Coefficient (n, m) for any -n <= m <= n by the real-source symmetry
// C_n^{-m} = (-1)^m conj(C_n^m).
__device__ __forceinline__ void coefficient(const double* c, int n, int m, double* re, double* im) {
    const int a = m < 0 ? -m : m;
    const int k = cidx(n, a);
    double r = c[2 * k], i = c[2 * k + 1];
    if (m < 0) {
        if (a % 2 == 0) {
            i = -i;
        } else {
            r = -r;
        }
    }
    *re = r;
    *im = i;
}

// The target cell of an M2L block (one block per target: block blockIdx.x of a launch over
// `count` targets) and its M2L list, sources[first..last) with (first, last - first) the
// high and low 32 bits of spans[cell]; false for a block past the targets or an empty list.
__device__ __forceinline__ bool m2l_target(const unsigned* __restrict__ targets, unsigned count,
                                           const unsigned long long* __restrict__ spans,
                                           unsigned* cell, unsigned* first, unsigned* last) {
    if (blockIdx.x >= count) {
        return false;
    }
    *cell = targets[blockIdx.x];
    const unsigned long long span = spans[*cell];
    *first = (unsigned)(span >> 32);
    *last = *first + (unsigned)(span & 0xffffffffu);
    return *first != *last;
}
