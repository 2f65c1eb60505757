//! The caps presets file (design §5): converged caps stored per problem size and settings,
//! so a run starts from caps that need no retries. JSON, written atomically.
//!
//! Lookup for a key: the exact entry; else the entry with the nearest larger particle count
//! (same other fields) as it is; else the nearest smaller one scaled by the particle ratio.

use super::caps::Caps;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Current file format version.
const VERSION: u32 = 1;

/// What a preset is for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PresetKey {
    /// Particles per rank.
    pub particles_per_rank: u64,
    /// Number of ranks.
    pub ranks: u32,
    /// Leaf size.
    pub leaf_size: u32,
    /// Expansion order.
    pub order: u32,
    /// Opening angle parameter.
    pub theta: f64,
    /// "cpu" or "cuda".
    pub backend: String,
}

impl PresetKey {
    /// Same settings, any particle count.
    fn same_settings(&self, other: &PresetKey) -> bool {
        self.ranks == other.ranks
            && self.leaf_size == other.leaf_size
            && self.order == other.order
            && (self.theta - other.theta).abs() <= 1e-12 * self.theta.abs().max(1.0)
            && self.backend == other.backend
    }
}

/// One stored preset.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Preset {
    /// What it is for.
    pub key: PresetKey,
    /// Caps that worked.
    pub caps: Caps,
}

/// The whole file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PresetsFile {
    /// Format version.
    pub version: u32,
    /// Stored presets.
    pub entries: Vec<Preset>,
}

impl PresetsFile {
    /// Caps for `key` by the lookup rules, or None when nothing matches its settings.
    pub fn lookup(&self, key: &PresetKey) -> Option<Caps> {
        let same: Vec<&Preset> = self
            .entries
            .iter()
            .filter(|e| e.key.same_settings(key))
            .collect();
        let n = key.particles_per_rank;
        if let Some(exact) = same.iter().find(|e| e.key.particles_per_rank == n) {
            return Some(exact.caps);
        }
        if let Some(larger) = same
            .iter()
            .filter(|e| e.key.particles_per_rank > n)
            .min_by_key(|e| e.key.particles_per_rank)
        {
            return Some(larger.caps);
        }
        same.iter()
            .filter(|e| e.key.particles_per_rank > 0)
            .max_by_key(|e| e.key.particles_per_rank)
            .map(|smaller| {
                smaller
                    .caps
                    .scaled(n as f64 / smaller.key.particles_per_rank as f64)
            })
    }

    /// Inserts or replaces the entry for `key`.
    pub fn store(&mut self, key: PresetKey, caps: Caps) {
        self.version = VERSION;
        if let Some(e) = self.entries.iter_mut().find(|e| {
            e.key.same_settings(&key) && e.key.particles_per_rank == key.particles_per_rank
        }) {
            e.caps = caps;
        } else {
            self.entries.push(Preset { key, caps });
        }
    }
}

/// A presets file on disk.
#[derive(Debug, Clone)]
pub struct PresetsStore {
    path: PathBuf,
}

impl PresetsStore {
    /// The store at `path` (the file need not exist yet).
    pub fn new(path: PathBuf) -> Self {
        PresetsStore { path }
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the file: missing → empty; unreadable or corrupt → empty with a warning.
    pub fn load(&self) -> (PresetsFile, Option<String>) {
        let text = match crate::files::read_regular_text(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return (PresetsFile::default(), None);
            }
            Err(e) => {
                return (
                    PresetsFile::default(),
                    Some(format!(
                        "caps presets {} unreadable ({e}); starting without presets",
                        self.path.display()
                    )),
                );
            }
        };
        match serde_json::from_str::<PresetsFile>(&text) {
            Ok(f) if f.version == VERSION => (f, None),
            Ok(f) => (
                PresetsFile::default(),
                Some(format!(
                    "caps presets {} have format version {}, expected {VERSION}; starting without presets",
                    self.path.display(),
                    f.version
                )),
            ),
            Err(e) => (
                PresetsFile::default(),
                Some(format!(
                    "caps presets {} are corrupt ({e}); starting without presets",
                    self.path.display()
                )),
            ),
        }
    }

    /// Records `caps` for `key`: read, update, write to a temporary file, rename.
    pub fn save(&self, key: PresetKey, caps: Caps) -> Result<(), String> {
        let (mut file, _) = self.load();
        file.store(key, caps);
        let text = serde_json::to_string_pretty(&file).map_err(|e| e.to_string())?;
        let tmp = self
            .path
            .with_extension(format!("json.tmp{}", std::process::id()));
        std::fs::write(&tmp, text)
            .and_then(|()| std::fs::rename(&tmp, &self.path))
            .map_err(|e| format!("cannot write caps presets {}: {e}", self.path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u64) -> PresetKey {
        PresetKey {
            particles_per_rank: n,
            ranks: 1,
            leaf_size: 32,
            order: 4,
            theta: 0.5,
            backend: "cpu".into(),
        }
    }

    fn caps(v: usize) -> Caps {
        Caps {
            cells: v,
            m2l_pairs: 10 * v,
            p2p_pairs: 2 * v,
            let_cells: 3 * v,
            let_particles: 4 * v,
        }
    }

    #[test]
    fn lookup_rules() {
        let mut f = PresetsFile::default();
        assert_eq!(f.lookup(&key(1000)), None);
        f.store(key(1000), caps(100));
        f.store(key(4000), caps(400));
        f.store(key(8000), caps(800));
        // Exact.
        assert_eq!(f.lookup(&key(4000)), Some(caps(400)));
        // Nearest larger, as is.
        assert_eq!(f.lookup(&key(2000)), Some(caps(400)));
        assert_eq!(f.lookup(&key(500)), Some(caps(100)));
        // Nearest smaller, scaled by the particle ratio.
        assert_eq!(f.lookup(&key(16000)), Some(caps(1600)));
        // Other settings do not match.
        let mut other = key(4000);
        other.order = 6;
        assert_eq!(f.lookup(&other), None);
        // Replacing keeps one entry per key.
        f.store(key(4000), caps(500));
        assert_eq!(f.entries.len(), 3);
        assert_eq!(f.lookup(&key(4000)), Some(caps(500)));
    }

    #[test]
    fn corrupt_file_warns_and_starts_fresh() {
        let dir = tempfile::tempdir().unwrap();
        let store = PresetsStore::new(dir.path().join("caps.json"));
        let (f, w) = store.load();
        assert!(f.entries.is_empty() && w.is_none());
        store.save(key(10), caps(1)).unwrap();
        assert_eq!(store.load().0.lookup(&key(10)), Some(caps(1)));
        std::fs::write(store.path(), "{ not json").unwrap();
        let (f, w) = store.load();
        assert!(f.entries.is_empty());
        assert!(w.unwrap().contains("corrupt"));
        // Saving over a corrupt file replaces it.
        store.save(key(10), caps(2)).unwrap();
        assert_eq!(store.load().0.lookup(&key(10)), Some(caps(2)));
    }
}
