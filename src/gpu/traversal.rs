//! The dual-tree walk on the device (the GPU side of `fmm::traversal`): the M2L and P2P
//! lists are built there and stay for the passes (`walk`), with a download for checks
//! (`walked_lists`).

use super::buffers::{Reused, WalkBuffers};
use super::context::{GpuFmm, grid};
use super::error::GpuError;
use super::sort::{
    OFFSETS_THREADS, WALK_CACHE, WALK_CHUNK, WALK_QUEUE, WALK_RETRY_CHUNK, WALK_RING_BYTES,
    WALK_SHORT_QUEUE,
};
use crate::fmm::backend::DeviceLists;
use crate::fmm::caps::Caps;
use crate::fmm::traversal::Mac;
use crate::fmm::tree::Tree;
use cudarc::driver::{LaunchConfig, PushKernelArg};

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

impl GpuFmm {
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
}
