//! The small disk galaxy stays in equilibrium: N = 1.5e5, FMM, more than three rotation
//! periods at 2 R_d. Lagrangian radii, disk thickness, radial dispersion, bar strength, energy
//! and angular momentum are compared between the first and the last snapshot.
//!
//! N is 1.5e5 rather than the 5e4 minimum because discreteness heats the disk vertically at a
//! rate ∝ 1/N: at 1e5 the scale height grows ~20% in three rotations, at 1.5e5 ~9% (the same
//! initial conditions integrated in their static model potential keep it within ±3%). The fixed step of 1e-3 (~1 Myr) keeps |ΔE/E| well below 1e-3 at a third of the cost
//! of the adaptive criterion, which the cusp of the halo drives down.

mod common;

use common::*;
use leapfmm::analysis::bar::a2;
use leapfmm::analysis::profiles::{annulus, lagrangian_radii};
use leapfmm::ics::ModelFile;
use leapfmm::ics::galaxy::Galaxy;
use leapfmm::io::snapshot::read_snapshot;
use leapfmm::particles::Component;

#[test]
fn small_disk_stays_in_equilibrium_for_three_rotations() {
    stays_in_equilibrium("eq", "fixed_step = true\ndt_max = 0.001");
}

/// The same run with hierarchical time steps (issue 8). With eta = 0.3 the bulk of the
/// particles sits on steps of 5e-4 to 1e-3, the densest on 2.5e-4.
#[test]
fn small_disk_stays_in_equilibrium_with_block_steps() {
    stays_in_equilibrium("eqblock", "scheme = \"block\"\neta = 0.3\ndt_max = 0.0325");
}

/// Runs the small disk for three rotations with the `[integrator]` lines `integrator`
/// (besides t_end) and checks its equilibrium between the first and the last snapshot.
/// The forces use the opening angle alone (`accuracy = 0`): 150 000 particles for 650 steps
/// take 301 s alone at the default accuracy target against 105 s, three times the suite's
/// budget for a test. At the default (measured 2026-12-07, issue 42) the global run keeps
/// every bound with the same figures (disk r10 +2.6 %, scale height +9.1 %, σ_R +2.9 %,
/// A2 0.023; |ΔE/E| 4.2e-4 against 4.6e-4, |ΔLz/Lz| 3e-7 against 1.3e-5), and the suite
/// runs the default in the shorter runs (first_run, restart, block_steps, distributed_run).
fn stays_in_equilibrium(name: &str, integrator: &str) {
    let model = ModelFile::load(&repo("ics/small_disk.toml")).unwrap();
    let galaxy = Galaxy::new(&model);
    let rd = galaxy.disk.as_ref().unwrap().profile.rd;
    let vc = galaxy.potential.vc2(2.0 * rd).sqrt();
    let period = 2.0 * std::f64::consts::PI * 2.0 * rd / vc;
    let t_end = 0.65;
    assert!(
        t_end > 3.0 * period,
        "t_end {t_end} must exceed 3 periods of {period}"
    );
    let dir = tempfile::tempdir().unwrap();
    let cfg = format!(
        r#"name = "{name}"
seed = 11
units = "galactic"
[ics]
model = "{}"
n = 150000
[gravity]
softening = 0.05
accuracy = 0
[integrator]
t_end = {t_end}
{integrator}
[output]
snapshot_interval = 0.325
snapshot_precision = "double"
"#,
        repo("ics/small_disk.toml").display()
    );
    let cfg = write(dir.path(), &format!("{name}.toml"), &cfg);
    let out = run_in(dir.path(), &["run", cfg.to_str().unwrap(), "--quiet"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let snaps = dir.path().join("runs").join(name).join("snapshots");
    let (first, last) = {
        let _hdf5 = hdf5_lock();
        (
            read_snapshot(&snaps.join("snap_000.hdf5"))
                .unwrap()
                .particles,
            read_snapshot(&snaps.join("snap_002.hdf5"))
                .unwrap()
                .particles,
        )
    };
    eprintln!("{name}: rotation period at 2 R_d: {period:.3}; ran to {t_end}");
    for c in [Component::Halo, Component::Disk] {
        let a = lagrangian_radii(&first, c, &[0.1, 0.5, 0.9]);
        let b = lagrangian_radii(&last, c, &[0.1, 0.5, 0.9]);
        for k in 0..3 {
            let drift = b[k] / a[k] - 1.0;
            eprintln!(
                "{c:?} Lagrangian radius {}: {:.3} -> {:.3} ({:+.2}%)",
                [10, 50, 90][k],
                a[k],
                b[k],
                100.0 * drift
            );
            assert!(
                drift.abs() <= 0.05,
                "{c:?} r_{} drifted {drift}",
                [10, 50, 90][k]
            );
        }
    }
    let (h0, h1) = (
        annulus(&first, Component::Disk, rd, 3.0 * rd),
        annulus(&last, Component::Disk, rd, 3.0 * rd),
    );
    let growth = h1.scale_height / h0.scale_height - 1.0;
    eprintln!(
        "disk scale height (1-3 R_d): {:.4} -> {:.4} ({:+.1}%)",
        h0.scale_height,
        h1.scale_height,
        100.0 * growth
    );
    assert!(growth <= 0.15, "scale height grew {growth}");
    let (s0, s1) = (
        annulus(&first, Component::Disk, 1.8 * rd, 2.2 * rd),
        annulus(&last, Component::Disk, 1.8 * rd, 2.2 * rd),
    );
    let sdrift = s1.sigma_r / s0.sigma_r - 1.0;
    eprintln!(
        "sigma_R at 2 R_d: {:.2} -> {:.2} ({:+.1}%)",
        s0.sigma_r,
        s1.sigma_r,
        100.0 * sdrift
    );
    assert!(sdrift.abs() <= 0.10, "sigma_R drifted {sdrift}");
    let (b0, b1) = (
        a2(&first, Component::Disk, 3.0 * rd),
        a2(&last, Component::Disk, 3.0 * rd),
    );
    eprintln!("A2 (R < 3 R_d): {b0:.4} -> {b1:.4}");
    assert!(b1 <= 0.05, "bar amplitude {b1}");
    let d = Diagnostics::read(&dir.path().join("runs").join(name).join("diagnostics.csv"));
    let de = d
        .column("rel_energy_error")
        .iter()
        .fold(0.0f64, |m, x| m.max(x.abs()));
    let lz = d.column("lz");
    let dlz = lz
        .iter()
        .fold(0.0f64, |m, x| m.max((x / lz[0] - 1.0).abs()));
    eprintln!(
        "{} steps, max |dE/E| {de:e}, max |dLz/Lz| {dlz:e}",
        d.rows.len() - 1
    );
    assert!(de <= 1e-3 && dlz <= 1e-3);
}
