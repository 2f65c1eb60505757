//! Hierarchical (block) time steps (issue 8): on a cuspy Hernquist sphere the block scheme
//! makes a fraction of the global scheme's force evaluations; a block run resumes bit for
//! bit; K = 1 and K = 4 ranks agree. The rung rules themselves are property-tested in
//! src/integrate/block.rs.

mod common;

use common::*;
use leapfmm::config::Precision;
use leapfmm::io::snapshot::{SnapshotInfo, write_snapshot};
use leapfmm::particles::{Component, Particles};
use leapfmm::units::UnitSystem;
use std::path::Path;

/// Writes a two-body orbit (masses 1 and 0.1, semi-major axis 1, eccentricity 0.9, G = 1,
/// both at apocentre, centre-of-mass frame) as an initial-conditions file.
fn two_body_ic(path: &Path) {
    let (m1, m2, a, e): (f64, f64, f64, f64) = (1.0, 0.1, 1.0, 0.9);
    let m = m1 + m2;
    let r = a * (1.0 + e);
    let v = (m * (1.0 - e) / (a * (1.0 + e))).sqrt();
    let mut p = Particles::with_capacity(2);
    p.push(
        [-m2 / m * r, 0.0, 0.0],
        [0.0, -m2 / m * v, 0.0],
        m1,
        1,
        Component::Generic,
    );
    p.push(
        [m1 / m * r, 0.0, 0.0],
        [0.0, m1 / m * v, 0.0],
        m2,
        2,
        Component::Generic,
    );
    let info = SnapshotInfo::new(0.0, UnitSystem::Nbody, Precision::Double);
    let _hdf5 = hdf5_lock();
    write_snapshot(path, &p, &info).unwrap();
}

/// Three periods of the two-body orbit with the `[integrator]` lines `integrator`.
fn two_body(dir: &Path, name: &str, integrator: &str) -> Diagnostics {
    let cfg = format!(
        "name = \"{name}\"\nunits = \"nbody\"\n[ics]\nfile = \"{}\"\n[gravity]\nsolver = \"direct\"\nsoftening = 0.001\n[integrator]\nt_end = 18.0\n{integrator}\n[output]\ndiagnostics_every = 1\n",
        dir.join("two_body.hdf5").display()
    );
    let path = write(dir, &format!("{name}.toml"), &cfg);
    let out = run_in(dir, &["run", path.to_str().unwrap(), "--quiet"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Diagnostics::read(&dir.join("runs").join(name).join("diagnostics.csv"))
}

#[test]
#[ignore = "issue 8 target not met: block |dE/E| max 4.2e-4 vs 1.5e-4 for the global scheme at the smallest rung's step (with 20x fewer evaluations); see docs/benchmarks.md"]
fn an_eccentric_binary_conserves_energy_with_block_steps_like_the_global_scheme() {
    let dir = tempfile::tempdir().unwrap();
    two_body_ic(&dir.path().join("two_body.hdf5"));
    let block = two_body(dir.path(), "block", "dt_max = 0.0625\nscheme = \"block\"");
    let finest = block
        .column("dt")
        .iter()
        .skip(1)
        .fold(f64::INFINITY, |a, &b| a.min(b));
    let global = two_body(
        dir.path(),
        "global",
        &format!("dt_max = {finest}\nfixed_step = true"),
    );
    let (eb, eg) = (
        max_abs(&block.column("rel_energy_error")),
        max_abs(&global.column("rel_energy_error")),
    );
    let evaluations: f64 = block.column("force_evaluations").iter().sum();
    let global_evaluations = 2.0 * (global.rows.len() - 1) as f64;
    let last = |d: &Diagnostics| d.column("rel_energy_error").last().copied().unwrap_or(0.0);
    eprintln!(
        "final |dE/E|: block {:.3e}, global {:.3e}",
        last(&block),
        last(&global)
    );
    eprintln!(
        "two-body e = 0.9: block |dE/E| max {eb:.3e} with {evaluations} evaluations; global at dt = {finest}: {eg:.3e} with {global_evaluations}"
    );
    assert!(eb <= 1.5 * eg, "block {eb} vs global {eg}");
    assert!(evaluations < global_evaluations);
}

/// A Hernquist sphere (N-body units, direct forces unless `gravity` says otherwise) run to
/// `t_end` in `dir`; returns its diagnostics.
fn hernquist(
    dir: &Path,
    name: &str,
    integrator: &str,
    gravity: &str,
    args: &[&str],
) -> Diagnostics {
    let cfg = format!(
        r#"name = "{name}"
units = "nbody"
seed = 3

[ics]
model = "{model}"
n = 4000

[gravity]
softening = 0.01
{gravity}

[integrator]
t_end = 1.0
{integrator}

[output]
diagnostics_every = 1
snapshot_precision = "double"
"#,
        model = repo("ics/hernquist.toml").display()
    );
    let path = write(dir, &format!("{name}.toml"), &cfg);
    let mut all = vec!["run", path.to_str().unwrap(), "--quiet"];
    all.extend_from_slice(args);
    let out = run_in(dir, &all);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Diagnostics::read(&dir.join("runs").join(name).join("diagnostics.csv"))
}

fn max_abs(v: &[f64]) -> f64 {
    v.iter().fold(0.0, |m, x| m.max(x.abs()))
}

/// The block run (eta 0.05) and the global run at its smallest rung's step: (block |dE/E|,
/// global |dE/E|, block evaluations, global evaluations).
fn block_against_global(dir: &Path) -> (f64, f64, f64, f64) {
    let block = hernquist(
        dir,
        "block",
        "dt_max = 0.125\neta = 0.05\nscheme = \"block\"",
        "solver = \"direct\"",
        &[],
    );
    let finest = block
        .column("dt")
        .iter()
        .skip(1)
        .fold(f64::INFINITY, |a, &b| a.min(b));
    let global = hernquist(
        dir,
        "global",
        &format!("dt_max = {finest}\nfixed_step = true"),
        "solver = \"direct\"",
        &[],
    );
    let evaluations: f64 = block.column("force_evaluations").iter().sum();
    let steps = global.rows.len() as f64 - 1.0;
    let global_evaluations = 4000.0 * steps;
    let saving = block.column("block_saving");
    eprintln!(
        "block: |dE/E| max {:.3e}, {evaluations} force evaluations (block_saving column {:.2}); global at dt = {finest}: |dE/E| max {:.3e}, {global_evaluations} evaluations",
        max_abs(&block.column("rel_energy_error")),
        saving[saving.len() - 1],
        max_abs(&global.column("rel_energy_error")),
    );
    (
        max_abs(&block.column("rel_energy_error")),
        max_abs(&global.column("rel_energy_error")),
        evaluations,
        global_evaluations,
    )
}

#[test]
fn block_steps_make_a_third_of_the_force_evaluations_on_a_cuspy_sphere() {
    let dir = tempfile::tempdir().unwrap();
    let (block_de, _, block_ev, global_ev) = block_against_global(dir.path());
    assert!(
        global_ev >= 3.0 * block_ev,
        "block {block_ev} vs global {global_ev} evaluations"
    );
    assert!(block_de < 2e-5, "block |dE/E| {block_de}");
}

#[test]
#[ignore = "issue 8 target not met: block |dE/E| 6.4e-6 vs 1.0e-6 for the global run at the smallest rung's step (the bulk of the particles sits 2-3 rungs above the shortest); see docs/benchmarks.md"]
fn block_steps_conserve_energy_like_the_global_scheme_at_the_smallest_step() {
    let dir = tempfile::tempdir().unwrap();
    let (block_de, global_de, _, _) = block_against_global(dir.path());
    assert!(block_de <= 1.5 * global_de, "{block_de} vs {global_de}");
}

#[test]
fn a_block_run_resumes_bit_exactly_and_k_ranks_agree_with_one() {
    let dir = tempfile::tempdir().unwrap();
    let integrator = "dt_max = 0.125\neta = 0.1\nscheme = \"block\"";
    // Straight through.
    hernquist(dir.path(), "straight", integrator, "", &[]);
    // The same run stopped at t = 0.5 (t_end lowered), then resumed to 1.0 with the
    // original config: every output time is a synchronisation point, so the checkpoint
    // at 0.5 holds the whole state.
    let cfg_text = |name: &str, t_end: f64| {
        std::fs::read_to_string(dir.path().join("straight.toml"))
            .unwrap()
            .replace("name = \"straight\"", &format!("name = \"{name}\""))
            .replace("t_end = 1.0", &format!("t_end = {t_end}"))
    };
    write(dir.path(), "resumed.toml", &cfg_text("resumed", 0.5));
    let first = run_in(dir.path(), &["run", "resumed.toml", "--quiet"]);
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    write(dir.path(), "resumed.toml", &cfg_text("resumed", 1.0));
    let second = run_in(dir.path(), &["run", "resumed.toml", "--quiet", "--resume"]);
    assert!(
        second.status.success(),
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );
    let last = |name: &str| {
        let snaps = dir.path().join("runs").join(name).join("snapshots");
        let mut files: Vec<_> = std::fs::read_dir(snaps)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .collect();
        files.sort();
        files.pop().unwrap()
    };
    for set in ["PartType4/Coordinates", "PartType4/Velocities"] {
        assert!(
            dataset_bytes(&last("straight"), set) == dataset_bytes(&last("resumed"), set),
            "{set} differ after the restart"
        );
    }
    // Four thread ranks, FMM: the same physics to the FMM's accuracy.
    let one = hernquist(dir.path(), "fmm1", integrator, "", &[]);
    let four = hernquist(dir.path(), "fmm4", integrator, "", &["--ranks", "4"]);
    let (e1, e4) = (
        max_abs(&one.column("rel_energy_error")),
        max_abs(&four.column("rel_energy_error")),
    );
    let (n1, n4): (f64, f64) = (
        one.column("force_evaluations").iter().sum(),
        four.column("force_evaluations").iter().sum(),
    );
    eprintln!("FMM block runs: |dE/E| K=1 {e1:.3e}, K=4 {e4:.3e}; evaluations {n1} and {n4}");
    for run in [&one, &four] {
        let retries: f64 = run.column("fmm_retries").iter().skip(2).sum();
        assert_eq!(retries, 0.0, "retries after the first cycle");
    }
    assert!(e4 <= 1.5 * e1 + 1e-6, "{e4} vs {e1}");
    assert!((n4 - n1).abs() <= 0.02 * n1, "{n4} vs {n1} evaluations");
}
