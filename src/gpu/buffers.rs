//! The device memory a `GpuFmm` keeps between evaluations, one set per concern: `Reused`
//! (a buffer grown when a count needs more, never shrunk), the page-locked `HostStage`
//! downloads go through, the passes' `Buffers` (sized by `memory::DeviceLengths`), the
//! sort's, the moments', the walk's and the LET payload's. Allocation and growth only; what
//! the kernels do with them is in `tree`, `traversal`, `passes` and `payload`.

use super::error::GpuError;
use super::memory::DeviceLengths;
use super::sort::{
    BOUNDS_BLOCKS, BOUNDS_FIELDS, LEVEL_SLOTS, RADIX_THREADS, SCAN_VALUES, sort_blocks,
};
use crate::fmm::backend::DevicePlan;
use crate::fmm::caps::Caps;
use crate::fmm::tree::MOMENT_VALUES;
use cudarc::driver::{
    CudaSlice, CudaStream, CudaView, DeviceRepr, PinnedHostSlice, ValidAsZeroBits,
};
use std::sync::Arc;
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

/// The device buffers of the force evaluations, in `DeviceLengths`' order.
pub(super) struct Buffers {
    pub(super) pos: Reused<f64>,
    pub(super) mass: Reused<f64>,
    pub(super) acc: Reused<f64>,
    pub(super) pot: Reused<f64>,
    pub(super) centre: Reused<f64>,
    pub(super) multipoles: Reused<f64>,
    pub(super) locals: Reused<f64>,
    pub(super) leaf_of: Reused<u32>,
    pub(super) order_of: Reused<u32>,
    pub(super) begin: Reused<u32>,
    pub(super) end: Reused<u32>,
    pub(super) first_child: Reused<u32>,
    pub(super) child_count: Reused<u32>,
    pub(super) parent: Reused<u32>,
    pub(super) all: Reused<u32>,
    pub(super) parents: Reused<u32>,
    pub(super) m2l_sources: Reused<u32>,
    pub(super) leaves: Reused<u32>,
    pub(super) p2p_sources: Reused<u32>,
    pub(super) m2l_spans: Reused<u64>,
    pub(super) p2p_spans: Reused<u64>,
    /// Host side: where each level's cells with children start in `parents`, and how many
    /// (the per-level M2M launches of the last uploaded plan).
    pub(super) parent_levels: Vec<(usize, usize)>,
}

impl Buffers {
    pub(super) fn new(stream: &Arc<CudaStream>, lengths: &DeviceLengths) -> Result<Self, GpuError> {
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
    pub(super) fn fit(
        &mut self,
        stream: &Arc<CudaStream>,
        lengths: &DeviceLengths,
    ) -> Result<(), GpuError> {
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

/// The device buffers of the sort into tree order (`GpuFmm::sort_resident`;
/// `super::sort::sort_bytes` counts them), grown with the particles.
pub(super) struct SortBuffers {
    pub(super) bounds: CudaSlice<f64>,
    pub(super) keys: [Reused<u64>; 2],
    pub(super) index: [Reused<u32>; 2],
    pub(super) counts: Reused<u32>,
    pub(super) pos: Reused<f64>,
    pub(super) mass: Reused<f64>,
    /// `sort_scan`'s sums for the checks.
    pub(super) scan: Reused<u64>,
    /// Runs of equal keys too long for `order_equal_runs`.
    pub(super) long_runs: Reused<u32>,
}

impl SortBuffers {
    /// Buffers for `n` particles.
    pub(super) fn new(stream: &Arc<CudaStream>, n: usize) -> Result<Self, GpuError> {
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
    pub(super) fn fit(&mut self, stream: &Arc<CudaStream>, n: usize) -> Result<(), GpuError> {
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
pub(super) struct MomentsBuffers {
    pub(super) begin: Reused<u32>,
    pub(super) end: Reused<u32>,
    pub(super) first_child: Reused<u32>,
    pub(super) child_count: Reused<u32>,
    pub(super) parent: Reused<u32>,
    pub(super) leaves: Reused<u32>,
    pub(super) level_start: Reused<u32>,
    pub(super) leaf_of: Reused<u32>,
    pub(super) mass: Reused<f64>,
    pub(super) centre: Reused<f64>,
    pub(super) r2: Reused<u64>,
    pub(super) out: Reused<f64>,
    /// Per cell of a level, its children, then their prefix sums (`split_cells`).
    pub(super) split_counts: Reused<u32>,
    /// A block sub-step's active rows, their marks (a byte per particle) and the flags of
    /// the cells holding them (a byte per cell: `GpuFmm::cells_holding`).
    pub(super) rows: Reused<u32>,
    pub(super) marked: Reused<u8>,
    pub(super) flags: Reused<u8>,
}

impl MomentsBuffers {
    /// Buffers for `cells` cells over `n` particles.
    pub(super) fn new(stream: &Arc<CudaStream>, n: usize, cells: usize) -> Result<Self, GpuError> {
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
    pub(super) fn cell_columns(&mut self) -> [&mut Reused<u32>; 5] {
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
    pub(super) fn holds(&self, plan: &DevicePlan) -> bool {
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
    pub(super) fn fit(
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

/// The device buffers of the walk (`GpuFmm::walk`; `super::sort::walk_bytes` and
/// `WALK_RING_BYTES` count those besides the lists and the handed sources): its M2L and P2P
/// lists, which the passes then read, and its working arrays.
pub(super) struct WalkBuffers {
    pub(super) m2l_sources: Reused<u32>,
    pub(super) m2l_spans: Reused<u64>,
    pub(super) p2p_sources: Reused<u32>,
    pub(super) p2p_spans: Reused<u64>,
    /// Sources deferred by one level and handed to the next, and where each cell's are:
    /// level l writes side l % 2 and reads the other.
    pub(super) deferred: [Reused<u32>; 2],
    pub(super) deferred_spans: [Reused<u64>; 2],
    pub(super) counts: Reused<u32>,
    /// A level's three list totals, gathered from `counts` for one download.
    pub(super) totals: Reused<u32>,
    pub(super) pairs: Reused<u64>,
    pub(super) ring: Reused<u32>,
    /// The entries a level's counting pass keeps, `WALK_CACHE` per target, and how many
    /// each target kept (walk.cu: `WALK_UNCACHED` when they did not fit).
    pub(super) cache: Reused<u32>,
    pub(super) cache_len: Reused<u32>,
    /// The targets whose short rings filled up (launched again with long rings), and those
    /// whose long rings did too; how many of each.
    pub(super) retry: [Reused<u32>; 2],
    pub(super) retry_count: [Reused<u32>; 2],
    /// The cells a walk for some targets only walks for (a block sub-step's), level by
    /// level.
    pub(super) targets: Reused<u32>,
    pub(super) problems: Reused<u32>,
}

impl WalkBuffers {
    /// Buffers for a tree of `cells` cells, with room for the lists `caps` expects.
    pub(super) fn new(
        stream: &Arc<CudaStream>,
        cells: usize,
        caps: &Caps,
    ) -> Result<Self, GpuError> {
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

/// The gathered LET payload this rank's device sends (`PayloadRoutes`): every rank's part,
/// one after the other.
pub(super) struct PayloadBuffers {
    pub(super) rows: Reused<u32>,
    pub(super) particles: Reused<u32>,
    pub(super) multipoles: Reused<f64>,
    pub(super) pos: Reused<f64>,
    pub(super) mass: Reused<f64>,
}
