//! The run-file schema (TOML), its validation, and error messages that point at the culprit.
//!
//! Every problem is reported before any work starts, as one sentence naming the file, the key
//! (with line:column where the text can be located) and the offending value. Relative paths
//! inside a config are taken from the current working directory, as in GADGET and SWIFT.
//!
//! Owns the run schema and its validation (defaults of the FMM come from `fmm`). Must not
//! read model files' contents beyond `ics::ModelFile`, or start any work.

use crate::fmm::expansion::MAX_ORDER;
use crate::fmm::p2p::NearFieldPrecision;
use crate::format::short;
use crate::gravity::external::{ExternalEntry, ExternalPotential, ExternalProfile};
use crate::gravity::{Softening, SofteningKernel};
use crate::ics::ModelFile;
use crate::ics::encounter::{Encounter, GalaxyEntry, OrbitEntry};
use crate::integrate::timestep::MAX_LEVEL;
use crate::units::UnitSystem;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

pub use crate::source::{ConfigError, Location, OptionalLocation, SourceText, location_of};

// ------------------------------------------------------------------------------------------
// Schema
// ------------------------------------------------------------------------------------------

/// One run: what to simulate, how, and what to write. See `docs/config.md`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    /// Run name; the run's folder is `output_dir/name`.
    pub name: String,
    /// Parent folder of the run folder.
    #[serde(default = "default_output_dir")]
    pub output_dir: PathBuf,
    /// Seed of every random stream of the run.
    #[serde(default)]
    pub seed: u64,
    /// Unit system of every quantity in the run.
    #[serde(default)]
    pub units: UnitSystem,
    /// Initial conditions.
    pub ics: IcsConfig,
    /// Force solver.
    pub gravity: GravityConfig,
    /// Time integration.
    pub integrator: IntegratorConfig,
    /// Snapshots, checkpoints and diagnostics.
    #[serde(default)]
    pub output: OutputConfig,
}

fn default_output_dir() -> PathBuf {
    PathBuf::from("runs")
}

/// `[ics]`: either a model file with a particle count, or an existing snapshot file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IcsConfig {
    /// Model file (TOML, see `ics/`).
    pub model: Option<PathBuf>,
    /// Particle count for `model`.
    pub n: Option<i64>,
    /// GADGET-format HDF5 initial-conditions file.
    pub file: Option<PathBuf>,
    /// Several galaxies (`[[ics.galaxies]]`), in place of `model`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub galaxies: Vec<GalaxyEntry>,
    /// The Keplerian orbit that places two `galaxies`.
    pub orbit: Option<OrbitEntry>,
}

/// Which force solver a run uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum SolverKind {
    /// The fast multipole method.
    #[default]
    Fmm,
    /// Direct summation, O(N^2), f64: the reference.
    Direct,
}

/// Where the FMM's passes run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// GPU 0 when this machine has a CUDA device and the run can use it, else the CPU;
    /// the run says which.
    #[default]
    Auto,
    /// The CPU.
    Cpu,
    /// GPU 0; a run that cannot use it stops with the reason.
    Cuda,
}

/// `[gravity]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GravityConfig {
    /// Force solver.
    #[serde(default)]
    pub solver: SolverKind,
    /// Where the FMM's passes run (`--backend` overrides it).
    #[serde(default)]
    pub backend: Backend,
    /// Plummer-equivalent softening length (0 = Newtonian).
    pub softening: f64,
    /// Softening kernel.
    #[serde(default)]
    pub kernel: SofteningKernel,
    /// FMM expansion order (default: `DEFAULT_ORDER`, or `ACCURATE_ORDER` with an accuracy
    /// target; `Gravity::order`).
    pub order: Option<i64>,
    /// FMM opening angle parameter.
    #[serde(default = "default_theta")]
    pub theta: f64,
    /// Relative force error the FMM holds every particle to (the error-controlled MAC;
    /// default `DEFAULT_ACCURACY`, `GravityConfig::accuracy`); 0 for the geometric MAC of
    /// `theta` alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accuracy: Option<f64>,
    /// Most particles in an FMM leaf.
    #[serde(default = "default_leaf_size")]
    pub leaf_size: i64,
    /// Precision of the FMM near field.
    #[serde(default)]
    pub near_field: NearFieldPrecision,
    /// Caps presets file; default `output_dir/caps_presets.json`.
    pub caps_presets: Option<PathBuf>,
    /// Factor an overflowed buffer capacity grows by.
    #[serde(default = "default_cap_growth")]
    pub cap_growth: f64,
    /// Rigid external potentials (`[[gravity.external]]`), summed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub external: Vec<ExternalEntry>,
}

pub use crate::fmm::solver::{
    DEFAULT_ACCURACY, DEFAULT_LEAF_SIZE, DEFAULT_ORDER, DEFAULT_THETA, default_order,
};

fn default_theta() -> f64 {
    DEFAULT_THETA
}
fn default_leaf_size() -> i64 {
    DEFAULT_LEAF_SIZE as i64
}
fn default_cap_growth() -> f64 {
    2.0
}

impl GravityConfig {
    /// The FMM expansion order: the one given, else the default for the accuracy target.
    pub fn order(&self) -> usize {
        self.order_for(self.accuracy())
    }

    /// The expansion order at `accuracy`: the one given, else `default_order(accuracy)`.
    pub fn order_for(&self, accuracy: f64) -> usize {
        self.order
            .map_or_else(|| default_order(accuracy), |o| o.max(1) as usize)
    }

    /// The accuracy target: the one given, else `DEFAULT_ACCURACY` (0: the opening angle
    /// alone).
    pub fn accuracy(&self) -> f64 {
        self.accuracy.unwrap_or(DEFAULT_ACCURACY)
    }

    /// The accuracy target the run holds on the GPU backend (`gpu`) or the CPU: the device
    /// walk has no error test yet, so there it is 0 (a target the config asks for is
    /// refused before, `simulation::choose_backend`).
    pub fn accuracy_on(&self, gpu: bool) -> f64 {
        if gpu { 0.0 } else { self.accuracy() }
    }

    /// The softening this section describes.
    pub fn softening(&self) -> Softening {
        Softening {
            kernel: self.kernel,
            epsilon: self.softening,
        }
    }
}

/// `[integrator]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IntegratorConfig {
    /// End time of the run.
    pub t_end: f64,
    /// Largest step; every step is `dt_max / 2^k`.
    pub dt_max: f64,
    /// Accuracy parameter of `dt = eta sqrt(eps / max|a|)`.
    #[serde(default = "default_eta")]
    pub eta: f64,
    /// Use `dt_max` for every step, ignoring the acceleration criterion.
    #[serde(default)]
    pub fixed_step: bool,
    /// One step for everybody, or each particle on its own power-of-two rung.
    #[serde(default)]
    pub scheme: StepScheme,
    /// Deepest rung of the block scheme: steps down to `dt_max / 2^max_rungs`.
    #[serde(default = "default_max_rungs")]
    pub max_rungs: i64,
}

/// How steps are shared among the particles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum StepScheme {
    /// Every particle takes the step its fastest one needs.
    #[default]
    Global,
    /// Hierarchical (block) steps: each particle on the rung `dt_max / 2^k` its own
    /// acceleration asks for; forces only for the particles whose step ends.
    Block,
}

fn default_eta() -> f64 {
    0.15
}

fn default_max_rungs() -> i64 {
    16
}

/// Storage precision of snapshot coordinates and velocities.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// f32 (GADGET default).
    #[default]
    Single,
    /// f64.
    Double,
}

/// `[output]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputConfig {
    /// Simulation time between snapshots (a whole multiple of `dt_max`); none = first and last only.
    pub snapshot_interval: Option<f64>,
    /// Simulation time between checkpoints (a whole multiple of `dt_max`).
    pub checkpoint_interval: Option<f64>,
    /// Wall-clock minutes between checkpoints.
    #[serde(default = "default_checkpoint_minutes")]
    pub checkpoint_wall_minutes: f64,
    /// How many checkpoints to keep.
    #[serde(default = "default_keep")]
    pub keep_checkpoints: i64,
    /// Snapshot precision of coordinates and velocities.
    #[serde(default)]
    pub snapshot_precision: Precision,
    /// Write `Potential` in snapshots.
    #[serde(default)]
    pub snapshot_potential: bool,
    /// Write `Acceleration` in snapshots.
    #[serde(default)]
    pub snapshot_acceleration: bool,
    /// Write a diagnostics row every this many steps.
    #[serde(default = "default_diagnostics_every")]
    pub diagnostics_every: i64,
}

fn default_checkpoint_minutes() -> f64 {
    30.0
}
fn default_keep() -> i64 {
    3
}
fn default_diagnostics_every() -> i64 {
    1
}

impl Default for OutputConfig {
    fn default() -> Self {
        OutputConfig {
            snapshot_interval: None,
            checkpoint_interval: None,
            checkpoint_wall_minutes: default_checkpoint_minutes(),
            keep_checkpoints: default_keep(),
            snapshot_precision: Precision::default(),
            snapshot_potential: false,
            snapshot_acceleration: false,
            diagnostics_every: default_diagnostics_every(),
        }
    }
}

// ------------------------------------------------------------------------------------------
// Validation
// ------------------------------------------------------------------------------------------

/// Where the initial particles come from, after validation.
#[derive(Debug, Clone)]
pub enum IcSource {
    /// Sample a model.
    Model {
        /// The model file.
        path: PathBuf,
        /// Its parsed content.
        model: Box<ModelFile>,
        /// Particle count.
        n: usize,
    },
    /// Sample several galaxies and place them (`[[ics.galaxies]]`).
    Galaxies(Box<Encounter>),
    /// Read a GADGET-format HDF5 file.
    File {
        /// The file.
        path: PathBuf,
    },
}

/// A run config that passed every check, with everything derived from it.
#[derive(Debug, Clone)]
pub struct RunSpec {
    /// The config file and its text.
    pub source: SourceText,
    /// The parsed config.
    pub config: RunConfig,
    /// Where the initial conditions come from.
    pub ics: IcSource,
    /// The run's folder (`output_dir/name`).
    pub run_dir: PathBuf,
    /// The external potential: `[[gravity.external]]` and a model's rigid halo.
    pub external: Option<ExternalPotential>,
}

/// Most steps of `dt_max` a run may span (the block scheme's tick counter bounds it).
pub const MAX_STEPS: f64 = 1e7;

/// How many whole `dt_max` steps `value` spans, or `None` when it is not a whole multiple
/// (or spans `MAX_STEPS` or more).
pub fn whole_multiple(value: f64, dt_max: f64) -> Option<u64> {
    let ratio = value / dt_max;
    let rounded = ratio.round();
    if rounded >= 1.0 && (ratio - rounded).abs() <= 1e-9 * rounded && rounded < MAX_STEPS {
        Some(rounded as u64)
    } else {
        None
    }
}

impl RunSpec {
    /// Reads, parses and validates a run config; nothing is written except a probe file
    /// proving the output folder is writable.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let source = SourceText::read(path)?;
        let config = parse_run_config(&source)?;
        Self::validate(source, config)
    }

    /// Validates an already parsed config against its text.
    pub fn validate(source: SourceText, config: RunConfig) -> Result<Self, ConfigError> {
        let s = &source;
        validate_name(s, &config.name)?;
        let ics = validate_ics(s, &config)?;
        validate_gravity(s, &config.gravity)?;
        validate_integrator(s, &config.integrator, config.units)?;
        validate_output(s, &config)?;
        let external = validate_external(s, &config, &ics)?;
        let run_dir = config.output_dir.join(&config.name);
        check_writable(s, &config.output_dir)?;
        Ok(RunSpec {
            source,
            config,
            ics,
            run_dir,
            external,
        })
    }
}

/// Keys whose value may be a time with a unit (`"300 Myr"`) instead of a number in the run's
/// time unit.
pub const TIME_KEYS: [(&str, &str); 4] = [
    ("integrator", "t_end"),
    ("integrator", "dt_max"),
    ("output", "snapshot_interval"),
    ("output", "checkpoint_interval"),
];

/// Seconds in one of the time units a config may name (Julian years).
fn seconds_per(unit: &str) -> Option<f64> {
    match unit {
        "yr" => Some(crate::units::YEAR_S),
        "kyr" => Some(1e3 * crate::units::YEAR_S),
        "Myr" => Some(crate::units::MYR_S),
        "Gyr" => Some(crate::units::GYR_S),
        _ => None,
    }
}

/// A time with a unit (`"300 Myr"`) in the time unit of `units`, or why not.
fn time_in_run_units(text: &str, units: UnitSystem) -> Result<f64, String> {
    let mut words = text.split_whitespace();
    let (Some(number), Some(unit), None) = (words.next(), words.next(), words.next()) else {
        return Err("give a number in the run's time unit, or a number and a unit: \"300 Myr\" (yr, kyr, Myr, Gyr)".into());
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{number:?} is not a number"))?;
    let per = seconds_per(unit)
        .ok_or_else(|| format!("unknown time unit {unit:?}: use yr, kyr, Myr or Gyr"))?;
    let time_s = units.cgs().map(|u| u.time_s()).ok_or_else(|| {
        "a time with a unit needs physical units (units = \"galactic\"); N-body time is a bare number".to_string()
    })?;
    Ok(value * per / time_s)
}

/// The whole multiples of `step` on either side of `value`, in the run's unit and (physical
/// units) in Myr: what a refused time could be instead.
fn nearest_multiples(value: f64, step: f64, units: UnitSystem) -> String {
    let below = ((value / step).floor() * step).max(step);
    let above = below.max((value / step).ceil() * step);
    let myr = |t: f64| {
        units
            .cgs()
            .map(|u| format!(" ({:.6} Myr)", t * u.time_s() / crate::units::MYR_S))
            .map(|m| m.replace(".000000", ""))
            .unwrap_or_default()
    };
    format!(
        "the nearest are {}{} and {}{}",
        short(below),
        myr(below),
        short(above),
        myr(above)
    )
}

/// Parses a run config's text. Times in `TIME_KEYS` may be written with a unit (`t_end =
/// "300 Myr"`): they are turned into the run's time unit (galactic: kpc/(km/s) = 0.9778 Gyr)
/// first; everything else is read as written. Errors name the file, line, key and value.
pub fn parse_run_config(source: &SourceText) -> Result<RunConfig, ConfigError> {
    let Ok(mut table) = toml::from_str::<toml::Table>(&source.text) else {
        // Not even TOML: the typed parse says where.
        return source.parse();
    };
    let units = match table.get("units") {
        Some(toml::Value::String(u)) if u == "nbody" => UnitSystem::Nbody,
        _ => UnitSystem::Galactic,
    };
    let mut converted = false;
    for (section, key) in TIME_KEYS {
        let Some(toml::Value::Table(t)) = table.get_mut(section) else {
            continue;
        };
        if let Some(toml::Value::String(text)) = t.get(key) {
            let value = time_in_run_units(text, units).map_err(|reason| {
                source.invalid(&format!("{section}.{key}"), format!("{text:?}"), reason)
            })?;
            t.insert(key.to_string(), toml::Value::Float(value));
            converted = true;
        }
    }
    if !converted {
        return source.parse();
    }
    // Any other error is the typed parse's, located in the text as written.
    source.parse::<toml::Table>()?;
    RunConfig::deserialize(toml::Value::Table(table)).map_err(|e| ConfigError::Parse {
        path: source.path.clone(),
        location: location_of(&source.text, 0),
        key: String::new(),
        message: e.message().trim().replace('\n', " "),
    })
}

fn validate_name(s: &SourceText, name: &str) -> Result<(), ConfigError> {
    let ok = !name.is_empty()
        && name != "."
        && name != ".."
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '+' | '='));
    if ok {
        Ok(())
    } else {
        Err(s.invalid(
            "name",
            format!("{name:?}"),
            "the run name becomes a folder name, so use only letters, digits and - _ . + =",
        ))
    }
}

fn validate_ics(s: &SourceText, config: &RunConfig) -> Result<IcSource, ConfigError> {
    let ics = &config.ics;
    if !ics.galaxies.is_empty() || ics.orbit.is_some() {
        for (key, given) in [
            ("ics.model", ics.model.is_some()),
            ("ics.n", ics.n.is_some()),
            ("ics.file", ics.file.is_some()),
        ] {
            if given {
                return Err(s.invalid(
                    key,
                    "(given)",
                    "give either [[ics.galaxies]] (each with its model and n) or ics.model / ics.file, not both",
                ));
            }
        }
        let encounter = Encounter::validate(s, &ics.galaxies, ics.orbit, config.units)?;
        return Ok(IcSource::Galaxies(Box::new(encounter)));
    }
    match (&ics.model, &ics.file) {
        (Some(_), Some(file)) => Err(s.invalid(
            "ics.file",
            format!("{:?}", file.display().to_string()),
            "give either ics.model (with ics.n) or ics.file, not both",
        )),
        (None, None) => Err(s.invalid(
            "ics",
            "{}",
            "give either ics.model (a model file with ics.n particles) or ics.file (an HDF5 file)",
        )),
        (None, Some(file)) => {
            if let Some(n) = ics.n {
                return Err(s.invalid(
                    "ics.n",
                    n,
                    "ics.n applies to ics.model only; an ics.file brings its own particles",
                ));
            }
            if !file.is_file() {
                return Err(s.invalid(
                    "ics.file",
                    format!("{:?}", file.display().to_string()),
                    format!("no such file ({})", absolute(file).display()),
                ));
            }
            Ok(IcSource::File { path: file.clone() })
        }
        (Some(model_path), None) => {
            let n = match ics.n {
                None => {
                    return Err(s.invalid(
                        "ics.n",
                        "(missing)",
                        "a model needs a particle count ics.n",
                    ));
                }
                Some(n) if n < 2 => {
                    return Err(s.invalid(
                        "ics.n",
                        n,
                        "the particle count must be at least 2: one particle has no self-gravity (no potential energy, so the virial ratio is undefined)",
                    ));
                }
                Some(n) if n > (1i64 << 40) => {
                    return Err(s.invalid("ics.n", n, "the particle count must be below 2^40"));
                }
                Some(n) => n as usize,
            };
            if !model_path.is_file() {
                return Err(s.invalid(
                    "ics.model",
                    format!("{:?}", model_path.display().to_string()),
                    format!("no such file ({})", absolute(model_path).display()),
                ));
            }
            let model = ModelFile::load(model_path)?;
            if n < model.components() {
                return Err(s.invalid(
                    "ics.n",
                    n,
                    format!(
                        "the model has {} components; give at least one particle to each",
                        model.components()
                    ),
                ));
            }
            if model.units != config.units {
                return Err(s.invalid(
                    "units",
                    format!("{:?}", config.units.name()),
                    format!(
                        "the model file {} is in '{}' units; use the same unit system",
                        model_path.display(),
                        model.units.name()
                    ),
                ));
            }
            Ok(IcSource::Model {
                path: model_path.clone(),
                model: Box::new(model),
                n,
            })
        }
    }
}

/// A model's rigid halo as an external potential's entry.
fn rigid_halo_entry(h: crate::ics::galaxy::RigidHalo) -> ExternalEntry {
    ExternalEntry {
        profile: match h.profile {
            crate::ics::HaloProfile::Hernquist => ExternalProfile::Hernquist,
            crate::ics::HaloProfile::Nfw => ExternalProfile::Nfw,
        },
        mass: Some(h.mass),
        scale_radius: Some(h.scale_radius),
        scale_height: None,
        circular_velocity: None,
        core_radius: None,
        flattening: None,
        centre: [0.0; 3],
        centre_velocity: [0.0; 3],
        centre_orbit: None,
    }
}

/// The run's external potential: its `[[gravity.external]]` entries and the model's rigid
/// halo; `None` when there is neither.
fn validate_external(
    s: &SourceText,
    config: &RunConfig,
    ics: &IcSource,
) -> Result<Option<ExternalPotential>, ConfigError> {
    let mut entries = config.gravity.external.clone();
    match ics {
        IcSource::Model { model, .. } => {
            entries.extend(crate::ics::galaxy::rigid_halo(model).map(rigid_halo_entry));
        }
        IcSource::Galaxies(encounter) => {
            if let Some(g) = encounter
                .galaxies
                .iter()
                .position(|g| g.model.halo.as_ref().is_some_and(|h| h.rigid))
            {
                return Err(s.invalid(
                    &format!("ics.galaxies.{g}.model"),
                    format!("{:?}", encounter.galaxies[g].path.display().to_string()),
                    "its halo is rigid, which stays at rest at the origin; the galaxies of an encounter need live halos",
                ));
            }
        }
        IcSource::File { .. } => {}
    }
    if entries.is_empty() {
        return Ok(None);
    }
    Ok(Some(ExternalPotential::new(
        s,
        &entries,
        config.units.gravitational_constant(),
        config.integrator.t_end,
    )?))
}

fn validate_gravity(s: &SourceText, g: &GravityConfig) -> Result<(), ConfigError> {
    if !(g.softening.is_finite() && g.softening >= 0.0) {
        return Err(s.invalid(
            "gravity.softening",
            g.softening,
            "the softening length must be a finite number >= 0",
        ));
    }
    if let Some(order) = g.order.filter(|o| !(1..=MAX_ORDER as i64).contains(o)) {
        return Err(s.invalid(
            "gravity.order",
            order,
            format!("the expansion order must be between 1 and {MAX_ORDER}"),
        ));
    }
    if !(g.theta.is_finite() && g.theta > 0.0 && g.theta < 1.0) {
        return Err(s.invalid(
            "gravity.theta",
            g.theta,
            "the opening angle parameter must lie strictly between 0 and 1",
        ));
    }
    if let Some(accuracy) = g
        .accuracy
        .filter(|a| !(a.is_finite() && (0.0..1.0).contains(a)))
    {
        return Err(s.invalid(
            "gravity.accuracy",
            accuracy,
            "the accuracy target must be a relative error in [0, 1) (0: the opening angle alone)",
        ));
    }
    if !(1..=65_536).contains(&g.leaf_size) {
        return Err(s.invalid(
            "gravity.leaf_size",
            g.leaf_size,
            "the leaf size must be between 1 and 65536",
        ));
    }
    if !(g.cap_growth.is_finite() && (1.1..=16.0).contains(&g.cap_growth)) {
        return Err(s.invalid(
            "gravity.cap_growth",
            g.cap_growth,
            "the growth factor must be between 1.1 and 16",
        ));
    }
    Ok(())
}

fn validate_integrator(
    s: &SourceText,
    i: &IntegratorConfig,
    units: UnitSystem,
) -> Result<(), ConfigError> {
    if !(i.t_end.is_finite() && i.t_end > 0.0) {
        return Err(s.invalid("integrator.t_end", i.t_end, "the end time must be positive"));
    }
    if !(i.dt_max.is_finite() && i.dt_max > 0.0) {
        return Err(s.invalid(
            "integrator.dt_max",
            i.dt_max,
            "the largest step must be positive",
        ));
    }
    if i.dt_max > i.t_end {
        return Err(s.invalid(
            "integrator.dt_max",
            i.dt_max,
            format!(
                "the largest step exceeds integrator.t_end = {}",
                short(i.t_end)
            ),
        ));
    }
    let steps = i.t_end / i.dt_max;
    if steps.round() >= MAX_STEPS {
        return Err(s.invalid(
            "integrator.t_end",
            i.t_end,
            format!(
                "t_end / dt_max = {} steps of dt_max = {}, beyond the limit of 10^7 steps; raise dt_max",
                short(steps.round()),
                short(i.dt_max)
            ),
        ));
    }
    if whole_multiple(i.t_end, i.dt_max).is_none() {
        return Err(s.invalid(
            "integrator.t_end",
            i.t_end,
            format!(
                "the end time must be a whole multiple of integrator.dt_max = {} so that it is hit exactly; {}",
                short(i.dt_max),
                nearest_multiples(i.t_end, i.dt_max, units)
            ),
        ));
    }
    if !(i.eta.is_finite() && i.eta > 0.0) {
        return Err(s.invalid("integrator.eta", i.eta, "eta must be positive"));
    }
    if !(1..=MAX_LEVEL as i64).contains(&i.max_rungs) {
        return Err(s.invalid(
            "integrator.max_rungs",
            i.max_rungs,
            format!("between 1 and {MAX_LEVEL} rungs"),
        ));
    }
    if i.scheme == StepScheme::Block && i.fixed_step {
        return Err(s.invalid(
            "integrator.fixed_step",
            true,
            "fixed steps leave nothing to the block scheme: drop fixed_step or use scheme = \"global\"",
        ));
    }
    Ok(())
}

fn validate_output(s: &SourceText, c: &RunConfig) -> Result<(), ConfigError> {
    let o = &c.output;
    let dt_max = c.integrator.dt_max;
    for (key, value) in [
        ("output.snapshot_interval", o.snapshot_interval),
        ("output.checkpoint_interval", o.checkpoint_interval),
    ] {
        if let Some(v) = value {
            if !(v.is_finite() && v > 0.0) {
                return Err(s.invalid(key, v, "the interval must be positive"));
            }
            if whole_multiple(v, dt_max).is_none() {
                return Err(s.invalid(
                    key,
                    v,
                    format!(
                        "the interval must be a whole multiple of integrator.dt_max = {} so that output times are hit exactly; {}",
                        short(dt_max),
                        nearest_multiples(v, dt_max, c.units)
                    ),
                ));
            }
        }
    }
    if !(o.checkpoint_wall_minutes.is_finite() && o.checkpoint_wall_minutes > 0.0) {
        return Err(s.invalid(
            "output.checkpoint_wall_minutes",
            o.checkpoint_wall_minutes,
            "the wall-clock checkpoint interval must be positive",
        ));
    }
    // A Duration holds it (and a year of minutes is a checkpoint never taken by the clock).
    if !(MIN_WALL_MINUTES..=MAX_WALL_MINUTES).contains(&o.checkpoint_wall_minutes) {
        return Err(s.invalid(
            "output.checkpoint_wall_minutes",
            o.checkpoint_wall_minutes,
            format!(
                "the wall-clock checkpoint interval must be between {} (0.06 s) and {} minutes (ten years)",
                short(MIN_WALL_MINUTES),
                short(MAX_WALL_MINUTES)
            ),
        ));
    }
    if o.keep_checkpoints < 1 {
        return Err(s.invalid(
            "output.keep_checkpoints",
            o.keep_checkpoints,
            "keep at least 1 checkpoint",
        ));
    }
    if o.diagnostics_every < 1 {
        return Err(s.invalid(
            "output.diagnostics_every",
            o.diagnostics_every,
            "write diagnostics at least every 1 step",
        ));
    }
    Ok(())
}

/// Shortest wall-clock checkpoint interval, minutes.
const MIN_WALL_MINUTES: f64 = 1e-3;
/// Longest wall-clock checkpoint interval, minutes (ten years).
const MAX_WALL_MINUTES: f64 = 5.26e6;

/// Creates the output folder if needed and proves it is writable with a probe file.
fn check_writable(s: &SourceText, dir: &Path) -> Result<(), ConfigError> {
    let shown = format!("{:?}", dir.display().to_string());
    if dir.exists() && !dir.is_dir() {
        return Err(s.invalid("output_dir", shown, "this is a file, not a folder"));
    }
    std::fs::create_dir_all(dir).map_err(|e| {
        s.invalid(
            "output_dir",
            &shown,
            format!("the folder cannot be created: {e}"),
        )
    })?;
    let probe = dir.join(format!(".leapfmm-write-probe-{}", std::process::id()));
    std::fs::write(&probe, b"probe").map_err(|e| {
        s.invalid(
            "output_dir",
            &shown,
            format!("the folder is not writable: {e}"),
        )
    })?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// `path` made absolute for messages (unchanged if the working directory is unknown).
pub fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// Keys that may differ between a checkpoint's config and the config used to resume it.
/// The backend is where the passes run, like the number of ranks: another one continues
/// the same physics (other bits), and `--backend`, which the checkpoint's config text does
/// not hold, must not stop a resume.
/// `output_dir` is where the run folder is, not what the run is: a folder moved elsewhere
/// resumes with `output_dir` edited to its new place.
const RESUMABLE_CHANGES: [&str; 5] = [
    "integrator.t_end",
    "output.checkpoint_wall_minutes",
    "output.keep_checkpoints",
    "gravity.backend",
    "output_dir",
];

/// The input paths, which may change on resume when the run folder's record of the inputs'
/// content (`inputs.toml`) vouches for them.
pub const INPUT_PATH_KEYS: [&str; 2] = ["ics.model", "ics.file"];

/// Dotted keys whose values differ between two configs (saved, now), except those a resume
/// may change and those in `also_allowed`, with both values as written.
pub fn resume_conflicts(
    saved: &RunConfig,
    now: &RunConfig,
    also_allowed: &[&str],
) -> Vec<(String, String, String)> {
    let flat = |c: &RunConfig| -> std::collections::BTreeMap<String, String> {
        flatten(c)
            .into_iter()
            .map(|(k, v)| (k, v.to_string()))
            .collect()
    };
    let (a, b) = (flat(saved), flat(now));
    let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    keys.into_iter()
        .filter(|k| !RESUMABLE_CHANGES.contains(&k.as_str()) && !also_allowed.contains(&k.as_str()))
        .filter_map(|k| {
            let (va, vb) = (a.get(k), b.get(k));
            (va != vb).then(|| {
                let show = |v: Option<&String>| v.cloned().unwrap_or_else(|| "(unset)".into());
                (k.clone(), show(va), show(vb))
            })
        })
        .collect()
}

/// Any serialisable settings as dotted keys and TOML values, in table order.
pub fn flatten<T: Serialize>(settings: &T) -> Vec<(String, toml::Value)> {
    fn walk(prefix: &str, v: &toml::Value, out: &mut Vec<(String, toml::Value)>) {
        match v {
            toml::Value::Table(t) => {
                for (k, v) in t {
                    let key = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    walk(&key, v, out);
                }
            }
            other => out.push((prefix.to_string(), other.clone())),
        }
    }
    let mut out = Vec::new();
    if let Ok(v) = toml::Value::try_from(settings) {
        walk("", &v, &mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_multiples() {
        assert_eq!(whole_multiple(1.0, 0.01), Some(100));
        assert_eq!(whole_multiple(0.3, 0.1), Some(3));
        assert_eq!(whole_multiple(0.25, 0.1), None);
        assert_eq!(whole_multiple(0.001, 0.01), None);
    }
}
