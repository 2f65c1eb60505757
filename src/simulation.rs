//! One run's life: initial conditions (or a checkpoint), the KDK step loop, snapshots,
//! checkpoints, diagnostics, and a clean stop on SIGINT/SIGTERM.
//!
//! Run folder layout: `config.toml` (the config as last run), `diagnostics.csv`,
//! `snapshots/snap_NNN.hdf5`, `checkpoints/checkpoint_SSSSSSSSSSSS.ckpt`. On K > 1 ranks
//! every rank runs the same loop on its own particles: snapshots are GADGET multi-file sets
//! (`snapshots/snapdir_NNN/snap_NNN.R.hdf5`), checkpoints are rank sets committed by a
//! manifest, rank 0 writes the logs (with per-rank figures in `ranks.csv`), and every global
//! decision (step size, energy, when to stop) comes from a collective, so all ranks agree.

use crate::config::{
    ConfigError, INPUT_PATH_KEYS, IcSource, RunConfig, RunSpec, SolverKind, StepScheme, flatten,
    resume_conflicts, whole_multiple,
};
use crate::distributed::comm::{
    CommError, Communicator, SingleRank, allgatherv, allreduce_max, allreduce_sum, run_thread_ranks,
};
use crate::distributed::driver::DistributedFmm;
use crate::fmm::caps::{Caps, CapsPolicy};
use crate::fmm::p2p::NearFieldPrecision;
use crate::fmm::presets::PresetsStore;
use crate::fmm::{FmmSettings, FmmSolver};
use crate::format::short;
use crate::gpu::backend::{Chosen, DeviceInfo, choose, probe};
use crate::gravity::{
    DirectSummation, GravityError, GravitySolver, Softening, SolverStat, active_flags,
};
use crate::ics;
use crate::ics::Share;
use crate::ics::sampling::{block_moments, centre_on};
use crate::integrate::block::{Rungs, rung_for, rungs_for};
use crate::integrate::diagnostics::{
    CONSERVED_SUMS, Conserved, DiagnosticsLog, PhaseTimes, RankLog, Row,
};
use crate::integrate::leapfrog::{drift, kick, kick_each, max_acceleration_by_component};
use crate::integrate::timestep::{TICKS_PER_DT_MAX, Timeline, TimestepError, criterion_dt};
use crate::io::checkpoint::{self, CheckpointError};
use crate::io::inputs::{INPUTS_FILE, InputsError, RunInputs};
use crate::io::lock::{LockError, RunLock};
use crate::io::snapshot::{
    MultiFile, SnapshotError, SnapshotInfo, part_type_counts, read_snapshot, write_snapshot,
};
use crate::particles::Particles;
use crate::progress::Progress;
use crate::units::UnitSystem;
use rayon::prelude::*;
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
    /// The record of the run's inputs could not be made, read or written.
    #[error(transparent)]
    Inputs(#[from] InputsError),
    /// Another process writes the run folder, or its lock failed.
    #[error(transparent)]
    Lock(#[from] LockError),
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
    /// Ranks could not agree (another rank failed, or a timeout).
    #[error(transparent)]
    Communication(#[from] CommError),
    /// One rank of a multi-rank run failed; the others stopped with it.
    #[error("rank {rank} of {ranks} failed: {reason}")]
    Rank {
        /// The rank that failed first.
        rank: usize,
        /// Ranks in the run.
        ranks: usize,
        /// Its error.
        reason: String,
    },
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
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Continue from the newest valid checkpoint.
    pub resume: bool,
    /// No progress output.
    pub quiet: bool,
    /// Thread ranks to split the particles over (0 or 1: one).
    pub ranks: usize,
    /// Progress bars shown together (a campaign's): the run's bar joins them.
    pub group: Option<indicatif::MultiProgress>,
}

/// Collective waits of thread ranks give up after this long: a last resort, since a failing
/// rank stops the others at once.
const RANK_TIMEOUT: Duration = Duration::from_secs(3600);

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
    /// Per-particle work the next domain decomposition balances on (runs on several ranks;
    /// empty otherwise), so a resumed run decomposes exactly as the original would have.
    pub decomposition_work: Vec<f64>,
}

/// Folder of the snapshots of a run.
pub fn snapshot_dir(run_dir: &Path) -> PathBuf {
    run_dir.join("snapshots")
}

/// Folder of the checkpoints of a run.
pub fn checkpoint_dir(run_dir: &Path) -> PathBuf {
    run_dir.join("checkpoints")
}

/// Path of snapshot number `index` of a single-rank run (for K ranks, the first file of the
/// set: `snapshot_file(run_dir, index, 0, K)`).
pub fn snapshot_path(run_dir: &Path, index: u32) -> PathBuf {
    snapshot_file(run_dir, index, 0, 1)
}

/// Path of rank `rank`'s file of snapshot `index` in a run on `ranks` ranks, in GADGET-4's
/// multi-file naming.
pub fn snapshot_file(run_dir: &Path, index: u32, rank: usize, ranks: usize) -> PathBuf {
    if ranks <= 1 {
        snapshot_dir(run_dir).join(format!("snap_{index:03}.hdf5"))
    } else {
        snapshot_dir(run_dir)
            .join(format!("snapdir_{index:03}"))
            .join(format!("snap_{index:03}.{rank}.hdf5"))
    }
}

/// Softening lengths per component (`Component::index`) when the run's model gives
/// components their own (`None` when one length serves every particle).
pub fn component_softening(spec: &RunSpec) -> Option<[f64; 4]> {
    match &spec.ics {
        IcSource::Model { model, .. } => model.component_softening(spec.config.gravity.softening),
        IcSource::File { .. } => None,
    }
}

/// Where `spec`'s force passes run (`gravity.backend`, design §7): `auto` takes the GPUs
/// for a run the GPU backend can do, else the CPU; `cuda` insists. Under `auto`,
/// `thread_ranks` ranks of this process need one GPU each; under `cuda` they share them
/// (as MPI ranks do: rank r takes GPU r modulo the node's count).
pub fn choose_backend(spec: &RunSpec, thread_ranks: usize) -> Result<Chosen, RunError> {
    let g = &spec.config.gravity;
    let unsupported = if g.solver != SolverKind::Fmm {
        Some("runs the FMM only")
    } else if component_softening(spec).is_some() {
        Some("needs one softening length for every particle")
    } else if g.near_field == NearFieldPrecision::Double {
        Some("has the mixed-precision near field only")
    } else {
        None
    };
    choose(g.backend, unsupported, thread_ranks, probe).map_err(|e| {
        RunError::State(format!(
            "{}: gravity.backend: {e}",
            spec.source.path.display()
        ))
    })
}

/// The force solver `spec` asks for, on the rank `comm` (with its model's per-component
/// softening lengths, if any), its passes where `backend` says.
pub fn make_solver<C: Communicator + 'static>(
    spec: &RunSpec,
    comm: C,
    backend: &Chosen,
) -> Result<Box<dyn GravitySolver>, RunError> {
    let (config, component_softening) = (&spec.config, component_softening(spec));
    let g = config.units.gravitational_constant();
    let gravity = &config.gravity;
    // The far field's minimum separation follows the largest length any pair uses.
    let softening = Softening {
        epsilon: component_softening
            .map_or(gravity.softening, |t| t.iter().fold(0.0, |a, &b| a.max(b))),
        ..gravity.softening()
    };
    Ok(match gravity.solver {
        SolverKind::Direct if comm.size() > 1 => {
            return Err(RunError::State(
                "gravity.solver = \"direct\" runs on one rank only; use \"fmm\" with --ranks"
                    .into(),
            ));
        }
        SolverKind::Direct => Box::new(
            DirectSummation::new(g, gravity.softening())
                .with_component_softening(component_softening),
        ),
        SolverKind::Fmm => {
            let settings = FmmSettings {
                order: gravity.order as usize,
                theta: gravity.theta,
                leaf_size: gravity.leaf_size as usize,
                softening,
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
            if let Chosen::Cuda(device) = backend {
                return gpu_solver(comm, settings, PresetsStore::new(presets), device);
            }
            Box::new(
                DistributedFmm::new(
                    comm,
                    FmmSolver::new(settings, None),
                    Some(PresetsStore::new(presets)),
                )
                .with_component_softening(component_softening),
            )
        }
    })
}

/// The FMM with its passes on GPU `rank mod devices` of `device`'s machine, with the
/// particles resident there: on one rank `GpuSolver`; on several, the distributed FMM with
/// its passes on each rank's GPU (`GpuRank`: the decomposition, tree, lists and the LET's
/// cells on the host from the positions brought down each step, the LET's payload from GPU
/// to GPU).
#[cfg(feature = "cuda")]
fn gpu_solver<C: Communicator + 'static>(
    comm: C,
    settings: FmmSettings,
    presets: PresetsStore,
    device: &DeviceInfo,
) -> Result<Box<dyn GravitySolver>, RunError> {
    let ordinal = comm.rank() % device.devices.max(1);
    let mut gpu = crate::gpu::GpuFmm::open(ordinal, crate::gpu::kernel_cache().as_deref())
        .map_err(|e| RunError::Gravity(GravityError::Device(e.to_string())))?;
    if comm.size() == 1 {
        return Ok(Box::new(crate::gpu::solver::GpuSolver::new(
            FmmSolver::new(settings, Some(presets)),
            gpu,
        )));
    }
    // The LET payload moves between the GPUs through NCCL when each rank has its own
    // (ranks of one machine, or MPI ranks no more than one machine's GPUs), else through
    // the host's communicator.
    let own_gpu = comm.size() <= device.devices;
    let link = gpu.connect_ranks(&comm, own_gpu);
    let mut solver = DistributedFmm::new(
        comm,
        FmmSolver::new(settings, None).with_backend("cuda"),
        Some(presets),
    )
    .with_device(Box::new(crate::gpu::rank::GpuRank::new(gpu)));
    let route = match link {
        Ok(true) => "through NCCL",
        Ok(false) => "through the host (the ranks share GPUs, or there is no NCCL library)",
        Err(e) => {
            solver = solver.with_warning(format!(
                "NCCL between the GPUs failed ({e}); the LET payload goes through the host"
            ));
            "through the host (NCCL failed)"
        }
    };
    Ok(Box::new(solver.with_note(format!(
        "the LET payload moves between the GPUs {route}"
    ))))
}

/// Without the `cuda` feature no device is ever chosen.
#[cfg(not(feature = "cuda"))]
fn gpu_solver<C: Communicator + 'static>(
    _comm: C,
    _settings: FmmSettings,
    _presets: PresetsStore,
    _device: &DeviceInfo,
) -> Result<Box<dyn GravitySolver>, RunError> {
    Err(RunError::Gravity(GravityError::Device(
        "this leapfmm was built without the `cuda` feature".into(),
    )))
}

/// Exit status of a run that a signal stopped cleanly, after finishing its step and writing
/// its checkpoint (sysexits' EX_TEMPFAIL: resume it later with `--resume`).
pub const EXIT_STOPPED: u8 = 75;

/// Exit status when a second SIGINT ends the run at once, without a checkpoint of the stop.
pub const EXIT_ABORTED: i32 = 130;

/// SIGINT/SIGTERM handling for the duration of a run: the first signal is recorded and the
/// run stops after its current step with a checkpoint. Only a second SIGINT (a person
/// pressing Ctrl-C again) exits at once; SIGTERM never does, because `timeout` and batch
/// schedulers often send it twice (to the process and to its group) and both must still
/// end in a checkpoint.
struct SignalGuard {
    received: Arc<AtomicUsize>,
    /// True until the step loop starts: a signal then ends the process at once.
    preparing: Arc<AtomicBool>,
    ids: Vec<signal_hook::SigId>,
}

impl SignalGuard {
    fn install() -> Result<Self, RunError> {
        use signal_hook::consts::{SIGINT, SIGTERM};
        let received = Arc::new(AtomicUsize::new(0));
        let preparing = Arc::new(AtomicBool::new(true));
        let interrupted = Arc::new(AtomicBool::new(false));
        let mut ids = Vec::new();
        let fail =
            |e: std::io::Error| RunError::State(format!("cannot install signal handlers: {e}"));
        // Before the first step (reading checkpoints, sampling ICs) nothing is left half
        // done by stopping (every file is written atomically): end at once, as without a
        // handler, so that a stuck read can always be stopped.
        for sig in [SIGINT, SIGTERM] {
            ids.push(
                signal_hook::flag::register_conditional_shutdown(
                    sig,
                    128 + sig,
                    Arc::clone(&preparing),
                )
                .map_err(fail)?,
            );
        }
        // Registered before the flag it tests, so the first SIGINT only sets the flag.
        ids.push(
            signal_hook::flag::register_conditional_shutdown(
                SIGINT,
                EXIT_ABORTED,
                Arc::clone(&interrupted),
            )
            .map_err(fail)?,
        );
        ids.push(signal_hook::flag::register(SIGINT, Arc::clone(&interrupted)).map_err(fail)?);
        for sig in [SIGINT, SIGTERM] {
            ids.push(
                signal_hook::flag::register_usize(sig, Arc::clone(&received), sig as usize)
                    .map_err(fail)?,
            );
        }
        Ok(SignalGuard {
            received,
            preparing,
            ids,
        })
    }

    /// The step loop starts: from now on a signal stops the run after its step.
    fn stepping(&self) {
        self.preparing.store(false, Ordering::SeqCst);
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

/// Runs (or resumes) the run described by `spec` to its end time, on `options.ranks`
/// thread ranks.
pub fn run(spec: &RunSpec, options: RunOptions) -> Result<RunOutcome, RunError> {
    let ranks = options.ranks.max(1);
    if ranks == 1 {
        return run_with(spec, options, SingleRank);
    }
    let signals = SignalGuard::install()?;
    let backend = choose_backend(spec, ranks)?;
    check_memory(spec, ranks, ranks, &backend)?;
    let threads = (rayon::current_num_threads() / ranks).max(1);
    let outcomes = run_thread_ranks(ranks, threads, RANK_TIMEOUT, |comm| {
        let solver = make_solver(spec, comm.clone(), &backend)?;
        run_rank(spec, options.clone(), comm, solver, &backend, &signals)
    })
    .map_err(|(rank, reason)| RunError::Rank {
        rank,
        ranks,
        reason,
    })?;
    outcomes
        .into_iter()
        .next()
        .ok_or_else(|| RunError::State("no rank reported how the run ended".into()))
}

/// Runs (or resumes) the run as the rank `comm` of a group that every rank runs alike (one
/// process alone, or one MPI rank).
pub fn run_with<C: Communicator + Clone + 'static>(
    spec: &RunSpec,
    options: RunOptions,
    comm: C,
) -> Result<RunOutcome, RunError> {
    let signals = SignalGuard::install()?;
    let backend = choose_backend(spec, 1)?;
    // One process per rank (MPI): this machine holds the ranks the launcher put on it.
    let local = [
        "OMPI_COMM_WORLD_LOCAL_SIZE",
        "MPI_LOCALNRANKS",
        "SLURM_NTASKS_PER_NODE",
    ]
    .iter()
    .find_map(|v| std::env::var(v).ok()?.parse::<usize>().ok())
    .unwrap_or(1)
    .min(comm.size());
    check_memory(spec, comm.size(), local, &backend)?;
    let solver = make_solver(spec, comm.clone(), &backend)?;
    run_rank(spec, options, &comm, solver, &backend, &signals)
}

/// Refuses, before anything is allocated or written, a run from a model whose memory
/// estimate exceeds what this machine (or a GPU) has (`memory::check`). A run from a file
/// is bounded by the file it reads.
fn check_memory(
    spec: &RunSpec,
    ranks: usize,
    local_ranks: usize,
    backend: &Chosen,
) -> Result<(), RunError> {
    let IcSource::Model { n, .. } = &spec.ics else {
        return Ok(());
    };
    crate::memory::check(
        &spec.config.gravity,
        *n as u64,
        ranks,
        local_ranks,
        backend,
        crate::memory::available_host(),
    )
    .map_err(|reason| RunError::State(format!("{}: {reason}", spec.source.path.display())))
}

/// One rank's part of `run`.
fn run_rank(
    spec: &RunSpec,
    options: RunOptions,
    comm: &dyn Communicator,
    solver: Box<dyn GravitySolver>,
    backend: &Chosen,
    signals: &SignalGuard,
) -> Result<RunOutcome, RunError> {
    let mut sim = Simulation::prepare(spec, options, comm, solver, backend)?;
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
    let outcome = sim.advance(signals);
    sim.progress.finish();
    outcome
}

/// A run in progress (one rank's part of it).
struct Simulation<'a> {
    spec: &'a RunSpec,
    comm: &'a dyn Communicator,
    particles: Particles,
    state: RunState,
    solver: Box<dyn GravitySolver>,
    timeline: Timeline,
    ti_end: u64,
    snapshot_every: Option<u64>,
    checkpoint_every: Option<u64>,
    checkpoint_wall: Duration,
    last_checkpoint: Instant,
    /// The run's logs, written by rank 0 only.
    logs: Option<Logs>,
    progress: Progress,
    wall: PhaseTimes,
    interactions: u64,
    /// Solver figures since the last diagnostics row.
    solver_stats: Vec<SolverStat>,
    /// Block-scheme figures since the last diagnostics row.
    block: BlockFigures,
    /// Where the particle state is kept between steps.
    residence: Residence,
    /// The run folder's lock (rank 0), held until the run ends.
    _lock: Option<RunLock>,
}

/// The leapfrog's two operators.
#[derive(Debug, Clone, Copy)]
enum Operator {
    /// `v += a h`.
    Kick,
    /// `x += v h`.
    Drift,
}

/// Where a run keeps its particle state between steps (design §7).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Residence {
    /// On the host (`Simulation::particles`): the CPU backend, and the block scheme.
    Host,
    /// On the solver's device (`GravitySolver::resident`), loaded at the first step.
    DeviceToLoad,
    /// On the solver's device; the host's copy is behind it when `host_behind` and is
    /// brought up to date before it is read (`Simulation::sync_host`).
    Device { host_behind: bool },
}

/// What the block scheme did since the last diagnostics row (summed over ranks).
#[derive(Debug, Clone, Default)]
struct BlockFigures {
    /// Particle force evaluations.
    evaluations: u64,
    /// Those the global scheme would have made at each cycle's shortest step.
    global_evaluations: f64,
    /// Particles per rung at the start of the last cycle.
    histogram: Vec<u64>,
    /// Simulation time of the last diagnostics row.
    since: f64,
}

impl BlockFigures {
    /// Names of the diagnostics columns for rungs 0..=`deepest`.
    fn names(deepest: u32) -> Vec<String> {
        let mut names = vec![
            "force_evaluations".to_string(),
            "evaluations_per_particle_time".to_string(),
            "block_saving".to_string(),
        ];
        names.extend((0..=deepest).map(|k| format!("rung_{k}")));
        names
    }

    /// The columns' values at `time` for `particles` in all.
    fn values(&self, particles: u64, time: f64, deepest: u32) -> Vec<f64> {
        let e = self.evaluations as f64;
        let span = time - self.since;
        let mut v = vec![
            e,
            if span > 0.0 {
                e / (particles as f64 * span)
            } else {
                0.0
            },
            if e > 0.0 {
                self.global_evaluations / e
            } else {
                1.0
            },
        ];
        v.extend(
            (0..=deepest as usize).map(|k| self.histogram.get(k).copied().unwrap_or(0) as f64),
        );
        v
    }
}

/// `diagnostics.csv`, and `ranks.csv` on more than one rank.
struct Logs {
    diagnostics: DiagnosticsLog,
    ranks: Option<RankLog>,
}

impl Logs {
    /// The logs with the solver's columns `names` (in both) and the run's own `extra`
    /// columns (in diagnostics.csv only).
    fn open(
        run_dir: &Path,
        names: &[&str],
        extra: &[String],
        ranks: usize,
        resume_step: Option<u64>,
    ) -> Result<Self, RunError> {
        let path = run_dir.join("diagnostics.csv");
        let all: Vec<&str> = names
            .iter()
            .copied()
            .chain(extra.iter().map(String::as_str))
            .collect();
        let diagnostics = match resume_step {
            Some(step) => DiagnosticsLog::resume(&path, step, &all)
                .map_err(io_err(&path, "reopening the diagnostics log"))?,
            None => DiagnosticsLog::create(&path, &all)
                .map_err(io_err(&path, "creating the diagnostics log"))?,
        };
        let ranks = if ranks > 1 {
            let path = run_dir.join("ranks.csv");
            Some(
                RankLog::open(&path, names, resume_step)
                    .map_err(io_err(&path, "opening the per-rank log"))?,
            )
        } else {
            None
        };
        Ok(Logs { diagnostics, ranks })
    }
}

/// Where a resumed rank's state comes from.
struct Resumed {
    state: RunState,
    particles: Particles,
    caps: Option<Caps>,
    work: Vec<f64>,
}

impl<'a> Simulation<'a> {
    fn prepare(
        spec: &'a RunSpec,
        options: RunOptions,
        comm: &'a dyn Communicator,
        mut solver: Box<dyn GravitySolver>,
        backend: &Chosen,
    ) -> Result<Self, RunError> {
        let c = &spec.config;
        let run_dir = &spec.run_dir;
        let (rank, ranks) = (comm.rank(), comm.size());
        let ckpt_dir = checkpoint_dir(run_dir);
        let existed = run_dir.exists();
        // Before looking at the folder: no other process may write it from here on.
        let lock = lock_run_folder(run_dir, comm)?;
        let existing = checkpoint::list(&ckpt_dir)?;
        let has_outputs = run_dir.join("diagnostics.csv").exists()
            || snapshot_dir(run_dir)
                .read_dir()
                .is_ok_and(|mut d| d.next().is_some())
            || !existing.is_empty();
        // What the run is built from, by content: rank 0 hashes the inputs and compares them
        // with the folder's record; every rank gets its verdict.
        let recorded = run_dir.join(INPUTS_FILE).exists();
        let (inputs, verdict) = if rank == 0 {
            match folder_verdict(spec, &options, has_outputs, existing.is_empty()) {
                Ok(inputs) => (Some(inputs), Ok(())),
                Err(e) => (None, Err(e)),
            }
        } else {
            (None, Ok(()))
        };
        agree(comm, verdict).map_err(RunError::State)?;
        if options.resume && !existed && rank == 0 {
            // Said even when quiet: a typo in 'name' or output_dir starts a new run.
            crate::tell!(
                "{}: run folder {} does not exist; starting a fresh run",
                c.name,
                run_dir.display()
            );
        }
        // Every rank has looked at the folder before rank 0 writes into it.
        comm.barrier()?;
        let timeline = Timeline {
            dt_max: c.integrator.dt_max,
        };
        let ticks_of = |v: f64| whole_multiple(v, c.integrator.dt_max).map(Timeline::ticks);
        let ti_end = ticks_of(c.integrator.t_end).unwrap_or(0);
        let progress = Progress::new(
            &c.name,
            c.integrator.t_end,
            options.quiet || rank != 0,
            options.group.as_ref(),
        );
        for dir in [run_dir.clone(), snapshot_dir(run_dir), ckpt_dir.clone()] {
            std::fs::create_dir_all(&dir).map_err(io_err(&dir, "creating the run folder"))?;
        }
        let stat_names = solver.stat_names();

        let resumed = if options.resume && !existing.is_empty() {
            let resumed = load_checkpoint(spec, comm, &progress, &timeline, recorded)?;
            if !recorded {
                progress.note(&format!(
                    "{}: the run folder has no record of its inputs (an older leapfmm wrote it); the model or IC file is taken as it is and recorded now",
                    c.name
                ));
            }
            if rank == 0 {
                remove_snapshots_from(run_dir, resumed.state.snapshots_written)?;
            }
            // The later trajectory is gone before any rank writes the new one.
            comm.barrier()?;
            Some(resumed)
        } else {
            if has_outputs {
                progress.note(&format!(
                    "{}: no checkpoint yet; starting again from the beginning with the same config",
                    c.name
                ));
            }
            None
        };

        if c.gravity.solver == SolverKind::Fmm {
            progress.note(&format!("{}: {}", c.name, backend.describe()));
        }
        let logs = if rank == 0 {
            if let Some(inputs) = &inputs {
                // Before config.toml: a folder whose config.toml is there has its record.
                write_atomically(&run_dir.join(INPUTS_FILE), inputs.to_text()?.as_bytes())?;
            }
            write_atomically(&run_dir.join("config.toml"), spec.source.text.as_bytes())?;
            let step = resumed.as_ref().map(|r| r.state.step);
            let block = match c.integrator.scheme {
                StepScheme::Block => BlockFigures::names(c.integrator.max_rungs as u32),
                StepScheme::Global => Vec::new(),
            };
            Some(Logs::open(run_dir, &stat_names, &block, ranks, step)?)
        } else {
            None
        };
        let (particles, state, fresh) = match resumed {
            Some(r) => {
                if let Some(caps) = r.caps {
                    solver.set_caps(caps);
                }
                solver.set_decomposition_work(r.work);
                (r.particles, r.state, false)
            }
            None => {
                let particles = initial_particles(spec, comm, &progress)?;
                let state = RunState {
                    ti: 0,
                    step: 0,
                    last_dt: 0.0,
                    energy0: 0.0,
                    snapshots_written: 0,
                };
                (particles, state, true)
            }
        };
        for note in solver.notes() {
            progress.note(&format!("{}: {note}", c.name));
        }
        let since = timeline.time(state.ti);
        let residence = match solver.resident() {
            Some(_) => {
                progress.note(&format!(
                    "{}: the particles stay on the device between steps",
                    c.name
                ));
                Residence::DeviceToLoad
            }
            None => Residence::Host,
        };
        let mut sim = Simulation {
            spec,
            comm,
            particles,
            state,
            solver,
            timeline,
            ti_end,
            snapshot_every: c.output.snapshot_interval.and_then(ticks_of),
            checkpoint_every: c.output.checkpoint_interval.and_then(ticks_of),
            checkpoint_wall: Duration::from_secs_f64(c.output.checkpoint_wall_minutes * 60.0),
            last_checkpoint: Instant::now(),
            logs,
            progress,
            wall: PhaseTimes::default(),
            interactions: 0,
            solver_stats: Vec::new(),
            block: BlockFigures {
                since,
                ..BlockFigures::default()
            },
            residence,
            _lock: lock,
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
        let total = allreduce_sum(self.comm, &[self.particles.len() as u64])?[0];
        let ranks = match self.comm.size() {
            1 => String::new(),
            k => format!(" on {k} ranks"),
        };
        self.progress.note(&format!(
            "{}: {total} particles{ranks}, solver '{}', t_end = {}{physical}, output in {}",
            c.name,
            self.solver.name(),
            c.integrator.t_end,
            self.spec.run_dir.display()
        ));
        self.compute_forces(None)?;
        self.state.energy0 = self.conserved()?.total();
        self.write_diagnostics()?;
        self.write_snapshot()?;
        self.write_checkpoint()?;
        Ok(())
    }

    /// The conserved quantities of all ranks' particles (summed where they are).
    fn conserved(&mut self) -> Result<Conserved, RunError> {
        let on_device = self.on_device();
        let mine = match self.solver.resident().filter(|_| on_device) {
            Some(device) => device.conserved_sums()?,
            None => Conserved::sums(&self.particles),
        };
        let sums = allreduce_sum(self.comm, &mine)?;
        let mut all = [0.0; CONSERVED_SUMS];
        all.copy_from_slice(&sums);
        Ok(Conserved::from_sums(&all))
    }

    /// Whether the particle state is on the solver's device now.
    fn on_device(&self) -> bool {
        matches!(self.residence, Residence::Device { .. })
    }

    /// Takes the particles onto the solver's device before the first step there.
    fn load_resident(&mut self) -> Result<(), RunError> {
        if self.residence == Residence::DeviceToLoad {
            if let Some(device) = self.solver.resident() {
                device.load(&self.particles)?;
            }
            self.residence = Residence::Device { host_behind: false };
        }
        Ok(())
    }

    /// Brings the host's particles up to date with the device's before they are read.
    fn sync_host(&mut self) -> Result<(), RunError> {
        if self.residence == (Residence::Device { host_behind: true }) {
            if let Some(device) = self.solver.resident() {
                device.store(&mut self.particles)?;
            }
            self.residence = Residence::Device { host_behind: false };
        }
        Ok(())
    }

    /// The leapfrog's `op` with step `h` for every particle, where the state is.
    fn apply(&mut self, op: Operator, h: f64) -> Result<(), RunError> {
        let on_device = self.on_device();
        match self.solver.resident().filter(|_| on_device) {
            Some(device) => {
                match op {
                    Operator::Kick => device.kick(h)?,
                    Operator::Drift => device.drift(h)?,
                }
                self.residence = Residence::Device { host_behind: true };
            }
            None => match op {
                Operator::Kick => kick(&mut self.particles, h),
                Operator::Drift => drift(&mut self.particles, h),
            },
        }
        Ok(())
    }

    /// The block scheme's kicks, `v += a h[k]` for the k-th particle of `rows` (of all
    /// without them), where the state is.
    fn kick_each(&mut self, rows: Option<&[u32]>, h: &[f64]) -> Result<(), RunError> {
        let on_device = self.on_device();
        match self.solver.resident().filter(|_| on_device) {
            Some(device) => {
                device.kick_each(rows, h)?;
                self.residence = Residence::Device { host_behind: true };
            }
            None => kick_each(&mut self.particles, rows, h),
        }
        Ok(())
    }

    /// Brings the host's accelerations up to date with the device's, where they are there,
    /// or with `only` those of the listed particles (the block scheme's step criterion
    /// reads them).
    fn fetch_accelerations(&mut self, only: Option<&[u32]>) -> Result<(), RunError> {
        let on_device = self.on_device();
        if let Some(device) = self.solver.resident().filter(|_| on_device) {
            device.accelerations(&mut self.particles, only)?;
        }
        Ok(())
    }

    /// The largest |a| of each component's particles on this rank, where the state is.
    fn max_acceleration_by_component(&mut self) -> Result<[f64; 4], RunError> {
        let on_device = self.on_device();
        Ok(match self.solver.resident().filter(|_| on_device) {
            Some(device) => device.max_acceleration_by_component()?,
            None => max_acceleration_by_component(&self.particles),
        })
    }

    /// Forces on every particle, or with `active` on those listed.
    fn compute_forces(&mut self, active: Option<&[u32]>) -> Result<(), RunError> {
        let start = Instant::now();
        let on_device = self.on_device();
        let report = match (active, self.solver.resident().filter(|_| on_device)) {
            (None, Some(device)) => {
                let report = device.compute(&mut self.particles)?;
                self.residence = Residence::Device { host_behind: true };
                report
            }
            (Some(active), Some(device)) => {
                let report = device.compute_active(&mut self.particles, active)?;
                self.residence = Residence::Device { host_behind: true };
                report
            }
            (None, None) => self.solver.compute(&mut self.particles)?,
            (Some(active), None) => {
                // The host's solvers build the whole tree anyway: flags cost no more.
                let flags = active_flags(active, self.particles.len());
                self.solver.compute_active(&mut self.particles, &flags)?
            }
        };
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
        signals.stepping();
        let c = &self.spec.config;
        let every = c.output.diagnostics_every.max(1) as u64;
        while self.state.ti < self.ti_end {
            self.step()?;
            let ti = self.state.ti;
            let finished = ti >= self.ti_end;
            // The last snapshot is at t_end; a regular one less than half an interval before
            // it would be a near-duplicate (a spike in every time derivative), so it is left out.
            let at_snapshot = finished
                || self.snapshot_every.is_some_and(|s| {
                    ti.is_multiple_of(s) && 2 * self.ti_end.saturating_sub(ti) >= s
                });
            // Signals and the wall clock are seen per rank; the ranks act on them together.
            let local = [
                f64::from(signals.received().unwrap_or(0)),
                f64::from(u8::from(
                    self.last_checkpoint.elapsed() >= self.checkpoint_wall,
                )),
            ];
            let agreed = allreduce_max(self.comm, &local)?;
            let signal = (agreed[0] > 0.0).then_some(agreed[0] as i32);
            let at_checkpoint = finished
                || signal.is_some()
                || self.checkpoint_every.is_some_and(|s| ti.is_multiple_of(s))
                || agreed[1] > 0.0;
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

    /// One kick-drift-kick step of the length the criterion allows, or in the block scheme
    /// one cycle of steps from a synchronisation point to the next.
    fn step(&mut self) -> Result<(), RunError> {
        let integ = &self.spec.config.integrator;
        if integ.scheme == StepScheme::Block {
            return self.block_cycle();
        }
        let start = Instant::now();
        self.load_resident()?;
        let wanted = if integ.fixed_step {
            f64::INFINITY
        } else {
            let a_max = allreduce_max(self.comm, &self.max_acceleration_by_component()?)?;
            match component_softening(self.spec) {
                // Each component's fastest particle against its own softening length.
                Some(table) => (0..4)
                    .map(|c| criterion_dt(integ.eta, table[c], a_max[c]))
                    .fold(f64::INFINITY, f64::min),
                None => criterion_dt(
                    integ.eta,
                    self.spec.config.gravity.softening,
                    a_max.iter().fold(0.0, |m, &a| m.max(a)),
                ),
            }
        };
        let level = self.timeline.choose_level(self.state.ti, wanted)?;
        let dt = self.timeline.level_dt(level);
        self.apply(Operator::Kick, 0.5 * dt)?;
        self.apply(Operator::Drift, dt)?;
        self.wall.integrate += start.elapsed().as_secs_f64();
        self.compute_forces(None)?;
        let start = Instant::now();
        self.apply(Operator::Kick, 0.5 * dt)?;
        self.state.ti += Timeline::level_ticks(level);
        self.state.step += 1;
        self.state.last_dt = dt;
        self.wall.integrate += start.elapsed().as_secs_f64();
        Ok(())
    }

    /// The step each particle's own acceleration asks for, `eta sqrt(eps / |a|)` with its
    /// softening length: of the particles of `rows`, or of all without them.
    fn wanted_steps(&self, rows: Option<&[u32]>) -> Vec<f64> {
        let eta = self.spec.config.integrator.eta;
        let eps = self.spec.config.gravity.softening;
        let table = component_softening(self.spec);
        let p = &self.particles;
        let wanted = |i: usize| {
            let (a, c) = (p.acc[i], p.component[i]);
            let e = table.map_or(eps, |t| t[c.index()]);
            criterion_dt(eta, e, (a[0] * a[0] + a[1] * a[1] + a[2] * a[2]).sqrt())
        };
        match rows {
            None => (0..p.len()).into_par_iter().map(wanted).collect(),
            Some(rows) => rows.par_iter().map(|&i| wanted(i as usize)).collect(),
        }
    }

    /// One cycle of the block scheme (`integrate::block`), from the synchronisation point
    /// the run is at to the next: rungs from every particle's acceleration, the opening
    /// half kicks, then at each tick where steps end a drift of everybody, forces for the
    /// particles whose step ends, their closing half kick, and (unless everybody is
    /// synchronised) a new rung and opening half kick. A sub-step's bookkeeping here and
    /// its traffic with a device go with its active particles only (a list of their rows).
    fn block_cycle(&mut self) -> Result<(), RunError> {
        let integ = &self.spec.config.integrator;
        let deepest = integ.max_rungs as u32;
        let start = Instant::now();
        self.load_resident()?;
        let ti0 = self.state.ti;
        let n = self.particles.len();
        let rung = rungs_for(&self.timeline, ti0, &self.wanted_steps(None), deepest)?;
        let mut rungs = Rungs::start(ti0, rung);
        let own = rungs.histogram(deepest);
        let mut finest = own.iter().rposition(|&c| c > 0).unwrap_or(0) as u32;
        let histogram = allreduce_sum(self.comm, &own)?;
        let timeline = self.timeline;
        let half_step = move |r: u32| 0.5 * timeline.level_dt(r);
        let half: Vec<f64> = rungs.rung().par_iter().map(|&r| half_step(r)).collect();
        self.kick_each(None, &half)?;
        let mut ti = ti0;
        self.wall.integrate += start.elapsed().as_secs_f64();
        loop {
            let start = Instant::now();
            let next = allgatherv(self.comm, &[rungs.next_end()])?
                .iter()
                .flatten()
                .copied()
                .min()
                .unwrap_or(u64::MAX);
            if next == u64::MAX {
                // No particle on any rank: on to the next multiple of dt_max.
                ti = (ti0 / TICKS_PER_DT_MAX + 1) * TICKS_PER_DT_MAX;
                break;
            }
            self.apply(Operator::Drift, self.timeline.span(ti, next))?;
            ti = next;
            rungs.advance(ti);
            let count = rungs.count_ending() as u64;
            let counts = allreduce_sum(self.comm, &[count, n as u64])?;
            let everyone = counts[0] == counts[1];
            self.block.evaluations += counts[0];
            self.wall.integrate += start.elapsed().as_secs_f64();
            if everyone {
                // The full evaluation may move particles between ranks (rebalancing on the
                // cycle's work): their rungs travel with them for the closing half kick.
                self.particles.rung = rungs.rung().iter().map(|&r| r as u8).collect();
                self.compute_forces(None)?;
                let start = Instant::now();
                let rung = std::mem::take(&mut self.particles.rung);
                let half: Vec<f64> = rung.par_iter().map(|&r| half_step(u32::from(r))).collect();
                self.kick_each(None, &half)?;
                // The next cycle's rungs come from these accelerations.
                self.fetch_accelerations(None)?;
                self.wall.integrate += start.elapsed().as_secs_f64();
                break;
            }
            let active = rungs.ending_rows();
            self.compute_forces(Some(&active))?;
            let start = Instant::now();
            self.fetch_accelerations(Some(&active))?;
            let closing: Vec<f64> = active
                .par_iter()
                .map(|&i| half_step(rungs.rung()[i as usize]))
                .collect();
            self.kick_each(Some(&active), &closing)?;
            let wanted = self.wanted_steps(Some(&active));
            let mut opening = Vec::with_capacity(active.len());
            for (&i, &w) in active.iter().zip(&wanted) {
                let r = rung_for(&self.timeline, ti, w, deepest)?;
                rungs.restart(i, r);
                finest = finest.max(r);
                opening.push(half_step(r));
            }
            self.kick_each(Some(&active), &opening)?;
            self.wall.integrate += start.elapsed().as_secs_f64();
        }
        let finest = allreduce_max(self.comm, &[f64::from(finest)])?[0] as u32;
        let cycle = (ti - ti0) / Timeline::level_ticks(finest);
        self.block.global_evaluations += (histogram.iter().sum::<u64>() * cycle) as f64;
        self.block.histogram = histogram;
        self.state.ti = ti;
        self.state.step += 1;
        self.state.last_dt = self.timeline.level_dt(finest);
        Ok(())
    }

    /// A diagnostics row (collective): global sums, the slowest rank's phase times, and
    /// per solver figure the largest over ranks (every rank's in `ranks.csv`).
    fn write_diagnostics(&mut self) -> Result<(), RunError> {
        let start = Instant::now();
        let conserved = self.conserved()?;
        self.wall.diagnostics += start.elapsed().as_secs_f64();
        let interactions = allreduce_sum(self.comm, &[self.interactions])?[0];
        let w = &self.wall;
        let wall = allreduce_max(self.comm, &[w.force, w.integrate, w.diagnostics, w.io])?;
        let values: Vec<f64> = self.solver_stats.iter().map(|s| s.value).collect();
        let per_rank = allgatherv(self.comm, &values)?;
        if let Some(logs) = &mut self.logs {
            let mut largest = per_rank[0].clone();
            for other in &per_rank[1..] {
                for (a, b) in largest.iter_mut().zip(other) {
                    *a = a.max(*b);
                }
            }
            let time = self.timeline.time(self.state.ti);
            let integ = &self.spec.config.integrator;
            if integ.scheme == StepScheme::Block {
                let total = self.block.histogram.iter().sum::<u64>();
                largest.extend(self.block.values(total, time, integ.max_rungs as u32));
            }
            let row = Row {
                step: self.state.step,
                time,
                dt: self.state.last_dt,
                conserved,
                energy0: self.state.energy0,
                interactions,
                wall: PhaseTimes {
                    force: wall[0],
                    integrate: wall[1],
                    diagnostics: wall[2],
                    io: wall[3],
                },
                solver: &largest,
            };
            let path = logs.diagnostics.path().to_path_buf();
            logs.diagnostics
                .append(&row)
                .map_err(io_err(&path, "writing diagnostics"))?;
            if let Some(ranks) = &mut logs.ranks {
                let path = self.spec.run_dir.join("ranks.csv");
                ranks
                    .append(self.state.step, time, &per_rank)
                    .map_err(io_err(&path, "writing the per-rank log"))?;
            }
        }
        self.wall = PhaseTimes::default();
        self.interactions = 0;
        self.block = BlockFigures {
            histogram: std::mem::take(&mut self.block.histogram),
            since: self.timeline.time(self.state.ti),
            ..BlockFigures::default()
        };
        for stat in self.solver_stats.iter_mut().filter(|s| s.summed) {
            stat.value = 0.0;
        }
        Ok(())
    }

    /// Snapshot (collective): one file, or one file per rank in a GADGET multi-file set.
    fn write_snapshot(&mut self) -> Result<(), RunError> {
        let start = Instant::now();
        self.sync_host()?;
        // A snapshot never holds a state the solvers would refuse: the run stops first.
        let local = crate::gravity::check_finite(&self.particles)
            .map_err(|e| e.to_string())
            .and_then(|()| finite_velocities(&self.particles));
        agree(self.comm, local).map_err(|reason| {
            RunError::State(format!(
                "{}: no snapshot written at step {}: {reason}",
                self.spec.config.name, self.state.step
            ))
        })?;
        let c = &self.spec.config;
        let (rank, ranks) = (self.comm.rank(), self.comm.size());
        let index = self.state.snapshots_written;
        let path = snapshot_file(&self.spec.run_dir, index, rank, ranks);
        let multi_file = if ranks > 1 {
            let total = allreduce_sum(self.comm, &part_type_counts(&self.particles))?;
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)
                    .map_err(io_err(dir, "creating the snapshot folder"))?;
            }
            let mut t = [0u64; 6];
            t.copy_from_slice(&total);
            Some(MultiFile {
                files: ranks as u32,
                total: t,
            })
        } else {
            None
        };
        let info = SnapshotInfo {
            time: self.timeline.time(self.state.ti),
            units: c.units,
            precision: c.output.snapshot_precision,
            potential: c.output.snapshot_potential,
            acceleration: c.output.snapshot_acceleration,
            parameters: flatten(c),
            settings_text: Some(&self.spec.source.text),
            multi_file,
            softening: Some(component_softening(self.spec).unwrap_or([c.gravity.softening; 4])),
        };
        write_snapshot(&path, &self.particles, &info)?;
        self.state.snapshots_written += 1;
        self.wall.io += start.elapsed().as_secs_f64();
        Ok(())
    }

    /// Checkpoint (collective): one file, or a rank set committed by rank 0 only after every
    /// rank has written its file.
    fn write_checkpoint(&mut self) -> Result<PathBuf, RunError> {
        let start = Instant::now();
        self.sync_host()?;
        let (rank, ranks) = (self.comm.rank(), self.comm.size());
        let ckpt = Checkpoint {
            version: env!("CARGO_PKG_VERSION").to_string(),
            config_text: self.spec.source.text.clone(),
            state: self.state.clone(),
            particles: self.particles.clone(),
            caps: self.solver.caps(),
            decomposition_work: if ranks > 1 {
                self.solver.decomposition_work()
            } else {
                Vec::new()
            },
        };
        let keep = self.spec.config.output.keep_checkpoints.max(1) as usize;
        let dir = checkpoint_dir(&self.spec.run_dir);
        let step = self.state.step;
        let path = if ranks == 1 {
            checkpoint::write(&dir, step, &ckpt, keep)?
        } else {
            let time = self.timeline.time(self.state.ti);
            let set_id = checkpoint::set_identity(&self.spec.source.text, step, time, ranks);
            let identity = checkpoint::RankIdentity {
                set_id,
                step,
                rank: rank as u32,
                ranks: ranks as u32,
            };
            let written = checkpoint::write_rank(&dir, identity, &ckpt);
            // Each rank's digest and count (40 bytes; empty where its write failed) reach
            // rank 0 for the manifest.
            let mut mine = Vec::new();
            if let Ok(digest) = &written {
                mine.extend_from_slice(digest);
                mine.extend_from_slice(&(self.particles.len() as u64).to_le_bytes());
            }
            let all = allgatherv(self.comm, &mine)?;
            written?;
            if all.iter().any(|b| b.len() != 40) {
                return Err(RunError::State(format!(
                    "the checkpoint of step {step} failed on another rank; it was not committed"
                )));
            }
            if rank == 0 {
                let files = all
                    .iter()
                    .map(|b| {
                        let mut digest = [0u8; 32];
                        digest.copy_from_slice(&b[..32]);
                        let mut count = [0u8; 8];
                        count.copy_from_slice(&b[32..]);
                        (digest, u64::from_le_bytes(count))
                    })
                    .collect();
                let summary = checkpoint::SetSummary {
                    set_id,
                    step,
                    time,
                    files,
                };
                checkpoint::commit_set(&dir, &summary, keep)?;
            }
            // Committed before any rank goes on (and might be stopped).
            self.comm.barrier()?;
            dir.join(checkpoint::manifest_name(step))
        };
        self.last_checkpoint = Instant::now();
        self.wall.io += start.elapsed().as_secs_f64();
        Ok(path)
    }
}

/// Makes one rank's failure every rank's (collective): the first rank's reason, in rank
/// order, or `Ok` when every rank passed.
fn agree(comm: &dyn Communicator, local: Result<(), String>) -> Result<(), String> {
    let reason = local.err().unwrap_or_default();
    let reasons = allgatherv(comm, reason.as_bytes()).map_err(|e| e.to_string())?;
    match reasons.iter().find(|r| !r.is_empty()) {
        Some(r) => Err(String::from_utf8_lossy(r).into_owned()),
        None => Ok(()),
    }
}

/// The first particle whose velocity is NaN or infinite, as a message.
fn finite_velocities(p: &Particles) -> Result<(), String> {
    match p.vel.iter().position(|v| !v.iter().all(|x| x.is_finite())) {
        Some(i) => Err(format!(
            "particle {} has a non-finite velocity ({}, {}, {}); the simulation state is corrupt",
            p.id[i],
            short(p.vel[i][0]),
            short(p.vel[i][1]),
            short(p.vel[i][2])
        )),
        None => Ok(()),
    }
}

/// Takes the run folder's lock on rank 0 (collective): every rank fails alike, with the
/// holder's PID, when another process writes the folder.
fn lock_run_folder(run_dir: &Path, comm: &dyn Communicator) -> Result<Option<RunLock>, RunError> {
    let (lock, local) = if comm.rank() == 0 {
        match RunLock::acquire(run_dir) {
            Ok(lock) => (Some(lock), Ok(())),
            Err(e) => (None, Err(e.to_string())),
        }
    } else {
        (None, Ok(()))
    };
    agree(comm, local).map_err(RunError::State)?;
    Ok(lock)
}

/// Removes the snapshots numbered `first` and later, in either layout (`snap_NNN.hdf5` of
/// one rank, `snapdir_NNN/` of several): a resume from a checkpoint taken before them writes
/// them again, and a stale file (another layout, or a rank beyond the new count) must not
/// survive beside the new ones.
fn remove_snapshots_from(run_dir: &Path, first: u32) -> Result<(), RunError> {
    let dir = snapshot_dir(run_dir);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Ok(());
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let index = name
            .strip_prefix("snapdir_")
            .or_else(|| {
                name.strip_prefix("snap_")
                    .and_then(|r| r.strip_suffix(".hdf5"))
            })
            .and_then(|i| i.parse::<u32>().ok());
        if index.is_some_and(|i| i >= first) {
            let path = entry.path();
            let removed = if path.is_dir() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
            removed.map_err(io_err(
                &path,
                "removing a snapshot written after the checkpoint",
            ))?;
        }
    }
    Ok(())
}

/// Reads the newest valid checkpoint (collective) and takes this rank's part: its own file
/// when the rank count is unchanged (bit-exact), otherwise an equal share of all particles
/// (redistribution; the next force evaluation rebalances).
fn load_checkpoint(
    spec: &RunSpec,
    comm: &dyn Communicator,
    progress: &Progress,
    timeline: &Timeline,
    inputs_recorded: bool,
) -> Result<Resumed, RunError> {
    let c = &spec.config;
    let ckpt_dir = checkpoint_dir(&spec.run_dir);
    let (rank, ranks) = (comm.rank(), comm.size());
    // The step comes from the content: a copy named as another step is corrupt.
    let check = |step: u64, loaded: &checkpoint::Loaded<Checkpoint>| {
        verify_checkpoint(loaded)?;
        match loaded.payloads.first().map(|c| c.state.step) {
            Some(inside) if inside != step => {
                Err(format!("named as step {step} but holds step {inside}"))
            }
            _ => Ok(()),
        }
    };
    let found = checkpoint::newest_valid::<Checkpoint>(&ckpt_dir, check)?
        .ok_or_else(|| RunError::State(format!("no checkpoint in {}", ckpt_dir.display())))?;
    let path = found.entry.path().to_path_buf();
    let first = found
        .payloads
        .first()
        .ok_or_else(|| RunError::State(format!("{}: the checkpoint is empty", path.display())))?;
    check_resumable(spec, first, &path, inputs_recorded)?;
    // Every rank has read before rank 0 renames anything.
    comm.barrier()?;
    if rank == 0 {
        for (bad, reason) in &found.rejected {
            let aside = checkpoint::set_aside(bad)?;
            progress.warn(&format!(
                "{reason}; set aside as {} and resuming from the previous checkpoint",
                aside.display()
            ));
        }
    }
    let state = first.state.clone();
    progress.note(&format!(
        "{}: resuming from {} (step {}, t = {})",
        c.name,
        path.display(),
        state.step,
        timeline.time(state.ti)
    ));
    let saved = found.payloads.len();
    if saved == ranks {
        let mut mine = found.payloads.into_iter().nth(rank).ok_or_else(|| {
            RunError::State(format!("{}: no file for rank {rank}", path.display()))
        })?;
        if mine.decomposition_work.len() != mine.particles.len() {
            mine.decomposition_work.clear();
        }
        return Ok(Resumed {
            state,
            particles: mine.particles,
            caps: mine.caps,
            work: mine.decomposition_work,
        });
    }
    progress.note(&format!(
        "{}: the checkpoint was written by {saved} rank(s); redistributing its particles over {ranks}",
        c.name
    ));
    let mut all = Particles::default();
    for ckpt in found.payloads {
        all.extend(ckpt.particles);
    }
    let n = all.len();
    Ok(Resumed {
        state,
        particles: all.slice(n * rank / ranks..n * (rank + 1) / ranks),
        caps: None,
        work: Vec::new(),
    })
}

/// Checks a verified checkpoint's contents as a whole: every rank file at the same step
/// and time, each holding the particles its manifest says, the total the particle count of
/// the run that wrote it (`ics.n` of its own config, for a model), and every particle ID
/// once. A checkpoint that fails is treated as corrupt.
pub fn verify_checkpoint(loaded: &checkpoint::Loaded<Checkpoint>) -> Result<(), String> {
    let first = loaded
        .payloads
        .first()
        .ok_or_else(|| "the checkpoint holds no rank files".to_string())?;
    for (r, p) in loaded.payloads.iter().enumerate() {
        if p.state != first.state {
            return Err(format!(
                "rank {r} is at step {}, rank 0 at step {}: the files come from different checkpoints",
                p.state.step, first.state.step
            ));
        }
    }
    if let Some(m) = &loaded.manifest {
        if m.step != first.state.step {
            return Err(format!(
                "the manifest is of step {}, its files of step {}",
                m.step, first.state.step
            ));
        }
        for (r, (p, listed)) in loaded.payloads.iter().zip(&m.files).enumerate() {
            if p.particles.len() as u64 != listed.particles {
                return Err(format!(
                    "rank {r}'s file holds {} particles, the manifest says {}",
                    p.particles.len(),
                    listed.particles
                ));
            }
        }
    }
    let total: usize = loaded.payloads.iter().map(|p| p.particles.len()).sum();
    let model_n = parse_stored_config(&first.config_text)
        .ok()
        .and_then(|c| c.ics.n.filter(|_| c.ics.model.is_some()));
    if let Some(n) = model_n
        && total as i64 != n
    {
        return Err(format!("it holds {total} particles, its run has n = {n}"));
    }
    let mut ids: Vec<u64> = loaded
        .payloads
        .iter()
        .flat_map(|p| p.particles.id.iter().copied())
        .collect();
    ids.sort_unstable();
    if let Some(w) = ids.windows(2).find(|w| w[0] == w[1]) {
        return Err(format!("particle ID {} appears more than once", w[0]));
    }
    Ok(())
}

/// A config text stored in a checkpoint, parsed as `RunSpec::load` parses a file.
pub fn parse_stored_config(text: &str) -> Result<RunConfig, ConfigError> {
    crate::config::parse_run_config(&crate::config::SourceText {
        path: PathBuf::from("(the checkpoint's config)"),
        text: text.to_string(),
    })
}

/// Whether the run may start or go on in its folder (rank 0): a folder with outputs needs
/// `--resume`; without a checkpoint only the same config and inputs may start it again; with
/// one, the inputs must match the folder's record. Returns the inputs to record.
fn folder_verdict(
    spec: &RunSpec,
    options: &RunOptions,
    has_outputs: bool,
    no_checkpoint: bool,
) -> Result<RunInputs, String> {
    let run_dir = &spec.run_dir;
    if has_outputs && !options.resume {
        return Err(format!(
            "run folder {} already holds a run (snapshots, checkpoints or diagnostics); pass --resume to continue it, or change 'name' in {} to start another",
            run_dir.display(),
            spec.source.path.display()
        ));
    }
    let now = RunInputs::of(&spec.ics).map_err(|e| e.to_string())?;
    if !has_outputs {
        return Ok(now);
    }
    let recorded = RunInputs::read(run_dir).map_err(|e| e.to_string())?;
    let changed = recorded.as_ref().and_then(|r| r.difference(&now));
    if no_checkpoint {
        // A run stopped before its first checkpoint starts again when its config and inputs
        // are the ones it was started with (a run is deterministic: the same snapshots come
        // again); otherwise a fresh start would overwrite its snapshots with another run.
        let same_config = crate::io::read_regular_text(&run_dir.join("config.toml"))
            .is_ok_and(|t| t == spec.source.text);
        let why = if !same_config {
            format!(
                "its config.toml differs from {}",
                spec.source.path.display()
            )
        } else if let Some(change) = &changed {
            format!("its inputs differ ({change})")
        } else if recorded.is_none() {
            format!("it has no {INPUTS_FILE} recording its inputs")
        } else {
            return Ok(now);
        };
        let snapshots = snapshot_dir(run_dir)
            .read_dir()
            .map_or(0, |d| d.flatten().count());
        return Err(format!(
            "run folder {} holds {snapshots} snapshot(s){} but no checkpoint, and {why}, so --resume cannot continue it; to start afresh, remove the folder (or change 'name')",
            run_dir.display(),
            if run_dir.join("diagnostics.csv").exists() {
                " and diagnostics.csv"
            } else {
                ""
            },
        ));
    }
    match changed {
        Some(change) => Err(change),
        None => Ok(now),
    }
}

/// Refuses to resume when the config changed in a way that breaks the run's continuity.
/// The input paths may change when the folder's record vouches for the inputs' content.
fn check_resumable(
    spec: &RunSpec,
    ckpt: &Checkpoint,
    path: &Path,
    inputs_recorded: bool,
) -> Result<(), RunError> {
    let saved = parse_stored_config(&ckpt.config_text).map_err(|e| {
        RunError::State(format!(
            "{}: the config stored in this checkpoint no longer parses ({e}); resume with the leapfmm version that wrote it ({})",
            path.display(),
            ckpt.version
        ))
    })?;
    let also_allowed: &[&str] = if inputs_recorded {
        &INPUT_PATH_KEYS
    } else {
        &[]
    };
    if let Some((key, was, now)) = resume_conflicts(&saved, &spec.config, also_allowed)
        .into_iter()
        .next()
    {
        return Err(RunError::State(format!(
            "{}: key '{key}' changed since the checkpoint (was {was}, now {now}); restore it to resume, or start a new run under another name",
            spec.source.path.display()
        )));
    }
    Ok(())
}

/// Builds this rank's initial particles (collective): its share of the model's sampling
/// blocks, centred with every rank's block sums, or its share of a file's particles; in
/// the run's units. The first force evaluation then balances the ranks.
fn initial_particles(
    spec: &RunSpec,
    comm: &dyn Communicator,
    progress: &Progress,
) -> Result<Particles, RunError> {
    let (rank, ranks) = (comm.rank(), comm.size());
    match &spec.ics {
        IcSource::Model { model, n, .. } => {
            let share = Share { rank, ranks };
            let (mut particles, warnings) = ics::generate_share(model, *n, spec.config.seed, share);
            let moments: Vec<_> = allgatherv(comm, &block_moments(&particles))?
                .into_iter()
                .flatten()
                .collect();
            centre_on(&mut particles, &moments);
            for w in warnings {
                progress.warn(&w);
            }
            Ok(particles)
        }
        IcSource::File { path } => {
            let data = read_snapshot(path)?;
            let mut p = data.particles;
            if p.len() < 2 {
                return Err(RunError::State(format!(
                    "{}: the file holds {} particle(s); a run needs at least 2 (one has no self-gravity, and its virial ratio is undefined)",
                    path.display(),
                    p.len()
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
                (None, Some(_)) if data.nbody => progress.note(&format!(
                    "{}: the file is in N-body units (G = 1), but the run uses '{}' units; values are used as they are",
                    path.display(),
                    spec.config.units.name()
                )),
                (None, _) => {}
            }
            let n = p.len();
            Ok(if ranks > 1 {
                p.slice(n * rank / ranks..n * (rank + 1) / ranks)
            } else {
                p
            })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gravity::{ForceReport, ResidentState};

    /// A solver whose "device" is a private copy of the particles, written back only by
    /// `store`: a run that read the host's particles without bringing them up to date
    /// first would write stale velocities and energies, so the step loop's handling of
    /// resident state is checked without a GPU.
    struct Mirror {
        inner: Box<dyn GravitySolver>,
        device: Particles,
        kicks: Arc<AtomicUsize>,
    }

    impl GravitySolver for Mirror {
        fn name(&self) -> &'static str {
            self.inner.name()
        }

        fn compute(&mut self, particles: &mut Particles) -> Result<ForceReport, GravityError> {
            self.inner.compute(particles)
        }

        fn stat_names(&self) -> Vec<&'static str> {
            self.inner.stat_names()
        }

        fn caps(&self) -> Option<Caps> {
            self.inner.caps()
        }

        fn set_caps(&mut self, caps: Caps) {
            self.inner.set_caps(caps);
        }

        fn resident(&mut self) -> Option<&mut dyn ResidentState> {
            Some(self)
        }
    }

    impl ResidentState for Mirror {
        fn load(&mut self, particles: &Particles) -> Result<(), GravityError> {
            self.device = particles.clone();
            Ok(())
        }

        fn kick(&mut self, h: f64) -> Result<(), GravityError> {
            self.kicks.fetch_add(1, Ordering::SeqCst);
            kick(&mut self.device, h);
            Ok(())
        }

        fn drift(&mut self, h: f64) -> Result<(), GravityError> {
            drift(&mut self.device, h);
            Ok(())
        }

        fn compute(&mut self, particles: &mut Particles) -> Result<ForceReport, GravityError> {
            let report = self.inner.compute(&mut self.device)?;
            particles.pos.clone_from(&self.device.pos);
            Ok(report)
        }

        fn compute_active(
            &mut self,
            particles: &mut Particles,
            active: &[u32],
        ) -> Result<ForceReport, GravityError> {
            let flags = active_flags(active, self.device.len());
            let report = self.inner.compute_active(&mut self.device, &flags)?;
            particles.pos.clone_from(&self.device.pos);
            // The others' accelerations are undefined on a device: a run that read them
            // before their next evaluation would differ from the host's.
            for (a, &on) in self.device.acc.iter_mut().zip(&flags) {
                if !on {
                    *a = [f64::NAN; 3];
                }
            }
            Ok(report)
        }

        fn kick_each(&mut self, rows: Option<&[u32]>, h: &[f64]) -> Result<(), GravityError> {
            self.kicks.fetch_add(1, Ordering::SeqCst);
            kick_each(&mut self.device, rows, h);
            Ok(())
        }

        fn accelerations(
            &mut self,
            particles: &mut Particles,
            only: Option<&[u32]>,
        ) -> Result<(), GravityError> {
            match only {
                None => particles.acc.clone_from(&self.device.acc),
                Some(rows) => {
                    for &i in rows {
                        particles.acc[i as usize] = self.device.acc[i as usize];
                    }
                }
            }
            Ok(())
        }

        fn max_acceleration_by_component(&mut self) -> Result<[f64; 4], GravityError> {
            Ok(max_acceleration_by_component(&self.device))
        }

        fn conserved_sums(&mut self) -> Result<[f64; CONSERVED_SUMS], GravityError> {
            Ok(Conserved::sums(&self.device))
        }

        fn store(&mut self, particles: &mut Particles) -> Result<(), GravityError> {
            particles.pos.clone_from(&self.device.pos);
            particles.vel.clone_from(&self.device.vel);
            particles.acc.clone_from(&self.device.acc);
            particles.pot.clone_from(&self.device.pot);
            Ok(())
        }
    }

    /// Runs a 400-particle Plummer sphere (FMM, adaptive steps of the `scheme`, diagnostics
    /// every third step, snapshots and checkpoints on their own intervals) named `name` to
    /// `t_end`, on the host or with its state resident on a `Mirror`; the device's kick
    /// count.
    fn plummer(
        dir: &Path,
        name: &str,
        t_end: f64,
        mirror: bool,
        resume: bool,
        scheme: &str,
    ) -> usize {
        let text = format!(
            "name = \"{name}\"\noutput_dir = \"{}\"\nunits = \"nbody\"\nseed = 5\n[ics]\nmodel = \"{}\"\nn = 400\n[gravity]\nsoftening = 0.05\n[integrator]\nt_end = {t_end}\ndt_max = 0.0625\neta = 0.1\nscheme = \"{scheme}\"\n[output]\ndiagnostics_every = 3\nsnapshot_interval = 0.25\ncheckpoint_interval = 0.125\nsnapshot_precision = \"double\"\n",
            dir.join("runs").display(),
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("ics/plummer.toml")
                .display()
        );
        let path = dir.join(format!("{name}.toml"));
        std::fs::write(&path, text).unwrap();
        let spec = RunSpec::load(&path).unwrap();
        let backend = Chosen::Cpu("requested".into());
        let host = make_solver(&spec, SingleRank, &backend).unwrap();
        let kicks = Arc::new(AtomicUsize::new(0));
        let solver: Box<dyn GravitySolver> = if mirror {
            Box::new(Mirror {
                inner: host,
                device: Particles::default(),
                kicks: Arc::clone(&kicks),
            })
        } else {
            host
        };
        let options = RunOptions {
            resume,
            quiet: true,
            ranks: 1,
            group: None,
        };
        let signals = SignalGuard::install().unwrap();
        run_rank(&spec, options, &SingleRank, solver, &backend, &signals).unwrap();
        kicks.load(Ordering::SeqCst)
    }

    /// The physics columns (step to virial ratio) of a run's diagnostics.
    fn physics(dir: &Path, name: &str) -> Vec<String> {
        let text =
            std::fs::read_to_string(dir.join("runs").join(name).join("diagnostics.csv")).unwrap();
        text.lines()
            .map(|l| l.split(',').take(17).collect::<Vec<_>>().join(","))
            .collect()
    }

    fn last_snapshot(dir: &Path, name: &str) -> Particles {
        let snaps = snapshot_dir(&dir.join("runs").join(name));
        let mut files: Vec<_> = std::fs::read_dir(snaps)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .collect();
        files.sort();
        read_snapshot(files.last().unwrap()).unwrap().particles
    }

    #[test]
    fn a_run_with_its_state_resident_on_a_device_writes_the_host_runs_bits() {
        for scheme in ["global", "block"] {
            resident_run_writes_the_host_runs_bits(scheme);
        }
    }

    fn resident_run_writes_the_host_runs_bits(scheme: &str) {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        assert_eq!(plummer(d, "host", 0.5, false, false, scheme), 0);
        let kicks = plummer(d, "device", 0.5, true, false, scheme);
        assert!(
            kicks > 16,
            "{scheme}: the device state was not used: {kicks} kicks"
        );
        // Stopped at 0.25 and resumed from its checkpoint, resident both times.
        plummer(d, "resumed", 0.25, true, false, scheme);
        plummer(d, "resumed", 0.5, true, true, scheme);
        let rows = physics(d, "host");
        assert!(rows.len() > 5, "{scheme}");
        assert_eq!(rows, physics(d, "device"), "{scheme}");
        assert_eq!(rows, physics(d, "resumed"), "{scheme}");
        let host = last_snapshot(d, "host");
        for name in ["device", "resumed"] {
            let p = last_snapshot(d, name);
            assert_eq!(host.pos, p.pos, "{scheme}: {name}");
            assert_eq!(host.vel, p.vel, "{scheme}: {name}");
        }
    }
}
