//! The record of what a run was built from (`RUN/inputs.toml`): the model file's SHA-256 and
//! resolved content, or the IC file's SHA-256 and size.
//!
//! The config alone does not identify a run: `ics.model` and `ics.file` name files whose
//! content can change after the run started. `--resume` compares the inputs given then with
//! this record and refuses a difference, naming the file and, for a model, the key. Paths
//! are recorded for the reader only; identity is the content, so a run folder moved with its
//! inputs (and `output_dir`, `ics.model` or `ics.file` edited to the new places) resumes.

use crate::config::{IcSource, flatten};
use crate::format::short_text;
use crate::gravity::external::ExternalEntry;
use crate::ics::ModelFile;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::{Path, PathBuf};
use thiserror::Error;

/// Name of the record inside a run folder.
pub const INPUTS_FILE: &str = "inputs.toml";
/// Format of the record.
const FORMAT: u32 = 1;

/// The record could not be made, read or written.
#[derive(Debug, Error)]
#[error("{path}: {what}: {reason}")]
pub struct InputsError {
    /// The file.
    pub path: PathBuf,
    /// What was being done.
    pub what: &'static str,
    /// Why it failed.
    pub reason: String,
}

/// What a run was built from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunInputs {
    /// Format of this record.
    pub format: u32,
    /// The model file, for a run sampled from a model.
    pub model: Option<ModelRecord>,
    /// The IC file, for a run read from a file.
    pub file: Option<FileRecord>,
    /// The galaxies' model files, in order, for a run of several galaxies
    /// (`[[ics.galaxies]]`; their placement is in the config).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub galaxies: Vec<ModelRecord>,
    /// The path files external potentials' centres follow (`centre_orbit`), in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub orbits: Vec<FileRecord>,
}

/// A model file: its digest and its parsed content (defaults filled in).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelRecord {
    /// The path given when this record was written (for the reader; not compared).
    pub path: String,
    /// SHA-256 of the file's bytes, in hex.
    pub sha256: String,
    /// The model as the run used it.
    pub resolved: ModelFile,
}

/// An IC file: its digest and size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileRecord {
    /// The path given when this record was written (for the reader; not compared).
    pub path: String,
    /// SHA-256 of the file's bytes, in hex.
    pub sha256: String,
    /// The file's size in bytes.
    pub bytes: u64,
}

impl RunInputs {
    /// Records the inputs of a validated run (reads and hashes the model or IC file, and
    /// the path files of the `external` potentials' centres).
    pub fn of(ics: &IcSource, external: &[ExternalEntry]) -> Result<Self, InputsError> {
        let mut inputs = Self::of_ics(ics)?;
        for path in external.iter().filter_map(|e| e.centre_orbit.as_deref()) {
            let (sha256, bytes) = sha256_of(path)?;
            inputs.orbits.push(FileRecord {
                path: path.display().to_string(),
                sha256,
                bytes,
            });
        }
        Ok(inputs)
    }

    fn of_ics(ics: &IcSource) -> Result<Self, InputsError> {
        Ok(match ics {
            IcSource::Model { path, model, .. } => RunInputs {
                format: FORMAT,
                model: Some(ModelRecord::of(path, model)?),
                file: None,
                galaxies: Vec::new(),
                orbits: Vec::new(),
            },
            IcSource::Galaxies(encounter) => RunInputs {
                format: FORMAT,
                model: None,
                file: None,
                galaxies: encounter
                    .galaxies
                    .iter()
                    .map(|g| ModelRecord::of(&g.path, &g.model))
                    .collect::<Result<_, _>>()?,
                orbits: Vec::new(),
            },
            IcSource::File { path } => {
                let (sha256, bytes) = sha256_of(path)?;
                RunInputs {
                    format: FORMAT,
                    model: None,
                    file: Some(FileRecord {
                        path: path.display().to_string(),
                        sha256,
                        bytes,
                    }),
                    galaxies: Vec::new(),
                    orbits: Vec::new(),
                }
            }
        })
    }

    /// Reads the record of the run folder `run_dir`; `None` when it has none (a folder
    /// written before records existed, or a run that never started).
    pub fn read(run_dir: &Path) -> Result<Option<Self>, InputsError> {
        let path = run_dir.join(INPUTS_FILE);
        if !path.exists() {
            return Ok(None);
        }
        let fail = |what, reason: String| InputsError {
            path: path.clone(),
            what,
            reason,
        };
        let text =
            crate::files::read_regular_text(&path).map_err(|e| fail("reading", e.to_string()))?;
        let record: RunInputs =
            toml::from_str(&text).map_err(|e| fail("parsing", e.message().to_string()))?;
        if record.format != FORMAT {
            return Err(fail(
                "reading",
                format!(
                    "record format {}, this leapfmm reads {FORMAT}",
                    record.format
                ),
            ));
        }
        Ok(Some(record))
    }

    /// The record as the text of `inputs.toml`.
    pub fn to_text(&self) -> Result<String, InputsError> {
        let body = toml::to_string(self).map_err(|e| InputsError {
            path: PathBuf::from(INPUTS_FILE),
            what: "writing",
            reason: e.to_string(),
        })?;
        Ok(format!(
            "# What this run was built from; --resume refuses inputs that differ from it.\n\
             # Paths are for the reader: the run is identified by the files' content.\n{body}"
        ))
    }

    /// Why the inputs `now` do not continue the run recorded as `self`, in one sentence;
    /// `None` when they do (same model keys and values, or the same IC file bytes).
    pub fn difference(&self, now: &RunInputs) -> Option<String> {
        let restore = "restore it to resume, or start a new run under another name";
        self.ics_difference(now, restore).or_else(|| {
            let changed = self.orbits.len() != now.orbits.len()
                || self.orbits.iter().zip(&now.orbits).any(|(a, b)| a.sha256 != b.sha256);
            changed.then(|| {
                format!(
                    "the external potentials' centre path files ({}) changed since the run started; {restore}",
                    now.orbits
                        .iter()
                        .map(|o| o.path.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })
        })
    }

    fn ics_difference(&self, now: &RunInputs, restore: &str) -> Option<String> {
        match (&self.model, &now.model, &self.file, &now.file) {
            (Some(was), Some(is), _, _) => model_change(was, is, restore),
            (None, None, None, None)
                if !self.galaxies.is_empty() && self.galaxies.len() == now.galaxies.len() =>
            {
                self.galaxies
                    .iter()
                    .zip(&now.galaxies)
                    .find_map(|(was, is)| model_change(was, is, restore))
            }
            (_, _, Some(was), Some(is)) => (was.sha256 != is.sha256).then(|| {
                format!(
                    "IC file {}: its content changed since the run started ({} bytes with SHA-256 {}…, now {} bytes with {}…); {restore}",
                    is.path,
                    was.bytes,
                    &was.sha256[..12.min(was.sha256.len())],
                    is.bytes,
                    &is.sha256[..12.min(is.sha256.len())]
                )
            }),
            _ => Some(format!(
                "the run was started from {}, now it is given {}; {restore}",
                self.describe(),
                now.describe()
            )),
        }
    }

    fn describe(&self) -> String {
        match (&self.model, &self.file) {
            (Some(m), _) => format!("model file {}", m.path),
            (_, Some(f)) => format!("IC file {}", f.path),
            _ if !self.galaxies.is_empty() => format!(
                "{} galaxies ({})",
                self.galaxies.len(),
                self.galaxies
                    .iter()
                    .map(|g| g.path.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            _ => "no recorded input".into(),
        }
    }
}

impl ModelRecord {
    /// The record of the model `model` read from `path`.
    fn of(path: &Path, model: &ModelFile) -> Result<Self, InputsError> {
        Ok(ModelRecord {
            path: path.display().to_string(),
            sha256: sha256_of(path)?.0,
            resolved: model.clone(),
        })
    }
}

/// The first key whose value differs between the model records `was` and `is`, as the
/// sentence `RunInputs::difference` gives.
fn model_change(was: &ModelRecord, is: &ModelRecord, restore: &str) -> Option<String> {
    let (a, b) = (flat(&was.resolved), flat(&is.resolved));
    let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    keys.into_iter().find_map(|k| {
        let (va, vb) = (a.get(k), b.get(k));
        (va != vb).then(|| {
            let show = |v: Option<&String>| v.map_or_else(|| "(unset)".into(), |v| short_text(v));
            format!(
                "model file {}: key '{k}' changed since the run started (was {}, now {}); {restore}",
                is.path,
                show(va),
                show(vb)
            )
        })
    })
}

/// A model's keys as dotted names and their values as TOML text.
fn flat(model: &ModelFile) -> std::collections::BTreeMap<String, String> {
    flatten(model)
        .into_iter()
        .map(|(k, v)| (k, v.to_string()))
        .collect()
}

/// SHA-256 (hex) and size of a regular file, read in pieces.
fn sha256_of(path: &Path) -> Result<(String, u64), InputsError> {
    let fail = |reason: String| InputsError {
        path: path.to_path_buf(),
        what: "reading to record its digest",
        reason,
    };
    let meta = std::fs::metadata(path).map_err(|e| fail(e.to_string()))?;
    if !meta.is_file() {
        return Err(fail("not a regular file".into()));
    }
    let mut file = std::fs::File::open(path).map_err(|e| fail(e.to_string()))?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 1 << 20];
    let mut bytes = 0u64;
    loop {
        let got = match file.read(&mut buffer) {
            Ok(got) => got,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(fail(e.to_string())),
        };
        if got == 0 {
            break;
        }
        hasher.update(&buffer[..got]);
        bytes += got as u64;
    }
    Ok((super::hex(&hasher.finalize()), bytes))
}
