//! The near field: every target leaf against the leaves on its P2P list, in mixed precision
//! (design §5.7: positions relative to the target leaf's centre in f32, interactions and
//! per-leaf-pair sums in f32, sums across pairs in f64) or in f64 throughout.

use super::tree::Tree;
use crate::gravity::pairwise::{
    KernelFn, LANES_F32, LANES_F64, PairParams, Staged, TARGET_BLOCK, evaluate_targets, select_f32,
    select_f64,
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

/// The near-field evaluator of one solver.
#[derive(Debug, Clone, Copy)]
pub struct NearField {
    precision: NearFieldPrecision,
    g: f64,
    single: (KernelFn<f32, LANES_F32, TARGET_BLOCK>, PairParams<f32>),
    double: (KernelFn<f64, LANES_F64, TARGET_BLOCK>, PairParams<f64>),
    /// The same kernel with per-particle softening lengths (trees with `eps`).
    single_per_particle: PairParams<f32>,
    double_per_particle: PairParams<f64>,
}

impl NearField {
    /// An evaluator for gravitational constant `g` and `softening`.
    pub fn new(precision: NearFieldPrecision, g: f64, softening: Softening) -> Self {
        NearField {
            precision,
            g,
            single: (select_f32().0, PairParams::new(softening)),
            double: (select_f64().0, PairParams::new(softening)),
            single_per_particle: PairParams::per_particle(softening),
            double_per_particle: PairParams::per_particle(softening),
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
        match self.precision {
            NearFieldPrecision::Mixed => {
                let (kernel, uniform) = self.single;
                let params = if per_particle {
                    self.single_per_particle
                } else {
                    uniform
                };
                stage_and_sum(
                    tree,
                    target,
                    sources,
                    &mut scratch.single,
                    (kernel, params),
                    self.g,
                    acc,
                    pot,
                )
            }
            NearFieldPrecision::Double => {
                let (kernel, uniform) = self.double;
                let params = if per_particle {
                    self.double_per_particle
                } else {
                    uniform
                };
                stage_and_sum(
                    tree,
                    target,
                    sources,
                    &mut scratch.double,
                    (kernel, params),
                    self.g,
                    acc,
                    pot,
                )
            }
        }
    }
}

/// Stages the source leaves relative to the target leaf's centre and runs the kernel.
#[allow(clippy::too_many_arguments)]
fn stage_and_sum<T: Real, const L: usize>(
    tree: &Tree,
    target: u32,
    sources: impl Iterator<Item = u32>,
    staged: &mut Staged<T, L>,
    (kernel, params): (KernelFn<T, L, TARGET_BLOCK>, PairParams<T>),
    g: f64,
    acc: &mut [[f64; 3]],
    pot: &mut [f64],
) {
    let cell = tree.cells[target as usize];
    let origin = cell.centre;
    staged.clear();
    for s in sources {
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
}
