//! The f32 pair kernel in each instruction set's vector code: the windows
//! `pairwise::FastWindow` names, for 16 lanes (`LANES_F32`).
//!
//! Why by hand: the compiler's vectorisation of the generic loop kept the sums in memory,
//! would not fuse multiply–adds, and computed `1/sqrt` with a square root and a division,
//! the two slowest vector instructions (1.8e9 interactions per second per core on AVX-512;
//! `cargo bench --bench p2p`). Every build does the same IEEE operations in the same order on
//! each lane but for `1/sqrt(r²)`, which each takes from its own estimate: AVX-512 the CPU's
//! `vrsqrt14ps` (2^-14) and one Newton step, AVX2 `rsqrtps` (1.5·2^-12) and one, the portable
//! build the bit-pattern estimate and three (`rsqrt`); every one within 3e-7 of the exact
//! value (tests below). So a build gives the same bits for any thread count, and builds differ
//! from each other at f32's rounding: a run restarted on a CPU with another instruction set
//! continues within round-off, not bit for bit. Why not one estimate for all: the bit-pattern
//! estimate (its shift and subtraction, the half r² and three Newton steps) is 12 of the
//! AVX-512 loop's ~26 instructions a chunk, the hardware estimate and one step 5
//! (2.1–2.4e9 → 2.8–3.0e9 interactions/s).
//!
//! The vector windows keep everything in registers: the sums at a power-of-two scale (one
//! multiplication fewer a chunk, `UNSCALE`), chunks with a pair inside the softening's
//! support in line in the same vector code (`softened_lanes!`, a call in the loop cost every
//! chunk a quarter), f32 sums widened to f64 every `FLUSH_CHUNKS` chunks with lanes l and
//! l + 8 folded first, the lanes summed in one tree at the end (`sum_lanes`): 2.5–2.9 → 3.8–4.0e9
//! interactions/s on AVX-512 (docs/benchmarks.md, "The near field in registers").

use super::pairwise::{BlockSums, FLUSH_CHUNKS, FastWindow, SplineChunks, Staged, TARGET_BLOCK};

/// Lanes of every window.
const L: usize = 16;

/// The bit pattern whose shift gives the first estimate of `1/sqrt` (Lomont's constant).
const RSQRT_MAGIC: u32 = 0x5f37_5a86;

/// Newton steps after the estimate: its 3.4% shrinks to 1.8e-3, 4.7e-6, then f32's rounding.
const RSQRT_STEPS: usize = 3;

/// `1/sqrt(x)` for `x > 0` as every build computes it; finite at 0.
#[inline(always)]
fn rsqrt(x: f32) -> f32 {
    let half = 0.5 * x;
    let mut y = f32::from_bits(RSQRT_MAGIC.wrapping_sub(x.to_bits() >> 1));
    for _ in 0..RSQRT_STEPS {
        y *= (-(half * y)).mul_add(y, 1.5);
    }
    y
}

/// Targets per call.
const TB: usize = TARGET_BLOCK;

/// The portable build (any CPU; `f32::mul_add` is a library call without FMA hardware).
#[derive(Debug, Clone, Copy)]
pub struct Portable;

/// The AVX2 + FMA build.
#[cfg(target_arch = "x86_64")]
#[derive(Debug, Clone, Copy)]
pub struct Avx2;

/// The AVX-512 build.
#[cfg(target_arch = "x86_64")]
#[derive(Debug, Clone, Copy)]
pub struct Avx512;

impl FastWindow for Portable {
    unsafe fn sums(
        src: &Staged<f32, L>,
        targets: &[[f32; 3]; TB],
        spline: SplineChunks,
    ) -> BlockSums<TB> {
        window_portable(src, targets, spline)
    }
}

#[cfg(target_arch = "x86_64")]
impl FastWindow for Avx2 {
    unsafe fn sums(
        src: &Staged<f32, L>,
        targets: &[[f32; 3]; TB],
        spline: SplineChunks,
    ) -> BlockSums<TB> {
        // SAFETY: the caller's CPU supports AVX2 and FMA.
        unsafe { window_avx2(src, targets, spline) }
    }
}

#[cfg(target_arch = "x86_64")]
impl FastWindow for Avx512 {
    unsafe fn sums(
        src: &Staged<f32, L>,
        targets: &[[f32; 3]; TB],
        spline: SplineChunks,
    ) -> BlockSums<TB> {
        // SAFETY: the caller's CPU supports AVX-512F.
        unsafe { window_avx512(src, targets, spline) }
    }
}

/// Lanes of the f64 sums: a window's 16 f32 lanes l and l + 8 share one.
const WIDE: usize = L / 2;

/// Moves one target's f32 sums of a window into its f64 sums: lanes l and l + 8 added in
/// f32 (one rounding; widening is two µops a vector, so this halves them), then widened.
#[inline(always)]
fn flush(total: &mut [[f64; WIDE]; 4], sums: &[[f32; L]; 4]) {
    for q in 0..4 {
        for l in 0..WIDE {
            total[q][l] += f64::from(sums[q][l] + sums[q][l + WIDE]);
        }
    }
}

/// The sum of a target's 8 f64 lanes, in the tree every build uses (the order of a vector
/// build's halving reduction).
#[inline(always)]
fn sum_lanes(v: [f64; WIDE]) -> f64 {
    let quarter = [v[0] + v[4], v[1] + v[5], v[2] + v[6], v[3] + v[7]];
    (quarter[0] + quarter[2]) + (quarter[1] + quarter[3])
}

/// The sums of `targets` over every chunk of `src` (see `pairwise::FastWindow`), one target
/// at a time, each chunk in order: Newtonian chunks here, the others through
/// `SplineChunks::softened`; f32 sums over `FLUSH_CHUNKS` chunks, then f64. Portable build:
/// the operations of the vector builds, lane by lane.
fn window_portable(
    src: &Staged<f32, L>,
    targets: &[[f32; 3]; TB],
    spline: SplineChunks,
) -> BlockSums<TB> {
    let mut out = [[0.0; 4]; TB];
    let chunks = src.x.len();
    for (t, target) in targets.iter().enumerate() {
        let mut total = [[0.0; WIDE]; 4];
        for first in (0..chunks).step_by(FLUSH_CHUNKS) {
            let mut acc = [[0.0f32; L]; 4];
            for c in first..(first + FLUSH_CHUNKS).min(chunks) {
                let (xs, ys, zs, ms) = (&src.x[c], &src.y[c], &src.z[c], &src.m[c]);
                let mut d = [[0.0f32; L]; 4];
                let mut newtonian = true;
                for l in 0..L {
                    d[0][l] = xs[l] - target[0];
                    d[1][l] = ys[l] - target[1];
                    d[2][l] = zs[l] - target[2];
                    d[3][l] = d[2][l].mul_add(d[2][l], d[1][l].mul_add(d[1][l], d[0][l] * d[0][l]));
                    newtonian &= d[3][l] >= spline.newtonian_from;
                }
                if !newtonian {
                    spline.softened(src, c, *target, &mut acc);
                    continue;
                }
                for l in 0..L {
                    let r2 = d[3][l];
                    // m/r (r² > 0 here: see `SplineChunks::newtonian_from`).
                    let y = rsqrt(r2);
                    let mi = ms[l] * y;
                    let mf = mi * y * y;
                    acc[0][l] = d[0][l].mul_add(mf, acc[0][l]);
                    acc[1][l] = d[1][l].mul_add(mf, acc[1][l]);
                    acc[2][l] = d[2][l].mul_add(mf, acc[2][l]);
                    acc[3][l] += mi;
                }
            }
            flush(&mut total, &acc);
        }
        out[t] = total.map(sum_lanes);
    }
    out
}

/// `window_portable` in AVX-512: per target, 4 f32 and 8 f64 sums and its coordinates in
/// registers (two targets at a time, sharing each chunk's loads, spilled and ran slower).
///
/// # Safety
/// The CPU must support AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn window_avx512(
    src: &Staged<f32, L>,
    targets: &[[f32; 3]; TB],
    spline: SplineChunks,
) -> BlockSums<TB> {
    use std::arch::x86_64::*;
    let from = _mm512_set1_ps(spline.newtonian_from);
    let soft = SplineLanes::new(spline, |v| _mm512_set1_ps(v));
    let zero = _mm512_setzero_ps();
    // SAFETY (every load and store): each row is 16 contiguous f32 (8 f64 a half row).
    let load = |v: &[f32; L]| unsafe { _mm512_loadu_ps(v.as_ptr()) };
    let mut out = [[0.0; 4]; TB];
    let chunks = src.x.len();
    for (t, target) in targets.iter().enumerate() {
        let [tx, ty, tz] = target.map(|v| _mm512_set1_ps(v));
        let mut wide = [_mm512_setzero_pd(); 4];
        let mut s = [zero; 4];
        // One loop over every chunk, the flush inside it (a loop per flush ran no faster),
        // over zipped slices (no bounds check).
        let rows = src.x.iter().zip(&src.y).zip(src.z.iter().zip(&src.m));
        for (c, ((x, y), (z, m))) in rows.enumerate() {
            let dx = _mm512_sub_ps(load(x), tx);
            let dy = _mm512_sub_ps(load(y), ty);
            let dz = _mm512_sub_ps(load(z), tz);
            let r2 = _mm512_fmadd_ps(dz, dz, _mm512_fmadd_ps(dy, dy, _mm512_mul_ps(dx, dx)));
            if _mm512_cmp_ps_mask::<_CMP_GE_OQ>(r2, from) == 0xffff {
                // 2m/r and 8m/r³ (r² > 0 here: see `SplineChunks::newtonian_from`).
                let y = twice_rsqrt_avx512(r2);
                let mi = _mm512_mul_ps(load(m), y);
                let mf = _mm512_mul_ps(_mm512_mul_ps(mi, y), y);
                s[0] = _mm512_fmadd_ps(dx, mf, s[0]);
                s[1] = _mm512_fmadd_ps(dy, mf, s[1]);
                s[2] = _mm512_fmadd_ps(dz, mf, s[2]);
                s[3] = _mm512_add_ps(s[3], mi);
            } else {
                // In line: a call here would cost every chunk a quarter (its registers).
                softened_avx512(&soft, [load(x), load(y), load(z), load(m)], *target, &mut s);
            }
            if c % FLUSH_CHUNKS == FLUSH_CHUNKS - 1 || c + 1 == chunks {
                // f32 sums to f64 as `flush`.
                for (w, v) in wide.iter_mut().zip(s) {
                    let low = _mm512_castps512_ps256(v);
                    let high = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
                    *w = _mm512_add_pd(*w, _mm512_cvtps_pd(_mm256_add_ps(low, high)));
                }
                s = [zero; 4];
            }
        }
        for (q, (w, k)) in wide.iter().zip(UNSCALE).enumerate() {
            let mut lanes = [0.0; WIDE];
            // SAFETY: 8 f64.
            unsafe { _mm512_storeu_pd(lanes.as_mut_ptr(), *w) };
            out[t][q] = sum_lanes(lanes) * f64::from(k);
        }
    }
    out
}

/// `window_avx512` in AVX2 (each chunk as two halves of 8 lanes).
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn window_avx2(
    src: &Staged<f32, L>,
    targets: &[[f32; 3]; TB],
    spline: SplineChunks,
) -> BlockSums<TB> {
    use std::arch::x86_64::*;
    let from = _mm256_set1_ps(spline.newtonian_from);
    let soft = SplineLanes::new(spline, |v| _mm256_set1_ps(v));
    let zero = _mm256_setzero_ps();
    // SAFETY (every load and store): each half row is 8 contiguous f32.
    let load = |v: &[f32; L], k: usize| unsafe { _mm256_loadu_ps(v.as_ptr().add(8 * k)) };
    let mut out = [[0.0; 4]; TB];
    let chunks = src.x.len();
    for (t, target) in targets.iter().enumerate() {
        let [tx, ty, tz] = target.map(|v| _mm256_set1_ps(v));
        // f64 sums of lanes 0–3 and 4–7 (each of a chunk's two halves' lanes l and l + 8).
        let mut wide = [[_mm256_setzero_pd(); 2]; 4];
        let mut s = [[zero; 4]; 2];
        let rows = src.x.iter().zip(&src.y).zip(src.z.iter().zip(&src.m));
        for (c, ((x, y), (z, m))) in rows.enumerate() {
            let mut d = [[zero; 4]; 2];
            let mut newtonian = true;
            for (k, dk) in d.iter_mut().enumerate() {
                let dx = _mm256_sub_ps(load(x, k), tx);
                let dy = _mm256_sub_ps(load(y, k), ty);
                let dz = _mm256_sub_ps(load(z, k), tz);
                let r2 = _mm256_fmadd_ps(dz, dz, _mm256_fmadd_ps(dy, dy, _mm256_mul_ps(dx, dx)));
                let ge = _mm256_cmp_ps::<_CMP_GE_OQ>(r2, from);
                newtonian &= _mm256_movemask_ps(ge) == 0xff;
                *dk = [dx, dy, dz, r2];
            }
            if newtonian {
                // 2m/r and 8m/r³ (r² > 0 here: see `SplineChunks::newtonian_from`).
                for (k, [dx, dy, dz, r2]) in d.into_iter().enumerate() {
                    let y = twice_rsqrt_avx2(r2);
                    let mi = _mm256_mul_ps(load(m, k), y);
                    let mf = _mm256_mul_ps(_mm256_mul_ps(mi, y), y);
                    let s = &mut s[k];
                    s[0] = _mm256_fmadd_ps(dx, mf, s[0]);
                    s[1] = _mm256_fmadd_ps(dy, mf, s[1]);
                    s[2] = _mm256_fmadd_ps(dz, mf, s[2]);
                    s[3] = _mm256_add_ps(s[3], mi);
                }
            } else {
                // In line: a call here would cost every chunk a quarter (its registers).
                for (k, s) in s.iter_mut().enumerate() {
                    let rows = [x, y, z, m].map(|r| load(r, k));
                    softened_avx2(&soft, rows, *target, s);
                }
            }
            if c % FLUSH_CHUNKS == FLUSH_CHUNKS - 1 || c + 1 == chunks {
                // f32 sums to f64 as `flush`.
                for (w, (low, high)) in wide.iter_mut().zip(s[0].iter().zip(&s[1])) {
                    let v = _mm256_add_ps(*low, *high);
                    w[0] = _mm256_add_pd(w[0], _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
                    w[1] = _mm256_add_pd(w[1], _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(v)));
                }
                s = [[zero; 4]; 2];
            }
        }
        for (q, (w, k)) in wide.iter().zip(UNSCALE).enumerate() {
            let mut lanes = [0.0; WIDE];
            // SAFETY: twice 4 f64.
            unsafe {
                _mm256_storeu_pd(lanes.as_mut_ptr(), w[0]);
                _mm256_storeu_pd(lanes.as_mut_ptr().add(4), w[1]);
            }
            out[t][q] = sum_lanes(lanes) * f64::from(k);
        }
    }
    out
}

/// The sums' scale in the vector windows, per quantity (x, y, z, potential): they add
/// `8 m d/r³` and `2 m/r`, which `twice_rsqrt_*` give one multiplication sooner; powers of
/// two, so taking them out again is exact and the bits are those of the true scale.
const UNSCALE: [f32; 4] = [0.125, 0.125, 0.125, 0.5];

/// `2/sqrt(x)` on 16 lanes for `x > 0`: `vrsqrt14ps` (2^-14) and one Newton step, `e (3 -
/// x e²)`, twice the step's usual `e (1.5 - x e²/2)` and so one multiplication fewer
/// (f32's rounding). (Safe to call from code compiled for AVX-512F.)
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
fn twice_rsqrt_avx512(x: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    let e = _mm512_rsqrt14_ps(x);
    let step = _mm512_fnmadd_ps(_mm512_mul_ps(x, e), e, _mm512_set1_ps(3.0));
    _mm512_mul_ps(e, step)
}

/// `2/sqrt(x)` on 8 lanes for `x > 0`: `rsqrtps` (1.5·2^-12) and one Newton step (as
/// `twice_rsqrt_avx512`; ~2e-7). (Safe to call from code compiled for AVX2 and FMA.)
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
fn twice_rsqrt_avx2(x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let e = _mm256_rsqrt_ps(x);
    let step = _mm256_fnmadd_ps(_mm256_mul_ps(x, e), e, _mm256_set1_ps(3.0));
    _mm256_mul_ps(e, step)
}

/// The spline's constants for the vector builds' softened chunks (`softened_lanes!`),
/// broadcast once a window: the support h, 1/h, -1/h, 1/h³ as `spline_factors` computes them
/// in f32, and the central potential p0 at the sums' scale (`UNSCALE`).
struct SplineLanes<V> {
    h: V,
    h_inv: V,
    minus_h_inv: V,
    h3_inv: V,
    p0: V,
}

impl<V> SplineLanes<V> {
    /// `spline`'s constants, broadcast by `splat`.
    #[inline(always)]
    fn new(spline: SplineChunks, splat: impl Fn(f32) -> V) -> Self {
        let h_inv = 1.0 / spline.h;
        Self {
            h: splat(spline.h),
            h_inv: splat(h_inv),
            minus_h_inv: splat(-h_inv),
            h3_inv: splat(h_inv * h_inv * h_inv),
            p0: splat(spline.p0 / UNSCALE[3]),
        }
    }
}

/// `SplineChunks::softened` on one vector of lanes in a vector build, added to the window's
/// sums at their scale (`UNSCALE`): lane by lane the IEEE operations of `spline_factors` and
/// `softened_chunk`, in their order (no fused multiply–adds; square root and division are
/// correctly rounded in vector code too), so each lane's terms are the pair-by-pair code's
/// bits times a power of two. In line, not a call: a call in the window's loop cost every
/// chunk a quarter (the registers it may clobber were kept in memory throughout the loop).
/// Arguments: the constants (`SplineLanes`), the rows `[x, y, z, m]`, the target, the sums
/// `[x, y, z, potential]`, then the build's broadcast, add, subtract, multiply, divide and
/// square root, its comparisons `a < b`, `a >= b`, `a > b` and `blend(mask, if_not, if_so)`.
macro_rules! softened_lanes {
    ($k:expr, $rows:expr, $t:expr, $s:expr, $splat:ident, $add:ident, $sub:ident,
     $mul:ident, $div:ident, $sqrt:ident, $lt:expr, $ge:expr, $gt:expr, $blend:expr) => {{
        let (k, s, t) = ($k, $s, $t);
        let c = |v: f64| $splat(v as f32);
        let [x, y, z, m] = $rows;
        let d = [
            $sub(x, $splat(t[0])),
            $sub(y, $splat(t[1])),
            $sub(z, $splat(t[2])),
        ];
        let r2 = $add($add($mul(d[0], d[0]), $mul(d[1], d[1])), $mul(d[2], d[2]));
        let r = $sqrt(r2);
        let inv_r = $div($splat(1.0), r);
        let newton_f = $mul($mul(inv_r, inv_r), inv_r);
        let u = $mul(r, k.h_inv);
        let u2 = $mul(u, u);
        let inner_f = $mul(
            k.h3_inv,
            $add(
                c(32.0 / 3.0),
                $mul(u2, $sub($mul(c(32.0), u), c(192.0 / 5.0))),
            ),
        );
        let inner_poly = $sub($mul(c(32.0 / 5.0), u), c(48.0 / 5.0));
        let inner_p = $mul(
            k.minus_h_inv,
            $add(
                c(-14.0 / 5.0),
                $mul(u2, $add(c(16.0 / 3.0), $mul(u2, inner_poly))),
            ),
        );
        let inv_u = $mul(k.h, inv_r);
        let outer_f = $mul(
            k.h3_inv,
            $sub(
                $sub(
                    $add(
                        $sub(c(64.0 / 3.0), $mul(c(48.0), u)),
                        $mul(c(192.0 / 5.0), u2),
                    ),
                    $mul($mul(c(32.0 / 3.0), u2), u),
                ),
                $mul($mul($mul(c(1.0 / 15.0), inv_u), inv_u), inv_u),
            ),
        );
        let outer_poly = $add(
            c(-16.0),
            $mul(u, $sub(c(48.0 / 5.0), $mul(c(32.0 / 15.0), u))),
        );
        let outer_p = $mul(
            k.minus_h_inv,
            $add(
                $add(c(-16.0 / 5.0), $mul(c(1.0 / 15.0), inv_u)),
                $mul(u2, $add(c(32.0 / 3.0), $mul(u, outer_poly))),
            ),
        );
        let inner = $lt(u, c(0.5));
        let beyond = $ge(r, k.h);
        // At the sums' scale: 8 f and 2 p (exact).
        let f = $mul(
            $blend(beyond, $blend(inner, outer_f, inner_f), newton_f),
            c(8.0),
        );
        let p = $mul(
            $blend(beyond, $blend(inner, outer_p, inner_p), inv_r),
            c(2.0),
        );
        // No force at zero separation (a particle and itself), and the central potential.
        let apart = $gt(r2, c(0.0));
        let mf = $blend(apart, c(0.0), $mul(m, f));
        let mp = $mul(m, $blend(apart, k.p0, p));
        for q in 0..3 {
            s[q] = $add(s[q], $mul(d[q], mf));
        }
        s[3] = $add(s[3], mp);
    }};
}

/// `softened_lanes!` in AVX-512 (16 lanes).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
fn softened_avx512(
    k: &SplineLanes<std::arch::x86_64::__m512>,
    rows: [std::arch::x86_64::__m512; 4],
    t: [f32; 3],
    s: &mut [std::arch::x86_64::__m512; 4],
) {
    use std::arch::x86_64::*;
    softened_lanes!(
        k,
        rows,
        t,
        s,
        _mm512_set1_ps,
        _mm512_add_ps,
        _mm512_sub_ps,
        _mm512_mul_ps,
        _mm512_div_ps,
        _mm512_sqrt_ps,
        |a, b| _mm512_cmp_ps_mask::<_CMP_LT_OQ>(a, b),
        |a, b| _mm512_cmp_ps_mask::<_CMP_GE_OQ>(a, b),
        |a, b| _mm512_cmp_ps_mask::<_CMP_GT_OQ>(a, b),
        |mask, a, b| _mm512_mask_blend_ps(mask, a, b)
    )
}

/// `softened_lanes!` in AVX2 (8 lanes, half a chunk).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
fn softened_avx2(
    k: &SplineLanes<std::arch::x86_64::__m256>,
    rows: [std::arch::x86_64::__m256; 4],
    t: [f32; 3],
    s: &mut [std::arch::x86_64::__m256; 4],
) {
    use std::arch::x86_64::*;
    softened_lanes!(
        k,
        rows,
        t,
        s,
        _mm256_set1_ps,
        _mm256_add_ps,
        _mm256_sub_ps,
        _mm256_mul_ps,
        _mm256_div_ps,
        _mm256_sqrt_ps,
        |a, b| _mm256_cmp_ps::<_CMP_LT_OQ>(a, b),
        |a, b| _mm256_cmp_ps::<_CMP_GE_OQ>(a, b),
        |a, b| _mm256_cmp_ps::<_CMP_GT_OQ>(a, b),
        |mask, a, b| _mm256_blendv_ps(a, b, mask)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The largest relative error and the mean one (the bias) of `estimate` against the
    /// exact `1/sqrt`, over many values in each of 120 binades (1e-18 to 1e18), 16 at a time.
    fn errors(estimate: impl Fn(&[f32; 16]) -> [f32; 16]) -> (f64, f64) {
        let (mut worst, mut sum, mut count) = (0.0f64, 0.0f64, 0);
        for block in 0..40_000 / 16 {
            let x: [f32; 16] = std::array::from_fn(|l| {
                (2.0f64.powf(-60.0 + 120.0 * (16 * block + l) as f64 / 40_000.0)) as f32
            });
            for (x, y) in x.iter().zip(estimate(&x)) {
                let exact = 1.0 / f64::from(*x).sqrt();
                let rel = (f64::from(y) - exact) / exact;
                worst = worst.max(rel.abs());
                sum += rel;
                count += 1;
            }
        }
        (worst, sum / count as f64)
    }

    #[test]
    fn rsqrt_is_within_f32_rounding_and_unbiased() {
        let (worst, bias) = errors(|x| x.map(rsqrt));
        assert!(worst < 2e-7, "largest relative error {worst:.2e}");
        assert!(bias.abs() < 1e-8, "bias {bias:.2e}");
        assert!(rsqrt(0.0).is_finite());
    }

    /// The vector builds' estimates: within 3e-7 and nearly unbiased (a Newton step from
    /// below undershoots by 1.5 e², e the estimate's error), so builds agree at round-off.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn vector_rsqrt_estimates_are_within_f32_rounding() {
        use std::arch::x86_64::*;
        let mut checked = Vec::new();
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU supports AVX-512F; 16 contiguous f32 each way.
            let (worst, bias) = errors(|x| unsafe {
                let mut y = [0.0f32; 16];
                let twice = twice_rsqrt_avx512(_mm512_loadu_ps(x.as_ptr()));
                _mm512_storeu_ps(y.as_mut_ptr(), _mm512_mul_ps(twice, _mm512_set1_ps(0.5)));
                y
            });
            checked.push(("avx512", worst, bias, 1.5e-7, 2e-8));
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU supports AVX2 and FMA; two halves of 8 f32 each way.
            let (worst, bias) = errors(|x| unsafe {
                let mut y = [0.0f32; 16];
                for k in 0..2 {
                    let v = twice_rsqrt_avx2(_mm256_loadu_ps(x.as_ptr().add(8 * k)));
                    let v = _mm256_mul_ps(v, _mm256_set1_ps(0.5));
                    _mm256_storeu_ps(y.as_mut_ptr().add(8 * k), v);
                }
                y
            });
            checked.push(("avx2", worst, bias, 3e-7, 5e-8));
        }
        for (isa, worst, bias, worst_bound, bias_bound) in checked {
            eprintln!("{isa}: largest relative error {worst:.2e}, bias {bias:.2e}");
            assert!(
                worst < worst_bound,
                "{isa}: largest relative error {worst:.2e}"
            );
            assert!(bias.abs() < bias_bound, "{isa}: bias {bias:.2e}");
        }
    }

    /// The vector builds' softened chunks (`softened_lanes!`) give the pair-by-pair code's
    /// bits lane for lane, at the sums' scale: pairs inside half the support, between half
    /// and all of it, beyond it, and one at zero separation; with the spline and without
    /// softening (h = 0, the Newtonian near field's chunk with a particle and itself).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn vector_softened_chunks_give_the_pair_by_pair_bits() {
        use std::arch::x86_64::*;
        let t = [0.01f32, -0.02, 0.03];
        let mut pos: Vec<[f64; 3]> = (0..32)
            .map(|i| {
                let (a, r) = (0.7 * i as f64, 0.004 * i as f64);
                [
                    f64::from(t[0]) + r * a.cos(),
                    f64::from(t[1]) + r * a.sin(),
                    f64::from(t[2]) + 0.5 * r,
                ]
            })
            .collect();
        pos[5] = t.map(f64::from);
        let mass: Vec<f64> = (0..32).map(|i| 1e-3 * (1.0 + (i % 5) as f64)).collect();
        let mut src = Staged::<f32, L>::default();
        src.push(&pos, &mass, None, [0.0; 3]);
        let start: [[f32; L]; 4] = std::array::from_fn(|q| {
            std::array::from_fn(|l| 1e-3 * (q as f32 + 1.0) * (l as f32 - 7.5))
        });
        let scaled = |sums: [[f32; L]; 4]| -> [[f32; L]; 4] {
            std::array::from_fn(|q| sums[q].map(|v| v / UNSCALE[q]))
        };
        let mut checked = 0;
        for (h, p0) in [(0.05f32, 2.8 / 0.05), (0.0, 0.0)] {
            let spline = SplineChunks {
                h,
                p0,
                newtonian_from: 0.0,
            };
            for c in 0..src.x.len() {
                let mut expected = start;
                spline.softened(&src, c, t, &mut expected);
                let expected = scaled(expected);
                let rows = [&src.x[c], &src.y[c], &src.z[c], &src.m[c]];
                if std::arch::is_x86_feature_detected!("avx512f") {
                    // SAFETY: the CPU supports AVX-512F; rows of 16 contiguous f32.
                    let got = unsafe {
                        let k = SplineLanes::new(spline, |v| _mm512_set1_ps(v));
                        let mut s = scaled(start).map(|r| _mm512_loadu_ps(r.as_ptr()));
                        softened_avx512(&k, rows.map(|r| _mm512_loadu_ps(r.as_ptr())), t, &mut s);
                        s.map(|v| {
                            let mut r = [0.0f32; L];
                            _mm512_storeu_ps(r.as_mut_ptr(), v);
                            r
                        })
                    };
                    assert_eq!(
                        got.map(|r| r.map(f32::to_bits)),
                        expected.map(|r| r.map(f32::to_bits))
                    );
                    checked += 1;
                }
                if std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                {
                    let mut got = scaled(start);
                    for half in 0..2 {
                        // SAFETY: the CPU supports AVX2 and FMA; halves of 8 contiguous f32.
                        unsafe {
                            let at = |r: &[f32; L]| _mm256_loadu_ps(r.as_ptr().add(8 * half));
                            let k = SplineLanes::new(spline, |v| _mm256_set1_ps(v));
                            let mut s = got.each_ref().map(at);
                            softened_avx2(&k, rows.map(at), t, &mut s);
                            for (row, v) in got.iter_mut().zip(s) {
                                _mm256_storeu_ps(row.as_mut_ptr().add(8 * half), v);
                            }
                        }
                    }
                    assert_eq!(
                        got.map(|r| r.map(f32::to_bits)),
                        expected.map(|r| r.map(f32::to_bits))
                    );
                    checked += 1;
                }
            }
        }
        eprintln!("{checked} chunks checked");
    }
}
