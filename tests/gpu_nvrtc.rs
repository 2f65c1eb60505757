//! The embedded kernels compile with NVRTC through cudarc, and the PTX cache is used on the
//! second start and keyed by architecture. Needs libnvrtc (`make kernels-check` provides it
//! and sets LEAPFMM_REQUIRE_NVRTC=1, so that CI cannot skip this; it runs it with NVRTC 12
//! and with 13, setting LEAPFMM_REQUIRE_NVRTC_MAJOR to the one it means); without it the
//! test says so and passes.

#![cfg(feature = "cuda")]

use leapfmm::gpu::nvrtc::{available, compile_all, version};

#[test]
fn kernels_compile_with_nvrtc_and_the_ptx_cache_is_reused() {
    if !available() {
        assert!(
            std::env::var_os("LEAPFMM_REQUIRE_NVRTC").is_none(),
            "LEAPFMM_REQUIRE_NVRTC is set but libnvrtc cannot be loaded"
        );
        eprintln!("libnvrtc not found: NVRTC check skipped (make kernels-check runs it)");
        return;
    }
    let (major, minor) = version().unwrap();
    eprintln!("NVRTC {major}.{minor}");
    // make kernels-check runs this with NVRTC 12 and 13 (the GPU machine's): each must be
    // the one it put on the path.
    if let Some(wanted) = std::env::var_os("LEAPFMM_REQUIRE_NVRTC_MAJOR") {
        assert_eq!(
            wanted.to_string_lossy(),
            major.to_string(),
            "NVRTC {major}.{minor} loaded"
        );
    }
    let cache = tempfile::tempdir().unwrap();
    let first = compile_all("sm_90", Some(cache.path())).unwrap();
    let units = leapfmm::gpu::units().count();
    assert_eq!(first.len(), units);
    assert!(first.iter().all(|k| !k.cached));
    for entry in [
        "p2p_leaves",
        "kick",
        "kick_each",
        "drift",
        "gather_tree_order",
        "gather_rows",
        "gather_labels",
        "staying_rows",
        "scatter_forces",
        "max_acceleration_blocks",
        "conserved_chunks",
        "p2m_leaves",
        "m2l_cells",
        "m2l_cells_p8",
        "l2p_particles",
        "bounds_blocks",
        "morton_keys",
        "radix_count",
        "radix_offsets",
        "radix_scatter",
        "m2m_cells",
        "l2l_cells",
        "leaf_of_particles",
        "mark_rows",
        "flag_cells_holding",
        "level_moments",
        "ancestor_r2",
        "finish_moments",
        "walk_level",
        "sort_scan",
        "order_equal_runs",
        "split_count",
        "split_write",
        "m2l_rotated_1",
        "m2l_rotated_7",
        "m2l_rotated_8",
    ] {
        assert!(
            first
                .iter()
                .any(|k| k.ptx.contains(&format!(".entry {entry}("))),
            "no kernel {entry} in the PTX"
        );
    }
    let again = compile_all("sm_90", Some(cache.path())).unwrap();
    assert!(again.iter().all(|k| k.cached));
    for (a, b) in first.iter().zip(&again) {
        assert_eq!(a.ptx, b.ptx, "{}", a.name);
    }
    let other = compile_all("sm_80", Some(cache.path())).unwrap();
    assert!(other.iter().all(|k| !k.cached), "sm_80 reused sm_90's PTX");
    assert_eq!(std::fs::read_dir(cache.path()).unwrap().count(), 2 * units);
}

#[test]
fn forces_on_the_cuda_backend_without_a_driver_is_a_clear_error() {
    // SAFETY: only tries to open the shared library.
    if unsafe { cudarc::driver::sys::is_culib_present() } {
        eprintln!("a CUDA driver is present: scripts/gpu-check.sh checks the GPU passes");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bin = env!("CARGO_BIN_EXE_leapfmm");
    let model = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("ics/plummer.toml");
    let run = |args: &[&str]| {
        std::process::Command::new(bin)
            .current_dir(dir.path())
            .args(args)
            .output()
            .unwrap()
    };
    let ics = run(&["ics", model.to_str().unwrap(), "--n", "300", "-o", "s.hdf5"]);
    assert!(ics.status.success());
    for ranks in ["1", "2"] {
        let out = run(&[
            "forces",
            "s.hdf5",
            "--softening",
            "0.05",
            "--backend",
            "cuda",
            "--ranks",
            ranks,
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains("no CUDA driver"), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        // On K ranks it says so before the CPU ranks' evaluation.
        assert!(!stderr.contains("evaluation(s) on"), "{stderr}");
    }
}

#[test]
fn a_run_says_which_backend_it_uses_and_cuda_without_a_gpu_is_a_clear_error() {
    // SAFETY: only tries to open the shared library.
    if unsafe { cudarc::driver::sys::is_culib_present() } {
        eprintln!("a CUDA driver is present: scripts/gpu-check.sh checks the GPU backend");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let model = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("ics/plummer.toml");
    let config = |extra: &str| {
        format!(
            "name = \"b\"\nunits = \"nbody\"\n[ics]\nmodel = \"{}\"\nn = 300\n[gravity]\nsoftening = 0.05\n{extra}\n[integrator]\nt_end = 0.02\ndt_max = 0.01\n",
            model.display()
        )
    };
    std::fs::write(dir.path().join("auto.toml"), config("")).unwrap();
    std::fs::write(dir.path().join("gpu.toml"), config("backend = \"gpu\"")).unwrap();
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_leapfmm"))
            .current_dir(dir.path())
            .args(args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!stderr.contains("panicked"), "{stderr}");
        (out.status.code(), stderr)
    };
    let (code, stderr) = run(&["run", "auto.toml", "--backend", "cuda"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("gravity.backend: backend \"cuda\": no CUDA driver"),
        "{stderr}"
    );
    assert!(
        !dir.path().join("runs/b").exists(),
        "a refused run wrote files"
    );
    let (code, stderr) = run(&["run", "auto.toml"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains("b: backend: cpu (auto: no CUDA driver (libcuda.so.1) on this machine)"),
        "{stderr}"
    );
    let (code, stderr) = run(&["run", "gpu.toml"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("key 'gravity.backend': unknown variant `gpu`"),
        "{stderr}"
    );
}
