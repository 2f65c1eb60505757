//! Snapshots in the GADGET-4 HDF5 layout (design §8), so yt, pynbody and h5py read them
//! unchanged; and a reader for GADGET-format files written by other codes.

use super::hdf5_util::{
    create_checksummed, create_group, damage, read_f64, read_f64_array, read_i64_array,
    read_string, vectors_to_array, write_array, write_dataset, write_scalar, write_string,
};
use crate::config::Precision;
use crate::format::short;
use crate::particles::{Component, Particles};
use crate::units::{CgsUnits, UnitSystem};
use ndarray::Array1;
use std::path::{Path, PathBuf};
use thiserror::Error;

/// Number of GADGET particle types.
pub const PART_TYPES: usize = 6;

/// A snapshot that could not be written or read.
#[derive(Debug, Error)]
pub enum SnapshotError {
    /// HDF5 refused an operation.
    #[error("{path}: {what}: {reason}")]
    Hdf5 {
        /// The file.
        path: PathBuf,
        /// What was being done.
        what: String,
        /// HDF5's message.
        reason: String,
    },
    /// The file opened but its content is not usable.
    #[error("{path}: {reason}")]
    Content {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// Everything about a snapshot other than the particles.
#[derive(Debug, Clone)]
pub struct SnapshotInfo<'a> {
    /// Simulation time.
    pub time: f64,
    /// Unit system of the values.
    pub units: UnitSystem,
    /// Coordinates/velocities precision.
    pub precision: Precision,
    /// Also write `Potential`.
    pub potential: bool,
    /// Also write `Acceleration`.
    pub acceleration: bool,
    /// Settings recorded under `/Parameters` as `leapfmm.<key>` attributes.
    pub parameters: Vec<(String, toml::Value)>,
    /// The full settings text (run config or model file), recorded as `leapfmm_config`.
    pub settings_text: Option<&'a str>,
    /// Set when this file is one of several that together hold the snapshot.
    pub multi_file: Option<MultiFile>,
    /// Plummer-equivalent softening length of each component (`Component::ALL` order), when
    /// known: written as GADGET-4's softening classes, from which pynbody takes `eps`.
    pub softening: Option<[f64; 4]>,
}

impl SnapshotInfo<'_> {
    /// A single-file snapshot at `time` with positions, velocities, masses and IDs only.
    pub fn new(time: f64, units: UnitSystem, precision: Precision) -> Self {
        SnapshotInfo {
            time,
            units,
            precision,
            potential: false,
            acceleration: false,
            parameters: Vec::new(),
            settings_text: None,
            multi_file: None,
            softening: None,
        }
    }
}

/// The set a file of a multi-file snapshot belongs to (GADGET `snapdir_NNN/snap_NNN.R.hdf5`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MultiFile {
    /// Files in the set (`NumFilesPerSnapshot`).
    pub files: u32,
    /// Particles per type over all files (`NumPart_Total`).
    pub total: [u64; PART_TYPES],
}

/// Particles per GADGET type in `particles`.
pub fn part_type_counts(particles: &Particles) -> [u64; PART_TYPES] {
    let mut counts = [0u64; PART_TYPES];
    for c in &particles.component {
        counts[c.part_type()] += 1;
    }
    counts
}

/// Writes one snapshot file atomically (temporary name, then rename), particles grouped by
/// `PartType` and sorted by ID within each group.
pub fn write_snapshot(
    path: &Path,
    particles: &Particles,
    info: &SnapshotInfo,
) -> Result<(), SnapshotError> {
    let tmp = temporary_name(path);
    let result = write_file(&tmp, particles, info).map_err(|e| SnapshotError::Hdf5 {
        path: path.to_path_buf(),
        what: "writing snapshot".into(),
        reason: e.to_string(),
    });
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, path).map_err(|e| SnapshotError::Content {
        path: path.to_path_buf(),
        reason: format!("cannot move the finished snapshot into place: {e}"),
    })
}

/// `dir/.name.tmp` for `dir/name`.
fn temporary_name(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.tmp"))
}

fn write_file(path: &Path, particles: &Particles, info: &SnapshotInfo) -> hdf5::Result<()> {
    let file = create_checksummed(path)?;
    let mut by_type: Vec<Vec<usize>> = vec![Vec::new(); PART_TYPES];
    for c in Component::ALL {
        let mut idx = particles.indices_of(c);
        idx.sort_by_key(|&i| particles.id[i]);
        by_type[c.part_type()].extend(idx);
    }
    let counts: Vec<u32> = by_type.iter().map(|v| v.len() as u32).collect();
    let (files, total) = match info.multi_file {
        Some(m) => (m.files, m.total.to_vec()),
        None => (1, by_type.iter().map(|v| v.len() as u64).collect()),
    };
    let total_low: Vec<u32> = total.iter().map(|&t| t as u32).collect();
    let high: Vec<u32> = total.iter().map(|&t| (t >> 32) as u32).collect();
    let double = info.precision == Precision::Double;

    let header = create_group(&file, "Header")?;
    write_array(&header, "NumPart_ThisFile", &counts)?;
    write_array(&header, "NumPart_Total", &total_low)?;
    write_array(&header, "NumPart_Total_HighWord", &high)?;
    write_array(&header, "MassTable", &[0.0f64; PART_TYPES])?;
    write_scalar(&header, "Time", info.time)?;
    write_scalar(&header, "Redshift", 0.0f64)?;
    write_scalar(&header, "BoxSize", 0.0f64)?;
    write_scalar(&header, "NumFilesPerSnapshot", files as i32)?;
    write_scalar(&header, "Omega0", 0.0f64)?;
    write_scalar(&header, "OmegaLambda", 0.0f64)?;
    write_scalar(&header, "HubbleParam", 1.0f64)?;
    for flag in [
        "Flag_Sfr",
        "Flag_Cooling",
        "Flag_StellarAge",
        "Flag_Metals",
        "Flag_Feedback",
    ] {
        write_scalar(&header, flag, 0i32)?;
    }
    write_scalar(&header, "Flag_DoublePrecision", i32::from(double))?;

    write_units(&file, info.units)?;
    write_parameters(&file, info)?;

    for (pt, idx) in by_type.iter().enumerate() {
        if idx.is_empty() {
            continue;
        }
        let g = create_group(&file, &format!("PartType{pt}"))?;
        let pick3 = |v: &[[f64; 3]]| idx.iter().map(|&i| v[i]).collect::<Vec<_>>();
        let pick1 = |v: &[f64]| Array1::from_iter(idx.iter().map(|&i| v[i]));
        let vectors = [
            ("Coordinates", &particles.pos, true),
            ("Velocities", &particles.vel, true),
            ("Acceleration", &particles.acc, info.acceleration),
        ];
        for (name, data, wanted) in vectors {
            if !wanted {
                continue;
            }
            let sel = pick3(data);
            if double {
                write_dataset(&g, name, &vectors_to_array(&sel, |x| x))?;
            } else {
                write_dataset(&g, name, &vectors_to_array(&sel, |x| x as f32))?;
            }
        }
        let ids = Array1::from_iter(idx.iter().map(|&i| particles.id[i]));
        write_dataset(&g, "ParticleIDs", &ids)?;
        write_dataset(&g, "Masses", &pick1(&particles.mass))?;
        if info.potential {
            if double {
                write_dataset(&g, "Potential", &pick1(&particles.pot))?;
            } else {
                write_dataset(&g, "Potential", &pick1(&particles.pot).mapv(|x| x as f32))?;
            }
        }
    }
    Ok(())
}

/// SWIFT-style `/Units` group of cgs conversion factors (all 1 for N-body units).
fn write_units(file: &hdf5::File, units: UnitSystem) -> hdf5::Result<()> {
    let g = create_group(file, "Units")?;
    let c = units.cgs().unwrap_or(CgsUnits {
        length_cm: 1.0,
        mass_g: 1.0,
        velocity_cm_per_s: 1.0,
    });
    write_scalar(&g, "Unit length in cgs (U_L)", c.length_cm)?;
    write_scalar(&g, "Unit mass in cgs (U_M)", c.mass_g)?;
    write_scalar(&g, "Unit time in cgs (U_t)", c.time_s())?;
    write_scalar(&g, "Unit current in cgs (U_I)", 1.0f64)?;
    write_scalar(&g, "Unit temperature in cgs (U_T)", 1.0f64)?;
    // GADGET's names as well: pynbody takes units only from /Units when the group exists,
    // and looks for these (all 1 for N-body units, as the SWIFT factors are).
    write_scalar(&g, "UnitLength_in_cm", c.length_cm)?;
    write_scalar(&g, "UnitMass_in_g", c.mass_g)?;
    write_scalar(&g, "UnitVelocity_in_cm_per_s", c.velocity_cm_per_s)?;
    write_scalar(&g, "UnitTime_in_s", c.time_s())?;
    write_string(&g, "UnitSystem", units.name())
}

/// `/Parameters`: GADGET-4 unit parameters (read by yt) plus every key of the run config
/// and its full text.
fn write_parameters(file: &hdf5::File, info: &SnapshotInfo) -> hdf5::Result<()> {
    let g = create_group(file, "Parameters")?;
    if let Some(c) = info.units.cgs() {
        write_scalar(&g, "UnitLength_in_cm", c.length_cm)?;
        write_scalar(&g, "UnitMass_in_g", c.mass_g)?;
        write_scalar(&g, "UnitVelocity_in_cm_per_s", c.velocity_cm_per_s)?;
    }
    write_scalar(
        &g,
        "GravityConstantInternal",
        info.units.gravitational_constant(),
    )?;
    write_scalar(&g, "ComovingIntegrationOn", 0i32)?;
    write_scalar(&g, "TimeBegin", 0.0f64)?;
    // pynbody reads a non-cosmological snapshot's time only from Time_GYR (otherwise it
    // computes the age of a default universe). N-body units count seconds (factor 1).
    let time_s = info.units.cgs().map_or(1.0, |c| c.time_s());
    write_scalar(&g, "Time_GYR", info.time * time_s / crate::units::GYR_S)?;
    if let Some(eps) = info.softening {
        // GADGET-4's form: one softening class per particle type (class t for type t).
        for c in Component::ALL {
            let t = c.part_type();
            write_scalar(&g, &format!("SofteningClassOfPartType{t}"), t as i32)?;
            write_scalar(&g, &format!("SofteningComovingClass{t}"), eps[c.index()])?;
            write_scalar(&g, &format!("SofteningMaxPhysClass{t}"), eps[c.index()])?;
        }
    }
    if let Some(text) = info.settings_text {
        write_string(&g, "leapfmm_config", text)?;
    }
    for (key, value) in &info.parameters {
        let name = format!("leapfmm.{key}");
        match value {
            toml::Value::Float(x) => write_scalar(&g, &name, *x)?,
            toml::Value::Integer(x) => write_scalar(&g, &name, *x)?,
            toml::Value::Boolean(x) => write_scalar(&g, &name, i32::from(*x))?,
            toml::Value::String(s) => write_string(&g, &name, s)?,
            other => write_string(&g, &name, &other.to_string())?,
        }
    }
    Ok(())
}

/// A snapshot read back from disk.
#[derive(Debug, Clone)]
pub struct SnapshotData {
    /// The particles in file order (PartType by PartType, file by file); accelerations and
    /// potentials zero. Velocities are empty when read with `Velocities::Skip`.
    pub particles: Particles,
    /// `Header/Time`.
    pub time: f64,
    /// Code units in cgs when the file records them.
    pub units: Option<CgsUnits>,
    /// Whether the file says it is in N-body units (`/Units/UnitSystem = "nbody"`).
    pub nbody: bool,
    /// Files the snapshot was spread over.
    pub files: Vec<PathBuf>,
    /// Particles per type in each file.
    pub counts: Vec<[u64; PART_TYPES]>,
}

/// The units a file records.
#[derive(Debug, Clone, Copy, PartialEq)]
enum FileUnits {
    /// Physical units, as cgs factors.
    Cgs(CgsUnits),
    /// Labelled N-body units.
    Nbody,
    /// None recorded.
    Unknown,
}

/// Whether to read velocities (a force evaluation does not need them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Velocities {
    /// Read them.
    Read,
    /// Leave `Particles::vel` empty.
    Skip,
}

/// Reads a GADGET-format HDF5 snapshot or IC file (leapfmm's own or another code's), single-
/// or multi-file. Masses come from `Masses` or, where absent, from `Header/MassTable`.
/// Non-finite values, gas particles and duplicate IDs are rejected.
pub fn read_snapshot(path: &Path) -> Result<SnapshotData, SnapshotError> {
    read_snapshot_with(path, Velocities::Read)
}

/// `read_snapshot`, optionally without velocities.
pub fn read_snapshot_with(
    path: &Path,
    velocities: Velocities,
) -> Result<SnapshotData, SnapshotError> {
    let first = read_one(path, velocities)?;
    let mut files = vec![path.to_path_buf()];
    let mut data = first.0;
    if first.1 > 1 {
        let stem = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".0.hdf5"))
            .ok_or_else(|| SnapshotError::Content {
                path: path.to_path_buf(),
                reason: format!(
                    "the header says the snapshot is spread over {} files, but the name does not end in .0.hdf5",
                    first.1
                ),
            })?;
        // One sibling at a time, so that a huge NumFilesPerSnapshot stops at the first
        // file that is not there instead of listing them all.
        for k in 1..first.1 {
            let sibling = path.with_file_name(format!("{stem}.{k}.hdf5"));
            if !sibling.is_file() {
                return Err(SnapshotError::Content {
                    path: path.to_path_buf(),
                    reason: format!(
                        "Header/NumFilesPerSnapshot = {} but {} does not exist",
                        first.1,
                        sibling.display()
                    ),
                });
            }
            let (part, _) = read_one(&sibling, velocities)?;
            data.particles.extend(part.particles);
            data.counts.extend(part.counts);
            files.push(sibling);
        }
    }
    check_total(path, &data.counts)?;
    let mut ids = data.particles.id.clone();
    ids.sort_unstable();
    if let Some(w) = ids.windows(2).find(|w| w[0] == w[1]) {
        return Err(SnapshotError::Content {
            path: path.to_path_buf(),
            reason: format!("particle ID {} appears more than once", w[0]),
        });
    }
    data.files = files;
    Ok(data)
}

fn read_one(path: &Path, velocities: Velocities) -> Result<(SnapshotData, usize), SnapshotError> {
    let err = |what: &str| {
        let what = what.to_string();
        move |e: hdf5::Error| hdf5_error(path, &what, &e)
    };
    let content = |reason: String| SnapshotError::Content {
        path: path.to_path_buf(),
        reason,
    };
    match std::fs::metadata(path) {
        Err(_) => return Err(content("no such file".into())),
        // Checked before HDF5 opens it: opening a FIFO blocks.
        Ok(m) if !m.is_file() => {
            return Err(content(
                "not a regular file (a folder, FIFO or device); refusing to read it".into(),
            ));
        }
        Ok(_) => {}
    }
    let file = hdf5::File::open(path).map_err(err("opening as HDF5"))?;
    let header = file.group("Header").map_err(|e| match damage(&e) {
        Some(_) => hdf5_error(path, "reading Header", &e),
        None => content("no /Header group: not a GADGET-format HDF5 file".into()),
    })?;
    check_metadata_intact(path, &file)?;
    let counts = read_i64_array(&header, "NumPart_ThisFile")
        .map_err(err("reading Header/NumPart_ThisFile"))?;
    if let Some((pt, c)) = counts.iter().enumerate().find(|(_, c)| **c < 0) {
        return Err(content(format!(
            "Header/NumPart_ThisFile[{pt}] = {c}: a particle count cannot be negative"
        )));
    }
    let counts: Vec<u64> = counts.iter().map(|&c| c as u64).collect();
    let mass_table = read_f64_array(&header, "MassTable").unwrap_or_else(|_| vec![0.0; PART_TYPES]);
    let time = if header.attr("Time").is_ok() {
        match read_f64(&header, "Time") {
            Ok(t) if t.is_finite() => t,
            Ok(t) => return Err(content(format!("Header/Time = {t}: it must be finite"))),
            Err(_) => return Err(content("Header/Time is not a number".into())),
        }
    } else {
        0.0
    };
    let num_files = read_f64(&header, "NumFilesPerSnapshot").unwrap_or(1.0);
    if !(num_files.is_finite() && num_files >= 0.0 && num_files.fract() == 0.0) {
        return Err(content(format!(
            "Header/NumFilesPerSnapshot = {}: it must be a whole number of files",
            short(num_files)
        )));
    }
    let num_files = (num_files as usize).max(1);
    if counts.first().copied().unwrap_or(0) > 0 {
        return Err(content(format!(
            "the file holds {} gas particles (PartType0); leapfmm is collisionless and cannot evolve gas",
            counts[0]
        )));
    }
    let mut particles = Particles::default();
    for (pt, &count) in counts.iter().enumerate().take(PART_TYPES).skip(1) {
        if count == 0 {
            continue;
        }
        let n = count as usize;
        let component = Component::from_part_type(pt).unwrap_or(Component::Generic);
        let group = format!("PartType{pt}");
        let g = file.group(&group).map_err(|e| match damage(&e) {
            Some(_) => hdf5_error(path, &format!("reading {group}"), &e),
            None => content(format!(
                "Header says {n} particles of {group}, but the group is missing"
            )),
        })?;
        let read3 = |name: &str| -> Result<Vec<[f64; 3]>, SnapshotError> {
            let ds = g
                .dataset(name)
                .map_err(err(&format!("reading {group}/{name}")))?;
            check_stored(&ds, &[n, 3]).map_err(|r| content(format!("{group}/{name} {r}")))?;
            let raw = ds
                .read_raw::<f64>()
                .map_err(err(&format!("reading {group}/{name}")))?;
            if raw.len() != 3 * n {
                return Err(content(format!(
                    "{group}/{name} has {} values, expected {} for {n} particles",
                    raw.len(),
                    3 * n
                )));
            }
            let v: Vec<[f64; 3]> = raw.chunks_exact(3).map(|c| [c[0], c[1], c[2]]).collect();
            check_finite3(&v, &group, name).map_err(&content)?;
            Ok(v)
        };
        let pos = read3("Coordinates")?;
        let vel = match velocities {
            Velocities::Read => read3("Velocities")?,
            Velocities::Skip => Vec::new(),
        };
        let ids = g
            .dataset("ParticleIDs")
            .map_err(err(&format!("reading {group}/ParticleIDs")))?;
        check_stored(&ids, &[n]).map_err(|r| content(format!("{group}/ParticleIDs {r}")))?;
        let ids = ids
            .read_raw::<u64>()
            .map_err(err(&format!("reading {group}/ParticleIDs")))?;
        if ids.len() != n {
            return Err(content(format!(
                "{group}/ParticleIDs has {} entries, expected {n}",
                ids.len()
            )));
        }
        let masses = if g.link_exists("Masses") {
            let m = g
                .dataset("Masses")
                .map_err(err(&format!("reading {group}/Masses")))?;
            check_stored(&m, &[n]).map_err(|r| content(format!("{group}/Masses {r}")))?;
            let m = m
                .read_raw::<f64>()
                .map_err(err(&format!("reading {group}/Masses")))?;
            if m.len() != n {
                return Err(content(format!(
                    "{group}/Masses has {} entries, expected {n}",
                    m.len()
                )));
            }
            m
        } else {
            let m = mass_table.get(pt).copied().unwrap_or(0.0);
            if m <= 0.0 {
                return Err(content(format!(
                    "{group} has no Masses dataset and Header/MassTable[{pt}] is {m}; give particle masses one way or the other"
                )));
            }
            vec![m; n]
        };
        if let Some((i, m)) = masses
            .iter()
            .enumerate()
            .find(|(_, m)| !(m.is_finite() && **m > 0.0))
        {
            return Err(content(format!(
                "{group}/Masses[{i}] = {m}: masses must be positive and finite"
            )));
        }
        particles.pos.extend(pos);
        particles.vel.extend(vel);
        particles.mass.extend(masses);
        particles.id.extend(ids);
        particles
            .component
            .extend(std::iter::repeat_n(component, n));
    }
    let n = particles.pos.len();
    particles.acc = vec![[0.0; 3]; n];
    particles.pot = vec![0.0; n];
    let mut per_type = [0u64; PART_TYPES];
    for (k, c) in counts.iter().enumerate().take(PART_TYPES) {
        per_type[k] = *c;
    }
    let file_units = read_units(&file).map_err(content)?;
    Ok((
        SnapshotData {
            particles,
            time,
            units: match file_units {
                FileUnits::Cgs(u) => Some(u),
                _ => None,
            },
            nbody: file_units == FileUnits::Nbody,
            files: Vec::new(),
            counts: vec![per_type],
        },
        num_files,
    ))
}

/// Checks `Header/NumPart_Total` (with its high word), where the first file has it, against
/// the counts of all files read.
fn check_total(path: &Path, counts: &[[u64; PART_TYPES]]) -> Result<(), SnapshotError> {
    let content = |reason: String| SnapshotError::Content {
        path: path.to_path_buf(),
        reason,
    };
    let header = hdf5::File::open(path)
        .and_then(|f| f.group("Header"))
        .map_err(|e| content(e.to_string()))?;
    let Ok(low) = read_i64_array(&header, "NumPart_Total") else {
        return Ok(());
    };
    let high = read_i64_array(&header, "NumPart_Total_HighWord").unwrap_or_default();
    for (pt, &l) in low.iter().enumerate().take(PART_TYPES) {
        let h = high.get(pt).copied().unwrap_or(0);
        // GADGET splits a total past 2^32 into a low and a high word; some codes write the
        // whole count in the low one.
        let declared = if l as u64 > 0xffff_ffff {
            l as u64
        } else {
            l as u64 | ((h as u64) << 32)
        };
        let found: u64 = counts.iter().map(|c| c[pt]).sum();
        if l < 0 || h < 0 || declared != found {
            return Err(content(format!(
                "Header/NumPart_Total[{pt}] = {declared} but the {} file(s) hold {found} particles of PartType{pt}",
                counts.len()
            )));
        }
    }
    Ok(())
}

/// Opens every group and attribute once, so that a failed metadata checksum is reported as
/// damage instead of read as an absent attribute (a damaged `Header/Time` must not become
/// time 0). Other errors are left to the reads that need the object.
fn check_metadata_intact(path: &Path, file: &hdf5::File) -> Result<(), SnapshotError> {
    let groups = file
        .member_names()
        .map_err(|e| hdf5_error(path, "reading the file's groups", &e))?;
    for group in groups {
        let g = match file.group(&group) {
            Ok(g) => g,
            Err(e) if damage(&e).is_some() => {
                return Err(hdf5_error(path, &format!("reading {group}"), &e));
            }
            Err(_) => continue,
        };
        let names = g
            .attr_names()
            .map_err(|e| hdf5_error(path, &format!("reading {group}"), &e))?;
        for name in names {
            if let Err(e) = g.attr(&name)
                && damage(&e).is_some()
            {
                return Err(hdf5_error(path, &format!("reading {group}/{name}"), &e));
            }
        }
    }
    Ok(())
}

/// An HDF5 failure while `what` ("reading X") was done; a failed checksum is said as damage
/// to X, in one sentence.
fn hdf5_error(path: &Path, what: &str, e: &hdf5::Error) -> SnapshotError {
    match damage(e) {
        Some(kind) => SnapshotError::Content {
            path: path.to_path_buf(),
            reason: format!(
                "{} is damaged: {kind}, so the file changed after it was written; use an intact copy",
                what.strip_prefix("reading ").unwrap_or(what)
            ),
        },
        None => SnapshotError::Hdf5 {
            path: path.to_path_buf(),
            what: what.to_string(),
            reason: e.to_string(),
        },
    }
}

/// Most a compression filter can shrink data (deflate's limit is about 1 032 : 1).
const MAX_COMPRESSION: u64 = 1100;

/// Checks, before anything is allocated, that a dataset has `shape` (from the header's
/// count) and a numeric type, and that the file really stores them: a crafted header with a
/// huge count over an unwritten chunked dataset must not make the reader allocate it.
fn check_stored(ds: &hdf5::Dataset, shape: &[usize]) -> Result<(), String> {
    // By shape, not by count: (3, n) or a flat (3n,) would scramble the particles.
    if ds.shape() != shape {
        return Err(format!(
            "has shape {:?}, expected {shape:?} from Header/NumPart_ThisFile",
            ds.shape()
        ));
    }
    let numeric = ds.dtype().and_then(|t| t.to_descriptor()).is_ok_and(|d| {
        use hdf5::types::TypeDescriptor as T;
        matches!(d, T::Integer(_) | T::Unsigned(_) | T::Float(_))
    });
    if !numeric {
        return Err("is not numeric (integers or floats expected)".into());
    }
    let values: usize = shape.iter().product();
    let element = ds.dtype().map(|t| t.size()).unwrap_or(8) as u64;
    let logical = values as u64 * element;
    let stored = ds.storage_size();
    let limit = if ds.filters().is_empty() {
        stored
    } else {
        stored.saturating_mul(MAX_COMPRESSION)
    };
    if logical > limit {
        return Err(format!(
            "declares {values} values ({logical} bytes) but the file stores only {stored} bytes of them"
        ));
    }
    Ok(())
}

/// The first non-finite component of a vector dataset, as a message naming it.
fn check_finite3(v: &[[f64; 3]], group: &str, name: &str) -> Result<(), String> {
    for (i, x) in v.iter().enumerate() {
        if let Some(bad) = x.iter().find(|c| !c.is_finite()) {
            return Err(format!(
                "{group}/{name}[{i}] contains {bad}; every value must be finite"
            ));
        }
    }
    Ok(())
}

/// Code units recorded in a file: SWIFT `/Units` or GADGET `/Parameters` (or `/Header`).
fn read_units(file: &hdf5::File) -> Result<FileUnits, String> {
    // A unit factor that is present must be a positive, finite number: a negative mass unit
    // would make every mass negative, zero every velocity infinite.
    let factor = |g: &hdf5::Group, group: &str, name: &str| -> Result<Option<f64>, String> {
        if g.attr(name).is_err() {
            return Ok(None);
        }
        match read_f64(g, name) {
            Ok(v) if v.is_finite() && v > 0.0 => Ok(Some(v)),
            Ok(v) => Err(format!(
                "/{group}/{name} = {}: a unit must be a positive, finite number",
                short(v)
            )),
            Err(_) => Err(format!("/{group}/{name} is not a number")),
        }
    };
    if let Ok(g) = file.group("Units") {
        if let Ok(name) = read_string(&g, "UnitSystem")
            && name == "nbody"
        {
            return Ok(FileUnits::Nbody);
        }
        let l = factor(&g, "Units", "Unit length in cgs (U_L)")?;
        let m = factor(&g, "Units", "Unit mass in cgs (U_M)")?;
        let t = factor(&g, "Units", "Unit time in cgs (U_t)")?;
        if let (Some(l), Some(m), Some(t)) = (l, m, t) {
            return Ok(FileUnits::Cgs(CgsUnits {
                length_cm: l,
                mass_g: m,
                velocity_cm_per_s: l / t,
            }));
        }
        return Ok(FileUnits::Unknown);
    }
    for group in ["Parameters", "Header"] {
        if let Ok(g) = file.group(group) {
            let l = factor(&g, group, "UnitLength_in_cm")?;
            let m = factor(&g, group, "UnitMass_in_g")?;
            let v = factor(&g, group, "UnitVelocity_in_cm_per_s")?;
            if let (Some(l), Some(m), Some(v)) = (l, m, v) {
                return Ok(FileUnits::Cgs(CgsUnits {
                    length_cm: l,
                    mass_g: m,
                    velocity_cm_per_s: v,
                }));
            }
        }
    }
    Ok(FileUnits::Unknown)
}

/// A number from `/Parameters` (e.g. `GravityConstantInternal`, `leapfmm.gravity.softening`).
pub fn read_parameter_f64(path: &Path, name: &str) -> Option<f64> {
    let file = hdf5::File::open(path).ok()?;
    let group = file.group("Parameters").ok()?;
    read_f64(&group, name).ok()
}

/// A string from `/Parameters`.
pub fn read_parameter_string(path: &Path, name: &str) -> Option<String> {
    let file = hdf5::File::open(path).ok()?;
    let group = file.group("Parameters").ok()?;
    read_string(&group, name).ok()
}

/// Writes `Acceleration` and `Potential` datasets into existing snapshot files (replacing
/// any already there), splitting `acc`/`pot` by the files' per-type counts in file order.
/// Stored in the precision of each group's `Coordinates`.
pub fn write_forces(
    data: &SnapshotData,
    acc: &[[f64; 3]],
    pot: &[f64],
) -> Result<(), SnapshotError> {
    let mut offset = 0;
    for (path, counts) in data.files.iter().zip(&data.counts) {
        let fail = |e: hdf5::Error| SnapshotError::Hdf5 {
            path: path.clone(),
            what: "writing Acceleration and Potential".into(),
            reason: e.to_string(),
        };
        let file = hdf5::File::open_rw(path).map_err(fail)?;
        for (pt, &count) in counts.iter().enumerate().skip(1) {
            let n = count as usize;
            if n == 0 {
                continue;
            }
            let g = file.group(&format!("PartType{pt}")).map_err(fail)?;
            let double = g
                .dataset("Coordinates")
                .and_then(|d| d.dtype())
                .map(|t| t.size() == 8)
                .unwrap_or(false);
            for name in ["Acceleration", "Potential"] {
                if g.link_exists(name) {
                    g.unlink(name).map_err(fail)?;
                }
            }
            let a = &acc[offset..offset + n];
            let p = Array1::from_iter(pot[offset..offset + n].iter().copied());
            if double {
                write_dataset(&g, "Acceleration", &vectors_to_array(a, |x| x)).map_err(fail)?;
                write_dataset(&g, "Potential", &p).map_err(fail)?;
            } else {
                write_dataset(&g, "Acceleration", &vectors_to_array(a, |x| x as f32))
                    .map_err(fail)?;
                write_dataset(&g, "Potential", &p.mapv(|x| x as f32)).map_err(fail)?;
            }
            offset += n;
        }
    }
    Ok(())
}
