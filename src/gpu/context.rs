//! The opened CUDA device (design §7): `GpuFmm` with its kernel table (compiled by NVRTC,
//! `nvrtc`, or loaded from the cache), its stream and the buffers it keeps (`buffers`), and
//! the launch shapes. What runs on it is in the files named for each concern, beside their
//! CPU counterparts' names: `state` (resident particles, kick, drift, sums), `tree` (keys,
//! sort, split, moments), `traversal` (the walk), `passes` (plan upload, P2M … P2P) and
//! `payload` (LET moves). Errors are `error`'s; finding a device is `backend::device_info`.

use super::buffers::{
    Buffers, HostStage, MomentsBuffers, PayloadBuffers, SortBuffers, WalkBuffers,
};
use super::error::GpuError;
use super::memory::{M2L_ROTATED_ORDER, THREADS_PER_BLOCK, TRANSLATE_THREADS};
use super::nccl::NcclLink;
use super::nvrtc::compile_all;
use cudarc::driver::{CudaContext, CudaFunction, CudaStream, LaunchConfig};
use cudarc::nvrtc::Ptx;
use std::path::Path;
use std::sync::Arc;

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

/// The loaded kernels.
pub(super) struct Kernels {
    pub(super) p2m: CudaFunction,
    pub(super) m2m: CudaFunction,
    /// A rigid external potential's acceleration, and its energy per chunk.
    pub(super) add_external: CudaFunction,
    pub(super) external_energy: CudaFunction,
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
    /// integrate.cu: the ids and components of a migration's staying rows.
    pub(super) gather_labels: CudaFunction,
    /// integrate.cu: a migration's staying rows from its leaving ones.
    pub(super) staying_rows: CudaFunction,
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

impl GpuFmm {
    /// Opens device `ordinal`, compiles (or loads from `cache`) the kernels for its
    /// architecture. A machine without the CUDA driver gets `GpuError::NoDriver`, never a
    /// panic.
    pub fn open(ordinal: usize, cache: Option<&Path>) -> Result<Self, GpuError> {
        let info = super::backend::device_info(ordinal)?;
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
            gather_labels: function("integrate.cu", "gather_labels")?,
            staying_rows: function("integrate.cu", "staying_rows")?,
            add_external: function("external.cu", "add_external")?,
            external_energy: function("external.cu", "external_energy_chunks")?,
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
