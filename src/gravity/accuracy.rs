//! Force accuracy against direct summation, with the metric names used everywhere (design §5):
//! per-particle relative error `|a - a_direct| / |a_direct|` as median, p99 and max, and
//! `aggL2 = ||a - a_direct||_F / ||a_direct||_F`.

use super::direct::{DirectSummation, SourceSet};
use super::softening::Softening;
use rand::seq::index::sample;

/// Error statistics over a set of compared particles.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AccuracyStats {
    /// Particles compared.
    pub count: usize,
    /// Median relative error.
    pub median: f64,
    /// 99th percentile relative error.
    pub p99: f64,
    /// Largest relative error.
    pub max: f64,
    /// Aggregate L2 error.
    pub agg_l2: f64,
}

/// Compares `acc` with `reference`, entry by entry.
pub fn compare(acc: &[[f64; 3]], reference: &[[f64; 3]]) -> AccuracyStats {
    let mut rel = Vec::with_capacity(acc.len());
    let (mut num, mut den) = (0.0, 0.0);
    for (a, r) in acc.iter().zip(reference) {
        let d2 = (a[0] - r[0]).powi(2) + (a[1] - r[1]).powi(2) + (a[2] - r[2]).powi(2);
        let r2 = r[0] * r[0] + r[1] * r[1] + r[2] * r[2];
        num += d2;
        den += r2;
        rel.push(if r2 > 0.0 {
            (d2 / r2).sqrt()
        } else {
            d2.sqrt()
        });
    }
    rel.sort_by(f64::total_cmp);
    let at = |q: f64| {
        if rel.is_empty() {
            0.0
        } else {
            rel[((q * (rel.len() - 1) as f64).round() as usize).min(rel.len() - 1)]
        }
    };
    AccuracyStats {
        count: rel.len(),
        median: at(0.5),
        p99: at(0.99),
        max: rel.last().copied().unwrap_or(0.0),
        agg_l2: if den > 0.0 { (num / den).sqrt() } else { 0.0 },
    }
}

/// `m` distinct particle indices out of `n`, chosen reproducibly from `seed`.
pub fn sample_indices(n: usize, m: usize, seed: u64) -> Vec<usize> {
    let mut rng = crate::ics::sampling::block_rng(seed, u64::MAX, 0);
    if m >= n {
        return (0..n).collect();
    }
    let mut idx = sample(&mut rng, n, m).into_vec();
    idx.sort_unstable();
    idx
}

/// The particles where force errors concentrate (issue 42's "tail"): the `m` with the
/// weakest accelerations in `acc` (an estimate, e.g. the FMM's own; the far field dominates
/// their force) and the `m` farthest from the mass-weighted centre (outer-halo particles
/// whose force comes from few, distant cells). Sorted, without repeats.
pub fn tail_indices(pos: &[[f64; 3]], mass: &[f64], acc: &[[f64; 3]], m: usize) -> Vec<usize> {
    let n = pos.len();
    let total: f64 = mass.iter().sum();
    let centre: [f64; 3] = std::array::from_fn(|k| {
        if total > 0.0 {
            pos.iter().zip(mass).map(|(x, w)| x[k] * w).sum::<f64>() / total
        } else {
            0.0
        }
    });
    let norm2 = |v: [f64; 3]| v[0] * v[0] + v[1] * v[1] + v[2] * v[2];
    let smallest = |key: &dyn Fn(usize) -> f64| -> Vec<usize> {
        let mut order: Vec<usize> = (0..n).collect();
        let m = m.min(n);
        if m == 0 {
            return Vec::new();
        }
        // Ties broken by index (a total order), so the choice is the same on every machine;
        // a selection, not a sort, as N may be 1e7.
        order.select_nth_unstable_by(m - 1, |&a, &b| key(a).total_cmp(&key(b)).then(a.cmp(&b)));
        order.truncate(m);
        order
    };
    let mut idx = smallest(&|i| norm2(acc[i]));
    idx.extend(smallest(&|i| {
        -norm2([0, 1, 2].map(|k| pos[i][k] - centre[k]))
    }));
    idx.sort_unstable();
    idx.dedup();
    idx
}

/// Direct-summation accelerations and potentials at the particles `targets` of the set.
pub fn direct_at(
    pos: &[[f64; 3]],
    mass: &[f64],
    targets: &[usize],
    g: f64,
    softening: Softening,
) -> (Vec<[f64; 3]>, Vec<f64>) {
    let solver = DirectSummation::new(g, softening);
    let sources = SourceSet::new(pos, mass);
    let points: Vec<[f64; 3]> = targets.iter().map(|&i| pos[i]).collect();
    let mut acc = vec![[0.0; 3]; points.len()];
    let mut pot = vec![0.0; points.len()];
    solver.evaluate(&sources, &points, &mut acc, &mut pot);
    for (p, &i) in pot.iter_mut().zip(targets) {
        *p += solver.self_term(mass[i], None);
    }
    (acc, pot)
}

/// Direct-summation accelerations at a union of particle sets, for comparing each set
/// (random targets, the tail) against the same reference.
#[derive(Debug, Clone)]
pub struct Reference {
    /// The particles, sorted, without repeats.
    indices: Vec<usize>,
    /// Their direct-summation accelerations.
    acc: Vec<[f64; 3]>,
}

impl Reference {
    /// Direct sums at every particle of `sets`.
    pub fn at(
        pos: &[[f64; 3]],
        mass: &[f64],
        sets: &[&[usize]],
        g: f64,
        softening: Softening,
    ) -> Reference {
        let mut indices: Vec<usize> = sets.iter().flat_map(|s| s.iter().copied()).collect();
        indices.sort_unstable();
        indices.dedup();
        let (acc, _) = direct_at(pos, mass, &indices, g, softening);
        Reference { indices, acc }
    }

    /// Every particle it holds.
    pub fn indices(&self) -> &[usize] {
        &self.indices
    }

    /// `compare` of `acc` (all particles) on the particles `chosen` among its own.
    pub fn compare(&self, acc: &[[f64; 3]], chosen: &[usize]) -> AccuracyStats {
        let (mine, direct): (Vec<[f64; 3]>, Vec<[f64; 3]>) = chosen
            .iter()
            .filter_map(|&i| {
                let k = self.indices.binary_search(&i).ok()?;
                Some((acc[i], self.acc[k]))
            })
            .unzip();
        compare(&mine, &direct)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_of_known_errors() {
        let reference = vec![[1.0, 0.0, 0.0]; 100];
        let mut acc = reference.clone();
        acc[7] = [1.1, 0.0, 0.0];
        let s = compare(&acc, &reference);
        assert_eq!(s.count, 100);
        assert_eq!(s.median, 0.0);
        assert!((s.max - 0.1).abs() < 1e-12);
        assert!((s.agg_l2 - 0.01).abs() < 1e-12);
        assert_eq!(sample_indices(1000, 10, 3), sample_indices(1000, 10, 3));
        assert_eq!(sample_indices(1000, 10, 3).len(), 10);
    }

    #[test]
    fn the_tail_is_the_weakest_and_the_farthest() {
        // A line of unit masses at x = 0..10, centre 4.5; accelerations |a| = x + 1 except
        // particle 7, the weakest.
        let pos: Vec<[f64; 3]> = (0..10).map(|i| [i as f64, 0.0, 0.0]).collect();
        let mass = vec![1.0; 10];
        let mut acc: Vec<[f64; 3]> = (0..10).map(|i| [i as f64 + 1.0, 0.0, 0.0]).collect();
        acc[7] = [0.1, 0.0, 0.0];
        // Weakest two: 7 and 0; farthest two from 4.5: 0 and 9.
        assert_eq!(tail_indices(&pos, &mass, &acc, 2), vec![0, 7, 9]);
        assert_eq!(tail_indices(&pos, &mass, &acc, 20).len(), 10);
    }
}
