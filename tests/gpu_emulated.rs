//! The binary's GPU backend run whole without a GPU: the emulated CUDA driver and NVRTC of
//! kernels/emulation/driver.cpp, first on LD_LIBRARY_PATH, are what cudarc loads, and every
//! launch runs its kernel under the CPU emulation. So the host code that drives the device
//! (buffers, copies, launches, the resident pipeline of a run: sort, split, moments, walk,
//! passes, kick and drift on the device) runs here as on an H200, each copy and kernel
//! confined to its buffers (the emulated driver faults on the first byte past one). Checked
//! against the CPU backend in the same processes and runs.
//! Needs a C++20 compiler (`c++`; scripts/install-deps.sh installs g++), and the `cuda`
//! feature (default).
#![cfg(feature = "cuda")]

mod common;

use common::{Diagnostics, bin, emulation, repo, write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The binary with the emulated driver as its CUDA, NVRTC and NCCL, and `home` as HOME
/// and TMPDIR (the kernel cache and NCCL's messages go there, not into the user's).
fn on_emulated_gpu(home: &Path) -> Command {
    let driver = emulation::driver();
    let mut paths = vec![driver];
    paths.extend(std::env::split_paths(
        &std::env::var_os("LD_LIBRARY_PATH").unwrap_or_default(),
    ));
    let mut cmd = bin();
    cmd.current_dir(home)
        .env("LD_LIBRARY_PATH", std::env::join_paths(paths).unwrap())
        .env("HOME", home)
        .env("TMPDIR", home);
    cmd
}

/// Everything `out` printed, stdout then stderr, after checking that it succeeded.
fn succeeded(out: Output, what: &str) -> String {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{text}",
        out.status
    );
    text
}

/// A Milky Way model of `n` particles written to `dir/mw.hdf5`.
fn galaxy(dir: &Path, n: usize) -> PathBuf {
    let file = dir.join("mw.hdf5");
    let out = bin()
        .args(["ics", repo("ics/milky_way.toml").to_str().unwrap()])
        .args(["--n", &n.to_string(), "-o", file.to_str().unwrap()])
        .output()
        .unwrap();
    succeeded(out, "ics");
    file
}

/// The largest relative difference of the line of `stdout` that starts with `prefix`
/// ("... median a, p99 b, max c relative difference").
fn max_difference(stdout: &str, prefix: &str) -> f64 {
    let line = stdout
        .lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line {prefix:?} in:\n{stdout}"));
    let max = line.split("max ").nth(1).and_then(|r| r.split(' ').next());
    max.and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no maximum in {line:?}"))
}

#[test]
fn forces_on_the_emulated_gpu_are_the_cpus_on_one_and_two_ranks() {
    let dir = tempfile::tempdir().unwrap();
    let ics = galaxy(dir.path(), 3000);
    let ics = ics.to_str().unwrap();
    let args = ["forces", ics, "--softening", "0.05", "--backend", "cuda"];

    let out = on_emulated_gpu(dir.path())
        .args(args)
        .args(["--repeat", "2", "-o", "one.hdf5"])
        .output()
        .unwrap();
    let stdout = succeeded(out, "forces on the emulated GPU");
    assert!(
        stdout.contains("GPU leapfmm CPU emulation (not a GPU) (sm_90) ready"),
        "{stdout}"
    );
    // The device's tree order, cells, moments, lists and a sub-step's flags of cells, each
    // evaluation, against the host's.
    for (what, count) in [
        (
            "GPU tree order",
            "the host's order, positions and sums: identical",
        ),
        ("GPU cells", "the host's cells: identical"),
        ("GPU cell moments", "the host's: identical"),
        ("GPU walk", "the host's lists: identical"),
        ("GPU active cells", "the host's flags: identical"),
        (
            "GPU walk for a sub-step",
            "the host's lists there: identical",
        ),
    ] {
        let same = stdout
            .lines()
            .filter(|l| l.starts_with(what) && l.ends_with(count))
            .count();
        assert_eq!(same, 2, "{what}: {stdout}");
    }
    let one_rank = max_difference(&stdout, "GPU vs CPU accelerations (one rank)");
    assert!(one_rank <= 1e-5, "{one_rank:e}\n{stdout}");

    // Two thread ranks sharing the device: each rank's passes there, its multipoles and
    // particles for the other gathered there and sent through the host (NCCL needs a GPU
    // per rank). The f64 near field
    // on the CPU ranks, so that the two differ by the device's f32 near field only.
    let out = on_emulated_gpu(dir.path())
        .args(args)
        .args(["--ranks", "2", "--near-field", "double", "-o", "two.hdf5"])
        .output()
        .unwrap();
    let stdout = succeeded(out, "forces on two ranks on the emulated GPU");
    let two_ranks = max_difference(&stdout, "GPU vs CPU accelerations (2 ranks)");
    assert!(two_ranks <= 1e-5, "{two_ranks:e}\n{stdout}");

    // Each rank with a GPU of its own: the payload goes from GPU to GPU through NCCL (the
    // emulated one), with the same forces, bit for bit, though each launch's blocks and
    // threads run in reverse order.
    let out = on_emulated_gpu(dir.path())
        .env("LEAPFMM_EMULATED_GPUS", "2")
        .env("LEAPFMM_EMULATED_SCHEDULE", "reversed")
        .args(args)
        .args(["--ranks", "2", "--near-field", "double", "-o", "nccl.hdf5"])
        .output()
        .unwrap();
    let stdout = succeeded(out, "forces on two ranks on two emulated GPUs");
    assert!(
        stdout.contains(
            "on 2 GPU(s) (leapfmm CPU emulation (not a GPU)), the LET payload through NCCL"
        ),
        "{stdout}"
    );
    let read = |f: &str| std::fs::read(dir.path().join(f)).unwrap();
    assert!(
        read("nccl.hdf5") == read("two.hdf5"),
        "NCCL (or the reversed order of blocks and threads) changed the forces"
    );
}

/// The coordinates and velocities of every particle type in the last snapshot of run
/// `name` under `dir`, as stored (a run on several ranks writes a file per rank into a
/// folder: their parts one after the other): (dataset, its bytes).
fn last_snapshot(dir: &Path, name: &str) -> Vec<(String, Vec<u8>)> {
    let sorted = |folder: &Path| {
        let mut paths: Vec<PathBuf> = std::fs::read_dir(folder)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .collect();
        paths.sort();
        paths
    };
    let last = sorted(&dir.join("runs").join(name).join("snapshots"))
        .pop()
        .expect("a snapshot");
    let files = if last.is_dir() {
        sorted(&last)
    } else {
        vec![last]
    };
    let mut out: Vec<(String, Vec<u8>)> = Vec::new();
    for file in &files {
        let groups: Vec<String> = {
            let _hdf5 = common::hdf5_lock();
            let f = hdf5::File::open(file).unwrap();
            f.member_names()
                .unwrap()
                .into_iter()
                .filter(|g| g.starts_with("PartType"))
                .collect()
        };
        for g in groups {
            for d in ["Coordinates", "Velocities"] {
                let name = format!("{g}/{d}");
                let bytes = common::dataset_bytes(file, &name);
                match out.iter_mut().find(|(n, _)| *n == name) {
                    Some((_, all)) => all.extend(bytes),
                    None => out.push((name, bytes)),
                }
            }
        }
    }
    assert!(!out.is_empty(), "no particles in {files:?}");
    out
}

fn f64s(bytes: &[u8]) -> Vec<f64> {
    bytes
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// The line that turns the default accuracy target off (the device walk has none yet).
const NO_TARGET: &str = "accuracy = 0\n";

/// Writes `dir/<name>.toml`: a run of the galaxy `ics` to t = 0.0004 (steps of at most
/// 1e-4, a snapshot in f64 at the end), with `gravity` and `integrator` lines added.
fn galaxy_run(dir: &Path, ics: &Path, name: &str, gravity: &str, integrator: &str) -> PathBuf {
    write(
        dir,
        &format!("{name}.toml"),
        &galaxy_text(ics, name, gravity, integrator),
    )
}

/// `galaxy_run`'s config text (its `[output]` table last, so lines can be added to it). The
/// CPU runs compared with the GPU's use the GPU's criterion, the opening angle alone
/// (`accuracy = 0`, `NO_TARGET`).
fn galaxy_text(ics: &Path, name: &str, gravity: &str, integrator: &str) -> String {
    format!(
        "name = \"{name}\"\noutput_dir = \"runs\"\n[ics]\nfile = \"{}\"\n\
         [gravity]\nsoftening = 0.05\n{NO_TARGET}{gravity}\n[integrator]\nt_end = 0.0004\ndt_max = 0.0001\n{integrator}\n\
         [output]\nsnapshot_interval = 0.0004\nsnapshot_precision = \"double\"\n",
        ics.display()
    )
}

/// Runs `config` with `args` on the emulated GPU(s) (`gpus` of them); what it printed,
/// which must hold no warning.
fn run(dir: &Path, config: &Path, args: &[&str], gpus: usize) -> String {
    run_scheduled(dir, config, args, gpus, "in-order")
}

/// `run`, the blocks and threads of each launch in the order `schedule` names
/// (`LEAPFMM_EMULATED_SCHEDULE`: in-order, reversed or shuffled).
fn run_scheduled(dir: &Path, config: &Path, args: &[&str], gpus: usize, schedule: &str) -> String {
    let out = on_emulated_gpu(dir)
        .env("LEAPFMM_EMULATED_GPUS", gpus.to_string())
        .env("LEAPFMM_EMULATED_SCHEDULE", schedule)
        .args(["run", config.to_str().unwrap()])
        .args(args)
        .output()
        .unwrap();
    let text = succeeded(out, &config.display().to_string());
    assert!(!text.contains("warning"), "{text}");
    text
}

/// Runs `a` and `b` under `dir` took the same steps to total energies within `energy` of
/// each other (relative), and their last snapshots' positions and velocities are within
/// 1e-6 of the largest (forces through the device's f32 near field differ by ~1e-7).
fn assert_close_runs(dir: &Path, a: &str, b: &str, energy: f64) {
    let read = |name: &str| Diagnostics::read(&dir.join("runs").join(name).join("diagnostics.csv"));
    let (da, db) = (read(a), read(b));
    assert_eq!(da.column("step"), db.column("step"), "{a} and {b}");
    for (x, y) in da.column("total").iter().zip(&db.column("total")) {
        assert!(
            ((x - y) / y).abs() < energy,
            "energy {x} in {a}, {y} in {b}"
        );
    }
    let (sa, sb) = (last_snapshot(dir, a), last_snapshot(dir, b));
    assert_eq!(sa.len(), sb.len());
    for ((name, x), (_, y)) in sa.iter().zip(&sb) {
        let (x, y) = (f64s(x), f64s(y));
        assert_eq!(x.len(), y.len(), "{name}");
        let scale = y.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        let worst = x
            .iter()
            .zip(&y)
            .fold(0.0f64, |m, (x, y)| m.max((x - y).abs()));
        assert!(
            worst <= 1e-6 * scale,
            "{a} and {b}, {name}: {worst:e} of {scale:e}"
        );
    }
}

#[test]
fn a_resident_run_on_the_emulated_gpu_follows_the_cpu_run_and_repeats_its_bits() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ics = galaxy(d, 3000);
    // Without `gravity.accuracy`: the GPU backend's walk takes the opening angle alone
    // (the bits of `accuracy = 0` below) and says so.
    let default = galaxy_text(&ics, "gpu", "", "").replace(NO_TARGET, "");
    let gpu = run(
        d,
        &write(d, "gpu.toml", &default),
        &["--backend", "cuda"],
        1,
    );
    assert!(
        gpu.contains("the particles stay on the device between steps"),
        "{gpu}"
    );
    assert!(
        gpu.contains("the GPU backend walks with the opening angle alone: it does not hold the default accuracy target (1e-3) (θ = 0.75, p = 7)"),
        "{gpu}"
    );
    // Under `auto` a GPU does not take a run that keeps the default target.
    let auto = run(
        d,
        &write(d, "auto.toml", &default.replace("\"gpu\"", "\"auto\"")),
        &[],
        1,
    );
    assert!(
        auto.contains(
            "auto: backend: cpu (auto: the GPU backend walks with the opening angle alone"
        ),
        "{auto}"
    );
    // Again with each launch's blocks and threads shuffled, as a GPU may run them.
    run_scheduled(
        d,
        &galaxy_run(d, &ics, "again", "", ""),
        &["--backend", "cuda"],
        1,
        "shuffled",
    );
    run(
        d,
        &galaxy_run(d, &ics, "cpu", "", ""),
        &["--backend", "cpu"],
        1,
    );
    // The same run twice on the device: the same bits, whatever the order of the blocks
    // and threads.
    assert!(
        last_snapshot(d, "gpu") == last_snapshot(d, "again"),
        "two runs on the device differ (the second with its blocks and threads shuffled)"
    );
    // The one-rank columns a CPU run writes too (docs/formats.md), which campaign summaries
    // read.
    let diagnostics = Diagnostics::read(&d.join("runs/gpu/diagnostics.csv"));
    assert!(
        diagnostics
            .column("rank_particles")
            .iter()
            .all(|&n| n == 3000.0)
    );
    assert!(
        diagnostics
            .column("load_imbalance")
            .iter()
            .all(|&x| x == 1.0)
    );
    // Both with the f32 pairs of the mixed near field: the energies agree to 1e-9.
    assert_close_runs(d, "gpu", "cpu", 1e-8);
}

/// With an external potential the device adds it too (kernels/external.cu), on one rank
/// and on two, and the runs follow the CPU's: energies (the external one included) and
/// states.
#[test]
fn an_external_potential_on_the_emulated_gpus_follows_the_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ics = galaxy(d, 3000);
    let external = "[[gravity.external]]\nprofile = \"miyamoto_nagai\"\nmass = 5.0\nscale_radius = 3.0\nscale_height = 0.3\n\
                    [[gravity.external]]\nprofile = \"nfw\"\nmass = 60.0\nscale_radius = 20.0\ncentre_velocity = [10.0, 0.0, 0.0]\n\
                    [[gravity.external]]\nprofile = \"logarithmic\"\ncircular_velocity = 50.0\ncore_radius = 2.0\nflattening = 0.8";
    let gpu = run(
        d,
        &galaxy_run(d, &ics, "gpu", external, ""),
        &["--backend", "cuda"],
        1,
    );
    assert!(
        gpu.contains("the particles stay on the device between steps"),
        "{gpu}"
    );
    run(
        d,
        &galaxy_run(d, &ics, "gpu2", external, ""),
        &["--backend", "cuda", "--ranks", "2"],
        2,
    );
    run(
        d,
        &galaxy_run(d, &ics, "cpu", external, ""),
        &["--backend", "cpu"],
        1,
    );
    // Two CPU ranks with the f64 near field, as in the test below: the mixed one's
    // compressed wire would move the energy by 1e-7.
    run(
        d,
        &galaxy_run(
            d,
            &ics,
            "cpu2",
            &format!("near_field = \"double\"\n{external}"),
            "",
        ),
        &["--backend", "cpu", "--ranks", "2"],
        1,
    );
    assert_close_runs(d, "gpu", "cpu", 1e-8);
    assert_close_runs(d, "gpu2", "cpu2", 5e-8);
    let external_energy = |name: &str| {
        Diagnostics::read(&d.join("runs").join(name).join("diagnostics.csv"))
            .column("external_energy")
    };
    for (g, c) in [("gpu", "cpu"), ("gpu2", "cpu2")] {
        let (g, c) = (external_energy(g), external_energy(c));
        assert!(g[0] < 0.0, "{g:?}");
        for (x, y) in g.iter().zip(&c) {
            // The same states, the same sums but for the logarithms' last bits (and,
            // after the first step, the near fields' ~1e-7 in the positions).
            assert!((x / y - 1.0).abs() < 1e-9, "{g:?} {c:?}");
        }
    }
}

#[test]
fn block_steps_and_two_thread_ranks_on_the_emulated_gpus_follow_the_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ics = galaxy(d, 3000);
    // Hierarchical steps: each sub-step's forces on the active particles only.
    let block = "scheme = \"block\"";
    let said = run(
        d,
        &galaxy_run(d, &ics, "block_gpu", "", block),
        &["--backend", "cuda"],
        1,
    );
    assert!(
        said.contains("the particles stay on the device between steps"),
        "{said}"
    );
    run(
        d,
        &galaxy_run(d, &ics, "block_cpu", "", block),
        &["--backend", "cpu"],
        1,
    );
    assert_close_runs(d, "block_gpu", "block_cpu", 1e-8);
    // Two thread ranks, a GPU each: the distributed FMM with each rank's passes on its GPU,
    // the payload (which carries exact positions) through NCCL. So do the CPU ranks' LET with the f64 near
    // field (the mixed one's compressed wire moves them by up to 4e-6 of a leaf's radius,
    // 1e-7 of the energy); the GPU has the mixed one only, whose f32 pairs put the
    // energy 2.2e-8 from the f64 ones' here.
    let exact = "near_field = \"double\"";
    let two = ["--ranks", "2", "--backend"];
    let gpus = run(
        d,
        &galaxy_run(d, &ics, "ranks_gpu", "", ""),
        &[&two[..], &["cuda"]].concat(),
        2,
    );
    assert!(gpus.contains("on 2 ranks, solver 'fmm-cuda'"), "{gpus}");
    assert!(
        gpus.contains("the LET payload moves between the GPUs through NCCL"),
        "{gpus}"
    );
    // Each rank's particles stay on its GPU; particles moved between the ranks (the
    // domains rebalance on the work measured), so the devices' migration ran.
    assert!(
        gpus.contains("the particles stay on the device between steps"),
        "{gpus}"
    );
    let migrated = |name: &str| -> f64 {
        let file = d.join("runs").join(name).join("diagnostics.csv");
        Diagnostics::read(&file)
            .column("rank_migrated")
            .iter()
            .sum()
    };
    assert!(migrated("ranks_gpu") > 0.0, "no particle changed ranks");
    run(
        d,
        &galaxy_run(d, &ics, "ranks_cpu", exact, ""),
        &[&two[..], &["cpu"]].concat(),
        2,
    );
    assert_close_runs(d, "ranks_gpu", "ranks_cpu", 5e-8);
    // The two ranks sharing one GPU (`cuda` asked for by name), the payload through the
    // host: the same bits.
    let shared = run(
        d,
        &galaxy_run(d, &ics, "ranks_shared", "", ""),
        &[&two[..], &["cuda"]].concat(),
        1,
    );
    assert!(
        shared.contains("the LET payload moves between the GPUs through the host"),
        "{shared}"
    );
    assert!(
        last_snapshot(d, "ranks_gpu") == last_snapshot(d, "ranks_shared"),
        "two ranks sharing a GPU differ from two ranks with a GPU each"
    );
    // The same run with each launch's blocks and threads shuffled: the same bits.
    run_scheduled(
        d,
        &galaxy_run(d, &ics, "ranks_again", "", ""),
        &[&two[..], &["cuda"]].concat(),
        2,
        "shuffled",
    );
    assert!(
        last_snapshot(d, "ranks_gpu") == last_snapshot(d, "ranks_again"),
        "two runs on two devices differ (the second with its blocks and threads shuffled)"
    );
    // Block steps on two ranks: sub-steps on the active particles kept on each GPU, and
    // at each cycle's end a full evaluation that moves particles (their rungs with them).
    run(
        d,
        &galaxy_run(d, &ics, "block_ranks_gpu", "", block),
        &[&two[..], &["cuda"]].concat(),
        2,
    );
    run(
        d,
        &galaxy_run(d, &ics, "block_ranks_cpu", exact, block),
        &[&two[..], &["cpu"]].concat(),
        2,
    );
    assert!(
        migrated("block_ranks_gpu") > 0.0,
        "no particle changed ranks"
    );
    assert_close_runs(d, "block_ranks_gpu", "block_ranks_cpu", 5e-8);
}

#[test]
fn a_resident_run_on_the_emulated_gpu_stopped_and_resumed_repeats_its_bits() {
    stopped_and_resumed_on_emulated_gpus(1);
}

#[test]
fn two_ranks_resident_on_their_emulated_gpus_stopped_and_resumed_repeat_their_bits() {
    stopped_and_resumed_on_emulated_gpus(2);
}

/// A run on `ranks` thread ranks with a GPU each, its particles resident there, stopped by
/// SIGTERM after a checkpoint and resumed, gives the bits of the same run straight through.
fn stopped_and_resumed_on_emulated_gpus(ranks: usize) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ics = galaxy(d, 3000);
    let ranks_text = ranks.to_string();
    let args = ["--backend", "cuda", "--ranks", &ranks_text];
    // To 6e-4 with checkpoints every 2e-4: the resident state comes back for each.
    let config = |name: &str| {
        let text = galaxy_text(&ics, name, "", "")
            .replace("t_end = 0.0004", "t_end = 0.0006")
            .replace("snapshot_interval = 0.0004", "snapshot_interval = 0.0006")
            + "checkpoint_interval = 0.0002\nkeep_checkpoints = 10\n";
        write(d, &format!("{name}.toml"), &text)
    };
    let straight = config("straight");
    run(d, &straight, &args, ranks);
    let reference = last_snapshot(d, "straight");

    // Stopped by SIGTERM once the checkpoint at 2e-4 is there, then resumed.
    let stopped = config("stopped");
    let child = on_emulated_gpu(d)
        .env("LEAPFMM_EMULATED_GPUS", &ranks_text)
        .args(["run", stopped.to_str().unwrap(), "--quiet"])
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let folder = d.join("runs/stopped/checkpoints");
    let start = std::time::Instant::now();
    // Committed checkpoints: a `.ckpt` file on one rank, a `.manifest` over the ranks'
    // folder on several.
    let committed = || {
        std::fs::read_dir(&folder).map_or(0, |entries| {
            entries
                .flatten()
                .filter(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    name.ends_with(".ckpt") || name.ends_with(".manifest")
                })
                .count()
        })
    };
    while committed() < 2 {
        assert!(start.elapsed().as_secs() < 120, "no second checkpoint");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // SAFETY: plain kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(i32::from(leapfmm::simulation::EXIT_STOPPED)),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !d.join("runs/stopped/snapshots/snap_001.hdf5").exists()
            && !d.join("runs/stopped/snapshots/snapdir_001").exists(),
        "the signal came after the run finished: the test proved nothing"
    );
    run(d, &stopped, &[&args[..], &["--resume"]].concat(), ranks);
    assert!(
        last_snapshot(d, "stopped") == reference,
        "the resumed run differs from the straight one"
    );
}

#[test]
fn a_run_that_does_not_fit_on_the_emulated_gpu_stops_with_one_clear_sentence() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ics = galaxy(d, 3000);
    // 1 MB: the run takes 2.3 MB at the most (LEAPFMM_EMULATED_TRACE).
    let out = on_emulated_gpu(d)
        .env("LEAPFMM_EMULATED_MEMORY", "1000000")
        .args(["run", galaxy_run(d, &ics, "full", "", "").to_str().unwrap()])
        .args(["--backend", "cuda"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("error: GPU backend: the GPU's memory is full (CUDA_ERROR_OUT_OF_MEMORY): run fewer particles per GPU"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn forces_on_the_emulated_gpu_at_other_orders_leaves_and_kernels_are_the_cpus() {
    let dir = tempfile::tempdir().unwrap();
    let ics = galaxy(dir.path(), 3000);
    let ics = ics.to_str().unwrap();
    // Order 3 takes the rotated M2L, 12 the direct form's general kernel; small and large
    // leaves; the Plummer pair and the Newtonian one.
    for settings in [
        &[
            "--order",
            "3",
            "--leaf-size",
            "16",
            "--softening",
            "0.05",
            "--kernel",
            "plummer",
        ][..],
        &["--order", "12", "--theta", "0.5", "--softening", "0.05"],
        &["--leaf-size", "512", "--softening", "0"],
    ] {
        let out = on_emulated_gpu(dir.path())
            .args(["forces", ics, "--backend", "cuda", "-o", "f.hdf5"])
            .args(settings)
            .output()
            .unwrap();
        let stdout = succeeded(out, &format!("forces {settings:?}"));
        let max = max_difference(&stdout, "GPU vs CPU accelerations (one rank)");
        assert!(max <= 1e-5, "{settings:?}: {max:e}\n{stdout}");
    }
}

#[test]
fn a_kernel_cache_that_cannot_be_written_is_named_and_can_be_moved_or_turned_off() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ics = galaxy(d, 3000);
    // HOME a file: its .cache cannot be made.
    let home = write(d, "not_a_folder", "");
    let forces = |cache: Option<&str>| {
        let mut cmd = on_emulated_gpu(d);
        cmd.env("HOME", &home)
            .args(["forces", ics.to_str().unwrap(), "--backend", "cuda"])
            .args(["--softening", "0.05", "-o", "f.hdf5"]);
        if let Some(c) = cache {
            cmd.env("LEAPFMM_KERNEL_CACHE", c);
        }
        cmd.output().unwrap()
    };
    let out = forces(None);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("not_a_folder/.cache/leapfmm/kernels")
            && err.contains("LEAPFMM_KERNEL_CACHE=off"),
        "{err}"
    );
    succeeded(forces(Some("off")), "forces without a kernel cache");
    let elsewhere = d.join("elsewhere");
    succeeded(
        forces(Some(elsewhere.to_str().unwrap())),
        "forces with the cache elsewhere",
    );
    assert!(std::fs::read_dir(&elsewhere).unwrap().count() > 0);
}

#[test]
fn a_machine_with_a_gpu_but_no_nvrtc_runs_on_the_cpu_under_auto_and_says_why() {
    // What is loadable here besides the emulated driver decides the case: skip where a
    // system NVRTC is on the default library path (a developer's GPU machine).
    if leapfmm::gpu::nvrtc::available() {
        eprintln!("skipped: this machine has an NVRTC of its own");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ics = galaxy(d, 3000);
    // The driver alone, without NVRTC under its name.
    let alone = d.join("driver_alone");
    std::fs::create_dir(&alone).unwrap();
    std::os::unix::fs::symlink(
        emulation::driver().join("libcuda.so"),
        alone.join("libcuda.so"),
    )
    .unwrap();
    let config = galaxy_run(d, &ics, "auto", "", "");
    let run = |backend: &str| {
        bin()
            .current_dir(d)
            .env("LD_LIBRARY_PATH", &alone)
            .env("HOME", d)
            .args(["run", config.to_str().unwrap(), "--backend", backend])
            .output()
            .unwrap()
    };
    let err_of = |out: &Output| String::from_utf8_lossy(&out.stderr).into_owned();
    let nvrtc = "NVRTC (libnvrtc.so.12) is not installed or not on LD_LIBRARY_PATH";
    let out = run("cuda");
    assert_eq!(out.status.code(), Some(1), "{}", err_of(&out));
    assert!(err_of(&out).contains(nvrtc), "{}", err_of(&out));
    let out = run("auto");
    let err = err_of(&out);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains(&format!("backend: cpu (auto: {nvrtc}")),
        "{err}"
    );
}

/// What the emulated driver counted over a whole run (`LEAPFMM_EMULATED_TRACE`): device
/// allocations, bytes up and bytes down.
fn traffic(printed: &str) -> [u64; 3] {
    let line = printed
        .lines()
        .find(|l| l.starts_with("emulated devices:"))
        .unwrap_or_else(|| panic!("no traffic line in:\n{printed}"));
    let number_before = |word: &str| -> u64 {
        let head = &line[..line
            .find(word)
            .unwrap_or_else(|| panic!("{word} in {line}"))];
        let n = head.trim_end().rsplit([' ', '(']).next().unwrap();
        n.parse()
            .unwrap_or_else(|_| panic!("{n:?} before {word} in {line}"))
    };
    let after = |from: &str| -> u64 {
        let tail = &line[line.find(from).unwrap() + from.len()..];
        let bytes = tail.split(" copies, ").nth(1).unwrap();
        bytes.split(' ').next().unwrap().parse().unwrap()
    };
    [
        number_before(" allocations"),
        after("host to device "),
        after("device to host "),
    ]
}

#[test]
fn a_step_on_two_emulated_gpus_allocates_nothing_and_moves_little() {
    // Issue 34's steady state: two thread ranks with a GPU each, fixed steps, run for 3 and
    // for 8 steps (the same outputs), so that the difference is what steps 4–8 cost.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let n = 8000;
    let ics = galaxy(d, n);
    let counted = |steps: u32| -> [u64; 3] {
        let name = format!("steps{steps}");
        let end = format!("{:.4}", f64::from(steps) * 1e-4);
        let text = galaxy_text(&ics, &name, "", "fixed_step = true\n")
            .replace("t_end = 0.0004", &format!("t_end = {end}"))
            .replace(
                "snapshot_interval = 0.0004",
                &format!("snapshot_interval = {end}"),
            );
        let config = write(d, &format!("{name}.toml"), &text);
        let out = on_emulated_gpu(d)
            .env("LEAPFMM_EMULATED_GPUS", "2")
            .env("LEAPFMM_EMULATED_TRACE", "1")
            .args(["run", config.to_str().unwrap(), "--backend", "cuda"])
            .args(["--ranks", "2"])
            .output()
            .unwrap();
        traffic(&succeeded(out, &name))
    };
    let (short, long) = (counted(3), counted(8));
    let per = |k: usize| (long[k] - short[k]) as f64 / 5.0 / n as f64;
    // No allocation once the buffers have grown (the scratch of a few leaving particles
    // or LET particles has a floor, so a few more than last time do not allocate).
    assert_eq!(long[0], short[0], "allocations in steps 4-8");
    // Measured 42.6 B up (the lists and the cells) and 31.4 B down (the positions, for the
    // host's decomposition; the tree order, for the work that balances the ranks; the cells
    // and their moments, for the host's walk and exchange) a particle a step. Before the
    // tree was built on the devices: 50.4 up (the tree order and each particle's leaf went
    // up) and 24.0 down; before the placeholders and the staying rows stayed there, 127.6 up.
    let (up, down) = (per(1), per(2));
    assert!(up <= 50.0, "{up:.1} bytes up a particle a step");
    assert!(down <= 35.0, "{down:.1} bytes down a particle a step");
}
