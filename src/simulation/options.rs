//! What a caller asks of a run (`RunOptions`) and how it ended (`RunOutcome`).

use super::signals::StopRequest;
use std::path::PathBuf;
/// How `run` was asked to behave.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Continue from the newest valid checkpoint.
    pub resume: bool,
    /// No progress output.
    pub quiet: bool,
    /// Thread ranks to split the particles over (0 or 1: one).
    pub ranks: usize,
    /// Progress bars shown together (a campaign's): the run's bar joins them.
    pub group: Option<indicatif::MultiProgress>,
    /// A library caller's way to stop the run (instead of SIGINT/SIGTERM handlers, which
    /// are not installed then).
    pub stop: Option<StopRequest>,
}

/// How a run ended without error.
#[derive(Debug, Clone, PartialEq)]
pub enum RunOutcome {
    /// Reached `t_end`.
    Finished {
        /// Total steps.
        steps: u64,
        /// Final time.
        time: f64,
    },
    /// `--resume` found the run already at `t_end`.
    AlreadyFinished {
        /// Final time.
        time: f64,
    },
    /// A signal stopped the run after writing a checkpoint.
    Interrupted {
        /// The signal number.
        signal: i32,
        /// Time reached.
        time: f64,
        /// The checkpoint written.
        checkpoint: PathBuf,
    },
}
