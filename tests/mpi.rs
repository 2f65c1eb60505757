//! MPI ranks (`cargo nextest run --features mpi`, needs `mpirun` from openmpi-bin): a run and
//! a force evaluation under `mpirun -n 2` / `-n 3` give the same bits as the same number of
//! thread ranks, on the CPU and on the GPU backend (the emulated driver of
//! tests/gpu_emulated.rs), and a failure stops every rank with a clear message.
#![cfg(feature = "mpi")]

mod common;

use common::*;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// `mpirun -n ranks leapfmm args…` in `dir` (as root too, more ranks than cores allowed).
fn mpirun(dir: &Path, ranks: usize, args: &[&str]) -> Output {
    mpirun_with(dir, ranks, args, &[])
}

/// `mpirun` with the variables `env` set for every rank.
fn mpirun_with(
    dir: &Path,
    ranks: usize,
    args: &[&str],
    env: &[(&str, &std::ffi::OsStr)],
) -> Output {
    let mut cmd = Command::new("mpirun");
    cmd.current_dir(dir).args([
        "--allow-run-as-root",
        "--oversubscribe",
        "-n",
        &ranks.to_string(),
    ]);
    for (name, value) in env {
        cmd.args(["-x", name]).env(name, value);
    }
    cmd.arg(env!("CARGO_BIN_EXE_leapfmm"))
        .args(args)
        .env("OMPI_MCA_rmaps_base_oversubscribe", "1")
        .output()
        .expect("mpirun starts (install openmpi-bin)")
}

fn galaxy_config(dir: &Path, name: &str) -> std::path::PathBuf {
    let text = galaxy_text(name);
    write(dir, &format!("{name}.toml"), &text)
}

/// The galaxy run's config text (20 fixed steps of 12000 particles).
fn galaxy_text(name: &str) -> String {
    format!(
        r#"name = "{name}"
output_dir = "runs"
seed = 3
units = "galactic"

[ics]
model = "{model}"
n = 12000

[gravity]
solver = "fmm"
softening = 0.05

[integrator]
t_end = 0.02
dt_max = 0.001
fixed_step = true

[output]
snapshot_interval = 0.02
checkpoint_interval = 0.01
snapshot_precision = "double"
"#,
        model = repo("ics/small_disk.toml").display()
    )
}

fn final_state(run: &Path, ranks: usize) -> Vec<Vec<u8>> {
    (0..ranks)
        .flat_map(|r| {
            let f = run.join(format!("snapshots/snapdir_001/snap_001.{r}.hdf5"));
            ["PartType1", "PartType2"].into_iter().flat_map(move |pt| {
                [
                    dataset_bytes(&f, &format!("{pt}/Coordinates")),
                    dataset_bytes(&f, &format!("{pt}/Velocities")),
                ]
            })
        })
        .collect()
}

#[test]
fn mpi_ranks_run_like_thread_ranks() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for ranks in [2, 3] {
        let mpi = galaxy_config(d, &format!("mpi{ranks}"));
        let out = mpirun(d, ranks, &["run", mpi.to_str().unwrap(), "--quiet"]);
        assert!(
            out.status.success(),
            "mpirun -n {ranks} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let threads = galaxy_config(d, &format!("threads{ranks}"));
        let r = ranks.to_string();
        let out = run_in(
            d,
            &["run", threads.to_str().unwrap(), "--quiet", "--ranks", &r],
        );
        assert!(out.status.success());
        let a = final_state(&d.join(format!("runs/mpi{ranks}")), ranks);
        let b = final_state(&d.join(format!("runs/threads{ranks}")), ranks);
        assert!(a == b, "{ranks} MPI ranks differ from {ranks} thread ranks");
        let manifest = d.join(format!(
            "runs/mpi{ranks}/checkpoints/checkpoint_000000000020.manifest"
        ));
        assert!(
            manifest.is_file(),
            "the MPI run commits rank checkpoint sets"
        );
    }
}

/// Two galaxies on an orbit in a rigid external potential (issue 40): MPI ranks give the
/// thread ranks' bits.
#[test]
fn mpi_ranks_run_galaxies_in_an_external_potential_like_thread_ranks() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let model = repo("ics/small_disk.toml").display().to_string();
    let text = |name: &str| {
        galaxy_text(name)
            .replace(
                &format!("[ics]\nmodel = \"{model}\"\nn = 12000\n"),
                &format!(
                    "[[ics.galaxies]]\nmodel = \"{model}\"\nn = 6000\n\
                     [[ics.galaxies]]\nmodel = \"{model}\"\nn = 6000\ninclination = 45.0\n\
                     [ics.orbit]\nseparation = 50.0\npericentre = 5.0\n"
                ),
            )
            .replace(
                "softening = 0.05\n",
                "softening = 0.05\n[[gravity.external]]\nprofile = \"plummer\"\nmass = 20.0\nscale_radius = 30.0\n",
            )
    };
    assert!(text("x").contains("ics.galaxies") && text("x").contains("gravity.external"));
    let mpi = write(d, "mpi.toml", &text("mpi"));
    let out = mpirun(d, 2, &["run", mpi.to_str().unwrap(), "--quiet"]);
    assert!(
        out.status.success(),
        "mpirun -n 2 failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let threads = write(d, "threads.toml", &text("threads"));
    let out = run_in(
        d,
        &["run", threads.to_str().unwrap(), "--quiet", "--ranks", "2"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let a = final_state(&d.join("runs/mpi"), 2);
    let b = final_state(&d.join("runs/threads"), 2);
    assert!(a == b, "2 MPI ranks differ from 2 thread ranks");
}

#[test]
fn mpi_forces_match_thread_ranks() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let model = repo("ics/small_disk.toml");
    let out = run_in(
        d,
        &[
            "ics",
            model.to_str().unwrap(),
            "--n",
            "20000",
            "-o",
            "ic.hdf5",
        ],
    );
    assert!(out.status.success());
    let mpi = mpirun(
        d,
        3,
        &["forces", "ic.hdf5", "--softening", "0.05", "-o", "mpi.hdf5"],
    );
    assert!(
        mpi.status.success(),
        "{}",
        String::from_utf8_lossy(&mpi.stderr)
    );
    assert!(String::from_utf8_lossy(&mpi.stdout).contains("on 3 ranks"));
    let threads = run_in(
        d,
        &[
            "forces",
            "ic.hdf5",
            "--softening",
            "0.05",
            "-o",
            "threads.hdf5",
            "--ranks",
            "3",
        ],
    );
    assert!(threads.status.success());
    for pt in ["PartType1", "PartType2"] {
        for ds in ["Acceleration", "Potential"] {
            let name = format!("{pt}/{ds}");
            assert!(
                dataset_bytes(&d.join("mpi.hdf5"), &name)
                    == dataset_bytes(&d.join("threads.hdf5"), &name),
                "{name} differs"
            );
        }
    }
}

#[test]
fn a_failure_under_mpirun_stops_every_rank_with_a_message() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let start = Instant::now();
    let out = mpirun(d, 2, &["forces", "missing.hdf5", "--softening", "0.05"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("missing.hdf5"), "{err}");
    assert!(start.elapsed() < Duration::from_secs(60), "no hang");
}

#[test]
#[cfg(feature = "cuda")]
fn mpi_ranks_on_the_emulated_gpus_run_like_thread_ranks() {
    // The GPU backend on the emulated driver (tests/gpu_emulated.rs), 4 steps. The MPI ranks
    // on one device, which they share: the payload through MPI; on two: through NCCL (its
    // id made on rank 0 and sent over MPI). The thread ranks on two (one each, as they
    // must): through NCCL. The same bits, all three.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let driver = emulation::driver();
    let short = |name: &str| {
        let text = galaxy_text(name)
            .replace("t_end = 0.02", "t_end = 0.004")
            .replace("snapshot_interval = 0.02", "snapshot_interval = 0.004")
            .replace("checkpoint_interval = 0.01", "checkpoint_interval = 0.002");
        write(d, &format!("{name}.toml"), &text)
    };
    let gpus = |k: &'static str| {
        [
            ("LD_LIBRARY_PATH", driver.as_os_str()),
            ("HOME", d.as_os_str()),
            ("TMPDIR", d.as_os_str()),
            ("LEAPFMM_EMULATED_GPUS", std::ffi::OsStr::new(k)),
        ]
    };
    for (name, k, route) in [
        ("mpi_one_gpu", "1", "through the host"),
        ("mpi_two_gpus", "2", "through NCCL"),
    ] {
        let config = short(name);
        let args = ["run", config.to_str().unwrap(), "--backend", "cuda"];
        let out = mpirun_with(d, 2, &args, &gpus(k));
        let text = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{text}");
        assert!(text.contains("solver 'fmm-cuda'"), "{text}");
        assert!(
            text.contains(&format!("the LET payload moves between the GPUs {route}")),
            "{text}"
        );
    }
    let config = short("threads_gpus");
    let out = bin()
        .current_dir(d)
        .envs(gpus("2"))
        .args([
            "run",
            config.to_str().unwrap(),
            "--backend",
            "cuda",
            "--ranks",
            "2",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let threads = final_state(&d.join("runs/threads_gpus"), 2);
    for name in ["mpi_one_gpu", "mpi_two_gpus"] {
        assert!(
            final_state(&d.join("runs").join(name), 2) == threads,
            "{name} differs from 2 thread ranks on 2 GPUs"
        );
    }
}
