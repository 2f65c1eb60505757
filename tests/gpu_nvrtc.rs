//! The embedded kernels compile with NVRTC through cudarc, and the PTX cache is used on the
//! second start and keyed by architecture. Needs libnvrtc (`make kernels-check` provides it
//! and sets LEAPFMM_REQUIRE_NVRTC=1, so that CI cannot skip this); without it the test says
//! so and passes.

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
    eprintln!("NVRTC {:?}", version().unwrap());
    let cache = tempfile::tempdir().unwrap();
    let first = compile_all("sm_90", Some(cache.path())).unwrap();
    assert_eq!(first.len(), 3);
    assert!(first.iter().all(|k| !k.cached));
    for entry in [
        "p2p_leaves",
        "kick",
        "drift",
        "p2m_leaves",
        "m2l_cells",
        "l2p_particles",
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
    assert_eq!(std::fs::read_dir(cache.path()).unwrap().count(), 6);
}
