//! The step loop: `advance` until `t_end` or a signal, one global KDK step (`step`) or one
//! cycle of the block scheme (`block_cycle`), both over the state interface of `state`.

use super::error::RunError;
use super::options::RunOutcome;
use super::setup::component_softening;
use super::signals::SignalGuard;
use super::state::{Operator, Simulation};
use crate::config::StepScheme;
use crate::distributed::comm::{allgatherv, allreduce_max, allreduce_sum};
use crate::integrate::block::{BlockKeeper, cycle};
use crate::integrate::timestep::{Timeline, criterion_dt};
use rayon::prelude::*;
use std::time::Instant;

impl<'a> Simulation<'a> {
    /// Steps until `t_end` or a signal.
    pub(super) fn advance(&mut self, signals: &SignalGuard) -> Result<RunOutcome, RunError> {
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
    pub(super) fn step(&mut self) -> Result<(), RunError> {
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
        let end = self.state.ti + Timeline::level_ticks(level);
        self.compute_forces(None, self.timeline.time(end))?;
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

    /// One cycle of the block scheme (`integrate::block::cycle`), from the synchronisation
    /// point the run is at to the next, over the state interface (host or device).
    fn block_cycle(&mut self) -> Result<(), RunError> {
        let deepest = self.spec.config.integrator.max_rungs as u32;
        self.load_resident()?;
        let timeline = self.timeline;
        let end = cycle(self, &timeline, self.state.ti, deepest)?;
        self.block.evaluations += end.evaluations;
        self.block.global_evaluations += end.global_evaluations;
        self.block.histogram = end.histogram;
        self.state.ti = end.ti;
        self.state.step += 1;
        self.state.last_dt = self.timeline.level_dt(end.finest);
        Ok(())
    }
}

/// A run's rank as the block cycle's keeper: its state interface, its collectives, and the
/// wall time of the integration's parts (forces are timed where they are computed).
impl BlockKeeper for Simulation<'_> {
    type Error = RunError;

    fn own_particles(&self) -> usize {
        self.particles.len()
    }

    fn wanted_steps(&mut self, rows: Option<&[u32]>) -> Result<Vec<f64>, RunError> {
        let start = Instant::now();
        let wanted = Simulation::wanted_steps(self, rows);
        self.wall.integrate += start.elapsed().as_secs_f64();
        Ok(wanted)
    }

    fn kick_each(&mut self, rows: Option<&[u32]>, h: &[f64]) -> Result<(), RunError> {
        let start = Instant::now();
        Simulation::kick_each(self, rows, h)?;
        self.wall.integrate += start.elapsed().as_secs_f64();
        Ok(())
    }

    fn drift(&mut self, h: f64) -> Result<(), RunError> {
        let start = Instant::now();
        self.apply(Operator::Drift, h)?;
        self.wall.integrate += start.elapsed().as_secs_f64();
        Ok(())
    }

    fn forces_of(&mut self, rows: &[u32], time: f64) -> Result<(), RunError> {
        self.compute_forces(Some(rows), time)?;
        self.fetch_accelerations(Some(rows))
    }

    fn forces_of_all(&mut self, rung: Vec<u8>, time: f64) -> Result<Vec<u8>, RunError> {
        // The full evaluation may move particles between ranks (rebalancing on the cycle's
        // work): their rungs travel with them for the closing half kick.
        self.particles.rung = rung;
        self.compute_forces(None, time)?;
        let rung = std::mem::take(&mut self.particles.rung);
        // The next cycle's rungs come from these accelerations.
        self.fetch_accelerations(None)?;
        Ok(rung)
    }

    fn earliest(&mut self, tick: u64) -> Result<u64, RunError> {
        Ok(allgatherv(self.comm, &[tick])?
            .iter()
            .flatten()
            .copied()
            .min()
            .unwrap_or(u64::MAX))
    }

    fn sum(&mut self, values: &[u64]) -> Result<Vec<u64>, RunError> {
        Ok(allreduce_sum(self.comm, values)?)
    }

    fn largest(&mut self, value: f64) -> Result<f64, RunError> {
        Ok(allreduce_max(self.comm, &[value])?[0])
    }
}
