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
