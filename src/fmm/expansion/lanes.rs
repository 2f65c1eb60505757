//! The lane-batched kernels of the expansions: the M2L (`m2l_lanes`, the rotated M2L on
//! `M2L_LANES` translations into one target), L2P and P2M of `M2L_LANES` points at once,
//! each compiled for AVX-512, AVX2 and the portable target (`lane_kernels!`), chosen at run
//! time (`select_lane_kernels`). Every build does the same operations in the same order, so
//! they give the same bits; only data movement (the 8 × 8 transpositions) differs.

use super::*;
use std::mem::MaybeUninit;

/// Multipoles translated together by `Operators::m2l_batch`.
pub const M2L_LANES: usize = 8;

/// Lane-vector of f64.
pub(in crate::fmm) type V = [f64; M2L_LANES];

/// The batched M2L body for a compile-time order `P` with `LEN = real_len(P)`.
#[inline(always)]
fn m2l_lanes<const P: usize, const LEN: usize>(
    ops: &Operators,
    r: &[[f64; 3]; M2L_LANES],
    multipoles: &[&[f64]; M2L_LANES],
    local: &mut [f64],
    transposer: impl Transpose,
) {
    const W: usize = M2L_LANES;
    // `b` below is written row by row: every row of the LEN exists for (k, l), l <= k <= P.
    const { assert!(LEN == real_len(P)) };
    // Geometry per lane.
    let (mut cphi, mut sphi, mut cth, mut sth, mut inv_rho) =
        ([0.0; W], [0.0; W], [0.0; W], [0.0; W], [0.0; W]);
    for w in 0..W {
        let rxy2 = r[w][0] * r[w][0] + r[w][1] * r[w][1];
        let rho = (rxy2 + r[w][2] * r[w][2]).sqrt();
        let rxy = rxy2.sqrt();
        (cphi[w], sphi[w]) = if rxy > 0.0 {
            (r[w][0] / rxy, r[w][1] / rxy)
        } else {
            (1.0, 0.0)
        };
        (cth[w], sth[w]) = (r[w][2] / rho, rxy / rho);
        inv_rho[w] = 1.0 / rho;
    }
    let mut a = MaybeUninit::uninit();
    let a = gather_lanes::<LEN>(multipoles, transposer, &mut a);
    // M~ = T(S^-1) Tz(-θ) T(S) Tz(-φ) M, degree by degree (rotations keep the degree).
    let (mut phi, mut theta) = (MaybeUninit::uninit(), MaybeUninit::uninit());
    let phi = cos_sin_multiples::<P>(&cphi, &sphi, &mut phi);
    let theta = cos_sin_multiples::<P>(&cth, &sth, &mut theta);
    let forward = (
        SwapMatrix::Swap,
        SwapMatrix::Unswap,
        &ops.swap_flat,
        &ops.unswap_flat,
    );
    // One scratch for every degree's intermediate rows (zeroing it per degree cost more
    // than the z rotations).
    let mut x = [[0.0f64; W]; 2 * MAX_ORDER + 2];
    each_degree!(
        P,
        rotate_degree,
        &mut *a,
        &mut x,
        phi,
        theta,
        forward,
        false
    );
    // Translation along +z: L~_k^l = (-1)^{k+l} Σ_n conj(M~_n^l) (n+k)!/rho^{n+k+1}.
    // (n + k)! / rho^(n + k + 1) for n + k = 0..=P + 1.
    let mut pow = inv_rho;
    let mut factor = [[0.0f64; W]; MAX_ORDER + 2];
    for (s, f) in factor.iter_mut().enumerate().take(P + 2) {
        if s > 0 {
            for w in 0..W {
                pow[w] *= inv_rho[w];
            }
        }
        for w in 0..W {
            f[w] = ops.factorial[s] * pow[w];
        }
    }
    // Every row of `b` is written below (those of k + l > P with zeros), so it starts
    // uninitialised: zeroing its LEN rows per batch showed in the profile.
    let mut b = MaybeUninit::<[V; LEN]>::uninit();
    let rows = b.as_mut_ptr().cast::<V>();
    for l in 0..=P {
        for k in l..=P {
            let (mut re, mut im) = ([0.0f64; W], [0.0f64; W]);
            if k <= P - l {
                for n in l..=P - k {
                    let c = cidx(n, l);
                    // SAFETY: n + k <= P < MAX_ORDER + 2 rows of `factor`, and
                    // 2 cidx(n, l) + 1 < LEN for l <= n <= P. (Checked, the index
                    // arithmetic and its branches outweighed the products.)
                    let (fw, ar, ai) = unsafe {
                        (
                            factor.get_unchecked(n + k),
                            a.get_unchecked(2 * c),
                            a.get_unchecked(2 * c + 1),
                        )
                    };
                    // Fused: one rounding a term (the portable build's `mul_add` too).
                    for w in 0..W {
                        re[w] = ar[w].mul_add(fw[w], re[w]);
                        im[w] = (-ai[w]).mul_add(fw[w], im[w]);
                    }
                }
                let sign = if (k + l) % 2 == 0 { 1.0 } else { -1.0 };
                for w in 0..W {
                    (re[w], im[w]) = (sign * re[w], sign * im[w]);
                }
            }
            let c = cidx(k, l);
            // SAFETY: c < LEN / 2 for l <= k <= P, so both rows are inside `b`.
            unsafe {
                rows.add(2 * c).write(re);
                rows.add(2 * c + 1).write(im);
            }
        }
    }
    // SAFETY: (k, l) ran over every 0 <= l <= k <= P, each writing rows 2 cidx(k, l) and
    // 2 cidx(k, l) + 1: all LEN = (P + 1)(P + 2) rows.
    let b = unsafe { b.assume_init_mut() };
    // L += Tz(-φ) U_S Tz(-θ) U_S^-1 L~ (the z rotations are symmetric under W).
    let back = (
        SwapMatrix::UnswapLocal,
        SwapMatrix::SwapLocal,
        &ops.unswap_local_flat,
        &ops.swap_local_flat,
    );
    each_degree!(P, rotate_degree, &mut *b, &mut x, theta, phi, back, true);
    // All lanes share the target: sum them in a fixed order.
    sum_lanes_into(b, local, transposer);
}

/// An 8 × 8 transposition of f64 values: the one data movement of the M2L that the
/// compiler did not turn into vector code by itself. Every build moves the same values, so
/// the bits do not depend on which one runs.
trait Transpose: Copy {
    /// `out[k][w] = rows[w][k]`.
    fn transpose(self, rows: [&[f64; M2L_LANES]; M2L_LANES]) -> [V; M2L_LANES];
}

/// Transposition in plain Rust (the AVX2 and portable builds).
#[derive(Clone, Copy)]
struct Portable;

impl Transpose for Portable {
    #[inline(always)]
    fn transpose(self, rows: [&[f64; M2L_LANES]; M2L_LANES]) -> [V; M2L_LANES] {
        std::array::from_fn(|k| std::array::from_fn(|w| rows[w][k]))
    }
}

#[cfg(target_arch = "x86_64")]
mod transpose {
    use super::{M2L_LANES, Transpose, V};
    use std::arch::x86_64::*;

    /// Transposition in 24 AVX-512 shuffles (unpack pairs, then 256- and 512-bit halves).
    /// Only the AVX-512 build of the lane kernels holds one.
    #[derive(Clone, Copy)]
    pub(super) struct Avx512;

    impl Transpose for Avx512 {
        #[inline(always)]
        fn transpose(self, rows: [&[f64; M2L_LANES]; M2L_LANES]) -> [V; M2L_LANES] {
            // SAFETY: `Avx512` is only handed to the lane kernels compiled with AVX-512F,
            // which run only on a CPU that has it; the loads and stores are of whole
            // 8-value arrays.
            unsafe {
                let r: [__m512d; 8] = std::array::from_fn(|w| _mm512_loadu_pd(rows[w].as_ptr()));
                let t: [__m512d; 8] = std::array::from_fn(|i| {
                    let (x, y) = (r[2 * (i / 2)], r[2 * (i / 2) + 1]);
                    if i % 2 == 0 {
                        _mm512_unpacklo_pd(x, y)
                    } else {
                        _mm512_unpackhi_pd(x, y)
                    }
                });
                // u[0..4] from rows 0-3, u[4..8] from rows 4-7: columns (0, 4), (1, 5),
                // (2, 6), (3, 7) in 128-bit pieces.
                let u = [
                    _mm512_shuffle_f64x2::<0x88>(t[0], t[2]),
                    _mm512_shuffle_f64x2::<0x88>(t[1], t[3]),
                    _mm512_shuffle_f64x2::<0xdd>(t[0], t[2]),
                    _mm512_shuffle_f64x2::<0xdd>(t[1], t[3]),
                    _mm512_shuffle_f64x2::<0x88>(t[4], t[6]),
                    _mm512_shuffle_f64x2::<0x88>(t[5], t[7]),
                    _mm512_shuffle_f64x2::<0xdd>(t[4], t[6]),
                    _mm512_shuffle_f64x2::<0xdd>(t[5], t[7]),
                ];
                let out = [
                    _mm512_shuffle_f64x2::<0x88>(u[0], u[4]),
                    _mm512_shuffle_f64x2::<0x88>(u[1], u[5]),
                    _mm512_shuffle_f64x2::<0x88>(u[2], u[6]),
                    _mm512_shuffle_f64x2::<0x88>(u[3], u[7]),
                    _mm512_shuffle_f64x2::<0xdd>(u[0], u[4]),
                    _mm512_shuffle_f64x2::<0xdd>(u[1], u[5]),
                    _mm512_shuffle_f64x2::<0xdd>(u[2], u[6]),
                    _mm512_shuffle_f64x2::<0xdd>(u[3], u[7]),
                ];
                let mut v = [[0.0f64; M2L_LANES]; M2L_LANES];
                for (o, x) in v.iter_mut().zip(out) {
                    _mm512_storeu_pd(o.as_mut_ptr(), x);
                }
                v
            }
        }
    }
}

/// The multipoles' coefficients lane by lane (row i: coefficient i of each lane), eight
/// rows at a time by `Transpose` (one value at a time took a tenth of the M2L).
#[inline(always)]
fn gather_lanes<'a, const LEN: usize>(
    multipoles: &[&[f64]; M2L_LANES],
    transposer: impl Transpose,
    a: &'a mut MaybeUninit<[V; LEN]>,
) -> &'a mut [V; LEN] {
    const W: usize = M2L_LANES;
    let m: [&[f64; LEN]; W] = std::array::from_fn(|w| {
        multipoles[w][..LEN]
            .try_into()
            .expect("a multipole of real_len(P) values")
    });
    // Every row is written once, in place: no zeroing first, no copy after (both showed in
    // the profile).
    let rows_out = a.as_mut_ptr().cast::<V>();
    let blocks = LEN / W;
    for blk in 0..blocks {
        let rows: [&[f64; W]; W] = std::array::from_fn(|w| {
            m[w][blk * W..blk * W + W]
                .try_into()
                .expect("eight coefficients")
        });
        for (k, row) in transposer.transpose(rows).into_iter().enumerate() {
            // SAFETY: blk * W + k < blocks * W <= LEN.
            unsafe { rows_out.add(blk * W + k).write(row) };
        }
    }
    for i in blocks * W..LEN {
        // SAFETY: i < LEN.
        unsafe { rows_out.add(i).write(std::array::from_fn(|w| m[w][i])) };
    }
    // SAFETY: the loops above wrote rows 0..blocks * W and blocks * W..LEN.
    unsafe { a.assume_init_mut() }
}

/// Adds to `local[i]` the sum of row i's lanes, in lane order from zero, for every row of
/// `lanes`: eight rows at a time transposed, so that the sums are vector additions.
#[inline(always)]
fn sum_lanes_into<const LEN: usize>(
    lanes: &[V; LEN],
    local: &mut [f64],
    transposer: impl Transpose,
) {
    const W: usize = M2L_LANES;
    let local: &mut [f64; LEN] = (&mut local[..LEN]).try_into().expect("a local expansion");
    let blocks = LEN / W;
    for blk in 0..blocks {
        let rows: [&[f64; W]; W] = std::array::from_fn(|k| &lanes[blk * W + k]);
        let columns = transposer.transpose(rows);
        let mut sum = [0.0f64; W];
        for column in columns {
            for k in 0..W {
                sum[k] += column[k];
            }
        }
        for k in 0..W {
            local[blk * W + k] += sum[k];
        }
    }
    for i in blocks * W..LEN {
        let mut sum = 0.0;
        for w in 0..W {
            sum += lanes[i][w];
        }
        local[i] += sum;
    }
}

/// Calls `$f::<N, 2N + 2>($args)` for every degree N up to the order `$p`.
macro_rules! each_degree {
    ($p:expr, $f:ident, $($arg:expr),*) => {
        $f::<0, 2>($($arg),*);
        if $p >= 1 { $f::<1, 4>($($arg),*); }
        if $p >= 2 { $f::<2, 6>($($arg),*); }
        if $p >= 3 { $f::<3, 8>($($arg),*); }
        if $p >= 4 { $f::<4, 10>($($arg),*); }
        if $p >= 5 { $f::<5, 12>($($arg),*); }
        if $p >= 6 { $f::<6, 14>($($arg),*); }
        if $p >= 7 { $f::<7, 16>($($arg),*); }
        if $p >= 8 { $f::<8, 18>($($arg),*); }
        if $p >= 9 { $f::<9, 20>($($arg),*); }
        if $p >= 10 { $f::<10, 22>($($arg),*); }
        if $p >= 11 { $f::<11, 24>($($arg),*); }
        if $p >= 12 { $f::<12, 26>($($arg),*); }
    };
}
use each_degree;

/// (cos mα, sin mα) for m = 0..=P, lane by lane, by the recursion of products
/// (the rotations' factors e^{imα}).
#[inline(always)]
fn cos_sin_multiples<'a, const P: usize>(
    c: &V,
    s: &V,
    out: &'a mut MaybeUninit<[(V, V); MAX_ORDER + 1]>,
) -> &'a [(V, V); MAX_ORDER + 1] {
    // Written entry by entry in place: an initialised array to fill and return cost a
    // memset and a copy per call.
    let entries = out.as_mut_ptr().cast::<(V, V)>();
    let (mut cm, mut sm) = ([1.0f64; M2L_LANES], [0.0f64; M2L_LANES]);
    for m in 0..=MAX_ORDER {
        if (1..=P).contains(&m) {
            for w in 0..M2L_LANES {
                (cm[w], sm[w]) = (cm[w] * c[w] - sm[w] * s[w], sm[w] * c[w] + cm[w] * s[w]);
            }
        }
        let entry = if m <= P {
            (cm, sm)
        } else {
            ([1.0f64; M2L_LANES], [0.0f64; M2L_LANES])
        };
        // SAFETY: m <= MAX_ORDER, inside `out`.
        unsafe { entries.add(m).write(entry) };
    }
    // SAFETY: every entry 0..=MAX_ORDER was written.
    unsafe { out.assume_init_ref() }
}

/// Multiplies each degree-N coefficient `v[2m], v[2m + 1]` (re, im of m) by e^{imα}.
#[inline(always)]
fn rotate_z_degree<const N: usize, const D: usize>(v: &mut [V; D], cs: &[(V, V); MAX_ORDER + 1]) {
    for m in 1..=N {
        let (cm, sm) = &cs[m];
        for w in 0..M2L_LANES {
            let (re, im) = (v[2 * m][w], v[2 * m + 1][w]);
            v[2 * m][w] = re * cm[w] - im * sm[w];
            v[2 * m + 1][w] = re * sm[w] + im * cm[w];
        }
    }
}

/// The pair of rotations of the M2L on the rows of degree N: `v_N = second · Rz(second
/// angle) · first · Rz(first angle) v_N` (a multipole into the frame of its offset), or
/// with `back`, `v_N = Rz(second angle) · second · Rz(first angle) · first v_N` (a local
/// expansion back out of it).
#[inline(always)]
fn rotate_degree<const N: usize, const D: usize>(
    v: &mut [V],
    x: &mut [V],
    first_angle: &[(V, V); MAX_ORDER + 1],
    second_angle: &[(V, V); MAX_ORDER + 1],
    (first, second, first_rows, second_rows): (SwapMatrix, SwapMatrix, &SparseRows, &SparseRows),
    back: bool,
) {
    let base = 2 * cidx(N, 0);
    let rows: &mut [V; D] = (&mut v[base..base + D])
        .try_into()
        .expect("a degree's rows");
    let x: &mut [V; D] = (&mut x[..D]).try_into().expect("a degree's scratch");
    if back {
        swap_degree::<N>(first, first_rows, rows, x);
        rotate_z_degree::<N, D>(x, first_angle);
        swap_degree::<N>(second, second_rows, x, rows);
        rotate_z_degree::<N, D>(rows, second_angle);
    } else {
        // The rows are rewritten at the end: the first rotation can work on them in place.
        rotate_z_degree::<N, D>(rows, first_angle);
        swap_degree::<N>(first, first_rows, rows, x);
        rotate_z_degree::<N, D>(x, second_angle);
        swap_degree::<N>(second, second_rows, x, rows);
    }
}

/// `out = M v` on the rows of degree N: straight-line code where `swap_lanes` has it, the
/// sparse rows `m` otherwise; the same bits.
#[inline(always)]
fn swap_degree<const N: usize>(which: SwapMatrix, m: &SparseRows, v: &[V], out: &mut [V]) {
    if !crate::fmm::swap_lanes::apply_degree::<N>(which, v, out) {
        let base = 2 * cidx(N, 0);
        for (r, row) in out.iter_mut().enumerate().take(2 * N + 2) {
            let mut sum = [0.0f64; M2L_LANES];
            for e in m.start[base + r] as usize..m.start[base + r + 1] as usize {
                let (a, src) = (m.val[e], &v[m.col[e] as usize - base]);
                for w in 0..M2L_LANES {
                    sum[w] = a.mul_add(src[w], sum[w]);
                }
            }
            *row = sum;
        }
    }
}

/// Entry points of the lane-batched kernels (M2L, L2P, P2M) for this CPU.
#[derive(Debug, Clone, Copy)]
pub(super) struct LaneKernels {
    pub(super) m2l: M2lKernel,
    pub(super) l2p: L2pKernel,
    pub(super) p2m: P2mKernel,
    pub(super) shift: ShiftKernel,
}

type M2lKernel =
    unsafe fn(&Operators, &[[f64; 3]; M2L_LANES], &[&[f64]; M2L_LANES], &mut [f64], usize);
type L2pKernel = unsafe fn(&[[f64; 3]; M2L_LANES], &[f64], usize) -> [[f64; 4]; M2L_LANES];
type P2mKernel = unsafe fn(&[[f64; 3]; M2L_LANES], &[f64; M2L_LANES], &mut [f64], usize);
type ShiftKernel = unsafe fn(&ShiftTable, &[[f64; 3]; M2L_LANES], &[V], &mut [V], usize);

/// Calls `$f::<P, real_len(P)>($args)` for the runtime order `$p`.
macro_rules! by_order {
    ($p:expr, $f:ident, $($arg:expr),*) => {
        match $p {
            1 => $f::<1, 6>($($arg),*),
            2 => $f::<2, 12>($($arg),*),
            3 => $f::<3, 20>($($arg),*),
            4 => $f::<4, 30>($($arg),*),
            5 => $f::<5, 42>($($arg),*),
            6 => $f::<6, 56>($($arg),*),
            7 => $f::<7, 72>($($arg),*),
            8 => $f::<8, 90>($($arg),*),
            9 => $f::<9, 110>($($arg),*),
            10 => $f::<10, 132>($($arg),*),
            11 => $f::<11, 156>($($arg),*),
            _ => $f::<12, 182>($($arg),*),
        }
    };
}

/// Defines the three lane kernels compiled with one set of target features.
macro_rules! lane_kernels {
    ($attr:meta, $set:ident, $transposer:expr) => {
        /// The lane kernels compiled for one instruction set; callers must make sure the CPU
        /// supports its features.
        mod $set {
            use super::*;

            /// # Safety
            /// The CPU must support the enabled features.
            #[$attr]
            pub(super) unsafe fn m2l(
                ops: &Operators,
                r: &[[f64; 3]; M2L_LANES],
                m: &[&[f64]; M2L_LANES],
                l: &mut [f64],
                p: usize,
            ) {
                by_order!(p, m2l_lanes, ops, r, m, l, $transposer)
            }

            /// # Safety
            /// The CPU must support the enabled features.
            #[$attr]
            pub(super) unsafe fn l2p(
                x: &[[f64; 3]; M2L_LANES],
                local: &[f64],
                p: usize,
            ) -> [[f64; 4]; M2L_LANES] {
                by_order!(p, l2p_lanes, x, local)
            }

            /// # Safety
            /// The CPU must support the enabled features.
            #[$attr]
            pub(super) unsafe fn p2m(
                y: &[[f64; 3]; M2L_LANES],
                q: &[f64; M2L_LANES],
                multipole: &mut [f64],
                p: usize,
            ) {
                by_order!(p, p2m_lanes, y, q, multipole)
            }

            /// # Safety
            /// The CPU must support the enabled features.
            #[$attr]
            pub(super) unsafe fn shift(
                table: &ShiftTable,
                t: &[[f64; 3]; M2L_LANES],
                a: &[V],
                out: &mut [V],
                p: usize,
            ) {
                by_order!(p, shift_lanes, table, t, a, out)
            }
        }
    };
}

#[cfg(target_arch = "x86_64")]
lane_kernels!(
    target_feature(enable = "avx512f,avx2,fma"),
    avx512,
    super::transpose::Avx512
);
#[cfg(target_arch = "x86_64")]
lane_kernels!(target_feature(enable = "avx2,fma"), avx2, Portable);
lane_kernels!(inline, portable, Portable);

/// The widest build of the lane kernels this CPU runs. Every build gives the same bits: no
/// FMA contraction and a fixed operation order.
pub(super) fn select_lane_kernels() -> LaneKernels {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return LaneKernels {
                m2l: avx512::m2l,
                l2p: avx512::l2p,
                p2m: avx512::p2m,
                shift: avx512::shift,
            };
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            return LaneKernels {
                m2l: avx2::m2l,
                l2p: avx2::l2p,
                p2m: avx2::p2m,
                shift: avx2::shift,
            };
        }
    }
    LaneKernels {
        m2l: portable::m2l,
        l2p: portable::l2p,
        p2m: portable::p2m,
        shift: portable::shift,
    }
}

/// Regular solid harmonics of `M2L_LANES` points at once, lane by lane (see `regular`).
#[inline(always)]
fn regular_lanes<const P: usize, const LEN: usize>(x: &[[f64; 3]; M2L_LANES]) -> [V; LEN] {
    const W: usize = M2L_LANES;
    let mut out = [[0.0f64; W]; LEN];
    let (mut z, mut r2, mut xr, mut xi) = ([0.0; W], [0.0; W], [0.0; W], [0.0; W]);
    for w in 0..W {
        (xr[w], xi[w], z[w]) = (x[w][0], x[w][1], x[w][2]);
        r2[w] = xr[w] * xr[w] + xi[w] * xi[w] + z[w] * z[w];
    }
    out[0] = [1.0; W];
    for m in 0..=P {
        let d = cidx(m, m);
        if m > 0 {
            let prev = cidx(m - 1, m - 1);
            let f = -1.0 / (2.0 * m as f64);
            for w in 0..W {
                let (pr, pi) = (out[2 * prev][w], out[2 * prev + 1][w]);
                out[2 * d][w] = f * (xr[w] * pr - xi[w] * pi);
                out[2 * d + 1][w] = f * (xr[w] * pi + xi[w] * pr);
            }
        }
        if m < P {
            let k = cidx(m + 1, m);
            for w in 0..W {
                out[2 * k][w] = z[w] * out[2 * d][w];
                out[2 * k + 1][w] = z[w] * out[2 * d + 1][w];
            }
        }
        for n in m + 2..=P {
            let (k, a, b) = (cidx(n, m), cidx(n - 1, m), cidx(n - 2, m));
            let inv = 1.0 / (((n - m) * (n + m)) as f64);
            let c1 = (2 * n - 1) as f64;
            for w in 0..W {
                let cz = c1 * z[w];
                out[2 * k][w] = (cz * out[2 * a][w] - r2[w] * out[2 * b][w]) * inv;
                out[2 * k + 1][w] = (cz * out[2 * a + 1][w] - r2[w] * out[2 * b + 1][w]) * inv;
            }
        }
    }
    out
}

/// Where coefficient (n, m) of a real-source expansion lies for any m in -n..=n, and the
/// signs its real and imaginary parts take there.
#[inline(always)]
fn signed_row(n: usize, m: isize) -> (usize, f64, f64) {
    let c = cidx(n, m.unsigned_abs());
    if m >= 0 {
        (c, 1.0, 1.0)
    } else if m % 2 == 0 {
        (c, 1.0, -1.0)
    } else {
        (c, -1.0, 1.0)
    }
}

/// `acc += a x + b y` lane by lane (the products rounded, then summed, then added).
#[inline(always)]
fn add_products(acc: &mut V, a: f64, x: &V, b: f64, y: &V) {
    for w in 0..M2L_LANES {
        acc[w] += a * x[w] + b * y[w];
    }
}

/// L2P for `M2L_LANES` points sharing one local expansion: per lane `[pot, ax, ay, az]` with
/// the potential `-G pot` and the acceleration `G a`:
/// Φ/(-G) = Σ conj(R_k^l(x)) L_k^l, and the gradient from
/// L'_1^i = Σ_{k>=1} Σ_l conj(R_{k-1}^{l-i}(x)) L_k^l (i = 0, 1).
#[inline(always)]
fn l2p_lanes<const P: usize, const LEN: usize>(
    x: &[[f64; 3]; M2L_LANES],
    local: &[f64],
) -> [[f64; 4]; M2L_LANES] {
    const W: usize = M2L_LANES;
    let r = regular_lanes::<P, LEN>(x);
    let mut pot = [0.0f64; W];
    for k in 0..=P {
        for l in 0..=k {
            let c = cidx(k, l);
            let wgt = if l == 0 { 1.0 } else { 2.0 };
            let (lr, li) = (wgt * local[2 * c], wgt * local[2 * c + 1]);
            for w in 0..W {
                pot[w] += r[2 * c][w] * lr + r[2 * c + 1][w] * li;
            }
        }
    }
    // The gradient's terms in the order of the sum over l = -k..=k. The symmetry signs of
    // R_d^(l) and L_k^l for negative orders are folded into the two scalar factors (a sign
    // change is exact and commutes with a rounded product), so each term is two products of
    // a scalar with a lane row and the sums keep their order: the same bits as summing the
    // signed coefficients, in whole vectors.
    // Three passes, one a component: each sum keeps its order, and the compiler keeps each
    // pass in whole vectors (one pass for the three interleaved them into scalar code).
    let l10 = gradient_sum::<P>(&r, local, 0, |lr, li, sr, si| (sr * lr, si * li));
    let l11r = gradient_sum::<P>(&r, local, 1, |lr, li, sr, si| (sr * lr, si * li));
    // x - y is x + (-y) in IEEE arithmetic: the same bits as the difference.
    let l11i = gradient_sum::<P>(&r, local, 1, |lr, li, sr, si| (sr * li, -(si * lr)));
    std::array::from_fn(|w| [pot[w], -l11r[w], -l11i[w], l10[w]])
}

/// One component of the L2P gradient: Σ_{k=1..P} Σ_{j=-(k-1)..k-1} (a R_{k-1}^j.re +
/// b R_{k-1}^j.im) over the lane rows `r`, with (a, b) = `factors(L_k^(j+shift), signs of
/// R_{k-1}^j)` in that order of terms.
#[inline(always)]
fn gradient_sum<const P: usize>(
    r: &[V],
    local: &[f64],
    shift: isize,
    factors: impl Fn(f64, f64, f64, f64) -> (f64, f64),
) -> V {
    let mut sum = [0.0f64; M2L_LANES];
    for k in 1..=P {
        let d = (k - 1) as isize;
        for j in -d..=d {
            let (lr, li) = get(local, k, j + shift);
            let (c, sr, si) = signed_row(k - 1, j);
            let (a, b) = factors(lr, li, sr, si);
            add_products(&mut sum, a, &r[2 * c], b, &r[2 * c + 1]);
        }
    }
    sum
}

/// P2M for `M2L_LANES` points with masses `q` (zero for unused lanes): M += Σ q conj(R(y)),
/// summed over the lanes in a fixed order.
#[inline(always)]
fn p2m_lanes<const P: usize, const LEN: usize>(
    y: &[[f64; 3]; M2L_LANES],
    q: &[f64; M2L_LANES],
    multipole: &mut [f64],
) {
    let r = regular_lanes::<P, LEN>(y);
    for c in 0..LEN / 2 {
        let (mut re, mut im) = (0.0, 0.0);
        for w in 0..M2L_LANES {
            re += q[w] * r[2 * c][w];
            im -= q[w] * r[2 * c + 1][w];
        }
        multipole[2 * c] += re;
        multipole[2 * c + 1] += im;
    }
}

/// M2M or L2L (`table`) of `M2L_LANES` expansions `a` (lane rows) by the offsets `t`, into
/// `out` (lane rows; see `ShiftTable::apply_lanes`).
#[inline(always)]
fn shift_lanes<const P: usize, const LEN: usize>(
    table: &ShiftTable,
    t: &[[f64; 3]; M2L_LANES],
    a: &[V],
    out: &mut [V],
) {
    let r = regular_lanes::<P, LEN>(t);
    table.apply_lanes(&a[..LEN], &r, &mut out[..LEN]);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The builds of lane kernel `$k` this CPU runs, the portable one first.
    macro_rules! builds {
        ($k:ident) => {{
            #[allow(unused_mut)]
            let mut builds = vec![portable::$k as _];
            #[cfg(target_arch = "x86_64")]
            {
                if std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                {
                    builds.push(avx2::$k as _);
                }
                if std::arch::is_x86_feature_detected!("avx512f") {
                    builds.push(avx512::$k as _);
                }
            }
            builds
        }};
    }

    /// Deterministic values in [-0.5, 0.5) from `seed`.
    fn uniform(mut seed: u64) -> impl FnMut() -> f64 {
        move || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 11) as f64 / (1u64 << 53) as f64 - 0.5
        }
    }

    /// Every build of the M2L this CPU runs gives the same bits (the AVX-512 build moves
    /// the lanes with its own shuffles; the arithmetic is the same in all of them).
    #[test]
    fn every_build_of_the_m2l_gives_the_same_bits() {
        let mut next = uniform(11);
        let builds: Vec<M2lKernel> = builds!(m2l);
        for p in [1, 3, 7, 9, 12] {
            let ops = Operators::new(p);
            let len = real_len(p);
            let ms: Vec<Vec<f64>> = (0..M2L_LANES)
                .map(|_| (0..len).map(|_| next()).collect())
                .collect();
            let refs: [&[f64]; M2L_LANES] = std::array::from_fn(|w| ms[w].as_slice());
            let r: [[f64; 3]; M2L_LANES] =
                std::array::from_fn(|_| [3.0 + next(), 2.0 * next(), -2.5 + next()]);
            let outputs: Vec<Vec<u64>> = builds
                .iter()
                .map(|&m2l| {
                    let mut local: Vec<f64> = (0..len).map(|i| i as f64 * 0.25).collect();
                    // SAFETY: only the builds this CPU runs are listed.
                    unsafe { m2l(&ops, &r, &refs, &mut local, p) };
                    local.iter().map(|x| x.to_bits()).collect()
                })
                .collect();
            for (b, out) in outputs.iter().enumerate().skip(1) {
                assert_eq!(
                    out, &outputs[0],
                    "build {b} differs from the portable one at p = {p}"
                );
            }
        }
    }

    /// Every build of the batched M2M and L2L gives the bits of the free functions `m2m`
    /// and `l2l`, one expansion at a time, at every order.
    #[test]
    fn every_build_of_the_batched_shifts_gives_the_free_functions_bits() {
        let mut next = uniform(5);
        let builds: Vec<ShiftKernel> = builds!(shift);
        for p in 1..=MAX_ORDER {
            let len = real_len(p);
            type Free = fn(usize, [f64; 3], &[f64], &mut [f64], &mut [f64]);
            let tables: [(ShiftTable, Free); 2] =
                [(ShiftTable::m2m(p), m2m), (ShiftTable::l2l(p), l2l)];
            let a: Vec<V> = (0..len).map(|_| std::array::from_fn(|_| next())).collect();
            let t: [[f64; 3]; M2L_LANES] = std::array::from_fn(|_| [next(), next(), next()]);
            for (table, free) in &tables {
                let mut scratch = vec![0.0; len];
                let want: Vec<Vec<u64>> = (0..M2L_LANES)
                    .map(|w| {
                        let lane: Vec<f64> = a.iter().map(|row| row[w]).collect();
                        let mut out = vec![0.0; len];
                        free(p, t[w], &lane, &mut out, &mut scratch);
                        out.iter().map(|x| x.to_bits()).collect()
                    })
                    .collect();
                for (b, shift) in builds.iter().enumerate() {
                    let mut out = vec![[f64::NAN; M2L_LANES]; len];
                    // SAFETY: only the builds this CPU runs are listed.
                    unsafe { shift(table, &t, &a, &mut out, p) };
                    for (w, lane) in want.iter().enumerate() {
                        let got: Vec<u64> =
                            out.iter().map(|row| (row[w] + 0.0).to_bits()).collect();
                        assert_eq!(&got, lane, "build {b}, lane {w}, p = {p}");
                    }
                }
            }
        }
    }
}
