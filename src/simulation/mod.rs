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
//!
//! Owns one run's life and its run folder. Must not implement physics itself (solvers,
//! integrator operators, samplers and formats are the other modules').

mod error;
mod folder;
mod logs;
mod options;
mod outputs;
mod resume;
mod setup;
mod signals;
mod state;
mod stepping;

pub use error::RunError;
pub use folder::{
    Checkpoint, RunState, checkpoint_dir, snapshot_dir, snapshot_file, snapshot_path,
};
pub use options::{RunOptions, RunOutcome};
pub use resume::{parse_stored_config, verify_checkpoint};
pub use setup::{choose_backend, component_softening, make_solver};
use signals::SignalGuard;
pub use signals::{EXIT_ABORTED, EXIT_STOPPED, StopRequest};
use state::Simulation;

use crate::config::{IcSource, RunSpec};
use crate::distributed::comm::{Communicator, SingleRank, run_thread_ranks};
use crate::gpu::backend::Chosen;
use crate::gravity::GravitySolver;
use std::time::Duration;

/// Collective waits of thread ranks give up after this long: a last resort, since a failing
/// rank stops the others at once.
const RANK_TIMEOUT: Duration = Duration::from_secs(3600);

/// Runs (or resumes) the run described by `spec` to its end time, on `options.ranks`
/// thread ranks.
pub fn run(spec: &RunSpec, options: RunOptions) -> Result<RunOutcome, RunError> {
    let ranks = options.ranks.max(1);
    if ranks == 1 {
        return run_with(spec, options, SingleRank);
    }
    let signals = SignalGuard::for_run(options.stop.as_ref())?;
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
    let signals = SignalGuard::for_run(options.stop.as_ref())?;
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
    let n = match &spec.ics {
        IcSource::Model { n, .. } => *n,
        IcSource::Galaxies(encounter) => encounter.particles(),
        IcSource::File { .. } => return Ok(()),
    };
    crate::memory::check(
        &spec.config.gravity,
        n as u64,
        ranks,
        local_ranks,
        backend,
        crate::files::available_host(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fmm::caps::Caps;
    use crate::gravity::{ForceReport, GravityError, ResidentState, active_flags};
    use crate::integrate::diagnostics::{CONSERVED_SUMS, Conserved};
    use crate::integrate::leapfrog::{drift, kick, kick_each, max_acceleration_by_component};
    use crate::io::snapshot::read_snapshot;
    use crate::particles::Particles;
    use std::path::Path;
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
        fn add_external(
            &mut self,
            _terms: &[f64],
            _rows: Option<&[u32]>,
        ) -> Result<(), GravityError> {
            Err(GravityError::Device(
                "the mirror adds no external potential".into(),
            ))
        }

        fn external_energy(&mut self, _terms: &[f64]) -> Result<f64, GravityError> {
            Err(GravityError::Device(
                "the mirror adds no external potential".into(),
            ))
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
            stop: None,
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
