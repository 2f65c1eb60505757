//! The f32 pair kernel's Newtonian chunks in each instruction set's vector code: the windows
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

/// Per-lane f64 sums of each target: x, y, z, potential.
type Totals = [[[f64; L]; 4]; TB];

/// Moves one target's f32 sums of a window into its f64 sums, lane by lane.
#[inline(always)]
fn flush(total: &mut [[f64; L]; 4], sums: &[[f32; L]; 4]) {
    for q in 0..4 {
        for l in 0..L {
            total[q][l] += f64::from(sums[q][l]);
        }
    }
}

/// Each target's sums over its lanes, in lane order.
#[inline(always)]
fn finish(total: &Totals) -> BlockSums<TB> {
    let mut out = [[0.0; 4]; TB];
    for t in 0..TB {
        for q in 0..4 {
            for l in 0..L {
                out[t][q] += total[t][q][l];
            }
        }
    }
    out
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
    let mut total: Totals = [[[0.0; L]; 4]; TB];
    let chunks = src.x.len();
    for (t, target) in targets.iter().enumerate() {
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
                    let y = rsqrt(r2);
                    // m/r, and none at zero separation (the particle itself).
                    let mi = if r2 > 0.0 { ms[l] * y } else { 0.0 };
                    let mf = mi * y * y;
                    acc[0][l] = d[0][l].mul_add(mf, acc[0][l]);
                    acc[1][l] = d[1][l].mul_add(mf, acc[1][l]);
                    acc[2][l] = d[2][l].mul_add(mf, acc[2][l]);
                    acc[3][l] += mi;
                }
            }
            flush(&mut total[t], &acc);
        }
    }
    finish(&total)
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
    let zero = _mm512_setzero_ps();
    // SAFETY (every load and store): each row is 16 contiguous f32 (8 f64 a half row).
    let load = |v: &[f32; L]| unsafe { _mm512_loadu_ps(v.as_ptr()) };
    let mut total: Totals = [[[0.0; L]; 4]; TB];
    let chunks = src.x.len();
    for (t, target) in targets.iter().enumerate() {
        let [tx, ty, tz] = target.map(|v| _mm512_set1_ps(v));
        let mut wide = [[_mm512_setzero_pd(); 2]; 4];
        for first in (0..chunks).step_by(FLUSH_CHUNKS) {
            let mut s = [zero; 4];
            let last = (first + FLUSH_CHUNKS).min(chunks);
            // Zipped slices, not indices: no bounds check in the loop.
            let rows = src.x[first..last].iter().zip(&src.y[first..last]);
            let rows = rows.zip(src.z[first..last].iter().zip(&src.m[first..last]));
            for (c, ((x, y), (z, m))) in (first..last).zip(rows) {
                let dx = _mm512_sub_ps(load(x), tx);
                let dy = _mm512_sub_ps(load(y), ty);
                let dz = _mm512_sub_ps(load(z), tz);
                let r2 = _mm512_fmadd_ps(dz, dz, _mm512_fmadd_ps(dy, dy, _mm512_mul_ps(dx, dx)));
                if _mm512_cmp_ps_mask::<_CMP_GE_OQ>(r2, from) != 0xffff {
                    let mut rows = [[0.0f32; L]; 4];
                    for (row, v) in rows.iter_mut().zip(s) {
                        unsafe { _mm512_storeu_ps(row.as_mut_ptr(), v) };
                    }
                    unsafe { softened_avx512(spline, src, c, *target, &mut rows) };
                    s = rows.each_ref().map(load);
                    continue;
                }
                // m/r, and none at zero separation (y = 0 there).
                let y = rsqrt_avx512(r2);
                let mi = _mm512_mul_ps(load(m), y);
                let mf = _mm512_mul_ps(_mm512_mul_ps(mi, y), y);
                s[0] = _mm512_fmadd_ps(dx, mf, s[0]);
                s[1] = _mm512_fmadd_ps(dy, mf, s[1]);
                s[2] = _mm512_fmadd_ps(dz, mf, s[2]);
                s[3] = _mm512_add_ps(s[3], mi);
            }
            // f32 sums to f64, lane by lane: the low and high 8 lanes of each row.
            for (w, v) in wide.iter_mut().zip(s) {
                let low = _mm512_castps512_ps256(v);
                let high = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
                w[0] = _mm512_add_pd(w[0], _mm512_cvtps_pd(low));
                w[1] = _mm512_add_pd(w[1], _mm512_cvtps_pd(high));
            }
        }
        for (row, w) in total[t].iter_mut().zip(wide) {
            unsafe {
                _mm512_storeu_pd(row.as_mut_ptr(), w[0]);
                _mm512_storeu_pd(row.as_mut_ptr().add(8), w[1]);
            }
        }
    }
    finish(&total)
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
    let zero = _mm256_setzero_ps();
    // SAFETY (every load and store): each half row is 8 contiguous f32.
    let load = |v: &[f32; L], k: usize| unsafe { _mm256_loadu_ps(v.as_ptr().add(8 * k)) };
    let mut total: Totals = [[[0.0; L]; 4]; TB];
    let chunks = src.x.len();
    for (t, target) in targets.iter().enumerate() {
        let [tx, ty, tz] = target.map(|v| _mm256_set1_ps(v));
        for first in (0..chunks).step_by(FLUSH_CHUNKS) {
            let mut s = [[zero; 4]; 2];
            for c in first..(first + FLUSH_CHUNKS).min(chunks) {
                let mut d = [[zero; 4]; 2];
                let mut newtonian = true;
                for (k, dk) in d.iter_mut().enumerate() {
                    let dx = _mm256_sub_ps(load(&src.x[c], k), tx);
                    let dy = _mm256_sub_ps(load(&src.y[c], k), ty);
                    let dz = _mm256_sub_ps(load(&src.z[c], k), tz);
                    let r2 =
                        _mm256_fmadd_ps(dz, dz, _mm256_fmadd_ps(dy, dy, _mm256_mul_ps(dx, dx)));
                    let ge = _mm256_cmp_ps::<_CMP_GE_OQ>(r2, from);
                    newtonian &= _mm256_movemask_ps(ge) == 0xff;
                    *dk = [dx, dy, dz, r2];
                }
                if !newtonian {
                    let mut rows = [[0.0f32; L]; 4];
                    for (k, halves) in s.iter().enumerate() {
                        for (row, v) in rows.iter_mut().zip(halves) {
                            unsafe { _mm256_storeu_ps(row.as_mut_ptr().add(8 * k), *v) };
                        }
                    }
                    unsafe { softened_avx2(spline, src, c, *target, &mut rows) };
                    s = [0, 1].map(|k| rows.each_ref().map(|r| load(r, k)));
                    continue;
                }
                for (k, [dx, dy, dz, r2]) in d.into_iter().enumerate() {
                    let y = rsqrt_avx2(r2);
                    let mi = _mm256_mul_ps(load(&src.m[c], k), y);
                    let mf = _mm256_mul_ps(_mm256_mul_ps(mi, y), y);
                    let s = &mut s[k];
                    s[0] = _mm256_fmadd_ps(dx, mf, s[0]);
                    s[1] = _mm256_fmadd_ps(dy, mf, s[1]);
                    s[2] = _mm256_fmadd_ps(dz, mf, s[2]);
                    s[3] = _mm256_add_ps(s[3], mi);
                }
            }
            let mut rows = [[0.0f32; L]; 4];
            for (k, halves) in s.iter().enumerate() {
                for (row, v) in rows.iter_mut().zip(halves) {
                    unsafe { _mm256_storeu_ps(row.as_mut_ptr().add(8 * k), *v) };
                }
            }
            flush(&mut total[t], &rows);
        }
    }
    finish(&total)
}

/// `1/sqrt(x)` on 16 lanes for `x > 0`, 0 for `x = 0` (a particle and itself, which then
/// adds nothing): `vrsqrt14ps` and one Newton step (2^-14 → f32's rounding). (Safe to call
/// from code compiled for AVX-512F.)
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
fn rsqrt_avx512(x: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    let h = _mm512_mul_ps(_mm512_set1_ps(0.5), x);
    let e = _mm512_rsqrt14_ps(x);
    let step = _mm512_fnmadd_ps(_mm512_mul_ps(h, e), e, _mm512_set1_ps(1.5));
    // At 0 the estimate is +∞ and the step NaN: the mask keeps those lanes at 0.
    let positive = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, _mm512_setzero_ps());
    _mm512_maskz_mul_ps(positive, e, step)
}

/// `1/sqrt(x)` on 8 lanes for `x > 0`, 0 for `x = 0`: `rsqrtps` and one Newton step
/// (1.5·2^-12 → ~2e-7). (Safe to call from code compiled for AVX2 and FMA.)
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
fn rsqrt_avx2(x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let h = _mm256_mul_ps(_mm256_set1_ps(0.5), x);
    let e = _mm256_rsqrt_ps(x);
    let step = _mm256_fnmadd_ps(_mm256_mul_ps(h, e), e, _mm256_set1_ps(1.5));
    let positive = _mm256_cmp_ps::<_CMP_GT_OQ>(x, _mm256_setzero_ps());
    _mm256_and_ps(positive, _mm256_mul_ps(e, step))
}

/// `SplineChunks::softened` in AVX-512, out of line: inlined into the window, the compiler
/// left it unvectorised.
///
/// # Safety
/// The CPU must support AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline(never)]
unsafe fn softened_avx512(
    spline: SplineChunks,
    src: &Staged<f32, L>,
    c: usize,
    t: [f32; 3],
    acc: &mut [[f32; L]; 4],
) {
    spline.softened(src, c, t, acc);
}

/// `SplineChunks::softened` in AVX2, out of line (see `softened_avx512`).
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline(never)]
unsafe fn softened_avx2(
    spline: SplineChunks,
    src: &Staged<f32, L>,
    c: usize,
    t: [f32; 3],
    acc: &mut [[f32; L]; 4],
) {
    spline.softened(src, c, t, acc);
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
                _mm512_storeu_ps(y.as_mut_ptr(), rsqrt_avx512(_mm512_loadu_ps(x.as_ptr())));
                y
            });
            checked.push(("avx512", worst, bias, 1.5e-7, 2e-8));
            // SAFETY: as above.
            let at_zero = unsafe { _mm512_reduce_add_ps(rsqrt_avx512(_mm512_setzero_ps())) };
            assert_eq!(at_zero, 0.0);
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU supports AVX2 and FMA; two halves of 8 f32 each way.
            let (worst, bias) = errors(|x| unsafe {
                let mut y = [0.0f32; 16];
                for k in 0..2 {
                    let v = rsqrt_avx2(_mm256_loadu_ps(x.as_ptr().add(8 * k)));
                    _mm256_storeu_ps(y.as_mut_ptr().add(8 * k), v);
                }
                y
            });
            checked.push(("avx2", worst, bias, 3e-7, 5e-8));
            let mut at_zero = [1.0f32; 8];
            // SAFETY: as above.
            unsafe { _mm256_storeu_ps(at_zero.as_mut_ptr(), rsqrt_avx2(_mm256_setzero_ps())) };
            assert_eq!(at_zero, [0.0; 8]);
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
}
