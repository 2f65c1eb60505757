//! Campaigns: several runs from one TOML file — a base run config plus either a list of runs
//! or a sweep (the cartesian product of listed values), each value addressed by a dotted key
//! path into the run schema (`"gravity.softening"`) or, below `ics.`, into the model file
//! (`"ics.disk.toomre_q"`). See docs/config.md.
//!
//! Every run gets a readable name from its parameters and its own folder
//! `output_dir/CAMPAIGN/RUN`; its config (and its model file, when a key changes the model)
//! is written to `CAMPAIGN/configs/RUN.toml` (`CAMPAIGN/models/RUN.toml`), so any run can
//! also be rerun alone with `leapfmm run`. All of them are validated before any run starts:
//! a key path that is not in the schema stops the campaign; a value that one run's checks
//! reject marks that run invalid and the others go ahead.
//!
//! Owns the campaign file, the expansion into runs and `summary.md`; each run goes through
//! `simulation::run`. Must not step particles or write a run's files itself.

use crate::config::{ConfigError, RunSpec, SourceText, location_of};
use crate::ics::ModelFile;
use crate::progress::CampaignProgress as Progress;
use crate::simulation::{self, RunOptions, RunOutcome, StopRequest};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use toml::{Table, Value};

/// A campaign that cannot be planned.
#[derive(Debug, thiserror::Error)]
pub enum CampaignError {
    /// The campaign file itself is unreadable or malformed.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The campaign asks for something impossible (one sentence naming the key).
    #[error("{path}: {message}")]
    Invalid {
        /// The campaign file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

/// The campaign file's schema.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct CampaignFile {
    /// Campaign name (default: the file's stem); the runs live in `output_dir/name`.
    name: Option<String>,
    /// Parent of the campaign folder (default: the base's `output_dir`, else "runs").
    output_dir: Option<PathBuf>,
    /// A complete run config; `name` and `output_dir` in it are replaced.
    base: Table,
    /// Key path → list of values: one run per combination.
    sweep: Option<Table>,
    /// One table of key path → value per run (and an optional `name`).
    runs: Option<Vec<Table>>,
}

/// True when `text` is a campaign file (it has a `[base]` run) rather than a run config.
pub fn is_campaign(text: &str) -> bool {
    text.parse::<Table>()
        .is_ok_and(|t| t.get("base").is_some_and(Value::is_table))
}

/// One run of a campaign, planned and validated.
#[derive(Debug)]
pub struct PlannedRun {
    /// Folder name of the run.
    pub name: String,
    /// The values this run sets, by key path.
    pub params: Vec<(String, Value)>,
    /// The generated run config.
    pub config_path: PathBuf,
    /// The validated run, or why its values were rejected.
    pub spec: Result<RunSpec, String>,
}

/// A planned campaign.
#[derive(Debug)]
pub struct Campaign {
    /// Its name.
    pub name: String,
    /// The campaign file.
    pub source: PathBuf,
    /// The folder holding its runs, configs and summary.
    pub dir: PathBuf,
    /// The runs, in order.
    pub runs: Vec<PlannedRun>,
}

/// Keys of `[ics]` that belong to the run config; any other `ics.` key addresses the model.
const RUN_ICS_KEYS: [&str; 3] = ["model", "n", "file"];

/// Keys of an `[[ics.galaxies]]` entry; any other `ics.galaxies.K.` key addresses galaxy
/// K's model.
const GALAXY_KEYS: [&str; 7] = [
    "model",
    "n",
    "mass_scale",
    "inclination",
    "argument_of_pericentre",
    "position",
    "velocity",
];

/// Where a campaign's `ics.` key goes: the run config, or a model file (`None`: the run's
/// `ics.model`; `Some(g)`: galaxy g's) at the key's rest.
fn model_key(key: &str) -> Option<(Option<usize>, &str)> {
    let rest = key.strip_prefix("ics.")?;
    if RUN_ICS_KEYS.contains(&rest) || rest.starts_with("orbit.") {
        return None;
    }
    match rest.strip_prefix("galaxies.") {
        Some(entry) => {
            let (index, inner) = entry.split_once('.')?;
            let index = index.parse().ok()?;
            let head = inner.split('.').next().unwrap_or(inner);
            (!GALAXY_KEYS.contains(&head)).then_some((Some(index), inner))
        }
        None => Some((None, rest)),
    }
}

impl Campaign {
    /// Reads, plans and validates a campaign; writes the runs' configs (and changed model
    /// files) into the campaign folder but starts nothing.
    pub fn load(path: &Path) -> Result<Campaign, CampaignError> {
        let source = SourceText::read(path)?;
        let file: CampaignFile = source.parse()?;
        let invalid = |message: String| CampaignError::Invalid {
            path: path.to_path_buf(),
            message,
        };
        let name = match &file.name {
            Some(n) => n.clone(),
            None => path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default(),
        };
        if name.is_empty() || !name.chars().all(name_char) {
            return Err(invalid(format!(
                "name = {name:?}: the campaign name becomes a folder name, so use only letters, digits and - _ . + ="
            )));
        }
        let output_dir = file
            .output_dir
            .clone()
            .or_else(|| file.base.get("output_dir")?.as_str().map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from("runs"));
        let dir = output_dir.join(&name);
        let sets = parameter_sets(&file).map_err(invalid)?;
        let keys: Vec<String> = {
            let mut k: Vec<String> = sets
                .iter()
                .flat_map(|(_, p)| p.iter().map(|(k, _)| k.clone()))
                .collect();
            k.sort();
            k.dedup();
            k
        };
        for key in &keys {
            check_key(key).map_err(invalid)?;
        }
        // Every name is checked before any run's files are written: a refused campaign
        // leaves no folder behind.
        let mut names = BTreeMap::new();
        let mut named = Vec::new();
        for (k, (explicit, params)) in sets.into_iter().enumerate() {
            let run_name = explicit.unwrap_or_else(|| readable_name(&params, &keys));
            if let Some(other) = names.insert(run_name.clone(), k) {
                return Err(invalid(format!(
                    "runs {} and {} would share the folder {run_name:?}; give them different names",
                    other + 1,
                    k + 1
                )));
            }
            named.push((run_name, params));
        }
        let existed = dir.exists();
        let mut runs = Vec::new();
        for (run_name, params) in named {
            match plan_run(&source, &file.base, &dir, run_name, params) {
                Ok(run) => runs.push(run),
                Err(e) => {
                    // A refused campaign leaves no folder behind (one it made itself).
                    if !existed {
                        let _ = std::fs::remove_dir_all(&dir);
                    }
                    return Err(e);
                }
            }
        }
        Ok(Campaign {
            name,
            source: path.to_path_buf(),
            dir,
            runs,
        })
    }
}

fn name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '+' | '=')
}

/// "key = value, …" of a run's parameters.
pub fn describe(params: &[(String, Value)]) -> String {
    params
        .iter()
        .map(|(k, v)| format!("{k} = {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Most runs one campaign may hold: each gets a folder, a line in the summary and a row in
/// every report.
pub const MAX_RUNS: usize = 10_000;

/// The runs' parameter sets (with explicit names where given), in order.
type ParameterSet = (Option<String>, Vec<(String, Value)>);

fn parameter_sets(file: &CampaignFile) -> Result<Vec<ParameterSet>, String> {
    match (&file.sweep, &file.runs) {
        (Some(sweep), None) => {
            // Counted before anything is expanded: a product of long lists must not fill
            // the memory with parameter sets.
            let count = sweep
                .values()
                .map(|v| v.as_array().map_or(1, Vec::len).max(1))
                .try_fold(1usize, usize::checked_mul);
            if count.is_none_or(|c| c > MAX_RUNS) {
                let sizes: Vec<String> = sweep
                    .iter()
                    .map(|(k, v)| format!("{k}: {}", v.as_array().map_or(1, Vec::len)))
                    .collect();
                return Err(format!(
                    "the sweep expands to {} runs ({}), more than the limit of {MAX_RUNS}; split it into several campaigns",
                    count.map_or("more than 1e19".to_string(), |c| c.to_string()),
                    sizes.join(" x ")
                ));
            }
            let mut sets: Vec<Vec<(String, Value)>> = vec![Vec::new()];
            for (key, values) in sweep {
                let list = match values {
                    Value::Array(a) if !a.is_empty() => a,
                    other => {
                        return Err(format!(
                            "key 'sweep.\"{key}\"' = {other}: a sweep lists the values to try, e.g. [1.2, 1.5]"
                        ));
                    }
                };
                sets = sets
                    .into_iter()
                    .flat_map(|set| {
                        list.iter().map(move |v| {
                            let mut s = set.clone();
                            s.push((key.clone(), v.clone()));
                            s
                        })
                    })
                    .collect();
            }
            Ok(sets.into_iter().map(|s| (None, s)).collect())
        }
        (None, Some(runs)) if !runs.is_empty() => runs
            .iter()
            .enumerate()
            .map(|(k, run)| {
                let mut name = None;
                let mut params = Vec::new();
                for (key, value) in run {
                    if key == "name" {
                        match value.as_str() {
                            Some(n) if !n.is_empty() && n.chars().all(name_char) => {
                                name = Some(n.to_string())
                            }
                            _ => {
                                return Err(format!(
                                    "key 'runs[{k}].name' = {value}: a run name becomes a folder name, so use only letters, digits and - _ . + ="
                                ));
                            }
                        }
                    } else {
                        params.push((key.clone(), value.clone()));
                    }
                }
                Ok((name, params))
            })
            .collect(),
        _ => Err("give either [sweep] (key path = [values]) or [[runs]] (key path = value), one of them".into()),
    }
}

/// Rejects key paths the campaign itself controls or that are not dotted names.
fn check_key(key: &str) -> Result<(), String> {
    if key.split('.').any(str::is_empty) {
        return Err(format!(
            "key path {key:?} is not a dotted path such as \"gravity.softening\""
        ));
    }
    if key == "name" || key == "output_dir" {
        return Err(format!(
            "key path {key:?} is set by the campaign (its name and output_dir)"
        ));
    }
    Ok(())
}

/// A folder name from the parameters: `key=value` joined by `_`, each key shortened to the
/// shortest ending of its path that no other key of the campaign shares.
fn readable_name(params: &[(String, Value)], keys: &[String]) -> String {
    if params.is_empty() {
        return "base".into();
    }
    params
        .iter()
        .map(|(key, value)| {
            let parts: Vec<&str> = key.split('.').collect();
            let short = (1..=parts.len())
                .map(|n| parts[parts.len() - n..].join("."))
                .find(|s| {
                    keys.iter()
                        .filter(|k| *k == s || k.ends_with(&format!(".{s}")))
                        .count()
                        == 1
                })
                .unwrap_or_else(|| key.clone());
            let value = match value {
                Value::String(s) => Path::new(s)
                    .file_stem()
                    .map(|f| f.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                other => other.to_string(),
            };
            let value: String = value
                .chars()
                .map(|c| if name_char(c) { c } else { '-' })
                .collect();
            format!("{short}={value}")
        })
        .collect::<Vec<_>>()
        .join("_")
}

/// Sets `key` (dotted) in `table`, creating tables on the way; the part after a list's
/// name is an index into it (`ics.galaxies.1.inclination`: the second galaxy's).
fn set_path(table: &mut Table, key: &str, value: Value) -> Result<(), String> {
    let parts: Vec<&str> = key.split('.').collect();
    let Some((last, path)) = parts.split_last() else {
        return Err(format!("key path {key:?} is empty"));
    };
    let mut at = table;
    let mut k = 0;
    while k < path.len() {
        let here = path[..=k].join(".");
        let entry = at
            .entry(path[k].to_string())
            .or_insert_with(|| Value::Table(Table::new()));
        let entry = match entry {
            Value::Array(items) => {
                let count = items.len();
                let index = path
                    .get(k + 1)
                    .and_then(|p| p.parse::<usize>().ok())
                    .filter(|&i| i < count)
                    .ok_or_else(|| {
                        format!(
                            "key path {key:?}: {here} is a list of {count}; name an entry by its index from 0, as in \"{here}.0\""
                        )
                    })?;
                k += 1;
                &mut items[index]
            }
            other => other,
        };
        at = entry.as_table_mut().ok_or_else(|| {
            format!(
                "key path {key:?}: {} is a value, not a table",
                path[..=k].join(".")
            )
        })?;
        k += 1;
    }
    at.insert(last.to_string(), value);
    Ok(())
}

/// True when a parse error says the key is not in the schema.
fn unknown_key(e: &ConfigError) -> bool {
    matches!(e, ConfigError::Parse { message, .. } if message.contains("unknown field"))
}

fn write_toml(path: &Path, table: &Table) -> Result<(), CampaignError> {
    let fail = |reason: String| CampaignError::Invalid {
        path: path.to_path_buf(),
        message: reason,
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| fail(format!("cannot create it: {e}")))?;
    }
    let text = toml::to_string(table).map_err(|e| fail(e.to_string()))?;
    std::fs::write(path, text).map_err(|e| fail(format!("cannot write it: {e}")))
}

/// Writes one run's config (and model) and validates it.
fn plan_run(
    source: &SourceText,
    base: &Table,
    dir: &Path,
    name: String,
    params: Vec<(String, Value)>,
) -> Result<PlannedRun, CampaignError> {
    let invalid = |message: String| CampaignError::Invalid {
        path: source.path.clone(),
        message,
    };
    let mut config = base.clone();
    let mut model_changes: Vec<(Option<usize>, &str, &Value)> = Vec::new();
    for (key, value) in &params {
        match model_key(key) {
            Some((galaxy, rest)) => model_changes.push((galaxy, rest, value)),
            None => set_path(&mut config, key, value.clone()).map_err(invalid)?,
        }
    }
    config.insert("name".into(), Value::String(name.clone()));
    config.insert(
        "output_dir".into(),
        Value::String(dir.to_string_lossy().into_owned()),
    );
    let mut model_paths = Vec::new();
    let mut changed: Vec<Option<usize>> = model_changes.iter().map(|c| c.0).collect();
    changed.sort_unstable();
    changed.dedup();
    for galaxy in changed {
        let (path_key, file) = match galaxy {
            None => ("ics.model".to_string(), format!("{name}.toml")),
            Some(g) => (
                format!("ics.galaxies.{g}.model"),
                format!("{name}_galaxy{g}.toml"),
            ),
        };
        let ics = config.get("ics");
        let base_model = match galaxy {
            None => ics.and_then(|i| i.get("model")),
            Some(g) => ics
                .and_then(|i| i.get("galaxies"))
                .and_then(|l| l.get(g))
                .and_then(|e| e.get("model")),
        }
        .and_then(Value::as_str);
        let Some(base_model) = base_model else {
            let first = model_changes
                .iter()
                .find(|c| c.0 == galaxy)
                .map_or("", |c| c.1);
            let key = match galaxy {
                None => format!("ics.{first}"),
                Some(g) => format!("ics.galaxies.{g}.{first}"),
            };
            return Err(invalid(format!(
                "key path \"{key}\" changes a model file, but the run has no {path_key}"
            )));
        };
        let model_source = SourceText::read(Path::new(base_model))?;
        let mut model: Table = model_source.parse()?;
        for (_, key, value) in model_changes.iter().filter(|c| c.0 == galaxy) {
            set_path(&mut model, key, (*value).clone()).map_err(invalid)?;
        }
        let path = dir.join("models").join(file);
        write_toml(&path, &model)?;
        set_path(
            &mut config,
            &path_key,
            Value::String(path.to_string_lossy().into_owned()),
        )
        .map_err(invalid)?;
        model_paths.push(path);
    }
    let config_path = dir.join("configs").join(format!("{name}.toml"));
    write_toml(&config_path, &config)?;
    let check = |e: ConfigError| -> Result<String, CampaignError> {
        if unknown_key(&e) {
            // Cite the campaign's own line for the key path that names the unknown field
            // (the generated file is not the user's).
            let message = e.to_string();
            let unknown = message
                .split("unknown field `")
                .nth(1)
                .and_then(|rest| rest.split('`').next());
            let cited = params.iter().find_map(|(key, _)| {
                (key.rsplit('.').next() == unknown).then_some(key)?;
                let at = source.text.find(key.as_str())?;
                Some((key, location_of(&source.text, at)))
            });
            Err(match cited {
                Some((key, at)) => CampaignError::Invalid {
                    path: PathBuf::from(format!("{}:{at}", source.path.display())),
                    message: format!("key path \"{key}\" is not in the schema ({e})"),
                },
                None => invalid(format!("a key path is not in the schema: {e}")),
            })
        } else {
            Ok(e.to_string())
        }
    };
    let spec = match RunSpec::load(&config_path) {
        Ok(spec) => match model_paths
            .iter()
            .map(|p| ModelFile::load(p))
            .find_map(Result::err)
        {
            Some(e) => Err(check(e)?),
            None => Ok(spec),
        },
        Err(e) => Err(check(e)?),
    };
    Ok(PlannedRun {
        name,
        params,
        config_path,
        spec,
    })
}

/// How one run of a campaign ended.
#[derive(Debug, Clone, PartialEq)]
pub enum RunStatus {
    /// Ran from the start to the end now.
    Finished,
    /// Continued from a checkpoint to the end now.
    Resumed,
    /// Already finished before: skipped.
    Skipped,
    /// Its values were rejected before the campaign started.
    Invalid(String),
    /// It stopped with an error.
    Failed(String),
    /// A signal stopped it (and the campaign) after a checkpoint.
    Interrupted,
    /// Not reached (the campaign was interrupted before it).
    NotRun,
}

impl RunStatus {
    /// One word for tables.
    pub fn word(&self) -> &'static str {
        match self {
            RunStatus::Finished => "finished",
            RunStatus::Resumed => "resumed",
            RunStatus::Skipped => "skipped",
            RunStatus::Invalid(_) => "invalid",
            RunStatus::Failed(_) => "failed",
            RunStatus::Interrupted => "interrupted",
            RunStatus::NotRun => "not run",
        }
    }

    /// Whether the run is complete (now or before).
    pub fn complete(&self) -> bool {
        matches!(
            self,
            RunStatus::Finished | RunStatus::Resumed | RunStatus::Skipped
        )
    }

    fn reason(&self) -> &str {
        match self {
            RunStatus::Invalid(r) | RunStatus::Failed(r) => r,
            _ => "",
        }
    }
}

/// Figures of a run from its diagnostics.csv.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RunFigures {
    /// Last time reached.
    pub time: f64,
    /// Steps taken.
    pub steps: u64,
    /// Largest |ΔE/E|.
    pub energy: f64,
    /// Largest |ΔLz/Lz|.
    pub lz: f64,
    /// Wall-clock seconds of all its steps (over all sessions).
    pub wall: f64,
    /// Particle steps per wall-clock second.
    pub particles_per_s: f64,
}

/// Reads a run's figures; `None` when it has no diagnostics yet.
pub fn run_figures(run_dir: &Path) -> Option<RunFigures> {
    let mut reader = csv::Reader::from_path(run_dir.join("diagnostics.csv")).ok()?;
    let headers = reader.headers().ok()?.clone();
    let col = |n: &str| headers.iter().position(|h| h == n);
    let (ct, cs, ce, cl, cw, cn) = (
        col("time")?,
        col("step")?,
        col("rel_energy_error")?,
        col("lz")?,
        col("wall_total")?,
        col("rank_particles"),
    );
    let mut f = RunFigures::default();
    let (mut lz0, mut particles) = (None, 0.0);
    for record in reader.records().flatten() {
        let v = |c: usize| record.get(c).and_then(|s| s.parse::<f64>().ok());
        let (Some(t), Some(s), Some(e), Some(l)) = (v(ct), v(cs), v(ce), v(cl)) else {
            continue;
        };
        let lz0 = *lz0.get_or_insert(l);
        f.time = t;
        f.steps = s as u64;
        f.energy = f.energy.max(e.abs());
        if lz0 != 0.0 {
            f.lz = f.lz.max(((l - lz0) / lz0).abs());
        }
        f.wall += v(cw).unwrap_or(0.0);
        if particles == 0.0 {
            particles = cn.and_then(v).unwrap_or(0.0);
        }
    }
    if f.wall > 0.0 {
        f.particles_per_s = particles * f.steps as f64 / f.wall;
    }
    Some(f)
}

/// The campaign's summary as (CSV, Markdown): per run its parameters, status, final time,
/// steps, |ΔE/E|, |ΔLz/Lz|, wall time and particles per second.
pub fn summary(campaign: &Campaign, statuses: &[RunStatus]) -> (String, String) {
    let mut csv = String::from(
        "run,parameters,status,final_time,steps,max_rel_energy_error,max_rel_lz_error,wall_s,particles_per_s,reason\n",
    );
    let mut md = format!(
        "# Campaign {}\n\n| run | parameters | status | final time | steps | max abs(dE/E) | max abs(dLz/Lz) | wall s | particles/s | reason |\n|---|---|---|---|---|---|---|---|---|---|\n",
        campaign.name
    );
    for (run, status) in campaign.runs.iter().zip(statuses) {
        let figures = run.spec.as_ref().ok().and_then(|s| run_figures(&s.run_dir));
        let cells: Vec<String> = match figures {
            Some(f) => vec![
                format!("{}", f.time),
                format!("{}", f.steps),
                format!("{:.3e}", f.energy),
                format!("{:.3e}", f.lz),
                format!("{:.1}", f.wall),
                format!("{:.3e}", f.particles_per_s),
            ],
            None => vec![String::new(); 6],
        };
        let reason = status.reason().replace(['\n', '"'], " ");
        let params = describe(&run.params).replace('"', "'");
        let _ = writeln!(
            csv,
            "{},\"{}\",{},{},\"{}\"",
            run.name,
            params,
            status.word(),
            cells.join(","),
            reason
        );
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} |",
            run.name,
            params.replace('|', "\\|"),
            status.word(),
            cells.join(" | "),
            reason.replace('|', "\\|")
        );
    }
    (csv, md)
}

/// How the campaign's runs are run.
#[derive(Debug, Clone)]
pub struct CampaignOptions {
    /// No progress output.
    pub quiet: bool,
    /// Thread ranks per run.
    pub ranks: usize,
    /// A library caller's stop request (`RunOptions::stop`), passed to every run.
    pub stop: Option<StopRequest>,
}

/// Runs the campaign's valid runs in order — each one continued from its checkpoints,
/// skipped when already finished — and keeps going when one fails; a signal stops the
/// campaign after the interrupted run's checkpoint. Writes `summary.csv` and `summary.md`
/// in the campaign folder after every run. Returns each run's status and the signal that
/// stopped the campaign, if one did.
pub fn run_campaign(
    campaign: &Campaign,
    options: &CampaignOptions,
) -> Result<(Vec<RunStatus>, Option<i32>), CampaignError> {
    let mut statuses: Vec<RunStatus> = campaign
        .runs
        .iter()
        .map(|r| match &r.spec {
            Ok(_) => RunStatus::NotRun,
            Err(reason) => RunStatus::Invalid(reason.clone()),
        })
        .collect();
    let group = indicatif::MultiProgress::new();
    let overall = Progress::campaign(&group, campaign.runs.len() as u64, options.quiet);
    let mut signal = None;
    for (k, run) in campaign.runs.iter().enumerate() {
        let Ok(spec) = &run.spec else {
            continue;
        };
        overall.set(k as u64, &run.name);
        let started_before = spec.run_dir.join("checkpoints").is_dir();
        let outcome = simulation::run(
            spec,
            RunOptions {
                resume: true,
                quiet: options.quiet,
                ranks: options.ranks,
                group: Some(group.clone()),
                stop: options.stop.clone(),
            },
        );
        statuses[k] = match outcome {
            Ok(RunOutcome::Finished { .. }) if started_before => RunStatus::Resumed,
            Ok(RunOutcome::Finished { .. }) => RunStatus::Finished,
            Ok(RunOutcome::AlreadyFinished { .. }) => RunStatus::Skipped,
            Ok(RunOutcome::Interrupted { signal: s, .. }) => {
                signal = Some(s);
                RunStatus::Interrupted
            }
            Err(e) => RunStatus::Failed(e.to_string()),
        };
        if !options.quiet {
            overall.note(&format!(
                "campaign {}: run {} {}",
                campaign.name,
                run.name,
                statuses[k].word()
            ));
        }
        write_summary(campaign, &statuses)?;
        if signal.is_some() {
            break;
        }
    }
    overall.set(campaign.runs.len() as u64, "done");
    overall.finish();
    write_summary(campaign, &statuses)?;
    Ok((statuses, signal))
}

fn write_summary(campaign: &Campaign, statuses: &[RunStatus]) -> Result<(), CampaignError> {
    let (csv, md) = summary(campaign, statuses);
    for (name, text) in [("summary.csv", csv), ("summary.md", md)] {
        let path = campaign.dir.join(name);
        std::fs::write(&path, text).map_err(|e| CampaignError::Invalid {
            path: path.clone(),
            message: format!("cannot write the summary: {e}"),
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_names_use_the_shortest_unambiguous_key_endings() {
        let keys: Vec<String> = ["ics.disk.mass", "ics.halo.mass", "gravity.softening"]
            .map(String::from)
            .to_vec();
        let params = vec![
            ("gravity.softening".to_string(), Value::Float(0.05)),
            ("ics.disk.mass".to_string(), Value::Float(0.5)),
            ("ics.halo.mass".to_string(), Value::Integer(8)),
        ];
        assert_eq!(
            readable_name(&params, &keys),
            "softening=0.05_disk.mass=0.5_halo.mass=8"
        );
        let file = vec![("ics.file".to_string(), Value::String("ics/a b.hdf5".into()))];
        assert_eq!(readable_name(&file, &["ics.file".into()]), "file=a-b");
    }

    #[test]
    fn key_paths_create_tables_but_never_replace_a_value() {
        let mut t: Table = "[gravity]\nsoftening = 0.1\n".parse().unwrap();
        set_path(&mut t, "gravity.theta", Value::Float(0.5)).unwrap();
        set_path(&mut t, "output.keep_checkpoints", Value::Integer(2)).unwrap();
        assert_eq!(t["gravity"]["theta"].as_float(), Some(0.5));
        assert_eq!(t["output"]["keep_checkpoints"].as_integer(), Some(2));
        assert!(set_path(&mut t, "gravity.softening.x", Value::Integer(1)).is_err());
    }
}
