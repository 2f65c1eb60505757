//! Memory is estimated before a run allocates: a run that cannot fit is refused at once
//! with the estimate and what the machine has, leaving no run folder; and the estimate
//! (`leapfmm::memory::host_bytes`) bounds the peak RSS measured on real runs.

mod common;

use common::*;
use leapfmm::config::RunSpec;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The quick-start galaxy with `n` particles, two steps, a snapshot and checkpoint each.
fn galaxy(dir: &Path, name: &str, n: u64) -> PathBuf {
    let text = std::fs::read_to_string(repo("configs/quickstart.toml")).unwrap();
    let text = text
        .replace("n = 30000", &format!("n = {n}"))
        .replace("name = \"quickstart\"", &format!("name = \"{name}\""))
        .replace(
            "ics/small_disk.toml",
            repo("ics/small_disk.toml").to_str().unwrap(),
        )
        .replace("t_end = 0.307", "t_end = 0.002")
        .replace("snapshot_interval = 0.051", "snapshot_interval = 0.001")
        .replace("checkpoint_interval = 0.102", "checkpoint_interval = 0.001");
    write(dir, &format!("{name}.toml"), &text)
}

#[test]
fn a_run_that_cannot_fit_is_refused_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    for (n, ranks) in [
        (500_000_000u64, "1"),
        (1_000_000_000_000, "1"),
        (500_000_000, "4"),
    ] {
        let cfg = galaxy(dir.path(), "huge", n);
        let m = run_measured(
            dir.path(),
            &["run", cfg.to_str().unwrap(), "--ranks", ranks],
        );
        assert_eq!(m.code, Some(1), "n = {n}: {}", m.stderr);
        assert!(
            m.stderr.contains(&format!("{n} particles need about"))
                && m.stderr.contains("available"),
            "{}",
            m.stderr
        );
        if ranks == "4" {
            assert!(m.stderr.contains("per rank over 4 ranks"), "{}", m.stderr);
        }
        assert!(
            m.wall < Duration::from_secs(2) && m.peak_rss < 100 << 20,
            "refused at once: {:?}, {} MB",
            m.wall,
            m.peak_rss >> 20
        );
        assert!(
            !dir.path().join("runs/huge").exists(),
            "no run folder is left to block a rerun"
        );
    }
}

#[test]
fn the_estimate_bounds_the_measured_peak() {
    let dir = tempfile::tempdir().unwrap();
    let plummer = plummer_config(
        "direct",
        5000,
        0.1,
        0.05,
        "",
        "snapshot_precision = \"double\"",
    );
    let cases = [
        (galaxy(dir.path(), "fmm1", 100_000), 1),
        (galaxy(dir.path(), "fmm2", 100_000), 2),
        (write(dir.path(), "direct.toml", &plummer), 1),
    ];
    for (cfg, ranks) in cases {
        let spec = RunSpec::load(&cfg).unwrap();
        let n = match spec.config.ics.n {
            Some(n) => n as u64,
            None => unreachable!("model runs"),
        };
        let estimate = leapfmm::memory::host_bytes(&spec.config.gravity, n, ranks);
        let r = ranks.to_string();
        let m = run_measured(
            dir.path(),
            &["run", cfg.to_str().unwrap(), "--ranks", &r, "--quiet"],
        );
        assert_eq!(m.code, Some(0), "{}", m.stderr);
        let ratio = estimate as f64 / m.peak_rss as f64;
        eprintln!(
            "{}: {ranks} ranks, peak {} MB, estimate {} MB ({ratio:.2}x)",
            cfg.display(),
            m.peak_rss >> 20,
            estimate >> 20
        );
        assert!(
            (1.0..3.0).contains(&ratio),
            "{}: peak {} B, estimate {estimate} B",
            cfg.display(),
            m.peak_rss
        );
    }
}
