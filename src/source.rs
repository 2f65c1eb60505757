//! A TOML file's text and the errors that point into it: every config and model problem
//! as one sentence naming the file, the key (with line:column where the text can be
//! located) and the value. Shared by `config` (run files) and `ics` (model files), and
//! owning neither schema.

use serde::de::DeserializeOwned;
use std::fmt;
use std::path::{Path, PathBuf};
use thiserror::Error;

/// A problem with a config or model file.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The file could not be read at all.
    #[error("cannot read {path}: {reason}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why (OS error text).
        reason: String,
    },
    /// The TOML is malformed, has an unknown key, or a value of the wrong type.
    #[error("{path}:{location}: {key}{message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// line:column of the problem.
        location: Location,
        /// "key 'a.b': " when the key could be determined, else empty.
        key: String,
        /// The parser's description.
        message: String,
    },
    /// A value parsed but is not allowed.
    #[error("{path}{location}: key '{key}' = {value}: {reason}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// ":line:column" when the key was found in the text, else empty.
        location: OptionalLocation,
        /// Dotted key path.
        key: String,
        /// The value as written.
        value: String,
        /// What is wrong and what is expected.
        reason: String,
    },
}

/// A 1-based line and column in a text file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Location {
    /// Line number, from 1.
    pub line: usize,
    /// Column number (characters), from 1.
    pub column: usize,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.column)
    }
}

/// A location that may be unknown; displays as ":line:column" or nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionalLocation(pub Option<Location>);

impl fmt::Display for OptionalLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(loc) => write!(f, ":{loc}"),
            None => Ok(()),
        }
    }
}

/// A TOML file's text, kept so that validation errors can point into it.
#[derive(Debug, Clone)]
pub struct SourceText {
    /// Where it came from.
    pub path: PathBuf,
    /// Its full text.
    pub text: String,
}

impl SourceText {
    /// Reads a file.
    pub fn read(path: &Path) -> Result<Self, ConfigError> {
        let text = crate::files::read_regular_text(path).map_err(|e| ConfigError::Read {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        Ok(SourceText {
            path: path.to_path_buf(),
            text,
        })
    }

    /// Deserialises the text, turning parser errors into located, key-naming messages.
    pub fn parse<T: DeserializeOwned>(&self) -> Result<T, ConfigError> {
        toml::from_str(&self.text).map_err(|e| {
            let offset = e.span().map(|s| s.start).unwrap_or(0);
            let key = key_at(&self.text, offset)
                .map(|k| format!("key '{k}': "))
                .unwrap_or_default();
            ConfigError::Parse {
                path: self.path.clone(),
                location: location_of(&self.text, offset),
                key,
                message: e.message().trim().replace('\n', " "),
            }
        })
    }

    /// An "invalid value" error for `key`, located in the text when possible.
    pub fn invalid(
        &self,
        key: &str,
        value: impl fmt::Display,
        reason: impl Into<String>,
    ) -> ConfigError {
        ConfigError::Invalid {
            path: self.path.clone(),
            location: OptionalLocation(locate_key(&self.text, key)),
            key: key.to_string(),
            value: crate::format::short_text(&value.to_string()),
            reason: reason.into(),
        }
    }
}

/// Line and column of a byte offset.
pub fn location_of(text: &str, offset: usize) -> Location {
    let offset = offset.min(text.len());
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map(|i| i + 1).unwrap_or(0);
    Location {
        line,
        column: text[line_start..offset].chars().count() + 1,
    }
}

/// The header name of a `[table]` line, if `line` is one.
fn table_header(line: &str) -> Option<String> {
    let t = line.trim();
    if t.starts_with("[[") {
        return None;
    }
    let inner = t.strip_prefix('[')?.split(']').next()?;
    Some(inner.trim().replace(['"', ' '], ""))
}

/// The bare key of a `key = value` line.
fn line_key(line: &str) -> Option<String> {
    let t = line.trim();
    if t.starts_with('#') || t.starts_with('[') {
        return None;
    }
    let (k, _) = t.split_once('=')?;
    Some(k.trim().trim_matches('"').to_string())
}

/// The dotted key whose line contains `offset` (or the table whose header does).
fn key_at(text: &str, offset: usize) -> Option<String> {
    let loc = location_of(text, offset);
    let mut table = String::new();
    for (n, line) in text.lines().enumerate() {
        if let Some(h) = table_header(line) {
            table = h;
        }
        if n + 1 == loc.line {
            if let Some(h) = table_header(line) {
                return Some(h);
            }
            let k = line_key(line)?;
            return Some(if table.is_empty() {
                k
            } else {
                format!("{table}.{k}")
            });
        }
    }
    None
}

/// Where the value of dotted `key` starts in the text, if it is written as `key = value`
/// inside its `[table]` (the layout every shipped file uses).
fn locate_key(text: &str, key: &str) -> Option<Location> {
    let (table, leaf) = match key.rsplit_once('.') {
        Some((t, l)) => (t, l),
        None => ("", key),
    };
    let mut current = String::new();
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        if let Some(h) = table_header(line) {
            current = h;
        } else if current == table && line_key(line).as_deref() == Some(leaf) {
            let eq = line.find('=').unwrap_or(0);
            let value_start = eq + 1 + (line[eq + 1..].len() - line[eq + 1..].trim_start().len());
            return Some(location_of(text, offset + value_start));
        }
        offset += line.len();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locates_keys_and_offsets() {
        let text = "name = \"a\"\n[gravity]\nsoftening = -1.0\nkernel = \"plummer\"\n";
        let loc = locate_key(text, "gravity.softening").unwrap();
        assert_eq!((loc.line, loc.column), (3, 13));
        assert_eq!(locate_key(text, "name").unwrap().line, 1);
        assert!(locate_key(text, "gravity.missing").is_none());
        let off = text.find("-1.0").unwrap();
        assert_eq!(key_at(text, off).unwrap(), "gravity.softening");
    }
}
