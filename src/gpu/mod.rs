//! The GPU backend (design §7), in progress: the CUDA kernels of `kernels/` embedded in the
//! binary and compiled at start-up by NVRTC (through cudarc, loaded at run time, so neither
//! the build nor a CPU-only machine needs CUDA), with an on-disk cache of the PTX.
//!
//! Owns the device: kernels, their compilation and cache, the device's buffers, state,
//! tree, walk, passes and payload moves, and the choice of backend. Must not decide physics
//! (it runs `fmm::backend`'s plan and the integrator's kick and drift as the host would) or
//! write files.

pub mod backend;
#[cfg(feature = "cuda")]
pub mod buffers;
#[cfg(feature = "cuda")]
pub mod context;
#[cfg(feature = "cuda")]
pub mod error;
pub mod memory;
#[cfg(feature = "cuda")]
pub mod nccl;
#[cfg(feature = "cuda")]
pub mod nvrtc;
#[cfg(feature = "cuda")]
pub mod passes;
#[cfg(feature = "cuda")]
pub mod payload;
#[cfg(feature = "cuda")]
pub mod rank;
#[cfg(feature = "cuda")]
pub mod solver;
pub mod sort;
#[cfg(feature = "cuda")]
pub mod state;
#[cfg(feature = "cuda")]
pub mod traversal;
#[cfg(feature = "cuda")]
pub mod tree;

/// Where compiled kernels are cached: `LEAPFMM_KERNEL_CACHE` (a folder, or `off` for no
/// cache: a machine whose HOME cannot be written), else `$HOME/.cache/leapfmm/kernels`
/// (none without HOME).
pub fn kernel_cache() -> Option<std::path::PathBuf> {
    match std::env::var_os(KERNEL_CACHE_ENV) {
        Some(v) if v == "off" => None,
        Some(v) if !v.is_empty() => Some(v.into()),
        _ => std::env::var_os("HOME")
            .map(|h| std::path::Path::new(&h).join(".cache/leapfmm/kernels")),
    }
}

/// The variable that moves (or turns off) the kernel cache.
const KERNEL_CACHE_ENV: &str = "LEAPFMM_KERNEL_CACHE";

/// The kernel sources, embedded: (file name, text). Headers (`.cuh`) are spliced into the
/// sources that include them before compilation (`expand_includes`).
pub const SOURCES: [(&str, &str); 12] = [
    ("common.cuh", include_str!("../../kernels/common.cuh")),
    (
        "expansions.cuh",
        include_str!("../../kernels/expansions.cuh"),
    ),
    ("p2p.cu", include_str!("../../kernels/p2p.cu")),
    ("expansions.cu", include_str!("../../kernels/expansions.cu")),
    ("integrate.cu", include_str!("../../kernels/integrate.cu")),
    ("keys.cu", include_str!("../../kernels/keys.cu")),
    ("moments.cu", include_str!("../../kernels/moments.cu")),
    ("walk.cu", include_str!("../../kernels/walk.cu")),
    ("split.cu", include_str!("../../kernels/split.cu")),
    ("external.cu", include_str!("../../kernels/external.cu")),
    ("rotations.cuh", include_str!("../../kernels/rotations.cuh")),
    (
        "m2l_rotated.cu",
        include_str!("../../kernels/m2l_rotated.cu"),
    ),
];

/// The compilation units (`.cu` files) among `SOURCES`.
pub fn units() -> impl Iterator<Item = (&'static str, &'static str)> {
    SOURCES
        .into_iter()
        .filter(|(name, _)| name.ends_with(".cu"))
}

/// `source` with every `#include "X"` of an embedded header replaced by the header's text
/// (each header once), so NVRTC needs no include path on disk.
pub fn expand_includes(source: &str) -> Result<String, String> {
    let mut out = String::with_capacity(source.len());
    let mut seen = Vec::new();
    splice(source, &mut out, &mut seen)?;
    Ok(out)
}

fn splice(source: &str, out: &mut String, seen: &mut Vec<&'static str>) -> Result<(), String> {
    for line in source.lines() {
        let included = line
            .trim()
            .strip_prefix("#include \"")
            .and_then(|rest| rest.strip_suffix('"'));
        match included {
            Some(name) => {
                let (header, text) = SOURCES
                    .iter()
                    .find(|(n, _)| *n == name)
                    .ok_or_else(|| format!("kernel header {name} is not embedded"))?;
                if !seen.contains(header) {
                    seen.push(header);
                    splice(text, out, seen)?;
                }
            }
            None if line.trim() == "#pragma once" => {}
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_file_is_embedded_and_includes_expand() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels");
        let mut on_disk: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".cu") || n.ends_with(".cuh"))
            .collect();
        on_disk.sort();
        let mut embedded: Vec<String> = SOURCES.iter().map(|(n, _)| n.to_string()).collect();
        embedded.sort();
        assert_eq!(
            on_disk, embedded,
            "embed every kernels/*.cu and *.cuh in SOURCES"
        );
        for (name, text) in units() {
            let full = expand_includes(text).unwrap();
            assert!(!full.contains("#include \""), "{name}");
            assert!(!full.contains("#pragma once"), "{name}");
        }
        let p2p = expand_includes(SOURCES[2].1).unwrap();
        assert_eq!(p2p.matches("void plummer_factors").count(), 1);
        assert!(expand_includes("#include \"missing.cuh\"").is_err());
    }
}
