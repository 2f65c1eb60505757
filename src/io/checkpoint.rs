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
//!
//! A set is verified as a whole, not file by file: the manifest carries its own SHA-256, the
//! set's identity, step, time and particle count, and each rank file's SHA-256 and particle
//! count; each rank file records the set identity, step, rank and rank count it belongs to.
//! An edited manifest, a rank file copied in from another set, or a missing file makes the
//! whole set invalid, so the previous checkpoint is used.

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
    set_folder(dir, step).join(rank_file_name(rank))
}

fn rank_file_name(rank: usize) -> String {
    format!("rank_{rank:05}.ckpt")
}

/// The step encoded in a checkpoint file or manifest name, and which of the two it is.
fn step_of(name: &str) -> Option<(u64, bool)> {
    let rest = name.strip_prefix("checkpoint_")?;
    if let Some(step) = rest.strip_suffix(".ckpt") {
        return Some((step.parse().ok()?, false));
    }
    Some((rest.strip_suffix(".manifest")?.parse().ok()?, true))
}

/// Format of the manifests this leapfmm writes and reads.
pub const MANIFEST_FORMAT: u32 = 2;

/// What a manifest records: the set, its summary and each rank file's digest.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Manifest format (`MANIFEST_FORMAT`).
    pub format: u32,
    /// Identity of the set, recorded in each of its rank files (hex).
    pub set_id: String,
    /// The step the set was taken after.
    pub step: u64,
    /// Simulation time of the set.
    pub time: f64,
    /// Particles in the whole set.
    pub particles: u64,
    /// Number of rank files.
    pub ranks: usize,
    /// Each rank file, in rank order.
    pub files: Vec<RankEntry>,
    /// SHA-256 (hex) of this manifest written with an empty `checksum`.
    pub checksum: String,
}

/// One rank file as its set's manifest records it.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RankEntry {
    /// File name inside the set's folder.
    pub name: String,
    /// SHA-256 (hex) of the whole file.
    pub sha256: String,
    /// Particles the file holds.
    pub particles: u64,
}

/// Which set a rank file belongs to; recorded in the file itself, so a file copied in from
/// another set is recognised even before its digest is compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct RankIdentity {
    /// The set's identity (see `set_identity`).
    pub set_id: u64,
    /// The step the set was taken after.
    pub step: u64,
    /// This file's rank.
    pub rank: u32,
    /// Ranks in the set.
    pub ranks: u32,
}

/// What a rank file holds: its identity and the rank's payload.
#[derive(Debug, Serialize, serde::Deserialize)]
struct RankFile<T> {
    identity: RankIdentity,
    payload: T,
}

/// A set identity that every rank computes alike without talking to the others: a digest
/// of the run's own text (its config), the step, the time and the rank count, so sets of
/// different steps, runs or rank counts never share one.
pub fn set_identity(run_text: &str, step: u64, time: f64, ranks: usize) -> u64 {
    let mut h = Sha256::new();
    h.update(run_text.as_bytes());
    h.update(step.to_le_bytes());
    h.update(time.to_bits().to_le_bytes());
    h.update((ranks as u64).to_le_bytes());
    let d = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&d[..8]);
    u64::from_le_bytes(first)
}

/// What rank 0 needs to commit a set: its summary and each rank's file digest and count.
#[derive(Debug, Clone, PartialEq)]
pub struct SetSummary {
    /// The set's identity (`set_identity`).
    pub set_id: u64,
    /// The step the set was taken after.
    pub step: u64,
    /// Simulation time.
    pub time: f64,
    /// Each rank's file: SHA-256 of the whole file and its particle count, in rank order.
    pub files: Vec<([u8; 32], u64)>,
}

impl Manifest {
    /// The manifest's checksum: SHA-256 of its JSON text with an empty `checksum`.
    fn digest(&self) -> String {
        let mut blank = self.clone();
        blank.checksum.clear();
        let text = serde_json::to_vec(&blank).unwrap_or_default();
        super::hex(&Sha256::digest(&text))
    }

    /// Parses a manifest and checks it against its own checksum and for consistency.
    pub fn parse(text: &str) -> Result<Manifest, String> {
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(text)
            && v.get("format").is_none()
        {
            return Err("the manifest has no format or checksum (written by a leapfmm older than the manifest format 2), so its set cannot be verified".into());
        }
        let m: Manifest =
            serde_json::from_str(text).map_err(|e| format!("unreadable manifest: {e}"))?;
        if m.format != MANIFEST_FORMAT {
            return Err(format!(
                "manifest format {}, this leapfmm reads {MANIFEST_FORMAT}",
                m.format
            ));
        }
        if m.digest() != m.checksum {
            return Err(
                "the manifest's checksum does not match its contents (edited or damaged)".into(),
            );
        }
        if m.ranks == 0 || m.files.len() != m.ranks {
            return Err(format!(
                "the manifest lists {} rank files for {} ranks",
                m.files.len(),
                m.ranks
            ));
        }
        let sum: u64 = m.files.iter().map(|f| f.particles).sum();
        if sum != m.particles {
            return Err(format!(
                "the manifest's rank files hold {sum} particles, its total says {}",
                m.particles
            ));
        }
        Ok(m)
    }
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
    let written = (|| {
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
        f.sync_all().map_err(io_err(&tmp_path, "syncing"))
    })();
    if let Err(e) = written {
        // A full disk must not stay full of our half-written file.
        let _ = fs::remove_file(&tmp_path);
        return Err(e);
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
    prune(dir, keep, step)?;
    Ok(path)
}

/// Writes rank `identity.rank`'s part of the set of `identity.step` and returns the
/// file's SHA-256 for the manifest. The set counts only once `commit_set` has run, after
/// every rank's `write_rank` returned.
pub fn write_rank<T: Serialize>(
    dir: &Path,
    identity: RankIdentity,
    payload: &T,
) -> Result<[u8; 32], CheckpointError> {
    let folder = set_folder(dir, identity.step);
    fs::create_dir_all(&folder).map_err(io_err(&folder, "creating the checkpoint folder"))?;
    let path = rank_file(dir, identity.step, identity.rank as usize);
    let bytes =
        encode(&RankFile { identity, payload }).map_err(|reason| CheckpointError::Invalid {
            path: path.clone(),
            reason,
        })?;
    write_durably(&path, &bytes)?;
    Ok(Sha256::digest(&bytes).into())
}

/// Commits the set `summary` describes, and keeps only the newest `keep` checkpoints. Call
/// on one rank, after every rank finished `write_rank`.
pub fn commit_set(
    dir: &Path,
    summary: &SetSummary,
    keep: usize,
) -> Result<PathBuf, CheckpointError> {
    let path = dir.join(manifest_name(summary.step));
    let mut manifest = Manifest {
        format: MANIFEST_FORMAT,
        set_id: format!("{:016x}", summary.set_id),
        step: summary.step,
        time: summary.time,
        particles: summary.files.iter().map(|f| f.1).sum(),
        ranks: summary.files.len(),
        files: summary
            .files
            .iter()
            .enumerate()
            .map(|(r, (digest, particles))| RankEntry {
                name: rank_file_name(r),
                sha256: super::hex(digest),
                particles: *particles,
            })
            .collect(),
        checksum: String::new(),
    };
    manifest.checksum = manifest.digest();
    let text = serde_json::to_string_pretty(&manifest).map_err(|e| CheckpointError::Invalid {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    write_durably(&path, text.as_bytes())?;
    prune(dir, keep, summary.step)?;
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
/// and stale temporary files, after `current` was written. A checkpoint named as a later
/// step than `current` cannot belong to this run (a copy under another name): it is set
/// aside as corrupt rather than allowed to outrank the real ones.
fn prune(dir: &Path, keep: usize, current: u64) -> Result<(), CheckpointError> {
    let (future, entries): (Vec<_>, Vec<_>) = list(dir)?
        .into_iter()
        .partition(|(step, _)| *step > current);
    for (_, entry) in &future {
        set_aside(entry)?;
    }
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
    let bytes = crate::files::read_regular(path).map_err(io_err(path, "reading"))?;
    decode(&bytes).map_err(|reason| CheckpointError::Invalid {
        path: path.to_path_buf(),
        reason,
    })
}

/// A checkpoint read and verified: its payloads (one for a file, one per rank in rank order
/// for a set) and, for a set, its manifest.
#[derive(Debug)]
pub struct Loaded<T> {
    /// The payloads.
    pub payloads: Vec<T>,
    /// The set's manifest (`None` for a single file).
    pub manifest: Option<Manifest>,
}

/// Reads and verifies a checkpoint; a set as a whole: the manifest's own checksum, every
/// rank file's digest against the manifest, and the identity each file records.
pub fn read_entry<T: DeserializeOwned>(entry: &Entry) -> Result<Loaded<T>, CheckpointError> {
    match entry {
        Entry::File(path) => Ok(Loaded {
            payloads: vec![read(path)?],
            manifest: None,
        }),
        Entry::Set { manifest, folder } => {
            let invalid = |reason: String| CheckpointError::Invalid {
                path: manifest.clone(),
                reason,
            };
            let text =
                crate::files::read_regular_text(manifest).map_err(io_err(manifest, "reading"))?;
            let m = Manifest::parse(&text).map_err(invalid)?;
            let set_id = u64::from_str_radix(&m.set_id, 16)
                .map_err(|_| invalid(format!("set_id '{}' is not hexadecimal", m.set_id)))?;
            let mut payloads = Vec::with_capacity(m.ranks);
            for (r, listed) in m.files.iter().enumerate() {
                let path = folder.join(rank_file_name(r));
                if listed.name != rank_file_name(r) {
                    return Err(invalid(format!(
                        "rank {r}'s file is listed as '{}', expected '{}'",
                        listed.name,
                        rank_file_name(r)
                    )));
                }
                let bytes = crate::files::read_regular(&path).map_err(io_err(&path, "reading"))?;
                if super::hex(&Sha256::digest(&bytes)) != listed.sha256 {
                    return Err(invalid(format!(
                        "{} is not the file the manifest committed (its SHA-256 differs)",
                        path.display()
                    )));
                }
                let file: RankFile<T> =
                    decode(&bytes).map_err(|reason| CheckpointError::Invalid {
                        path: path.clone(),
                        reason,
                    })?;
                let want = RankIdentity {
                    set_id,
                    step: m.step,
                    rank: r as u32,
                    ranks: m.ranks as u32,
                };
                if file.identity != want {
                    return Err(invalid(format!(
                        "{} belongs to another set (step {}, rank {} of {}), not to this one (step {}, rank {r} of {})",
                        path.display(),
                        file.identity.step,
                        file.identity.rank,
                        file.identity.ranks,
                        m.step,
                        m.ranks
                    )));
                }
                payloads.push(file.payload);
            }
            Ok(Loaded {
                payloads,
                manifest: Some(m),
            })
        }
    }
}

/// The newest checkpoint in `dir` that verifies, with the newer ones that did not and why.
/// `Ok(None)` when the folder holds no checkpoint at all; an error, touching nothing, when
/// none verifies. `check` adds the caller's own test of a verified checkpoint's contents
/// (particle counts, identifiers); a checkpoint it refuses counts as corrupt.
pub fn newest_valid<T: DeserializeOwned>(
    dir: &Path,
    check: impl Fn(u64, &Loaded<T>) -> Result<(), String>,
) -> Result<Option<Found<T>>, CheckpointError> {
    let mut rejected = Vec::new();
    let candidates = list(dir)?;
    let any = !candidates.is_empty();
    for (step, entry) in candidates {
        let loaded = read_entry::<T>(&entry).and_then(|loaded| {
            check(step, &loaded).map_err(|reason| CheckpointError::Invalid {
                path: entry.path().to_path_buf(),
                reason,
            })?;
            Ok(loaded)
        });
        match loaded {
            Ok(loaded) => {
                return Ok(Some(Found {
                    entry,
                    payloads: loaded.payloads,
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
        let found = newest_valid::<u64>(dir.path(), no_check).unwrap().unwrap();
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
        assert!(newest_valid::<u64>(dir.path(), no_check).is_err());
        assert!(newest.exists() && only.exists());
    }

    /// Writes and (with `commit`) commits a set of `values`, one per rank.
    fn write_set(d: &Path, step: u64, values: &[u64], commit: bool, keep: usize) {
        let ranks = values.len();
        let set_id = set_identity("run", step, step as f64, ranks);
        let files = values
            .iter()
            .enumerate()
            .map(|(rank, v)| {
                let identity = RankIdentity {
                    set_id,
                    step,
                    rank: rank as u32,
                    ranks: ranks as u32,
                };
                (write_rank(d, identity, v).unwrap(), 1)
            })
            .collect();
        if commit {
            let summary = SetSummary {
                set_id,
                step,
                time: step as f64,
                files,
            };
            commit_set(d, &summary, keep).unwrap();
        }
    }

    fn no_check<T>(_: u64, _: &Loaded<T>) -> Result<(), String> {
        Ok(())
    }

    #[test]
    fn a_checkpoint_named_beyond_the_current_step_does_not_outrank_it_when_pruning() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        write(d, 99, &8u64, 1).unwrap();
        write(d, 20, &20u64, 1).unwrap();
        let steps: Vec<u64> = list(d).unwrap().into_iter().map(|(s, _)| s).collect();
        assert_eq!(steps, vec![20], "the real newest survives pruning");
        assert!(d.join(format!("{}.corrupt", file_name(99))).exists());
    }

    #[test]
    fn rank_sets_count_only_when_committed() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        write(d, 10, &10u64, 3).unwrap();
        write_set(d, 20, &[200, 201, 202], false, 3);
        // Not committed yet: the single file is still the newest checkpoint.
        assert_eq!(
            newest_valid::<u64>(d, no_check).unwrap().unwrap().payloads,
            vec![10]
        );
        write_set(d, 20, &[200, 201, 202], true, 3);
        let found = newest_valid::<u64>(d, no_check).unwrap().unwrap();
        assert_eq!(found.payloads, vec![200, 201, 202]);
        // An uncommitted newer set is ignored, then removed by the next commit; a damaged
        // rank file makes its whole set fall back to the previous checkpoint.
        write_set(d, 30, &[300], false, 3);
        write_set(d, 40, &[400, 401], true, 2);
        assert!(!set_folder(d, 30).exists());
        assert!(
            !d.join(file_name(10)).exists(),
            "only the newest 2 are kept"
        );
        fs::write(rank_file(d, 40, 1), b"garbage").unwrap();
        let found = newest_valid::<u64>(d, no_check).unwrap().unwrap();
        assert_eq!(found.payloads, vec![200, 201, 202]);
        assert_eq!(found.rejected.len(), 1);
        let aside = set_aside(&found.rejected[0].0).unwrap();
        assert!(aside.to_string_lossy().ends_with(".manifest.corrupt"));
        assert_eq!(list(d).unwrap().len(), 1);
    }

    /// The set as a whole: an edited manifest, a rank file from another step's set (even
    /// with the manifest's digest edited to match it), a missing file, and a caller's
    /// check each make the set fall back to the previous one.
    #[test]
    fn a_set_is_verified_as_a_whole() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        write_set(d, 10, &[100, 101, 102], true, 5);
        write_set(d, 20, &[200, 201, 202], true, 5);
        let manifest = d.join(manifest_name(20));
        let text = fs::read_to_string(&manifest).unwrap();
        let newest = |d: &Path| newest_valid::<u64>(d, no_check).unwrap().unwrap();
        assert_eq!(newest(d).payloads, vec![200, 201, 202]);

        // The manifest edited to one rank: its checksum no longer matches.
        fs::write(&manifest, text.replace("\"ranks\": 3", "\"ranks\": 1")).unwrap();
        let found = newest(d);
        assert_eq!(found.payloads, vec![100, 101, 102]);
        assert!(
            found.rejected[0].1.contains("checksum"),
            "{}",
            found.rejected[0].1
        );
        fs::write(&manifest, &text).unwrap();

        // A rank file copied in from step 10's set, with or without the manifest's digest
        // and checksum recomputed to match it.
        let original = fs::read(rank_file(d, 20, 1)).unwrap();
        fs::copy(rank_file(d, 10, 1), rank_file(d, 20, 1)).unwrap();
        let found = newest(d);
        assert_eq!(found.payloads, vec![100, 101, 102]);
        assert!(
            found.rejected[0].1.contains("SHA-256"),
            "{}",
            found.rejected[0].1
        );
        let mut m = Manifest::parse(&text).unwrap();
        m.files[1].sha256 = crate::io::hex(&Sha256::digest(fs::read(rank_file(d, 10, 1)).unwrap()));
        m.checksum = m.digest();
        fs::write(&manifest, serde_json::to_string(&m).unwrap()).unwrap();
        let found = newest(d);
        assert_eq!(found.payloads, vec![100, 101, 102]);
        assert!(
            found.rejected[0].1.contains("belongs to another set"),
            "{}",
            found.rejected[0].1
        );
        fs::write(&manifest, &text).unwrap();
        fs::write(rank_file(d, 20, 1), &original).unwrap();

        // A missing rank file.
        let original = fs::read(rank_file(d, 20, 2)).unwrap();
        fs::remove_file(rank_file(d, 20, 2)).unwrap();
        assert_eq!(newest(d).payloads, vec![100, 101, 102]);
        fs::write(rank_file(d, 20, 2), &original).unwrap();
        assert_eq!(newest(d).payloads, vec![200, 201, 202]);

        // The caller's own check refuses the newest set.
        let found = newest_valid::<u64>(d, |_, l: &Loaded<u64>| {
            if l.payloads.contains(&200) {
                Err("200 is not allowed".into())
            } else {
                Ok(())
            }
        })
        .unwrap()
        .unwrap();
        assert_eq!(found.payloads, vec![100, 101, 102]);
        assert!(found.rejected[0].1.contains("200 is not allowed"));
    }
}
