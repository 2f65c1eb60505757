//! One run's life: initial conditions (or a checkpoint), the KDK step loop, snapshots,
//! checkpoints, diagnostics, and a clean stop on SIGINT/SIGTERM.
//!
//! Run folder layout: `config.toml` (the config as last run), `diagnostics.csv`,
//! `snapshots/snap_NNN.hdf5`, `checkpoints/checkpoint_SSSSSSSSSSSS.ckpt`. On K > 1 ranks
//! every rank runs the same loop on its own particles: snapshots are GADGET multi-file sets
//! (`snapshots/snapdir_NNN/snap_NNN.R.hdf5`), checkpoints are rank sets committed by a
//! manifest, rank 0 writes the logs (with per-rank figures in `ranks.csv`), and every global
//! decision (step size, energy, when to stop) comes from a collective, so all ranks agree.
//!
//! Here: the run's errors, options, outcome and checkpoint contents, `run` (thread ranks) and
//! `run_with` (one rank of a group), and the `Simulation` every part works on. `setup`
//! chooses the backend and solver and prepares the first step; `state` is the one
//! particle-state interface (host or resident on a device); `stepping` is the loop (global
//! steps and block cycles); `outputs` writes logs, snapshots and checkpoints; `resume` reads
//! a run folder back; `signals` stops a run cleanly.

mod outputs;
mod resume;
mod setup;
mod signals;
mod state;
mod stepping;

use crate::config::{ConfigError, IcSource, RunSpec};
use crate::distributed::comm::{CommError, Communicator, SingleRank, allgatherv, run_thread_ranks};
use crate::fmm::caps::Caps;
use crate::gpu::backend::Chosen;
use crate::gravity::{GravityError, GravitySolver, SolverStat};
use crate::integrate::diagnostics::PhaseTimes;
use crate::integrate::timestep::{Timeline, TimestepError};
use crate::io::checkpoint::CheckpointError;
use crate::io::inputs::InputsError;
use crate::io::lock::{LockError, RunLock};
use crate::io::snapshot::SnapshotError;
use crate::particles::Particles;
use crate::progress::Progress;
use outputs::Logs;
pub use resume::{parse_stored_config, verify_checkpoint};
use serde::{Deserialize, Serialize};
pub use setup::{choose_backend, component_softening, make_solver};
use signals::SignalGuard;
pub use signals::{EXIT_ABORTED, EXIT_STOPPED};
use state::Residence;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use stepping::BlockFigures;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gravity::{ForceReport, ResidentState, active_flags};
    use crate::integrate::diagnostics::{CONSERVED_SUMS, Conserved};
    use crate::integrate::leapfrog::{drift, kick, kick_each, max_acceleration_by_component};
    use crate::io::snapshot::read_snapshot;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

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
