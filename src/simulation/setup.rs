//! Setting a run up: which backend runs the passes and which solver (direct, FMM, distributed,
//! GPU), the initial particles (model or IC file, this rank's share), and the first step
//! (`Simulation::prepare` and `start`: fresh, or from a checkpoint through `resume`).

use super::error::{RunError, agree, io_err};
use super::folder::{
    RunState, checkpoint_dir, remove_snapshots_from, snapshot_dir, write_atomically,
};
use super::logs::{BlockFigures, EXTERNAL_COLUMN, Logs};
use super::options::RunOptions;
use super::resume::{folder_verdict, load_checkpoint, lock_run_folder};
use super::state::{Residence, Simulation};
use crate::config::{
    Backend, DEFAULT_ACCURACY, IcSource, RunSpec, SolverKind, StepScheme, whole_multiple,
};
use crate::distributed::comm::{Communicator, allgatherv, allreduce_sum};
use crate::distributed::driver::DistributedFmm;
use crate::fmm::caps::CapsPolicy;
use crate::fmm::p2p::NearFieldPrecision;
use crate::fmm::presets::PresetsStore;
use crate::fmm::{FmmSettings, FmmSolver};
use crate::gpu::backend::{Chosen, DeviceInfo, choose, probe};
use crate::gravity::direct::DirectSummation;
use crate::gravity::{GravityError, GravitySolver, Softening};
use crate::ics;
use crate::ics::Share;
use crate::ics::encounter;
use crate::ics::sampling::{block_moments, centre_on};
use crate::integrate::diagnostics::PhaseTimes;
use crate::integrate::timestep::Timeline;
use crate::io::checkpoint;
use crate::io::inputs::INPUTS_FILE;
use crate::io::snapshot::read_snapshot;
use crate::particles::Particles;
use crate::progress::Progress;
use crate::units::UnitSystem;
use std::time::{Duration, Instant};

/// Softening lengths per component (`Component::index`) when the run's model gives
/// components their own (`None` when one length serves every particle).
pub fn component_softening(spec: &RunSpec) -> Option<[f64; 4]> {
    match &spec.ics {
        IcSource::Model { model, .. } => model.component_softening(spec.config.gravity.softening),
        IcSource::Galaxies(encounter) => {
            encounter.component_softening(spec.config.gravity.softening)
        }
        IcSource::File { .. } => None,
    }
}

/// What the GPU backend does without an error test in its walk (issue 34): the default
/// accuracy target is not held there.
fn gpu_without_target() -> String {
    format!(
        "walks with the opening angle alone: it does not hold the default accuracy target ({DEFAULT_ACCURACY:e})"
    )
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
    } else if g.accuracy.is_some_and(|a| a > 0.0) {
        Some("walks with the opening angle only (no gravity.accuracy) for now")
    } else {
        None
    };
    let chosen = choose(g.backend, unsupported, thread_ranks, probe).map_err(|e| {
        RunError::State(format!(
            "{}: gravity.backend: {e}",
            spec.source.path.display()
        ))
    })?;
    // `auto` keeps the default accuracy target on a machine whose GPUs could take the run;
    // `cuda` trades it for the opening angle alone, and the run's log says so.
    Ok(match chosen {
        Chosen::Cuda(_) if g.backend == Backend::Auto && g.accuracy.is_none() => {
            Chosen::Cpu(format!(
                "auto: the GPU backend {}; gravity.accuracy = 0 runs there",
                gpu_without_target()
            ))
        }
        chosen => chosen,
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
            let accuracy = gravity.accuracy_on(matches!(backend, Chosen::Cuda(_)));
            let settings = FmmSettings {
                order: gravity.order_for(accuracy),
                theta: gravity.theta,
                accuracy,
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
    let mut gpu = crate::gpu::context::GpuFmm::open(ordinal, crate::gpu::kernel_cache().as_deref())
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

impl<'a> Simulation<'a> {
    pub(super) fn prepare(
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
            if matches!(backend, Chosen::Cuda(_)) && c.gravity.accuracy.is_none() {
                progress.note(&format!(
                    "{}: gravity: the GPU backend {} (θ = {}, p = {}); set gravity.accuracy = 0 to say so, or backend = \"cpu\" for the target",
                    c.name,
                    gpu_without_target(),
                    c.gravity.theta,
                    c.gravity.order_for(0.0)
                ));
            }
        }
        let logs = if rank == 0 {
            if let Some(inputs) = &inputs {
                // Before config.toml: a folder whose config.toml is there has its record.
                write_atomically(&run_dir.join(INPUTS_FILE), inputs.to_text()?.as_bytes())?;
            }
            write_atomically(&run_dir.join("config.toml"), spec.source.text.as_bytes())?;
            let step = resumed.as_ref().map(|r| r.state.step);
            let mut block = match c.integrator.scheme {
                StepScheme::Block => BlockFigures::names(c.integrator.max_rungs as u32),
                StepScheme::Global => Vec::new(),
            };
            if spec.external.is_some() {
                block.push(EXTERNAL_COLUMN.to_string());
            }
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
        if spec.external.as_ref().is_some_and(|e| e.moves()) {
            // Said once, so that a drifting rel_energy_error is not taken for an error.
            progress.note(&format!(
                "{}: an external potential's centre moves, so the energy is not conserved: rel_energy_error includes the work the moving potential does on the particles",
                c.name
            ));
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
    pub(super) fn start(&mut self) -> Result<(), RunError> {
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
        self.compute_forces(None, self.timeline.time(self.state.ti))?;
        self.state.energy0 = self.conserved()?.total();
        self.write_diagnostics()?;
        self.write_snapshot()?;
        self.write_checkpoint()?;
        Ok(())
    }
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
        IcSource::Galaxies(encounter) => {
            let share = Share { rank, ranks };
            let (parts, warnings) = encounter::sample_share(encounter, spec.config.seed, share);
            let moments: Vec<_> = allgatherv(
                comm,
                &parts.iter().flat_map(block_moments).collect::<Vec<_>>(),
            )?
            .into_iter()
            .flatten()
            .collect();
            let g = spec.config.units.gravitational_constant();
            let particles = encounter::assemble(encounter, parts, &moments, g);
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
