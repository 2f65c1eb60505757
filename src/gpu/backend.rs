//! Which backend runs a simulation's force passes (design §7): `auto` takes GPU 0 when this
//! machine has a CUDA driver and device and the run is one the GPU backend can do, else the
//! CPU, and says why; `cuda` insists and fails with the reason. Never touches CUDA on a
//! machine without its driver (cudarc would panic).

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
                "backend: cuda on GPU {}, {} ({}, {:.1} GiB)",
                d.ordinal,
                d.name,
                d.arch,
                d.memory_bytes as f64 / f64::from(1u32 << 30)
            ),
        }
    }
}

/// The CUDA device this process would use, or why there is none.
#[cfg(feature = "cuda")]
pub fn probe() -> Result<DeviceInfo, String> {
    super::device::probe(0).map_err(|e| e.to_string())
}

/// Without the `cuda` feature there is never a device.
#[cfg(not(feature = "cuda"))]
pub fn probe() -> Result<DeviceInfo, String> {
    Err("this leapfmm was built without the `cuda` feature".into())
}

/// Resolves `requested`; `unsupported` says why the GPU backend cannot do this run (e.g.
/// several ranks), `None` when it can. `device` finds the device (`probe`).
pub fn choose(
    requested: Backend,
    unsupported: Option<&str>,
    device: impl FnOnce() -> Result<DeviceInfo, String>,
) -> Result<Chosen, String> {
    match requested {
        Backend::Cpu => Ok(Chosen::Cpu("requested".into())),
        Backend::Auto => Ok(match unsupported {
            Some(why) => Chosen::Cpu(format!("auto: the GPU backend {why}")),
            None => match device() {
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
        })
    }

    fn none() -> Result<DeviceInfo, String> {
        Err("no CUDA driver (libcuda.so.1) on this machine".into())
    }

    #[test]
    fn auto_takes_the_gpu_when_there_is_one_and_the_run_fits() {
        let c = choose(Backend::Auto, None, h200).unwrap();
        assert_eq!(
            c.describe(),
            "backend: cuda on GPU 0, NVIDIA H200 (sm_90, 150.0 GiB)"
        );
        let c = choose(Backend::Auto, None, none).unwrap();
        assert_eq!(
            c.describe(),
            "backend: cpu (auto: no CUDA driver (libcuda.so.1) on this machine)"
        );
        let c = choose(Backend::Auto, Some("runs on one rank only"), h200).unwrap();
        assert_eq!(
            c.describe(),
            "backend: cpu (auto: the GPU backend runs on one rank only)"
        );
        assert_eq!(
            choose(Backend::Cpu, None, h200).unwrap(),
            Chosen::Cpu("requested".into())
        );
    }

    #[test]
    fn cuda_without_a_device_or_for_an_unsupported_run_is_an_error() {
        let e = choose(Backend::Cuda, None, none).unwrap_err();
        assert_eq!(
            e,
            "backend \"cuda\": no CUDA driver (libcuda.so.1) on this machine; use \"auto\" or \"cpu\""
        );
        let e = choose(Backend::Cuda, Some("runs on one rank only"), h200).unwrap_err();
        assert!(e.contains("runs on one rank only"), "{e}");
        assert!(matches!(
            choose(Backend::Cuda, None, h200),
            Ok(Chosen::Cuda(_))
        ));
    }
}
