//! Runs on K thread ranks (`leapfmm run --ranks K`): a galaxy run on 4 ranks conserves energy
//! and momentum as well as on one rank; a 4-rank run killed after a checkpoint resumes
//! bit-exactly on 4 ranks and resumes on 2 (redistribution); caps presets make a second run
//! retry-free from step 0; snapshots are GADGET multi-file sets.

mod common;

use common::*;
use leapfmm::io::snapshot::read_snapshot;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// 20 000 particles of the small disk galaxy, 100 fixed steps of 1 Myr (half a rotation at
/// the disk's scale length), snapshots every 50 steps, checkpoints every 10.
fn galaxy_config(dir: &Path, name: &str) -> PathBuf {
    let text = format!(
        r#"name = "{name}"
output_dir = "runs"
seed = 11
units = "galactic"

[ics]
model = "{model}"
n = 20000

[gravity]
solver = "fmm"
softening = 0.05
kernel = "spline"

[integrator]
t_end = 0.1
dt_max = 0.001
fixed_step = true

[output]
snapshot_interval = 0.05
checkpoint_interval = 0.01
keep_checkpoints = 20
snapshot_precision = "double"
"#,
        model = repo("ics/small_disk.toml").display()
    );
    write(dir, &format!("{name}.toml"), &text)
}

fn run(dir: &Path, config: &Path, ranks: usize, resume: bool) {
    let ranks = ranks.to_string();
    let mut args = vec![
        "run",
        config.to_str().unwrap(),
        "--quiet",
        "--ranks",
        &ranks,
    ];
    if resume {
        args.push("--resume");
    }
    let out = run_in(dir, &args);
    assert!(
        out.status.success(),
        "run failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn run_dir(dir: &Path, name: &str) -> PathBuf {
    dir.join("runs").join(name)
}

/// Largest |x(t) - x(0)| over the rows of a diagnostics column.
fn max_drift(values: &[f64]) -> f64 {
    values
        .iter()
        .map(|v| (v - values[0]).abs())
        .fold(0.0, f64::max)
}

/// Positions by particle ID of the final snapshot (t = 0.1, the third), any file layout.
fn final_positions(run: &Path, ranks: usize) -> HashMap<u64, [f64; 3]> {
    let path = if ranks == 1 {
        run.join("snapshots/snap_002.hdf5")
    } else {
        run.join("snapshots/snapdir_002/snap_002.0.hdf5")
    };
    let _hdf5 = hdf5_lock();
    let data = read_snapshot(&path).unwrap();
    assert_eq!(data.files.len(), ranks, "one file per rank");
    let p = data.particles;
    (0..p.len()).map(|i| (p.id[i], p.pos[i])).collect()
}

/// Median and 99th percentile of the distance between the same particles of two states (a
/// few particles in close encounters diverge faster; the bulk must agree to the FMM's
/// accuracy).
fn separations(a: &HashMap<u64, [f64; 3]>, b: &HashMap<u64, [f64; 3]>) -> (f64, f64) {
    let mut d: Vec<f64> = a
        .iter()
        .map(|(id, x)| {
            let y = b[id];
            ((x[0] - y[0]).powi(2) + (x[1] - y[1]).powi(2) + (x[2] - y[2]).powi(2)).sqrt()
        })
        .collect();
    d.sort_by(f64::total_cmp);
    (d[d.len() / 2], d[d.len() * 99 / 100])
}

fn final_files(run: &Path, ranks: usize) -> Vec<(Vec<u8>, Vec<u8>)> {
    (0..ranks)
        .map(|r| {
            let f = run.join(format!("snapshots/snapdir_002/snap_002.{r}.hdf5"));
            let mut pos = Vec::new();
            let mut vel = Vec::new();
            for pt in [1, 2] {
                pos.extend(dataset_bytes(&f, &format!("PartType{pt}/Coordinates")));
                vel.extend(dataset_bytes(&f, &format!("PartType{pt}/Velocities")));
            }
            (pos, vel)
        })
        .collect()
}

/// Starts a 4-rank run, kills it (SIGKILL) as soon as the checkpoint of step 20 is
/// committed, and checks that it had not finished.
fn killed_after_step_20(dir: &Path, config: &Path, name: &str) {
    let mut child = bin()
        .current_dir(dir)
        .args(["run", config.to_str().unwrap(), "--quiet", "--ranks", "4"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let manifest = run_dir(dir, name).join("checkpoints/checkpoint_000000000020.manifest");
    let start = Instant::now();
    while !manifest.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "no checkpoint at step 20"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        !run_dir(dir, name).join("snapshots/snapdir_002").exists(),
        "the run finished before it was killed; the test needs a longer run"
    );
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

#[test]
fn four_ranks_conserve_like_one_restart_exactly_and_redistribute() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();

    // Straight runs on 1 and 4 ranks.
    let one = galaxy_config(d, "one");
    run(d, &one, 1, false);
    let four = galaxy_config(d, "four");
    run(d, &four, 4, false);
    let k1 = Diagnostics::read(&run_dir(d, "one").join("diagnostics.csv"));
    let k4 = Diagnostics::read(&run_dir(d, "four").join("diagnostics.csv"));
    let energy = |g: &Diagnostics| {
        g.column("rel_energy_error")
            .iter()
            .map(|e| e.abs())
            .fold(0.0, f64::max)
    };
    let momentum = |g: &Diagnostics| {
        ["px", "py", "pz"]
            .iter()
            .map(|c| max_drift(&g.column(c)).powi(2))
            .sum::<f64>()
            .sqrt()
    };
    let lz = |g: &Diagnostics| {
        let l = g.column("lz");
        max_drift(&l) / l[0].abs()
    };
    eprintln!(
        "|dE/E| K=1 {:.3e} K=4 {:.3e}; |dp| K=1 {:.3e} K=4 {:.3e}; |dLz/Lz| K=1 {:.3e} K=4 {:.3e}",
        energy(&k1),
        energy(&k4),
        momentum(&k1),
        momentum(&k4),
        lz(&k1),
        lz(&k4)
    );
    assert!(
        energy(&k4) <= 1.2 * energy(&k1),
        "energy: K=4 worse than 1.2x K=1"
    );
    // Both drifts are f32 round-off of the near field (~5e-8 here), and which of two
    // round-off figures is larger is a coin flip: between builds they have stood in the
    // ratios 0.9, 1.3 and 1.34 (docs/benchmarks.md). What the comparison must catch is a
    // cross-domain interaction used one way only, which leaves the far field's truncation
    // error (~1e-4 of a force, against f32's ~1e-7) in the momentum: hundreds of times the
    // floor, far above the 4x allowed.
    assert!(
        momentum(&k4) <= 4.0 * momentum(&k1),
        "momentum: K=4 worse than 4x K=1 (round-off)"
    );
    assert!(
        lz(&k4) <= 1.2 * lz(&k1),
        "angular momentum: K=4 worse than 1.2x K=1"
    );

    // Per-rank figures: every rank in ranks.csv, balanced from the second step on.
    let ranks = Diagnostics::read(&run_dir(d, "four").join("ranks.csv"));
    assert_eq!(ranks.rows.len(), 4 * k4.rows.len());
    let imbalance = k4.column("load_imbalance");
    assert!(
        imbalance[1..].iter().all(|&x| x <= 1.10),
        "load imbalance after the first step: {imbalance:?}"
    );
    assert!(k4.column("let_bytes_received").iter().all(|&b| b > 0.0));

    // The same particles at the end, to the FMM's accuracy.
    let p1 = final_positions(&run_dir(d, "one"), 1);
    let p4 = final_positions(&run_dir(d, "four"), 4);
    assert_eq!(p1.len(), 20000);
    assert_eq!(p4.len(), 20000);
    let (median, p99) = separations(&p1, &p4);
    eprintln!("K=1 vs K=4 final positions: median {median:.2e}, p99 {p99:.2e} kpc");
    assert!(
        median < 1e-4 && p99 < 1e-2,
        "K=1 and K=4 runs differ: median {median}, p99 {p99} kpc"
    );

    // Caps presets: no retries after the first step (the evaluations at steps 0 and 1 find
    // the caps for the count-balanced and the work-balanced domains), none at all in a
    // second run of the same size (it starts from the presets the first one recorded).
    let retries = k4.column("fmm_retries");
    assert!(
        retries[2..].iter().all(|&r| r == 0.0),
        "retries after step 1: {retries:?}"
    );
    let again = galaxy_config(d, "again");
    run(d, &again, 4, false);
    let retries =
        Diagnostics::read(&run_dir(d, "again").join("diagnostics.csv")).column("fmm_retries");
    assert!(
        retries.iter().all(|&r| r == 0.0),
        "second run retried: {retries:?}"
    );

    // Killed after step 20, resumed on 4 ranks: the same bits as the straight run.
    let killed = galaxy_config(d, "killed");
    killed_after_step_20(d, &killed, "killed");
    let redistributed = tempfile::tempdir().unwrap();
    copy_dir(
        &run_dir(d, "killed"),
        &run_dir(redistributed.path(), "killed"),
    );
    std::fs::copy(&killed, redistributed.path().join("killed.toml")).unwrap();
    run(d, &killed, 4, true);
    let straight = final_files(&run_dir(d, "four"), 4);
    let resumed = final_files(&run_dir(d, "killed"), 4);
    assert!(straight == resumed, "a 4-rank restart is not bit-exact");

    // The same checkpoint resumed on 2 ranks: it finishes, and agrees with the straight
    // run to the FMM's accuracy.
    let r = redistributed.path();
    run(r, &r.join("killed.toml"), 2, true);
    let p2 = final_positions(&run_dir(r, "killed"), 2);
    assert_eq!(p2.len(), 20000);
    let (median, p99) = separations(&p4, &p2);
    eprintln!("K=4 vs K=4→2 final positions: median {median:.2e}, p99 {p99:.2e} kpc");
    assert!(
        median < 1e-4 && p99 < 1e-2,
        "the 2-rank resume differs: median {median}, p99 {p99} kpc"
    );
}
