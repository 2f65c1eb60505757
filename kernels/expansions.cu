// Upward and downward ends of the FMM on the device: P2M (one thread per leaf, its particles
// in order: a fixed summation order, no atomics) and L2P (one thread per particle), with
// the same operations as src/fmm/expansion.rs. Expansions are G-free; L2P applies G.
#include "expansions.cuh"

// Accelerations and potentials of `n` particles from the local expansion of their leaf
// (`leaf_of[i]`): Φ = -G Σ conj(R(x)) L, a from the gradient (L'_1^i of the CPU backend).
// Overwrites acc and pot (the near field adds to them afterwards). Each regular harmonic is
// used as `for_each_regular` makes it, so no array of them is kept.
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
    const double x = pos[3 * i] - leaf_centre[3 * leaf];
    const double y = pos[3 * i + 1] - leaf_centre[3 * leaf + 1];
    const double z = pos[3 * i + 2] - leaf_centre[3 * leaf + 2];
    double phi = 0.0, l10 = 0.0, l11r = 0.0, l11i = 0.0;
    for_each_regular(p, x, y, z, [&](int d, int m, double rr, double ri) {
        // Φ: conj(R_d^m) L_d^m for m >= 0, twice for m > 0 (the -m term is its conjugate).
        const int c = cidx(d, m);
        const double w = m == 0 ? 1.0 : 2.0;
        phi += rr * (w * local[2 * c]) + ri * (w * local[2 * c + 1]);
        if (d + 1 > p) {
            return;
        }
        // The gradient: R_d^j with L_{d+1}^j (l10) and with L_{d+1}^{j+1} (l11), for
        // j = m and, when m > 0, j = -m (R_d^{-m} = (-1)^m conj(R_d^m)).
        double lr, li;
        coefficient(local, d + 1, m, &lr, &li);
        l10 += lr * rr + li * ri;
        coefficient(local, d + 1, m + 1, &lr, &li);
        l11r += lr * rr + li * ri;
        l11i += li * rr - lr * ri;
        if (m > 0) {
            const double odd = (m % 2 == 0) ? 1.0 : -1.0;
            const double nr = odd * rr, ni = -odd * ri;
            coefficient(local, d + 1, -m, &lr, &li);
            l10 += lr * nr + li * ni;
            coefficient(local, d + 1, 1 - m, &lr, &li);
            l11r += lr * nr + li * ni;
            l11i += li * nr - lr * ni;
        }
    });
    acc[3 * i] = g * -l11r;
    acc[3 * i + 1] = g * -l11i;
    acc[3 * i + 2] = g * l10;
    pot[i] = -g * phi;
}

// M2L: each of `count` target cells (`targets`) adds the local expansions of the source
// cells on its M2L list, `sources[start..start + len]` in list order with (start, len) the
// high and low 32 bits of `spans[cell]` (the host walk's per-cell pieces, as it wrote them):
//   L_k^l += (-1)^k Σ_{n + k <= p} Σ_m M_n^m I_{n+k}^{m+l}(R),  R = target centre - source centre.
// The direct O(p^4) form of the CPU backend's rotation-based translation (same truncation).
//
// One block of M2L_THREADS threads (a warp) per target cell. The list is taken in batches
// of M2L_BATCH sources. For each batch the threads unpack the multipoles into shared memory
// with the negative orders written out, and compute the irregular harmonics of each R there
// (one thread per source and order m: the column of order m, the negative order by
// symmetry; at p = 7 the 4 sources' 8 columns are the warp's 32 threads), so that every term
// is a plain product of two shared values. A short batch is padded with zero sources.
//
// The sum is cut into pieces (k, l, n): the terms of output (k, l) with multipole degree n,
// 2n + 1 of them. Pieces go to threads in order of decreasing size, back and forth across
// the warp, so every thread gets about the same number of terms; each thread works out its
// pieces' offsets once, before the list, and keeps their sums in registers. Within a batch,
// a piece is summed for each source separately (M2L_BATCH independent chains: the loop is
// latency-bound) and the sources' sums are added in list order. At the end the pieces go to
// shared memory and each output adds its pieces in increasing n: a fixed order, so the
// result does not change from run to run.
//
// The shared arrays are sized for the largest order a kernel takes: `m2l_cells` any up to
// LEAPFMM_MAX_ORDER (21.6 KB), `m2l_cells_p8` orders up to 8 (10.4 KB, so more blocks fit on
// an SM).
#define M2L_THREADS 32
// Sources a block translates between two barriers.
#define M2L_BATCH 4
// Largest order of `m2l_cells_p8`.
#define M2L_SMALL_ORDER 8
// Pieces of order P: Σ_k (k + 1)(P - k + 1).
#define M2L_PIECES(P) (((P) + 1) * ((P) + 2) * ((P) + 3) / 6)
// Complex values of an expansion of order P with the negative orders written out.
#define M2L_FULL(P) (((P) + 1) * ((P) + 1))

// Index of (n, m), -n <= m <= n, in an expansion with the negative orders written out.
__device__ __forceinline__ int full_index(int n, int m) { return n * n + n + m; }

// Pieces of degree n: outputs (k, l) with k <= p - n, 0 <= l <= k.
__device__ __forceinline__ int pieces_of_degree(int p, int n) {
    return (p - n + 1) * (p - n + 2) / 2;
}

// Where piece (k, l, n) sits: degrees from p down to 0, within one (k, l) in cidx order.
__device__ __forceinline__ int piece_index(int p, int k, int l, int n) {
    int at = 0;
    for (int d = p; d > n; --d) at += pieces_of_degree(p, d);
    return at + cidx(k, l);
}

// The slot of the warp's thread `lane` in round `round` of the back-and-forth deal.
__device__ __forceinline__ int dealt(int round, int lane) {
    return round * M2L_THREADS + ((round % 2 == 0) ? lane : M2L_THREADS - 1 - lane);
}

// Column m of the irregular harmonics I_n^m(x, y, z), n = m..p, into `out` (negative orders
// written out): (n, m) and, by the real-source symmetry, (n, -m) = (-1)^m conj(n, m). The
// recurrence of `irregular` in src/fmm/expansion.rs: the diagonal up to (m, m), then down
// the column.
__device__ __forceinline__ void irregular_column(int p, int m, double x, double y, double z,
                                                 double2* out) {
    const double inv_r2 = 1.0 / (x * x + y * y + z * z);
    double dr = sqrt(inv_r2), di = 0.0;
    for (int d = 1; d <= m; ++d) {
        const double f = -(double)(2 * d - 1) * inv_r2;
        const double r = f * (x * dr - y * di), i = f * (x * di + y * dr);
        dr = r;
        di = i;
    }
    const double odd = (m % 2 == 0) ? 1.0 : -1.0;
    double a_r = dr, a_i = di, b_r = 0.0, b_i = 0.0;
    for (int n = m; n <= p; ++n) {
        double c_r, c_i;
        if (n == m) {
            c_r = dr;
            c_i = di;
        } else if (n == m + 1) {
            const double f = (double)(2 * m + 1) * z * inv_r2;
            c_r = f * a_r;
            c_i = f * a_i;
        } else {
            const double c1 = (double)(2 * n - 1) * z;
            const double c2 = (double)((n - 1) * (n - 1) - m * m);
            c_r = (c1 * a_r - c2 * b_r) * inv_r2;
            c_i = (c1 * a_i - c2 * b_i) * inv_r2;
        }
        out[full_index(n, m)] = make_double2(c_r, c_i);
        if (m > 0) {
            out[full_index(n, -m)] = make_double2(odd * c_r, -odd * c_i);
        }
        if (n > m) {
            b_r = a_r;
            b_i = a_i;
        }
        a_r = c_r;
        a_i = c_i;
    }
}

// A piece's place in the shared arrays, packed in one register: the index of its first
// multipole value (bits 0-9), of its first harmonic (bits 10-19) and its number of terms
// (bits 20-25; 0 for a round past the thread's last piece).
__device__ __forceinline__ int pack_piece(int m_at, int i_at, int terms) {
    return m_at | (i_at << 10) | (terms << 20);
}

template <int MAXP>
__device__ __forceinline__ void m2l_block(
    const unsigned* __restrict__ targets, unsigned count,
    const unsigned long long* __restrict__ spans, const unsigned* __restrict__ sources,
    const double* __restrict__ centre,
    const double* __restrict__ multipoles, int p, double* __restrict__ locals)
{
    // One source's complex values in each array: the stride between a batch's sources.
    constexpr int STRIDE = M2L_FULL(MAXP);
    // Rounds of the deal: a thread's pieces at most.
    constexpr int ROUNDS = (M2L_PIECES(MAXP) + M2L_THREADS - 1) / M2L_THREADS;
    static_assert(STRIDE <= 1024 && 2 * MAXP + 1 < 64, "a piece packs into one int");
    __shared__ double2 m_full[M2L_BATCH * STRIDE];
    __shared__ double2 i_full[M2L_BATCH * STRIDE];
    // At the end the pieces' sums go where the multipoles were.
    static_assert(M2L_PIECES(MAXP) <= M2L_BATCH * STRIDE, "the pieces fit in m_full");
    double2* part = m_full;
    const int lane = (int)threadIdx.x;
    unsigned cell, first, last;
    if (!m2l_target(targets, count, spans, &cell, &first, &last)) {
        return;
    }
    const int len = (p + 1) * (p + 2);
    const int full = (p + 1) * (p + 1);
    int pieces = 0;
    for (int n = 0; n <= p; ++n) pieces += pieces_of_degree(p, n);

    // This thread's pieces, worked out once, and their running sums.
    int piece[ROUNDS];
    double sum_r[ROUNDS], sum_i[ROUNDS];
#pragma unroll
    for (int r = 0; r < ROUNDS; ++r) {
        const int slot = dealt(r, lane);
        piece[r] = 0;
        sum_r[r] = 0.0;
        sum_i[r] = 0.0;
        // Degrees from p down, the (k, l) of each in cidx order.
        int at = 0;
        for (int n = p; n >= 0 && slot < pieces; --n) {
            const int here = pieces_of_degree(p, n);
            if (slot < at + here) {
                const int c = slot - at;
                int k = 0;
                while ((k + 1) * (k + 2) / 2 <= c) ++k;
                const int l = c - k * (k + 1) / 2;
                piece[r] = pack_piece(full_index(n, -n), full_index(n + k, l - n), 2 * n + 1);
                break;
            }
            at += here;
        }
    }

    const double tx = centre[3 * cell], ty = centre[3 * cell + 1], tz = centre[3 * cell + 2];
    for (unsigned b = first; b < last; b += M2L_BATCH) {
        const int batch = (int)min((unsigned)M2L_BATCH, last - b);
        __syncthreads();
        for (int w = lane; w < M2L_BATCH * full; w += M2L_THREADS) {
            const int s = w / full, i = w - s * full;
            double re = 0.0, im = 0.0;
            if (s < batch) {
                int n = 0;
                while ((n + 1) * (n + 1) <= i) ++n;
                const double* m_src = multipoles + (size_t)sources[b + s] * len;
                coefficient(m_src, n, i - n * n - n, &re, &im);
            }
            m_full[s * STRIDE + i] = make_double2(re, im);
        }
        for (int w = lane; w < M2L_BATCH * (p + 1); w += M2L_THREADS) {
            const int s = w / (p + 1), m = w - s * (p + 1);
            double2* out = &i_full[s * STRIDE];
            if (s < batch) {
                const unsigned src = sources[b + s];
                irregular_column(p, m, tx - centre[3 * src], ty - centre[3 * src + 1],
                                 tz - centre[3 * src + 2], out);
            } else {
                for (int n = m; n <= p; ++n) {
                    out[full_index(n, m)] = make_double2(0.0, 0.0);
                    out[full_index(n, -m)] = make_double2(0.0, 0.0);
                }
            }
        }
        __syncthreads();
#pragma unroll
        for (int r = 0; r < ROUNDS; ++r) {
            const double2* mm = &m_full[piece[r] & 1023];
            const double2* ii = &i_full[(piece[r] >> 10) & 1023];
            const int terms = piece[r] >> 20;
            double re[M2L_BATCH], im[M2L_BATCH];
#pragma unroll
            for (int s = 0; s < M2L_BATCH; ++s) {
                re[s] = 0.0;
                im[s] = 0.0;
            }
            for (int j = 0; j < terms; ++j) {
#pragma unroll
                for (int s = 0; s < M2L_BATCH; ++s) {
                    const double2 mv = mm[s * STRIDE + j], iv = ii[s * STRIDE + j];
                    re[s] += mv.x * iv.x - mv.y * iv.y;
                    im[s] += mv.x * iv.y + mv.y * iv.x;
                }
            }
#pragma unroll
            for (int s = 0; s < M2L_BATCH; ++s) {
                sum_r[r] += re[s];
                sum_i[r] += im[s];
            }
        }
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < ROUNDS; ++r) {
        const int slot = dealt(r, lane);
        if (slot < pieces) {
            part[slot] = make_double2(sum_r[r], sum_i[r]);
        }
    }
    __syncthreads();
    double* out = locals + (size_t)cell * len;
    for (int c = lane; c < len / 2; c += M2L_THREADS) {
        int k = 0;
        while ((k + 1) * (k + 2) / 2 <= c) ++k;
        const int l = c - k * (k + 1) / 2;
        double re = 0.0, im = 0.0;
        for (int n = 0; n + k <= p; ++n) {
            const double2 v = part[piece_index(p, k, l, n)];
            re += v.x;
            im += v.y;
        }
        const double sign = (k % 2 == 0) ? 1.0 : -1.0;
        out[2 * c] += sign * re;
        out[2 * c + 1] += sign * im;
    }
}

// M2L for any order up to LEAPFMM_MAX_ORDER.
extern "C" __global__ void m2l_cells(
    const unsigned* __restrict__ targets, unsigned count,
    const unsigned long long* __restrict__ spans, const unsigned* __restrict__ sources,
    const double* __restrict__ centre,
    const double* __restrict__ multipoles, int p, double* __restrict__ locals)
{
    m2l_block<LEAPFMM_MAX_ORDER>(targets, count, spans, sources, centre, multipoles, p, locals);
}

// M2L for orders up to M2L_SMALL_ORDER (the default 7 among them), with less shared memory.
extern "C" __global__ void m2l_cells_p8(
    const unsigned* __restrict__ targets, unsigned count,
    const unsigned long long* __restrict__ spans, const unsigned* __restrict__ sources,
    const double* __restrict__ centre,
    const double* __restrict__ multipoles, int p, double* __restrict__ locals)
{
    m2l_block<M2L_SMALL_ORDER>(targets, count, spans, sources, centre, multipoles, p, locals);
}

// P2M, M2M and L2L: one block of TRANSLATE_THREADS threads (a warp) per cell. The threads unpack
// the expansion to translate into shared memory with its negative orders written out, and
// compute the regular harmonics of the shift there (thread m the column of order m); then
// each thread sums the outputs (n, m) it owns, c = thread, thread + 32, ... in cidx order,
// term by term in the order of the one-thread form (k, then l): a fixed order. (A thread
// per cell left a level's few cells to a long serial chain each: with eight children, the
// upper levels of the upward pass took milliseconds apiece.)
#define TRANSLATE_THREADS 32
// Outputs a thread owns at most: those of an expansion of order LEAPFMM_MAX_ORDER.
#define TRANSLATE_ROUNDS ((LEAPFMM_MAX_LEN / 2 + TRANSLATE_THREADS - 1) / TRANSLATE_THREADS)

// Expansion `c` (order p) into `out` with the negative orders written out, by the block's
// threads.
__device__ __forceinline__ void unpack_full(int p, const double* __restrict__ c, double2* out) {
    const int full = (p + 1) * (p + 1);
    for (int i = (int)threadIdx.x; i < full; i += TRANSLATE_THREADS) {
        int n = 0;
        while ((n + 1) * (n + 1) <= i) ++n;
        double re, im;
        coefficient(c, n, i - n * n - n, &re, &im);
        out[i] = make_double2(re, im);
    }
}

// Column m of the regular harmonics R_n^m(x, y, z), n = m..p, into `out`, with the
// operations of `for_each_regular`: with `full`, with the negative orders written out
// ((n, -m) = (-1)^m conj(n, m), at full_index), else at cidx(n, m).
__device__ __forceinline__ void regular_column(int p, int m, double x, double y, double z,
                                               bool full, double2* out) {
    const double r2 = x * x + y * y + z * z;
    double diag_r = 1.0, diag_i = 0.0;
    for (int d = 1; d <= m; ++d) {
        const double f = -1.0 / (2.0 * d);
        const double re = f * (x * diag_r - y * diag_i), im = f * (x * diag_i + y * diag_r);
        diag_r = re;
        diag_i = im;
    }
    const double odd = (m % 2 == 0) ? 1.0 : -1.0;
    double a_r = diag_r, a_i = diag_i, b_r = 0.0, b_i = 0.0;
    for (int n = m; n <= p; ++n) {
        double re = a_r, im = a_i;
        if (n == m + 1) {
            re = z * a_r;
            im = z * a_i;
        } else if (n > m + 1) {
            const double inv = 1.0 / (double)((n - m) * (n + m));
            const double cz = (double)(2 * n - 1) * z;
            re = (cz * a_r - r2 * b_r) * inv;
            im = (cz * a_i - r2 * b_i) * inv;
        }
        if (full) {
            out[full_index(n, m)] = make_double2(re, im);
            if (m > 0) {
                out[full_index(n, -m)] = make_double2(odd * re, -odd * im);
            }
        } else {
            out[cidx(n, m)] = make_double2(re, im);
        }
        if (n > m) {
            b_r = a_r;
            b_i = a_i;
            a_r = re;
            a_i = im;
        }
    }
}

// Zeroes the sums of the outputs a thread of a translation block owns.
__device__ __forceinline__ void zero_outputs(double* sum_r, double* sum_i) {
#pragma unroll
    for (int r = 0; r < TRANSLATE_ROUNDS; ++r) {
        sum_r[r] = 0.0;
        sum_i[r] = 0.0;
    }
}

// Writes the sums of the outputs this thread owns, c = thread + r TRANSLATE_THREADS < len / 2,
// into `out` (an expansion of `len` values).
__device__ __forceinline__ void write_outputs(const double* sum_r, const double* sum_i, int len,
                                              double* __restrict__ out) {
#pragma unroll
    for (int r = 0; r < TRANSLATE_ROUNDS; ++r) {
        const int c = (int)threadIdx.x + r * TRANSLATE_THREADS;
        if (c < len / 2) {
            out[2 * c] = sum_r[r];
            out[2 * c + 1] = sum_i[r];
        }
    }
}

// A translation staged in shared memory by the block's threads: `expansion` (order p) into
// e_full and the regular harmonics of the shift centre[at] - centre[origin] into r_full.
__device__ __forceinline__ void stage_shift(int p, const double* __restrict__ expansion,
                                            const double* __restrict__ centre, unsigned at,
                                            unsigned origin, double2* e_full, double2* r_full) {
    unpack_full(p, expansion, e_full);
    const int m = (int)threadIdx.x;
    if (m <= p) {
        regular_column(p, m, centre[3 * at] - centre[3 * origin],
                       centre[3 * at + 1] - centre[3 * origin + 1],
                       centre[3 * at + 2] - centre[3 * origin + 2], true, r_full);
    }
}

// The (n, m) of output c = cidx(n, m).
__device__ __forceinline__ void output_of(int c, int* n, int* m) {
    int k = 0;
    while ((k + 1) * (k + 2) / 2 <= c) ++k;
    *n = k;
    *m = c - k * (k + 1) / 2;
}

// M2M for one level: each of `count` parent cells (`parents`) gets the sum of its children's
// multipoles translated to its centre (children contiguous from first_child, in order):
//   M'_n^m = Σ_{k,l} conj(R_{n-k}^{m-l}(t)) M_k^l,  t = child centre - parent centre.
extern "C" __global__ void m2m_cells(
    const unsigned* __restrict__ parents, unsigned count,
    const unsigned* __restrict__ first_child, const unsigned* __restrict__ child_count,
    const double* __restrict__ centre, int p, double* __restrict__ multipoles)
{
    __shared__ double2 m_full[M2L_FULL(LEAPFMM_MAX_ORDER)];
    __shared__ double2 r_full[M2L_FULL(LEAPFMM_MAX_ORDER)];
    const unsigned k = blockIdx.x;
    const int lane = (int)threadIdx.x;
    if (k >= count) {
        return;
    }
    const int len = (p + 1) * (p + 2);
    const unsigned cell = parents[k];
    double sum_r[TRANSLATE_ROUNDS], sum_i[TRANSLATE_ROUNDS];
    zero_outputs(sum_r, sum_i);
    for (unsigned ch = first_child[cell]; ch < first_child[cell] + child_count[cell]; ++ch) {
        __syncthreads();
        stage_shift(p, multipoles + (size_t)ch * len, centre, ch, cell, m_full, r_full);
        __syncthreads();
#pragma unroll
        for (int r = 0; r < TRANSLATE_ROUNDS; ++r) {
            const int c = lane + r * TRANSLATE_THREADS;
            if (c >= len / 2) {
                continue;
            }
            int n, m;
            output_of(c, &n, &m);
            double re = 0.0, im = 0.0;
            for (int kk = 0; kk <= n; ++kk) {
                const int j = n - kk;
                const int lo = max(m - j, -kk), hi = min(m + j, kk);
                for (int l = lo; l <= hi; ++l) {
                    const double2 mv = m_full[full_index(kk, l)];
                    const double2 rv = r_full[full_index(j, m - l)];
                    const double rr = rv.x, ri = -rv.y;
                    re += mv.x * rr - mv.y * ri;
                    im += mv.x * ri + mv.y * rr;
                }
            }
            sum_r[r] += re;
            sum_i[r] += im;
        }
    }
    write_outputs(sum_r, sum_i, len, multipoles + (size_t)cell * len);
}

// L2L for one level: each of `count` cells (`cells`) adds its parent's local expansion
// translated to its centre:
//   L'_j^i = Σ_{k,l} conj(R_{k-j}^{l-i}(s)) L_k^l,  s = cell centre - parent centre.
extern "C" __global__ void l2l_cells(
    const unsigned* __restrict__ cells, unsigned count, const unsigned* __restrict__ parent,
    const double* __restrict__ centre, int p, double* __restrict__ locals)
{
    __shared__ double2 l_full[M2L_FULL(LEAPFMM_MAX_ORDER)];
    __shared__ double2 r_full[M2L_FULL(LEAPFMM_MAX_ORDER)];
    const unsigned k = blockIdx.x;
    const int lane = (int)threadIdx.x;
    if (k >= count) {
        return;
    }
    const int len = (p + 1) * (p + 2);
    const unsigned cell = cells[k];
    const unsigned up = parent[cell];
    stage_shift(p, locals + (size_t)up * len, centre, cell, up, l_full, r_full);
    __syncthreads();
    double* out = locals + (size_t)cell * len;
    for (int c = lane; c < len / 2; c += TRANSLATE_THREADS) {
        int j, i;
        output_of(c, &j, &i);
        double re = 0.0, im = 0.0;
        for (int kk = j; kk <= p; ++kk) {
            const int d = kk - j;
            const int lo = max(i - d, -kk), hi = min(i + d, kk);
            for (int l = lo; l <= hi; ++l) {
                const double2 lv = l_full[full_index(kk, l)];
                const double2 rv = r_full[full_index(d, l - i)];
                const double rr = rv.x, ri = -rv.y;
                re += lv.x * rr - lv.y * ri;
                im += lv.x * ri + lv.y * rr;
            }
        }
        out[2 * c] += re;
        out[2 * c + 1] += im;
    }
}

// Particles whose harmonics a P2M block holds at once.
#define P2M_BATCH 8

// Multipoles of the `count` leaf cells `leaves` (order p, `len` = (p + 1)(p + 2) values per
// cell, indexed by cell) about their centres: M = Σ q conj(R(x - centre)), one warp per
// leaf. The threads compute the regular harmonics of P2M_BATCH particles at a time into
// shared memory (a thread per particle and order m); each thread then adds them to the
// coefficients it owns, particle by particle in the leaf's order (the order of the
// one-thread form).
extern "C" __global__ void p2m_leaves(
    const double* __restrict__ pos, const double* __restrict__ mass,
    const unsigned* __restrict__ leaves, unsigned count,
    const unsigned* __restrict__ cell_begin, const unsigned* __restrict__ cell_end,
    const double* __restrict__ centre, int p, double* __restrict__ multipoles)
{
    // The m >= 0 harmonics of each particle of a batch, at cidx.
    constexpr int HALF = LEAPFMM_MAX_LEN / 2;
    __shared__ double2 r_half[P2M_BATCH * HALF];
    const unsigned k = blockIdx.x;
    const int lane = (int)threadIdx.x;
    if (k >= count) {
        return;
    }
    const unsigned leaf = leaves[k];
    const int len = (p + 1) * (p + 2);
    const double cx = centre[3 * leaf], cy = centre[3 * leaf + 1], cz = centre[3 * leaf + 2];
    const unsigned begin = cell_begin[leaf], end = cell_end[leaf];
    double sum_r[TRANSLATE_ROUNDS], sum_i[TRANSLATE_ROUNDS];
    zero_outputs(sum_r, sum_i);
    for (unsigned base = begin; base < end; base += P2M_BATCH) {
        const int batch = (int)min((unsigned)P2M_BATCH, end - base);
        __syncthreads();
        for (int w = lane; w < batch * (p + 1); w += TRANSLATE_THREADS) {
            const int s = w / (p + 1), m = w - s * (p + 1);
            const unsigned i = base + s;
            regular_column(p, m, pos[3 * i] - cx, pos[3 * i + 1] - cy, pos[3 * i + 2] - cz,
                           false, &r_half[s * HALF]);
        }
        __syncthreads();
#pragma unroll
        for (int r = 0; r < TRANSLATE_ROUNDS; ++r) {
            const int c = lane + r * TRANSLATE_THREADS;
            if (c >= len / 2) {
                continue;
            }
            for (int s = 0; s < batch; ++s) {
                const double q = mass[base + s];
                const double2 v = r_half[s * HALF + c];
                sum_r[r] += q * v.x;
                sum_i[r] -= q * v.y;
            }
        }
    }
    write_outputs(sum_r, sum_i, len, multipoles + (size_t)leaf * len);
}
