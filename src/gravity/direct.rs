//! Direct summation: every particle against every other, in f64.
//!
//! This is the reference solver (design §5): the FMM's accuracy is measured against it, so it
//! must be exact to f64 rounding, deterministic, and fast enough to check 1e5-particle sets.
//! It runs the shared pair kernel (`pairwise`) with all sources in one segment.

use super::pairwise::{
    KernelFn, LANES_F64, PairParams, Staged, TARGET_BLOCK, evaluate_targets, select_f64,
    self_potential,
};
use super::softening::Softening;
use super::{ForceReport, GravityError, GravitySolver, check_finite};
use crate::particles::Particles;
use rayon::prelude::*;
use std::time::Instant;

/// Targets per parallel task.
const TASK_TARGETS: usize = 64;

/// All sources of a direct evaluation, staged once.
#[derive(Debug, Clone, Default)]
pub struct SourceSet {
    staged: Staged<f64, LANES_F64>,
}

impl SourceSet {
    /// Stages the sources at `pos` with `mass`.
    pub fn new(pos: &[[f64; 3]], mass: &[f64]) -> Self {
        let mut staged = Staged::default();
        staged.push(pos, mass, None, [0.0; 3]);
        SourceSet { staged }
    }

    /// Stages the sources at `pos` with `mass` and their own softening lengths `eps`.
    pub fn with_softening(pos: &[[f64; 3]], mass: &[f64], eps: &[f64]) -> Self {
        let mut staged = Staged::default();
        staged.push(pos, mass, Some(eps), [0.0; 3]);
        SourceSet { staged }
    }
}

/// Direct-summation solver with a gravitational constant and a softening kernel.
#[derive(Debug, Clone)]
pub struct DirectSummation {
    g: f64,
    /// The uniform softening length.
    epsilon: f64,
    params: PairParams<f64>,
    per_particle: PairParams<f64>,
    kernel: KernelFn<f64, LANES_F64, TARGET_BLOCK>,
    isa: &'static str,
    /// Softening length per component (`Component::index`), when they differ.
    component_softening: Option<[f64; 4]>,
}

impl DirectSummation {
    /// A solver for gravitational constant `g` and the given softening.
    pub fn new(g: f64, softening: Softening) -> Self {
        let (kernel, isa) = select_f64();
        DirectSummation {
            g,
            epsilon: softening.epsilon,
            params: PairParams::new(softening),
            per_particle: PairParams::per_particle(softening),
            kernel,
            isa,
            component_softening: None,
        }
    }

    /// Gives every component its own softening length (indexed by `Component::index`); a
    /// pair uses the larger of its two.
    pub fn with_component_softening(mut self, table: Option<[f64; 4]>) -> Self {
        self.component_softening = table;
        self
    }

    /// The G-scaled potential a particle of `mass` (softening `eps`, else the solver's one
    /// length) gives itself through its zero-separation pair in `evaluate`: a caller whose
    /// targets are among the sources adds it back to each target's potential, so that a
    /// particle feels every other one (an exact duplicate included) but not itself.
    pub fn self_term(&self, mass: f64, eps: Option<f64>) -> f64 {
        self.g * self_potential(mass, eps.unwrap_or(self.epsilon))
    }

    /// The instruction set the kernel was specialised for ("avx512", "avx2" or "portable").
    pub fn instruction_set(&self) -> &'static str {
        self.isa
    }

    /// Accelerations and potentials at arbitrary `targets` from `sources` (overwriting
    /// `acc` and `pot`). A source at exactly a target's place adds no force and the kernel's
    /// central potential (a target that is itself a source: see `self_term`).
    pub fn evaluate(
        &self,
        sources: &SourceSet,
        targets: &[[f64; 3]],
        acc: &mut [[f64; 3]],
        pot: &mut [f64],
    ) {
        self.evaluate_softened(sources, targets, None, acc, pot);
    }

    /// `evaluate` with per-particle softening lengths: the sources' (from
    /// `SourceSet::with_softening`) and the targets' `target_eps`.
    pub fn evaluate_softened(
        &self,
        sources: &SourceSet,
        targets: &[[f64; 3]],
        target_eps: Option<&[f64]>,
        acc: &mut [[f64; 3]],
        pot: &mut [f64],
    ) {
        let params = if target_eps.is_some() {
            self.per_particle
        } else {
            self.params
        };
        let (g, kernel) = (self.g, self.kernel);
        acc.par_chunks_mut(TASK_TARGETS)
            .zip(pot.par_chunks_mut(TASK_TARGETS))
            .enumerate()
            .for_each(|(task, (acc, pot))| {
                acc.iter_mut().for_each(|a| *a = [0.0; 3]);
                pot.iter_mut().for_each(|p| *p = 0.0);
                let range = task * TASK_TARGETS..task * TASK_TARGETS + acc.len();
                evaluate_targets(
                    kernel,
                    &sources.staged,
                    &targets[range.clone()],
                    target_eps.map(|e| &e[range]),
                    [0.0; 3],
                    params,
                    g,
                    acc,
                    pot,
                );
            });
    }
}

impl GravitySolver for DirectSummation {
    fn name(&self) -> &'static str {
        "direct"
    }

    fn compute(&mut self, particles: &mut Particles) -> Result<ForceReport, GravityError> {
        let all: Vec<u32> = (0..particles.len() as u32).collect();
        self.compute_targets(particles, &all)
    }

    fn compute_active(
        &mut self,
        particles: &mut Particles,
        active: &[bool],
    ) -> Result<ForceReport, GravityError> {
        let targets: Vec<u32> = (0..particles.len() as u32)
            .filter(|&i| active[i as usize])
            .collect();
        self.compute_targets(particles, &targets)
    }
}

impl DirectSummation {
    /// The forces on the particles `targets` from all particles.
    fn compute_targets(
        &self,
        particles: &mut Particles,
        targets: &[u32],
    ) -> Result<ForceReport, GravityError> {
        check_finite(particles)?;
        let start = Instant::now();
        let n = particles.len();
        particles.acc.resize(n, [0.0; 3]);
        particles.pot.resize(n, 0.0);
        let at: Vec<[f64; 3]> = targets.iter().map(|&i| particles.pos[i as usize]).collect();
        let (mut acc, mut pot) = (vec![[0.0; 3]; at.len()], vec![0.0; at.len()]);
        match self.component_softening {
            None => {
                let sources = SourceSet::new(&particles.pos, &particles.mass);
                self.evaluate(&sources, &at, &mut acc, &mut pot);
            }
            Some(table) => {
                let eps: Vec<f64> = particles
                    .component
                    .iter()
                    .map(|c| table[c.index()])
                    .collect();
                let target_eps: Vec<f64> = targets.iter().map(|&i| eps[i as usize]).collect();
                let sources = SourceSet::with_softening(&particles.pos, &particles.mass, &eps);
                self.evaluate_softened(&sources, &at, Some(&target_eps), &mut acc, &mut pot);
            }
        }
        let eps = |i: usize| {
            self.component_softening
                .map(|table| table[particles.component[i].index()])
        };
        for (k, &i) in targets.iter().enumerate() {
            let i = i as usize;
            particles.acc[i] = acc[k];
            particles.pot[i] = pot[k] + self.self_term(particles.mass[i], eps(i));
        }
        let (t, n) = (targets.len() as u64, n as u64);
        Ok(ForceReport {
            pair_interactions: t * n.saturating_sub(1),
            seconds: start.elapsed().as_secs_f64(),
            stats: Vec::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gravity::pairwise::{KernelFn, all_f32, all_f64};
    use crate::gravity::softening::SofteningKernel;

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
            // The targets are the sources: each takes its own pair back out.
            for (p, &m) in pot.iter_mut().zip(&mass) {
                *p += solver.self_term(m, None);
            }
            let (ra, rp) = reference(&pos, &mass, 2.0, soft);
            for i in 0..pos.len() {
                for k in 0..3 {
                    assert!((acc[i][k] - ra[i][k]).abs() < 1e-12 * ra[i][k].abs().max(1.0));
                }
                assert!((pot[i] - rp[i]).abs() < 1e-12 * rp[i].abs());
            }
        }
    }

    /// f64 builds give identical bits; f32 builds the portable build's sums within 1e-6 of
    /// each target's force and potential (their `1/sqrt` estimates differ at f32's rounding,
    /// `pairwise_fast`), and each the same bits call after call.
    #[test]
    fn instruction_sets_agree() {
        // Sources spread so that some chunks are softened and some Newtonian, with two
        // particles at the same place (zero separation) among them.
        let (mut pos, mass) = cloud(203);
        pos[7] = pos[3];
        let targets = [pos[3], [0.0; 3], [0.5, 0.5, 0.5], [0.9, 0.1, 0.4]];
        let eps: Vec<f64> = (0..pos.len())
            .map(|i| 0.005 + 0.001 * (i % 7) as f64)
            .collect();
        // Each softening setting, staged in two pieces, through every build of `builds`.
        fn agree<T: crate::gravity::softening::Real + Default + std::fmt::Debug, const L: usize>(
            builds: Vec<(KernelFn<T, L, 4>, &str)>,
            (pos, mass, eps): (&[[f64; 3]], &[f64], &[f64]),
            targets: [[f64; 3]; 4],
            tolerance: f64,
        ) {
            let spline = |epsilon| Softening {
                kernel: SofteningKernel::Spline,
                epsilon,
            };
            let plummer = Softening {
                kernel: SofteningKernel::Plummer,
                epsilon: 0.02,
            };
            let settings = [
                PairParams::new(spline(0.02)),
                // The FMM's Newtonian near field: the vector path, the pair at 0 included.
                PairParams::new(spline(0.0)),
                PairParams::new(Softening::newtonian()),
                PairParams::new(plummer),
                PairParams::per_particle(spline(0.011)),
                PairParams::per_particle(plummer),
            ];
            let origin = [0.1; 3];
            let t = targets.map(|t| std::array::from_fn(|k| T::lit(t[k] - origin[k])));
            let te = [0.02, 0.0, 0.005, 0.01].map(T::lit);
            for params in settings {
                let per = params.is_per_particle().then_some(eps);
                let mut src = Staged::<T, L>::default();
                src.push(&pos[..20], &mass[..20], per.map(|e| &e[..20]), origin);
                src.push(&pos[20..], &mass[20..], per.map(|e| &e[20..]), origin);
                // SAFETY: the `all_*` lists hold only builds this CPU runs.
                let call = |k: &KernelFn<T, L, 4>| unsafe { k(&src, &t, &te, params) };
                let sums: Vec<_> = builds.iter().map(|(k, isa)| (call(k), isa)).collect();
                let reference = &sums[sums.len() - 1].0; // the portable build
                assert!(reference.iter().flatten().all(|v| v.is_finite()));
                for ((s, isa), (k, _)) in sums.iter().zip(&builds) {
                    assert_eq!(format!("{s:?}"), format!("{:?}", call(k)), "{isa} repeated");
                    for (a, b) in s.iter().zip(reference) {
                        let force = (b[0] * b[0] + b[1] * b[1] + b[2] * b[2]).sqrt();
                        for q in 0..4 {
                            let scale = if q < 3 { force } else { b[3].abs() };
                            let off = (a[q] - b[q]).abs();
                            assert!(off <= tolerance * scale, "{isa} {params:?}: {a:?} {b:?}");
                        }
                    }
                }
            }
        }
        agree(all_f64(), (&pos, &mass, &eps), targets, 0.0);
        agree(all_f32(), (&pos, &mass, &eps), targets, 1e-6);
    }

    #[test]
    fn per_particle_softening_uses_the_larger_length_of_a_pair() {
        use crate::particles::{Component, Particles};
        for kernel in [SofteningKernel::Spline, SofteningKernel::Plummer] {
            let mut p = Particles::default();
            p.push([0.0, 0.0, 0.0], [0.0; 3], 2.0, 1, Component::Halo);
            p.push([0.03, 0.01, 0.0], [0.0; 3], 0.5, 2, Component::Disk);
            p.push([0.5, -0.2, 0.1], [0.0; 3], 1.0, 3, Component::Disk);
            let table = [0.05, 0.01, 0.0, 0.0];
            let soft = |epsilon| Softening { kernel, epsilon };
            let mut solver =
                DirectSummation::new(1.0, soft(0.05)).with_component_softening(Some(table));
            solver.compute(&mut p).unwrap();
            // Reference: each pair with the larger of its two lengths.
            let eps: [f64; 3] = [0.05, 0.01, 0.01];
            for i in 0..3 {
                let mut a = [0.0; 3];
                for j in (0..3).filter(|&j| j != i) {
                    let d: [f64; 3] = std::array::from_fn(|k| p.pos[j][k] - p.pos[i][k]);
                    let r2 = d[0] * d[0] + d[1] * d[1] + d[2] * d[2];
                    let (f, _) = soft(eps[i].max(eps[j])).factors(r2);
                    for k in 0..3 {
                        a[k] += p.mass[j] * f * d[k];
                    }
                }
                for k in 0..3 {
                    assert!(
                        (p.acc[i][k] - a[k]).abs() <= 1e-12 * a[k].abs().max(1.0),
                        "{kernel:?} {i}"
                    );
                }
            }
            // The pair rule is symmetric, so momentum is kept.
            let total: Vec<f64> = (0..3)
                .map(|k| (0..3).map(|i| p.mass[i] * p.acc[i][k]).sum::<f64>())
                .collect();
            assert!(total.iter().all(|t| t.abs() < 1e-9), "{total:?}");
        }
    }
}
