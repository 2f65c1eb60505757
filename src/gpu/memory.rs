//! What one GPU holds in device memory (design §7): the element count of every buffer of the
//! force evaluations for a plan, each at least the size the caps give it, so that the
//! buffers of a run's first evaluation serve the later ones (`GpuFmm` keeps them),
//! and of the particle state that stays on the device between steps
//! (`state::DeviceState`). One list for the allocation and for the bytes per particle a
//! GPU needs (issue target: ≤ 1 KB, so that 1e8 particles fit on an H200), which needs no
//! GPU to compute.

use crate::fmm::backend::DevicePlan;
use crate::fmm::caps::Caps;
use crate::integrate::diagnostics::CONSERVED_SUMS;

/// Number of f64 buffers (`DeviceLengths::f64_counts`).
pub const F64_BUFFERS: usize = 7;
/// Number of u32 buffers (`DeviceLengths::u32_counts`).
pub const U32_BUFFERS: usize = 12;
/// Number of u64 buffers (`DeviceLengths::u64_counts`).
pub const U64_BUFFERS: usize = 2;
/// Number of f64 buffers of the resident state (`resident_f64_counts`).
pub const RESIDENT_BUFFERS: usize = 7;

/// Threads per block of the per-item kernels (and of `max_acceleration_blocks`, a power of
/// two ≤ MAX_ACC_BLOCK in integrate.cu).
pub const THREADS_PER_BLOCK: u32 = 128;

/// Threads of a P2P block, one block per target leaf (a power of two ≤ P2P_MAX_BLOCK in
/// p2p.cu): one warp, split into groups by the leaf's size so that the lanes of a leaf of a
/// few particles are busy too (p2p.cu: `p2p_shape`).
pub const P2P_THREADS: u32 = 32;

/// Threads of a P2M, M2M or L2L block, one block per cell (`TRANSLATE_THREADS` in
/// expansions.cu).
pub const TRANSLATE_THREADS: u32 = 32;

/// Threads of an M2L block, one block per target cell (`M2L_THREADS` in expansions.cu).
pub const M2L_THREADS: u32 = 32;
/// Largest expansion order of the M2L kernel with less shared memory, `m2l_cells_p8`
/// (`M2L_SMALL_ORDER` in expansions.cu).
pub const M2L_SMALL_ORDER: usize = 8;
/// Largest expansion order of the rotation-based M2L kernel, `m2l_rotated`
/// (`M2L_ROTATED_ORDER` in m2l_rotated.cu; kernels/rotations.cuh holds its matrices).
pub const M2L_ROTATED_ORDER: usize = 8;
/// Threads of an `m2l_rotated` block, one block per target cell (`M2L_ROTATED_THREADS`).
pub const M2L_ROTATED_THREADS: u32 = 32;

/// Element counts of the resident state of `particles` particles, in the order
/// `DeviceState` keeps them: positions, velocities, masses, accelerations, potentials (the
/// run's particle order), 4 per-component maxima of |a|² per block of the criterion's
/// reduction, and the conserved sums per chunk of the diagnostics (`crate::sum::CHUNK`).
/// Besides these, one component byte per particle.
pub fn resident_f64_counts(particles: usize) -> [usize; RESIDENT_BUFFERS] {
    let n = particles;
    [
        3 * n,
        3 * n,
        n,
        3 * n,
        n,
        4 * n.div_ceil(THREADS_PER_BLOCK as usize).max(1),
        CONSERVED_SUMS * n.div_ceil(crate::sum::CHUNK).max(1),
    ]
}

/// Bytes of device memory the resident state of `particles` particles takes (its f64
/// buffers, a component byte and an id each, and for block steps a step each and at most
/// an index and an acceleration each, gathered for the host: made only for block steps, so
/// the figure is a bound), with the buffers of its sort into tree order
/// (`super::sort::sort_bytes`), which are made with 1/`SPARE_ROOM` room to spare.
pub fn resident_bytes(particles: usize) -> usize {
    8 * resident_f64_counts(particles).iter().sum::<usize>()
        + (1 + 8 + 8 + 4 + 24) * particles
        + super::sort::sort_bytes(with_spare_room(particles))
}

/// `particles` and the room to spare the sort's and the moments' buffers are made with
/// (a rank's count moves a little with each migration).
pub fn with_spare_room(particles: usize) -> usize {
    particles + particles.div_ceil(super::buffers::SPARE_ROOM)
}

/// The sizes the device buffers of one evaluation need: particles, cells (at least the
/// caps' cells), M2L and P2P list entries (at least the caps' pairs) and values
/// per expansion.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceLengths {
    /// Particles.
    pub particles: usize,
    /// Cells.
    pub cells: usize,
    /// M2L list entries (one per directed pair).
    pub m2l: usize,
    /// P2P list entries (one per directed leaf pair).
    pub p2p: usize,
    /// f64 values of one expansion.
    pub expansion: usize,
}

impl DeviceLengths {
    /// The sizes for `plan`, each list and the cells at least as large as `caps` say (the
    /// host's tree and walk never exceed them, so buffers of this size serve every
    /// evaluation until the caps grow). Lists walked on the device
    /// (`DevicePlan::device_lists`) live in the walk's buffers, not these.
    pub fn of(plan: &DevicePlan, caps: &Caps) -> Self {
        let cells = plan.centre.len().max(caps.cells);
        let list = |len: usize, cap: usize| {
            if plan.device_lists.is_some() {
                0
            } else {
                len.max(cap)
            }
        };
        DeviceLengths {
            particles: plan.particles(),
            cells,
            m2l: list(plan.m2l_sources.len(), caps.m2l_pairs),
            p2p: list(plan.p2p_sources.len(), caps.p2p_pairs),
            expansion: (plan.order + 1) * (plan.order + 2),
        }
    }

    /// Element counts of the f64 buffers, in the order `GpuFmm` keeps them: positions,
    /// masses, accelerations, potentials (per particle), centres, multipoles, local
    /// expansions (per cell).
    pub fn f64_counts(&self) -> [usize; F64_BUFFERS] {
        let (n, c) = (self.particles, self.cells);
        [
            3 * n,
            n,
            3 * n,
            n,
            3 * c,
            c * self.expansion,
            c * self.expansion,
        ]
    }

    /// Element counts of the u32 buffers, in the order `GpuFmm` keeps them: the leaf of
    /// each particle and its index in the run's order; per cell its particle range, first
    /// child, child count, parent, its own index (the per-level launches' cell lists), the
    /// parents by level; the M2L sources; the leaves (as many slots as cells: a leaf is a
    /// cell, and the leaf count changes from step to step while the cells' cap does not);
    /// the P2P sources.
    pub fn u32_counts(&self) -> [usize; U32_BUFFERS] {
        let c = self.cells;
        [
            self.particles,
            self.particles,
            c,
            c,
            c,
            c,
            c,
            c,
            c,
            self.m2l,
            c,
            self.p2p,
        ]
    }

    /// Element counts of the u64 buffers: per cell, where its M2L sources and its P2P
    /// sources are (`DevicePlan::m2l_spans`, `p2p_spans`).
    pub fn u64_counts(&self) -> [usize; U64_BUFFERS] {
        [self.cells, self.cells]
    }

    /// Bytes of device memory the buffers take.
    pub fn bytes(&self) -> usize {
        8 * self.f64_counts().iter().sum::<usize>()
            + 4 * self.u32_counts().iter().sum::<usize>()
            + 8 * self.u64_counts().iter().sum::<usize>()
    }

    /// Bytes of device memory per particle of a run: the evaluation's buffers, the
    /// resident state, and the cell moments and walk found on the device (its lists counted
    /// once, here in the evaluation's; the walk's fixed 1 GiB of rings and the sources it
    /// hands from level to level left out).
    pub fn bytes_per_particle(&self) -> f64 {
        let moments = super::sort::moments_bytes(with_spare_room(self.particles), self.cells);
        let walk = super::sort::walk_bytes(self.cells);
        (self.bytes() + resident_bytes(self.particles) + moments + walk) as f64
            / self.particles.max(1) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_add_up_to_the_bytes() {
        let l = DeviceLengths {
            particles: 10,
            cells: 3,
            m2l: 4,
            p2p: 5,
            expansion: 6,
        };
        // f64: 30 + 10 + 30 + 10 + 9 + 18 + 18 = 125; u32: 2 * 10 + 7 * 3 + 4 + 3 + 5 = 53;
        // u64: 3 + 3.
        assert_eq!(l.bytes(), 8 * 125 + 4 * 53 + 8 * 6);
        // Resident: 30 + 30 + 10 + 30 + 10 + 4 + 12 f64, 10 component bytes, 10 ids, and 10
        // block-scheme steps and gathered indices and accelerations; the
        // sort, for 10 particles and 2 to spare: 2 * (8 + 4) * 12 + 32 * 12 bytes for the
        // particles, 256 counts of one block, 1024 blocks' 7 extremes, the 5 sums of the
        // checks and a count of long runs.
        let sort = 2 * 12 * 12 + 32 * 12 + 4 * 256 + 8 * 7 * 1024 + 8 * 5 + 4;
        assert_eq!(
            resident_bytes(10),
            8 * 126 + 10 + 8 * 10 + 8 * 10 + 28 * 10 + sort
        );
        // Moments: a leaf index, an active row and mark per particle (and 2 to spare), 7 u32, a flag and 10
        // f64 per cell, 32 level slots;
        // the walk: 3 u64 and 6 u32 (3 counts, 2 slots of the lists of targets launched
        // again, 1 of the targets of a sub-step) per cell, and its kept entries with their number.
        let moments = 9 * 12 + (7 * 4 + 1 + 10 * 8) * 3 + 4 * 32;
        let walk = (3 * 8 + 6 * 4 + 4 * super::super::sort::WALK_CACHE + 4) * 3;
        assert_eq!(
            l.bytes_per_particle(),
            (8 * 125 + 4 * 53 + 8 * 6 + 8 * 126 + 10 + 80 + 80 + 280 + sort + moments + walk)
                as f64
                / 10.0
        );
    }
}
