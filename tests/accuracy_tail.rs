//! The accuracy test set (issue 42): on each distribution, the FMM with an accuracy target
//! (the error-controlled MAC, `FmmSettings::accuracy`) against direct summation on 4 000
//! random particles plus the 500 with the weakest forces and the 500 farthest from the
//! centre, where the errors of a geometric MAC concentrate. Asserted: p99 ≤ accuracy,
//! max ≤ 10 × accuracy and aggL2 ≤ 0.3 × accuracy, at 1e-3, 1e-4 and 1e-5 with 1e4
//! particles, and at the default (1e-3) with 1e5.

use leapfmm::fmm::solver::{DEFAULT_ACCURACY, Evaluation, default_order, expected_accelerations};
use leapfmm::fmm::{FmmSettings, FmmSolver};
use leapfmm::gravity::accuracy::{AccuracyStats, Reference, sample_indices, tail_indices};
use leapfmm::gravity::{Softening, SofteningKernel};
use leapfmm::workloads::Workload;

/// Particles of each distribution: small enough for every case to take about a second,
/// and the regime where the tail was worst (it grows as N falls).
const N: usize = 10_000;

/// Random targets and the size of each half of the tail.
const RANDOM: usize = 4_000;
const TAIL: usize = 500;

/// The errors of one evaluation of `w` at `accuracy` (0: the geometric MAC alone) with the
/// defaults a user gets (order `default_order(accuracy)`, θ and leaf size) over the random
/// targets and the tail.
fn errors(w: Workload, accuracy: f64) -> AccuracyStats {
    errors_at(w, N, accuracy)
}

/// `errors` at `n` particles.
fn errors_at(w: Workload, n: usize, accuracy: f64) -> AccuracyStats {
    let softening = Softening {
        kernel: SofteningKernel::Spline,
        epsilon: w.softening(n),
    };
    errors_with(w, n, accuracy, softening)
}

/// `errors_at` with another softening.
fn errors_with(w: Workload, n: usize, accuracy: f64, softening: Softening) -> AccuracyStats {
    let settings = FmmSettings {
        accuracy,
        order: default_order(accuracy),
        ..FmmSettings::defaults(softening, w.g())
    };
    errors_of(w, n, settings)
}

/// The errors of one evaluation of `w` at `n` particles with `settings`.
fn errors_of(w: Workload, n: usize, settings: FmmSettings) -> AccuracyStats {
    let (p, softening) = (w.particles(n, 1), settings.softening);
    let mut solver = FmmSolver::new(settings, None);
    let mut acc = vec![[0.0; 3]; n];
    let mut pot = vec![0.0; n];
    solver
        .evaluate(&p.pos, &p.mass, &p.id, &mut acc, &mut pot)
        .expect("an FMM evaluation of the test set");
    let random = sample_indices(n, RANDOM, 7);
    let tail = tail_indices(&p.pos, &p.mass, &acc, TAIL);
    let reference = Reference::at(&p.pos, &p.mass, &[&random, &tail], w.g(), softening);
    reference.compare(&acc, reference.indices())
}

/// Asserts the accuracy's bounds on `w` at each accuracy.
fn honours_the_accuracy(w: Workload) {
    honours_the_accuracy_with(w, |accuracy| errors(w, accuracy));
}

/// Asserts the accuracy's bounds on the errors `at` each accuracy gives.
fn honours_the_accuracy_with(w: Workload, at: impl Fn(f64) -> AccuracyStats) {
    for accuracy in [1e-3, 1e-4, 1e-5] {
        let e = at(accuracy);
        let case = format!("{} at accuracy {accuracy:.0e}: {e:?}", w.name());
        assert!(e.count >= RANDOM, "{case}");
        assert!(e.p99 <= accuracy, "p99 above the accuracy, {case}");
        assert!(
            e.max <= 10.0 * accuracy,
            "max above 10x the accuracy, {case}"
        );
        assert!(
            e.agg_l2 <= 0.3 * accuracy,
            "aggL2 above 0.3x the accuracy, {case}"
        );
    }
}

#[test]
fn plummer_sphere() {
    honours_the_accuracy(Workload::Plummer);
}

#[test]
fn hernquist_cusp() {
    honours_the_accuracy(Workload::HernquistCusp);
}

#[test]
fn disk_in_a_truncated_halo() {
    honours_the_accuracy(Workload::TruncatedHalo);
}

#[test]
fn two_galaxies_far_apart() {
    honours_the_accuracy(Workload::TwoGalaxies);
}

#[test]
fn cold_uniform_cube() {
    honours_the_accuracy(Workload::UniformCube);
}

#[test]
fn one_tight_clump() {
    honours_the_accuracy(Workload::Clump);
}

/// Plummer softening: a far pair taken as Newtonian is up to 1.5 (ε/s)² too strong, always
/// in the same sense, which the criterion bounds too (`Mac::bias`). Without that term, at
/// ε = 0.02 (ten times the workload's) p99 was 3.9e-4 at accuracy 1e-4 (measured at 2e4).
#[test]
fn plummer_softening_honours_the_accuracy_too() {
    let w = Workload::Plummer;
    honours_the_accuracy_with(w, |accuracy| {
        let softening = Softening {
            kernel: SofteningKernel::Plummer,
            epsilon: 10.0 * w.softening(N),
        };
        errors_with(w, N, accuracy, softening)
    });
}

/// At 1e5 particles too (issue 42 asks for 1e4, 1e5 and 1e6; 1e6 is in docs/benchmarks.md),
/// with the settings a user gets when asking for nothing (`FmmSettings::defaults`: the
/// accuracy target `DEFAULT_ACCURACY`, 1e-3, and its order). (At 1e-5 the two galaxies' p99
/// comes out at 1.1e-5 at 1e5, just over: the open part of issue 42.)
#[test]
fn the_whole_set_at_1e5_particles_holds_the_default_1e_3() {
    let accuracy = 1e-3;
    assert_eq!(DEFAULT_ACCURACY, accuracy);
    for w in Workload::TEST_SET {
        let n = 100_000;
        let softening = Softening {
            kernel: SofteningKernel::Spline,
            epsilon: w.softening(n),
        };
        let e = errors_of(w, n, FmmSettings::defaults(softening, w.g()));
        let case = format!("{} at 1e5: {e:?}", w.name());
        assert!(e.p99 <= accuracy, "p99 above the accuracy, {case}");
        assert!(e.max <= 10.0 * accuracy, "max above 10x, {case}");
        assert!(e.agg_l2 <= 0.3 * accuracy, "aggL2 above 0.3x, {case}");
    }
}

/// The set tells the criteria apart: the geometric MAC at its default θ breaks the max
/// bound of accuracy 1e-3 on the truncated halo (6e-2 when this was written), which is why
/// the accuracy target exists.
#[test]
fn the_geometric_mac_fails_the_truncated_halo() {
    let e = errors(Workload::TruncatedHalo, 0.0);
    assert!(e.max > 1e-2, "{e:?}");
}

/// A block sub-step walks for the cells of its active particles only (the lists of the
/// others are left out); those particles get the accuracy all the same, tail included.
#[test]
fn active_particles_of_a_block_step_get_the_accuracy_too() {
    let w = Workload::TruncatedHalo;
    let p = w.particles(N, 1);
    let softening = Softening {
        kernel: SofteningKernel::Spline,
        epsilon: w.softening(N),
    };
    let accuracy = 1e-3;
    let settings = FmmSettings {
        accuracy,
        order: default_order(accuracy),
        ..FmmSettings::defaults(softening, w.g())
    };
    let mut solver = FmmSolver::new(settings, None);
    let mut acc = vec![[0.0; 3]; N];
    let mut pot = vec![0.0; N];
    solver
        .evaluate(&p.pos, &p.mass, &p.id, &mut acc, &mut pot)
        .expect("a full evaluation");
    // Every third particle and the tail are active; the others keep a marker.
    let tail = tail_indices(&p.pos, &p.mass, &acc, TAIL);
    let mut active: Vec<bool> = (0..N).map(|i| i % 3 == 0).collect();
    for &i in &tail {
        active[i] = true;
    }
    let expected = expected_accelerations(&acc);
    let marker = [7.0; 3];
    for (a, &on) in acc.iter_mut().zip(&active) {
        if on {
            *a = marker;
        }
    }
    let with = Evaluation {
        active: Some(&active),
        expected_accel: Some(&expected),
        ..Evaluation::default()
    };
    solver
        .evaluate_with(&p.pos, &p.mass, &p.id, with, &mut acc, &mut pot)
        .expect("an evaluation for the active particles");
    let chosen: Vec<usize> = (0..N).filter(|&i| active[i]).collect();
    assert!(
        chosen.iter().all(|&i| acc[i] != marker),
        "every active particle received"
    );
    let reference = Reference::at(&p.pos, &p.mass, &[&chosen], w.g(), softening);
    let e = reference.compare(&acc, reference.indices());
    assert!(e.p99 <= accuracy && e.max <= 10.0 * accuracy, "{e:?}");
}
