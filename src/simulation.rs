//! One run's life: initial conditions (or a checkpoint), the KDK step loop, snapshots,
//! checkpoints, diagnostics, and a clean stop on SIGINT/SIGTERM.
//!
//! Run folder layout: `config.toml` (the config as last run), `diagnostics.csv`,
//! `snapshots/snap_NNN.hdf5`, `checkpoints/checkpoint_SSSSSSSSSSSS.ckpt`.

use crate::config::{
    ConfigError, IcSource, RunConfig, RunSpec, SolverKind, flatten, resume_conflicts,
    whole_multiple,
};
use crate::fmm::caps::{Caps, CapsPolicy};
use crate::fmm::presets::PresetsStore;
use crate::fmm::{FmmSettings, FmmSolver};
use crate::gravity::{DirectSummation, GravityError, GravitySolver, SolverStat};
use crate::ics;
use crate::integrate::diagnostics::{Conserved, DiagnosticsLog, PhaseTimes, Row};
use crate::integrate::leapfrog::{drift, kick, max_acceleration};
use crate::integrate::timestep::{Timeline, TimestepError, criterion_dt};
use crate::io::checkpoint::{self, CheckpointError};
use crate::io::snapshot::{SnapshotError, SnapshotInfo, read_snapshot, write_snapshot};
use crate::particles::Particles;
use crate::progress::Progress;
use crate::units::UnitSystem;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use thiserror::Error;

/// Why a run stopped with an error. Everything already written stays intact.
#[derive(Debug, Error)]
pub enum RunError {
    /// Bad config or model file.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A snapshot could not be read or written.
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    /// A checkpoint could not be read or written.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// The force solver failed.
    #[error(transparent)]
    Gravity(#[from] GravityError),
    /// The time step collapsed.
    #[error(transparent)]
    Timestep(#[from] TimestepError),
    /// A file in the run folder could not be written.
    #[error("{path}: {what}: {reason}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// What was being done.
        what: &'static str,
        /// The OS error.
        reason: String,
    },
    /// The run folder's state does not allow what was asked.
    #[error("{0}")]
    State(String),
}

fn io_err(path: &Path, what: &'static str) -> impl FnOnce(std::io::Error) -> RunError {
    let path = path.to_path_buf();
    move |e| RunError::Io {
        path,
        what,
        reason: e.to_string(),
    }
}

/// How `run` was asked to behave.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunOptions {
    /// Continue from the newest valid checkpoint.
    pub resume: bool,
    /// No progress output.
    pub quiet: bool,
}

/// How a run ended without error.
#[derive(Debug, Clone, PartialEq)]
pub enum RunOutcome {
    /// Reached `t_end`.
    Finished {
        /// Total steps.
        steps: u64,
        /// Final time.
        time: f64,
    },
    /// `--resume` found the run already at `t_end`.
    AlreadyFinished {
        /// Final time.
        time: f64,
    },
    /// A signal stopped the run after writing a checkpoint.
    Interrupted {
        /// The signal number.
        signal: i32,
        /// Time reached.
        time: f64,
        /// The checkpoint written.
        checkpoint: PathBuf,
    },
}

/// Integrator state beyond the particles: everything needed to continue bit-exactly.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunState {
    /// Current tick on the integer timeline.
    pub ti: u64,
    /// Steps taken.
    pub step: u64,
    /// Length of the last step.
    pub last_dt: f64,
    /// Total energy at t = 0.
    pub energy0: f64,
    /// Snapshots written so far (the next one's number).
    pub snapshots_written: u32,
}

/// What a checkpoint file holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// leapfmm version that wrote it.
    pub version: String,
    /// The run config text at the time.
    pub config_text: String,
    /// Integrator state.
    pub state: RunState,
    /// Particle state (f64), including the accelerations of the last force evaluation.
    pub particles: Particles,
    /// The force solver's buffer capacities, so a resumed run needs no retries.
    pub caps: Option<Caps>,
}

/// Folder of the snapshots of a run.
pub fn snapshot_dir(run_dir: &Path) -> PathBuf {
    run_dir.join("snapshots")
}

/// Folder of the checkpoints of a run.
pub fn checkpoint_dir(run_dir: &Path) -> PathBuf {
    run_dir.join("checkpoints")
}

/// Path of snapshot number `index`.
pub fn snapshot_path(run_dir: &Path, index: u32) -> PathBuf {
    snapshot_dir(run_dir).join(format!("snap_{index:03}.hdf5"))
}

/// The force solver a config asks for.
pub fn make_solver(config: &RunConfig) -> Box<dyn GravitySolver> {
    let g = config.units.gravitational_constant();
    let gravity = &config.gravity;
    match gravity.solver {
        SolverKind::Direct => Box::new(DirectSummation::new(g, gravity.softening())),
        SolverKind::Fmm => {
            let settings = FmmSettings {
                order: gravity.order as usize,
                theta: gravity.theta,
                leaf_size: gravity.leaf_size as usize,
                softening: gravity.softening(),
                g,
                near_field: gravity.near_field,
                caps_policy: CapsPolicy {
                    growth: gravity.cap_growth,
                    ..CapsPolicy::default()
                },
            };
            let presets = gravity
                .caps_presets
                .clone()
                .unwrap_or_else(|| config.output_dir.join("caps_presets.json"));
            Box::new(FmmSolver::new(settings, Some(PresetsStore::new(presets))))
        }
    }
}

/// SIGINT/SIGTERM handling for the duration of a run: the first signal is recorded and
/// the run stops after its current step; a second one exits at once.
struct SignalGuard {
    received: Arc<AtomicUsize>,
    ids: Vec<signal_hook::SigId>,
}

impl SignalGuard {
    fn install() -> Result<Self, RunError> {
        use signal_hook::consts::{SIGINT, SIGTERM};
        let received = Arc::new(AtomicUsize::new(0));
        let armed = Arc::new(AtomicBool::new(false));
        let mut ids = Vec::new();
        let fail =
            |e: std::io::Error| RunError::State(format!("cannot install signal handlers: {e}"));
        for sig in [SIGINT, SIGTERM] {
            ids.push(
                signal_hook::flag::register_conditional_shutdown(
                    sig,
                    128 + sig,
                    Arc::clone(&armed),
                )
                .map_err(fail)?,
            );
            ids.push(
                signal_hook::flag::register_usize(sig, Arc::clone(&received), sig as usize)
                    .map_err(fail)?,
            );
            ids.push(signal_hook::flag::register(sig, Arc::clone(&armed)).map_err(fail)?);
        }
        Ok(SignalGuard { received, ids })
    }

    fn received(&self) -> Option<i32> {
        match self.received.load(Ordering::SeqCst) {
            0 => None,
            s => Some(s as i32),
        }
    }
}

impl Drop for SignalGuard {
    fn drop(&mut self) {
        for id in self.ids.drain(..) {
            signal_hook::low_level::unregister(id);
        }
    }
}

/// Runs (or resumes) the run described by `spec` to its end time.
pub fn run(spec: &RunSpec, options: RunOptions) -> Result<RunOutcome, RunError> {
    let mut sim = Simulation::prepare(spec, options)?;
    if sim.state.ti >= sim.ti_end {
        sim.progress.note(&format!(
            "{}: already finished at t = {}; nothing to do",
            spec.run_dir.display(),
            sim.timeline.time(sim.state.ti)
        ));
        return Ok(RunOutcome::AlreadyFinished {
            time: sim.timeline.time(sim.state.ti),
        });
    }
    let signals = SignalGuard::install()?;
    let outcome = sim.advance(&signals);
    sim.progress.finish();
    outcome
}

/// A run in progress.
struct Simulation<'a> {
    spec: &'a RunSpec,
    particles: Particles,
    state: RunState,
    solver: Box<dyn GravitySolver>,
    timeline: Timeline,
    ti_end: u64,
    snapshot_every: Option<u64>,
    checkpoint_every: Option<u64>,
    checkpoint_wall: Duration,
    last_checkpoint: Instant,
    log: DiagnosticsLog,
    progress: Progress,
    wall: PhaseTimes,
    interactions: u64,
    /// Solver figures since the last diagnostics row.
    solver_stats: Vec<SolverStat>,
}

impl<'a> Simulation<'a> {
    fn prepare(spec: &'a RunSpec, options: RunOptions) -> Result<Self, RunError> {
        let c = &spec.config;
        let run_dir = &spec.run_dir;
        let ckpt_dir = checkpoint_dir(run_dir);
        let existing = checkpoint::list(&ckpt_dir)?;
        let has_outputs = run_dir.join("diagnostics.csv").exists()
            || snapshot_dir(run_dir)
                .read_dir()
                .is_ok_and(|mut d| d.next().is_some())
            || !existing.is_empty();
        if has_outputs && !options.resume {
            return Err(RunError::State(format!(
                "run folder {} already holds a run (snapshots, checkpoints or diagnostics); pass --resume to continue it, or change 'name' in {} to start another",
                run_dir.display(),
                spec.source.path.display()
            )));
        }
        let timeline = Timeline {
            dt_max: c.integrator.dt_max,
        };
        let ticks_of = |v: f64| whole_multiple(v, c.integrator.dt_max).map(Timeline::ticks);
        let ti_end = ticks_of(c.integrator.t_end).unwrap_or(0);
        let progress = Progress::new(&c.name, c.integrator.t_end, options.quiet);
        for dir in [run_dir.clone(), snapshot_dir(run_dir), ckpt_dir.clone()] {
            std::fs::create_dir_all(&dir).map_err(io_err(&dir, "creating the run folder"))?;
        }
        let mut solver = make_solver(c);
        let stat_names = solver.stat_names();

        let resumed = if options.resume && !existing.is_empty() {
            let found = checkpoint::newest_valid::<Checkpoint>(&ckpt_dir)?.ok_or_else(|| {
                RunError::State(format!("no checkpoint in {}", ckpt_dir.display()))
            })?;
            let (path, ckpt) = (found.path, found.payload);
            check_resumable(spec, &ckpt, &path)?;
            for (bad, reason) in &found.rejected {
                let aside = checkpoint::set_aside(bad)?;
                progress.warn(&format!(
                    "{reason}; set aside as {} and resuming from the previous checkpoint",
                    aside.display()
                ));
            }
            progress.note(&format!(
                "{}: resuming from {} (step {}, t = {})",
                c.name,
                path.display(),
                ckpt.state.step,
                timeline.time(ckpt.state.ti)
            ));
            Some(ckpt)
        } else {
            if options.resume && has_outputs {
                progress.note(&format!(
                    "{}: no checkpoint yet; starting from the beginning",
                    c.name
                ));
            }
            None
        };

        let config_copy = run_dir.join("config.toml");
        write_atomically(&config_copy, spec.source.text.as_bytes())?;

        let log_path = run_dir.join("diagnostics.csv");
        let (particles, state, log, fresh) = match resumed {
            Some(ckpt) => {
                let log = DiagnosticsLog::resume(&log_path, ckpt.state.step, &stat_names)
                    .map_err(io_err(&log_path, "reopening the diagnostics log"))?;
                if let Some(caps) = ckpt.caps {
                    solver.set_caps(caps);
                }
                (ckpt.particles, ckpt.state, log, false)
            }
            None => {
                let particles = initial_particles(spec, &progress)?;
                let log = DiagnosticsLog::create(&log_path, &stat_names)
                    .map_err(io_err(&log_path, "creating the diagnostics log"))?;
                let state = RunState {
                    ti: 0,
                    step: 0,
                    last_dt: 0.0,
                    energy0: 0.0,
                    snapshots_written: 0,
                };
                (particles, state, log, true)
            }
        };
        let mut sim = Simulation {
            spec,
            particles,
            state,
            solver,
            timeline,
            ti_end,
            snapshot_every: c.output.snapshot_interval.and_then(ticks_of),
            checkpoint_every: c.output.checkpoint_interval.and_then(ticks_of),
            checkpoint_wall: Duration::from_secs_f64(c.output.checkpoint_wall_minutes * 60.0),
            last_checkpoint: Instant::now(),
            log,
            progress,
            wall: PhaseTimes::default(),
            interactions: 0,
            solver_stats: Vec::new(),
        };
        if fresh {
            sim.start()?;
        }
        sim.progress
            .start_at(sim.state.step, timeline.time(sim.state.ti));
        Ok(sim)
    }

    /// Step 0: forces, reference energy, first diagnostics row, snapshot and checkpoint.
    fn start(&mut self) -> Result<(), RunError> {
        let c = &self.spec.config;
        let physical = c
            .units
            .time_unit_gyr()
            .map(|gyr| format!(" ({:.0} Myr)", c.integrator.t_end * gyr * 1e3))
            .unwrap_or_default();
        self.progress.note(&format!(
            "{}: {} particles, solver '{}', t_end = {}{physical}, output in {}",
            c.name,
            self.particles.len(),
            self.solver.name(),
            c.integrator.t_end,
            self.spec.run_dir.display()
        ));
        self.compute_forces()?;
        self.state.energy0 = Conserved::measure(&self.particles).total();
        self.write_diagnostics()?;
        self.write_snapshot()?;
        self.write_checkpoint()?;
        Ok(())
    }

    fn compute_forces(&mut self) -> Result<(), RunError> {
        let start = Instant::now();
        let report = self.solver.compute(&mut self.particles)?;
        self.interactions += report.pair_interactions;
        if self.solver_stats.len() != report.stats.len() {
            self.solver_stats = report
                .stats
                .iter()
                .map(|s| SolverStat { value: 0.0, ..*s })
                .collect();
        }
        for (acc, stat) in self.solver_stats.iter_mut().zip(&report.stats) {
            acc.value = if stat.summed {
                acc.value + stat.value
            } else {
                stat.value
            };
        }
        for w in self.solver.take_warnings() {
            self.progress.warn(&w);
        }
        self.wall.force += start.elapsed().as_secs_f64();
        Ok(())
    }

    /// Steps until `t_end` or a signal.
    fn advance(&mut self, signals: &SignalGuard) -> Result<RunOutcome, RunError> {
        let c = &self.spec.config;
        let every = c.output.diagnostics_every.max(1) as u64;
        while self.state.ti < self.ti_end {
            self.step()?;
            let ti = self.state.ti;
            let finished = ti >= self.ti_end;
            let at_snapshot = finished || self.snapshot_every.is_some_and(|s| ti.is_multiple_of(s));
            let signal = signals.received();
            let at_checkpoint = finished
                || signal.is_some()
                || self.checkpoint_every.is_some_and(|s| ti.is_multiple_of(s))
                || self.last_checkpoint.elapsed() >= self.checkpoint_wall;
            if self.state.step.is_multiple_of(every) || at_snapshot || at_checkpoint {
                self.write_diagnostics()?;
            }
            if at_snapshot {
                self.write_snapshot()?;
            }
            let written = if at_checkpoint {
                Some(self.write_checkpoint()?)
            } else {
                None
            };
            self.progress
                .update(self.state.step, self.timeline.time(ti));
            if let (Some(signal), Some(checkpoint)) = (signal, written)
                && !finished
            {
                self.progress.note(&format!(
                    "{}: stopped by signal {signal} at t = {}; checkpoint {} written; continue with --resume",
                    c.name,
                    self.timeline.time(ti),
                    checkpoint.display()
                ));
                return Ok(RunOutcome::Interrupted {
                    signal,
                    time: self.timeline.time(ti),
                    checkpoint,
                });
            }
        }
        Ok(RunOutcome::Finished {
            steps: self.state.step,
            time: self.timeline.time(self.state.ti),
        })
    }

    /// One kick-drift-kick step of the length the criterion allows.
    fn step(&mut self) -> Result<(), RunError> {
        let integ = &self.spec.config.integrator;
        let start = Instant::now();
        let wanted = if integ.fixed_step {
            f64::INFINITY
        } else {
            criterion_dt(
                integ.eta,
                self.spec.config.gravity.softening,
                max_acceleration(&self.particles),
            )
        };
        let level = self.timeline.choose_level(self.state.ti, wanted)?;
        let dt = self.timeline.level_dt(level);
        kick(&mut self.particles, 0.5 * dt);
        drift(&mut self.particles, dt);
        self.wall.integrate += start.elapsed().as_secs_f64();
        self.compute_forces()?;
        let start = Instant::now();
        kick(&mut self.particles, 0.5 * dt);
        self.state.ti += Timeline::level_ticks(level);
        self.state.step += 1;
        self.state.last_dt = dt;
        self.wall.integrate += start.elapsed().as_secs_f64();
        Ok(())
    }

    fn write_diagnostics(&mut self) -> Result<(), RunError> {
        let start = Instant::now();
        let conserved = Conserved::measure(&self.particles);
        self.wall.diagnostics += start.elapsed().as_secs_f64();
        let values: Vec<f64> = self.solver_stats.iter().map(|s| s.value).collect();
        let row = Row {
            step: self.state.step,
            time: self.timeline.time(self.state.ti),
            dt: self.state.last_dt,
            conserved,
            energy0: self.state.energy0,
            interactions: self.interactions,
            wall: self.wall,
            solver: &values,
        };
        let path = self.log.path().to_path_buf();
        self.log
            .append(&row)
            .map_err(io_err(&path, "writing diagnostics"))?;
        self.wall = PhaseTimes::default();
        self.interactions = 0;
        for stat in self.solver_stats.iter_mut().filter(|s| s.summed) {
            stat.value = 0.0;
        }
        Ok(())
    }

    fn write_snapshot(&mut self) -> Result<(), RunError> {
        let start = Instant::now();
        let c = &self.spec.config;
        let path = snapshot_path(&self.spec.run_dir, self.state.snapshots_written);
        let info = SnapshotInfo {
            time: self.timeline.time(self.state.ti),
            units: c.units,
            precision: c.output.snapshot_precision,
            potential: c.output.snapshot_potential,
            acceleration: c.output.snapshot_acceleration,
            parameters: flatten(c),
            settings_text: Some(&self.spec.source.text),
        };
        write_snapshot(&path, &self.particles, &info)?;
        self.state.snapshots_written += 1;
        self.wall.io += start.elapsed().as_secs_f64();
        Ok(())
    }

    fn write_checkpoint(&mut self) -> Result<PathBuf, RunError> {
        let start = Instant::now();
        let ckpt = Checkpoint {
            version: env!("CARGO_PKG_VERSION").to_string(),
            config_text: self.spec.source.text.clone(),
            state: self.state.clone(),
            particles: self.particles.clone(),
            caps: self.solver.caps(),
        };
        let keep = self.spec.config.output.keep_checkpoints.max(1) as usize;
        let path = checkpoint::write(
            &checkpoint_dir(&self.spec.run_dir),
            self.state.step,
            &ckpt,
            keep,
        )?;
        self.last_checkpoint = Instant::now();
        self.wall.io += start.elapsed().as_secs_f64();
        Ok(path)
    }
}

/// Refuses to resume when the config changed in a way that breaks the run's continuity.
fn check_resumable(spec: &RunSpec, ckpt: &Checkpoint, path: &Path) -> Result<(), RunError> {
    let saved: RunConfig = toml::from_str(&ckpt.config_text).map_err(|e| {
        RunError::State(format!(
            "{}: the config stored in this checkpoint no longer parses ({}); resume with the leapfmm version that wrote it ({})",
            path.display(),
            e.message(),
            ckpt.version
        ))
    })?;
    if let Some((key, was, now)) = resume_conflicts(&saved, &spec.config).into_iter().next() {
        return Err(RunError::State(format!(
            "{}: key '{key}' changed since the checkpoint (was {was}, now {now}); restore it to resume, or start a new run under another name",
            spec.source.path.display()
        )));
    }
    Ok(())
}

/// Builds the initial particles from a model or reads them from a file, in the run's units.
fn initial_particles(spec: &RunSpec, progress: &Progress) -> Result<Particles, RunError> {
    match &spec.ics {
        IcSource::Model { model, n, .. } => {
            let (particles, warnings) = ics::generate(model, *n, spec.config.seed);
            for w in warnings {
                progress.warn(&w);
            }
            Ok(particles)
        }
        IcSource::File { path } => {
            let data = read_snapshot(path)?;
            let mut p = data.particles;
            if p.is_empty() {
                return Err(RunError::State(format!(
                    "{}: the file holds no particles",
                    path.display()
                )));
            }
            match (data.units, spec.config.units.cgs()) {
                (Some(from), Some(to)) => {
                    let l = from.length_cm / to.length_cm;
                    let v = from.velocity_cm_per_s / to.velocity_cm_per_s;
                    let m = from.mass_g / to.mass_g;
                    // Codes differ in their solar mass and parsec by up to ~3e-4; such files
                    // are in the same unit system by intent and are used as they are.
                    if [l, v, m].iter().any(|r| (r - 1.0).abs() > SAME_UNITS_TOLERANCE) {
                        progress.note(&format!(
                            "{}: converting from the file's units (length x{l:.6e}, velocity x{v:.6e}, mass x{m:.6e})",
                            path.display()
                        ));
                        scale_units(&mut p, l, v, m);
                    }
                }
                (Some(_), None) => progress.note(&format!(
                    "{}: the file records physical units, but the run uses '{}' units; values are used as they are",
                    path.display(),
                    UnitSystem::Nbody.name()
                )),
                (None, _) => {}
            }
            Ok(p)
        }
    }
}

/// Relative difference below which two unit definitions count as the same.
const SAME_UNITS_TOLERANCE: f64 = 1e-3;

fn scale_units(p: &mut Particles, length: f64, velocity: f64, mass: f64) {
    for x in &mut p.pos {
        x.iter_mut().for_each(|c| *c *= length);
    }
    for v in &mut p.vel {
        v.iter_mut().for_each(|c| *c *= velocity);
    }
    p.mass.iter_mut().for_each(|m| *m *= mass);
}

/// Writes a small file via a temporary name so it is never seen half-written.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), RunError> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).map_err(io_err(&tmp, "writing"))?;
    std::fs::rename(&tmp, path).map_err(io_err(path, "renaming into place"))
}
