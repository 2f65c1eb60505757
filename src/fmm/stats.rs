//! What an FMM evaluation reports: wall seconds per phase and the buffers' use
//! (`FmmStats`), as the diagnostics columns of a run (`fmm_*` in diagnostics.csv).

use super::backend::DeviceSeconds;
use super::caps::Caps;
use crate::gravity::SolverStat;

/// Wall seconds per phase of one evaluation (retries included in tree and traversal).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PhaseSeconds {
    /// Sort and cell construction.
    pub tree: f64,
    /// Moments, P2M and M2M.
    pub upward: f64,
    /// Dual-tree walk (the lists).
    pub traversal: f64,
    /// M2L.
    pub m2l: f64,
    /// L2L and L2P.
    pub downward: f64,
    /// P2P.
    pub p2p: f64,
    /// Locally essential tree exchange (distributed runs).
    pub exchange: f64,
}

/// What one evaluation did.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FmmStats {
    /// Retries caused by overflowed caps.
    pub retries: usize,
    /// Overflows per buffer kind (`CapKind` order).
    pub overflows: [usize; 5],
    /// Caps in force for the successful attempt.
    pub caps: Caps,
    /// What the successful attempt used of each cap.
    pub used: Caps,
    /// Phase timings.
    pub seconds: PhaseSeconds,
    /// Particle–particle interactions in the near field.
    pub p2p_interactions: u64,
    /// Cells in the tree.
    pub cells: usize,
    /// Cells received from other ranks.
    pub remote_cells: usize,
    /// M2L pairs whose source came from another rank.
    pub remote_m2l: usize,
}

/// Diagnostics columns of an FMM evaluation: (name, summed between rows).
const STAT_COLUMNS: [(&str, bool); 12] = [
    ("fmm_retries", true),
    ("fmm_cells", false),
    ("fmm_m2l_pairs", false),
    ("fmm_p2p_pairs", false),
    ("fmm_cap_m2l_pairs", false),
    ("fmm_cap_p2p_pairs", false),
    ("fmm_tree_s", true),
    ("fmm_upward_s", true),
    ("fmm_traversal_s", true),
    ("fmm_m2l_s", true),
    ("fmm_downward_s", true),
    ("fmm_p2p_s", true),
];

impl FmmStats {
    /// Adds the seconds of passes run on a device to the host's phases (copies count with
    /// the pass they feed).
    pub fn add_device_seconds(&mut self, device: &DeviceSeconds) {
        self.seconds.upward += device.upload + device.upward;
        self.seconds.m2l += device.m2l;
        self.seconds.downward += device.downward;
        self.seconds.p2p += device.p2p + device.download;
    }

    /// Adds a first pass's retries, interactions and seconds (an evaluation that needed
    /// one to know the accelerations to expect, `FmmSolver::evaluate_twice`).
    pub fn add_first_pass(&mut self, first: &FmmStats) {
        self.retries += first.retries;
        for (o, f) in self.overflows.iter_mut().zip(first.overflows) {
            *o += f;
        }
        self.p2p_interactions += first.p2p_interactions;
        let (s, f) = (&mut self.seconds, &first.seconds);
        s.tree += f.tree;
        s.upward += f.upward;
        s.traversal += f.traversal;
        s.m2l += f.m2l;
        s.downward += f.downward;
        s.p2p += f.p2p;
        s.exchange += f.exchange;
    }

    /// Names of the diagnostics columns of `solver_stats`.
    pub fn stat_names() -> Vec<&'static str> {
        STAT_COLUMNS.iter().map(|c| c.0).collect()
    }

    /// The figures as diagnostics columns.
    pub fn solver_stats(&self) -> Vec<SolverStat> {
        SolverStat::columns(&STAT_COLUMNS, &self.values())
    }

    /// The figures in `STAT_COLUMNS` order.
    fn values(&self) -> [f64; 12] {
        let s = &self.seconds;
        [
            self.retries as f64,
            self.cells as f64,
            self.used.m2l_pairs as f64,
            self.used.p2p_pairs as f64,
            self.caps.m2l_pairs as f64,
            self.caps.p2p_pairs as f64,
            s.tree,
            s.upward,
            s.traversal,
            s.m2l,
            s.downward,
            s.p2p,
        ]
    }
}
