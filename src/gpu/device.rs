//! The FMM passes and the integrator on a CUDA device (design §7): the host builds the tree
//! and the lists (`FmmSolver::device_plan`; for resident particles the device finds the
//! order, the moments and the lists itself, below), one upload brings them over into device
//! buffers kept from one evaluation to the next (sized by the caps, `memory::DeviceLengths`,
//! and grown when a plan needs more), and the kernels of kernels/ run P2M, M2M per level,
//! M2L, L2L per level, L2P and P2P. Either the plan's positions go up and the forces come
//! down (`evaluate`), or the particles live on the device for the whole run
//! (`DeviceState`): they are keyed and sorted into tree order there (`sort_resident`: the
//! host gets five sums of the sort to check) and split into cells there (`split_cells`:
//! the host gets the cells; or, when a run of equal keys is too long for the device to
//! order by id, `download_sorted` and the host splits), the cells' moments are
//! computed there (`cell_moments`: the host gets each cell's mass, centre and radius), the
//! tree is walked there (`walk`: the lists stay for the passes), the particles are gathered
//! into tree order and the forces scattered back (`evaluate_resident`), and the kick and
//! drift run there. On K ranks, the LET payload (the multipoles and particles another
//! rank's walk needs) goes from this device's plan straight into the other ranks' plans
//! (`run_passes_with_payload`: NCCL when linked, `connect_ranks`, else through the host).
//! The same kernels run under the CPU emulation in tests/gpu_kernels.rs,
//! where they match the CPU backend; scripts/gpu-check.sh checks them on a lent GPU (first run
//! on an H200 on 2026-12-04: the one-rank and K-rank-on-host-link paths, docs/benchmarks.md;
//! the NCCL link needs a machine with a GPU per rank and has not run yet).

use super::memory::{
    DeviceLengths, M2L_ROTATED_ORDER, M2L_ROTATED_THREADS, M2L_SMALL_ORDER, M2L_THREADS,
    P2P_THREADS, THREADS_PER_BLOCK, TRANSLATE_THREADS, resident_f64_counts,
};
use super::nccl::NcclLink;
use super::nvrtc::{KernelError, compile_all};
use super::sort::{
    ANCESTOR_THREADS, BOUNDS_BLOCKS, BOUNDS_FIELDS, BOUNDS_THREADS, LEVEL_SLOTS, OFFSETS_THREADS,
    RADIX_BITS, RADIX_THREADS, SCAN_BLOCKS, SCAN_THREADS, SCAN_VALUES, WALK_CACHE, WALK_CHUNK,
    WALK_QUEUE, WALK_RETRY_CHUNK, WALK_RING_BYTES, WALK_SHORT_QUEUE, cube_of_bounds, sort_blocks,
};
use crate::distributed::comm::Communicator;
use crate::distributed::payload::PayloadRoutes;
use crate::fmm::caps::Caps;
use crate::fmm::morton::BoundingCube;
use crate::fmm::solver::{DeviceForces, DeviceLists, DevicePasses, DevicePlan, DeviceSeconds};
use crate::fmm::traversal::Mac;
use crate::fmm::tree::{
    CellColumns, CellsOverflow, MOMENT_VALUES, SortSummary, SortedParticles, Tree,
};
use crate::gravity::GravityError;
use crate::gravity::softening::{SPLINE_SUPPORT_PER_EPSILON, Softening, SofteningKernel};
use crate::integrate::diagnostics::CONSERVED_SUMS;
use crate::particles::Particles;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, CudaView, DeviceRepr, DriverError,
    LaunchConfig, PinnedHostSlice, PushKernelArg, ValidAsZeroBits,
};
use cudarc::nvrtc::Ptx;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

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

const BLOCK: u32 = THREADS_PER_BLOCK;

/// An opened device with the kernels loaded.
pub struct GpuFmm {
    stream: Arc<CudaStream>,
    /// "NVIDIA H200 (sm_90)".
    pub device: String,
    kernels: Kernels,
    /// Kept between evaluations (`DeviceLengths`).
    buffers: Option<Buffers>,
    /// Kept between sorts into tree order (`sort_resident`).
    sorting: Option<SortBuffers>,
    /// Kept between computations of the cells' moments (`cell_moments`).
    moments: Option<MomentsBuffers>,
    /// Kept between walks (`walk`).
    walking: Option<WalkBuffers>,
    /// The number of cells whose columns the last `split_cells` left in the moments
    /// buffers (none since the last sort): `cell_moments` uses them instead of uploading.
    split: Option<usize>,
    /// The number of cells whose moments the last `cell_moments` left in the moments
    /// buffers (`download_moments`).
    moments_of: Option<usize>,
    /// Kept between the LET payloads this device sends (`run_passes_with_payload`).
    payload: Option<PayloadBuffers>,
    /// NCCL to the other ranks' GPUs, when every rank has one (`connect_ranks`).
    link: Option<NcclLink>,
    /// Page-locked host memory the forces of `evaluate` come down through.
    stage: HostStage,
}

/// Page-locked host memory that downloads go through: from pageable memory the driver
/// copies in pieces through a staging buffer of its own, several times slower (the forces
/// of `forces --backend cuda` at 1e7 took 0.2–0.3 s on an H200). Grown when a download
/// needs more, kept between downloads; if the driver cannot lock that much, downloads go
/// to pageable memory as before.
#[derive(Default)]
struct HostStage {
    values: Option<PinnedHostSlice<f64>>,
    /// Whether locking memory failed (not tried again).
    refused: bool,
}

impl HostStage {
    /// Copies `src` into `out` (as long) through the stage; returns when it is there.
    fn download(
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

/// The gathered LET payload this rank's device sends (`PayloadRoutes`): every rank's part,
/// one after the other.
struct PayloadBuffers {
    rows: Reused<u32>,
    particles: Reused<u32>,
    multipoles: Reused<f64>,
    pos: Reused<f64>,
    mass: Reused<f64>,
}

/// The loaded kernels.
struct Kernels {
    p2m: CudaFunction,
    m2m: CudaFunction,
    m2l: CudaFunction,
    /// M2L for orders up to `M2L_SMALL_ORDER`, with more blocks per SM.
    m2l_small: CudaFunction,
    /// The rotation-based M2L, one kernel per order 1..=`M2L_ROTATED_ORDER` (index p - 1).
    m2l_rotated: Vec<CudaFunction>,
    /// Whether M2L takes the direct form at every order (`LEAPFMM_GPU_M2L=direct`, for
    /// comparing the two on a device).
    m2l_direct: bool,
    l2l: CudaFunction,
    l2p: CudaFunction,
    p2p: CudaFunction,
    kick: CudaFunction,
    kick_each: CudaFunction,
    drift: CudaFunction,
    gather: CudaFunction,
    scatter: CudaFunction,
    max_acc: CudaFunction,
    conserved: CudaFunction,
    bounds: CudaFunction,
    keys: CudaFunction,
    radix_count: CudaFunction,
    radix_offsets: CudaFunction,
    radix_scatter: CudaFunction,
    leaf_of: CudaFunction,
    mark_rows: CudaFunction,
    flag_cells: CudaFunction,
    level_moments: CudaFunction,
    ancestor_r2: CudaFunction,
    finish_moments: CudaFunction,
    walk_level: CudaFunction,
    sort_scan: CudaFunction,
    order_runs: CudaFunction,
    split_count: CudaFunction,
    split_write: CudaFunction,
    gather_rows: CudaFunction,
}

/// A run's particle state on the device (design §7), in the run's particle order: what the
/// integrator kicks and drifts between force evaluations. `GpuFmm` creates and updates it;
/// the host copy is brought up to date only when it is read.
pub struct DeviceState {
    n: usize,
    /// Particles its buffers hold (at least `n`: a state rebuilt by `migrate_state` has
    /// room to spare, so that the next migration can reuse it).
    capacity: usize,
    pos: CudaSlice<f64>,
    vel: CudaSlice<f64>,
    mass: CudaSlice<f64>,
    acc: CudaSlice<f64>,
    pot: CudaSlice<f64>,
    block_max: CudaSlice<f64>,
    partial: CudaSlice<f64>,
    component: CudaSlice<u8>,
    /// The particles' ids, which order runs of equal keys.
    id: CudaSlice<u64>,
    /// The block scheme's buffers (grown at their first use): the steps of its last kick
    /// (`GpuFmm::kick_each`), the rows of the particles a kick or a download of
    /// accelerations is for (a sub-step's active ones), and those accelerations gathered
    /// for the download (`GpuFmm::accelerations`).
    steps: Reused<f64>,
    rows: Reused<u32>,
    picked: Reused<f64>,
}

/// What `GpuFmm::sort_resident` found.
#[derive(Debug, Clone, Copy)]
pub struct DeviceSort {
    /// The particles' bounding cube, which the keys refer to.
    pub cube: BoundingCube,
    /// The sort's sums, for `SortSummary::check`.
    pub summary: SortSummary,
    /// False when a run of equal keys was too long for the device to order by id
    /// (`RUN_LIMIT` in split.cu): the host must (`download_sorted`, `Tree::adopt_sorted`).
    pub runs_ordered: bool,
}

impl DeviceState {
    /// How many particles it holds.
    pub fn particles(&self) -> usize {
        self.n
    }
}

/// Growth of a device buffer that is too small: like the caps', so that a run reallocates
/// a few times at most.
const BUFFER_GROWTH: f64 = 2.0;

/// A state rebuilt by a migration has room for 1/SPARE_ROOM more particles than it holds:
/// a rank's count moves a little from step to step.
const SPARE_ROOM: usize = 8;

/// One device array kept between evaluations, reallocated only when an evaluation needs
/// more than it holds.
struct Reused<T> {
    buf: CudaSlice<T>,
}

impl<T: DeviceRepr + ValidAsZeroBits> Reused<T> {
    fn new(stream: &Arc<CudaStream>, count: usize) -> Result<Self, GpuError> {
        Ok(Reused {
            buf: stream.alloc_zeros::<T>(count.max(1))?,
        })
    }

    /// Room for `count` values: a new allocation `BUFFER_GROWTH` times larger when the
    /// current one is too small (the old one freed first).
    fn room(&mut self, stream: &Arc<CudaStream>, count: usize) -> Result<(), GpuError> {
        self.room_at_most(stream, count, usize::MAX)
    }

    /// Room for `count` values, as `room` but grown to no more than `most` (nor less than
    /// `count`).
    fn room_at_most(
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
    fn room_keeping(
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
    fn upload(&mut self, stream: &Arc<CudaStream>, data: &[T]) -> Result<(), GpuError> {
        if !data.is_empty() {
            stream.memcpy_htod(data, &mut self.buf)?;
        }
        Ok(())
    }

    /// Zeroes the first `count` values.
    fn zero(&mut self, stream: &Arc<CudaStream>, count: usize) -> Result<(), GpuError> {
        if count > 0 {
            stream.memset_zeros(&mut self.buf.slice_mut(0..count))?;
        }
        Ok(())
    }
}

/// The device buffers of the sort into tree order (`GpuFmm::sort_resident`;
/// `super::sort::sort_bytes` counts them), grown with the particles.
struct SortBuffers {
    bounds: CudaSlice<f64>,
    keys: [Reused<u64>; 2],
    index: [Reused<u32>; 2],
    counts: Reused<u32>,
    pos: Reused<f64>,
    mass: Reused<f64>,
    /// `sort_scan`'s sums for the checks.
    scan: Reused<u64>,
    /// Runs of equal keys too long for `order_equal_runs`.
    long_runs: Reused<u32>,
}

impl SortBuffers {
    /// Buffers for `n` particles.
    fn new(stream: &Arc<CudaStream>, n: usize) -> Result<Self, GpuError> {
        Ok(SortBuffers {
            bounds: stream.alloc_zeros::<f64>(BOUNDS_FIELDS * BOUNDS_BLOCKS as usize)?,
            keys: [Reused::new(stream, n)?, Reused::new(stream, n)?],
            index: [Reused::new(stream, n)?, Reused::new(stream, n)?],
            counts: Reused::new(stream, RADIX_THREADS as usize * sort_blocks(n))?,
            pos: Reused::new(stream, 3 * n)?,
            mass: Reused::new(stream, n)?,
            scan: Reused::new(stream, SCAN_VALUES)?,
            long_runs: Reused::new(stream, 1)?,
        })
    }

    /// Room for `n` particles.
    fn fit(&mut self, stream: &Arc<CudaStream>, n: usize) -> Result<(), GpuError> {
        for keys in &mut self.keys {
            keys.room(stream, n)?;
        }
        for index in &mut self.index {
            index.room(stream, n)?;
        }
        self.counts
            .room(stream, RADIX_THREADS as usize * sort_blocks(n))?;
        self.pos.room(stream, 3 * n)?;
        self.mass.room(stream, n)
    }
}

/// The device buffers of the cells' moments (`GpuFmm::cell_moments`;
/// `super::sort::moments_bytes` counts them), grown with the tree.
struct MomentsBuffers {
    begin: Reused<u32>,
    end: Reused<u32>,
    first_child: Reused<u32>,
    child_count: Reused<u32>,
    parent: Reused<u32>,
    leaves: Reused<u32>,
    level_start: Reused<u32>,
    leaf_of: Reused<u32>,
    mass: Reused<f64>,
    centre: Reused<f64>,
    r2: Reused<u64>,
    out: Reused<f64>,
    /// Per cell of a level, its children, then their prefix sums (`split_cells`).
    split_counts: Reused<u32>,
    /// A block sub-step's active rows, their marks (a byte per particle) and the flags of
    /// the cells holding them (a byte per cell: `GpuFmm::cells_holding`).
    rows: Reused<u32>,
    marked: Reused<u8>,
    flags: Reused<u8>,
}

impl MomentsBuffers {
    /// Buffers for `cells` cells over `n` particles.
    fn new(stream: &Arc<CudaStream>, n: usize, cells: usize) -> Result<Self, GpuError> {
        Ok(MomentsBuffers {
            begin: Reused::new(stream, cells)?,
            end: Reused::new(stream, cells)?,
            first_child: Reused::new(stream, cells)?,
            child_count: Reused::new(stream, cells)?,
            parent: Reused::new(stream, cells)?,
            leaves: Reused::new(stream, cells)?,
            level_start: Reused::new(stream, LEVEL_SLOTS)?,
            leaf_of: Reused::new(stream, n)?,
            mass: Reused::new(stream, cells)?,
            centre: Reused::new(stream, 3 * cells)?,
            r2: Reused::new(stream, cells)?,
            out: Reused::new(stream, MOMENT_VALUES * cells)?,
            split_counts: Reused::new(stream, cells + 1)?,
            rows: Reused::new(stream, 0)?,
            marked: Reused::new(stream, 0)?,
            flags: Reused::new(stream, 0)?,
        })
    }

    /// The per-cell columns of the tree's structure: range, first child, child count,
    /// parent.
    fn cell_columns(&mut self) -> [&mut Reused<u32>; 5] {
        [
            &mut self.begin,
            &mut self.end,
            &mut self.first_child,
            &mut self.child_count,
            &mut self.parent,
        ]
    }

    /// Whether these buffers have room for the tree of `plan` (own cells only) and its
    /// leaves: a plan whose tree `cell_moments` left here finds its centres, columns and
    /// leaves in them.
    fn holds(&self, plan: &DevicePlan) -> bool {
        let (cells, leaves) = (plan.centre.len(), plan.leaves.len());
        let columns = [
            &self.begin,
            &self.end,
            &self.first_child,
            &self.child_count,
            &self.parent,
        ];
        cells == plan.own_cells
            && columns.iter().all(|c| c.buf.len() >= cells)
            && self.centre.buf.len() >= 3 * cells
            && self.leaves.buf.len() >= leaves
    }

    /// Room for `cells` cells over `n` particles in `levels` levels.
    fn fit(
        &mut self,
        stream: &Arc<CudaStream>,
        n: usize,
        cells: usize,
        levels: usize,
    ) -> Result<(), GpuError> {
        for b in [
            &mut self.begin,
            &mut self.end,
            &mut self.first_child,
            &mut self.child_count,
            &mut self.parent,
            &mut self.leaves,
        ] {
            b.room(stream, cells)?;
        }
        self.level_start.room(stream, levels + 1)?;
        self.leaf_of.room(stream, n)?;
        self.mass.room(stream, cells)?;
        self.centre.room(stream, 3 * cells)?;
        self.r2.room(stream, cells)?;
        self.out.room(stream, MOMENT_VALUES * cells)
    }
}

/// Lists a device walk made, downloaded (`GpuFmm::walked_lists`): each cell's sources are
/// `sources[start..start + len]` with `(start, len)` the high and low halves of its span.
pub struct WalkedLists {
    /// Per cell, where its M2L sources are.
    pub m2l_spans: Vec<u64>,
    /// M2L sources.
    pub m2l_sources: Vec<u32>,
    /// Per cell, where its P2P sources are.
    pub p2p_spans: Vec<u64>,
    /// P2P sources.
    pub p2p_sources: Vec<u32>,
}

/// The device buffers of the walk (`GpuFmm::walk`; `super::sort::walk_bytes` and
/// `WALK_RING_BYTES` count those besides the lists and the handed sources): its M2L and P2P
/// lists, which the passes then read, and its working arrays.
struct WalkBuffers {
    m2l_sources: Reused<u32>,
    m2l_spans: Reused<u64>,
    p2p_sources: Reused<u32>,
    p2p_spans: Reused<u64>,
    /// Sources deferred by one level and handed to the next, and where each cell's are:
    /// level l writes side l % 2 and reads the other.
    deferred: [Reused<u32>; 2],
    deferred_spans: [Reused<u64>; 2],
    counts: Reused<u32>,
    /// A level's three list totals, gathered from `counts` for one download.
    totals: Reused<u32>,
    pairs: Reused<u64>,
    ring: Reused<u32>,
    /// The entries a level's counting pass keeps, `WALK_CACHE` per target, and how many
    /// each target kept (walk.cu: `WALK_UNCACHED` when they did not fit).
    cache: Reused<u32>,
    cache_len: Reused<u32>,
    /// The targets whose short rings filled up (launched again with long rings), and those
    /// whose long rings did too; how many of each.
    retry: [Reused<u32>; 2],
    retry_count: [Reused<u32>; 2],
    /// The cells a walk for some targets only walks for (a block sub-step's), level by
    /// level.
    targets: Reused<u32>,
    problems: Reused<u32>,
}

impl WalkBuffers {
    /// Buffers for a tree of `cells` cells, with room for the lists `caps` expects.
    fn new(stream: &Arc<CudaStream>, cells: usize, caps: &Caps) -> Result<Self, GpuError> {
        Ok(WalkBuffers {
            m2l_sources: Reused::new(stream, caps.m2l_pairs)?,
            m2l_spans: Reused::new(stream, cells)?,
            p2p_sources: Reused::new(stream, caps.p2p_pairs)?,
            p2p_spans: Reused::new(stream, cells)?,
            deferred: [Reused::new(stream, cells)?, Reused::new(stream, cells)?],
            deferred_spans: [Reused::new(stream, cells)?, Reused::new(stream, cells)?],
            counts: Reused::new(stream, 3 * (cells + 1))?,
            totals: Reused::new(stream, 3)?,
            pairs: Reused::new(stream, cells)?,
            ring: Reused::new(stream, 0)?,
            cache: Reused::new(stream, 0)?,
            cache_len: Reused::new(stream, 0)?,
            retry: [Reused::new(stream, cells)?, Reused::new(stream, cells)?],
            retry_count: [Reused::new(stream, 1)?, Reused::new(stream, 1)?],
            targets: Reused::new(stream, 0)?,
            problems: Reused::new(stream, 1)?,
        })
    }
}

/// The device buffers of the force evaluations, in `DeviceLengths`' order.
struct Buffers {
    pos: Reused<f64>,
    mass: Reused<f64>,
    acc: Reused<f64>,
    pot: Reused<f64>,
    centre: Reused<f64>,
    multipoles: Reused<f64>,
    locals: Reused<f64>,
    leaf_of: Reused<u32>,
    order_of: Reused<u32>,
    begin: Reused<u32>,
    end: Reused<u32>,
    first_child: Reused<u32>,
    child_count: Reused<u32>,
    parent: Reused<u32>,
    all: Reused<u32>,
    parents: Reused<u32>,
    m2l_sources: Reused<u32>,
    leaves: Reused<u32>,
    p2p_sources: Reused<u32>,
    m2l_spans: Reused<u64>,
    p2p_spans: Reused<u64>,
    /// Host side: where each level's cells with children start in `parents`, and how many
    /// (the per-level M2M launches of the last uploaded plan).
    parent_levels: Vec<(usize, usize)>,
}

impl Buffers {
    fn new(stream: &Arc<CudaStream>, lengths: &DeviceLengths) -> Result<Self, GpuError> {
        let [pos, mass, acc, pot, centre, multipoles, locals] = lengths.f64_counts();
        let [
            leaf_of,
            order_of,
            begin,
            end,
            first_child,
            child_count,
            parent,
            all,
            parents,
            m2l_sources,
            leaves,
            p2p_sources,
        ] = lengths.u32_counts();
        let [m2l_spans, p2p_spans] = lengths.u64_counts();
        Ok(Buffers {
            pos: Reused::new(stream, pos)?,
            mass: Reused::new(stream, mass)?,
            acc: Reused::new(stream, acc)?,
            pot: Reused::new(stream, pot)?,
            centre: Reused::new(stream, centre)?,
            multipoles: Reused::new(stream, multipoles)?,
            locals: Reused::new(stream, locals)?,
            leaf_of: Reused::new(stream, leaf_of)?,
            order_of: Reused::new(stream, order_of)?,
            begin: Reused::new(stream, begin)?,
            end: Reused::new(stream, end)?,
            first_child: Reused::new(stream, first_child)?,
            child_count: Reused::new(stream, child_count)?,
            parent: Reused::new(stream, parent)?,
            all: Reused::new(stream, all)?,
            parents: Reused::new(stream, parents)?,
            m2l_sources: Reused::new(stream, m2l_sources)?,
            leaves: Reused::new(stream, leaves)?,
            p2p_sources: Reused::new(stream, p2p_sources)?,
            m2l_spans: Reused::new(stream, m2l_spans)?,
            p2p_spans: Reused::new(stream, p2p_spans)?,
            parent_levels: Vec::new(),
        })
    }

    /// Grows what is too small for `lengths`.
    fn fit(&mut self, stream: &Arc<CudaStream>, lengths: &DeviceLengths) -> Result<(), GpuError> {
        let f64s = [
            &mut self.pos,
            &mut self.mass,
            &mut self.acc,
            &mut self.pot,
            &mut self.centre,
            &mut self.multipoles,
            &mut self.locals,
        ];
        for (b, count) in f64s.into_iter().zip(lengths.f64_counts()) {
            b.room(stream, count)?;
        }
        let u32s = [
            &mut self.leaf_of,
            &mut self.order_of,
            &mut self.begin,
            &mut self.end,
            &mut self.first_child,
            &mut self.child_count,
            &mut self.parent,
            &mut self.all,
            &mut self.parents,
            &mut self.m2l_sources,
            &mut self.leaves,
            &mut self.p2p_sources,
        ];
        for (b, count) in u32s.into_iter().zip(lengths.u32_counts()) {
            b.room(stream, count)?;
        }
        let u64s = [&mut self.m2l_spans, &mut self.p2p_spans];
        for (b, count) in u64s.into_iter().zip(lengths.u64_counts()) {
            b.room(stream, count)?;
        }
        Ok(())
    }
}

fn grid(count: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: ((count as u32).div_ceil(BLOCK).max(1), 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// One block of TRANSLATE_THREADS per cell, for `count` cells (P2M, M2M, L2L).
fn per_cell(count: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: ((count as u32).max(1), 1, 1),
        block_dim: (TRANSLATE_THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Flattens `[f64; 3]` rows.
fn flat(v: &[[f64; 3]]) -> Vec<f64> {
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

    /// Joins the ranks of `comm` (all call this together) in NCCL for the LET payload when
    /// every rank has a GPU of its own (`own_gpu` says whether this one has) and the NCCL
    /// library; returns whether they did. Otherwise the payload goes through `comm`.
    pub fn connect_ranks(
        &mut self,
        comm: &dyn Communicator,
        own_gpu: bool,
    ) -> Result<bool, GpuError> {
        self.link = super::nccl::connect(comm, &self.stream, own_gpu).map_err(GpuError::Driver)?;
        Ok(self.link.is_some())
    }

    /// The forces of `plan` on the device, in buffers kept from the previous evaluation
    /// (sized by `caps` and the plan, grown when the plan needs more): the plan's positions
    /// and masses go up, the accelerations and potentials (tree order) come back.
    pub fn evaluate(
        &mut self,
        plan: &DevicePlan,
        caps: &Caps,
        softening: Softening,
        g: f64,
    ) -> Result<DeviceForces, GpuError> {
        self.evaluate_moving(plan, caps, (softening, g), None, None)
    }

    /// `evaluate`, and with `payload` (a distributed plan whose other ranks' multipoles,
    /// positions and masses are placeholders) the LET payload moved first: this device
    /// gathers what `routes` sends each rank from its plan, and what the others send lands
    /// in its plan's buffers, through NCCL when the ranks are linked, else through the host
    /// communicator (all ranks call this together; its seconds count as upload's).
    /// With `state` (a distributed run's rank's particles, `super::rank::GpuRank`), the own
    /// particles' positions and masses are gathered from it into tree order, not sent, and
    /// their forces scattered back into it: the forces returned are then empty.
    pub(super) fn evaluate_moving(
        &mut self,
        plan: &DevicePlan,
        caps: &Caps,
        (softening, g): (Softening, f64),
        payload: Option<(&PayloadRoutes, &dyn Communicator)>,
        state: Option<&mut DeviceState>,
    ) -> Result<DeviceForces, GpuError> {
        let (n, all) = (plan.own_particles, plan.particles());
        if plan.pos.len() != all || plan.device_lists.is_some() {
            return Err(GpuError::Unsupported(
                "a plan without positions or lists needs the particles on the device".into(),
            ));
        }
        if let Some(state) = &state
            && (state.n != n || plan.order_of.len() != n)
        {
            return Err(GpuError::Unsupported(format!(
                "a plan for {n} own particles on a device state of {}",
                state.n
            )));
        }
        let mut secs = DeviceSeconds::default();
        let t = Instant::now();
        let stream = self.stream.clone();
        let b = upload_plan(&stream, &mut self.buffers, plan, caps, None)?;
        b.leaf_of.upload(&stream, &plan.leaf_of)?;
        match state.as_deref() {
            None => {
                b.pos.upload(&stream, plan.pos.as_flattened())?;
                b.mass.upload(&stream, plan.mass)?;
            }
            Some(state) => {
                b.order_of.upload(&stream, plan.order_of)?;
                gather_tree_order(&self.kernels, &stream, state, b)?;
                // The other ranks' particles: from the plan, unless the devices move them.
                if payload.is_none() && all > n {
                    let mut pos = b.pos.buf.slice_mut(3 * n..3 * all);
                    stream.memcpy_htod(plan.pos[n..].as_flattened(), &mut pos)?;
                    let mut mass = b.mass.buf.slice_mut(n..all);
                    stream.memcpy_htod(&plan.mass[n..], &mut mass)?;
                }
            }
        }
        stream.synchronize()?;
        secs.upload = t.elapsed().as_secs_f64();
        if plan.upward_on_device {
            upward_pass(&self.kernels, &stream, b, plan, &mut secs)?;
        }
        if let Some((routes, comm)) = payload {
            // The own multipoles just computed go out; the others' land next to them.
            let t = Instant::now();
            let link = self.link.as_ref();
            move_payload(
                &self.kernels,
                &stream,
                b,
                &mut self.payload,
                link,
                routes,
                comm,
            )?;
            stream.synchronize()?;
            secs.upload += t.elapsed().as_secs_f64();
        }
        run_passes(
            &self.kernels,
            &stream,
            b,
            None,
            plan,
            (softening, g),
            &mut secs,
        )?;
        let t = Instant::now();
        let (mut acc, mut pot) = (Vec::new(), Vec::new());
        match state {
            Some(state) => {
                scatter_forces(&self.kernels, &stream, b, state)?;
                stream.synchronize()?;
            }
            None => {
                (acc, pot) = (vec![[0.0; 3]; n], vec![0.0; n]);
                let stage = &mut self.stage;
                stage.download(&stream, &b.acc.buf.slice(0..3 * n), acc.as_flattened_mut())?;
                stage.download(&stream, &b.pot.buf.slice(0..n), &mut pot)?;
            }
        }
        secs.download = t.elapsed().as_secs_f64();
        Ok(DeviceForces {
            acc,
            pot,
            seconds: secs,
        })
    }

    /// The forces of `plan` on the particles of `state`, which stay on the device: their
    /// positions and masses are gathered into the plan's tree order there (the plan's own
    /// copies are not sent) and the accelerations and potentials scattered back into
    /// `state`; the cells and lists go up. With `tree_on_device`, the plan's tree is the
    /// one of the last `sort_resident` and `cell_moments`, whose tree order, leaf of each
    /// particle, cell centres, columns and leaves are on the device already and are not
    /// sent either; the lists too when the plan says they were walked there (`walk`).
    pub fn evaluate_resident(
        &mut self,
        plan: &DevicePlan,
        caps: &Caps,
        softening: Softening,
        g: f64,
        state: &mut DeviceState,
        tree_on_device: bool,
    ) -> Result<DeviceSeconds, GpuError> {
        let n = plan.own_particles;
        if n != state.n || plan.particles() != n {
            return Err(GpuError::Unsupported(format!(
                "a plan for {} particles on a device state of {}",
                plan.particles(),
                state.n
            )));
        }
        let mut secs = DeviceSeconds::default();
        let t = Instant::now();
        let stream = self.stream.clone();
        let cells_here = match (tree_on_device, &self.moments) {
            (true, Some(m)) if m.holds(plan) => Some(m),
            _ => None,
        };
        let b = upload_plan(&stream, &mut self.buffers, plan, caps, cells_here)?;
        match (tree_on_device, &self.sorting, &self.moments) {
            (true, Some(s), Some(m)) => {
                stream.memcpy_dtod(&s.index[0].buf.slice(0..n), &mut b.order_of.buf)?;
                stream.memcpy_dtod(&m.leaf_of.buf.slice(0..n), &mut b.leaf_of.buf)?;
            }
            (true, ..) => {
                return Err(GpuError::Unsupported(
                    "no tree on the device: sort_resident and cell_moments first".into(),
                ));
            }
            (false, ..) if plan.leaf_of.len() != n => {
                return Err(GpuError::Unsupported(
                    "a plan without the particles' leaves and no tree on the device".into(),
                ));
            }
            (false, ..) => {
                b.order_of.upload(&stream, plan.order_of)?;
                b.leaf_of.upload(&stream, &plan.leaf_of)?;
            }
        }
        gather_tree_order(&self.kernels, &stream, state, b)?;
        stream.synchronize()?;
        secs.upload = t.elapsed().as_secs_f64();
        let walked = match (plan.device_lists, &self.walking) {
            (None, _) => None,
            (Some(_), Some(w)) => Some(w),
            (Some(_), None) => {
                return Err(GpuError::Unsupported(
                    "a plan with lists on the device before a device walk".into(),
                ));
            }
        };
        if plan.upward_on_device {
            upward_pass(&self.kernels, &stream, b, plan, &mut secs)?;
        }
        run_passes(
            &self.kernels,
            &stream,
            b,
            walked,
            plan,
            (softening, g),
            &mut secs,
        )?;
        let t = Instant::now();
        scatter_forces(&self.kernels, &stream, b, state)?;
        stream.synchronize()?;
        secs.download = t.elapsed().as_secs_f64();
        Ok(secs)
    }

    /// The particles' state on the device: positions, velocities, masses, accelerations
    /// and components of `particles` (their order).
    pub fn load_state(&self, particles: &Particles) -> Result<DeviceState, GpuError> {
        let n = particles.len();
        let mut state = self.alloc_state(n, n)?;
        self.upload_rows(&mut state, particles, 0)?;
        if particles.acc.len() == n && n > 0 {
            self.stream
                .memcpy_htod(&flat(&particles.acc), &mut state.acc)?;
        }
        if particles.pot.len() == n && n > 0 {
            self.stream.memcpy_htod(&particles.pot, &mut state.pot)?;
        }
        Ok(state)
    }

    /// A state of `n` particles, all zero, with room for `capacity` (at least `n`).
    fn alloc_state(&self, n: usize, capacity: usize) -> Result<DeviceState, GpuError> {
        let stream = &self.stream;
        let capacity = capacity.max(n);
        let [pos, vel, mass, acc, pot, block_max, partial] = resident_f64_counts(capacity);
        let zeros = |count: usize| stream.alloc_zeros::<f64>(count.max(1));
        Ok(DeviceState {
            n,
            capacity,
            pos: zeros(pos)?,
            vel: zeros(vel)?,
            mass: zeros(mass)?,
            acc: zeros(acc)?,
            pot: zeros(pot)?,
            block_max: zeros(block_max)?,
            partial: zeros(partial)?,
            component: stream.alloc_zeros::<u8>(capacity.max(1))?,
            id: stream.alloc_zeros::<u64>(capacity.max(1))?,
            steps: Reused::new(stream, 0)?,
            rows: Reused::new(stream, 0)?,
            picked: Reused::new(stream, 0)?,
        })
    }

    /// The positions, velocities (when `particles` has them) and masses of the rows
    /// `first..` of `particles` into the same rows of `state` (its other rows stay as
    /// they are), and the ids and components of all its rows.
    fn upload_rows(
        &self,
        state: &mut DeviceState,
        particles: &Particles,
        first: usize,
    ) -> Result<(), GpuError> {
        let stream = &self.stream;
        let n = particles.len();
        if state.n != n || first > n {
            return Err(GpuError::Unsupported(format!(
                "rows {first}.. of {n} particles into a device state of {}",
                state.n
            )));
        }
        if n == 0 {
            return Ok(());
        }
        if first < n {
            let pos = flat(&particles.pos[first..]);
            stream.memcpy_htod(&pos, &mut state.pos.slice_mut(3 * first..3 * n))?;
            if particles.vel.len() == n {
                let vel = flat(&particles.vel[first..]);
                stream.memcpy_htod(&vel, &mut state.vel.slice_mut(3 * first..3 * n))?;
            }
            let mass = &particles.mass[first..];
            stream.memcpy_htod(mass, &mut state.mass.slice_mut(first..n))?;
        }
        let component: Vec<u8> = particles
            .component
            .iter()
            .map(|c| c.index() as u8)
            .collect();
        stream.memcpy_htod(&component, &mut state.component.slice_mut(0..n))?;
        stream.memcpy_htod(&particles.id, &mut state.id.slice_mut(0..n))?;
        Ok(())
    }

    /// `state` as the rank's new set `particles` after a migration
    /// (`distributed::decomposition::migrate`): the particles of `stays` (rows of `state`,
    /// in order) keep their positions, velocities, masses, accelerations and potentials,
    /// gathered on the device (4 bytes a row go up); the arrivals, the rows of `particles`
    /// after them, come up with zero accelerations and potentials (the host's copy of
    /// theirs is the device's); the ids and components of all come up from `particles`.
    /// The new set is built in `spare` (a state kept for it, allocated with room to spare
    /// when it has too little), and the old one becomes the spare: after the first few
    /// migrations a step allocates nothing (design §7).
    pub fn migrate_state(
        &self,
        state: &mut DeviceState,
        spare: &mut Option<DeviceState>,
        stays: &[u32],
        particles: &Particles,
    ) -> Result<(), GpuError> {
        let (kept, n) = (stays.len(), particles.len());
        if kept > n || stays.iter().any(|&i| i as usize >= state.n) {
            return Err(GpuError::Unsupported(format!(
                "{kept} of {} particles on the device kept in a set of {n}",
                state.n
            )));
        }
        let stream = self.stream.clone();
        let mut next = match spare.take() {
            Some(next) if next.capacity >= n => next,
            _ => self.alloc_state(n, n + n.div_ceil(SPARE_ROOM))?,
        };
        next.n = n;
        // The scratch of the block scheme stays with the particles' state, grown as it is.
        std::mem::swap(&mut next.steps, &mut state.steps);
        std::mem::swap(&mut next.rows, &mut state.rows);
        std::mem::swap(&mut next.picked, &mut state.picked);
        if kept > 0 {
            next.rows.room(&stream, kept)?;
            next.rows.upload(&stream, stays)?;
            let count = kept as u32;
            for (from, to, width) in [
                (&state.pos, &mut next.pos, 3u32),
                (&state.vel, &mut next.vel, 3),
                (&state.mass, &mut next.mass, 1),
                (&state.acc, &mut next.acc, 3),
                (&state.pot, &mut next.pot, 1),
            ] {
                let mut launch = stream.launch_builder(&self.kernels.gather_rows);
                launch
                    .arg(from)
                    .arg(&next.rows.buf)
                    .arg(&count)
                    .arg(&width)
                    .arg(to);
                // SAFETY: the arguments match gather_rows's signature; every row is a
                // particle of `state`, and `to` holds `width` values for each of n >= kept.
                unsafe { launch.launch(grid(kept * width as usize)) }?;
            }
        }
        if n > kept {
            stream.memset_zeros(&mut next.acc.slice_mut(3 * kept..3 * n))?;
            stream.memset_zeros(&mut next.pot.slice_mut(kept..n))?;
        }
        self.upload_rows(&mut next, particles, kept)?;
        stream.synchronize()?;
        *spare = Some(std::mem::replace(state, next));
        Ok(())
    }

    /// `v += a dt` on the device.
    pub fn kick(&self, state: &mut DeviceState, dt: f64) -> Result<(), GpuError> {
        let kernel = &self.kernels.kick;
        self.add_scaled(kernel, &mut state.vel, &state.acc, dt, state.n)
    }

    /// The block scheme's kick on the device, `v += a h[k]` for the k-th particle of `rows`
    /// (of all without them), with the host's bits (`leapfrog::kick_each`).
    pub fn kick_each(
        &self,
        state: &mut DeviceState,
        rows: Option<&[u32]>,
        h: &[f64],
    ) -> Result<(), GpuError> {
        let count = rows.map_or(state.n, <[u32]>::len);
        if h.len() != count || rows.is_some_and(|r| r.iter().any(|&i| i as usize >= state.n)) {
            return Err(GpuError::Unsupported(format!(
                "{} steps for {count} of the {} particles on the device",
                h.len(),
                state.n
            )));
        }
        if count == 0 {
            return Ok(());
        }
        if let Some(rows) = rows {
            state.rows.room(&self.stream, count)?;
            state.rows.upload(&self.stream, rows)?;
        }
        state.steps.room(&self.stream, count)?;
        state.steps.upload(&self.stream, h)?;
        let (listed, count32) = (u32::from(rows.is_some()), count as u32);
        let mut launch = self.stream.launch_builder(&self.kernels.kick_each);
        launch
            .arg(&mut state.vel)
            .arg(&state.acc)
            .arg(&state.rows.buf)
            .arg(&listed)
            .arg(&state.steps.buf)
            .arg(&count32);
        // SAFETY: the arguments match kick_each's signature; vel and acc hold 3 n values,
        // steps `count`, and rows (read only when listed) `count` rows below n.
        unsafe { launch.launch(grid(count)) }?;
        Ok(())
    }

    /// `x += v dt` on the device.
    pub fn drift(&self, state: &mut DeviceState, dt: f64) -> Result<(), GpuError> {
        let kernel = &self.kernels.drift;
        self.add_scaled(kernel, &mut state.pos, &state.vel, dt, state.n)
    }

    /// `out += by dt` for `n` particles' 3-vectors with `kernel` (kick or drift, which
    /// share a signature).
    fn add_scaled(
        &self,
        kernel: &CudaFunction,
        out: &mut CudaSlice<f64>,
        by: &CudaSlice<f64>,
        dt: f64,
        n: usize,
    ) -> Result<(), GpuError> {
        let n32 = n as u32;
        let mut launch = self.stream.launch_builder(kernel);
        launch.arg(out).arg(by).arg(&dt).arg(&n32);
        // SAFETY: the arguments match kick's and drift's signature; both buffers hold 3 n
        // values.
        unsafe { launch.launch(grid(n)) }?;
        Ok(())
    }

    /// The largest |a| of each component's particles (`Component::index` order; 0 where
    /// there are none), with the host's bits (`leapfrog::max_acceleration_by_component`):
    /// per-block maxima of |a|² on the device, their maximum and square root here.
    pub fn max_acceleration_by_component(
        &self,
        state: &mut DeviceState,
    ) -> Result<[f64; 4], GpuError> {
        let n32 = state.n as u32;
        let mut launch = self.stream.launch_builder(&self.kernels.max_acc);
        launch
            .arg(&state.acc)
            .arg(&state.component)
            .arg(&n32)
            .arg(&mut state.block_max);
        // SAFETY: as above, for max_acceleration_blocks (block_max holds 4 per block).
        unsafe { launch.launch(grid(state.n)) }?;
        // The blocks of these particles only (a state may have room for more).
        let used = 4 * state.n.div_ceil(BLOCK as usize).max(1);
        let blocks = self.stream.clone_dtoh(&state.block_max.slice(0..used))?;
        self.stream.synchronize()?;
        let mut best = [0.0f64; 4];
        for m in blocks.chunks_exact(4) {
            for c in 0..4 {
                best[c] = best[c].max(m[c]);
            }
        }
        Ok(best.map(f64::sqrt))
    }

    /// The sums behind the diagnostics' conserved quantities (`Conserved::sums`), with the
    /// host's bits: per chunk on the device, the chunks added in order here.
    pub fn conserved_sums(
        &self,
        state: &mut DeviceState,
    ) -> Result<[f64; CONSERVED_SUMS], GpuError> {
        let n32 = state.n as u32;
        let chunks = state.n.div_ceil(crate::sum::CHUNK);
        let mut launch = self.stream.launch_builder(&self.kernels.conserved);
        launch
            .arg(&state.pos)
            .arg(&state.vel)
            .arg(&state.mass)
            .arg(&state.pot)
            .arg(&n32)
            .arg(&mut state.partial);
        // SAFETY: the arguments match conserved_chunks's signature; partial holds 12 values
        // per chunk (one thread per chunk).
        unsafe { launch.launch(grid(chunks)) }?;
        let partial = self
            .stream
            .clone_dtoh(&state.partial.slice(0..CONSERVED_SUMS * chunks))?;
        self.stream.synchronize()?;
        let mut total = [0.0; CONSERVED_SUMS];
        for chunk in partial.chunks_exact(CONSERVED_SUMS) {
            for (t, &c) in total.iter_mut().zip(chunk) {
                *t += c;
            }
        }
        Ok(total)
    }

    /// The particles of `state` keyed and sorted into tree order on the device (design §5
    /// steps 1–2, kernels/keys.cu; runs of equal keys in id order, kernels/split.cu:
    /// order_equal_runs), the keys, order, positions and masses kept there for
    /// `split_cells` and `cell_moments` (or `download_sorted`): their cube, the summary of
    /// the sort the host checks (kernels/split.cu: sort_scan; `SortSummary::check`), and
    /// whether the runs are ordered. `None` when a position or mass is not finite (the
    /// caller names the particle from the host's copy).
    pub fn sort_resident(&mut self, state: &DeviceState) -> Result<Option<DeviceSort>, GpuError> {
        self.split = None;
        self.moments_of = None;
        let (n, n32) = (state.n, state.n as u32);
        let stream = self.stream.clone();
        let s = match &mut self.sorting {
            Some(s) => s,
            None => self.sorting.insert(SortBuffers::new(&stream, n)?),
        };
        s.fit(&stream, n)?;
        let k = &self.kernels;
        let config = |blocks: u32, threads: u32| LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut launch = stream.launch_builder(&k.bounds);
        launch
            .arg(&state.pos)
            .arg(&state.mass)
            .arg(&n32)
            .arg(&mut s.bounds);
        // SAFETY: the arguments match bounds_blocks' signature; `bounds` holds
        // BOUNDS_FIELDS values for each of the BOUNDS_BLOCKS blocks.
        unsafe { launch.launch(config(BOUNDS_BLOCKS, BOUNDS_THREADS)) }?;
        let bounds = stream.clone_dtoh(&s.bounds)?;
        stream.synchronize()?;
        let Some(cube) = cube_of_bounds(&bounds) else {
            return Ok(None);
        };
        let [lo_x, lo_y, lo_z] = cube.lo;
        let scale = cube.scale();
        let [keys_a, keys_b] = &mut s.keys;
        let [index_a, index_b] = &mut s.index;
        let mut launch = stream.launch_builder(&k.keys);
        launch
            .arg(&state.pos)
            .arg(&n32)
            .arg(&lo_x)
            .arg(&lo_y)
            .arg(&lo_z)
            .arg(&scale)
            .arg(&mut keys_a.buf)
            .arg(&mut index_a.buf);
        // SAFETY: as above, for morton_keys; the key and index buffers hold n.
        unsafe { launch.launch(grid(n)) }?;
        let blocks = sort_blocks(n) as u32;
        let counts_len = RADIX_THREADS * blocks;
        // An even number of passes leaves the result where the keys started.
        const PASSES: u32 = 64 / RADIX_BITS;
        const _: () = assert!(PASSES.is_multiple_of(2));
        for pass in 0..PASSES {
            let shift = pass * RADIX_BITS;
            let (keys_in, keys_out, index_in, index_out) = if pass.is_multiple_of(2) {
                (&*keys_a, &mut *keys_b, &*index_a, &mut *index_b)
            } else {
                (&*keys_b, &mut *keys_a, &*index_b, &mut *index_a)
            };
            let mut launch = stream.launch_builder(&k.radix_count);
            launch
                .arg(&keys_in.buf)
                .arg(&n32)
                .arg(&shift)
                .arg(&mut s.counts.buf);
            // SAFETY: as above, for radix_count; `counts` holds RADIX_THREADS per block.
            unsafe { launch.launch(config(blocks, RADIX_THREADS)) }?;
            let mut launch = stream.launch_builder(&k.radix_offsets);
            launch.arg(&mut s.counts.buf).arg(&counts_len);
            // SAFETY: as above, for radix_offsets (one block).
            unsafe { launch.launch(config(1, OFFSETS_THREADS)) }?;
            let mut launch = stream.launch_builder(&k.radix_scatter);
            launch
                .arg(&keys_in.buf)
                .arg(&index_in.buf)
                .arg(&n32)
                .arg(&shift)
                .arg(&s.counts.buf)
                .arg(&mut keys_out.buf)
                .arg(&mut index_out.buf);
            // SAFETY: as above, for radix_scatter; every output position is below n.
            unsafe { launch.launch(config(blocks, RADIX_THREADS)) }?;
        }
        s.scan.zero(&stream, SCAN_VALUES)?;
        let mut launch = stream.launch_builder(&k.sort_scan);
        launch
            .arg(&keys_a.buf)
            .arg(&index_a.buf)
            .arg(&n32)
            .arg(&mut s.scan.buf);
        // SAFETY: as above, for sort_scan; `scan` holds SCAN_VALUES zeroes.
        unsafe { launch.launch(config(SCAN_BLOCKS, SCAN_THREADS)) }?;
        let scan = stream.clone_dtoh(&s.scan.buf.slice(0..SCAN_VALUES))?;
        stream.synchronize()?;
        let summary = SortSummary {
            out_of_order: scan[0],
            equal_neighbours: scan[1],
            largest: scan[2],
            sum: scan[3],
            squares: scan[4],
        };
        // What the checks reject is not read through (an index past the particles).
        let valid = summary.check(n).is_ok();
        let mut runs_ordered = true;
        if valid && summary.equal_neighbours > 0 {
            s.long_runs.zero(&stream, 1)?;
            let mut launch = stream.launch_builder(&k.order_runs);
            launch
                .arg(&keys_a.buf)
                .arg(&state.id)
                .arg(&n32)
                .arg(&mut index_a.buf)
                .arg(&mut s.long_runs.buf);
            // SAFETY: as above, for order_equal_runs; keys, ids and indices hold n.
            unsafe { launch.launch(grid(n)) }?;
            runs_ordered = stream.clone_dtoh(&s.long_runs.buf.slice(0..1))?[0] == 0;
        }
        if valid {
            let mut launch = stream.launch_builder(&k.gather);
            launch
                .arg(&state.pos)
                .arg(&state.mass)
                .arg(&index_a.buf)
                .arg(&n32)
                .arg(&mut s.pos.buf)
                .arg(&mut s.mass.buf);
            // SAFETY: as above, for gather_tree_order; every buffer holds n, every index is
            // below n.
            unsafe { launch.launch(grid(n)) }?;
            stream.synchronize()?;
        }
        Ok(Some(DeviceSort {
            cube,
            summary,
            runs_ordered,
        }))
    }

    /// The keys and order of `state`'s last `sort_resident` (in `cube`) downloaded into
    /// `out`, for the host to split into cells (`FmmSolver::plan_sorted`), and with
    /// `with_particles` the positions and masses in that order (without, they stay on the
    /// device for `cell_moments`, and `out` gets none).
    pub fn download_sorted(
        &self,
        state: &DeviceState,
        cube: BoundingCube,
        out: &mut SortedParticles,
        with_particles: bool,
    ) -> Result<(), GpuError> {
        let n = state.n;
        let stream = &self.stream;
        let s = self.sorted(n)?;
        out.keys.resize(n, 0);
        out.order.resize(n, 0);
        stream.memcpy_dtoh(&s.keys[0].buf.slice(0..n), &mut out.keys[..])?;
        stream.memcpy_dtoh(&s.index[0].buf.slice(0..n), &mut out.order[..])?;
        if with_particles {
            out.pos.resize(n, [0.0; 3]);
            out.mass.resize(n, 0.0);
            stream.memcpy_dtoh(&s.pos.buf.slice(0..3 * n), out.pos.as_flattened_mut())?;
            stream.memcpy_dtoh(&s.mass.buf.slice(0..n), &mut out.mass[..])?;
        } else {
            out.pos.clear();
            out.mass.clear();
        }
        stream.synchronize()?;
        out.cube = Some(cube);
        Ok(())
    }

    /// The buffers of the last `sort_resident`, of (at least) `n` particles, for a download.
    fn sorted(&self, n: usize) -> Result<&SortBuffers, GpuError> {
        let s = self.sorting.as_ref().ok_or_else(|| {
            GpuError::Unsupported("a download of the sort before the sort".into())
        })?;
        if s.keys[0].buf.len() < n || s.index[0].buf.len() < n {
            return Err(GpuError::Unsupported(
                "a download of a sort of fewer particles".into(),
            ));
        }
        Ok(s)
    }

    /// For each cell of `tree` (split on the device by the last `split_cells`, its moments
    /// computed by `cell_moments`), whether it holds one of the particles of `rows` (rows
    /// of `state`): `Tree::cells_holding`'s flags, found where the tree is (kernels
    /// mark_rows and flag_cells_holding), so that a block sub-step brings back a byte per
    /// cell instead of the sort's order (4 bytes a particle).
    pub fn cells_holding(
        &mut self,
        state: &DeviceState,
        tree: &Tree,
        rows: &[u32],
        out: &mut Vec<bool>,
    ) -> Result<(), GpuError> {
        let (n, cells) = (state.n, tree.cells.len());
        if self.split != Some(cells) || rows.iter().any(|&i| i as usize >= n) {
            return Err(GpuError::Unsupported(
                "active cells of a tree the device did not split, or of rows beyond its particles"
                    .into(),
            ));
        }
        let stream = self.stream.clone();
        let s = self
            .sorting
            .as_ref()
            .filter(|s| s.index[0].buf.len() >= n)
            .ok_or_else(|| GpuError::Unsupported("active cells before a sort".into()))?;
        let m = self
            .moments
            .as_mut()
            .ok_or_else(|| GpuError::Unsupported("active cells before the moments".into()))?;
        m.marked.room(&stream, n)?;
        m.marked.zero(&stream, n)?;
        m.flags.room(&stream, cells)?;
        m.flags.zero(&stream, cells)?;
        m.rows.room(&stream, rows.len())?;
        m.rows.upload(&stream, rows)?;
        let count = rows.len() as u32;
        let mut launch = stream.launch_builder(&self.kernels.mark_rows);
        launch.arg(&m.rows.buf).arg(&count).arg(&mut m.marked.buf);
        // SAFETY: the arguments match mark_rows's signature; every row is below n, the
        // marks' length.
        unsafe { launch.launch(grid(rows.len())) }?;
        let n_leaves = tree.leaves.len() as u32;
        let mut launch = stream.launch_builder(&self.kernels.flag_cells);
        launch
            .arg(&m.leaves.buf)
            .arg(&n_leaves)
            .arg(&m.begin.buf)
            .arg(&m.end.buf)
            .arg(&m.parent.buf)
            .arg(&s.index[0].buf)
            .arg(&m.marked.buf)
            .arg(&mut m.flags.buf);
        // SAFETY: the arguments match flag_cells_holding's signature; the cells' columns and
        // leaves are the tree's (its split and moments were the device's), the order holds n.
        unsafe { launch.launch(grid(tree.leaves.len())) }?;
        let mut flags = vec![0u8; cells];
        stream.memcpy_dtoh(&m.flags.buf.slice(0..cells), &mut flags[..])?;
        stream.synchronize()?;
        out.clear();
        out.extend(flags.iter().map(|&f| f != 0));
        Ok(())
    }

    /// The particles of `state`'s last `sort_resident` split into cells on the device
    /// (kernels/split.cu, level by level: counts, prefix sums, writes): at most
    /// `leaf_size` a leaf, the cells of `Tree::build_cells` in its numbering, their columns
    /// downloaded into `out` (16 bytes a cell) and kept for `cell_moments`. `Ok(Err(..))`
    /// when they need more than `cap` cells.
    pub fn split_cells(
        &mut self,
        state: &DeviceState,
        leaf_size: usize,
        cap: usize,
        out: &mut CellColumns,
    ) -> Result<Result<(), CellsOverflow>, GpuError> {
        self.split = None;
        let n = state.n;
        let stream = self.stream.clone();
        let k = &self.kernels;
        let s = self.sorting.as_ref().ok_or_else(|| {
            GpuError::Unsupported("a split into cells before a sort into tree order".into())
        })?;
        if cap == 0 {
            return Ok(Err(CellsOverflow { needed: 1 }));
        }
        let m = match &mut self.moments {
            Some(m) => m,
            None => self.moments.insert(MomentsBuffers::new(&stream, n, 1)?),
        };
        let leaf_size = leaf_size.clamp(1, u32::MAX as usize) as u32;
        for column in m.cell_columns() {
            column.room(&stream, 1)?;
        }
        m.begin.upload(&stream, &[0])?;
        m.end.upload(&stream, &[n as u32])?;
        m.parent.upload(&stream, &[0])?;
        let mut level_start = vec![0usize];
        let (mut first, mut cells) = (0usize, 1usize);
        for level in 0u32.. {
            let count = cells - first;
            m.split_counts.room(&stream, count + 1)?;
            m.split_counts.zero(&stream, count + 1)?;
            let (first32, count32) = (first as u32, count as u32);
            let mut launch = stream.launch_builder(&k.split_count);
            launch
                .arg(&first32)
                .arg(&count32)
                .arg(&level)
                .arg(&leaf_size)
                .arg(&s.keys[0].buf)
                .arg(&m.begin.buf)
                .arg(&m.end.buf)
                .arg(&mut m.split_counts.buf);
            // SAFETY: the arguments match split_count's signature; the level's cells are
            // below `cells`, and the counts hold count + 1.
            unsafe { launch.launch(grid(count)) }?;
            let len = count32 + 1;
            let mut launch = stream.launch_builder(&k.radix_offsets);
            launch.arg(&mut m.split_counts.buf).arg(&len);
            // SAFETY: radix_offsets scans `len` counts in place (one block).
            unsafe {
                launch.launch(LaunchConfig {
                    grid_dim: (1, 1, 1),
                    block_dim: (OFFSETS_THREADS, 1, 1),
                    shared_mem_bytes: 0,
                })
            }?;
            let children =
                stream.clone_dtoh(&m.split_counts.buf.slice(count..count + 1))?[0] as usize;
            if cells + children > cap {
                return Ok(Err(CellsOverflow { needed: cap + 1 }));
            }
            for column in m.cell_columns() {
                column.room_keeping(&stream, cells + children, cells)?;
            }
            let mut launch = stream.launch_builder(&k.split_write);
            launch
                .arg(&first32)
                .arg(&count32)
                .arg(&level)
                .arg(&leaf_size)
                .arg(&s.keys[0].buf)
                .arg(&m.split_counts.buf)
                .arg(&mut m.begin.buf)
                .arg(&mut m.end.buf)
                .arg(&mut m.first_child.buf)
                .arg(&mut m.child_count.buf)
                .arg(&mut m.parent.buf);
            // SAFETY: as above, for split_write; the columns hold the next level's cells.
            unsafe { launch.launch(grid(count)) }?;
            if children == 0 {
                break;
            }
            first = cells;
            cells += children;
            level_start.push(first);
        }
        level_start.push(cells);
        for (column, to) in [
            (&m.begin, &mut out.begin),
            (&m.end, &mut out.end),
            (&m.first_child, &mut out.first_child),
            (&m.child_count, &mut out.child_count),
        ] {
            to.resize(cells, 0);
            stream.memcpy_dtoh(&column.buf.slice(0..cells), &mut to[..])?;
        }
        stream.synchronize()?;
        out.level_start = level_start;
        self.split = Some(cells);
        Ok(Ok(()))
    }

    /// Mass, centre and r_max of every cell of `tree` (kernels/moments.cu: the values of
    /// `Tree::compute_moments`, bit for bit), computed and kept on the device (for `walk`
    /// and the passes; `download_moments` brings them to the host), from the particles the
    /// last `sort_resident` of `state` left on the device in tree order; with `reordered`
    /// they are first put into `tree.order` (the host reordered equal keys). Only the cells
    /// go up, none when `split_cells` made them there.
    pub fn cell_moments(
        &mut self,
        state: &DeviceState,
        tree: &Tree,
        reordered: bool,
    ) -> Result<(), GpuError> {
        self.moments_of = None;
        let (n, cells, levels) = (state.n, tree.cells.len(), tree.depth());
        if tree.own_particles != n || tree.own_cells != cells || levels + 1 > LEVEL_SLOTS {
            return Err(GpuError::Unsupported(format!(
                "moments of a tree of {} particles, {} cells ({cells} with received ones) and {levels} levels on a device state of {n} particles",
                tree.own_particles, tree.own_cells
            )));
        }
        let stream = self.stream.clone();
        let k = &self.kernels;
        let s = self.sorting.as_mut().ok_or_else(|| {
            GpuError::Unsupported("cell moments before a sort into tree order".into())
        })?;
        let n32 = n as u32;
        if reordered {
            s.index[0].upload(&stream, &tree.order)?;
            let mut launch = stream.launch_builder(&k.gather);
            launch
                .arg(&state.pos)
                .arg(&state.mass)
                .arg(&s.index[0].buf)
                .arg(&n32)
                .arg(&mut s.pos.buf)
                .arg(&mut s.mass.buf);
            // SAFETY: the arguments match gather_tree_order's signature; every buffer holds n.
            unsafe { launch.launch(grid(n)) }?;
        }
        let m = match &mut self.moments {
            Some(m) => m,
            None => self.moments.insert(MomentsBuffers::new(&stream, n, cells)?),
        };
        m.fit(&stream, n, cells, levels)?;
        // Cells split here are there already (`Tree::adopt_cells` checked them).
        if self.split != Some(cells) {
            let column = |f: fn(&crate::fmm::tree::Cell) -> u32| -> Vec<u32> {
                tree.cells.iter().map(f).collect()
            };
            m.begin.upload(&stream, &column(|c| c.begin))?;
            m.end.upload(&stream, &column(|c| c.end))?;
            m.first_child.upload(&stream, &column(|c| c.first_child))?;
            m.child_count
                .upload(&stream, &column(|c| u32::from(c.child_count)))?;
            m.parent.upload(&stream, &column(|c| c.parent))?;
        }
        m.leaves.upload(&stream, &tree.leaves)?;
        let level_start: Vec<u32> = tree.level_start.iter().map(|&l| l as u32).collect();
        m.level_start.upload(&stream, &level_start)?;
        let n_leaves = tree.leaves.len() as u32;
        let mut launch = stream.launch_builder(&k.leaf_of);
        launch
            .arg(&m.leaves.buf)
            .arg(&n_leaves)
            .arg(&m.begin.buf)
            .arg(&m.end.buf)
            .arg(&mut m.leaf_of.buf);
        // SAFETY: the arguments match leaf_of_particles' signature; the leaves' ranges
        // cover the n particles once.
        unsafe { launch.launch(grid(tree.leaves.len())) }?;
        for level in (0..levels).rev() {
            let (first, count) = (
                level_start[level],
                level_start[level + 1] - level_start[level],
            );
            let mut launch = stream.launch_builder(&k.level_moments);
            launch
                .arg(&first)
                .arg(&count)
                .arg(&m.begin.buf)
                .arg(&m.end.buf)
                .arg(&m.first_child.buf)
                .arg(&m.child_count.buf)
                .arg(&s.pos.buf)
                .arg(&s.mass.buf);
            launch
                .arg(&mut m.mass.buf)
                .arg(&mut m.centre.buf)
                .arg(&mut m.r2.buf);
            // SAFETY: as above, for level_moments; the level's children are done.
            unsafe { launch.launch(grid(count as usize)) }?;
        }
        let levels32 = levels as u32;
        let mut launch = stream.launch_builder(&k.ancestor_r2);
        launch
            .arg(&s.pos.buf)
            .arg(&n32)
            .arg(&m.leaf_of.buf)
            .arg(&m.parent.buf)
            .arg(&m.level_start.buf)
            .arg(&levels32)
            .arg(&m.centre.buf)
            .arg(&mut m.r2.buf);
        let blocks = (n as u32).div_ceil(ANCESTOR_THREADS).max(1);
        let config = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (ANCESTOR_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        if n > 0 {
            // SAFETY: as above, for ancestor_r2 (ANCESTOR_THREADS per block, every block
            // starting below n).
            unsafe { launch.launch(config) }?;
        }
        let cells32 = cells as u32;
        let mut launch = stream.launch_builder(&k.finish_moments);
        launch
            .arg(&cells32)
            .arg(&m.mass.buf)
            .arg(&m.centre.buf)
            .arg(&m.r2.buf)
            .arg(&mut m.out.buf);
        // SAFETY: as above, for finish_moments.
        unsafe { launch.launch(grid(cells)) }?;
        self.moments_of = Some(cells);
        Ok(())
    }

    /// The five values of every cell the last `cell_moments` computed, into `out` in cell
    /// order.
    pub fn download_moments(&self, out: &mut Vec<[f64; MOMENT_VALUES]>) -> Result<(), GpuError> {
        let (Some(cells), Some(m)) = (self.moments_of, &self.moments) else {
            return Err(GpuError::Unsupported(
                "a download of cell moments before any were computed".into(),
            ));
        };
        out.resize(cells, [0.0; MOMENT_VALUES]);
        self.stream.memcpy_dtoh(
            &m.out.buf.slice(0..MOMENT_VALUES * cells),
            out.as_flattened_mut(),
        )?;
        self.stream.synchronize()?;
        Ok(())
    }

    /// The M2L and P2P lists of every cell of `tree`, walked on the device with `mac`
    /// (kernels/walk.cu: the host walk's lists, in its order) from the cells and moments
    /// the last `cell_moments` left there, and kept there for `evaluate_resident`; their
    /// sizes, or `None` when a target's ring of opened sources overflowed or a list came out
    /// of order (the host then walks). `caps` sizes the lists' first buffers. Each level
    /// runs twice, counting then writing at the counts' prefix sums. With `targets` (a flag
    /// per cell: a block sub-step's cells holding active particles, every target's parent
    /// among them), the lists of those cells only, the others' empty.
    pub fn walk(
        &mut self,
        tree: &Tree,
        mac: Mac,
        caps: &Caps,
        targets: Option<&[bool]>,
    ) -> Result<Option<DeviceLists>, GpuError> {
        let (cells, levels) = (tree.cells.len(), tree.depth());
        if targets.is_some_and(|t| t.len() != cells) {
            return Err(GpuError::Unsupported(
                "target flags for another number of cells".into(),
            ));
        }
        let stream = self.stream.clone();
        let k = &self.kernels;
        let m = self
            .moments
            .as_ref()
            .ok_or_else(|| GpuError::Unsupported("a walk before the cells' moments".into()))?;
        let w = match &mut self.walking {
            Some(w) => w,
            None => self.walking.insert(WalkBuffers::new(&stream, cells, caps)?),
        };
        for spans in [&mut w.m2l_spans, &mut w.p2p_spans, &mut w.pairs] {
            spans.room(&stream, cells)?;
        }
        for spans in &mut w.deferred_spans {
            spans.room(&stream, cells)?;
        }
        for list in &mut w.retry {
            list.room(&stream, cells)?;
        }
        w.m2l_sources.room(&stream, caps.m2l_pairs)?;
        w.p2p_sources.room(&stream, caps.p2p_pairs)?;
        w.problems.zero(&stream, 1)?;
        // Each level's targets, when not all: their cells in order (levels are runs of
        // cells), and where each level's start in that list. The other cells' lists are
        // empty (their spans and pairs zero: the passes run over every cell).
        let mut listed_from = Vec::new();
        if let Some(flags) = targets {
            let listed: Vec<u32> = (0..cells as u32).filter(|&c| flags[c as usize]).collect();
            listed_from = tree.level_start[..=levels]
                .iter()
                .map(|&start| listed.partition_point(|&c| (c as usize) < start))
                .collect();
            w.targets.room(&stream, listed.len())?;
            w.targets.upload(&stream, &listed)?;
            for spans in [&mut w.m2l_spans, &mut w.p2p_spans, &mut w.pairs] {
                spans.zero(&stream, cells)?;
            }
        }
        let (theta, support) = (mac.theta, mac.support);
        // A kept entry tags its source's index in 30 bits (walk.cu: WALK_TAG_SHIFT).
        let cache_room = (if cells < 1 << 30 { WALK_CACHE } else { 0 }) as u32;
        let (mut m2l_total, mut p2p_total) = (0usize, 0usize);
        for level in 0..levels {
            let first = tree.level_start[level];
            let count = tree.level_start[level + 1] - first;
            let stride = count + 1;
            w.counts.room(&stream, 3 * stride)?;
            w.counts.zero(&stream, 3 * stride)?;
            w.cache.room(&stream, count * cache_room as usize)?;
            w.cache_len.room(&stream, count)?;
            let [deferred_0, deferred_1] = &mut w.deferred;
            let [spans_0, spans_1] = &mut w.deferred_spans;
            // Level l writes side l % 2 and reads what level l - 1 wrote on the other.
            let (handed, next, handed_spans, next_spans) = if level % 2 == 0 {
                (&*deferred_1, deferred_0, &*spans_1, spans_0)
            } else {
                (&*deferred_0, deferred_1, &*spans_0, spans_1)
            };
            let mut level_totals = (0, 0);
            for write in [0i32, 1] {
                if write == 1 {
                    for list in 0..3 {
                        let mut part = w.counts.buf.slice_mut(list * stride..(list + 1) * stride);
                        let len = stride as u32;
                        let mut launch = stream.launch_builder(&k.radix_offsets);
                        launch.arg(&mut part).arg(&len);
                        // SAFETY: radix_offsets scans `len` counts in place (one block).
                        unsafe {
                            launch.launch(LaunchConfig {
                                grid_dim: (1, 1, 1),
                                block_dim: (OFFSETS_THREADS, 1, 1),
                                shared_mem_bytes: 0,
                            })
                        }?;
                    }
                    // The three totals in one download: one wait for the device, not three.
                    for list in 0..3 {
                        let at = list * stride + count;
                        stream.memcpy_dtod(
                            &w.counts.buf.slice(at..at + 1),
                            &mut w.totals.buf.slice_mut(list..list + 1),
                        )?;
                    }
                    let totals = stream.clone_dtoh(&w.totals.buf.slice(0..3))?;
                    let [m2l, p2p, deferred] = [0, 1, 2].map(|list| totals[list] as usize);
                    if m2l_total + m2l > u32::MAX as usize || p2p_total + p2p > u32::MAX as usize {
                        return Err(GpuError::Unsupported(
                            "more list entries than 32-bit offsets reach".into(),
                        ));
                    }
                    w.m2l_sources
                        .room_keeping(&stream, m2l_total + m2l, m2l_total)?;
                    w.p2p_sources
                        .room_keeping(&stream, p2p_total + p2p, p2p_total)?;
                    next.room(&stream, deferred)?;
                    level_totals = (m2l, p2p);
                }
                // The level's targets with short rings, then those whose rings filled up
                // with long ones; any that fill those too are the host's to walk.
                for r in &mut w.retry_count {
                    r.zero(&stream, 1)?;
                }
                let [retry_0, retry_1] = &mut w.retry;
                let [count_0, count_1] = &mut w.retry_count;
                let stride32 = stride as u32;
                let (m2l_base, p2p_base) = (m2l_total as u32, p2p_total as u32);
                // Targets chunk_first.. of the level, or with `listed` of `which`, with
                // rings of `queue` entries.
                let mut walk_launch = |listed: bool,
                                       queue: usize,
                                       (chunk_first, chunk_count): (usize, usize),
                                       which: &Reused<u32>,
                                       retry: &mut Reused<u32>,
                                       retry_count: &mut Reused<u32>|
                 -> Result<(), GpuError> {
                    // A ring for each of the launch's targets: as large as the launches
                    // of this tree need, WALK_RING_BYTES at the most.
                    w.ring
                        .room_at_most(&stream, chunk_count * queue, WALK_RING_BYTES / 4)?;
                    let queue = queue as u32;
                    let (level_first, chunk_first, chunk_count, listed) = (
                        first as u32,
                        chunk_first as u32,
                        chunk_count as u32,
                        i32::from(listed),
                    );
                    let mut launch = stream.launch_builder(&k.walk_level);
                    launch
                        .arg(&level_first)
                        .arg(&chunk_first)
                        .arg(&chunk_count)
                        .arg(&listed)
                        .arg(&which.buf)
                        .arg(&write)
                        .arg(&m.out.buf)
                        .arg(&m.begin.buf)
                        .arg(&m.end.buf)
                        .arg(&m.first_child.buf)
                        .arg(&m.child_count.buf)
                        .arg(&m.parent.buf);
                    launch
                        .arg(&handed_spans.buf)
                        .arg(&handed.buf)
                        .arg(&theta)
                        .arg(&support)
                        .arg(&mut w.ring.buf)
                        .arg(&queue)
                        .arg(&mut w.cache.buf)
                        .arg(&cache_room)
                        .arg(&mut w.cache_len.buf)
                        .arg(&stride32)
                        .arg(&mut w.counts.buf)
                        .arg(&mut w.pairs.buf)
                        .arg(&m2l_base)
                        .arg(&p2p_base);
                    launch
                        .arg(&mut w.m2l_sources.buf)
                        .arg(&mut w.m2l_spans.buf)
                        .arg(&mut w.p2p_sources.buf)
                        .arg(&mut w.p2p_spans.buf)
                        .arg(&mut next.buf)
                        .arg(&mut next_spans.buf)
                        .arg(&mut retry.buf)
                        .arg(&mut retry_count.buf)
                        .arg(&mut w.problems.buf);
                    // SAFETY: the arguments match walk_level's signature; the ring holds
                    // `queue` entries for each of the launch's targets (above), the
                    // counts 3 strides, the lists and deferred sources their totals, the
                    // retry lists a level's cells, and a listed launch reads as many
                    // targets as the short launches listed.
                    unsafe { launch.launch(grid(chunk_count as usize)) }?;
                    Ok(())
                };
                let short = WALK_SHORT_QUEUE;
                if targets.is_some() {
                    let (lo, hi) = (listed_from[level], listed_from[level + 1]);
                    for chunk_first in (lo..hi).step_by(WALK_CHUNK) {
                        let chunk = (chunk_first, WALK_CHUNK.min(hi - chunk_first));
                        walk_launch(true, short, chunk, &w.targets, retry_0, count_0)?;
                    }
                } else {
                    for chunk_first in (first..first + count).step_by(WALK_CHUNK) {
                        let chunk = (chunk_first, WALK_CHUNK.min(first + count - chunk_first));
                        walk_launch(false, short, chunk, retry_1, retry_0, count_0)?;
                    }
                }
                let again = stream.clone_dtoh(&count_0.buf.slice(0..1))?[0] as usize;
                for chunk_first in (0..again).step_by(WALK_RETRY_CHUNK) {
                    let chunk = (chunk_first, WALK_RETRY_CHUNK.min(again - chunk_first));
                    walk_launch(true, WALK_QUEUE, chunk, retry_0, retry_1, count_1)?;
                }
                if again > 0 && stream.clone_dtoh(&count_1.buf.slice(0..1))?[0] > 0 {
                    return Ok(None);
                }
            }
            m2l_total += level_totals.0;
            p2p_total += level_totals.1;
        }
        let problems = stream.clone_dtoh(&w.problems.buf.slice(0..1))?[0];
        let pairs = stream.clone_dtoh(&w.pairs.buf.slice(0..cells))?;
        stream.synchronize()?;
        if problems > 0 {
            return Ok(None);
        }
        Ok(Some(DeviceLists {
            m2l: m2l_total,
            p2p: p2p_total,
            p2p_interactions: pairs.iter().sum(),
        }))
    }

    /// The lists of the last `walk` of a tree of `cells` cells, downloaded (for checks):
    /// M2L spans and sources, P2P spans and sources, as in `DevicePlan`.
    pub fn walked_lists(&self, cells: usize, lists: DeviceLists) -> Result<WalkedLists, GpuError> {
        let w = self
            .walking
            .as_ref()
            .ok_or_else(|| GpuError::Unsupported("no walk on the device yet".into()))?;
        let stream = &self.stream;
        let out = WalkedLists {
            m2l_spans: stream.clone_dtoh(&w.m2l_spans.buf.slice(0..cells))?,
            m2l_sources: stream.clone_dtoh(&w.m2l_sources.buf.slice(0..lists.m2l))?,
            p2p_spans: stream.clone_dtoh(&w.p2p_spans.buf.slice(0..cells))?,
            p2p_sources: stream.clone_dtoh(&w.p2p_sources.buf.slice(0..lists.p2p))?,
        };
        stream.synchronize()?;
        Ok(out)
    }

    /// Copies the positions of `state` into `pos` (the host's tree build needs them).
    /// Through the page-locked stage: a K-rank run brings them down every step.
    pub fn positions(&mut self, state: &DeviceState, pos: &mut [[f64; 3]]) -> Result<(), GpuError> {
        let n = state.n;
        if pos.len() != n {
            return Err(GpuError::Unsupported(format!(
                "positions of {n} particles into {}",
                pos.len()
            )));
        }
        if n == 0 {
            return Ok(());
        }
        let src = state.pos.slice(0..3 * n);
        self.stage
            .download(&self.stream, &src, pos.as_flattened_mut())
    }

    /// Copies the accelerations of `state` into `acc`, or with `only` those of the listed
    /// particles (gathered on the device: a block sub-step's active ones, whose step
    /// criterion reads them; the others in `acc` stay as they were).
    pub fn accelerations(
        &mut self,
        state: &mut DeviceState,
        acc: &mut [[f64; 3]],
        only: Option<&[u32]>,
    ) -> Result<(), GpuError> {
        let n = state.n;
        if acc.len() != n || only.is_some_and(|r| r.iter().any(|&i| i as usize >= n)) {
            return Err(GpuError::Unsupported(format!(
                "accelerations of {n} particles into {}, or of rows beyond them",
                acc.len()
            )));
        }
        match only {
            None => {
                let all = acc.as_flattened_mut();
                self.stage
                    .download(&self.stream, &state.acc.slice(0..3 * n), all)
            }
            Some(rows) => {
                let DeviceState {
                    acc: from,
                    rows: index,
                    picked,
                    ..
                } = state;
                self.download_rows(from, rows, index, picked, acc)
            }
        }
    }

    /// Copies the velocities of the particles of `rows` of `state` into those rows of
    /// `vel` (gathered on the device: the particles about to leave a rank).
    pub fn velocities(
        &mut self,
        state: &mut DeviceState,
        rows: &[u32],
        vel: &mut [[f64; 3]],
    ) -> Result<(), GpuError> {
        let n = state.n;
        if vel.len() != n || rows.iter().any(|&i| i as usize >= n) {
            return Err(GpuError::Unsupported(format!(
                "velocities of {n} particles into {}, or of rows beyond them",
                vel.len()
            )));
        }
        let DeviceState {
            vel: from,
            rows: index,
            picked,
            ..
        } = state;
        self.download_rows(from, rows, index, picked, vel)
    }

    /// The 3-vectors of `rows` of a state's column `from` into those rows of `out`,
    /// gathered on the device (through the state's `index` and `picked` buffers).
    fn download_rows(
        &mut self,
        from: &CudaSlice<f64>,
        rows: &[u32],
        index: &mut Reused<u32>,
        picked: &mut Reused<f64>,
        out: &mut [[f64; 3]],
    ) -> Result<(), GpuError> {
        if rows.is_empty() {
            return Ok(());
        }
        let stream = self.stream.clone();
        index.room(&stream, rows.len())?;
        index.upload(&stream, rows)?;
        picked.room(&stream, 3 * rows.len())?;
        let (count, width) = (rows.len() as u32, 3u32);
        let mut launch = stream.launch_builder(&self.kernels.gather_rows);
        launch
            .arg(from)
            .arg(&index.buf)
            .arg(&count)
            .arg(&width)
            .arg(&mut picked.buf);
        // SAFETY: the arguments match gather_rows's signature; `picked` holds 3 values a
        // row and every row is a particle of the state (the callers check).
        unsafe { launch.launch(grid(3 * rows.len())) }?;
        let mut values = vec![0.0; 3 * rows.len()];
        let gathered = picked.buf.slice(0..3 * rows.len());
        self.stage.download(&stream, &gathered, &mut values)?;
        for (&i, v) in rows.iter().zip(values.chunks_exact(3)) {
            out[i as usize] = [v[0], v[1], v[2]];
        }
        Ok(())
    }

    /// Copies positions, velocities, accelerations and potentials of `state` into
    /// `particles` (masses and components do not change on the device).
    pub fn store_state(
        &self,
        state: &DeviceState,
        particles: &mut Particles,
    ) -> Result<(), GpuError> {
        let n = state.n;
        let rows = |buf: &CudaSlice<f64>| -> Result<Vec<[f64; 3]>, GpuError> {
            let flat = self.stream.clone_dtoh(&buf.slice(0..3 * n))?;
            Ok(flat.chunks_exact(3).map(|x| [x[0], x[1], x[2]]).collect())
        };
        particles.pos = rows(&state.pos)?;
        particles.vel = rows(&state.vel)?;
        particles.acc = rows(&state.acc)?;
        particles.pot = self.stream.clone_dtoh(&state.pot.slice(0..n))?;
        self.stream.synchronize()?;
        Ok(())
    }
}

/// The buffers, grown to fit `plan` (and `caps`), with the plan's tree and lists
/// uploaded (the tree's centres, columns and leaves copied from `cells_here` instead, when
/// `cell_moments` left the plan's tree there) and the expansions and forces zeroed;
/// positions, masses and each particle's leaf are the caller's.
fn upload_plan<'a>(
    stream: &Arc<CudaStream>,
    buffers: &'a mut Option<Buffers>,
    plan: &DevicePlan,
    caps: &Caps,
    cells_here: Option<&MomentsBuffers>,
) -> Result<&'a mut Buffers, GpuError> {
    let lengths = DeviceLengths::of(plan, caps);
    let (n, cells, len) = (plan.particles(), plan.centre.len(), lengths.expansion);
    let stream = stream.clone();
    let b = match buffers {
        Some(b) => {
            b.fit(&stream, &lengths)?;
            b
        }
        none => none.insert(Buffers::new(&stream, &lengths)?),
    };
    if plan.moments_on_device && cells_here.is_none() {
        return Err(GpuError::Unsupported(
            "a plan whose cell centres stayed on a device that does not hold them".into(),
        ));
    }
    match cells_here {
        // The plan's tree is the one `cell_moments` left on the device: its centres,
        // columns and leaves are copied there rather than sent again (~45 bytes a cell).
        Some(m) => {
            let leaves = plan.leaves.len();
            stream.memcpy_dtod(&m.centre.buf.slice(0..3 * cells), &mut b.centre.buf)?;
            stream.memcpy_dtod(&m.begin.buf.slice(0..cells), &mut b.begin.buf)?;
            stream.memcpy_dtod(&m.end.buf.slice(0..cells), &mut b.end.buf)?;
            stream.memcpy_dtod(&m.first_child.buf.slice(0..cells), &mut b.first_child.buf)?;
            stream.memcpy_dtod(&m.child_count.buf.slice(0..cells), &mut b.child_count.buf)?;
            stream.memcpy_dtod(&m.parent.buf.slice(0..cells), &mut b.parent.buf)?;
            stream.memcpy_dtod(&m.leaves.buf.slice(0..leaves), &mut b.leaves.buf)?;
        }
        None => {
            b.centre.upload(&stream, plan.centre.as_flattened())?;
            b.begin.upload(&stream, &plan.begin)?;
            b.end.upload(&stream, &plan.end)?;
            b.first_child.upload(&stream, &plan.first_child)?;
            b.child_count.upload(&stream, &plan.child_count)?;
            b.parent.upload(&stream, &plan.parent)?;
            b.leaves.upload(&stream, plan.leaves)?;
        }
    }
    b.m2l_spans.upload(&stream, plan.m2l_spans)?;
    b.m2l_sources.upload(&stream, plan.m2l_sources)?;
    b.p2p_spans.upload(&stream, plan.p2p_spans)?;
    b.p2p_sources.upload(&stream, plan.p2p_sources)?;
    let all: Vec<u32> = (0..cells as u32).collect();
    b.all.upload(&stream, &all)?;
    let (parents, parent_levels) = parents_by_level(plan);
    b.parents.upload(&stream, &parents)?;
    b.parent_levels = parent_levels;
    // Multipoles the host computed (a distributed evaluation's, which other ranks' cells
    // came with) go up; otherwise the upward pass fills them.
    match plan.multipoles {
        Some(m) if m.len() == cells * len => b.multipoles.upload(&stream, m)?,
        Some(m) => {
            return Err(GpuError::Unsupported(format!(
                "a plan of {cells} cells came with {} multipole values, not {}",
                m.len(),
                cells * len
            )));
        }
        None => b.multipoles.zero(&stream, cells * len)?,
    }
    b.locals.zero(&stream, cells * len)?;
    b.acc.zero(&stream, 3 * n)?;
    b.pot.zero(&stream, n)?;
    Ok(b)
}

/// The cells with children of every level, one level after the other, and each level's
/// (offset, count) in that list: the per-level launches of M2M.
fn parents_by_level(plan: &DevicePlan) -> (Vec<u32>, Vec<(usize, usize)>) {
    let levels = plan.level_start.len().saturating_sub(1);
    let mut parents = Vec::new();
    let mut by_level = Vec::with_capacity(levels);
    for l in 0..levels {
        let (lo, hi) = (plan.level_start[l], plan.level_start[l + 1]);
        let start = parents.len();
        parents.extend((lo..hi).filter(|&c| plan.child_count[c as usize] > 0));
        by_level.push((start, parents.len() - start));
    }
    (parents, by_level)
}

/// M2L, L2L per level, L2P and P2P on buffers `upload_plan` filled (positions and masses in
/// tree order included, and the multipoles: the plan's, or `upward_pass`'s), with the
/// lists of `walked` when given, for the softening and G of `force`; their seconds into
/// `secs`.
fn run_passes(
    k: &Kernels,
    stream: &Arc<CudaStream>,
    b: &mut Buffers,
    walked: Option<&WalkBuffers>,
    plan: &DevicePlan,
    force: (Softening, f64),
    secs: &mut DeviceSeconds,
) -> Result<(), GpuError> {
    let (softening, g) = force;
    // Forces for the own particles and cells; the received ones are sources only.
    let (n, cells) = (plan.own_particles, plan.own_cells);
    let p = plan.order as i32;
    let levels = plan.level_start.len().saturating_sub(1);
    let n_leaves = plan.leaves.len() as u32;
    // The lists: the device walk's, or those uploaded from the plan.
    let (m2l_spans, m2l_sources, p2p_spans, p2p_sources) = match walked {
        Some(w) => (
            &w.m2l_spans.buf,
            &w.m2l_sources.buf,
            &w.p2p_spans.buf,
            &w.p2p_sources.buf,
        ),
        None => (
            &b.m2l_spans.buf,
            &b.m2l_sources.buf,
            &b.p2p_spans.buf,
            &b.p2p_sources.buf,
        ),
    };

    let t = Instant::now();
    let cells32 = cells as u32;
    let (m2l, threads) = match plan.order {
        p if (1..=M2L_ROTATED_ORDER).contains(&p) && !k.m2l_direct => {
            (&k.m2l_rotated[p - 1], M2L_ROTATED_THREADS)
        }
        p if p <= M2L_SMALL_ORDER => (&k.m2l_small, M2L_THREADS),
        _ => (&k.m2l, M2L_THREADS),
    };
    let mut launch = stream.launch_builder(m2l);
    launch
        .arg(&b.all.buf)
        .arg(&cells32)
        .arg(m2l_spans)
        .arg(m2l_sources)
        .arg(&b.centre.buf);
    launch.arg(&b.multipoles.buf).arg(&p).arg(&mut b.locals.buf);
    // SAFETY: the arguments match m2l_cells's signature (m2l_cells_p8's and each
    // m2l_rotated_P's are the same) and the buffers' sizes; the order is at most the
    // kernel's largest (m2l_rotated_P's own); one block of the kernel's threads per target.
    let per_target = LaunchConfig {
        grid_dim: (cells32.max(1), 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    };
    unsafe { launch.launch(per_target) }?;
    stream.synchronize()?;
    secs.m2l = t.elapsed().as_secs_f64();

    let t = Instant::now();
    for l in 1..levels {
        let (lo, hi) = (plan.level_start[l], plan.level_start[l + 1]);
        let count = hi - lo;
        let level_cells = b.all.buf.slice(lo as usize..hi as usize);
        let mut launch = stream.launch_builder(&k.l2l);
        launch
            .arg(&level_cells)
            .arg(&count)
            .arg(&b.parent.buf)
            .arg(&b.centre.buf)
            .arg(&p);
        launch.arg(&mut b.locals.buf);
        // SAFETY: as above, for l2l_cells (one block of TRANSLATE_THREADS per cell).
        unsafe { launch.launch(per_cell(count as usize)) }?;
    }
    let n32 = n as u32;
    let mut launch = stream.launch_builder(&k.l2p);
    launch
        .arg(&b.pos.buf)
        .arg(&b.leaf_of.buf)
        .arg(&b.centre.buf)
        .arg(&b.locals.buf)
        .arg(&n32)
        .arg(&p)
        .arg(&g);
    launch.arg(&mut b.acc.buf).arg(&mut b.pot.buf);
    // SAFETY: as above, for l2p_particles.
    unsafe { launch.launch(grid(n)) }?;
    stream.synchronize()?;
    secs.downward = t.elapsed().as_secs_f64();

    let t = Instant::now();
    let kernel: i32 = match softening.kernel {
        SofteningKernel::Plummer => 0,
        SofteningKernel::Spline => 1,
    };
    let eps = softening.epsilon;
    let (eps2, h) = (
        (eps * eps) as f32,
        (SPLINE_SUPPORT_PER_EPSILON * eps) as f32,
    );
    // The central potential in f64, so that each particle's own pair is taken back out
    // exactly as on the CPU.
    let p0 = crate::gravity::pairwise::self_potential(1.0, eps);
    let mut launch = stream.launch_builder(&k.p2p);
    launch
        .arg(&b.pos.buf)
        .arg(&b.mass.buf)
        .arg(&b.begin.buf)
        .arg(&b.end.buf)
        .arg(&b.centre.buf)
        .arg(&b.leaves.buf);
    launch
        .arg(p2p_spans)
        .arg(p2p_sources)
        .arg(&kernel)
        .arg(&eps2)
        .arg(&h)
        .arg(&p0)
        .arg(&g);
    launch.arg(&mut b.acc.buf).arg(&mut b.pot.buf);
    let config = LaunchConfig {
        grid_dim: (n_leaves.max(1), 1, 1),
        block_dim: (P2P_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    if n_leaves > 0 {
        // SAFETY: as above, for p2p_leaves (one block per target leaf).
        unsafe { launch.launch(config) }?;
    }
    stream.synchronize()?;
    secs.p2p = t.elapsed().as_secs_f64();
    Ok(())
}

/// The positions and masses of the particles of `state` into the plan buffers, in the
/// tree order of `b.order_of` (its first `state.n` entries, a permutation of the state's
/// rows).
fn gather_tree_order(
    kernels: &Kernels,
    stream: &Arc<CudaStream>,
    state: &DeviceState,
    b: &mut Buffers,
) -> Result<(), GpuError> {
    let n32 = state.n as u32;
    let mut launch = stream.launch_builder(&kernels.gather);
    launch
        .arg(&state.pos)
        .arg(&state.mass)
        .arg(&b.order_of.buf)
        .arg(&n32)
        .arg(&mut b.pos.buf)
        .arg(&mut b.mass.buf);
    // SAFETY: the arguments match gather_tree_order's signature; the state and the order
    // hold n particles, the plan's buffers at least n.
    unsafe { launch.launch(grid(state.n)) }?;
    Ok(())
}

/// The forces of the plan buffers' first `state.n` particles (tree order) back into the
/// rows of `state` that `b.order_of` names.
fn scatter_forces(
    kernels: &Kernels,
    stream: &Arc<CudaStream>,
    b: &Buffers,
    state: &mut DeviceState,
) -> Result<(), GpuError> {
    let n32 = state.n as u32;
    let mut launch = stream.launch_builder(&kernels.scatter);
    launch
        .arg(&b.acc.buf)
        .arg(&b.pot.buf)
        .arg(&b.order_of.buf)
        .arg(&n32)
        .arg(&mut state.acc)
        .arg(&mut state.pot);
    // SAFETY: the arguments match scatter_forces's signature; as above.
    unsafe { launch.launch(grid(state.n)) }?;
    Ok(())
}

/// P2M at the leaves and M2M level by level towards the root, on the device.
fn upward_pass(
    k: &Kernels,
    stream: &Arc<CudaStream>,
    b: &mut Buffers,
    plan: &DevicePlan,
    secs: &mut DeviceSeconds,
) -> Result<(), GpuError> {
    let p = plan.order as i32;
    let n_leaves = plan.leaves.len() as u32;
    let t = Instant::now();
    let mut launch = stream.launch_builder(&k.p2m);
    launch
        .arg(&b.pos.buf)
        .arg(&b.mass.buf)
        .arg(&b.leaves.buf)
        .arg(&n_leaves)
        .arg(&b.begin.buf)
        .arg(&b.end.buf);
    launch.arg(&b.centre.buf).arg(&p).arg(&mut b.multipoles.buf);
    // SAFETY: the arguments match p2m_leaves's signature and the buffers' sizes; one block
    // of TRANSLATE_THREADS per leaf.
    unsafe { launch.launch(per_cell(plan.leaves.len())) }?;
    for &(start, count) in b.parent_levels.iter().rev() {
        if count == 0 {
            continue;
        }
        let count32 = count as u32;
        let level_parents = b.parents.buf.slice(start..start + count);
        let mut launch = stream.launch_builder(&k.m2m);
        launch
            .arg(&level_parents)
            .arg(&count32)
            .arg(&b.first_child.buf)
            .arg(&b.child_count.buf);
        launch.arg(&b.centre.buf).arg(&p).arg(&mut b.multipoles.buf);
        // SAFETY: as above, for m2m_cells (one block of TRANSLATE_THREADS per cell).
        unsafe { launch.launch(per_cell(count)) }?;
    }
    stream.synchronize()?;
    secs.upward = t.elapsed().as_secs_f64();
    Ok(())
}

/// Gathers the payload `routes` sends each rank from the plan in `b` (multipoles, and
/// positions and masses in tree order) into `scratch`, moves it through `link` (NCCL) or
/// else `comm`, and puts what arrives in its place in `b`.
fn move_payload(
    k: &Kernels,
    stream: &Arc<CudaStream>,
    b: &mut Buffers,
    scratch: &mut Option<PayloadBuffers>,
    link: Option<&NcclLink>,
    routes: &PayloadRoutes,
    comm: &dyn Communicator,
) -> Result<(), GpuError> {
    let len = routes.len;
    let rows: Vec<u32> = routes.send_cells.concat();
    let particles: Vec<u32> = routes.send_particles.concat();
    let (nr, np) = (rows.len(), particles.len());
    let s = match scratch {
        Some(s) => s,
        none => none.insert(PayloadBuffers {
            rows: Reused::new(stream, nr)?,
            particles: Reused::new(stream, np)?,
            multipoles: Reused::new(stream, nr * len)?,
            pos: Reused::new(stream, 3 * np)?,
            mass: Reused::new(stream, np)?,
        }),
    };
    s.rows.room(stream, nr)?;
    s.particles.room(stream, np)?;
    s.multipoles.room(stream, nr * len)?;
    s.pos.room(stream, 3 * np)?;
    s.mass.room(stream, np)?;
    s.rows.upload(stream, &rows)?;
    s.particles.upload(stream, &particles)?;
    let (nr32, np32, len32) = (nr as u32, np as u32, len as u32);
    if nr > 0 {
        let mut launch = stream.launch_builder(&k.gather_rows);
        launch
            .arg(&b.multipoles.buf)
            .arg(&s.rows.buf)
            .arg(&nr32)
            .arg(&len32)
            .arg(&mut s.multipoles.buf);
        // SAFETY: the arguments match gather_rows's signature; `s.multipoles` holds nr * len
        // values and every row is an own cell of the plan (`PayloadRoutes::check`).
        unsafe { launch.launch(grid(nr * len)) }?;
    }
    if np > 0 {
        let mut launch = stream.launch_builder(&k.gather);
        launch
            .arg(&b.pos.buf)
            .arg(&b.mass.buf)
            .arg(&s.particles.buf)
            .arg(&np32)
            .arg(&mut s.pos.buf)
            .arg(&mut s.mass.buf);
        // SAFETY: as above, for gather_tree_order: np indices of own particles.
        unsafe { launch.launch(grid(np)) }?;
    }
    let parts = routes.send_parts();
    match link {
        Some(link) => {
            let nccl = link.comm();
            let err = |e| GpuError::Driver(format!("NCCL: {e:?}"));
            cudarc::nccl::safe::group_start().map_err(err)?;
            for (j, (m, q)) in parts.into_iter().enumerate() {
                let peer = j as i32;
                if !m.is_empty() {
                    nccl.send(&s.multipoles.buf.slice(m), peer).map_err(err)?;
                }
                if !q.is_empty() {
                    let x = 3 * q.start..3 * q.end;
                    nccl.send(&s.pos.buf.slice(x), peer).map_err(err)?;
                    nccl.send(&s.mass.buf.slice(q), peer).map_err(err)?;
                }
                let (m, q) = routes.landing(j);
                if !m.is_empty() {
                    nccl.recv(&mut b.multipoles.buf.slice_mut(m), peer)
                        .map_err(err)?;
                }
                if !q.is_empty() {
                    let x = 3 * q.start..3 * q.end;
                    nccl.recv(&mut b.pos.buf.slice_mut(x), peer).map_err(err)?;
                    nccl.recv(&mut b.mass.buf.slice_mut(q), peer).map_err(err)?;
                }
            }
            cudarc::nccl::safe::group_end().map_err(err)?;
        }
        None => {
            let m = stream.clone_dtoh(&s.multipoles.buf.slice(0..nr * len))?;
            let x = stream.clone_dtoh(&s.pos.buf.slice(0..3 * np))?;
            let q = stream.clone_dtoh(&s.mass.buf.slice(0..np))?;
            let messages = (0..parts.len())
                .map(|j| bytemuck::cast_slice(&routes.message(j, &m, &x, &q)).to_vec())
                .collect();
            let received = comm
                .alltoall_bytes(messages)
                .map_err(|e| GpuError::Driver(format!("the LET payload did not arrive: {e}")))?;
            for (j, bytes) in received.iter().enumerate() {
                let values: Vec<f64> = bytemuck::pod_collect_to_vec(bytes);
                let part = routes.split(j, &values).map_err(GpuError::Unsupported)?;
                let (m, q) = routes.landing(j);
                if !m.is_empty() {
                    stream.memcpy_htod(part.multipoles, &mut b.multipoles.buf.slice_mut(m))?;
                }
                if !q.is_empty() {
                    let x = 3 * q.start..3 * q.end;
                    stream.memcpy_htod(part.pos, &mut b.pos.buf.slice_mut(x))?;
                    stream.memcpy_htod(part.mass, &mut b.mass.buf.slice_mut(q))?;
                }
            }
        }
    }
    Ok(())
}

impl DevicePasses for GpuFmm {
    fn run_passes(
        &mut self,
        plan: &DevicePlan,
        caps: &Caps,
        softening: Softening,
        g: f64,
    ) -> Result<DeviceForces, GravityError> {
        self.evaluate(plan, caps, softening, g)
            .map_err(|e| GravityError::Device(e.to_string()))
    }

    fn moves_payload(&self) -> bool {
        true
    }

    fn run_passes_with_payload(
        &mut self,
        plan: &DevicePlan,
        caps: &Caps,
        force: (Softening, f64),
        routes: &PayloadRoutes,
        comm: &dyn Communicator,
    ) -> Result<DeviceForces, GravityError> {
        self.evaluate_moving(plan, caps, force, Some((routes, comm)), None)
            .map_err(|e| GravityError::Device(e.to_string()))
    }
}
