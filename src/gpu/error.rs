//! Why the GPU backend cannot run: no driver, no device, a full memory, a failed driver
//! call, kernels that do not compile, or an evaluation the device does not do.

use super::nvrtc::KernelError;
use cudarc::driver::DriverError;

/// Why the device backend cannot run.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// No CUDA driver library on this machine.
    #[error("no CUDA driver (libcuda.so.1) on this machine")]
    NoDriver,
    /// The driver reports no device.
    #[error("the CUDA driver reports no GPU")]
    NoDevice,
    /// The device has no memory left for a buffer.
    #[error(
        "the GPU's memory is full (CUDA_ERROR_OUT_OF_MEMORY): run fewer particles per GPU (more GPUs or ranks), or on the CPU (--backend cpu)"
    )]
    OutOfMemory,
    /// A driver call failed.
    #[error("CUDA: {0}")]
    Driver(String),
    /// The kernels could not be compiled.
    #[error(transparent)]
    Kernels(#[from] KernelError),
    /// The evaluation cannot run on the device (e.g. per-particle softening).
    #[error("{0}")]
    Unsupported(String),
}

impl From<DriverError> for GpuError {
    fn from(e: DriverError) -> Self {
        match e.0 {
            cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => GpuError::OutOfMemory,
            _ => GpuError::Driver(format!("{e:?}")),
        }
    }
}
