//! Buffer capacities ("caps", design §5): every list the traversal writes has a capacity;
//! a buffer that would overflow counts what it needed instead of storing, the evaluation is
//! retried with only the overflowed caps grown, and the caps that worked are carried to the
//! next evaluation with headroom.

use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

/// The capped buffers of one force evaluation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CapKind {
    /// Octree cells.
    Cells,
    /// Directed M2L (cell ← cell) pairs.
    M2lPairs,
    /// Directed P2P (leaf ← leaf) pairs.
    P2pPairs,
    /// Cells received in locally essential trees (distributed runs).
    LetCells,
    /// Particles received in locally essential trees.
    LetParticles,
}

impl CapKind {
    /// Every kind, in report order.
    pub const ALL: [CapKind; 5] = [
        CapKind::Cells,
        CapKind::M2lPairs,
        CapKind::P2pPairs,
        CapKind::LetCells,
        CapKind::LetParticles,
    ];

    /// Name used in diagnostics and presets.
    pub fn name(self) -> &'static str {
        match self {
            CapKind::Cells => "cells",
            CapKind::M2lPairs => "m2l_pairs",
            CapKind::P2pPairs => "p2p_pairs",
            CapKind::LetCells => "let_cells",
            CapKind::LetParticles => "let_particles",
        }
    }
}

/// One capacity per buffer kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Caps {
    /// Octree cells.
    pub cells: usize,
    /// M2L pairs.
    pub m2l_pairs: usize,
    /// P2P pairs.
    pub p2p_pairs: usize,
    /// LET cells received.
    #[serde(default)]
    pub let_cells: usize,
    /// LET particles received.
    #[serde(default)]
    pub let_particles: usize,
}

impl Caps {
    /// A first guess for `n` particles when no preset is known (typical use per cell at the
    /// default settings); a wrong guess only costs retries.
    pub fn guess(n: usize, leaf_size: usize) -> Self {
        let cells = 4 * n.div_ceil(leaf_size.max(1)) + 64;
        Caps {
            cells,
            m2l_pairs: 128 * cells,
            p2p_pairs: 64 * cells,
            let_cells: cells,
            let_particles: n / 4 + 64,
        }
    }

    /// The capacity of one kind.
    pub fn get(&self, kind: CapKind) -> usize {
        match kind {
            CapKind::Cells => self.cells,
            CapKind::M2lPairs => self.m2l_pairs,
            CapKind::P2pPairs => self.p2p_pairs,
            CapKind::LetCells => self.let_cells,
            CapKind::LetParticles => self.let_particles,
        }
    }

    /// Sets the capacity of one kind.
    pub fn set(&mut self, kind: CapKind, value: usize) {
        match kind {
            CapKind::Cells => self.cells = value,
            CapKind::M2lPairs => self.m2l_pairs = value,
            CapKind::P2pPairs => self.p2p_pairs = value,
            CapKind::LetCells => self.let_cells = value,
            CapKind::LetParticles => self.let_particles = value,
        }
    }

    /// Every cap multiplied by `factor` (rounded up).
    pub fn scaled(&self, factor: f64) -> Self {
        let s = |v: usize| ((v as f64 * factor).ceil() as usize).max(1);
        Caps {
            cells: s(self.cells),
            m2l_pairs: s(self.m2l_pairs),
            p2p_pairs: s(self.p2p_pairs),
            let_cells: s(self.let_cells),
            let_particles: s(self.let_particles),
        }
    }
}

/// How caps adapt between evaluations.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CapsPolicy {
    /// Factor an overflowed cap grows by (repeatedly, until it fits).
    pub growth: f64,
    /// Spare fraction kept above the use of the last evaluation.
    pub headroom: f64,
    /// Consecutive evaluations using under a quarter of a cap before it shrinks.
    pub shrink_after: u32,
}

impl Default for CapsPolicy {
    fn default() -> Self {
        CapsPolicy {
            growth: 2.0,
            headroom: 0.25,
            shrink_after: 8,
        }
    }
}

/// Caps, their adaptation state, and the retry rule.
#[derive(Debug, Clone)]
pub struct CapsTracker {
    caps: Caps,
    policy: CapsPolicy,
    low_use: [u32; 5],
}

impl CapsTracker {
    /// Starts from `caps`.
    pub fn new(caps: Caps, policy: CapsPolicy) -> Self {
        CapsTracker {
            caps,
            policy,
            low_use: [0; 5],
        }
    }

    /// The current caps.
    pub fn caps(&self) -> Caps {
        self.caps
    }

    /// Replaces the caps (e.g. from a checkpoint).
    pub fn set_caps(&mut self, caps: Caps) {
        self.caps = caps;
        self.low_use = [0; 5];
    }

    /// Raises every cap to at least `floor` (ranks share their largest caps so that none of
    /// them meets, later, a size another has already seen). Returns true when any cap rose.
    pub fn raise_to(&mut self, floor: &Caps) -> bool {
        let mut raised = false;
        for (k, kind) in CapKind::ALL.into_iter().enumerate() {
            if floor.get(kind) > self.caps.get(kind) {
                self.caps.set(kind, floor.get(kind));
                self.low_use[k] = 0;
                raised = true;
            }
        }
        raised
    }

    /// After an overflow of `kind` that needed `needed` entries: grows that cap by the growth
    /// factor until it fits. Other caps are untouched.
    pub fn grow(&mut self, kind: CapKind, needed: usize) {
        let mut cap = self.caps.get(kind).max(1) as f64;
        while (cap as usize) < needed {
            cap *= self.policy.growth.max(1.01);
        }
        self.caps.set(kind, cap.ceil() as usize);
        self.low_use[kind as usize] = 0;
    }

    /// After a successful evaluation that used `used` of each cap: keeps headroom above the
    /// use, and shrinks a cap only after several evaluations of low use. Returns true when
    /// any cap changed.
    pub fn settle(&mut self, used: &Caps) -> bool {
        let before = self.caps;
        for (k, kind) in CapKind::ALL.into_iter().enumerate() {
            let (u, cap) = (used.get(kind), self.caps.get(kind));
            let wanted = ((u as f64) * (1.0 + self.policy.headroom)).ceil() as usize;
            if wanted > cap {
                self.caps.set(kind, wanted);
                self.low_use[k] = 0;
            } else if u * 4 < cap {
                self.low_use[k] += 1;
                if self.low_use[k] >= self.policy.shrink_after {
                    self.caps.set(kind, wanted.max(1));
                    self.low_use[k] = 0;
                }
            } else {
                self.low_use[k] = 0;
            }
        }
        self.caps != before
    }
}

/// An append-only buffer of u32 entries (cell indices) with a fixed capacity that many threads push into.
/// Pushes beyond the capacity are counted but not stored, so the caller learns both that
/// it overflowed and how much room it would have needed.
#[derive(Debug, Default)]
pub struct CappedBuffer {
    slots: Vec<AtomicU32>,
    cursor: AtomicUsize,
}

impl CappedBuffer {
    /// Resizes to `capacity` (reallocating only when it grows beyond the allocation) and
    /// empties the buffer.
    pub fn reset(&mut self, capacity: usize) {
        if self.slots.len() != capacity {
            let mut v: Vec<u32> = std::mem::take(&mut self.slots)
                .into_iter()
                .map(AtomicU32::into_inner)
                .collect();
            v.clear();
            v.resize(capacity, 0);
            v.shrink_to(capacity);
            self.slots = v.into_iter().map(AtomicU32::new).collect();
        }
        self.cursor.store(0, Ordering::Relaxed);
    }

    /// Appends entries (or only counts those that do not fit) with one atomic reservation;
    /// returns the index of the first.
    pub fn push_all(&self, values: &[u32]) -> usize {
        let start = self.cursor.fetch_add(values.len(), Ordering::Relaxed);
        let end = (start + values.len()).min(self.slots.len());
        if start < end {
            for (slot, &v) in self.slots[start..end].iter().zip(values) {
                slot.store(v, Ordering::Relaxed);
            }
        }
        start
    }

    /// Entries pushed, stored or not.
    pub fn needed(&self) -> usize {
        self.cursor.load(Ordering::Relaxed)
    }

    /// True when some push did not fit.
    pub fn overflowed(&self) -> bool {
        self.needed() > self.slots.len()
    }

    /// Hands out the stored entries as a plain vector, reusing the buffer's memory (the
    /// buffer is left empty until `give_back`).
    pub fn take(&mut self) -> Vec<u32> {
        let n = self.needed().min(self.slots.len());
        let mut v: Vec<u32> = std::mem::take(&mut self.slots)
            .into_iter()
            .map(AtomicU32::into_inner)
            .collect();
        v.truncate(n);
        v
    }

    /// Returns a vector from `take` to serve as the storage of the next `reset`.
    pub fn give_back(&mut self, mut v: Vec<u32>) {
        let capacity = v.capacity();
        v.clear();
        // Hundreds of MB at 1e7 particles: filled in parallel (a serial fill was a fixed
        // ~0.02 s of every evaluation, whatever the number of cores).
        v.par_extend(rayon::iter::repeat_n(0, capacity));
        self.slots = v.into_iter().map(AtomicU32::new).collect();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffer_counts_overflow() {
        let mut b = CappedBuffer::default();
        b.reset(3);
        assert_eq!(b.push_all(&[0, 1]), 0);
        assert_eq!(b.push_all(&[2, 3, 4]), 2);
        assert!(b.overflowed());
        assert_eq!(b.needed(), 5);
        let out = b.take();
        assert_eq!(out, vec![0, 1, 2]);
        b.give_back(out);
        b.reset(3);
        b.push_all(&[7]);
        assert_eq!(b.take(), vec![7]);
    }

    #[test]
    fn growth_only_touches_the_overflowed_cap() {
        let caps = Caps {
            cells: 10,
            m2l_pairs: 100,
            p2p_pairs: 50,
            ..Caps::default()
        };
        let mut t = CapsTracker::new(caps, CapsPolicy::default());
        t.grow(CapKind::M2lPairs, 350);
        assert_eq!(t.caps().m2l_pairs, 400);
        assert_eq!(t.caps().cells, 10);
        assert_eq!(t.caps().p2p_pairs, 50);
    }

    #[test]
    fn settle_keeps_headroom_and_shrinks_slowly() {
        let caps = Caps {
            cells: 100,
            m2l_pairs: 100,
            p2p_pairs: 100,
            ..Caps::default()
        };
        let mut t = CapsTracker::new(caps, CapsPolicy::default());
        let used = Caps {
            cells: 90,
            m2l_pairs: 50,
            p2p_pairs: 10,
            ..Caps::default()
        };
        assert!(t.settle(&used));
        assert_eq!(t.caps().cells, 113); // 90 * 1.25 rounded up
        assert_eq!(t.caps().m2l_pairs, 100);
        for _ in 0..6 {
            assert!(!t.settle(&used));
        }
        assert_eq!(t.caps().p2p_pairs, 100);
        assert!(t.settle(&used)); // 8th low-use evaluation
        assert_eq!(t.caps().p2p_pairs, 13);
    }
}
