//! Direct summation: every particle against every other, in f64.
//!
//! This is the reference solver (design §5): the FMM's accuracy is measured against it, so it
//! must be exact to f64 rounding, deterministic, and fast enough to check 1e5-particle sets.
//! The inner loop runs over sources in fixed-width lanes with one accumulator per lane, so the
//! compiler vectorises it and the addition order — hence every bit of the result — is the same
//! for the scalar, AVX2 and AVX-512 builds of the loop and for any thread count.

use super::softening::{Softening, SofteningKernel, plummer_factors, spline_factors};
use super::{ForceReport, GravityError, GravitySolver, check_finite};
use crate::particles::Particles;
use rayon::prelude::*;
use std::time::Instant;

/// Source lanes processed together (one AVX-512 register of f64).
const LANES: usize = 8;
/// Targets evaluated together against each loaded source chunk.
const TARGET_BLOCK: usize = 4;
/// Targets per parallel task.
const TASK_TARGETS: usize = 64;

/// Sources in structure-of-arrays form, padded with massless particles to whole lanes.
#[derive(Debug, Clone, Default)]
pub struct SourceSet {
    x: Vec<[f64; LANES]>,
    y: Vec<[f64; LANES]>,
    z: Vec<[f64; LANES]>,
    m: Vec<[f64; LANES]>,
}

impl SourceSet {
    /// Builds the padded source arrays from positions and masses.
    pub fn new(pos: &[[f64; 3]], mass: &[f64]) -> Self {
        let chunks = pos.len().div_ceil(LANES);
        let mut set = SourceSet {
            x: vec![[0.0; LANES]; chunks],
            y: vec![[0.0; LANES]; chunks],
            z: vec![[0.0; LANES]; chunks],
            m: vec![[0.0; LANES]; chunks],
        };
        for (i, (p, &m)) in pos.iter().zip(mass).enumerate() {
            let (c, l) = (i / LANES, i % LANES);
            set.x[c][l] = p[0];
            set.y[c][l] = p[1];
            set.z[c][l] = p[2];
            set.m[c][l] = m;
        }
        set
    }
}

/// Pair kernel parameters, precomputed once per evaluation.
#[derive(Debug, Clone, Copy)]
struct KernelParams {
    kernel: SofteningKernel,
    eps2: f64,
    spline_h: f64,
}

/// Sums of `m f(r) dx` and `m p(r)` over all sources for `TARGET_BLOCK` targets.
type BlockSums = [[f64; 4]; TARGET_BLOCK];

/// Signature of the (possibly target-feature-specialised) block kernel.
type BlockKernel = unsafe fn(&SourceSet, &[[f64; 3]; TARGET_BLOCK], KernelParams) -> BlockSums;

/// The portable kernel body; inlined into each target-feature wrapper below.
#[inline(always)]
fn block_sums(
    src: &SourceSet,
    targets: &[[f64; 3]; TARGET_BLOCK],
    params: KernelParams,
) -> BlockSums {
    match params.kernel {
        SofteningKernel::Plummer => {
            let eps2 = params.eps2;
            block_sums_with(src, targets, |r2| plummer_factors(r2, eps2))
        }
        SofteningKernel::Spline => {
            let h = params.spline_h;
            if h > 0.0 {
                block_sums_with(src, targets, |r2| spline_factors(r2, h))
            } else {
                block_sums_with(src, targets, |r2| plummer_factors(r2, 0.0))
            }
        }
    }
}

#[inline(always)]
fn block_sums_with<K: Fn(f64) -> (f64, f64)>(
    src: &SourceSet,
    targets: &[[f64; 3]; TARGET_BLOCK],
    factors: K,
) -> BlockSums {
    let mut ax = [[0.0f64; LANES]; TARGET_BLOCK];
    let mut ay = [[0.0f64; LANES]; TARGET_BLOCK];
    let mut az = [[0.0f64; LANES]; TARGET_BLOCK];
    let mut ph = [[0.0f64; LANES]; TARGET_BLOCK];
    for c in 0..src.x.len() {
        let (xs, ys, zs, ms) = (&src.x[c], &src.y[c], &src.z[c], &src.m[c]);
        for t in 0..TARGET_BLOCK {
            let [tx, ty, tz] = targets[t];
            for l in 0..LANES {
                let dx = xs[l] - tx;
                let dy = ys[l] - ty;
                let dz = zs[l] - tz;
                let r2 = dx * dx + dy * dy + dz * dz;
                let (f, p) = factors(r2);
                // Zero separation is the particle itself (or an exact duplicate): excluded.
                let mf = if r2 > 0.0 { ms[l] * f } else { 0.0 };
                let mp = if r2 > 0.0 { ms[l] * p } else { 0.0 };
                ax[t][l] += dx * mf;
                ay[t][l] += dy * mf;
                az[t][l] += dz * mf;
                ph[t][l] += mp;
            }
        }
    }
    let mut out = [[0.0; 4]; TARGET_BLOCK];
    for t in 0..TARGET_BLOCK {
        for l in 0..LANES {
            out[t][0] += ax[t][l];
            out[t][1] += ay[t][l];
            out[t][2] += az[t][l];
            out[t][3] += ph[t][l];
        }
    }
    out
}

/// Defines an entry point that compiles `block_sums` with the given target features.
macro_rules! block_kernel {
    ($(#[$cfg:meta])* $name:ident, $features:literal, $doc:literal) => {
        #[doc = $doc]
        ///
        /// # Safety
        /// The CPU must support the enabled features (`select_kernel` checks).
        $(#[$cfg])*
        #[target_feature(enable = $features)]
        unsafe fn $name(
            src: &SourceSet,
            targets: &[[f64; 3]; TARGET_BLOCK],
            params: KernelParams,
        ) -> BlockSums {
            block_sums(src, targets, params)
        }
    };
}

/// The kernel for any CPU.
///
/// # Safety
/// None required; `unsafe` only to share the signature of the specialised kernels.
unsafe fn block_sums_portable(
    src: &SourceSet,
    targets: &[[f64; 3]; TARGET_BLOCK],
    params: KernelParams,
) -> BlockSums {
    block_sums(src, targets, params)
}

block_kernel!(
    #[cfg(target_arch = "x86_64")]
    block_sums_avx2,
    "avx2,fma",
    "The kernel for AVX2 CPUs."
);
block_kernel!(
    #[cfg(target_arch = "x86_64")]
    block_sums_avx512,
    "avx512f,avx2,fma",
    "The kernel for AVX-512 CPUs."
);

/// Picks the widest kernel this CPU runs. All variants give identical bits: the loop body has
/// no fused multiply-adds and the per-lane addition order is fixed in the source.
fn select_kernel() -> (BlockKernel, &'static str) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return (block_sums_avx512, "avx512");
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            return (block_sums_avx2, "avx2");
        }
    }
    (block_sums_portable, "portable")
}

/// Direct-summation solver with a gravitational constant and a softening kernel.
#[derive(Debug, Clone)]
pub struct DirectSummation {
    g: f64,
    params: KernelParams,
    kernel: BlockKernel,
    isa: &'static str,
}

impl DirectSummation {
    /// A solver for gravitational constant `g` and the given softening.
    pub fn new(g: f64, softening: Softening) -> Self {
        let (kernel, isa) = select_kernel();
        DirectSummation {
            g,
            params: KernelParams {
                kernel: softening.kernel,
                eps2: softening.epsilon * softening.epsilon,
                spline_h: super::softening::SPLINE_SUPPORT_PER_EPSILON * softening.epsilon,
            },
            kernel,
            isa,
        }
    }

    /// The instruction set the kernel was specialised for ("avx512", "avx2" or "portable").
    pub fn instruction_set(&self) -> &'static str {
        self.isa
    }

    /// Accelerations and potentials at arbitrary `targets` from `sources`. A target that
    /// coincides exactly with a source does not feel that source (self-interaction).
    pub fn evaluate(
        &self,
        sources: &SourceSet,
        targets: &[[f64; 3]],
        acc: &mut [[f64; 3]],
        pot: &mut [f64],
    ) {
        let (g, params, kernel) = (self.g, self.params, self.kernel);
        acc.par_chunks_mut(TASK_TARGETS)
            .zip(pot.par_chunks_mut(TASK_TARGETS))
            .zip(targets.par_chunks(TASK_TARGETS))
            .for_each(|((acc, pot), targets)| {
                for (b, block) in targets.chunks(TARGET_BLOCK).enumerate() {
                    // Pad a short last block by repeating its first target; the extra
                    // results are discarded.
                    let mut padded = [block[0]; TARGET_BLOCK];
                    padded[..block.len()].copy_from_slice(block);
                    // SAFETY: `select_kernel` only returns kernels this CPU supports.
                    let sums = unsafe { kernel(sources, &padded, params) };
                    for (t, s) in sums.iter().take(block.len()).enumerate() {
                        let i = b * TARGET_BLOCK + t;
                        acc[i] = [g * s[0], g * s[1], g * s[2]];
                        pot[i] = -g * s[3];
                    }
                }
            });
    }
}

impl GravitySolver for DirectSummation {
    fn name(&self) -> &'static str {
        "direct"
    }

    fn compute(&mut self, particles: &mut Particles) -> Result<ForceReport, GravityError> {
        check_finite(particles)?;
        let start = Instant::now();
        let sources = SourceSet::new(&particles.pos, &particles.mass);
        self.evaluate(
            &sources,
            &particles.pos,
            &mut particles.acc,
            &mut particles.pot,
        );
        let n = particles.len() as u64;
        Ok(ForceReport {
            pair_interactions: n * n.saturating_sub(1),
            seconds: start.elapsed().as_secs_f64(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(
        pos: &[[f64; 3]],
        mass: &[f64],
        g: f64,
        soft: Softening,
    ) -> (Vec<[f64; 3]>, Vec<f64>) {
        let n = pos.len();
        let mut acc = vec![[0.0; 3]; n];
        let mut pot = vec![0.0; n];
        for i in 0..n {
            for j in 0..n {
                if i == j {
                    continue;
                }
                let d = [
                    pos[j][0] - pos[i][0],
                    pos[j][1] - pos[i][1],
                    pos[j][2] - pos[i][2],
                ];
                let r2 = d[0] * d[0] + d[1] * d[1] + d[2] * d[2];
                let (f, p) = soft.factors(r2);
                for k in 0..3 {
                    acc[i][k] += g * mass[j] * f * d[k];
                }
                pot[i] -= g * mass[j] * p;
            }
        }
        (acc, pot)
    }

    fn cloud(n: usize) -> (Vec<[f64; 3]>, Vec<f64>) {
        let mut s = 12345u64;
        let mut next = || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 11) as f64 / (1u64 << 53) as f64
        };
        let pos: Vec<[f64; 3]> = (0..n).map(|_| [next(), next(), next()]).collect();
        let mass: Vec<f64> = (0..n).map(|_| 0.5 + next()).collect();
        (pos, mass)
    }

    #[test]
    fn matches_scalar_double_loop_for_both_kernels() {
        let (pos, mass) = cloud(37);
        for soft in [
            Softening::newtonian(),
            Softening {
                kernel: SofteningKernel::Plummer,
                epsilon: 0.05,
            },
            Softening {
                kernel: SofteningKernel::Spline,
                epsilon: 0.05,
            },
        ] {
            let solver = DirectSummation::new(2.0, soft);
            let src = SourceSet::new(&pos, &mass);
            let mut acc = vec![[0.0; 3]; pos.len()];
            let mut pot = vec![0.0; pos.len()];
            solver.evaluate(&src, &pos, &mut acc, &mut pot);
            let (ra, rp) = reference(&pos, &mass, 2.0, soft);
            for i in 0..pos.len() {
                for k in 0..3 {
                    assert!((acc[i][k] - ra[i][k]).abs() < 1e-12 * ra[i][k].abs().max(1.0));
                }
                assert!((pot[i] - rp[i]).abs() < 1e-12 * rp[i].abs());
            }
        }
    }

    #[test]
    fn all_instruction_sets_give_identical_bits() {
        let (pos, mass) = cloud(53);
        let src = SourceSet::new(&pos, &mass);
        let params = KernelParams {
            kernel: SofteningKernel::Plummer,
            eps2: 1e-4,
            spline_h: 0.028,
        };
        let targets = [pos[0], pos[5], pos[17], pos[52]];
        // SAFETY: the portable kernel runs anywhere; the selected one is supported.
        let portable = unsafe { block_sums_portable(&src, &targets, params) };
        let (best, _) = select_kernel();
        let fast = unsafe { best(&src, &targets, params) };
        for t in 0..TARGET_BLOCK {
            for k in 0..4 {
                assert_eq!(portable[t][k].to_bits(), fast[t][k].to_bits());
            }
        }
    }
}
