//! Checkpoint files: atomic, checksummed, rotated.
//!
//! Layout (little-endian): 16-byte magic, u32 format version, u32 reserved, u64 payload
//! length, the payload (postcard-encoded), then the SHA-256 of everything before it.
//! A file is written under a temporary name, fsynced, renamed into place, and the folder is
//! fsynced; only then are checkpoints beyond the newest `keep` removed. A truncated or
//! corrupt file fails the length or checksum test and the previous checkpoint is used.
//!
//! A run on K > 1 ranks stores each checkpoint as a set: every rank writes its own file into
//! `checkpoint_S.ranks/` the same way, and once every rank has finished, rank 0 commits the
//! set by writing `checkpoint_S.manifest` (atomically). A set without a manifest was never
//! committed and is ignored (and removed at the next commit).

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

/// File name of the manifest that commits the rank set taken after `step`.
pub fn manifest_name(step: u64) -> String {
    format!("checkpoint_{step:012}.manifest")
}

/// Folder of the rank files of the set taken after `step`.
pub fn set_folder(dir: &Path, step: u64) -> PathBuf {
    dir.join(format!("checkpoint_{step:012}.ranks"))
}

/// Path of rank `rank`'s file in the set taken after `step`.
pub fn rank_file(dir: &Path, step: u64, rank: usize) -> PathBuf {
    set_folder(dir, step).join(format!("rank_{rank:05}.ckpt"))
}

/// The step encoded in a checkpoint file or manifest name, and which of the two it is.
fn step_of(name: &str) -> Option<(u64, bool)> {
    let rest = name.strip_prefix("checkpoint_")?;
    if let Some(step) = rest.strip_suffix(".ckpt") {
        return Some((step.parse().ok()?, false));
    }
    Some((rest.strip_suffix(".manifest")?.parse().ok()?, true))
}

/// What a manifest records: the set is complete with this many rank files.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct Manifest {
    /// The step the set was taken after.
    pub step: u64,
    /// Number of rank files.
    pub ranks: usize,
}

/// One committed checkpoint: a single file, or a manifest and its rank files.
#[derive(Debug, Clone, PartialEq)]
pub enum Entry {
    /// A single-rank checkpoint file.
    File(PathBuf),
    /// A committed rank set.
    Set {
        /// The manifest.
        manifest: PathBuf,
        /// The folder of the rank files.
        folder: PathBuf,
    },
}

impl Entry {
    /// The file that names this checkpoint (the checkpoint file, or the manifest).
    pub fn path(&self) -> &Path {
        match self {
            Entry::File(p) => p,
            Entry::Set { manifest, .. } => manifest,
        }
    }
}

/// Writes `bytes` to `path` via a temporary file in the same folder, with fsyncs, so that a
/// kill at any moment leaves either the old state or the complete file.
fn write_durably(path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    let tmp_path = dir.join(format!(".{name}.tmp"));
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
    fs::rename(&tmp_path, path).map_err(io_err(path, "renaming into place"))?;
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
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
    let path = dir.join(file_name(step));
    let bytes = encode(payload).map_err(|reason| CheckpointError::Invalid {
        path: path.clone(),
        reason,
    })?;
    write_durably(&path, &bytes)?;
    prune(dir, keep)?;
    Ok(path)
}

/// Writes rank `rank`'s part of the set of `step`. The set counts only once `commit_set`
/// has run, after every rank's `write_rank` returned.
pub fn write_rank<T: Serialize>(
    dir: &Path,
    step: u64,
    rank: usize,
    payload: &T,
) -> Result<PathBuf, CheckpointError> {
    let folder = set_folder(dir, step);
    fs::create_dir_all(&folder).map_err(io_err(&folder, "creating the checkpoint folder"))?;
    let path = rank_file(dir, step, rank);
    let bytes = encode(payload).map_err(|reason| CheckpointError::Invalid {
        path: path.clone(),
        reason,
    })?;
    write_durably(&path, &bytes)?;
    Ok(path)
}

/// Commits the set of `step` written by `ranks` ranks, and keeps only the newest `keep`
/// checkpoints. Call on one rank, after every rank finished `write_rank`.
pub fn commit_set(
    dir: &Path,
    step: u64,
    ranks: usize,
    keep: usize,
) -> Result<PathBuf, CheckpointError> {
    let path = dir.join(manifest_name(step));
    let manifest = Manifest { step, ranks };
    let text = serde_json::to_string_pretty(&manifest).map_err(|e| CheckpointError::Invalid {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    write_durably(&path, text.as_bytes())?;
    prune(dir, keep)?;
    Ok(path)
}

/// Committed checkpoints in `dir`, newest (highest step) first.
pub fn list(dir: &Path) -> Result<Vec<(u64, Entry)>, CheckpointError> {
    if !dir.is_dir() {
        return Ok(Vec::new());
    }
    let mut found = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_err(dir, "listing"))? {
        let entry = entry.map_err(io_err(dir, "listing"))?;
        if let Some((step, is_set)) = entry.file_name().to_str().and_then(step_of) {
            let e = if is_set {
                Entry::Set {
                    manifest: entry.path(),
                    folder: set_folder(dir, step),
                }
            } else {
                Entry::File(entry.path())
            };
            found.push((step, e));
        }
    }
    found.sort_by_key(|f| std::cmp::Reverse(f.0));
    Ok(found)
}

/// Removes checkpoints beyond the newest `keep`, rank folders that were never committed,
/// and stale temporary files.
fn prune(dir: &Path, keep: usize) -> Result<(), CheckpointError> {
    let entries = list(dir)?;
    let mut kept_folders = Vec::new();
    for (k, (_, entry)) in entries.into_iter().enumerate() {
        match (k < keep.max(1), entry) {
            (true, Entry::Set { folder, .. }) => kept_folders.push(folder),
            (true, Entry::File(_)) => {}
            (false, Entry::File(path)) => {
                fs::remove_file(&path).map_err(io_err(&path, "removing an old checkpoint"))?
            }
            (false, Entry::Set { manifest, folder }) => {
                // The manifest first: a set without one is not a checkpoint any more.
                fs::remove_file(&manifest)
                    .map_err(io_err(&manifest, "removing an old checkpoint"))?;
                fs::remove_dir_all(&folder)
                    .map_err(io_err(&folder, "removing an old checkpoint"))?;
            }
        }
    }
    for entry in fs::read_dir(dir).map_err(io_err(dir, "listing"))?.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        let path = entry.path();
        if name.starts_with(".checkpoint_") && name.ends_with(".tmp") {
            let _ = fs::remove_file(&path);
        } else if name.ends_with(".ranks") && !kept_folders.contains(&path) {
            let _ = fs::remove_dir_all(&path);
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

/// Reads and verifies a checkpoint: one payload for a file, one per rank (in rank order)
/// for a set.
pub fn read_entry<T: DeserializeOwned>(entry: &Entry) -> Result<Vec<T>, CheckpointError> {
    match entry {
        Entry::File(path) => Ok(vec![read(path)?]),
        Entry::Set { manifest, folder } => {
            let invalid = |reason: String| CheckpointError::Invalid {
                path: manifest.clone(),
                reason,
            };
            let text = fs::read_to_string(manifest).map_err(io_err(manifest, "reading"))?;
            let m: Manifest = serde_json::from_str(&text)
                .map_err(|e| invalid(format!("unreadable manifest: {e}")))?;
            if m.ranks == 0 {
                return Err(invalid("the manifest lists no ranks".into()));
            }
            (0..m.ranks)
                .map(|r| read(&folder.join(format!("rank_{r:05}.ckpt"))))
                .collect()
        }
    }
}

/// The newest checkpoint in `dir` that verifies, with the newer ones that did not and why.
/// `Ok(None)` when the folder holds no checkpoint at all; an error, touching nothing, when
/// none verifies.
pub fn newest_valid<T: DeserializeOwned>(dir: &Path) -> Result<Option<Found<T>>, CheckpointError> {
    let mut rejected = Vec::new();
    let candidates = list(dir)?;
    let any = !candidates.is_empty();
    for (_, entry) in candidates {
        match read_entry::<T>(&entry) {
            Ok(payloads) => {
                return Ok(Some(Found {
                    entry,
                    payloads,
                    rejected,
                }));
            }
            Err(e) => rejected.push((entry, e.to_string())),
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
    /// The checkpoint.
    pub entry: Entry,
    /// Its payloads: one for a file, one per rank for a set.
    pub payloads: Vec<T>,
    /// Newer checkpoints that failed verification, with the reason.
    pub rejected: Vec<(Entry, String)>,
}

/// Renames a checkpoint that failed verification (the file, or a set's manifest) to
/// `*.corrupt`: kept for inspection, never tried again. Returns the new name.
pub fn set_aside(entry: &Entry) -> Result<PathBuf, CheckpointError> {
    let path = entry.path();
    let mut name = path.as_os_str().to_owned();
    name.push(".corrupt");
    let aside = PathBuf::from(name);
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
        assert_eq!(found.payloads, vec![30]);
        assert_eq!(found.entry, Entry::File(dir.path().join(file_name(30))));
        assert_eq!(found.rejected.len(), 1);
        assert_eq!(found.rejected[0].0, Entry::File(newest.clone()));
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

    #[test]
    fn rank_sets_count_only_when_committed() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        write(d, 10, &10u64, 3).unwrap();
        for rank in 0..3 {
            write_rank(d, 20, rank, &(200 + rank as u64)).unwrap();
        }
        // Not committed yet: the single file is still the newest checkpoint.
        assert_eq!(newest_valid::<u64>(d).unwrap().unwrap().payloads, vec![10]);
        commit_set(d, 20, 3, 3).unwrap();
        let found = newest_valid::<u64>(d).unwrap().unwrap();
        assert_eq!(found.payloads, vec![200, 201, 202]);
        // An uncommitted newer set is ignored, then removed by the next commit; a damaged
        // rank file makes its whole set fall back to the previous checkpoint.
        write_rank(d, 30, 0, &300u64).unwrap();
        for rank in 0..2 {
            write_rank(d, 40, rank, &(400 + rank as u64)).unwrap();
        }
        commit_set(d, 40, 2, 2).unwrap();
        assert!(!set_folder(d, 30).exists());
        assert!(
            !d.join(file_name(10)).exists(),
            "only the newest 2 are kept"
        );
        fs::write(rank_file(d, 40, 1), b"garbage").unwrap();
        let found = newest_valid::<u64>(d).unwrap().unwrap();
        assert_eq!(found.payloads, vec![200, 201, 202]);
        assert_eq!(found.rejected.len(), 1);
        let aside = set_aside(&found.rejected[0].0).unwrap();
        assert!(aside.to_string_lossy().ends_with(".manifest.corrupt"));
        assert_eq!(list(d).unwrap().len(), 1);
    }
}
