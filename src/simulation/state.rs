//! The one particle-state interface the step loop uses, whether the particles live on the
//! host or resident on the solver's device: kick, drift, forces, accelerations, maxima for the
//! step criterion and the conserved sums (`Residence` says where they are).

use super::error::RunError;
use super::folder::RunState;
use super::logs::{BlockFigures, Logs};
use crate::config::RunSpec;
use crate::distributed::comm::{Communicator, allreduce_sum};
use crate::gravity::active_flags;
use crate::gravity::{GravitySolver, SolverStat};
use crate::integrate::diagnostics::PhaseTimes;
use crate::integrate::diagnostics::{CONSERVED_SUMS, Conserved};
use crate::integrate::leapfrog::{drift, kick, kick_each, max_acceleration_by_component};
use crate::integrate::timestep::Timeline;
use crate::io::lock::RunLock;
use crate::particles::Particles;
use crate::progress::Progress;
use std::time::{Duration, Instant};

/// A run in progress (one rank's part of it).
pub(super) struct Simulation<'a> {
    pub(super) spec: &'a RunSpec,
    pub(super) comm: &'a dyn Communicator,
    pub(super) particles: Particles,
    pub(super) state: RunState,
    pub(super) solver: Box<dyn GravitySolver>,
    pub(super) timeline: Timeline,
    pub(super) ti_end: u64,
    pub(super) snapshot_every: Option<u64>,
    pub(super) checkpoint_every: Option<u64>,
    pub(super) checkpoint_wall: Duration,
    pub(super) last_checkpoint: Instant,
    /// The run's logs, written by rank 0 only.
    pub(super) logs: Option<Logs>,
    pub(super) progress: Progress,
    pub(super) wall: PhaseTimes,
    pub(super) interactions: u64,
    /// Solver figures since the last diagnostics row.
    pub(super) solver_stats: Vec<SolverStat>,
    /// Block-scheme figures since the last diagnostics row.
    pub(super) block: BlockFigures,
    /// Where the particle state is kept between steps.
    pub(super) residence: Residence,
    /// The run folder's lock (rank 0), held until the run ends.
    pub(super) _lock: Option<RunLock>,
}

/// The leapfrog's two operators.
#[derive(Debug, Clone, Copy)]
pub(super) enum Operator {
    /// `v += a h`.
    Kick,
    /// `x += v h`.
    Drift,
}

/// Where a run keeps its particle state between steps (design §7).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Residence {
    /// On the host (`Simulation::particles`): the CPU backend, and the block scheme.
    Host,
    /// On the solver's device (`GravitySolver::resident`), loaded at the first step.
    DeviceToLoad,
    /// On the solver's device; the host's copy is behind it when `host_behind` and is
    /// brought up to date before it is read (`Simulation::sync_host`).
    Device { host_behind: bool },
}

impl<'a> Simulation<'a> {
    /// The conserved quantities of all ranks' particles (summed where they are).
    pub(super) fn conserved(&mut self) -> Result<Conserved, RunError> {
        let on_device = self.on_device();
        let mine = match self.solver.resident().filter(|_| on_device) {
            Some(device) => device.conserved_sums()?,
            None => Conserved::sums(&self.particles),
        };
        let sums = allreduce_sum(self.comm, &mine)?;
        let mut all = [0.0; CONSERVED_SUMS];
        all.copy_from_slice(&sums);
        let mut conserved = Conserved::from_sums(&all);
        if let Some(external) = &self.spec.external {
            let t = self.timeline.time(self.state.ti);
            let mine = match self.solver.resident().filter(|_| on_device) {
                Some(device) => device.external_energy(&external.device_terms(t))?,
                None => external.energy(&self.particles.pos, &self.particles.mass, t),
            };
            conserved.external = allreduce_sum(self.comm, &[mine])?[0];
        }
        Ok(conserved)
    }

    /// Whether the particle state is on the solver's device now.
    fn on_device(&self) -> bool {
        matches!(self.residence, Residence::Device { .. })
    }

    /// Takes the particles onto the solver's device before the first step there.
    pub(super) fn load_resident(&mut self) -> Result<(), RunError> {
        if self.residence == Residence::DeviceToLoad {
            if let Some(device) = self.solver.resident() {
                device.load(&self.particles)?;
            }
            self.residence = Residence::Device { host_behind: false };
        }
        Ok(())
    }

    /// Brings the host's particles up to date with the device's before they are read.
    pub(super) fn sync_host(&mut self) -> Result<(), RunError> {
        if self.residence == (Residence::Device { host_behind: true }) {
            if let Some(device) = self.solver.resident() {
                device.store(&mut self.particles)?;
            }
            self.residence = Residence::Device { host_behind: false };
        }
        Ok(())
    }

    /// The leapfrog's `op` with step `h` for every particle, where the state is.
    pub(super) fn apply(&mut self, op: Operator, h: f64) -> Result<(), RunError> {
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
    pub(super) fn kick_each(&mut self, rows: Option<&[u32]>, h: &[f64]) -> Result<(), RunError> {
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
    pub(super) fn fetch_accelerations(&mut self, only: Option<&[u32]>) -> Result<(), RunError> {
        let on_device = self.on_device();
        if let Some(device) = self.solver.resident().filter(|_| on_device) {
            device.accelerations(&mut self.particles, only)?;
        }
        Ok(())
    }

    /// The largest |a| of each component's particles on this rank, where the state is.
    pub(super) fn max_acceleration_by_component(&mut self) -> Result<[f64; 4], RunError> {
        let on_device = self.on_device();
        Ok(match self.solver.resident().filter(|_| on_device) {
            Some(device) => device.max_acceleration_by_component()?,
            None => max_acceleration_by_component(&self.particles),
        })
    }

    /// Forces on every particle, or with `active` on those listed, at simulation time
    /// `time` (where a moving external potential's centres are).
    pub(super) fn compute_forces(
        &mut self,
        active: Option<&[u32]>,
        time: f64,
    ) -> Result<(), RunError> {
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
        if let Some(external) = &self.spec.external {
            match self.solver.resident().filter(|_| on_device) {
                Some(device) => device.add_external(&external.device_terms(time), active)?,
                None => {
                    let p = &mut self.particles;
                    external.add_accelerations(&p.pos, &mut p.acc, time, active);
                }
            }
        }
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
}
