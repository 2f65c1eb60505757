//! The CPU emulation of the CUDA kernels (kernels/emulation), built for the tests: the
//! harness that runs single kernels (tests/gpu_kernels.rs) and the emulated CUDA driver and
//! NVRTC that run the binary's whole GPU backend (tests/gpu_emulated.rs). Each is built once
//! for its sources and kept in Cargo's scratch directory for tests under a name made of the
//! hash of the sources and compiler flags, so that the test processes (nextest runs each
//! test in its own) share one build and a changed kernel gets a new one.
//! Needs a C++20 compiler (`c++`; scripts/install-deps.sh installs g++).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The harness executable (kernels/emulation/harness.cpp).
pub fn harness() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| build("harness.cpp", "emulation-harness-", &[]))
        .clone()
}

/// A folder holding the emulated driver (kernels/emulation/driver.cpp) as `libcuda.so`,
/// `libnvrtc.so` and `libnccl.so`: first on a process's LD_LIBRARY_PATH, it is the GPU
/// (and the NCCL) cudarc finds.
pub fn driver() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| build("driver.cpp", "emulated-driver-", &["-shared", "-fPIC"]))
        .clone()
}

/// Builds `kernels/emulation/<source>` (or finds it built): an executable, or with
/// `-shared` a folder with the library under both names. Builds for sources that are gone
/// are removed.
fn build(source: &str, prefix: &str, extra: &[&str]) -> PathBuf {
    use sha2::{Digest, Sha256};
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut sources: Vec<PathBuf> = ["kernels", "kernels/emulation"]
        .iter()
        .flat_map(|d| std::fs::read_dir(root.join(d)).unwrap().flatten())
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    sources.sort();
    // `#pragma unroll` is nvcc's; the emulation runs the loops as written.
    let flags = [
        "-std=c++20",
        "-O2",
        "-pthread",
        "-Wall",
        "-Werror",
        "-Wno-unknown-pragmas",
    ];
    let mut h = Sha256::new();
    h.update(flags.join(" "));
    h.update(extra.join(" "));
    h.update(source);
    for p in &sources {
        h.update(p.file_name().unwrap().as_encoded_bytes());
        h.update(std::fs::read(p).unwrap());
    }
    let hex: String = h.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let built = dir.join(format!("{prefix}{hex}"));
    if built.exists() {
        return built;
    }
    // Built under a name of its own, then renamed into place: another test process may be
    // building the same thing at the same time.
    let building = dir.join(format!("{prefix}{hex}.{}", std::process::id()));
    let library = extra.contains(&"-shared");
    let output = if library {
        std::fs::create_dir_all(&building).unwrap();
        building.join("libcuda.so")
    } else {
        building.clone()
    };
    let out = Command::new("c++")
        .args(flags)
        .args(extra)
        .arg("-I")
        .arg(root.join("kernels"))
        .arg(root.join("kernels/emulation").join(source))
        .arg("-o")
        .arg(&output)
        .output()
        .expect("a C++ compiler `c++` (install g++: scripts/install-deps.sh)");
    assert!(
        out.status.success(),
        "the kernels do not build under the emulation ({source}):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    if library {
        for name in ["libnvrtc.so", "libnccl.so"] {
            std::os::unix::fs::symlink("libcuda.so", building.join(name)).unwrap();
        }
    }
    // A rename onto a folder another process put there first fails; theirs is as good.
    if std::fs::rename(&building, &built).is_err() {
        let _ = std::fs::remove_dir_all(&building);
    }
    for old in std::fs::read_dir(dir).unwrap().flatten() {
        let name = old.file_name().to_string_lossy().into_owned();
        if name.starts_with(prefix) && !name.contains('.') && old.path() != built {
            let _ = std::fs::remove_dir_all(old.path());
            let _ = std::fs::remove_file(old.path());
        }
    }
    built
}
