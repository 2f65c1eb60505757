//! Run-folder integrity: a rank checkpoint set is verified as a whole (an edited manifest, a
//! rank file from another set, a wrong particle count or duplicate IDs make the set fall back
//! to the previous one, and `info` says why); one writer per run folder; a resume leaves one
//! trajectory; repeated SIGTERM still ends in a checkpoint.

mod common;

use common::*;
use leapfmm::io::checkpoint::{self, Entry, RankIdentity, SetSummary};
use leapfmm::simulation::Checkpoint;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Output;

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
