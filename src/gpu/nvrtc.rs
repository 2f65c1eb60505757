//! NVRTC compilation of the embedded kernels for one GPU architecture, cached on disk under
//! a key of the expanded source, the architecture and the NVRTC version (a changed kernel,
//! another GPU or another NVRTC never reuse a stale PTX).

use super::{expand_includes, units};
use cudarc::nvrtc::{CompileError, CompileOptions, compile_ptx_with_opts, sys};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

/// Why the kernels could not be compiled.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// libnvrtc could not be loaded.
    #[error(
        "NVRTC (libnvrtc.so.12) is not installed or not on LD_LIBRARY_PATH; the GPU backend needs it to compile its kernels (pip install nvidia-cuda-nvrtc-cu12 ships it)"
    )]
    NoNvrtc,
    /// A kernel does not compile (a bug in kernels/).
    #[error("kernel {name} does not compile for {arch}: {log}")]
    Compile {
        /// The source file.
        name: &'static str,
        /// The target architecture.
        arch: String,
        /// NVRTC's log.
        log: String,
    },
    /// The cache folder could not be used.
    #[error(
        "kernel cache {path}: {reason} (LEAPFMM_KERNEL_CACHE=FOLDER puts it elsewhere, LEAPFMM_KERNEL_CACHE=off turns it off)"
    )]
    Cache {
        /// The file or folder.
        path: PathBuf,
        /// The OS error.
        reason: String,
    },
}

/// One compiled kernel source.
#[derive(Debug, Clone)]
pub struct CompiledKernel {
    /// Its file in kernels/.
    pub name: &'static str,
    /// The PTX text.
    pub ptx: String,
    /// True when it came from the cache.
    pub cached: bool,
}

/// Whether libnvrtc can be loaded (cudarc panics on first use otherwise).
pub fn available() -> bool {
    // SAFETY: only tries to open the shared library.
    unsafe { sys::is_culib_present() }
}

/// NVRTC's (major, minor) version.
pub fn version() -> Result<(i32, i32), KernelError> {
    if !available() {
        return Err(KernelError::NoNvrtc);
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the library is present; nvrtcVersion writes two ints.
    unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
    Ok((major, minor))
}

/// NVRTC options besides the architecture (scripts/nvrtc-check.py compiles with the same).
/// `-ftz=true` flushes f32 denormals to zero: the near field's f32 values are nowhere near
/// 1e-38, and without it every `rsqrtf` carries a rescaling for denormal inputs (four more
/// instructions per particle pair, in a loop of about thirty).
const OPTIONS: [&str; 2] = ["--std=c++17", "-ftz=true"];

/// The cache file name of `source` for `arch` under NVRTC `version`.
fn cache_key(source: &str, arch: &str, version: (i32, i32)) -> String {
    let mut h = Sha256::new();
    h.update(source.as_bytes());
    h.update(format!("\0{arch}\0{}.{}", version.0, version.1).as_bytes());
    h.update(OPTIONS.join("\0").as_bytes());
    let digest = h.finalize();
    let hex: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
    format!("{hex}.ptx")
}

/// Every kernel source compiled to PTX for `arch` (e.g. "sm_90"), from `cache` when it holds
/// them and into it otherwise (`None`: no cache).
pub fn compile_all(arch: &str, cache: Option<&Path>) -> Result<Vec<CompiledKernel>, KernelError> {
    let version = version()?;
    let cache_err = |path: &Path, e: std::io::Error| KernelError::Cache {
        path: path.to_path_buf(),
        reason: e.to_string(),
    };
    if let Some(dir) = cache {
        std::fs::create_dir_all(dir).map_err(|e| cache_err(dir, e))?;
    }
    let mut out = Vec::new();
    for (name, text) in units() {
        let source = expand_includes(text).map_err(|log| KernelError::Compile {
            name,
            arch: arch.to_string(),
            log,
        })?;
        let file = cache.map(|dir| dir.join(cache_key(&source, arch, version)));
        if let Some(ptx) = file
            .as_deref()
            .and_then(|f| std::fs::read_to_string(f).ok())
        {
            out.push(CompiledKernel {
                name,
                ptx,
                cached: true,
            });
            continue;
        }
        let options = CompileOptions {
            name: Some(name.to_string()),
            options: std::iter::once(format!("--gpu-architecture={arch}"))
                .chain(OPTIONS.map(String::from))
                .collect(),
            ..Default::default()
        };
        let ptx = compile_ptx_with_opts(&source, options)
            .map_err(|e| KernelError::Compile {
                name,
                arch: arch.to_string(),
                log: match e {
                    CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
                    other => format!("{other:?}"),
                },
            })?
            .to_src();
        if let Some(f) = &file {
            // Written under a temporary name of its own and renamed: a reader never sees half
            // a file, and ranks (threads or processes) compiling at once never share one.
            static WRITES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
            let write = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let tmp = f.with_extension(format!("ptx.{}.{write}.tmp", std::process::id()));
            std::fs::write(&tmp, &ptx).map_err(|e| cache_err(&tmp, e))?;
            std::fs::rename(&tmp, f).map_err(|e| cache_err(f, e))?;
        }
        out.push(CompiledKernel {
            name,
            ptx,
            cached: false,
        });
    }
    Ok(out)
}
