//! The near field: every target leaf against the leaves on its P2P list, in mixed precision
//! (design §5.7: positions relative to the target leaf's centre in f32, interactions and
//! per-leaf-pair sums in f32, sums across pairs in f64) or in f64 throughout.

use super::tree::Tree;
use crate::gravity::pairwise::{
    KernelFn, LANES_F32, LANES_F64, PairParams, Staged, TARGET_BLOCK, evaluate_targets, select_f32,
    select_f64, self_potential,
};
use crate::gravity::softening::{Real, Softening};
use serde::{Deserialize, Serialize};

/// Working precision of the near field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NearFieldPrecision {
    /// f32 interactions on leaf-relative coordinates, f64 accumulation across leaf pairs.
    #[default]
    Mixed,
    /// f64 throughout (for accuracy studies beyond f32's floor).
    Double,
}

/// Per-thread staging buffers.
#[derive(Debug, Default)]
pub struct NearScratch {
    single: Staged<f32, LANES_F32>,
    double: Staged<f64, LANES_F64>,
}

/// One precision's kernel with its softening parameters: one length for all, or one per
/// particle (trees with `eps`).
#[derive(Debug, Clone, Copy)]
struct Kernels<T, const L: usize> {
    kernel: KernelFn<T, L, TARGET_BLOCK>,
    uniform: PairParams<T>,
    per_particle: PairParams<T>,
}

impl<T: Real, const L: usize> Kernels<T, L> {
    fn new(kernel: KernelFn<T, L, TARGET_BLOCK>, softening: Softening) -> Self {
        Kernels {
            kernel,
            uniform: PairParams::new(softening),
            per_particle: PairParams::per_particle(softening),
        }
    }

    fn pick(&self, per_particle: bool) -> (KernelFn<T, L, TARGET_BLOCK>, PairParams<T>) {
        let params = if per_particle {
            self.per_particle
        } else {
            self.uniform
        };
        (self.kernel, params)
    }
}

/// The near-field evaluator of one solver.
#[derive(Debug, Clone, Copy)]
pub struct NearField {
    precision: NearFieldPrecision,
    g: f64,
    /// The uniform softening length (its central potential is taken back out of each
    /// particle's own pair).
    epsilon: f64,
    single: Kernels<f32, LANES_F32>,
    double: Kernels<f64, LANES_F64>,
}

impl NearField {
    /// An evaluator for gravitational constant `g` and `softening`.
    pub fn new(precision: NearFieldPrecision, g: f64, softening: Softening) -> Self {
        NearField {
            precision,
            g,
            epsilon: softening.epsilon,
            single: Kernels::new(select_f32().0, softening),
            double: Kernels::new(select_f64().0, softening),
        }
    }

    /// Adds to `acc`/`pot` (the target leaf's particles) the forces of the `sources` leaves.
    pub fn leaf(
        &self,
        tree: &Tree,
        target: u32,
        sources: impl Iterator<Item = u32>,
        scratch: &mut NearScratch,
        acc: &mut [[f64; 3]],
        pot: &mut [f64],
    ) {
        let per_particle = !tree.eps.is_empty();
        let job = (tree, target);
        let self_listed = match self.precision {
            NearFieldPrecision::Mixed => {
                let k = self.single.pick(per_particle);
                stage_and_sum(job, sources, &mut scratch.single, k, self.g, acc, pot)
            }
            NearFieldPrecision::Double => {
                let k = self.double.pick(per_particle);
                stage_and_sum(job, sources, &mut scratch.double, k, self.g, acc, pot)
            }
        };
        if self_listed {
            let cell = tree.cells[target as usize];
            for (k, i) in (cell.begin as usize..cell.end as usize).enumerate() {
                let eps = if per_particle {
                    tree.eps[i]
                } else {
                    self.epsilon
                };
                pot[k] += self.g * self_potential(tree.mass[i], eps);
            }
        }
    }
}

/// Stages the source leaves relative to the target leaf's centre and runs the kernel on
/// the target leaf's particles; returns whether the target leaf was among the sources.
fn stage_and_sum<T: Real, const L: usize>(
    (tree, target): (&Tree, u32),
    sources: impl Iterator<Item = u32>,
    staged: &mut Staged<T, L>,
    (kernel, params): (KernelFn<T, L, TARGET_BLOCK>, PairParams<T>),
    g: f64,
    acc: &mut [[f64; 3]],
    pot: &mut [f64],
) -> bool {
    let cell = tree.cells[target as usize];
    let origin = cell.centre;
    staged.clear();
    let mut self_listed = false;
    for s in sources {
        self_listed |= s == target;
        let c = tree.cells[s as usize];
        let range = c.begin as usize..c.end as usize;
        let eps = params.is_per_particle().then(|| &tree.eps[range.clone()]);
        staged.push(&tree.pos[range.clone()], &tree.mass[range], eps, origin);
    }
    let range = cell.begin as usize..cell.end as usize;
    let target_eps = params.is_per_particle().then(|| &tree.eps[range.clone()]);
    evaluate_targets(
        kernel,
        staged,
        &tree.pos[range],
        target_eps,
        origin,
        params,
        g,
        acc,
        pot,
    );
    self_listed
}
