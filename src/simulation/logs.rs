//! diagnostics.csv and ranks.csv (`Logs`), and the block scheme's columns in them
//! (`BlockFigures`).

use super::error::{RunError, io_err};
use crate::integrate::diagnostics::{DiagnosticsLog, RankLog};
use std::path::Path;
/// The diagnostics column of the energy in the external potential, Σ m Φ_ext (which
/// `total` includes), in runs that have one.
pub(super) const EXTERNAL_COLUMN: &str = "external_energy";

/// `diagnostics.csv`, and `ranks.csv` on more than one rank.
pub(super) struct Logs {
    pub(super) diagnostics: DiagnosticsLog,
    pub(super) ranks: Option<RankLog>,
}

impl Logs {
    /// The logs with the solver's columns `names` (in both) and the run's own `extra`
    /// columns (in diagnostics.csv only).
    pub(super) fn open(
        run_dir: &Path,
        names: &[&str],
        extra: &[String],
        ranks: usize,
        resume_step: Option<u64>,
    ) -> Result<Self, RunError> {
        let path = run_dir.join("diagnostics.csv");
        let all: Vec<&str> = names
            .iter()
            .copied()
            .chain(extra.iter().map(String::as_str))
            .collect();
        let diagnostics = match resume_step {
            Some(step) => DiagnosticsLog::resume(&path, step, &all)
                .map_err(io_err(&path, "reopening the diagnostics log"))?,
            None => DiagnosticsLog::create(&path, &all)
                .map_err(io_err(&path, "creating the diagnostics log"))?,
        };
        let ranks = if ranks > 1 {
            let path = run_dir.join("ranks.csv");
            Some(
                RankLog::open(&path, names, resume_step)
                    .map_err(io_err(&path, "opening the per-rank log"))?,
            )
        } else {
            None
        };
        Ok(Logs { diagnostics, ranks })
    }
}

/// What the block scheme did since the last diagnostics row (summed over ranks).
#[derive(Debug, Clone, Default)]
pub(super) struct BlockFigures {
    /// Particle force evaluations.
    pub(super) evaluations: u64,
    /// Those the global scheme would have made at each cycle's shortest step.
    pub(super) global_evaluations: f64,
    /// Particles per rung at the start of the last cycle.
    pub(super) histogram: Vec<u64>,
    /// Simulation time of the last diagnostics row.
    pub(super) since: f64,
}

impl BlockFigures {
    /// Names of the diagnostics columns for rungs 0..=`deepest`.
    pub(super) fn names(deepest: u32) -> Vec<String> {
        let mut names = vec![
            "force_evaluations".to_string(),
            "evaluations_per_particle_time".to_string(),
            "block_saving".to_string(),
        ];
        names.extend((0..=deepest).map(|k| format!("rung_{k}")));
        names
    }

    /// The columns' values at `time` for `particles` in all.
    pub(super) fn values(&self, particles: u64, time: f64, deepest: u32) -> Vec<f64> {
        let e = self.evaluations as f64;
        let span = time - self.since;
        let mut v = vec![
            e,
            if span > 0.0 {
                e / (particles as f64 * span)
            } else {
                0.0
            },
            if e > 0.0 {
                self.global_evaluations / e
            } else {
                1.0
            },
        ];
        v.extend(
            (0..=deepest as usize).map(|k| self.histogram.get(k).copied().unwrap_or(0) as f64),
        );
        v
    }
}
