//! The step loop: `advance` until `t_end` or a signal, one global KDK step (`step`) or one
//! cycle of the block scheme (`block_cycle`), both over the state interface of `state`.

use super::error::RunError;
use super::options::RunOutcome;
use super::setup::component_softening;
use super::signals::SignalGuard;
use super::state::{Operator, Simulation};
use crate::config::StepScheme;
use crate::distributed::comm::{allgatherv, allreduce_max, allreduce_sum};
use crate::integrate::block::{Rungs, rung_for, rungs_for};
use crate::integrate::timestep::{TICKS_PER_DT_MAX, Timeline, criterion_dt};
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
                self.compute_forces(None, self.timeline.time(ti))?;
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
            self.compute_forces(Some(&active), self.timeline.time(ti))?;
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
}
