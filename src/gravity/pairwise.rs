//! The pair-interaction kernel shared by direct summation (f64) and the FMM near field
//! (f32 or f64): sources in structure-of-arrays lane chunks; a block of targets sums
//! `FLUSH_CHUNKS` chunks at a time in the working precision and adds those per-lane sums into
//! f64 accumulators (design §5.7 asks for f32 sums per leaf pair and f64 across pairs; a
//! fixed block of sources bounds the f32 sums the same way without padding every leaf).
//!
//! The loops are written over fixed-width lanes with one accumulator per lane, so the
//! compiler vectorises them and the order of every addition is fixed in the source: the
//! AVX-512, AVX2 and portable builds give identical bits, for any thread count. The f32
//! Newtonian chunks of one softening length for all pairs (the FMM near field's common
//! case) run in hand-written vector code instead (`pairwise_fast`), with the same order but
//! each instruction set's own `1/sqrt` estimate: there builds agree at f32's rounding, and
//! each gives the same bits for any thread count.

use super::softening::{
    Real, SPLINE_SUPPORT_PER_EPSILON, Softening, SofteningKernel, plummer_factors, spline_factors,
};

/// Chunks summed in the working precision before the sums move to f64: 256 sources, two
/// leaves at the default leaf size. Conversions cost the fast path a fifth of its time at 4
/// chunks and ~12 % at 8; at 16 the accuracy test set's errors are unchanged down to a
/// target of 1e-6 (where the FMM's truncation, not this rounding, sets them).
pub const FLUSH_CHUNKS: usize = 16;

/// Sources converted to the working precision relative to an origin, in lane chunks; the
/// last chunk is padded with massless particles.
#[derive(Debug, Clone, Default)]
pub struct Staged<T, const L: usize> {
    pub(super) x: Vec<[T; L]>,
    pub(super) y: Vec<[T; L]>,
    pub(super) z: Vec<[T; L]>,
    pub(super) m: Vec<[T; L]>,
    /// Per-source softening lengths (used by `PairParams::per_particle` calls only).
    e: Vec<[T; L]>,
    /// The largest softening length of each chunk.
    e_max: Vec<T>,
    /// Sources in the last chunk.
    tail: usize,
}

impl<T: Real, const L: usize> Staged<T, L> {
    /// Removes all sources, keeping the allocations.
    pub fn clear(&mut self) {
        self.x.clear();
        self.y.clear();
        self.z.clear();
        self.m.clear();
        self.e.clear();
        self.e_max.clear();
        self.tail = 0;
    }

    /// Appends the sources at `pos` with `mass` (and softening lengths `eps`, when they
    /// differ between particles), relative to `origin`: the free lanes of the last chunk
    /// first, then whole chunks in one loop each (staging took about as long as the pairs of
    /// a leaf of ~35 targets when it went particle by particle).
    pub fn push(&mut self, pos: &[[f64; 3]], mass: &[f64], eps: Option<&[f64]>, origin: [f64; 3]) {
        let mut i = 0;
        while i < pos.len() && self.tail > 0 && self.tail < L {
            let (c, l) = (self.x.len() - 1, self.tail);
            self.put(c, l, pos[i], mass[i], eps.map(|e| e[i]), origin);
            self.tail += 1;
            i += 1;
        }
        for start in (i..pos.len()).step_by(L) {
            let len = (pos.len() - start).min(L);
            let (p, m) = (&pos[start..start + len], &mass[start..start + len]);
            let mut chunk = [[T::ZERO; L]; 4];
            for l in 0..len {
                chunk[0][l] = T::lit(p[l][0] - origin[0]);
                chunk[1][l] = T::lit(p[l][1] - origin[1]);
                chunk[2][l] = T::lit(p[l][2] - origin[2]);
                chunk[3][l] = T::lit(m[l]);
            }
            let [x, y, z, m] = chunk;
            self.x.push(x);
            self.y.push(y);
            self.z.push(z);
            self.m.push(m);
            let mut e = [T::ZERO; L];
            let mut e_max = T::ZERO;
            if let Some(eps) = eps {
                for l in 0..len {
                    e[l] = T::lit(eps[start + l]);
                    if e[l] > e_max {
                        e_max = e[l];
                    }
                }
            }
            self.e.push(e);
            self.e_max.push(e_max);
            self.tail = len;
        }
    }

    /// Writes one source into lane `l` of chunk `c`.
    #[inline]
    fn put(&mut self, c: usize, l: usize, p: [f64; 3], m: f64, e: Option<f64>, origin: [f64; 3]) {
        self.x[c][l] = T::lit(p[0] - origin[0]);
        self.y[c][l] = T::lit(p[1] - origin[1]);
        self.z[c][l] = T::lit(p[2] - origin[2]);
        self.m[c][l] = T::lit(m);
        if let Some(e) = e {
            let e = T::lit(e);
            self.e[c][l] = e;
            if e > self.e_max[c] {
                self.e_max[c] = e;
            }
        }
    }
}

/// The softening of a kernel call in the working precision.
#[derive(Debug, Clone, Copy)]
pub struct PairParams<T> {
    kernel: SofteningKernel,
    eps2: T,
    spline_h: T,
    /// The kernel's central potential factor `p(0) = 1/ε` (0 for Newtonian gravity).
    central: T,
    /// Softening lengths per particle (the staged sources' and the targets'); a pair is
    /// softened with the larger of its two (GADGET's rule, symmetric, so momentum is kept).
    per_particle: bool,
}

impl<T: Real> PairParams<T> {
    /// Parameters for `softening` (one length for every pair).
    pub fn new(softening: Softening) -> Self {
        PairParams {
            kernel: softening.kernel,
            eps2: T::lit(softening.epsilon * softening.epsilon),
            spline_h: T::lit(SPLINE_SUPPORT_PER_EPSILON * softening.epsilon),
            central: T::lit(self_potential(1.0, softening.epsilon)),
            per_particle: false,
        }
    }

    /// Parameters for `softening`'s kernel with per-particle lengths instead of its one.
    pub fn per_particle(softening: Softening) -> Self {
        PairParams {
            per_particle: true,
            ..Self::new(softening)
        }
    }

    /// True when the lengths are per particle.
    pub fn is_per_particle(&self) -> bool {
        self.per_particle
    }
}

/// The central potential factor `p(0)` of a pair softened with Plummer-equivalent length
/// `e`: `1/e` for both kernels (the spline's `2.8/h`), none for Newtonian pairs.
#[inline(always)]
fn central_of<T: Real>(e: T) -> T {
    if e > T::ZERO { T::ONE / e } else { T::ZERO }
}

/// The term a particle of mass `mass` and softening `epsilon` adds to its own potential sum
/// through the zero-separation pair with itself (`m p(0)`, G-free): the solvers subtract it
/// once per particle whose own leaf (or set) was among the sources, so that only the other
/// particles (an exact duplicate included) count.
pub fn self_potential(mass: f64, epsilon: f64) -> f64 {
    if epsilon > 0.0 { mass / epsilon } else { 0.0 }
}

/// For each of `TB` targets: Σ m f(r) dx, dy, dz and Σ m p(r) over all staged sources
/// (G-free; a zero separation adds no force and the central potential `m p(0)`).
pub type BlockSums<const TB: usize> = [[f64; 4]; TB];

/// The portable kernel body; inlined into each target-feature entry point. `target_eps` are
/// the targets' softening lengths (read only with per-particle parameters).
#[inline(always)]
pub fn block_sums<T: Real, const L: usize, const TB: usize>(
    src: &Staged<T, L>,
    targets: &[[T; 3]; TB],
    target_eps: &[T; TB],
    params: PairParams<T>,
) -> BlockSums<TB> {
    let c = T::lit;
    // Just above h², so a chunk judged Newtonian is one the spline treats as such.
    let margin = c(1.0 + 1e-5);
    let newton = |r2: T| {
        let inv = T::ONE / r2.sqrt();
        (inv * inv * inv, inv)
    };
    match (params.kernel, params.per_particle) {
        (SofteningKernel::Plummer, false) => {
            let eps2 = params.eps2;
            let p0 = params.central;
            sums_with::<T, L, TB, false>(
                src,
                targets,
                target_eps,
                |_| None,
                |r2, _| plummer_factors(r2, eps2),
                |_| p0,
            )
        }
        (SofteningKernel::Spline, false) if params.spline_h > T::ZERO => {
            let h = params.spline_h;
            let from = h * h * margin;
            let p0 = params.central;
            sums_with::<T, L, TB, false>(
                src,
                targets,
                target_eps,
                |_| Some(from),
                |r2, _| spline_factors(r2, h),
                |_| p0,
            )
        }
        (SofteningKernel::Spline, false) => sums_with::<T, L, TB, false>(
            src,
            targets,
            target_eps,
            |_| None,
            |r2, _| newton(r2),
            |_| T::ZERO,
        ),
        (SofteningKernel::Plummer, true) => sums_with::<T, L, TB, true>(
            src,
            targets,
            target_eps,
            |_| None,
            |r2, e| plummer_factors(r2, e * e),
            central_of,
        ),
        (SofteningKernel::Spline, true) => {
            let support = c(SPLINE_SUPPORT_PER_EPSILON);
            sums_with::<T, L, TB, true>(
                src,
                targets,
                target_eps,
                |e_max| Some(support * e_max * support * e_max * margin),
                |r2, e| {
                    let h = support * e;
                    if h > T::ZERO {
                        spline_factors(r2, h)
                    } else {
                        newton(r2)
                    }
                },
                central_of,
            )
        }
    }
}

/// The kernel loop. `newtonian_from(e)` gives, for the largest pair softening `e` of a chunk
/// and target, the squared separation beyond which every pair is exactly Newtonian: a chunk
/// whose every pair is that far apart skips the softened branch (the fast path computes the
/// same expression, so the bits do not change). `factors(r2, e)` are the kernel's factors
/// for a pair softened with `e` (with `PER_PARTICLE` false, `e` is zero and unused).
#[inline(always)]
fn sums_with<T: Real, const L: usize, const TB: usize, const PER_PARTICLE: bool>(
    src: &Staged<T, L>,
    targets: &[[T; 3]; TB],
    target_eps: &[T; TB],
    newtonian_from: impl Fn(T) -> Option<T>,
    factors: impl Fn(T, T) -> (T, T),
    central: impl Fn(T) -> T,
) -> BlockSums<TB> {
    let max = |a: T, b: T| if a > b { a } else { b };
    let mut total = [[[0.0f64; L]; 4]; TB];
    let chunks = src.x.len();
    for first in (0..chunks).step_by(FLUSH_CHUNKS) {
        let last = (first + FLUSH_CHUNKS).min(chunks);
        let mut ax = [[T::ZERO; L]; TB];
        let mut ay = [[T::ZERO; L]; TB];
        let mut az = [[T::ZERO; L]; TB];
        let mut ph = [[T::ZERO; L]; TB];
        for c in first..last {
            let (xs, ys, zs, ms) = (&src.x[c], &src.y[c], &src.z[c], &src.m[c]);
            for t in 0..TB {
                let [tx, ty, tz] = targets[t];
                let mut d = [[T::ZERO; L]; 4];
                for l in 0..L {
                    d[0][l] = xs[l] - tx;
                    d[1][l] = ys[l] - ty;
                    d[2][l] = zs[l] - tz;
                    d[3][l] = d[0][l] * d[0][l] + d[1][l] * d[1][l] + d[2][l] * d[2][l];
                }
                let e_chunk = if PER_PARTICLE {
                    max(target_eps[t], src.e_max[c])
                } else {
                    T::ZERO
                };
                let newtonian = newtonian_from(e_chunk).is_some_and(|r2_min| {
                    let mut all = true;
                    for l in 0..L {
                        all &= d[3][l] >= r2_min;
                    }
                    all
                });
                // At zero separation (the particle itself, or one at exactly the same
                // place) there is no force and the kernel's central potential `p0`; the
                // caller takes each target's own term back out (`self_potential`).
                let pair = |l: usize, (f, p): (T, T), p0: T| {
                    let r2 = d[3][l];
                    let mf = if r2 > T::ZERO { ms[l] * f } else { T::ZERO };
                    let mp = ms[l] * if r2 > T::ZERO { p } else { p0 };
                    (mf, mp)
                };
                if newtonian {
                    for l in 0..L {
                        let inv = T::ONE / d[3][l].sqrt();
                        let (mf, mp) = pair(l, (inv * inv * inv, inv), T::ZERO);
                        ax[t][l] += d[0][l] * mf;
                        ay[t][l] += d[1][l] * mf;
                        az[t][l] += d[2][l] * mf;
                        ph[t][l] += mp;
                    }
                } else {
                    for l in 0..L {
                        let e = if PER_PARTICLE {
                            max(target_eps[t], src.e[c][l])
                        } else {
                            T::ZERO
                        };
                        let (mf, mp) = pair(l, factors(d[3][l], e), central(e));
                        ax[t][l] += d[0][l] * mf;
                        ay[t][l] += d[1][l] * mf;
                        az[t][l] += d[2][l] * mf;
                        ph[t][l] += mp;
                    }
                }
            }
        }
        for t in 0..TB {
            for l in 0..L {
                total[t][0][l] += ax[t][l].to_f64();
                total[t][1][l] += ay[t][l].to_f64();
                total[t][2][l] += az[t][l].to_f64();
                total[t][3][l] += ph[t][l].to_f64();
            }
        }
    }
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

/// Adds chunk `c` to `acc` for the target at `t`, pair by pair in `L` lanes: `factors(r2)`
/// for each pair (`p0`, the central potential, at zero separation).
#[inline(always)]
fn softened_chunk<T: Real, const L: usize>(
    src: &Staged<T, L>,
    c: usize,
    t: [T; 3],
    factors: &impl Fn(T) -> (T, T),
    p0: T,
    acc: &mut [[T; L]; 4],
) {
    let (xs, ys, zs, ms) = (&src.x[c], &src.y[c], &src.z[c], &src.m[c]);
    let mut d = [[T::ZERO; L]; 4];
    for l in 0..L {
        d[0][l] = xs[l] - t[0];
        d[1][l] = ys[l] - t[1];
        d[2][l] = zs[l] - t[2];
        d[3][l] = d[0][l] * d[0][l] + d[1][l] * d[1][l] + d[2][l] * d[2][l];
    }
    for l in 0..L {
        let r2 = d[3][l];
        let (f, p) = factors(r2);
        let mf = if r2 > T::ZERO { ms[l] * f } else { T::ZERO };
        let mp = ms[l] * if r2 > T::ZERO { p } else { p0 };
        acc[0][l] += d[0][l] * mf;
        acc[1][l] += d[1][l] * mf;
        acc[2][l] += d[2][l] * mf;
        acc[3][l] += mp;
    }
}

/// A build's vector code for the f32 pairs of one softening length for all
/// (`pairwise_fast`).
pub trait FastWindow {
    /// The sums of each target over every staged source, `FLUSH_CHUNKS` chunks at a time in
    /// f32 then in f64 (lanes l and l + 8 sharing one f64 sum, `pairwise_fast`), chunk by
    /// chunk in order: Newtonian chunks (see `SplineChunks::newtonian_from`) with the build's
    /// `1/sqrt`, the others with `SplineChunks::softened`'s operations.
    ///
    /// # Safety
    /// The CPU must support the build's instruction set.
    unsafe fn sums(
        src: &Staged<f32, LANES_F32>,
        targets: &[[f32; 3]; TARGET_BLOCK],
        spline: SplineChunks,
    ) -> BlockSums<TARGET_BLOCK>;
}

/// The spline softening of `block_sums_fast`'s pairs.
#[derive(Debug, Clone, Copy)]
pub struct SplineChunks {
    /// The support h (0: Newtonian pairs).
    pub h: f32,
    /// The central potential factor `p(0)`.
    pub p0: f32,
    /// A chunk whose every pair with a target is this far apart or more (squared) is
    /// Newtonian: just above h², as in `block_sums`; without softening the smallest normal
    /// f32, so that the vector code never sees r² = 0 (a particle and itself, which adds
    /// nothing: the chunk goes pair by pair) and needs no mask for it.
    pub newtonian_from: f32,
}

impl SplineChunks {
    /// Adds chunk `c` of `src` to the sums `acc` of the target at `t` pair by pair (a chunk
    /// with a pair inside the support).
    #[inline(always)]
    pub fn softened(
        &self,
        src: &Staged<f32, LANES_F32>,
        c: usize,
        t: [f32; 3],
        acc: &mut [[f32; LANES_F32]; 4],
    ) {
        let h = self.h;
        softened_chunk(src, c, t, &|r2| spline_factors(r2, h), self.p0, acc);
    }
}

/// `block_sums` for f32 with build `W`'s vector code where one softening length holds for
/// all pairs (the spline's or none); pair by pair as `block_sums` otherwise.
///
/// # Safety
/// The CPU must support `W`'s instruction set.
#[inline(always)]
pub unsafe fn block_sums_fast<W: FastWindow>(
    src: &Staged<f32, LANES_F32>,
    targets: &[[f32; 3]; TARGET_BLOCK],
    target_eps: &[f32; TARGET_BLOCK],
    params: PairParams<f32>,
) -> BlockSums<TARGET_BLOCK> {
    if params.kernel != SofteningKernel::Spline || params.per_particle {
        return block_sums(src, targets, target_eps, params);
    }
    let h = params.spline_h;
    let spline = SplineChunks {
        h,
        p0: params.central,
        newtonian_from: if h > 0.0 {
            h * h * (1.0 + 1e-5)
        } else {
            f32::MIN_POSITIVE
        },
    };
    // SAFETY: the caller's CPU supports `W`.
    unsafe { W::sums(src, targets, spline) }
}

/// Signature of a kernel entry point.
pub type KernelFn<T, const L: usize, const TB: usize> =
    unsafe fn(&Staged<T, L>, &[[T; 3]; TB], &[T; TB], PairParams<T>) -> BlockSums<TB>;

/// Defines the portable, AVX2 and AVX-512 entry points of one kernel instantiation and a
/// selector that picks the widest the CPU supports.
macro_rules! kernel_entries {
    ($select:ident, $all:ident, $t:ty, $l:literal, $tb:literal, [$portable:path, $avx2:path, $avx512:path]) => {
        /// Picks the widest build of this kernel the CPU runs, and names it.
        pub fn $select() -> (KernelFn<$t, $l, $tb>, &'static str) {
            $all()[0]
        }

        /// Every build of this kernel the CPU runs, widest first, with their names (for
        /// benchmarks, and the test that they give the same bits).
        pub fn $all() -> Vec<(KernelFn<$t, $l, $tb>, &'static str)> {
            /// # Safety
            /// None required; `unsafe` only to share the entry-point signature.
            #[allow(unused_unsafe)] // the f64 builds' body is safe
            unsafe fn portable(
                s: &Staged<$t, $l>,
                t: &[[$t; 3]; $tb],
                e: &[$t; $tb],
                p: PairParams<$t>,
            ) -> BlockSums<$tb> {
                unsafe { $portable(s, t, e, p) }
            }
            /// # Safety
            /// The CPU must support AVX2 and FMA.
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2,fma")]
            #[allow(unused_unsafe)] // the f64 builds' body is safe
            unsafe fn avx2(
                s: &Staged<$t, $l>,
                t: &[[$t; 3]; $tb],
                e: &[$t; $tb],
                p: PairParams<$t>,
            ) -> BlockSums<$tb> {
                unsafe { $avx2(s, t, e, p) }
            }
            /// # Safety
            /// The CPU must support AVX-512F.
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx512f,avx2,fma")]
            #[allow(unused_unsafe)] // the f64 builds' body is safe
            unsafe fn avx512(
                s: &Staged<$t, $l>,
                t: &[[$t; 3]; $tb],
                e: &[$t; $tb],
                p: PairParams<$t>,
            ) -> BlockSums<$tb> {
                unsafe { $avx512(s, t, e, p) }
            }
            let mut all: Vec<(KernelFn<$t, $l, $tb>, &'static str)> = Vec::new();
            #[cfg(target_arch = "x86_64")]
            {
                if std::arch::is_x86_feature_detected!("avx512f") {
                    all.push((avx512, "avx512"));
                }
                if std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                {
                    all.push((avx2, "avx2"));
                }
            }
            all.push((portable, "portable"));
            all
        }
    };
}

/// Lanes of the f64 kernel.
pub const LANES_F64: usize = 8;
/// Lanes of the f32 kernel.
pub const LANES_F32: usize = 16;
/// Targets per kernel call.
pub const TARGET_BLOCK: usize = 4;

// f64 (direct summation, the f64 near field) keeps one correctly rounded operation per step
// in every build; f32 takes each build's vector code (`pairwise_fast`).
kernel_entries!(
    select_f64,
    all_f64,
    f64,
    8,
    4,
    [block_sums, block_sums, block_sums]
);
kernel_entries!(
    select_f32,
    all_f32,
    f32,
    16,
    4,
    [
        block_sums_fast::<super::pairwise_fast::Portable>,
        block_sums_fast::<super::pairwise_fast::Avx2>,
        block_sums_fast::<super::pairwise_fast::Avx512>
    ]
);

/// Runs `kernel` for every target (coordinates relative to the staging origin), writing
/// G-scaled accelerations and potentials (added to what is there when `accumulate`).
#[allow(clippy::too_many_arguments)]
pub fn evaluate_targets<T: Real, const L: usize>(
    kernel: KernelFn<T, L, TARGET_BLOCK>,
    sources: &Staged<T, L>,
    targets: &[[f64; 3]],
    target_eps: Option<&[f64]>,
    origin: [f64; 3],
    params: PairParams<T>,
    g: f64,
    acc: &mut [[f64; 3]],
    pot: &mut [f64],
) {
    for (b, block) in targets.chunks(TARGET_BLOCK).enumerate() {
        // Pad a short last block by repeating its first target; the extra results are dropped.
        let mut padded = [[T::ZERO; 3]; TARGET_BLOCK];
        let mut eps = [T::ZERO; TARGET_BLOCK];
        for t in 0..TARGET_BLOCK {
            let k = t.min(block.len() - 1);
            let x = block[k];
            padded[t] = [
                T::lit(x[0] - origin[0]),
                T::lit(x[1] - origin[1]),
                T::lit(x[2] - origin[2]),
            ];
            if let Some(e) = target_eps {
                eps[t] = T::lit(e[b * TARGET_BLOCK + k]);
            }
        }
        // SAFETY: kernels come from a selector that checked the CPU's features.
        let sums = unsafe { kernel(sources, &padded, &eps, params) };
        for (t, s) in sums.iter().take(block.len()).enumerate() {
            let i = b * TARGET_BLOCK + t;
            acc[i][0] += g * s[0];
            acc[i][1] += g * s[1];
            acc[i][2] += g * s[2];
            pot[i] -= g * s[3];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_in_pieces_equals_staging_at_once() {
        let pos: Vec<[f64; 3]> = (0..50)
            .map(|i| [0.1 * i as f64, 1.0 - 0.01 * i as f64, 0.3])
            .collect();
        let mass: Vec<f64> = (0..50).map(|i| 1.0 + i as f64).collect();
        let eps: Vec<f64> = (0..50).map(|i| 0.01 * (i % 5) as f64).collect();
        let origin = [0.5, 0.25, 0.0];
        let mut once = Staged::<f32, 16>::default();
        once.push(&pos, &mass, Some(&eps), origin);
        let mut pieces = Staged::<f32, 16>::default();
        for (a, b) in [(0, 3), (3, 19), (19, 20), (20, 50)] {
            pieces.push(&pos[a..b], &mass[a..b], Some(&eps[a..b]), origin);
        }
        assert_eq!(format!("{once:?}"), format!("{pieces:?}"));
        assert_eq!(once.x.len(), 4);
        assert_eq!(once.tail, 2);
    }
}
