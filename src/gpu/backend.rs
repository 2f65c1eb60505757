//! Which backend runs a simulation's force passes (design §7): `auto` takes GPU 0 when this
//! machine has a CUDA driver, a device and NVRTC (to compile the kernels) and the run is one
//! the GPU backend can do, else the CPU, and says why; `cuda` insists and fails with the
//! reason. Never touches CUDA on a machine without its driver (cudarc would panic).

#[cfg(feature = "cuda")]
use super::error::GpuError;
use crate::config::Backend;

/// A CUDA device found on this machine.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceInfo {
    /// Device ordinal.
    pub ordinal: usize,
    /// "NVIDIA H200".
    pub name: String,
    /// "sm_90".
    pub arch: String,
    /// Device memory in bytes.
    pub memory_bytes: usize,
    /// GPUs on this machine (rank r of a run uses GPU r modulo this).
    pub devices: usize,
}

/// The backend chosen for a run.
#[derive(Debug, Clone, PartialEq)]
pub enum Chosen {
    /// The CPU, and why (requested, or what ruled the GPU out).
    Cpu(String),
    /// A CUDA device.
    Cuda(DeviceInfo),
}

impl Chosen {
    /// One line for the run's log.
    pub fn describe(&self) -> String {
        match self {
            Chosen::Cpu(why) => format!("backend: cpu ({why})"),
            Chosen::Cuda(d) => format!(
                "backend: cuda on GPU {}, {} ({}, {:.1} GiB){}",
                d.ordinal,
                d.name,
                d.arch,
                d.memory_bytes as f64 / f64::from(1u32 << 30),
                match d.devices {
                    1 => String::new(),
                    k => format!("; {k} GPUs here, rank r on GPU r mod {k}"),
                }
            ),
        }
    }
}

/// The CUDA device this process would use, or why there is none (no driver, no device, or
/// no NVRTC to compile the kernels for it).
#[cfg(feature = "cuda")]
pub fn probe() -> Result<DeviceInfo, String> {
    let device = device_info(0).map_err(|e| e.to_string())?;
    if !super::nvrtc::available() {
        return Err(super::nvrtc::KernelError::NoNvrtc.to_string());
    }
    Ok(device)
}

/// GPU `ordinal` of this machine: `NoDriver` or `NoDevice` when there is none (without
/// touching CUDA when its driver library is absent).
#[cfg(feature = "cuda")]
pub fn device_info(ordinal: usize) -> Result<DeviceInfo, GpuError> {
    // SAFETY: only tries to open the shared library.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(GpuError::NoDriver);
    }
    let devices = cudarc::driver::CudaContext::device_count()?;
    if devices <= ordinal as i32 {
        return Err(GpuError::NoDevice);
    }
    let ctx = cudarc::driver::CudaContext::new(ordinal)?;
    let (major, minor) = ctx.compute_capability()?;
    Ok(DeviceInfo {
        ordinal,
        name: ctx.name()?,
        arch: format!("sm_{major}{minor}"),
        memory_bytes: ctx.total_mem()?,
        devices: devices as usize,
    })
}

/// Without the `cuda` feature there is never a device.
#[cfg(not(feature = "cuda"))]
pub fn probe() -> Result<DeviceInfo, String> {
    Err("this leapfmm was built without the `cuda` feature".into())
}

/// Resolves `requested`; `unsupported` says why the GPU backend cannot do this run (e.g.
/// per-particle softening), `None` when it can. `device` finds the device (`probe`).
/// Under `auto`, `thread_ranks` ranks of this process take the GPUs only with one each;
/// `cuda` asked for by name lets them share (rank r on GPU r mod the count, as MPI ranks
/// do: slower, the LET payload then going through the host, but a machine with one GPU
/// can run and check a K-rank run).
pub fn choose(
    requested: Backend,
    unsupported: Option<&str>,
    thread_ranks: usize,
    device: impl FnOnce() -> Result<DeviceInfo, String>,
) -> Result<Chosen, String> {
    match requested {
        Backend::Cpu => Ok(Chosen::Cpu("requested".into())),
        Backend::Auto => Ok(match unsupported {
            Some(why) => Chosen::Cpu(format!("auto: the GPU backend {why}")),
            None => match device() {
                Ok(d) if d.devices < thread_ranks => Chosen::Cpu(format!(
                    "auto: {thread_ranks} ranks need one GPU each and this machine has {}",
                    d.devices
                )),
                Ok(d) => Chosen::Cuda(d),
                Err(why) => Chosen::Cpu(format!("auto: {why}")),
            },
        }),
        Backend::Cuda => match unsupported {
            Some(why) => Err(format!(
                "backend \"cuda\": the GPU backend {why}; use \"auto\" or \"cpu\""
            )),
            None => device()
                .map(Chosen::Cuda)
                .map_err(|why| format!("backend \"cuda\": {why}; use \"auto\" or \"cpu\"")),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h200() -> Result<DeviceInfo, String> {
        Ok(DeviceInfo {
            ordinal: 0,
            name: "NVIDIA H200".into(),
            arch: "sm_90".into(),
            memory_bytes: 150 << 30,
            devices: 2,
        })
    }

    fn none() -> Result<DeviceInfo, String> {
        Err("no CUDA driver (libcuda.so.1) on this machine".into())
    }

    #[test]
    fn auto_takes_the_gpu_when_there_is_one_and_the_run_fits() {
        let c = choose(Backend::Auto, None, 1, h200).unwrap();
        assert_eq!(
            c.describe(),
            "backend: cuda on GPU 0, NVIDIA H200 (sm_90, 150.0 GiB); 2 GPUs here, rank r on GPU r mod 2"
        );
        assert!(matches!(
            choose(Backend::Auto, None, 2, h200),
            Ok(Chosen::Cuda(_))
        ));
        let c = choose(Backend::Auto, None, 3, h200).unwrap();
        assert_eq!(
            c.describe(),
            "backend: cpu (auto: 3 ranks need one GPU each and this machine has 2)"
        );
        let c = choose(Backend::Auto, None, 1, none).unwrap();
        assert_eq!(
            c.describe(),
            "backend: cpu (auto: no CUDA driver (libcuda.so.1) on this machine)"
        );
        let c = choose(Backend::Auto, Some("runs the FMM only"), 1, h200).unwrap();
        assert_eq!(
            c.describe(),
            "backend: cpu (auto: the GPU backend runs the FMM only)"
        );
        assert_eq!(
            choose(Backend::Cpu, None, 1, h200).unwrap(),
            Chosen::Cpu("requested".into())
        );
    }

    #[test]
    fn cuda_without_a_device_or_for_an_unsupported_run_is_an_error() {
        let e = choose(Backend::Cuda, None, 1, none).unwrap_err();
        assert_eq!(
            e,
            "backend \"cuda\": no CUDA driver (libcuda.so.1) on this machine; use \"auto\" or \"cpu\""
        );
        let e = choose(Backend::Cuda, Some("runs the FMM only"), 1, h200).unwrap_err();
        assert!(e.contains("runs the FMM only"), "{e}");
        assert!(matches!(
            choose(Backend::Cuda, None, 1, h200),
            Ok(Chosen::Cuda(_))
        ));
    }

    #[test]
    fn cuda_asked_for_by_name_lets_more_ranks_than_gpus_share_them() {
        let c = choose(Backend::Cuda, None, 4, h200).unwrap();
        assert_eq!(
            c.describe(),
            "backend: cuda on GPU 0, NVIDIA H200 (sm_90, 150.0 GiB); 2 GPUs here, rank r on GPU r mod 2"
        );
        // `auto` takes them only with one each.
        assert!(matches!(
            choose(Backend::Auto, None, 4, h200),
            Ok(Chosen::Cpu(_))
        ));
    }
}
