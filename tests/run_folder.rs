//! Run-folder integrity: a rank checkpoint set is verified as a whole (an edited manifest, a
//! rank file from another set, a wrong particle count or duplicate IDs make the set fall back
//! to the previous one, and `info` says why); one writer per run folder; a resume leaves one
//! trajectory; repeated SIGTERM still ends in a checkpoint.

mod common;

use common::*;
use leapfmm::io::checkpoint::{self, Entry, RankIdentity, STALL_ENV, SetSummary};
use leapfmm::io::lock::LOCK_FILE;
use leapfmm::simulation::{Checkpoint, EXIT_ABORTED, EXIT_STOPPED};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

const N: usize = 300;

/// A 300-particle Plummer run of 10 steps with the FMM, a checkpoint every 2 steps
/// (all kept) and a snapshot every 5.
fn config(dir: &Path, name: &str) -> PathBuf {
    let text = plummer_config(
        name,
        N,
        0.5,
        0.05,
        "fixed_step = true",
        "checkpoint_interval = 0.1\nkeep_checkpoints = 10\nsnapshot_interval = 0.25\nsnapshot_precision = \"double\"",
    );
    let text = text.replace("solver = \"direct\"", "solver = \"fmm\"");
    write(dir, &format!("{name}.toml"), &text)
}

fn run(dir: &Path, cfg: &Path, ranks: usize, resume: bool) -> Output {
    let ranks = ranks.to_string();
    let mut args = vec!["run", cfg.to_str().unwrap(), "--ranks", &ranks];
    if resume {
        args.push("--resume");
    }
    run_in(dir, &args)
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).to_string()
}

fn ckpt_dir(dir: &Path, name: &str) -> PathBuf {
    dir.join("runs").join(name).join("checkpoints")
}

/// A finished 3-rank run: its checkpoint folder holds sets at steps 0, 2, …, 10.
fn finished_three_rank_run(name: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), name);
    let out = run(dir.path(), &cfg, 3, false);
    assert!(out.status.success(), "{}", stderr(&out));
    (dir, cfg)
}

/// `info` on the manifest fails naming `needle`; a resume sets the step-10 set aside,
/// resumes from step 8's and finishes with every particle once.
fn assert_set_rejected(dir: &Path, cfg: &Path, name: &str, needle: &str) {
    let manifest = ckpt_dir(dir, name).join(checkpoint::manifest_name(10));
    let info = run_in(dir, &["info", manifest.to_str().unwrap()]);
    assert_eq!(info.status.code(), Some(1), "{}", stderr(&info));
    assert!(stderr(&info).contains(needle), "{}", stderr(&info));
    let out = run(dir, cfg, 3, true);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(err.contains(needle) && err.contains("set aside"), "{err}");
    assert!(
        err.contains(&checkpoint::manifest_name(8)),
        "resumes from step 8: {err}"
    );
    let snap = dir
        .join("runs")
        .join(name)
        .join("snapshots/snapdir_002/snap_002.0.hdf5");
    let mut ids = leapfmm::io::snapshot::read_snapshot(&snap)
        .unwrap()
        .particles
        .id;
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), N, "every particle once in the final snapshot");
}

#[test]
fn a_manifest_edited_to_one_rank_is_set_aside() {
    let (dir, cfg) = finished_three_rank_run("edited");
    let manifest = ckpt_dir(dir.path(), "edited").join(checkpoint::manifest_name(10));
    let text = fs::read_to_string(&manifest).unwrap();
    assert!(text.contains("\"ranks\": 3"), "{text}");
    fs::write(&manifest, text.replace("\"ranks\": 3", "\"ranks\": 1")).unwrap();
    assert_set_rejected(dir.path(), &cfg, "edited", "checksum");
}

#[test]
fn a_rank_file_from_another_set_is_set_aside() {
    let (dir, cfg) = finished_three_rank_run("copied");
    let d = ckpt_dir(dir.path(), "copied");
    fs::copy(
        checkpoint::rank_file(&d, 6, 1),
        checkpoint::rank_file(&d, 10, 1),
    )
    .unwrap();
    assert_set_rejected(dir.path(), &cfg, "copied", "SHA-256");
}

/// Rewrites the step-10 set through the library (so every digest and checksum is right)
/// after `edit` changed its particles.
fn rewrite_set(d: &Path, edit: impl FnOnce(&mut Vec<Checkpoint>)) {
    let entry = Entry::Set {
        manifest: d.join(checkpoint::manifest_name(10)),
        folder: checkpoint::set_folder(d, 10),
    };
    let loaded = checkpoint::read_entry::<Checkpoint>(&entry).unwrap();
    let m = loaded.manifest.unwrap();
    let mut payloads = loaded.payloads;
    edit(&mut payloads);
    let set_id = u64::from_str_radix(&m.set_id, 16).unwrap();
    let files = payloads
        .iter()
        .enumerate()
        .map(|(r, p)| {
            let identity = RankIdentity {
                set_id,
                step: 10,
                rank: r as u32,
                ranks: 3,
            };
            let digest = checkpoint::write_rank(d, identity, p).unwrap();
            (digest, p.particles.len() as u64)
        })
        .collect();
    let summary = SetSummary {
        set_id,
        step: 10,
        time: m.time,
        files,
    };
    checkpoint::commit_set(d, &summary, 10).unwrap();
}

#[test]
fn a_set_with_the_wrong_count_or_duplicate_ids_is_set_aside() {
    let (dir, cfg) = finished_three_rank_run("count");
    let d = ckpt_dir(dir.path(), "count");
    rewrite_set(&d, |p| {
        let keep = p[1].particles.len() - 7;
        p[1].particles = p[1].particles.slice(0..keep);
    });
    assert_set_rejected(dir.path(), &cfg, "count", &format!("its run has n = {N}"));

    let (dir, cfg) = finished_three_rank_run("dupes");
    let d = ckpt_dir(dir.path(), "dupes");
    rewrite_set(&d, |p| {
        let id = p[0].particles.id[0];
        p[2].particles.id[3] = id;
    });
    assert_set_rejected(dir.path(), &cfg, "dupes", "appears more than once");
}

/// Spawns `leapfmm run` in `dir` with stderr piped and `env` set.
fn spawn(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Child {
    let mut cmd = bin();
    cmd.current_dir(dir).args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn finish(child: Child) -> (Option<i32>, String) {
    let out = child.wait_with_output().unwrap();
    (out.status.code(), stderr(&out))
}

/// Steps of the checkpoints (single files or sets) in a run's checkpoint folder.
fn checkpoint_steps(dir: &Path, name: &str) -> Vec<u64> {
    checkpoint::list(&ckpt_dir(dir, name))
        .unwrap()
        .into_iter()
        .map(|(step, _)| step)
        .collect()
}

#[test]
fn a_second_writer_is_refused_with_the_pid_and_kill_9_leaves_no_stale_lock() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "locked");
    let cfg_s = cfg.to_str().unwrap();
    // Every checkpoint write stalls 1 s: the holder is alive for the whole test.
    let mut holder = spawn(dir.path(), &["run", cfg_s], &[(STALL_ENV, "1000")]);
    let pid = holder.id();
    let lock = dir.path().join("runs/locked").join(LOCK_FILE);
    wait_for("the holder to take the lock", || {
        fs::read_to_string(&lock).is_ok_and(|t| t.trim() == pid.to_string())
    });
    for args in [
        vec!["run", cfg_s],
        vec!["run", cfg_s, "--resume"],
        vec!["run", cfg_s, "--resume", "--ranks", "2"],
    ] {
        let started = Instant::now();
        let out = run_in(dir.path(), &args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.contains(&format!("another leapfmm process (PID {pid})")),
            "{args:?}: {err}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "refused at once"
        );
    }
    assert!(
        !dir.path()
            .join("runs/locked/snapshots/snapdir_000")
            .exists(),
        "the refused 2-rank run wrote nothing"
    );
    holder.kill().unwrap();
    let _ = holder.wait();
    let out = run(dir.path(), &cfg, 1, true);
    assert!(out.status.success(), "after kill -9: {}", stderr(&out));
}

#[test]
fn two_fresh_starts_racing_leave_one_run() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "race");
    let cfg_s = cfg.to_str().unwrap();
    let a = spawn(dir.path(), &["run", cfg_s, "--quiet"], &[]);
    let b = spawn(dir.path(), &["run", cfg_s, "--quiet"], &[]);
    let (a, b) = (finish(a), finish(b));
    for (code, err) in [&a, &b] {
        assert!(!err.contains("renaming into place"), "{err}");
        assert!(
            *code == Some(0)
                || err.contains("another leapfmm process")
                || err.contains("already holds a run"),
            "{code:?}: {err}"
        );
    }
    assert!(
        a.0 == Some(0) || b.0 == Some(0),
        "one of the two finished: {a:?} {b:?}"
    );
    // One trajectory: single-file snapshots 0..=2 and nothing else.
    let mut snaps: Vec<String> = fs::read_dir(dir.path().join("runs/race/snapshots"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    snaps.sort();
    assert_eq!(snaps, ["snap_000.hdf5", "snap_001.hdf5", "snap_002.hdf5"]);
}

/// Removes the checkpoints taken after `step` so that a resume starts there.
fn keep_checkpoints_up_to(dir: &Path, name: &str, step: u64) {
    for (s, entry) in checkpoint::list(&ckpt_dir(dir, name)).unwrap() {
        if s > step {
            match entry {
                Entry::File(path) => fs::remove_file(path).unwrap(),
                Entry::Set { manifest, folder } => {
                    fs::remove_file(manifest).unwrap();
                    fs::remove_dir_all(folder).unwrap();
                }
            }
        }
    }
}

fn snapshot_names(dir: &Path, name: &str) -> Vec<String> {
    let root = dir.join("runs").join(name).join("snapshots");
    let mut names = Vec::new();
    for e in fs::read_dir(&root).unwrap().flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        if e.path().is_dir() {
            for f in fs::read_dir(e.path()).unwrap().flatten() {
                names.push(format!("{n}/{}", f.file_name().to_string_lossy()));
            }
        } else {
            names.push(n);
        }
    }
    names.sort();
    names
}

#[test]
fn resuming_on_fewer_ranks_leaves_one_trajectory() {
    let (dir, cfg) = finished_three_rank_run("shrink");
    let d = dir.path();
    // Resume 3 → 2 from step 4 (one snapshot written before it).
    keep_checkpoints_up_to(d, "shrink", 4);
    let out = run(d, &cfg, 2, true);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        snapshot_names(d, "shrink"),
        [
            "snapdir_000/snap_000.0.hdf5",
            "snapdir_000/snap_000.1.hdf5",
            "snapdir_000/snap_000.2.hdf5",
            "snapdir_001/snap_001.0.hdf5",
            "snapdir_001/snap_001.1.hdf5",
            "snapdir_002/snap_002.0.hdf5",
            "snapdir_002/snap_002.1.hdf5",
        ]
    );
    // Then 2 → 1 from step 4 again: the single-file layout replaces the folders.
    keep_checkpoints_up_to(d, "shrink", 4);
    let out = run(d, &cfg, 1, true);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        snapshot_names(d, "shrink"),
        [
            "snap_001.hdf5",
            "snap_002.hdf5",
            "snapdir_000/snap_000.0.hdf5",
            "snapdir_000/snap_000.1.hdf5",
            "snapdir_000/snap_000.2.hdf5",
        ]
    );
    let snap = d.join("runs/shrink/snapshots/snap_002.hdf5");
    let p = leapfmm::io::snapshot::read_snapshot(&snap)
        .unwrap()
        .particles;
    assert_eq!(p.len(), N);
}

/// A 2000-particle direct-summation run long enough (~200 steps) to be signalled mid-way;
/// checkpoints only at the start, the end and a stop.
fn long_config(dir: &Path, name: &str) -> PathBuf {
    let text = plummer_config(name, 2000, 6.25, 0.03125, "", "keep_checkpoints = 10");
    write(dir, &format!("{name}.toml"), &text)
}

#[test]
fn sigterm_sent_twice_still_ends_in_a_checkpoint_of_the_stop() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = long_config(dir.path(), "term");
    let child = spawn(dir.path(), &["run", cfg.to_str().unwrap(), "--quiet"], &[]);
    let csv = dir.path().join("runs/term/diagnostics.csv");
    wait_for("a few steps", || {
        fs::read_to_string(&csv).is_ok_and(|t| t.lines().count() > 3)
    });
    // As GNU timeout and batch schedulers do: to the process, then again.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    std::thread::sleep(Duration::from_millis(20));
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let (code, err) = finish(child);
    assert_eq!(
        code,
        Some(i32::from(EXIT_STOPPED)),
        "a clean stop after two SIGTERMs: {err}"
    );
    let steps = checkpoint_steps(dir.path(), "term");
    let last = *steps.iter().max().unwrap();
    assert!(
        last > 0 && last < 200,
        "a checkpoint of the stop: {steps:?}"
    );
}

#[test]
fn a_second_sigint_exits_at_once_with_its_own_status() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = long_config(dir.path(), "int");
    // The step-0 checkpoint write stalls 5 s: the second SIGINT must not wait for it.
    let child = spawn(
        dir.path(),
        &["run", cfg.to_str().unwrap(), "--quiet"],
        &[(STALL_ENV, "5000")],
    );
    let ckpts = ckpt_dir(dir.path(), "int");
    wait_for("the first checkpoint write", || {
        fs::read_dir(&ckpts).is_ok_and(|d| {
            d.flatten()
                .any(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        })
    });
    let started = Instant::now();
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    std::thread::sleep(Duration::from_millis(50));
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let (code, err) = finish(child);
    assert_eq!(code, Some(EXIT_ABORTED), "{err}");
    assert!(started.elapsed() < Duration::from_secs(3), "exited at once");
}

#[test]
fn a_checkpoint_write_that_fails_leaves_no_temporary_file() {
    // A file-size limit (SIGXFSZ ignored, so writes fail with EFBIG) stands in for a full
    // disk: the ~0.3 MB checkpoint does not fit, the ~0.1 MB snapshot does.
    let dir = tempfile::tempdir().unwrap();
    let text = plummer_config(
        "full",
        3000,
        0.5,
        0.05,
        "",
        "snapshot_precision = \"single\"",
    );
    let cfg = write(dir.path(), "full.toml", &text);
    let script = format!(
        "trap '' XFSZ; ulimit -f 200; exec {} run {} --quiet",
        env!("CARGO_BIN_EXE_leapfmm"),
        cfg.display()
    );
    let out = std::process::Command::new("bash")
        .current_dir(dir.path())
        .args(["-c", &script])
        .output()
        .unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(".ckpt.tmp") && err.contains("File too large"),
        "the checkpoint write fails: {err}"
    );
    let left: Vec<String> = fs::read_dir(ckpt_dir(dir.path(), "full"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(left.is_empty(), "nothing half-written is left: {left:?}");
}

#[test]
fn a_closed_pipe_does_not_kill_a_run() {
    // `leapfmm run X.toml 2>&1 | head -1`: the reader goes away before the run's first line.
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "piped");
    let mut child = bin()
        .current_dir(dir.path())
        .args(["run", cfg.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    drop(child.stderr.take());
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{status:?}");
    let last = dir.path().join("runs/piped/snapshots/snapdir_002");
    let single = dir.path().join("runs/piped/snapshots/snap_002.hdf5");
    assert!(
        single.exists() || last.exists(),
        "the run went on to its end"
    );
}

/// A library caller (the Python module) stops a run with `RunOptions::stop` instead of a
/// signal: no handlers are installed, the run ends its step with a checkpoint of the stop,
/// and a resume finishes it.
#[test]
fn a_stop_requested_by_the_caller_ends_in_a_checkpoint_and_resumes() {
    use leapfmm::config::RunSpec;
    use leapfmm::simulation::{RunOptions, RunOutcome, StopRequest, run as run_spec};
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "stopped");
    let runs = dir.path().join("runs");
    let text = fs::read_to_string(&cfg).unwrap().replace(
        "output_dir = \"runs\"",
        &format!("output_dir = \"{}\"", runs.display()),
    );
    fs::write(&cfg, text).unwrap();
    let spec = RunSpec::load(&cfg).unwrap();
    let stop = StopRequest::new();
    stop.request();
    let options = RunOptions {
        quiet: true,
        resume: true,
        stop: Some(stop),
        ..RunOptions::default()
    };
    match run_spec(&spec, options.clone()).unwrap() {
        RunOutcome::Interrupted { signal, time, .. } => {
            assert_eq!(signal, 2);
            assert!(
                time > 0.0 && time < 0.5,
                "stopped after its first step: {time}"
            );
        }
        other => panic!("not stopped: {other:?}"),
    }
    assert!(checkpoint_steps(dir.path(), "stopped").contains(&1));
    let options = RunOptions {
        stop: Some(StopRequest::new()),
        ..options
    };
    assert!(matches!(
        run_spec(&spec, options).unwrap(),
        RunOutcome::Finished { steps: 10, .. }
    ));
}
