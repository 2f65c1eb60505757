// M2L in the CPU backend's O(p^3) form (src/fmm/expansion.rs, `m2l_lanes`), for orders up
// to M2L_ROTATED_ORDER: each multipole is rotated so that the offset R points along z (a
// rotation about z, the fixed swap rotation S, a rotation about z, S undone), translated
// along z (where only m-preserving terms survive), and the local rotated back the same way.
// The swap matrices are straight-line code generated from the CPU's (rotations.cuh), so a
// translation is about 4 x 184 fused multiply-adds on registers at p = 7, where the direct
// form (m2l_cells in expansions.cu) takes 540 complex products of two shared-memory values.
//
// One block of M2L_ROTATED_THREADS threads (a warp) per target cell (`targets`), whose M2L
// list is `sources[start..start + len]` with (start, len) the high and low 32 bits of
// `spans[cell]`. The list is taken a warp's width of sources at a time, one per thread. A
// thread rotates its source's multipole degree by degree in registers and leaves it in its
// own column of a shared array, translates it there order by order, and rotates each degree
// back in place (no barrier comes between, so the compiler keeps all this in registers and
// only the last values reach shared memory: 168 registers at p = 7). After a barrier each thread adds up its outputs (c = thread, thread + 32,
// ...) across the columns in list order: every output is the sum of its sources' terms in
// list order, so the result does not change from run to run.
#include "expansions.cuh"
#include "rotations.cuh"

// Largest order: the degrees rotations.cuh has.
#define M2L_ROTATED_ORDER 8
#define M2L_ROTATED_THREADS 32
// Row stride of the shared columns: one more than the warp, so that the threads adding up
// their rows read different banks.
#define M2L_ROTATED_STRIDE (M2L_ROTATED_THREADS + 1)

// cos(m a) and sin(m a), m = 0..P, from (cos a, sin a) by the CPU's recurrence.
template <int P>
__device__ __forceinline__ void angle_multiples(double c, double s, double* cm, double* sm) {
    cm[0] = 1.0;
    sm[0] = 0.0;
#pragma unroll
    for (int m = 1; m <= P; ++m) {
        cm[m] = cm[m - 1] * c - sm[m - 1] * s;
        sm[m] = sm[m - 1] * c + cm[m - 1] * s;
    }
}

// Rotation about z of one degree N: c_N^m times e^{i m a}.
template <int N>
__device__ __forceinline__ void rotate_z(double* v, const double* cm, const double* sm) {
#pragma unroll
    for (int m = 1; m <= N; ++m) {
        const double re = v[2 * m], im = v[2 * m + 1];
        v[2 * m] = re * cm[m] - im * sm[m];
        v[2 * m + 1] = re * sm[m] + im * cm[m];
    }
}

// The angles of one translation: (cos, sin) multiples of the azimuth φ and polar angle θ of R.
template <int P>
struct Angles {
    double cphi[P + 1], sphi[P + 1], cth[P + 1], sth[P + 1];
};

// Degrees N..P of multipole `m`, rotated so that R lies along z, into `col` (row stride
// M2L_ROTATED_STRIDE): M~ = T(S^-1) Tz(θ) T(S) Tz(φ) M.
template <int N, int P>
__device__ __forceinline__ void rotate_forward(const double* __restrict__ m, const Angles<P>& a,
                                               double* col) {
    constexpr int BASE = N * (N + 1);
    double v[2 * N + 2], o[2 * N + 2];
    const double2* m2 = reinterpret_cast<const double2*>(m + BASE);
#pragma unroll
    for (int i = 0; i <= N; ++i) {
        const double2 c = m2[i];
        v[2 * i] = c.x;
        v[2 * i + 1] = c.y;
    }
    rotate_z<N>(v, a.cphi, a.sphi);
    Rotation<N>::swap(v, o);
    rotate_z<N>(o, a.cth, a.sth);
    Rotation<N>::unswap(o, v);
#pragma unroll
    for (int i = 0; i < 2 * N + 2; ++i) col[(BASE + i) * M2L_ROTATED_STRIDE] = v[i];
    if constexpr (N < P) rotate_forward<N + 1, P>(m, a, col);
}

// The translation along +z in `col`, order by order in place:
//   L~_k^l = (-1)^{k+l} Σ_{n=l}^{P-k} conj(M~_n^l) (n + k)! / ρ^{n+k+1}   (0 for k > P - l).
template <int P>
__device__ __forceinline__ void translate_z(double inv_rho, double* col) {
    // (n + k)! / ρ^{n+k+1} by n + k, as the CPU's factorial times power.
    double f[P + 1];
    double power = inv_rho, factorial = 1.0;
#pragma unroll
    for (int s = 0; s <= P; ++s) {
        if (s > 0) {
            power *= inv_rho;
            factorial *= (double)s;
        }
        f[s] = factorial * power;
    }
#pragma unroll
    for (int l = 0; l <= P; ++l) {
        double re_in[P + 1], im_in[P + 1];
#pragma unroll
        for (int n = l; n <= P; ++n) {
            re_in[n] = col[2 * cidx(n, l) * M2L_ROTATED_STRIDE];
            im_in[n] = col[(2 * cidx(n, l) + 1) * M2L_ROTATED_STRIDE];
        }
#pragma unroll
        for (int k = l; k <= P; ++k) {
            double re = 0.0, im = 0.0;
#pragma unroll
            for (int n = l; n <= P - k; ++n) {
                re += re_in[n] * f[n + k];
                im -= im_in[n] * f[n + k];
            }
            const double sign = ((k + l) % 2 == 0) ? 1.0 : -1.0;
            col[2 * cidx(k, l) * M2L_ROTATED_STRIDE] = sign * re;
            col[(2 * cidx(k, l) + 1) * M2L_ROTATED_STRIDE] = sign * im;
        }
    }
}

// Degrees N..P of the translated local in `col` rotated back, in place:
// L = Tz(φ) U_S Tz(θ) U_S^-1 L~ (U the local forms of the swap matrices).
template <int N, int P>
__device__ __forceinline__ void rotate_back(const Angles<P>& a, double* col) {
    constexpr int BASE = N * (N + 1);
    double v[2 * N + 2], o[2 * N + 2];
#pragma unroll
    for (int i = 0; i < 2 * N + 2; ++i) v[i] = col[(BASE + i) * M2L_ROTATED_STRIDE];
    Rotation<N>::unswap_local(v, o);
    rotate_z<N>(o, a.cth, a.sth);
    Rotation<N>::swap_local(o, v);
    rotate_z<N>(v, a.cphi, a.sphi);
#pragma unroll
    for (int i = 0; i < 2 * N + 2; ++i) col[(BASE + i) * M2L_ROTATED_STRIDE] = v[i];
    if constexpr (N < P) rotate_back<N + 1, P>(a, col);
}

// The local expansion about the origin of multipole `m` at offset (x, y, z) = target centre
// - source centre, into `col`.
template <int P>
__device__ __forceinline__ void translate_one(const double* __restrict__ m, double x, double y,
                                              double z, double* col) {
    const double rxy2 = x * x + y * y;
    const double rho = sqrt(rxy2 + z * z);
    const double rxy = sqrt(rxy2);
    Angles<P> a;
    angle_multiples<P>(rxy > 0.0 ? x / rxy : 1.0, rxy > 0.0 ? y / rxy : 0.0, a.cphi, a.sphi);
    angle_multiples<P>(z / rho, rxy / rho, a.cth, a.sth);
    rotate_forward<0, P>(m, a, col);
    translate_z<P>(1.0 / rho, col);
    rotate_back<0, P>(a, col);
}

template <int P>
__device__ __forceinline__ void m2l_rotated_block(
    const unsigned* __restrict__ targets, unsigned count,
    const unsigned long long* __restrict__ spans, const unsigned* __restrict__ sources,
    const double* __restrict__ centre, const double* __restrict__ multipoles,
    double* __restrict__ locals, double* columns)
{
    constexpr int LEN = (P + 1) * (P + 2);
    // Outputs a thread adds up.
    constexpr int OWN = (LEN + M2L_ROTATED_THREADS - 1) / M2L_ROTATED_THREADS;
    const unsigned lane = threadIdx.x;
    unsigned cell, first, last;
    if (!m2l_target(targets, count, spans, &cell, &first, &last)) {
        return;
    }
    const double tx = centre[3 * cell], ty = centre[3 * cell + 1], tz = centre[3 * cell + 2];
    double sum[OWN];
#pragma unroll
    for (int o = 0; o < OWN; ++o) sum[o] = 0.0;
    for (unsigned b = first; b < last; b += M2L_ROTATED_THREADS) {
        const unsigned width = min((unsigned)M2L_ROTATED_THREADS, last - b);
        if (lane < width) {
            const unsigned src = sources[b + lane];
            translate_one<P>(multipoles + (size_t)src * LEN, tx - centre[3 * src],
                             ty - centre[3 * src + 1], tz - centre[3 * src + 2],
                             columns + lane);
        }
        __syncthreads();
#pragma unroll
        for (int o = 0; o < OWN; ++o) {
            const int i = (int)lane + o * M2L_ROTATED_THREADS;
            if (i < LEN) {
                const double* row = columns + i * M2L_ROTATED_STRIDE;
                for (unsigned j = 0; j < width; ++j) sum[o] += row[j];
            }
        }
        __syncthreads();
    }
    double* out = locals + (size_t)cell * LEN;
#pragma unroll
    for (int o = 0; o < OWN; ++o) {
        const int i = (int)lane + o * M2L_ROTATED_THREADS;
        if (i < LEN) out[i] += sum[o];
    }
}

// M2L of order P (1 to M2L_ROTATED_ORDER; the host takes m2l_cells for larger ones), one
// block of M2L_ROTATED_THREADS per target cell: a kernel per order, so each has the registers
// and shared memory of its own order (at p = 7, 168 registers and 19 KB for sm_90, against
// 246 and 24 KB with order 8's body in the same kernel).
#define M2L_ROTATED_KERNEL(P)                                                                  \
    extern "C" __global__ void m2l_rotated_##P(                                               \
        const unsigned* __restrict__ targets, unsigned count,                                  \
        const unsigned long long* __restrict__ spans, const unsigned* __restrict__ sources,    \
        const double* __restrict__ centre, const double* __restrict__ multipoles, int p,       \
        double* __restrict__ locals)                                                           \
    {                                                                                          \
        __shared__ double columns[(P + 1) * (P + 2) * M2L_ROTATED_STRIDE];                     \
        m2l_rotated_block<P>(targets, count, spans, sources, centre, multipoles, locals,       \
                             columns);                                                         \
    }
M2L_ROTATED_KERNEL(1)
M2L_ROTATED_KERNEL(2)
M2L_ROTATED_KERNEL(3)
M2L_ROTATED_KERNEL(4)
M2L_ROTATED_KERNEL(5)
M2L_ROTATED_KERNEL(6)
M2L_ROTATED_KERNEL(7)
M2L_ROTATED_KERNEL(8)
