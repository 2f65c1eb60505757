//! The distributed FMM with K thread ranks against the single-rank FMM and direct summation.

mod common;

use leapfmm::distributed::comm::{Communicator, ThreadRank, run_thread_ranks};
use leapfmm::distributed::driver::DistributedFmm;
use leapfmm::distributed::stats::RankStats;
use leapfmm::fmm::caps::{CapKind, Caps, CapsPolicy};
use leapfmm::fmm::p2p::NearFieldPrecision;
use leapfmm::fmm::{FmmSettings, FmmSolver};
use leapfmm::gravity::GravitySolver;
use leapfmm::gravity::accuracy::{AccuracyStats, compare, direct_at};
use leapfmm::gravity::{Softening, SofteningKernel};
use leapfmm::particles::{Component, Particles};
use leapfmm::workloads::Workload;
use std::time::Duration;

fn settings(g: f64, eps: f64) -> FmmSettings {
    FmmSettings {
        order: 6,
        theta: 0.6,
        accuracy: 0.0,
        leaf_size: 32,
        softening: Softening {
            kernel: SofteningKernel::Spline,
            epsilon: eps,
        },
        g,
        near_field: NearFieldPrecision::Mixed,
        caps_policy: CapsPolicy::default(),
    }
}

/// Evaluates `p` on `k` thread ranks (rank r starts with every k-th particle), `steps` times;
/// returns accelerations in the input order and the last evaluation's per-rank figures.
fn distributed(
    p: &Particles,
    k: usize,
    s: &FmmSettings,
    steps: usize,
) -> (Vec<[f64; 3]>, Vec<RankStats>) {
    let out = run_thread_ranks(k, 1, Duration::from_secs(120), |comm: &ThreadRank| {
        let mut mine = Particles::default();
        for i in (comm.rank()..p.len()).step_by(k) {
            mine.push(p.pos[i], p.vel[i], p.mass[i], p.id[i], p.component[i]);
        }
        let mut solver = DistributedFmm::new(comm.clone(), FmmSolver::new(s.clone(), None), None);
        let mut stats = RankStats::default();
        for _ in 0..steps {
            stats = solver.evaluate(&mut mine, None)?;
        }
        Ok::<_, leapfmm::gravity::GravityError>((mine, stats))
    })
    .unwrap();
    let mut acc = vec![[0.0; 3]; p.len()];
    for (mine, _) in &out {
        for i in 0..mine.len() {
            acc[(mine.id[i] - 1) as usize] = mine.acc[i];
        }
    }
    (acc, out.into_iter().map(|o| o.1).collect())
}

fn errors(p: &Particles, acc: &[[f64; 3]], s: &FmmSettings, idx: &[usize]) -> AccuracyStats {
    let (reference, _) = direct_at(&p.pos, &p.mass, idx, s.g, s.softening);
    let a: Vec<[f64; 3]> = idx.iter().map(|&i| acc[i]).collect();
    compare(&a, &reference)
}

fn clumps(n: usize, separation: f64) -> Particles {
    let mut p = Particles::default();
    let mut s = 5u64;
    let mut r = move || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (s >> 11) as f64 / (1u64 << 53) as f64
    };
    for i in 0..n {
        let c = if i % 2 == 0 { 0.0 } else { separation };
        let x = [
            c + (r() - 0.5) * (r() + 0.1),
            (r() - 0.5) * r(),
            (r() - 0.5) * r(),
        ];
        p.push(x, [0.0; 3], 1.0 / n as f64, (i + 1) as u64, Component::Halo);
    }
    p
}

fn ids_from_one(mut p: Particles) -> Particles {
    for (i, id) in p.id.iter_mut().enumerate() {
        *id = (i + 1) as u64;
    }
    p
}

#[test]
fn forces_on_k_ranks_match_one_rank() {
    let sets: Vec<(&str, Particles, f64, f64)> = vec![
        (
            "plummer",
            ids_from_one(Workload::Plummer.particles(20_000, 1)),
            1.0,
            0.01,
        ),
        (
            "disk-in-halo",
            ids_from_one(Workload::DiskInHalo.particles(20_000, 1)),
            Workload::DiskInHalo.g(),
            0.1,
        ),
        ("separated clumps", clumps(20_000, 10.0), 1.0, 0.005),
        ("interpenetrating clumps", clumps(20_000, 0.3), 1.0, 0.005),
    ];
    for (name, p, g, eps) in &sets {
        let s = settings(*g, *eps);
        // Every particle: p99 over a small sample would be decided by a handful of them.
        let idx: Vec<usize> = (0..p.len()).collect();
        let (one, _) = distributed(p, 1, &s, 1);
        let base = errors(p, &one, &s, &idx);
        for k in [2, 3, 4, 8] {
            let (acc, stats) = distributed(p, k, &s, 1);
            let e = errors(p, &acc, &s, &idx);
            let remote_m2l: usize = stats.iter().map(|r| r.fmm.remote_m2l).sum();
            eprintln!(
                "{name} K={k}: aggL2 {:.2e} (1 rank {:.2e}), p99 {:.2e} ({:.2e}), cross-domain M2L {remote_m2l}",
                e.agg_l2, base.agg_l2, e.p99, base.p99
            );
            assert!(
                remote_m2l > 0,
                "{name} K={k}: no cross-domain far pair was used"
            );
            assert!(
                e.agg_l2 <= 1.2 * base.agg_l2,
                "{name} K={k}: aggL2 {} vs {}",
                e.agg_l2,
                base.agg_l2
            );
            assert!(
                e.p99 <= 1.2 * base.p99,
                "{name} K={k}: p99 {} vs {}",
                e.p99,
                base.p99
            );
        }
    }
}

/// The error-controlled MAC on K ranks: each cell's expected acceleration travels with
/// its geometry, the receivers' walks decide as the exporters emulated them (no missing
/// cells), and the accuracy holds for every particle, first evaluation (which finds the
/// accelerations to expect) and second (which expects the first's) alike.
#[test]
fn the_accuracy_target_holds_on_k_ranks() {
    let w = Workload::TruncatedHalo;
    let n = 10_000;
    let p = ids_from_one(w.particles(n, 1));
    let softening = Softening {
        kernel: SofteningKernel::Spline,
        epsilon: w.softening(n),
    };
    let s = FmmSettings {
        accuracy: 1e-3,
        ..FmmSettings::defaults(softening, w.g())
    };
    let idx: Vec<usize> = (0..n).collect();
    for k in [1, 2, 3] {
        for steps in [1, 2] {
            let (acc, stats) = distributed(&p, k, &s, steps);
            let e = errors(&p, &acc, &s, &idx);
            eprintln!("K={k}, evaluation {steps}: {e:?}");
            assert!(
                e.p99 <= 1e-3 && e.max <= 1e-2,
                "K={k}, evaluation {steps}: {e:?}"
            );
            if k > 1 {
                let remote_m2l: usize = stats.iter().map(|r| r.fmm.remote_m2l).sum();
                assert!(remote_m2l > 0, "K={k}: no cross-domain far pair was used");
            }
        }
    }
}

#[test]
fn the_f64_near_field_travels_in_f64_and_keeps_its_accuracy() {
    let p = ids_from_one(Workload::DiskInHalo.particles(12_000, 5));
    let s = FmmSettings {
        near_field: NearFieldPrecision::Double,
        ..settings(Workload::DiskInHalo.g(), 0.1)
    };
    let idx: Vec<usize> = (0..p.len()).collect();
    let (one, _) = distributed(&p, 1, &s, 1);
    let base = errors(&p, &one, &s, &idx);
    let (acc, stats) = distributed(&p, 3, &s, 1);
    let e = errors(&p, &acc, &s, &idx);
    assert!(stats.iter().all(|r| r.let_particles > 0));
    assert!(
        e.agg_l2 <= 1.2 * base.agg_l2 && e.p99 <= 1.2 * base.p99,
        "{e:?} vs {base:?}"
    );
}

#[test]
fn a_rank_with_bad_input_stops_every_rank_at_once() {
    let p = ids_from_one(Workload::Plummer.particles(8_000, 2));
    let s = settings(1.0, 0.01);
    let start = std::time::Instant::now();
    let err = run_thread_ranks(4, 1, Duration::from_secs(120), |comm: &ThreadRank| {
        let mut mine = Particles::default();
        for i in (comm.rank()..p.len()).step_by(4) {
            mine.push(p.pos[i], p.vel[i], p.mass[i], p.id[i], p.component[i]);
        }
        if comm.rank() == 2 {
            mine.pos[10][1] = f64::NAN;
        }
        let mut solver = DistributedFmm::new(comm.clone(), FmmSolver::new(s.clone(), None), None);
        for _ in 0..3 {
            solver.compute(&mut mine)?;
        }
        Ok::<_, leapfmm::gravity::GravityError>(())
    })
    .unwrap_err();
    assert_eq!(err.0, 2, "the failing rank is named: {err:?}");
    assert!(err.1.contains("non-finite position"), "{err:?}");
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "the other ranks must stop at once, not wait for the 120 s timeout"
    );
}

#[test]
fn let_buffers_that_overflow_grow_and_retry_without_truncation() {
    let p = ids_from_one(Workload::DiskInHalo.particles(20_000, 3));
    let s = settings(Workload::DiskInHalo.g(), 0.1);
    let run = |tiny: bool| {
        run_thread_ranks(3, 1, Duration::from_secs(120), |comm: &ThreadRank| {
            let mut mine = Particles::default();
            for i in (comm.rank()..p.len()).step_by(3) {
                mine.push(p.pos[i], p.vel[i], p.mass[i], p.id[i], p.component[i]);
            }
            let mut solver =
                DistributedFmm::new(comm.clone(), FmmSolver::new(s.clone(), None), None);
            if tiny {
                solver.set_caps(Caps {
                    cells: 1 << 16,
                    m2l_pairs: 1 << 22,
                    p2p_pairs: 1 << 20,
                    let_cells: 1,
                    let_particles: 1,
                });
            }
            let stats = solver.evaluate(&mut mine, None)?;
            let mut by_id: Vec<(u64, [f64; 3])> =
                (0..mine.len()).map(|i| (mine.id[i], mine.acc[i])).collect();
            by_id.sort_by_key(|x| x.0);
            Ok::<_, leapfmm::gravity::GravityError>((by_id, stats))
        })
        .unwrap()
    };
    let tiny = run(true);
    let roomy = run(false);
    for ((a, sa), (b, _)) in tiny.iter().zip(&roomy) {
        assert!(sa.fmm.retries > 0, "tiny LET caps must overflow");
        assert!(sa.fmm.overflows[CapKind::LetCells as usize] > 0);
        assert!(sa.fmm.overflows[CapKind::LetParticles as usize] > 0);
        assert!(sa.let_particles > 0);
        assert!(
            a == b,
            "an overflowed exchange must give the same forces after its retry"
        );
    }
}

#[test]
fn per_component_softening_matches_direct_summation_on_any_rank_count() {
    let mut model = leapfmm::ics::ModelFile::load(&common::repo("ics/small_disk.toml")).unwrap();
    // A cold thin disk softened four times less than the halo (a common production choice).
    model.disk.as_mut().unwrap().softening = Some(0.025);
    model.halo.as_mut().unwrap().softening = Some(0.1);
    let table = model.component_softening(0.05).expect("the lengths differ");
    let (p, _) = leapfmm::ics::generate(&model, 16_000, 8);
    let g = model.units.gravitational_constant();
    let soft = Softening {
        kernel: SofteningKernel::Spline,
        epsilon: 0.1,
    };
    let mut reference = p.clone();
    leapfmm::gravity::direct::DirectSummation::new(g, soft)
        .with_component_softening(Some(table))
        .compute(&mut reference)
        .unwrap();
    let mut uniform = p.clone();
    leapfmm::gravity::direct::DirectSummation::new(g, soft)
        .compute(&mut uniform)
        .unwrap();
    let disk = p.indices_of(Component::Disk);
    let pick = |a: &[[f64; 3]]| disk.iter().map(|&i| a[i]).collect::<Vec<_>>();
    let change = compare(&pick(&uniform.acc), &pick(&reference.acc));
    assert!(
        change.agg_l2 > 1e-3,
        "the disk's own softening must change its forces (aggL2 {})",
        change.agg_l2
    );
    let settings = FmmSettings {
        softening: soft,
        ..settings(g, 0.1)
    };
    let mut base = None;
    for k in [1, 3] {
        let out = run_thread_ranks(k, 1, Duration::from_secs(120), |comm: &ThreadRank| {
            let mut mine = Particles::default();
            for i in (comm.rank()..p.len()).step_by(k) {
                mine.push(p.pos[i], p.vel[i], p.mass[i], p.id[i], p.component[i]);
            }
            let mut solver =
                DistributedFmm::new(comm.clone(), FmmSolver::new(settings.clone(), None), None)
                    .with_component_softening(Some(table));
            solver.compute(&mut mine)?;
            Ok::<_, leapfmm::gravity::GravityError>(mine)
        })
        .unwrap();
        let mut acc = vec![[0.0; 3]; p.len()];
        for mine in &out {
            for i in 0..mine.len() {
                acc[(mine.id[i] - 1) as usize] = mine.acc[i];
            }
        }
        let e = compare(&acc, &reference.acc);
        eprintln!(
            "per-component softening, K={k}: aggL2 {:.2e}, p99 {:.2e} (uniform vs per-component: {:.2e})",
            e.agg_l2, e.p99, change.agg_l2
        );
        assert!(e.agg_l2 < 1e-3, "K={k}: aggL2 {}", e.agg_l2);
        let b = *base.get_or_insert(e.agg_l2);
        assert!(e.agg_l2 <= 1.2 * b, "K={k}: {} vs one rank {b}", e.agg_l2);
    }
}

fn galaxy(n: usize) -> (Particles, f64) {
    let model = leapfmm::ics::ModelFile::load(&common::repo("ics/milky_way.toml")).unwrap();
    let (p, _) = leapfmm::ics::generate(&model, n, 4);
    (p, model.units.gravitational_constant())
}

/// LET figures for the galaxy model on 4 ranks at N = 1e5 and 1e6 (second evaluation, so
/// that the domains are balanced on measured work): the mean bytes received per rank (LET
/// data plus the tree geometry its exporters' walks needed) and the largest ratio of those
/// bytes to the rank's own (position, mass) bytes.
fn galaxy_traffic() -> Vec<(usize, f64, f64)> {
    let mut out = Vec::new();
    for n in [100_000, 1_000_000] {
        let (p, g) = galaxy(n);
        let s = FmmSettings {
            order: 7,
            theta: 0.75,
            accuracy: 0.0,
            leaf_size: 128,
            ..settings(g, 0.05)
        };
        let (_, stats) = distributed(&p, 4, &s, 2);
        let received = |st: &RankStats| (st.let_bytes_received + st.geometry_bytes_received) as f64;
        let own_bytes = |st: &RankStats| (32 * st.particles) as f64;
        for (r, st) in stats.iter().enumerate() {
            eprintln!(
                "N={n} rank {r}: {} particles, work {:.3e}, imbalance {:.3}, LET received {} cells + {} particles = {} bytes, geometry {} bytes: {:.1}% of own (pos, mass) bytes",
                st.particles,
                st.work,
                st.imbalance,
                st.let_cells,
                st.let_particles,
                st.let_bytes_received,
                st.geometry_bytes_received,
                100.0 * received(st) / own_bytes(st),
            );
            assert!(
                st.imbalance <= 1.10,
                "N={n}: load imbalance {} on the second step",
                st.imbalance
            );
        }
        let mean = stats.iter().map(received).sum::<f64>() / stats.len() as f64;
        let worst = stats
            .iter()
            .map(|st| received(st) / own_bytes(st))
            .fold(0.0, f64::max);
        out.push((n, mean, worst));
    }
    out
}

#[test]
fn load_balance_surface_scaling_and_let_traffic_on_the_galaxy() {
    let t = galaxy_traffic();
    let growth = t[1].1 / t[0].1;
    eprintln!(
        "LET and geometry bytes per rank grew {growth:.2}x for 10x the particles; at 1e6 at most {:.1}% of own bytes",
        100.0 * t[1].2
    );
    assert!(growth <= 5.5, "LET traffic grew {growth}x");
    assert!(
        t[1].2 <= 0.25,
        "LET traffic {} of own (pos, mass) bytes at N = 1e6",
        t[1].2
    );
}

/// Ranks that hold no particles (more ranks than particles) still take part in every
/// exchange: their empty trees and packets travel and decode, and the others' forces are
/// those of direct summation.
#[test]
fn ranks_without_particles_take_part_in_the_exchange() {
    let p = clumps(6, 3.0);
    let s = FmmSettings {
        leaf_size: 1,
        ..settings(1.0, 0.01)
    };
    let (acc, stats) = distributed(&p, 8, &s, 2);
    assert!(
        stats.iter().any(|st| st.particles == 0),
        "some rank is empty"
    );
    assert!(stats.iter().any(|st| st.let_particles + st.let_cells > 0));
    let idx: Vec<usize> = (0..p.len()).collect();
    let e = errors(&p, &acc, &s, &idx);
    assert!(e.p99 < 1e-4, "{e:?}");
}
