//! Restart is bit-exact: a run straight to T and a run interrupted (SIGTERM at a random
//! moment; kill -9 after a checkpoint; kill -9 in the middle of writing a checkpoint) and
//! resumed to T end with identical positions and velocities.

mod common;

use common::*;
use leapfmm::io::checkpoint::STALL_ENV;
use rand::RngExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

const T_END: f64 = 16.0;

/// The run's gravity: direct summation, or for the runs named `accurate*` the FMM with an
/// accuracy target (whose walk depends on the last evaluation's accelerations, so a resume
/// must bring those back exactly).
fn setup(name: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = plummer_config(
        name,
        2000,
        T_END,
        0.03125,
        "",
        "snapshot_interval = 8.0\ncheckpoint_interval = 4.0\nsnapshot_precision = \"double\"\nkeep_checkpoints = 10",
    );
    if name.starts_with("accurate") {
        cfg = cfg.replace(
            "solver = \"direct\"",
            "solver = \"fmm\"\nleaf_size = 32\naccuracy = 1e-3",
        );
    }
    let path = write(dir.path(), "run.toml", &cfg);
    (dir, path)
}

fn spawn(dir: &Path, config: &Path, resume: bool, env: Option<(&str, &str)>) -> Child {
    let mut cmd = bin();
    cmd.current_dir(dir).arg("run").arg(config).arg("--quiet");
    if resume {
        cmd.arg("--resume");
    }
    if let Some((k, v)) = env {
        cmd.env(k, v);
    }
    cmd.stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn finish(child: Child) -> (i32, String) {
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

fn final_snapshot(dir: &Path, name: &str) -> PathBuf {
    // Snapshots at t = 0, 8, 16.
    dir.join("runs").join(name).join("snapshots/snap_002.hdf5")
}

/// Runs straight to the end; returns the final state's bytes and the wall time taken.
fn straight(name: &str) -> (Vec<u8>, Vec<u8>, Duration) {
    let (dir, cfg) = setup(name);
    let start = Instant::now();
    let (code, err) = finish(spawn(dir.path(), &cfg, false, None));
    assert_eq!(code, 0, "straight run failed: {err}");
    let snap = final_snapshot(dir.path(), name);
    (
        dataset_bytes(&snap, "PartType4/Coordinates"),
        dataset_bytes(&snap, "PartType4/Velocities"),
        start.elapsed(),
    )
}

fn resume_and_compare(
    dir: &Path,
    cfg: &Path,
    name: &str,
    reference: &(Vec<u8>, Vec<u8>, Duration),
) {
    let (code, err) = finish(spawn(dir, cfg, true, None));
    assert_eq!(code, 0, "resumed run failed: {err}");
    let snap = final_snapshot(dir, name);
    assert!(
        dataset_bytes(&snap, "PartType4/Coordinates") == reference.0,
        "positions differ after restart"
    );
    assert!(
        dataset_bytes(&snap, "PartType4/Velocities") == reference.1,
        "velocities differ after restart"
    );
}

fn checkpoints(dir: &Path, name: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir.join("runs").join(name).join("checkpoints"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().to_string())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn sigterm_at_a_random_moment_then_resume_is_bit_exact() {
    let reference = straight("term");
    let (dir, cfg) = setup("term");
    let fraction = rand::rng().random_range(0.1..0.45);
    let delay = reference.2.mul_f64(fraction);
    eprintln!("sending SIGTERM after {delay:?} ({fraction:.2} of the straight run)");
    let child = spawn(dir.path(), &cfg, false, None);
    std::thread::sleep(delay);
    // SAFETY: plain kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let (code, err) = finish(child);
    assert_eq!(
        code,
        i32::from(leapfmm::simulation::EXIT_STOPPED),
        "the run should stop on SIGTERM: {err}"
    );
    assert!(
        !final_snapshot(dir.path(), "term").exists(),
        "the signal arrived after the run finished; the test proved nothing"
    );
    resume_and_compare(dir.path(), &cfg, "term", &reference);
}

/// Kills the run `name` (SIGKILL) once it has written a mid-run checkpoint, then resumes
/// it and compares with a straight run.
fn kill_9_after_a_checkpoint_then_resume(name: &str) {
    let reference = straight(name);
    let (dir, cfg) = setup(name);
    let mut child = spawn(dir.path(), &cfg, false, None);
    // Checkpoints at steps 0 and at t = 4, 8, 12, 16: wait for the second one.
    wait_for("a mid-run checkpoint", || {
        checkpoints(dir.path(), name)
            .iter()
            .filter(|n| n.ends_with(".ckpt"))
            .count()
            >= 2
    });
    child.kill().unwrap();
    let _ = child.wait();
    assert!(!final_snapshot(dir.path(), name).exists());
    resume_and_compare(dir.path(), &cfg, name, &reference);
}

#[test]
fn kill_9_after_a_checkpoint_then_resume_is_bit_exact() {
    kill_9_after_a_checkpoint_then_resume("kill");
}

#[test]
fn with_an_accuracy_target_kill_9_then_resume_is_bit_exact() {
    kill_9_after_a_checkpoint_then_resume("accurate");
}

#[test]
fn kill_9_while_writing_a_checkpoint_leaves_the_previous_one_usable() {
    let reference = straight("mid");
    let (dir, cfg) = setup("mid");
    // Every checkpoint write stalls halfway for 1.5 s; kill during the stall of the second.
    let mut child = spawn(dir.path(), &cfg, false, Some((STALL_ENV, "1500")));
    wait_for("the second checkpoint to be half written", || {
        let names = checkpoints(dir.path(), "mid");
        names.iter().any(|n| n.ends_with(".ckpt")) && names.iter().any(|n| n.ends_with(".tmp"))
    });
    child.kill().unwrap();
    let _ = child.wait();
    let names = checkpoints(dir.path(), "mid");
    let complete: Vec<&String> = names.iter().filter(|n| n.ends_with(".ckpt")).collect();
    assert_eq!(
        complete.len(),
        1,
        "only the first checkpoint is complete: {names:?}"
    );
    let previous = dir.path().join("runs/mid/checkpoints").join(complete[0]);
    let info = run_in(dir.path(), &["info", previous.to_str().unwrap()]);
    assert!(
        info.status.success(),
        "previous checkpoint unusable: {}",
        String::from_utf8_lossy(&info.stderr)
    );
    assert!(String::from_utf8_lossy(&info.stdout).contains("checksum verified"));
    resume_and_compare(dir.path(), &cfg, "mid", &reference);
}
