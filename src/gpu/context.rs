//! The opened CUDA device (design §7): `GpuFmm` with its kernel table (compiled by NVRTC,
//! `nvrtc`), the errors of the GPU backend, page-locked staging for downloads, device buffers
//! reused between evaluations (`Reused`), launch shapes, and `probe`. What runs on it is in
//! the files named for each concern, beside their CPU counterparts' names: `state`
//! (resident particles, kick, drift, sums), `tree` (keys, sort, split, moments),
//! `traversal` (the walk), `passes` (plan upload, P2M … P2P) and `payload` (LET moves).

use super::memory::{M2L_ROTATED_ORDER, THREADS_PER_BLOCK, TRANSLATE_THREADS};
use super::nccl::NcclLink;
use super::nvrtc::{KernelError, compile_all};
use super::passes::Buffers;
use super::payload::PayloadBuffers;
use super::traversal::WalkBuffers;
use super::tree::{MomentsBuffers, SortBuffers};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, CudaView, DeviceRepr, DriverError,
    LaunchConfig, PinnedHostSlice, ValidAsZeroBits,
};
use cudarc::nvrtc::Ptx;
use std::path::Path;
use std::sync::Arc;

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

pub(super) const BLOCK: u32 = THREADS_PER_BLOCK;

/// An opened device with the kernels loaded.
pub struct GpuFmm {
    pub(super) stream: Arc<CudaStream>,
    /// "NVIDIA H200 (sm_90)".
    pub device: String,
    pub(super) kernels: Kernels,
    /// Kept between evaluations (`DeviceLengths`).
    pub(super) buffers: Option<Buffers>,
    /// Kept between sorts into tree order (`sort_resident`).
    pub(super) sorting: Option<SortBuffers>,
    /// Kept between computations of the cells' moments (`cell_moments`).
    pub(super) moments: Option<MomentsBuffers>,
    /// Kept between walks (`walk`).
    pub(super) walking: Option<WalkBuffers>,
    /// The number of cells whose columns the last `split_cells` left in the moments
    /// buffers (none since the last sort): `cell_moments` uses them instead of uploading.
    pub(super) split: Option<usize>,
    /// The number of cells whose moments the last `cell_moments` left in the moments
    /// buffers (`download_moments`).
    pub(super) moments_of: Option<usize>,
    /// Kept between the LET payloads this device sends (`run_passes_with_payload`).
    pub(super) payload: Option<PayloadBuffers>,
    /// NCCL to the other ranks' GPUs, when every rank has one (`connect_ranks`).
    pub(super) link: Option<NcclLink>,
    /// Page-locked host memory the forces of `evaluate` come down through.
    pub(super) stage: HostStage,
}

/// Page-locked host memory that downloads go through: from pageable memory the driver
/// copies in pieces through a staging buffer of its own, several times slower (the forces
/// of `forces --backend cuda` at 1e7 took 0.2–0.3 s on an H200). Grown when a download
/// needs more, kept between downloads; if the driver cannot lock that much, downloads go
/// to pageable memory as before.
#[derive(Default)]
pub(super) struct HostStage {
    pub(super) values: Option<PinnedHostSlice<f64>>,
    /// Whether locking memory failed (not tried again).
    pub(super) refused: bool,
}

impl HostStage {
    /// Copies `src` into `out` (as long) through the stage; returns when it is there.
    pub(super) fn download(
        &mut self,
        stream: &Arc<CudaStream>,
        src: &CudaView<'_, f64>,
        out: &mut [f64],
    ) -> Result<(), GpuError> {
        let n = out.len();
        if src.len() != n {
            return Err(GpuError::Unsupported(format!(
                "a download of {} values into {n}",
                src.len()
            )));
        }
        if !self.refused && self.values.as_ref().is_none_or(|v| v.len() < n) {
            // Free the old one first: the new one may need the room.
            self.values = None;
            let grown = (n as f64 * BUFFER_GROWTH).ceil() as usize;
            // SAFETY: the stage's values are read only where a copy has written them.
            match unsafe {
                stream
                    .context()
                    .alloc_pinned_with_flags::<f64>(grown.max(1), 0)
            } {
                Ok(v) => self.values = Some(v),
                Err(_) => self.refused = true,
            }
        }
        match &mut self.values {
            Some(stage) => {
                // Into the first n values only: cudarc copies as many values as the host
                // side holds, and the stage is larger than `src` (read past its end, the
                // buffer's neighbour or unmapped memory).
                let values = &mut stage.as_mut_slice()?[..n];
                stream.memcpy_dtoh(src, values)?;
                stream.synchronize()?;
                out.copy_from_slice(values);
            }
            None => {
                stream.memcpy_dtoh(src, out)?;
                stream.synchronize()?;
            }
        }
        Ok(())
    }
}

/// The loaded kernels.
pub(super) struct Kernels {
    pub(super) p2m: CudaFunction,
    pub(super) m2m: CudaFunction,
    pub(super) m2l: CudaFunction,
    /// M2L for orders up to `M2L_SMALL_ORDER`, with more blocks per SM.
    pub(super) m2l_small: CudaFunction,
    /// The rotation-based M2L, one kernel per order 1..=`M2L_ROTATED_ORDER` (index p - 1).
    pub(super) m2l_rotated: Vec<CudaFunction>,
    /// Whether M2L takes the direct form at every order (`LEAPFMM_GPU_M2L=direct`, for
    /// comparing the two on a device).
    pub(super) m2l_direct: bool,
    pub(super) l2l: CudaFunction,
    pub(super) l2p: CudaFunction,
    pub(super) p2p: CudaFunction,
    pub(super) kick: CudaFunction,
    pub(super) kick_each: CudaFunction,
    pub(super) drift: CudaFunction,
    pub(super) gather: CudaFunction,
    pub(super) scatter: CudaFunction,
    pub(super) max_acc: CudaFunction,
    pub(super) conserved: CudaFunction,
    pub(super) bounds: CudaFunction,
    pub(super) keys: CudaFunction,
    pub(super) radix_count: CudaFunction,
    pub(super) radix_offsets: CudaFunction,
    pub(super) radix_scatter: CudaFunction,
    pub(super) leaf_of: CudaFunction,
    pub(super) mark_rows: CudaFunction,
    pub(super) flag_cells: CudaFunction,
    pub(super) level_moments: CudaFunction,
    pub(super) ancestor_r2: CudaFunction,
    pub(super) finish_moments: CudaFunction,
    pub(super) walk_level: CudaFunction,
    pub(super) sort_scan: CudaFunction,
    pub(super) order_runs: CudaFunction,
    pub(super) split_count: CudaFunction,
    pub(super) split_write: CudaFunction,
    pub(super) gather_rows: CudaFunction,
}

/// Growth of a device buffer that is too small: like the caps', so that a run reallocates
/// a few times at most.
const BUFFER_GROWTH: f64 = 2.0;

/// A state rebuilt by a migration has room for 1/SPARE_ROOM more particles than it holds:
/// a rank's count moves a little from step to step.
pub(super) const SPARE_ROOM: usize = 8;

/// One device array kept between evaluations, reallocated only when an evaluation needs
/// more than it holds.
pub(super) struct Reused<T> {
    pub(super) buf: CudaSlice<T>,
}

impl<T: DeviceRepr + ValidAsZeroBits> Reused<T> {
    pub(super) fn new(stream: &Arc<CudaStream>, count: usize) -> Result<Self, GpuError> {
        Ok(Reused {
            buf: stream.alloc_zeros::<T>(count.max(1))?,
        })
    }

    /// Room for `count` values: a new allocation `BUFFER_GROWTH` times larger when the
    /// current one is too small (the old one freed first).
    pub(super) fn room(&mut self, stream: &Arc<CudaStream>, count: usize) -> Result<(), GpuError> {
        self.room_at_most(stream, count, usize::MAX)
    }

    /// Room for `count` values, as `room` but grown to no more than `most` (nor less than
    /// `count`).
    pub(super) fn room_at_most(
        &mut self,
        stream: &Arc<CudaStream>,
        count: usize,
        most: usize,
    ) -> Result<(), GpuError> {
        if self.buf.len() < count {
            self.buf = stream.alloc_zeros::<T>(1)?;
            let grown = ((count as f64 * BUFFER_GROWTH).ceil() as usize)
                .min(most)
                .max(count);
            self.buf = stream.alloc_zeros::<T>(grown)?;
        }
        Ok(())
    }

    /// Room for `count` values, keeping the first `keep`: as `room`, with those copied over
    /// when the buffer is reallocated.
    pub(super) fn room_keeping(
        &mut self,
        stream: &Arc<CudaStream>,
        count: usize,
        keep: usize,
    ) -> Result<(), GpuError> {
        if self.buf.len() < count {
            let grown = (count as f64 * BUFFER_GROWTH).ceil() as usize;
            let mut larger = stream.alloc_zeros::<T>(grown)?;
            if keep > 0 {
                stream.memcpy_dtod(&self.buf.slice(0..keep), &mut larger.slice_mut(0..keep))?;
            }
            self.buf = larger;
        }
        Ok(())
    }

    /// Copies `data` to the front of the buffer (which `room` has made large enough).
    pub(super) fn upload(&mut self, stream: &Arc<CudaStream>, data: &[T]) -> Result<(), GpuError> {
        if !data.is_empty() {
            stream.memcpy_htod(data, &mut self.buf)?;
        }
        Ok(())
    }

    /// Zeroes the first `count` values.
    pub(super) fn zero(&mut self, stream: &Arc<CudaStream>, count: usize) -> Result<(), GpuError> {
        if count > 0 {
            stream.memset_zeros(&mut self.buf.slice_mut(0..count))?;
        }
        Ok(())
    }
}

pub(super) fn grid(count: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: ((count as u32).div_ceil(BLOCK).max(1), 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// One block of TRANSLATE_THREADS per cell, for `count` cells (P2M, M2M, L2L).
pub(super) fn per_cell(count: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: ((count as u32).max(1), 1, 1),
        block_dim: (TRANSLATE_THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Flattens `[f64; 3]` rows.
pub(super) fn flat(v: &[[f64; 3]]) -> Vec<f64> {
    v.iter().flatten().copied().collect()
}

/// GPU `ordinal` of this machine: `NoDriver` or `NoDevice` when there is none (without
/// touching CUDA when its driver library is absent).
pub fn probe(ordinal: usize) -> Result<super::backend::DeviceInfo, GpuError> {
    // SAFETY: only tries to open the shared library.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(GpuError::NoDriver);
    }
    let devices = CudaContext::device_count()?;
    if devices <= ordinal as i32 {
        return Err(GpuError::NoDevice);
    }
    let ctx = CudaContext::new(ordinal)?;
    let (major, minor) = ctx.compute_capability()?;
    Ok(super::backend::DeviceInfo {
        ordinal,
        name: ctx.name()?,
        arch: format!("sm_{major}{minor}"),
        memory_bytes: ctx.total_mem()?,
        devices: devices as usize,
    })
}

impl GpuFmm {
    /// Opens device `ordinal`, compiles (or loads from `cache`) the kernels for its
    /// architecture. A machine without the CUDA driver gets `GpuError::NoDriver`, never a
    /// panic.
    pub fn open(ordinal: usize, cache: Option<&Path>) -> Result<Self, GpuError> {
        let info = probe(ordinal)?;
        let ctx = CudaContext::new(ordinal)?;
        let arch = info.arch;
        let device = format!("{} ({arch})", info.name);
        let mut functions = Vec::new();
        for kernel in compile_all(&arch, cache)? {
            let module = ctx.load_module(Ptx::from_src(kernel.ptx))?;
            functions.push((kernel.name, module));
        }
        let function = |file: &str, name: &str| -> Result<CudaFunction, GpuError> {
            let (_, module) = functions
                .iter()
                .find(|(f, _)| *f == file)
                .ok_or_else(|| GpuError::Unsupported(format!("kernel file {file} missing")))?;
            Ok(module.load_function(name)?)
        };
        let kernels = Kernels {
            p2m: function("expansions.cu", "p2m_leaves")?,
            m2m: function("expansions.cu", "m2m_cells")?,
            m2l: function("expansions.cu", "m2l_cells")?,
            m2l_small: function("expansions.cu", "m2l_cells_p8")?,
            m2l_rotated: (1..=M2L_ROTATED_ORDER)
                .map(|p| function("m2l_rotated.cu", &format!("m2l_rotated_{p}")))
                .collect::<Result<_, _>>()?,
            m2l_direct: std::env::var("LEAPFMM_GPU_M2L").is_ok_and(|v| v == "direct"),
            l2l: function("expansions.cu", "l2l_cells")?,
            l2p: function("expansions.cu", "l2p_particles")?,
            p2p: function("p2p.cu", "p2p_leaves")?,
            kick: function("integrate.cu", "kick")?,
            kick_each: function("integrate.cu", "kick_each")?,
            drift: function("integrate.cu", "drift")?,
            gather: function("integrate.cu", "gather_tree_order")?,
            scatter: function("integrate.cu", "scatter_forces")?,
            max_acc: function("integrate.cu", "max_acceleration_blocks")?,
            conserved: function("integrate.cu", "conserved_chunks")?,
            bounds: function("keys.cu", "bounds_blocks")?,
            keys: function("keys.cu", "morton_keys")?,
            radix_count: function("keys.cu", "radix_count")?,
            radix_offsets: function("keys.cu", "radix_offsets")?,
            radix_scatter: function("keys.cu", "radix_scatter")?,
            leaf_of: function("moments.cu", "leaf_of_particles")?,
            mark_rows: function("moments.cu", "mark_rows")?,
            flag_cells: function("moments.cu", "flag_cells_holding")?,
            level_moments: function("moments.cu", "level_moments")?,
            ancestor_r2: function("moments.cu", "ancestor_r2")?,
            finish_moments: function("moments.cu", "finish_moments")?,
            walk_level: function("walk.cu", "walk_level")?,
            sort_scan: function("split.cu", "sort_scan")?,
            order_runs: function("split.cu", "order_equal_runs")?,
            split_count: function("split.cu", "split_count")?,
            split_write: function("split.cu", "split_write")?,
            gather_rows: function("integrate.cu", "gather_rows")?,
        };
        Ok(GpuFmm {
            stream: ctx.default_stream(),
            device,
            kernels,
            buffers: None,
            sorting: None,
            moments: None,
            walking: None,
            split: None,
            moments_of: None,
            payload: None,
            link: None,
            stage: HostStage::default(),
        })
    }
}
