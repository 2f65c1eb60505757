//! What a first user sees: a finished run's figures and the command that draws it, units in
//! `info`, readable numbers in `diagnostics.csv`, and command-line arguments that work as
//! their help says.

mod common;

use common::*;

/// A 2 000-particle small-disk run of 5 Myr (galactic units).
fn galaxy_run(dir: &std::path::Path) -> String {
    let config = format!(
        r#"name = "first"
output_dir = "runs"
units = "galactic"
[ics]
model = "{}"
n = 2000
[gravity]
softening = 0.05
[integrator]
t_end = 0.005
dt_max = 0.001
fixed_step = true
[output]
snapshot_interval = 0.005
"#,
        repo("ics/small_disk.toml").display()
    );
    write(dir, "first.toml", &config);
    let out = run_in(dir, &["run", "first.toml"]);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{err}");
    err
}

#[test]
fn a_finished_run_shows_its_figures_units_and_how_to_see_it() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let err = galaxy_run(d);
    // The end of the run: time in Myr, wall time, evaluations, energy error, the command.
    assert!(err.contains("(4.9 Myr) after 5 steps"), "{err}");
    assert!(err.contains("6 force evaluations"), "{err}");
    assert!(err.contains("max |ΔE/E|"), "{err}");
    assert!(err.contains("leapfmm analyze runs/first"), "{err}");
    // diagnostics.csv: the first row's zeros are written as 0, every number reads back.
    let text = std::fs::read_to_string(d.join("runs/first/diagnostics.csv")).unwrap();
    let first = text.lines().nth(1).unwrap();
    assert!(first.starts_with("0,0,0,"), "{first}");
    assert!(!text.contains("0e0"), "{first}");
    // info gives the physical units with its numbers.
    let out = run_in(d, &["info", "runs/first/snapshots/snap_001.hdf5"]);
    let info = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success());
    assert!(info.contains("Myr)") && info.contains(" Msun") && info.contains(" kpc"));
    assert!(info.contains(" km/s"), "{info}");
}

#[test]
fn counts_on_the_command_line_work_as_their_help_says() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // A negative count is told it must be positive (not to write `-- -5`).
    let out = run_in(
        d,
        &[
            "ics",
            repo("ics/plummer.toml").to_str().unwrap(),
            "--n",
            "-5",
            "-o",
            "x.hdf5",
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("must be positive"), "{err}");
    // --sizes takes several values after one flag, as well as a comma-separated list.
    for sizes in [&["300", "500"][..], &["300,500"][..]] {
        let mut args = vec![
            "bench",
            "--workload",
            "plummer",
            "--export",
            "set.hdf5",
            "--sizes",
        ];
        args.extend_from_slice(sizes);
        let out = run_in(d, &args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = run_in(d, &["run", "x.toml", "--ranks", "-2"]);
    assert_eq!(out.status.code(), Some(2));
}

/// `Header/Time` of every snapshot of a run, in order.
fn snapshot_times(dir: &std::path::Path) -> Vec<f64> {
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    names.sort();
    let _hdf5 = hdf5_lock();
    names
        .iter()
        .map(|p| leapfmm::io::snapshot::read_snapshot(p).unwrap().time)
        .collect()
}

#[test]
fn times_in_myr_and_a_last_snapshot_without_a_near_duplicate() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // 7 Myr in steps of 1 Myr, snapshots every 3 Myr: at 0, 3 and 7 Myr (6 Myr would sit
    // 1 Myr before the last one at t_end, less than half an interval).
    let config = format!(
        r#"name = "myr"
units = "galactic"
[ics]
model = "{}"
n = 500
[gravity]
softening = 0.05
[integrator]
t_end = "7 Myr"
dt_max = "1 Myr"
fixed_step = true
[output]
snapshot_interval = "3 Myr"
"#,
        repo("ics/small_disk.toml").display()
    );
    write(d, "myr.toml", &config);
    let out = run_in(d, &["run", "myr.toml", "--quiet"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let myr = 1e6 * 3.15576e7 / (3.085_677_581_491_367e21 / 1e5);
    let times = snapshot_times(&d.join("runs/myr/snapshots"));
    let expected = [0.0, 3.0 * myr, 7.0 * myr];
    assert_eq!(times.len(), 3, "{times:?}");
    for (t, e) in times.iter().zip(expected) {
        assert!(
            (t - e).abs() <= 1e-12 * e.max(1.0),
            "{times:?} vs {expected:?}"
        );
    }
    // A time that is not a whole number of steps is refused with the nearest valid ones.
    write(d, "off.toml", &config.replace("\"7 Myr\"", "\"7.5 Myr\""));
    let out = run_in(d, &["run", "off.toml", "--quiet"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("(7 Myr) and") && err.contains("(8 Myr)"),
        "{err}"
    );
    // A unit it does not know is a one-line error.
    write(d, "pc.toml", &config.replace("\"7 Myr\"", "\"7 parsec\""));
    let err = String::from_utf8_lossy(&run_in(d, &["run", "pc.toml"]).stderr).to_string();
    assert!(err.contains("unknown time unit \"parsec\""), "{err}");
}
