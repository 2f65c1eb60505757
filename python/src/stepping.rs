//! `leapfmm.Simulation`: particles kept in Rust and advanced by the kick-drift-kick leapfrog
//! with global steps (fixed `dt`, or `eta sqrt(ε / max|a|)` each step) or the run's block
//! cycle (`integrate::block::cycle`, this simulation as its keeper), FMM forces from one
//! solver whose caps carry over from step to step as in a run, energy diagnostics, HDF5
//! snapshots and bit-exact checkpoints.

use crate::forces::{Forces, kernel_of, rows, to_numpy, values, vectors};
use crate::{guarded, value_error};
use leapfmm::config::Precision;
use leapfmm::fmm::presets::PresetsStore;
use leapfmm::fmm::solver::{
    Evaluation, FmmSettings, FmmSolver, default_order, expected_accelerations, magnitudes,
};
use leapfmm::gravity::{Softening, active_flags, check_finite};
use leapfmm::integrate::block::{BlockKeeper, cycle};
use leapfmm::integrate::diagnostics::Conserved;
use leapfmm::integrate::leapfrog::{drift, kick, kick_each};
use leapfmm::integrate::timestep::{Timeline, TimestepError, criterion_dt};
use leapfmm::io::checkpoint;
use leapfmm::io::snapshot::{SnapshotInfo, write_snapshot};
use leapfmm::particles::{Component, Particles};
use leapfmm::units::UnitSystem;
use numpy::ndarray::Array1;
use numpy::{IntoPyArray, PyArray1, PyArray2, PyReadonlyArray1, PyReadonlyArray2};
use pyo3::prelude::*;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Everything that defines how a simulation steps (kept in its checkpoints).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Settings {
    units: String,
    g: f64,
    softening: f64,
    kernel: String,
    dt: Option<f64>,
    eta: Option<f64>,
    dt_max: f64,
    accuracy: f64,
    theta: f64,
    order: usize,
    leaf_size: usize,
    /// "global" or "block".
    scheme: String,
    /// The block scheme's deepest rung (steps down to `dt_max / 2^max_rungs`).
    max_rungs: u32,
    /// A caps presets file the solver starts from and records its caps in.
    caps_presets: Option<PathBuf>,
}

/// A checkpoint's contents: the settings and the synchronised state, bit for bit.
#[derive(Debug, Serialize, Deserialize)]
struct Saved {
    settings: Settings,
    particles: Particles,
    time: f64,
    /// The block scheme's tick (`Timeline`), 0 for global steps.
    ti: u64,
    steps: u64,
    energy0: f64,
}

/// A simulation whose particle state lives in Rust between calls.
#[pyclass(module = "leapfmm._native")]
pub(crate) struct Simulation {
    settings: Settings,
    particles: Particles,
    solver: FmmSolver,
    threads: Option<usize>,
    time: f64,
    /// The block scheme's tick on its timeline of `dt_max`.
    ti: u64,
    steps: u64,
    /// Total energy at the start (the relative error in `diagnostics` is against it).
    energy0: f64,
    evaluations: u64,
    /// Buffer-capacity retries of every evaluation after the first.
    retries_after_first: u64,
}

impl Simulation {
    fn solver_for(s: &Settings) -> PyResult<FmmSolver> {
        let kernel = kernel_of(&s.kernel)?;
        let settings = FmmSettings {
            order: s.order,
            theta: s.theta,
            accuracy: s.accuracy,
            leaf_size: s.leaf_size,
            ..FmmSettings::defaults(
                Softening {
                    kernel,
                    epsilon: s.softening,
                },
                s.g,
            )
        };
        Ok(FmmSolver::new(
            settings,
            s.caps_presets.clone().map(PresetsStore::new),
        ))
    }

    /// Accelerations and potentials of the current positions, of all particles or of the
    /// `active` ones (block steps); the last ones' magnitudes are what the accuracy target
    /// expects, as in a run.
    fn forces(&mut self, first: bool, active: Option<&[u32]>) -> PyResult<()> {
        check_finite(&self.particles).map_err(value_error)?;
        let p = &mut self.particles;
        let expected = (!first).then(|| expected_accelerations(&p.acc));
        let flags = active.map(|rows| active_flags(rows, p.len()));
        let with = Evaluation {
            expected_accel: expected.as_deref(),
            active: flags.as_deref(),
            ..Evaluation::default()
        };
        let stats = self
            .solver
            .evaluate_with(&p.pos, &p.mass, &p.id, with, &mut p.acc, &mut p.pot)
            .map_err(value_error)?;
        if self.evaluations > 0 {
            self.retries_after_first += stats.retries as u64;
        }
        self.evaluations += 1;
        Ok(())
    }

    /// The step to take now, at most `left`.
    fn next_dt(&self, left: f64) -> f64 {
        let wanted = match (self.settings.dt, self.settings.eta) {
            (Some(dt), _) => dt,
            (None, Some(eta)) => {
                let a_max = magnitudes(&self.particles.acc)
                    .into_iter()
                    .fold(0.0, f64::max);
                criterion_dt(eta, self.settings.softening, a_max).min(self.settings.dt_max)
            }
            (None, None) => self.settings.dt_max,
        };
        // Land on the end time instead of a sliver of a step short of it.
        if wanted >= left * (1.0 - 1e-12) {
            left
        } else {
            wanted
        }
    }

    /// One kick-drift-kick step of `dt`.
    fn step_once(&mut self, dt: f64) -> PyResult<()> {
        kick(&mut self.particles, 0.5 * dt);
        drift(&mut self.particles, dt);
        self.forces(false, None)?;
        kick(&mut self.particles, 0.5 * dt);
        self.time += dt;
        self.steps += 1;
        Ok(())
    }

    /// One cycle of the block scheme (the command line's `integrator.scheme = "block"`),
    /// from the synchronisation point the simulation is at to the next.
    fn cycle_once(&mut self) -> PyResult<()> {
        let timeline = Timeline {
            dt_max: self.settings.dt_max,
        };
        let deepest = self.settings.max_rungs;
        let ti = self.ti;
        let end = cycle(&mut Keeper(self), &timeline, ti, deepest).map_err(|f| f.0)?;
        self.ti = end.ti;
        self.time = timeline.time(end.ti);
        self.steps += 1;
        Ok(())
    }

    fn block(&self) -> bool {
        self.settings.scheme == "block"
    }

    fn conserved(&self) -> Conserved {
        Conserved::measure(&self.particles)
    }

    /// Steps until `until` says stop, checking for Ctrl-C between steps.
    fn advance(
        &mut self,
        py: Python<'_>,
        mut more: impl FnMut(&Self) -> Option<f64> + Send,
    ) -> PyResult<()> {
        let threads = self.threads;
        loop {
            let Some(dt) = more(self) else {
                return Ok(());
            };
            py.detach(|| {
                guarded("Simulation.evolve", threads, || {
                    if self.block() {
                        self.cycle_once()
                    } else {
                        self.step_once(dt)
                    }
                })
            })?;
            // Between steps the state is synchronised: an interrupt (KeyboardInterrupt)
            // leaves it intact.
            py.check_signals()?;
        }
    }
}

#[pymethods]
impl Simulation {
    /// Particles at `pos` with `vel` and `mass` (checked by the Python wrapper), their forces
    /// evaluated once.
    #[new]
    #[pyo3(signature = (pos, vel, mass, softening, kernel, units, g, dt, eta, dt_max, accuracy, theta, order, leaf_size, threads, scheme, max_rungs, caps_presets))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        pos: PyReadonlyArray2<'_, f64>,
        vel: PyReadonlyArray2<'_, f64>,
        mass: PyReadonlyArray1<'_, f64>,
        softening: f64,
        kernel: String,
        units: String,
        g: f64,
        dt: Option<f64>,
        eta: Option<f64>,
        dt_max: f64,
        accuracy: f64,
        theta: f64,
        order: Option<usize>,
        leaf_size: usize,
        threads: Option<usize>,
        scheme: String,
        max_rungs: u32,
        caps_presets: Option<PathBuf>,
    ) -> PyResult<Self> {
        let (pos, vel, mass) = (
            rows(&pos, "pos")?,
            rows(&vel, "vel")?,
            values(&mass, "mass")?,
        );
        let mut particles = Particles::with_capacity(pos.len());
        for i in 0..pos.len() {
            particles.push(pos[i], vel[i], mass[i], i as u64, Component::Generic);
        }
        let settings = Settings {
            units,
            g,
            softening,
            kernel,
            dt,
            eta,
            dt_max,
            accuracy,
            theta,
            order: order.unwrap_or_else(|| default_order(accuracy)),
            leaf_size,
            scheme,
            max_rungs,
            caps_presets,
        };
        let solver = Self::solver_for(&settings)?;
        let mut sim = Simulation {
            settings,
            particles,
            solver,
            threads,
            time: 0.0,
            ti: 0,
            steps: 0,
            energy0: 0.0,
            evaluations: 0,
            retries_after_first: 0,
        };
        py.detach(|| guarded("Simulation", threads, || sim.forces(true, None)))?;
        sim.energy0 = sim.conserved().total();
        Ok(sim)
    }

    /// Advances to time `t` (a no-op at or before the current time).
    fn evolve(&mut self, py: Python<'_>, t: f64) -> PyResult<()> {
        // Block steps end cycles at multiples of dt_max: the first at or after `t`.
        self.advance(py, |s| {
            let left = t - s.time;
            (left > 1e-12 * t.abs()).then(|| s.next_dt(left))
        })
    }

    /// Takes `n` steps.
    fn step(&mut self, py: Python<'_>, n: u64) -> PyResult<()> {
        let end = self.steps + n;
        self.advance(py, |s| (s.steps < end).then(|| s.next_dt(f64::INFINITY)))
    }

    /// Current time.
    #[getter]
    fn time(&self) -> f64 {
        self.time
    }

    /// Steps taken since the start.
    #[getter]
    fn steps(&self) -> u64 {
        self.steps
    }

    /// Force evaluations made, and the buffer-capacity retries of all but the first.
    #[getter]
    fn evaluations(&self) -> (u64, u64) {
        (self.evaluations, self.retries_after_first)
    }

    /// Positions (a copy).
    #[getter]
    fn positions<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray2<f64>> {
        vectors(py, &self.particles.pos)
    }

    /// Velocities (a copy).
    #[getter]
    fn velocities<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray2<f64>> {
        vectors(py, &self.particles.vel)
    }

    /// Accelerations and potentials of the current positions (copies).
    #[getter]
    fn forces_now<'py>(&self, py: Python<'py>) -> Forces<'py> {
        to_numpy(py, self.particles.acc.clone(), self.particles.pot.clone())
    }

    /// Masses (a copy).
    #[getter]
    fn masses<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<f64>> {
        Array1::from(self.particles.mass.clone()).into_pyarray(py)
    }

    /// (kinetic, potential, total, relative energy error since the start, momentum,
    /// angular momentum).
    fn diagnostics(&self) -> (f64, f64, f64, f64, [f64; 3], [f64; 3]) {
        let c = self.conserved();
        let e = c.total();
        let rel = if self.energy0 != 0.0 {
            (e - self.energy0) / self.energy0.abs()
        } else {
            0.0
        };
        (
            c.kinetic,
            c.potential,
            e,
            rel,
            c.momentum,
            c.angular_momentum,
        )
    }

    /// The settings as a dict-like list of (name, value) pairs.
    fn settings(&self) -> Vec<(String, String)> {
        let s = &self.settings;
        vec![
            ("units".into(), s.units.clone()),
            ("G".into(), s.g.to_string()),
            ("softening".into(), s.softening.to_string()),
            ("kernel".into(), s.kernel.clone()),
            ("dt".into(), optional(s.dt)),
            ("eta".into(), optional(s.eta)),
            ("dt_max".into(), s.dt_max.to_string()),
            ("accuracy".into(), s.accuracy.to_string()),
            ("theta".into(), s.theta.to_string()),
            ("order".into(), s.order.to_string()),
            ("leaf_size".into(), s.leaf_size.to_string()),
            ("scheme".into(), s.scheme.clone()),
            ("max_rungs".into(), s.max_rungs.to_string()),
        ]
    }

    /// Writes a GADGET-format HDF5 snapshot (f64 values, with potentials and accelerations)
    /// that pynbody, yt and h5py read, atomically.
    fn save(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        let units = match self.settings.units.as_str() {
            "nbody" => UnitSystem::Nbody,
            _ => UnitSystem::Galactic,
        };
        let s = &self.settings;
        let info = SnapshotInfo {
            potential: true,
            acceleration: true,
            parameters: vec![
                ("gravity.softening".into(), toml::Value::Float(s.softening)),
                (
                    "gravity.kernel".into(),
                    toml::Value::String(s.kernel.clone()),
                ),
            ],
            softening: Some([s.softening; 4]),
            ..SnapshotInfo::new(self.time, units, Precision::Double)
        };
        py.detach(|| write_snapshot(&path, &self.particles, &info))
            .map_err(value_error)
    }

    /// Writes a checkpoint from which `from_checkpoint` continues bit for bit.
    fn checkpoint(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        let saved = Saved {
            settings: self.settings.clone(),
            particles: self.particles.clone(),
            time: self.time,
            ti: self.ti,
            steps: self.steps,
            energy0: self.energy0,
        };
        py.detach(|| {
            let bytes = checkpoint::encode(&saved).map_err(value_error)?;
            let tmp = path.with_extension("tmp");
            std::fs::write(&tmp, &bytes)
                .and_then(|_| std::fs::rename(&tmp, &path))
                .map_err(|e| {
                    value_error(format!(
                        "{}: cannot write the checkpoint: {e}",
                        path.display()
                    ))
                })
        })
    }

    /// A simulation continued from a checkpoint written by `checkpoint`.
    #[staticmethod]
    #[pyo3(signature = (path, threads=None))]
    fn from_checkpoint(py: Python<'_>, path: PathBuf, threads: Option<usize>) -> PyResult<Self> {
        let saved: Saved = py.detach(|| checkpoint::read(&path)).map_err(value_error)?;
        let solver = Self::solver_for(&saved.settings)?;
        Ok(Simulation {
            settings: saved.settings,
            particles: saved.particles,
            solver,
            threads,
            time: saved.time,
            ti: saved.ti,
            steps: saved.steps,
            energy0: saved.energy0,
            evaluations: 0,
            retries_after_first: 0,
        })
    }

    fn __len__(&self) -> usize {
        self.particles.len()
    }

    fn __repr__(&self) -> String {
        format!(
            "leapfmm.Simulation({} particles, t = {}, {} steps, units {})",
            self.particles.len(),
            self.time,
            self.steps,
            self.settings.units
        )
    }
}

/// A setting that may be unset, as text ("None" when it is).
fn optional(v: Option<f64>) -> String {
    v.map_or_else(|| "None".into(), |v| v.to_string())
}

/// A Python-side failure or a rung too deep, for the block cycle.
struct Failed(PyErr);

impl From<TimestepError> for Failed {
    fn from(e: TimestepError) -> Self {
        Failed(value_error(e))
    }
}

impl From<PyErr> for Failed {
    fn from(e: PyErr) -> Self {
        Failed(e)
    }
}

/// The simulation as the block cycle's keeper: one rank, on the host.
struct Keeper<'s>(&'s mut Simulation);

impl BlockKeeper for Keeper<'_> {
    type Error = Failed;

    fn own_particles(&self) -> usize {
        self.0.particles.len()
    }

    fn wanted_steps(&mut self, rows: Option<&[u32]>) -> Result<Vec<f64>, Failed> {
        let (s, p) = (&self.0.settings, &self.0.particles);
        let eta = s.eta.unwrap_or(0.0);
        let wanted = |i: usize| {
            let a = p.acc[i];
            criterion_dt(
                eta,
                s.softening,
                (a[0] * a[0] + a[1] * a[1] + a[2] * a[2]).sqrt(),
            )
        };
        Ok(match rows {
            None => (0..p.len()).map(wanted).collect(),
            Some(rows) => rows.iter().map(|&i| wanted(i as usize)).collect(),
        })
    }

    fn kick_each(&mut self, rows: Option<&[u32]>, h: &[f64]) -> Result<(), Failed> {
        kick_each(&mut self.0.particles, rows, h);
        Ok(())
    }

    fn drift(&mut self, h: f64) -> Result<(), Failed> {
        drift(&mut self.0.particles, h);
        Ok(())
    }

    fn forces_of(&mut self, rows: &[u32], _time: f64) -> Result<(), Failed> {
        Ok(self.0.forces(false, Some(rows))?)
    }

    fn forces_of_all(&mut self, rung: Vec<u8>, _time: f64) -> Result<Vec<u8>, Failed> {
        self.0.forces(false, None)?;
        Ok(rung)
    }

    fn earliest(&mut self, tick: u64) -> Result<u64, Failed> {
        Ok(tick)
    }

    fn sum(&mut self, values: &[u64]) -> Result<Vec<u64>, Failed> {
        Ok(values.to_vec())
    }

    fn largest(&mut self, value: f64) -> Result<f64, Failed> {
        Ok(value)
    }
}
