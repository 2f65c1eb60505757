//! What a distributed evaluation reports per rank (`RankStats`: particles, migration, work,
//! imbalance, LET traffic, seconds) as diagnostics columns, and the figures gathered from
//! every rank (`RankFigures`).

use crate::fmm::FmmStats;
use crate::gravity::SolverStat;
use bytemuck::{Pod, Zeroable};

/// What one distributed evaluation did on this rank.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RankStats {
    /// Particles on this rank after migration.
    pub particles: usize,
    /// Particles that left this rank.
    pub migrated: usize,
    /// This rank's work in the evaluation (see `FmmSolver::particle_work`).
    pub work: f64,
    /// Largest rank work over mean rank work.
    pub imbalance: f64,
    /// LET cells received.
    pub let_cells: usize,
    /// LET particles received.
    pub let_particles: usize,
    /// Bytes of LET data sent through the host (cells, and unless the devices move them,
    /// multipoles and particles).
    pub let_bytes_sent: usize,
    /// Bytes of LET data received through the host.
    pub let_bytes_received: usize,
    /// Bytes of LET payload (multipoles, positions, masses) the devices moved to this rank
    /// (`super::payload`; 0 when it came through the host).
    pub payload_bytes_received: usize,
    /// Bytes of other ranks' tree geometry received: their coarse top trees, the cells
    /// this rank's exports asked them for, and their 4-byte requests for this rank's cells.
    pub geometry_bytes_received: usize,
    /// Seconds in decomposition and migration.
    pub decomposition_s: f64,
    /// The local FMM's own figures (exchange time included as `seconds.exchange`).
    pub fmm: FmmStats,
}

/// Diagnostics columns of a distributed evaluation beyond the local FMM's: (name, summed
/// between rows).
pub(super) const RANK_COLUMNS: [(&str, bool); 12] = [
    ("rank_particles", false),
    ("rank_migrated", true),
    ("rank_work", false),
    ("load_imbalance", false),
    ("let_cells_received", false),
    ("let_particles_received", false),
    ("let_bytes_sent", false),
    ("let_bytes_received", false),
    ("let_payload_bytes_received", false),
    ("geometry_bytes_received", false),
    ("decomposition_s", true),
    ("exchange_s", true),
];

/// The names of the rank columns, which a solver on one rank writes too.
pub fn rank_stat_names() -> impl Iterator<Item = &'static str> {
    RANK_COLUMNS.iter().map(|c| c.0)
}

impl RankStats {
    /// The figures of a solver alone on `particles` particles: no decomposition, no
    /// traffic, imbalance 1.
    pub fn alone(particles: usize) -> Self {
        RankStats {
            particles,
            imbalance: 1.0,
            ..RankStats::default()
        }
    }

    /// The rank columns' figures.
    pub fn solver_stats(&self) -> Vec<SolverStat> {
        SolverStat::columns(&RANK_COLUMNS, &self.values())
    }

    fn values(&self) -> [f64; 12] {
        [
            self.particles as f64,
            self.migrated as f64,
            self.work,
            self.imbalance,
            self.let_cells as f64,
            self.let_particles as f64,
            self.let_bytes_sent as f64,
            self.let_bytes_received as f64,
            self.payload_bytes_received as f64,
            self.geometry_bytes_received as f64,
            self.decomposition_s,
            self.fmm.seconds.exchange,
        ]
    }
}

/// The figures of one rank's evaluation that `leapfmm forces` reports, as plain numbers
/// that ranks can gather.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub struct RankFigures {
    /// Particles after migration.
    pub particles: f64,
    /// Largest over mean rank work.
    pub imbalance: f64,
    /// Seconds in decomposition and migration.
    pub decomposition_s: f64,
    /// Seconds in the LET exchange.
    pub exchange_s: f64,
    /// Seconds in the local FMM passes.
    pub local_s: f64,
    /// Cap retries.
    pub retries: f64,
    /// LET cells received.
    pub let_cells: f64,
    /// LET particles received.
    pub let_particles: f64,
    /// LET bytes received through the host.
    pub let_bytes_received: f64,
    /// LET payload bytes the devices moved to the rank.
    pub payload_bytes_received: f64,
    /// Top-tree bytes received.
    pub geometry_bytes_received: f64,
}

impl From<&RankStats> for RankFigures {
    fn from(s: &RankStats) -> Self {
        let t = &s.fmm.seconds;
        RankFigures {
            particles: s.particles as f64,
            imbalance: s.imbalance,
            decomposition_s: s.decomposition_s,
            exchange_s: t.exchange,
            local_s: t.tree + t.upward + t.traversal + t.m2l + t.downward + t.p2p,
            retries: s.fmm.retries as f64,
            let_cells: s.let_cells as f64,
            let_particles: s.let_particles as f64,
            let_bytes_received: s.let_bytes_received as f64,
            payload_bytes_received: s.payload_bytes_received as f64,
            geometry_bytes_received: s.geometry_bytes_received as f64,
        }
    }
}
