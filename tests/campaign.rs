//! Campaigns: three tiny runs from one file — one finished then skipped, one killed and
//! resumed, one with a bad value failing alone — and a bad key path stopping the campaign
//! before any run starts.

mod common;

use common::*;
use leapfmm::io::checkpoint::STALL_ENV;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// A campaign of Plummer runs (direct summation, N-body units) with `runs` appended.
fn campaign_text(runs: &str) -> String {
    format!(
        r#"name = "camp"
output_dir = "runs"

[base]
name = "ignored"
seed = 7
units = "nbody"

[base.ics]
model = "{model}"
n = 1500

[base.gravity]
solver = "direct"
softening = 0.05

[base.integrator]
t_end = 0.5
dt_max = 0.03125
fixed_step = true

[base.output]
snapshot_interval = 0.5
checkpoint_interval = 0.25
keep_checkpoints = 10

{runs}
"#,
        model = repo("ics/plummer.toml").display()
    )
}

const RUNS: &str = r#"
[[runs]]
name = "short"

[[runs]]
name = "long"
"integrator.t_end" = 2.0

[[runs]]
name = "bad"
"ics.sphere.mass" = -1.0
"#;

fn checkpoints(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().ends_with(".ckpt"))
                .count()
        })
        .unwrap_or(0)
}

/// Rows of summary.csv as (run, status, final time, steps, reason).
fn summary(dir: &Path) -> Vec<(String, String, String, String, String)> {
    let mut reader = csv::Reader::from_path(dir.join("runs/camp/summary.csv")).unwrap();
    reader
        .records()
        .map(|r| {
            let r = r.unwrap();
            let get = |k: usize| r.get(k).unwrap_or_default().to_string();
            (get(0), get(2), get(3), get(4), get(9))
        })
        .collect()
}

#[test]
fn a_campaign_skips_finished_runs_resumes_killed_ones_and_isolates_a_bad_value() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "camp.toml", &campaign_text(RUNS));
    // First invocation: every checkpoint write stalls 300 ms, so that the long run can be
    // killed (kill -9) after its second checkpoint and well before its end.
    let mut child = bin()
        .current_dir(dir.path())
        .args(["run", file.to_str().unwrap(), "--quiet"])
        .env(STALL_ENV, "300")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let long_ckpts = dir.path().join("runs/camp/long/checkpoints");
    let start = Instant::now();
    while checkpoints(&long_ckpts) < 2 {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "no checkpoints of the long run"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "the campaign ended before the kill"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap();
    let _ = child.wait();
    let first = summary(dir.path());
    assert_eq!(first[0].1, "finished", "{first:?}");
    assert_eq!(first[1].1, "not run", "{first:?}");
    assert_eq!(first[2].1, "invalid", "{first:?}");

    // Second invocation: the short run is skipped, the long one resumed, the bad one fails
    // alone (exit status 1 because of it).
    let out = run_in(dir.path(), &["run", file.to_str().unwrap(), "--quiet"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("run bad rejected"), "{stderr}");
    let rows = summary(dir.path());
    let names: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(names, ["short", "long", "bad"]);
    assert_eq!(
        (rows[0].1.as_str(), rows[0].2.as_str(), rows[0].3.as_str()),
        ("skipped", "0.5", "16")
    );
    assert_eq!(
        (rows[1].1.as_str(), rows[1].2.as_str(), rows[1].3.as_str()),
        ("resumed", "2", "64")
    );
    assert_eq!(rows[2].1, "invalid");
    assert!(
        rows[2].4.contains("sphere.mass") && rows[2].4.contains("positive"),
        "{rows:?}"
    );
    let md = std::fs::read_to_string(dir.path().join("runs/camp/summary.md")).unwrap();
    assert!(
        md.contains("| long | integrator.t_end = 2.0 | resumed | 2 | 64 |"),
        "{md}"
    );
}

#[test]
fn a_bad_key_path_stops_the_campaign_before_any_run() {
    // A config key and a key of the generated model file: each is cited at the campaign
    // file's own line, and the refused campaign leaves no folder.
    for bad in ["gravity.thetaa", "ics.sphere.scale_radiuss"] {
        let dir = tempfile::tempdir().unwrap();
        let text = campaign_text(&format!(
            "[sweep]\n\"gravity.softening\" = [0.05, 0.1]\n\"{bad}\" = [0.5]\n"
        ));
        let line = text.lines().position(|l| l.contains(bad)).unwrap() + 1;
        let file = write(dir.path(), "camp.toml", &text);
        let out = run_in(dir.path(), &["run", file.to_str().unwrap(), "--quiet"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(
            stderr.contains(bad)
                && stderr.contains("not in the schema")
                && stderr.contains(&format!("camp.toml:{line}:")),
            "{stderr}"
        );
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
        assert!(
            !dir.path().join("runs/camp").exists(),
            "a refused campaign left its folder"
        );
    }
}

#[test]
fn a_sweep_runs_the_cartesian_product_with_readable_names() {
    let dir = tempfile::tempdir().unwrap();
    let text = campaign_text(
        "[sweep]\n\"gravity.softening\" = [0.05, 0.1]\n\"ics.sphere.scale_radius\" = [1.0, 1.5]\n\"integrator.t_end\" = [0.0625]\n",
    );
    let file = write(dir.path(), "camp.toml", &text);
    let out = run_in(dir.path(), &["run", file.to_str().unwrap(), "--quiet"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows = summary(dir.path());
    let names: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(
        names,
        [
            "softening=0.05_scale_radius=1.0_t_end=0.0625",
            "softening=0.05_scale_radius=1.5_t_end=0.0625",
            "softening=0.1_scale_radius=1.0_t_end=0.0625",
            "softening=0.1_scale_radius=1.5_t_end=0.0625",
        ]
    );
    assert!(
        rows.iter().all(|r| r.1 == "finished" && r.3 == "2"),
        "{rows:?}"
    );
}

#[test]
fn a_sweep_of_a_billion_runs_is_refused_before_it_is_expanded() {
    let dir = tempfile::tempdir().unwrap();
    let list = |scale: f64| {
        let v: Vec<String> = (1..=1000)
            .map(|k| format!("{}", k as f64 * scale))
            .collect();
        format!("[{}]", v.join(", "))
    };
    let text = campaign_text(&format!(
        "[sweep]\n\"gravity.softening\" = {}\n\"ics.sphere.scale_radius\" = {}\n\"integrator.t_end\" = {}\n",
        list(0.001),
        list(0.01),
        list(0.5)
    ));
    let file = write(dir.path(), "camp.toml", &text);
    let m = run_measured(dir.path(), &["run", file.to_str().unwrap(), "--quiet"]);
    assert_eq!(m.code, Some(1), "{}", m.stderr);
    assert!(
        m.stderr.contains("expands to 1000000000 runs") && m.stderr.contains("limit of 10000"),
        "{}",
        m.stderr
    );
    assert!(
        m.wall < Duration::from_secs(2) && m.peak_rss < 100 << 20,
        "{:?}, {} MB",
        m.wall,
        m.peak_rss >> 20
    );
    assert!(!dir.path().join("runs/camp").exists(), "no folder left");
}

#[test]
fn a_campaign_with_duplicate_run_names_leaves_no_folder() {
    let dir = tempfile::tempdir().unwrap();
    let text = campaign_text(
        "[[runs]]\nname = \"a\"\n\n[[runs]]\nname = \"b\"\n\n[[runs]]\nname = \"a\"\n",
    );
    let file = write(dir.path(), "camp.toml", &text);
    let out = run_in(dir.path(), &["run", file.to_str().unwrap(), "--quiet"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("runs 1 and 3 would share the folder \"a\""),
        "{err}"
    );
    assert!(!dir.path().join("runs/camp").exists(), "no empty folders");
}
