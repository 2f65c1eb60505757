//! Every bad input gives a non-zero exit and one line naming the culprit (file, key with
//! line:column, value), and nothing already written in the run folder is touched.

mod common;

use common::*;
use std::path::Path;

fn base_config() -> String {
    plummer_config(
        "victim",
        64,
        0.5,
        0.125,
        "",
        "checkpoint_interval = 0.25\nkeep_checkpoints = 5",
    )
}

/// A temporary folder holding a finished run called "victim".
fn finished_run() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write(dir.path(), "good.toml", &base_config());
    let out = run_in(dir.path(), &["run", cfg.to_str().unwrap(), "--quiet"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    dir
}

/// Runs `leapfmm args` in `dir`, asserts a one-line error containing every `needles`
/// entry, and that the run folder is byte-for-byte unchanged.
fn assert_rejected(dir: &Path, args: &[&str], code: i32, needles: &[&str]) {
    let before = tree_contents(&dir.join("runs"));
    let out = run_in(dir, args);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(
        out.status.code(),
        Some(code),
        "exit code for {args:?}: {err}"
    );
    let lines: Vec<&str> = err.trim().lines().collect();
    assert_eq!(lines.len(), 1, "exactly one line for {args:?}, got: {err}");
    assert!(lines[0].starts_with("error:"), "{err}");
    assert!(
        !err.contains("panicked") && !err.contains("backtrace"),
        "{err}"
    );
    for n in needles {
        assert!(
            err.contains(n),
            "message for {args:?} should name {n:?}: {err}"
        );
    }
    assert!(
        before == tree_contents(&dir.join("runs")),
        "the run folder changed after {args:?}"
    );
}

/// Writes the base config with `from` replaced by `to` and checks it is rejected.
fn assert_config_rejected(dir: &Path, from: &str, to: &str, needles: &[&str]) {
    let text = base_config();
    assert!(
        text.contains(from),
        "test setup: {from:?} not in the config"
    );
    let cfg = write(dir, "bad.toml", &text.replacen(from, to, 1));
    let mut all = vec!["bad.toml"];
    all.extend_from_slice(needles);
    assert_rejected(dir, &["run", cfg.to_str().unwrap(), "--resume"], 1, &all);
}

#[test]
fn bad_config_values_are_named_with_file_key_and_value() {
    let run = finished_run();
    let d = run.path();
    // Unknown key, with line:column.
    assert_config_rejected(
        d,
        "softening = 0.05",
        "softning = 0.05",
        &["bad.toml:12:1", "softning"],
    );
    // Wrong type.
    assert_config_rejected(
        d,
        "softening = 0.05",
        "softening = \"small\"",
        &["bad.toml:12:13", "gravity.softening"],
    );
    // Malformed TOML.
    assert_config_rejected(
        d,
        "softening = 0.05",
        "softening = = 0.05",
        &["bad.toml:12:"],
    );
    // Bad values.
    assert_config_rejected(d, "n = 64", "n = 0", &["ics.n", "= 0", "at least 2"]);
    assert_config_rejected(
        d,
        "n = 64",
        "n = 1",
        &["ics.n", "= 1", "at least 2", "virial ratio is undefined"],
    );
    assert_config_rejected(d, "n = 64", "n = -5", &["ics.n", "-5"]);
    assert_config_rejected(
        d,
        "softening = 0.05",
        "softening = -0.1",
        &["gravity.softening", "-0.1"],
    );
    assert_config_rejected(
        d,
        "t_end = 0.5",
        "t_end = 0.0",
        &["integrator.t_end", "= 0"],
    );
    assert_config_rejected(
        d,
        "t_end = 0.5",
        "t_end = -2.0",
        &["integrator.t_end", "-2"],
    );
    assert_config_rejected(
        d,
        "dt_max = 0.125",
        "dt_max = 0.3",
        &["integrator.t_end", "whole multiple"],
    );
    // The step limit is named as such, and long numbers are printed short.
    assert_config_rejected(
        d,
        "t_end = 0.5",
        "t_end = 1e7",
        &["integrator.t_end", "80000000 steps", "limit of 10^7 steps"],
    );
    assert_config_rejected(
        d,
        "t_end = 0.5",
        "t_end = 1e-300",
        &["integrator.dt_max' = 0.125", "integrator.t_end = 1e-300"],
    );
    assert_config_rejected(d, "name = \"victim\"", "name = \"a/b\"", &["name", "a/b"]);
    // Missing files.
    let model = repo("ics/plummer.toml").display().to_string();
    assert_config_rejected(
        d,
        &model,
        "no/such/model.toml",
        &["ics.model", "no/such/model.toml", "no such file"],
    );
    assert_config_rejected(
        d,
        &format!("model = \"{model}\"\nn = 64"),
        "file = \"missing_ic.hdf5\"",
        &["ics.file", "missing_ic.hdf5"],
    );
    // An output folder that cannot be written (under a regular file; root ignores modes).
    write(d, "plainfile", "x");
    assert_config_rejected(
        d,
        "output_dir = \"runs\"",
        "output_dir = \"plainfile/sub\"",
        &["output_dir", "plainfile/sub"],
    );
    // The config itself missing.
    assert_rejected(d, &["run", "nowhere.toml"], 1, &["nowhere.toml"]);
}

#[test]
fn a_bad_model_file_is_named() {
    let run = finished_run();
    let d = run.path();
    let model = write(
        d,
        "model.toml",
        "units = \"nbody\"\n[sphere]\nprofile = \"plummer\"\nmass = -1.0\nscale_radius = 1.0\n",
    );
    let text = base_config().replace(
        &repo("ics/plummer.toml").display().to_string(),
        model.to_str().unwrap(),
    );
    let cfg = write(d, "bad.toml", &text);
    assert_rejected(
        d,
        &["run", cfg.to_str().unwrap(), "--resume"],
        1,
        &["model.toml:4:8", "sphere.mass", "-1"],
    );
    assert_rejected(
        d,
        &["ics", model.to_str().unwrap(), "--n", "10", "-o", "x.hdf5"],
        1,
        &["sphere.mass"],
    );
    let disk = std::fs::read_to_string(repo("ics/small_disk.toml"))
        .unwrap()
        .replace("toomre_q = 2.0", "toomre_q = 2.0\nsoftening = 0.0");
    let model = write(d, "disk.toml", &disk);
    assert_rejected(
        d,
        &["ics", model.to_str().unwrap(), "--n", "10", "-o", "x.hdf5"],
        1,
        &["disk.toml", "disk.softening", "0"],
    );
}

#[test]
fn an_existing_run_is_never_overwritten_without_resume() {
    let run = finished_run();
    let cfg = run.path().join("good.toml");
    assert_rejected(
        run.path(),
        &["run", cfg.to_str().unwrap()],
        1,
        &["already holds a run", "--resume"],
    );
    // With --resume a finished run is left alone.
    let before = tree_contents(&run.path().join("runs"));
    let out = run_in(
        run.path(),
        &["run", cfg.to_str().unwrap(), "--resume", "--quiet"],
    );
    assert!(out.status.success());
    assert!(before == tree_contents(&run.path().join("runs")));
    // Where the passes run may change (--backend, which the checkpoint's config text does
    // not hold, or gravity.backend).
    let out = run_in(
        run.path(),
        &[
            "run",
            cfg.to_str().unwrap(),
            "--resume",
            "--backend",
            "cpu",
            "--quiet",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(before == tree_contents(&run.path().join("runs")));
    // Resuming with a changed physics key is refused by name.
    let changed = write(
        run.path(),
        "changed.toml",
        &base_config().replace("softening = 0.05", "softening = 0.06"),
    );
    assert_rejected(
        run.path(),
        &["run", changed.to_str().unwrap(), "--resume"],
        1,
        &["gravity.softening", "0.05", "0.06"],
    );
}

#[test]
fn truncated_checkpoints_fall_back_or_fail_cleanly() {
    let run = finished_run();
    let d = run.path();
    let ckpt_dir = d.join("runs/victim/checkpoints");
    let mut ckpts: Vec<_> = std::fs::read_dir(&ckpt_dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    ckpts.sort();
    assert!(ckpts.len() >= 3, "{ckpts:?}");
    // Truncate the newest: resuming (with a longer t_end) warns and uses the previous one.
    let newest = ckpts.last().unwrap().clone();
    let len = std::fs::metadata(&newest).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&newest)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let longer = write(
        d,
        "longer.toml",
        &base_config().replace("t_end = 0.5", "t_end = 0.75"),
    );
    let out = run_in(d, &["run", longer.to_str().unwrap(), "--resume", "--quiet"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("warning:") && err.contains(newest.file_name().unwrap().to_str().unwrap()),
        "{err}"
    );
    assert!(err.contains("truncated"), "{err}");

    // Truncate every checkpoint: resuming fails with one line and touches nothing.
    for e in std::fs::read_dir(&ckpt_dir).unwrap().flatten() {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "ckpt") {
            std::fs::OpenOptions::new()
                .write(true)
                .open(&p)
                .unwrap()
                .set_len(20)
                .unwrap();
        }
    }
    let longest = write(
        d,
        "longest.toml",
        &base_config().replace("t_end = 0.5", "t_end = 1.0"),
    );
    assert_rejected(
        d,
        &["run", longest.to_str().unwrap(), "--resume"],
        1,
        &["checkpoints", "no checkpoint verifies"],
    );
}

#[test]
fn other_subcommands_reject_bad_arguments() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("runs")).unwrap();
    let d = dir.path();
    let model = repo("ics/plummer.toml");
    let m = model.to_str().unwrap();
    // clap's usage errors exit with 2 and name the argument.
    let out = run_in(d, &["ics", m, "--n", "0", "-o", "x.hdf5"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--n"));
    assert_rejected(
        d,
        &["ics", "nomodel.toml", "--n", "10", "-o", "x.hdf5"],
        1,
        &["nomodel.toml"],
    );
    assert_rejected(
        d,
        &["ics", m, "--n", "10", "-o", "nodir/x.hdf5"],
        1,
        &["nodir"],
    );
    write(d, "plain", "x");
    assert_rejected(
        d,
        &["ics", m, "--n", "10", "-o", "plain/sub/x.hdf5"],
        1,
        &["plain is a file, not a folder"],
    );
    assert_rejected(
        d,
        &["info", "missing.hdf5"],
        1,
        &["missing.hdf5", "no such file"],
    );
    write(d, "notes.txt", "not hdf5");
    assert_rejected(d, &["info", "notes.txt"], 1, &["notes.txt"]);
    std::fs::create_dir(d.join("set.ranks")).unwrap();
    assert_rejected(
        d,
        &["info", "set.ranks"],
        1,
        &["set.ranks", "a folder", ".manifest"],
    );
    // Direct summation has no distributed version: refused before anything is written.
    let cfg = write(d, "direct.toml", &base_config());
    assert_rejected(
        d,
        &["run", cfg.to_str().unwrap(), "--ranks", "2", "--quiet"],
        1,
        &["gravity.solver", "direct", "--ranks"],
    );
    let out = run_in(d, &["run", cfg.to_str().unwrap(), "--ranks", "0"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn resume_never_overwrites_a_run_it_cannot_prove_it_continues() {
    // A finished run whose checkpoints were deleted to save space, with the config then
    // edited: --resume used to start again and overwrite its snapshots.
    let run = finished_run();
    let d = run.path();
    std::fs::remove_dir_all(d.join("runs/victim/checkpoints")).unwrap();
    let edited = base_config().replace("softening = 0.05", "softening = 0.2");
    let cfg = write(d, "good.toml", &edited);
    assert_rejected(
        d,
        &["run", cfg.to_str().unwrap(), "--resume", "--quiet"],
        1,
        &[
            "runs/victim",
            "snapshot(s)",
            "no checkpoint",
            "config.toml differs",
            "remove the folder",
        ],
    );
    // --resume on a folder that does not exist starts a fresh run, and says so when quiet.
    let fresh = write(
        d,
        "fresh.toml",
        &base_config().replace("victim", "newcomer"),
    );
    let out = run_in(d, &["run", fresh.to_str().unwrap(), "--resume", "--quiet"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("does not exist; starting a fresh run"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

/// Every numeric key of a run config, with a value that runs: section, key, value.
const NUMERIC_KEYS: [(&str, &str, &str); 15] = [
    ("", "seed", "7"),
    ("ics", "n", "64"),
    ("gravity", "softening", "0.05"),
    ("gravity", "order", "4"),
    ("gravity", "theta", "0.6"),
    ("gravity", "leaf_size", "16"),
    ("gravity", "cap_growth", "1.5"),
    ("integrator", "t_end", "0.5"),
    ("integrator", "dt_max", "0.125"),
    ("integrator", "eta", "0.02"),
    ("integrator", "max_rungs", "8"),
    ("output", "snapshot_interval", "0.25"),
    ("output", "checkpoint_interval", "0.25"),
    ("output", "checkpoint_wall_minutes", "10"),
    ("output", "keep_checkpoints", "3"),
];

fn fuzz_config(name: &str, key: (&str, &str), value: &str) -> String {
    let mut sections: Vec<(&str, Vec<String>)> = vec![
        (
            "",
            vec![
                format!("name = \"{name}\""),
                "output_dir = \"runs\"".into(),
                "units = \"nbody\"".into(),
            ],
        ),
        (
            "ics",
            vec![format!(
                "model = \"{}\"",
                repo("ics/plummer.toml").display()
            )],
        ),
        ("gravity", vec!["solver = \"fmm\"".into()]),
        ("integrator", vec![]),
        ("output", vec!["diagnostics_every = 1".into()]),
    ];
    for (section, k, v) in NUMERIC_KEYS {
        let v = if (section, k) == key { value } else { v };
        let lines = &mut sections.iter_mut().find(|s| s.0 == section).unwrap().1;
        lines.push(format!("{k} = {v}"));
    }
    sections
        .iter()
        .map(|(s, lines)| {
            let head = if s.is_empty() {
                String::new()
            } else {
                format!("[{s}]\n")
            };
            format!("{head}{}\n", lines.join("\n"))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn no_numeric_config_value_panics_or_leaves_a_refused_folder() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let values = ["0", "-1", "1e-300", "1e300", "9223372036854775807"];
    let mut refused = 0;
    for (k, &(section, key, _)) in NUMERIC_KEYS.iter().enumerate() {
        for (v, value) in values.iter().enumerate() {
            let name = format!("f{k}_{v}");
            let cfg = write(
                d,
                &format!("{name}.toml"),
                &fuzz_config(&name, (section, key), value),
            );
            let m = run_measured(d, &["run", cfg.to_str().unwrap(), "--quiet"]);
            let what = format!("{section}.{key} = {value}");
            assert!(
                m.code == Some(0) || m.code == Some(1),
                "{what}: exit {:?} (a panic is 101): {}",
                m.code,
                m.stderr
            );
            assert!(m.wall.as_secs() < 20, "{what}: {:?}", m.wall);
            if m.code == Some(1) {
                assert_eq!(m.stderr.trim().lines().count(), 1, "{what}: {}", m.stderr);
                if m.stderr.contains(&format!("{name}.toml")) {
                    refused += 1;
                    assert!(
                        !d.join("runs").join(&name).exists(),
                        "{what}: a refused run left its folder: {}",
                        m.stderr
                    );
                }
            }
        }
    }
    assert!(refused > 40, "most of these values are refused: {refused}");
}

#[test]
fn a_checkpoint_named_as_another_step_is_set_aside() {
    let run = finished_run();
    let d = run.path();
    let ckpts = d.join("runs/victim/checkpoints");
    let copy = ckpts.join(leapfmm::io::checkpoint::file_name(99));
    let steps: Vec<u64> = leapfmm::io::checkpoint::list(&ckpts)
        .unwrap()
        .into_iter()
        .map(|(s, _)| s)
        .collect();
    assert_eq!(steps.len(), 3, "{steps:?}");
    let older = steps[1];
    std::fs::copy(ckpts.join(leapfmm::io::checkpoint::file_name(older)), &copy).unwrap();
    let cfg = d.join("good.toml");
    let out = run_in(d, &["run", cfg.to_str().unwrap(), "--resume"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains(&format!("named as step 99 but holds step {older}")),
        "{err}"
    );
    assert!(
        err.contains("already finished"),
        "the real newest one is used: {err}"
    );
    assert!(!copy.exists());
    let mut aside = copy.into_os_string();
    aside.push(".corrupt");
    assert!(std::path::PathBuf::from(aside).exists());
}

#[test]
fn only_regular_files_are_read_and_a_signal_before_the_first_step_ends_the_run_at_once() {
    let run = finished_run();
    let d = run.path();
    let ckpts = d.join("runs/victim/checkpoints");
    let cfg = d.join("good.toml");
    // A FIFO named as the newest checkpoint used to block --resume forever; a link to
    // /dev/zero read until memory ran out.
    let fifo = ckpts.join(leapfmm::io::checkpoint::file_name(98));
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo(3) on a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    std::os::unix::fs::symlink(
        "/dev/zero",
        ckpts.join(leapfmm::io::checkpoint::file_name(99)),
    )
    .unwrap();
    let m = run_measured(d, &["run", cfg.to_str().unwrap(), "--resume"]);
    assert_eq!(m.code, Some(0), "{}", m.stderr);
    assert!(
        m.wall.as_secs() < 5 && m.peak_rss < 100 << 20,
        "{:?}",
        m.wall
    );
    assert_eq!(
        m.stderr.matches("not a regular file").count(),
        2,
        "{}",
        m.stderr
    );
    assert!(m.stderr.contains("already finished"), "{}", m.stderr);
    // A FIFO as the config file.
    let config_fifo = d.join("fifo.toml");
    let c = std::ffi::CString::new(config_fifo.to_str().unwrap()).unwrap();
    // SAFETY: as above.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let out = run_in(d, &["run", "fifo.toml"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("fifo.toml") && err.contains("not a regular file"),
        "{err}"
    );
    // SIGTERM while the step-0 checkpoint is written (before the first step): the process
    // ends at once with 128 + 15, not after a 5 s stall.
    let fresh = write(d, "fresh.toml", &base_config().replace("victim", "early"));
    let child = bin()
        .current_dir(d)
        .args(["run", fresh.to_str().unwrap(), "--quiet"])
        .env(leapfmm::io::checkpoint::STALL_ENV, "5000")
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let early = d.join("runs/early/checkpoints");
    wait_for("the step-0 checkpoint write", || {
        std::fs::read_dir(&early).is_ok_and(|r| {
            r.flatten()
                .any(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        })
    });
    let start = std::time::Instant::now();
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(128 + libc::SIGTERM));
    assert!(start.elapsed().as_secs() < 3, "{:?}", start.elapsed());
}

/// A small disk galaxy with its own disk softening (galactic units).
const MODEL: &str = r#"units = "galactic"

[halo]
profile = "hernquist"
mass = 8.0
scale_radius = 8.0
truncation_radius = 20.0
particles = 3.0

[disk]
mass = 0.5
scale_length = 2.0
scale_height = 0.25
toomre_q = 2.0
particles = 1.0
softening = 0.02
"#;

/// A 200-particle run of 4 steps from `ics` (a `model = …` or `file = …` line), a
/// checkpoint every 2 steps.
fn input_config(output_dir: &str, ics: &str, t_end: f64) -> String {
    format!(
        r#"name = "built"
output_dir = "{output_dir}"
seed = 3
units = "galactic"

[ics]
{ics}

[gravity]
solver = "direct"
softening = 0.05

[integrator]
t_end = {t_end}
dt_max = 0.001
fixed_step = true

[output]
snapshot_interval = 0.002
checkpoint_interval = 0.002
"#
    )
}

fn run_ok(dir: &Path, args: &[&str]) -> String {
    let out = run_in(dir, args);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{args:?}: {err}");
    err
}

#[test]
fn resume_compares_the_model_and_ic_files_by_content_not_path() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let model = write(d, "model.toml", MODEL);
    let cfg = write(
        d,
        "run.toml",
        &input_config("runs", "model = \"model.toml\"\nn = 200", 0.004),
    );
    run_ok(d, &["run", "run.toml", "--quiet"]);
    assert!(d.join("runs/built/inputs.toml").is_file());

    // The model's disk softening edited: refused naming the file and the key.
    std::fs::write(&model, MODEL.replace("softening = 0.02", "softening = 0.5")).unwrap();
    assert_rejected(
        d,
        &["run", cfg.to_str().unwrap(), "--resume", "--quiet"],
        1,
        &["model.toml", "disk.softening", "was 0.02", "now 0.5"],
    );
    // Without checkpoints, the same config with an edited model does not start again.
    let kept = d.join("kept-checkpoints");
    std::fs::rename(d.join("runs/built/checkpoints"), &kept).unwrap();
    assert_rejected(
        d,
        &["run", cfg.to_str().unwrap(), "--resume", "--quiet"],
        1,
        &["no checkpoint", "inputs differ", "disk.softening"],
    );
    std::fs::rename(&kept, d.join("runs/built/checkpoints")).unwrap();

    // The folder and the model moved, paths edited, a comment added to the model: the
    // content is the same, so the run goes on (with a later t_end).
    std::fs::create_dir_all(d.join("elsewhere/models")).unwrap();
    std::fs::rename(d.join("runs"), d.join("elsewhere/runs")).unwrap();
    std::fs::remove_file(&model).unwrap();
    write(d, "elsewhere/models/m.toml", &format!("# moved\n{MODEL}"));
    write(
        d,
        "moved.toml",
        &input_config(
            "elsewhere/runs",
            "model = \"elsewhere/models/m.toml\"\nn = 200",
            0.006,
        ),
    );
    let err = run_ok(d, &["run", "moved.toml", "--resume"]);
    assert!(err.contains("resuming from"), "{err}");
    assert!(
        d.join("elsewhere/runs/built/snapshots/snap_003.hdf5")
            .is_file()
    );

    // An IC file's content edited after the run started: refused naming the file.
    let ic = d.join("ic.hdf5");
    run_ok(
        d,
        &[
            "ics",
            "elsewhere/models/m.toml",
            "--n",
            "200",
            "-o",
            "ic.hdf5",
        ],
    );
    write(
        d,
        "file.toml",
        &input_config("file-runs", "file = \"ic.hdf5\"", 0.004),
    );
    run_ok(d, &["run", "file.toml", "--quiet"]);
    run_ok(
        d,
        &[
            "ics",
            "elsewhere/models/m.toml",
            "--n",
            "200",
            "--seed",
            "9",
            "-o",
            "ic.hdf5",
        ],
    );
    assert!(ic.is_file());
    let before = tree_contents(&d.join("file-runs"));
    let out = run_in(d, &["run", "file.toml", "--resume", "--quiet"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("IC file ic.hdf5") && err.contains("content changed"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(before == tree_contents(&d.join("file-runs")));
}
