//! Why a run stopped with an error, and how every rank comes to agree on it.

use crate::config::ConfigError;
use crate::distributed::comm::{CommError, Communicator, allgatherv};
use crate::gravity::GravityError;
use crate::integrate::timestep::TimestepError;
use crate::io::checkpoint::CheckpointError;
use crate::io::inputs::InputsError;
use crate::io::lock::LockError;
use crate::io::snapshot::SnapshotError;
use std::path::{Path, PathBuf};
use thiserror::Error;
/// Why a run stopped with an error. Everything already written stays intact.
#[derive(Debug, Error)]
pub enum RunError {
    /// Bad config or model file.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A snapshot could not be read or written.
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    /// A checkpoint could not be read or written.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// The force solver failed.
    #[error(transparent)]
    Gravity(#[from] GravityError),
    /// The time step collapsed.
    #[error(transparent)]
    Timestep(#[from] TimestepError),
    /// The record of the run's inputs could not be made, read or written.
    #[error(transparent)]
    Inputs(#[from] InputsError),
    /// Another process writes the run folder, or its lock failed.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// A file in the run folder could not be written.
    #[error("{path}: {what}: {reason}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// What was being done.
        what: &'static str,
        /// The OS error.
        reason: String,
    },
    /// The run folder's state does not allow what was asked.
    #[error("{0}")]
    State(String),
    /// Ranks could not agree (another rank failed, or a timeout).
    #[error(transparent)]
    Communication(#[from] CommError),
    /// One rank of a multi-rank run failed; the others stopped with it.
    #[error("rank {rank} of {ranks} failed: {reason}")]
    Rank {
        /// The rank that failed first.
        rank: usize,
        /// Ranks in the run.
        ranks: usize,
        /// Its error.
        reason: String,
    },
}

pub(super) fn io_err(path: &Path, what: &'static str) -> impl FnOnce(std::io::Error) -> RunError {
    let path = path.to_path_buf();
    move |e| RunError::Io {
        path,
        what,
        reason: e.to_string(),
    }
}

/// Makes one rank's failure every rank's (collective): the first rank's reason, in rank
/// order, or `Ok` when every rank passed.
pub(super) fn agree(comm: &dyn Communicator, local: Result<(), String>) -> Result<(), String> {
    let reason = local.err().unwrap_or_default();
    let reasons = allgatherv(comm, reason.as_bytes()).map_err(|e| e.to_string())?;
    match reasons.iter().find(|r| !r.is_empty()) {
        Some(r) => Err(String::from_utf8_lossy(r).into_owned()),
        None => Ok(()),
    }
}
