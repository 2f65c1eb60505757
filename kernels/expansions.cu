// Upward and downward ends of the FMM on the device: P2M (one thread per leaf, its particles
// in order: a fixed summation order, no atomics) and L2P (one thread per particle), with
// the same operations as src/fmm/expansion.rs. Expansions are G-free; L2P applies G.
#include "expansions.cuh"

// Multipoles of the `count` leaf cells `leaves` (order p, `len` = (p + 1)(p + 2) values per
// cell, indexed by cell) about their centres: M = Σ q conj(R(x - centre)).
extern "C" __global__ void p2m_leaves(
    const double* __restrict__ pos, const double* __restrict__ mass,
    const unsigned* __restrict__ leaves, unsigned count,
    const unsigned* __restrict__ cell_begin, const unsigned* __restrict__ cell_end,
    const double* __restrict__ centre, int p, double* __restrict__ multipoles)
{
    const unsigned k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= count) {
        return;
    }
    const unsigned leaf = leaves[k];
    const int len = (p + 1) * (p + 2);
    double r[LEAPFMM_MAX_LEN];
    double* out = multipoles + (size_t)leaf * len;
    for (int c = 0; c < len; ++c) {
        out[c] = 0.0;
    }
    const double cx = centre[3 * leaf], cy = centre[3 * leaf + 1], cz = centre[3 * leaf + 2];
    for (unsigned i = cell_begin[leaf]; i < cell_end[leaf]; ++i) {
        regular(p, pos[3 * i] - cx, pos[3 * i + 1] - cy, pos[3 * i + 2] - cz, r);
        const double q = mass[i];
        for (int c = 0; c < len / 2; ++c) {
            out[2 * c] += q * r[2 * c];
            out[2 * c + 1] -= q * r[2 * c + 1];
        }
    }
}

// Accelerations and potentials of `n` particles from the local expansion of their leaf
// (`leaf_of[i]`): Φ = -G Σ conj(R(x)) L, a from the gradient (L'_1^i of the CPU backend).
// Overwrites acc and pot (the near field adds to them afterwards).
extern "C" __global__ void l2p_particles(
    const double* __restrict__ pos, const unsigned* __restrict__ leaf_of,
    const double* __restrict__ leaf_centre, const double* __restrict__ locals, unsigned n,
    int p, double g, double* __restrict__ acc, double* __restrict__ pot)
{
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) {
        return;
    }
    const int len = (p + 1) * (p + 2);
    const unsigned leaf = leaf_of[i];
    const double* local = locals + (size_t)leaf * len;
    double r[LEAPFMM_MAX_LEN];
    regular(p, pos[3 * i] - leaf_centre[3 * leaf], pos[3 * i + 1] - leaf_centre[3 * leaf + 1],
            pos[3 * i + 2] - leaf_centre[3 * leaf + 2], r);
    double phi = 0.0;
    for (int k = 0; k <= p; ++k) {
        for (int l = 0; l <= k; ++l) {
            const int c = cidx(k, l);
            const double w = l == 0 ? 1.0 : 2.0;
            phi += r[2 * c] * (w * local[2 * c]) + r[2 * c + 1] * (w * local[2 * c + 1]);
        }
    }
    double l10 = 0.0, l11r = 0.0, l11i = 0.0;
    for (int k = 1; k <= p; ++k) {
        const int d = k - 1;
        for (int l = -k; l <= k; ++l) {
            double lr, li, rr, ri;
            coefficient(local, k, l, &lr, &li);
            if ((l < 0 ? -l : l) <= d) {
                coefficient(r, d, l, &rr, &ri);
                l10 += lr * rr + li * ri;
            }
            if ((l - 1 < 0 ? 1 - l : l - 1) <= d) {
                coefficient(r, d, l - 1, &rr, &ri);
                l11r += lr * rr + li * ri;
                l11i += li * rr - lr * ri;
            }
        }
    }
    acc[3 * i] = g * -l11r;
    acc[3 * i + 1] = g * -l11i;
    acc[3 * i + 2] = g * l10;
    pot[i] = -g * phi;
}

// M2M for one level: each of `count` parent cells (`parents`) gets the sum of its children's
// multipoles translated to its centre (children contiguous from first_child, in order).
extern "C" __global__ void m2m_cells(
    const unsigned* __restrict__ parents, unsigned count,
    const unsigned* __restrict__ first_child, const unsigned* __restrict__ child_count,
    const double* __restrict__ centre, int p, double* __restrict__ multipoles)
{
    const unsigned k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= count) {
        return;
    }
    const int len = (p + 1) * (p + 2);
    const unsigned cell = parents[k];
    double* out = multipoles + (size_t)cell * len;
    for (int c = 0; c < len; ++c) {
        out[c] = 0.0;
    }
    double r[LEAPFMM_MAX_LEN];
    for (unsigned ch = first_child[cell]; ch < first_child[cell] + child_count[cell]; ++ch) {
        regular(p, centre[3 * ch] - centre[3 * cell], centre[3 * ch + 1] - centre[3 * cell + 1],
                centre[3 * ch + 2] - centre[3 * cell + 2], r);
        const double* child = multipoles + (size_t)ch * len;
        // M'_n^m = Σ_{k,l} conj(R_{n-k}^{m-l}(t)) M_k^l
        for (int n = 0; n <= p; ++n) {
            for (int m = 0; m <= n; ++m) {
                double re = 0.0, im = 0.0;
                for (int kk = 0; kk <= n; ++kk) {
                    const int j = n - kk;
                    const int lo = max(m - j, -kk), hi = min(m + j, kk);
                    for (int l = lo; l <= hi; ++l) {
                        double cr, ci, rr, ri;
                        coefficient(child, kk, l, &cr, &ci);
                        coefficient(r, j, m - l, &rr, &ri);
                        ri = -ri;
                        re += cr * rr - ci * ri;
                        im += cr * ri + ci * rr;
                    }
                }
                const int c = cidx(n, m);
                out[2 * c] += re;
                out[2 * c + 1] += im;
            }
        }
    }
}

// L2L for one level: each of `count` cells (`cells`) adds its parent's local expansion
// translated to its centre.
extern "C" __global__ void l2l_cells(
    const unsigned* __restrict__ cells, unsigned count, const unsigned* __restrict__ parent,
    const double* __restrict__ centre, int p, double* __restrict__ locals)
{
    const unsigned k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= count) {
        return;
    }
    const int len = (p + 1) * (p + 2);
    const unsigned cell = cells[k];
    const unsigned up = parent[cell];
    double r[LEAPFMM_MAX_LEN];
    regular(p, centre[3 * cell] - centre[3 * up], centre[3 * cell + 1] - centre[3 * up + 1],
            centre[3 * cell + 2] - centre[3 * up + 2], r);
    const double* from = locals + (size_t)up * len;
    double* out = locals + (size_t)cell * len;
    // L'_j^i = Σ_{k,l} conj(R_{k-j}^{l-i}(s)) L_k^l
    for (int j = 0; j <= p; ++j) {
        for (int i = 0; i <= j; ++i) {
            double re = 0.0, im = 0.0;
            for (int kk = j; kk <= p; ++kk) {
                const int d = kk - j;
                const int lo = max(i - d, -kk), hi = min(i + d, kk);
                for (int l = lo; l <= hi; ++l) {
                    double lr, li, rr, ri;
                    coefficient(from, kk, l, &lr, &li);
                    coefficient(r, d, l - i, &rr, &ri);
                    ri = -ri;
                    re += lr * rr - li * ri;
                    im += lr * ri + li * rr;
                }
            }
            const int c = cidx(j, i);
            out[2 * c] += re;
            out[2 * c + 1] += im;
        }
    }
}

// M2L: each of `count` target cells (`targets`) adds the local expansions of the source
// cells on its M2L list, `sources[start..start + len]` in list order with (start, len) the
// high and low 32 bits of `spans[cell]` (the host walk's per-cell pieces, as it wrote them):
//   L_k^l += (-1)^k Σ_{n + k <= p} Σ_m M_n^m I_{n+k}^{m+l}(R),  R = target centre - source centre.
// The direct O(p^4) form of the CPU backend's rotation-based translation (same truncation).
extern "C" __global__ void m2l_cells(
    const unsigned* __restrict__ targets, unsigned count,
    const unsigned long long* __restrict__ spans, const unsigned* __restrict__ sources,
    const double* __restrict__ centre,
    const double* __restrict__ multipoles, int p, double* __restrict__ locals)
{
    const unsigned t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= count) {
        return;
    }
    const int len = (p + 1) * (p + 2);
    const unsigned cell = targets[t];
    double* out = locals + (size_t)cell * len;
    double irr[LEAPFMM_MAX_LEN];
    const unsigned long long span = spans[cell];
    const unsigned first = (unsigned)(span >> 32);
    const unsigned last = first + (unsigned)(span & 0xffffffffu);
    for (unsigned s = first; s < last; ++s) {
        const unsigned src = sources[s];
        irregular(p, centre[3 * cell] - centre[3 * src], centre[3 * cell + 1] - centre[3 * src + 1],
                  centre[3 * cell + 2] - centre[3 * src + 2], irr);
        const double* m_src = multipoles + (size_t)src * len;
        for (int k = 0; k <= p; ++k) {
            const double sign = (k % 2 == 0) ? 1.0 : -1.0;
            for (int l = 0; l <= k; ++l) {
                double re = 0.0, im = 0.0;
                for (int n = 0; n + k <= p; ++n) {
                    for (int m = -n; m <= n; ++m) {
                        double mr, mi, ir, ii;
                        coefficient(m_src, n, m, &mr, &mi);
                        coefficient(irr, n + k, m + l, &ir, &ii);
                        re += mr * ir - mi * ii;
                        im += mr * ii + mi * ir;
                    }
                }
                const int c = cidx(k, l);
                out[2 * c] += sign * re;
                out[2 * c + 1] += sign * im;
            }
        }
    }
}
