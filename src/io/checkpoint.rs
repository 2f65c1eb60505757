//! Checkpoint files: atomic, checksummed, rotated.
//!
//! Layout (little-endian): 16-byte magic, u32 format version, u32 reserved, u64 payload
//! length, the payload (postcard-encoded), then the SHA-256 of everything before it.
//! A file is written under a temporary name, fsynced, renamed into place, and the folder is
//! fsynced; only then are checkpoints beyond the newest `keep` removed. A truncated or
//! corrupt file fails the length or checksum test and the previous checkpoint is used.

use serde::Serialize;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use thiserror::Error;

/// First bytes of every checkpoint file.
pub const MAGIC: &[u8; 16] = b"LEAPFMM-CKPT\0\0\0\0";
/// Current format version.
pub const VERSION: u32 = 2;
/// Test-only fault injection: stall this many milliseconds halfway through writing a
/// checkpoint, so a test can kill the process mid-write.
pub const STALL_ENV: &str = "LEAPFMM_FAULT_CHECKPOINT_STALL_MS";

const HEADER_LEN: usize = 16 + 4 + 4 + 8;
const DIGEST_LEN: usize = 32;

/// A checkpoint that could not be written or read.
#[derive(Debug, Error)]
pub enum CheckpointError {
    /// A filesystem operation failed.
    #[error("{path}: {what}: {reason}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// What was being done.
        what: &'static str,
        /// The OS error.
        reason: String,
    },
    /// The file is not a valid checkpoint.
    #[error("{path} is not a usable checkpoint: {reason}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// Checkpoints exist but none verifies.
    #[error("{dir}: no checkpoint verifies, so the run cannot resume ({reasons})")]
    NoneValid {
        /// The checkpoint folder.
        dir: PathBuf,
        /// Why each file was rejected.
        reasons: String,
    },
}

fn io_err(path: &Path, what: &'static str) -> impl FnOnce(std::io::Error) -> CheckpointError {
    let path = path.to_path_buf();
    move |e| CheckpointError::Io {
        path,
        what,
        reason: e.to_string(),
    }
}

/// File name of the checkpoint taken after `step`.
pub fn file_name(step: u64) -> String {
    format!("checkpoint_{step:012}.ckpt")
}

/// The step encoded in a checkpoint file name.
fn step_of(name: &str) -> Option<u64> {
    name.strip_prefix("checkpoint_")?
        .strip_suffix(".ckpt")?
        .parse()
        .ok()
}

/// Encodes `payload` into the checkpoint byte layout.
pub fn encode<T: Serialize>(payload: &T) -> Result<Vec<u8>, String> {
    let body = postcard::to_stdvec(payload).map_err(|e| e.to_string())?;
    let mut bytes = Vec::with_capacity(HEADER_LEN + body.len() + DIGEST_LEN);
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&VERSION.to_le_bytes());
    bytes.extend_from_slice(&0u32.to_le_bytes());
    bytes.extend_from_slice(&(body.len() as u64).to_le_bytes());
    bytes.extend_from_slice(&body);
    let digest = Sha256::digest(&bytes);
    bytes.extend_from_slice(&digest);
    Ok(bytes)
}

/// Decodes and verifies checkpoint bytes.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    if bytes.len() < HEADER_LEN + DIGEST_LEN || &bytes[..16] != MAGIC {
        return Err("not a leapfmm checkpoint (wrong magic or too short)".into());
    }
    let version = u32::from_le_bytes([bytes[16], bytes[17], bytes[18], bytes[19]]);
    if version != VERSION {
        return Err(format!(
            "format version {version}, this leapfmm reads {VERSION}"
        ));
    }
    let mut len_bytes = [0u8; 8];
    len_bytes.copy_from_slice(&bytes[24..32]);
    let len = u64::from_le_bytes(len_bytes) as usize;
    let expected = HEADER_LEN
        .checked_add(len)
        .and_then(|x| x.checked_add(DIGEST_LEN));
    if expected != Some(bytes.len()) {
        return Err(format!(
            "truncated or padded: {} bytes on disk, the header promises {}",
            bytes.len(),
            expected.map_or("an impossible size".into(), |e| e.to_string())
        ));
    }
    let (content, digest) = bytes.split_at(HEADER_LEN + len);
    if Sha256::digest(content).as_slice() != digest {
        return Err("checksum mismatch: the file is corrupt".into());
    }
    postcard::from_bytes(&content[HEADER_LEN..]).map_err(|e| format!("undecodable payload: {e}"))
}

/// Writes the checkpoint of `step` into `dir` atomically and keeps only the newest `keep`.
pub fn write<T: Serialize>(
    dir: &Path,
    step: u64,
    payload: &T,
    keep: usize,
) -> Result<PathBuf, CheckpointError> {
    fs::create_dir_all(dir).map_err(io_err(dir, "creating the checkpoint folder"))?;
    let final_path = dir.join(file_name(step));
    let tmp_path = dir.join(format!(".{}.tmp", file_name(step)));
    let bytes = encode(payload).map_err(|reason| CheckpointError::Invalid {
        path: final_path.clone(),
        reason,
    })?;
    {
        let mut f = File::create(&tmp_path).map_err(io_err(&tmp_path, "creating"))?;
        let half = bytes.len() / 2;
        f.write_all(&bytes[..half])
            .map_err(io_err(&tmp_path, "writing"))?;
        if let Some(ms) = std::env::var(STALL_ENV)
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
        {
            f.flush().map_err(io_err(&tmp_path, "writing"))?;
            std::thread::sleep(std::time::Duration::from_millis(ms));
        }
        f.write_all(&bytes[half..])
            .map_err(io_err(&tmp_path, "writing"))?;
        f.sync_all().map_err(io_err(&tmp_path, "syncing"))?;
    }
    fs::rename(&tmp_path, &final_path).map_err(io_err(&final_path, "renaming into place"))?;
    if let Ok(d) = File::open(dir) {
        // Makes the rename durable; not every filesystem supports syncing a folder.
        let _ = d.sync_all();
    }
    prune(dir, keep)?;
    Ok(final_path)
}

/// Checkpoints in `dir`, newest (highest step) first.
pub fn list(dir: &Path) -> Result<Vec<(u64, PathBuf)>, CheckpointError> {
    if !dir.is_dir() {
        return Ok(Vec::new());
    }
    let mut found = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_err(dir, "listing"))? {
        let entry = entry.map_err(io_err(dir, "listing"))?;
        if let Some(step) = entry.file_name().to_str().and_then(step_of) {
            found.push((step, entry.path()));
        }
    }
    found.sort_by_key(|f| std::cmp::Reverse(f.0));
    Ok(found)
}

/// Removes checkpoints beyond the newest `keep` and stale temporary files.
fn prune(dir: &Path, keep: usize) -> Result<(), CheckpointError> {
    for (_, path) in list(dir)?.into_iter().skip(keep.max(1)) {
        fs::remove_file(&path).map_err(io_err(&path, "removing an old checkpoint"))?;
    }
    for entry in fs::read_dir(dir).map_err(io_err(dir, "listing"))?.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        if name.starts_with(".checkpoint_") && name.ends_with(".tmp") {
            let _ = fs::remove_file(entry.path());
        }
    }
    Ok(())
}

/// Reads and verifies one checkpoint file.
pub fn read<T: DeserializeOwned>(path: &Path) -> Result<T, CheckpointError> {
    let bytes = fs::read(path).map_err(io_err(path, "reading"))?;
    decode(&bytes).map_err(|reason| CheckpointError::Invalid {
        path: path.to_path_buf(),
        reason,
    })
}

/// The newest checkpoint in `dir` that verifies, with the newer files that did not and why.
/// `Ok(None)` when the folder holds no checkpoint at all; an error, touching nothing, when
/// none verifies.
pub fn newest_valid<T: DeserializeOwned>(dir: &Path) -> Result<Option<Found<T>>, CheckpointError> {
    let mut rejected = Vec::new();
    let candidates = list(dir)?;
    let any = !candidates.is_empty();
    for (_, path) in candidates {
        match read::<T>(&path) {
            Ok(payload) => {
                return Ok(Some(Found {
                    path,
                    payload,
                    rejected,
                }));
            }
            Err(e) => rejected.push((path, e.to_string())),
        }
    }
    if any {
        let reasons: Vec<String> = rejected.into_iter().map(|(_, r)| r).collect();
        return Err(CheckpointError::NoneValid {
            dir: dir.to_path_buf(),
            reasons: reasons.join("; "),
        });
    }
    Ok(None)
}

/// A checkpoint found by `newest_valid`.
#[derive(Debug)]
pub struct Found<T> {
    /// Its file.
    pub path: PathBuf,
    /// Its content.
    pub payload: T,
    /// Newer files that failed verification, with the reason.
    pub rejected: Vec<(PathBuf, String)>,
}

/// Renames a checkpoint that failed verification to `*.ckpt.corrupt`: kept for inspection,
/// never tried again. Returns the new name.
pub fn set_aside(path: &Path) -> Result<PathBuf, CheckpointError> {
    let aside = path.with_extension("ckpt.corrupt");
    fs::rename(path, &aside).map_err(io_err(path, "setting a corrupt checkpoint aside"))?;
    Ok(aside)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_detects_damage() {
        let payload = (
            42u64,
            vec![1.5f64, -2.25, f64::MIN_POSITIVE],
            "text".to_string(),
        );
        let bytes = encode(&payload).unwrap();
        let back: (u64, Vec<f64>, String) = decode(&bytes).unwrap();
        assert_eq!(back, payload);
        assert!(decode::<(u64, Vec<f64>, String)>(&bytes[..bytes.len() - 1]).is_err());
        let mut flipped = bytes.clone();
        flipped[HEADER_LEN + 3] ^= 1;
        let err = decode::<(u64, Vec<f64>, String)>(&flipped).unwrap_err();
        assert!(err.contains("checksum"), "{err}");
    }

    #[test]
    fn rotation_keeps_newest_and_falls_back() {
        let dir = tempfile::tempdir().unwrap();
        for step in [10u64, 20, 30, 40] {
            write(dir.path(), step, &step, 2).unwrap();
        }
        let steps: Vec<u64> = list(dir.path()).unwrap().iter().map(|x| x.0).collect();
        assert_eq!(steps, vec![40, 30]);
        // Truncate the newest: the previous one is used, with a warning.
        let newest = dir.path().join(file_name(40));
        let len = fs::metadata(&newest).unwrap().len();
        fs::OpenOptions::new()
            .write(true)
            .open(&newest)
            .unwrap()
            .set_len(len - 5)
            .unwrap();
        let found = newest_valid::<u64>(dir.path()).unwrap().unwrap();
        assert_eq!(found.payload, 30);
        assert_eq!(found.path, dir.path().join(file_name(30)));
        assert_eq!(found.rejected.len(), 1);
        assert_eq!(found.rejected[0].0, newest);
        // With every file damaged, nothing verifies and nothing is touched.
        let only = dir.path().join(file_name(30));
        fs::OpenOptions::new()
            .write(true)
            .open(&only)
            .unwrap()
            .set_len(10)
            .unwrap();
        assert!(newest_valid::<u64>(dir.path()).is_err());
        assert!(newest.exists() && only.exists());
    }
}
