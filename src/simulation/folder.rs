//! The run folder's layout and what persists in it: the snapshot and checkpoint paths, a
//! checkpoint's contents (`Checkpoint`, `RunState`), small files written atomically, and
//! snapshots removed past a resumed checkpoint.

use super::error::{RunError, io_err};
use crate::fmm::caps::Caps;
use crate::particles::Particles;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
/// Integrator state beyond the particles: everything needed to continue bit-exactly.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunState {
    /// Current tick on the integer timeline.
    pub ti: u64,
    /// Steps taken.
    pub step: u64,
    /// Length of the last step.
    pub last_dt: f64,
    /// Total energy at t = 0.
    pub energy0: f64,
    /// Snapshots written so far (the next one's number).
    pub snapshots_written: u32,
}

/// What a checkpoint file holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// leapfmm version that wrote it.
    pub version: String,
    /// The run config text at the time.
    pub config_text: String,
    /// Integrator state.
    pub state: RunState,
    /// Particle state (f64), including the accelerations of the last force evaluation.
    pub particles: Particles,
    /// The force solver's buffer capacities, so a resumed run needs no retries.
    pub caps: Option<Caps>,
    /// Per-particle work the next domain decomposition balances on (runs on several ranks;
    /// empty otherwise), so a resumed run decomposes exactly as the original would have.
    pub decomposition_work: Vec<f64>,
}

/// Folder of the snapshots of a run.
pub fn snapshot_dir(run_dir: &Path) -> PathBuf {
    run_dir.join("snapshots")
}

/// Folder of the checkpoints of a run.
pub fn checkpoint_dir(run_dir: &Path) -> PathBuf {
    run_dir.join("checkpoints")
}

/// Path of snapshot number `index` of a single-rank run (for K ranks, the first file of the
/// set: `snapshot_file(run_dir, index, 0, K)`).
pub fn snapshot_path(run_dir: &Path, index: u32) -> PathBuf {
    snapshot_file(run_dir, index, 0, 1)
}

/// Path of rank `rank`'s file of snapshot `index` in a run on `ranks` ranks, in GADGET-4's
/// multi-file naming.
pub fn snapshot_file(run_dir: &Path, index: u32, rank: usize, ranks: usize) -> PathBuf {
    if ranks <= 1 {
        snapshot_dir(run_dir).join(format!("snap_{index:03}.hdf5"))
    } else {
        snapshot_dir(run_dir)
            .join(format!("snapdir_{index:03}"))
            .join(format!("snap_{index:03}.{rank}.hdf5"))
    }
}

/// Removes the snapshots numbered `first` and later, in either layout (`snap_NNN.hdf5` of
/// one rank, `snapdir_NNN/` of several): a resume from a checkpoint taken before them writes
/// them again, and a stale file (another layout, or a rank beyond the new count) must not
/// survive beside the new ones.
pub(super) fn remove_snapshots_from(run_dir: &Path, first: u32) -> Result<(), RunError> {
    let dir = snapshot_dir(run_dir);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Ok(());
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let index = name
            .strip_prefix("snapdir_")
            .or_else(|| {
                name.strip_prefix("snap_")
                    .and_then(|r| r.strip_suffix(".hdf5"))
            })
            .and_then(|i| i.parse::<u32>().ok());
        if index.is_some_and(|i| i >= first) {
            let path = entry.path();
            let removed = if path.is_dir() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
            removed.map_err(io_err(
                &path,
                "removing a snapshot written after the checkpoint",
            ))?;
        }
    }
    Ok(())
}

/// Writes a small file via a temporary name so it is never seen half-written.
pub(super) fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), RunError> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).map_err(io_err(&tmp, "writing"))?;
    std::fs::rename(&tmp, path).map_err(io_err(path, "renaming into place"))
}
