//! One writer per run folder: an advisory lock on `RUN_DIR/.leapfmm.lock`.
//!
//! The lock is `flock(2)` (through `File::try_lock`), so the kernel releases it when the
//! holder exits in any way, kill -9 included: a stale lock file never blocks a later run.
//! The holder writes its PID into the file so a refused run can name it.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// Name of the lock file inside a run folder.
pub const LOCK_FILE: &str = ".leapfmm.lock";

/// The held lock of a run folder; released when dropped (or when the process ends).
#[derive(Debug)]
pub struct RunLock {
    _file: File,
}

/// Why a run folder could not be locked.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another process holds the lock.
    #[error(
        "run folder {dir} is being written by another leapfmm process (PID {pid}); wait for it to finish or stop it first"
    )]
    Held {
        /// The run folder.
        dir: PathBuf,
        /// The holder's PID as it wrote it ("unknown" if unreadable).
        pid: String,
    },
    /// The lock file could not be opened or locked.
    #[error("{path}: cannot lock the run folder: {reason}")]
    Io {
        /// The lock file.
        path: PathBuf,
        /// The OS error.
        reason: String,
    },
}

impl RunLock {
    /// Creates `dir` if needed and takes its lock at once, or says who holds it.
    pub fn acquire(dir: &Path) -> Result<RunLock, LockError> {
        let path = dir.join(LOCK_FILE);
        let io = |e: std::io::Error| LockError::Io {
            path: path.clone(),
            reason: e.to_string(),
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut pid = String::new();
                let _ = file.read_to_string(&mut pid);
                let pid = pid.trim();
                return Err(LockError::Held {
                    dir: dir.to_path_buf(),
                    pid: if pid.is_empty() { "unknown" } else { pid }.to_string(),
                });
            }
            Err(TryLockError::Error(e)) => return Err(io(e)),
        }
        file.set_len(0).map_err(io)?;
        file.seek(SeekFrom::Start(0)).map_err(io)?;
        writeln!(file, "{}", std::process::id()).map_err(io)?;
        file.flush().map_err(io)?;
        Ok(RunLock { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_with_the_pid_until_the_first_drops() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("run");
        let first = RunLock::acquire(&run).unwrap();
        let err = RunLock::acquire(&run).unwrap_err().to_string();
        assert!(
            err.contains(&format!("PID {}", std::process::id())),
            "{err}"
        );
        drop(first);
        RunLock::acquire(&run).unwrap();
    }
}
