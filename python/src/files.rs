//! Files from Python: initial conditions from a model file (`ics`), snapshots read back
//! (`load`), and whole TOML runs and campaigns (`run`).

use crate::forces::vectors;
use crate::{guarded, value_error};
use leapfmm::campaign::{Campaign, CampaignOptions, is_campaign, run_campaign};
use leapfmm::config::RunSpec;
use leapfmm::ics::{ModelFile, generate};
use leapfmm::io::snapshot::read_snapshot;
use leapfmm::particles::Particles;
use leapfmm::simulation::{RunOptions, RunOutcome, StopRequest, run as run_spec};
use numpy::ndarray::Array1;
use numpy::{IntoPyArray, PyArray1};
use pyo3::exceptions::PyKeyboardInterrupt;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::PathBuf;

/// The particles as a dict of numpy arrays: pos, vel, mass, id, component (0 halo, 1 disk,
/// 2 bulge, 3 other), and acc/pot when `forces`.
fn arrays<'py>(py: Python<'py>, p: &Particles, forces: bool) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("pos", vectors(py, &p.pos))?;
    d.set_item("vel", vectors(py, &p.vel))?;
    d.set_item("mass", Array1::from(p.mass.clone()).into_pyarray(py))?;
    d.set_item("id", Array1::from(p.id.clone()).into_pyarray(py))?;
    let component: Vec<u8> = p.component.iter().map(|c| c.index() as u8).collect();
    d.set_item("component", Array1::from(component).into_pyarray(py))?;
    if forces {
        d.set_item("acc", vectors(py, &p.acc))?;
        d.set_item("pot", PyArray1::from_slice(py, &p.pot))?;
    }
    Ok(d)
}

/// Samples `n` particles of the model file `path` with `seed`, as `leapfmm ics` does (the
/// model's units: kpc, km/s, 1e10 Msun).
#[pyfunction]
#[pyo3(signature = (path, n, seed))]
pub(crate) fn ics<'py>(
    py: Python<'py>,
    path: PathBuf,
    n: usize,
    seed: u64,
) -> PyResult<(Bound<'py, PyDict>, Vec<String>)> {
    let (particles, warnings) = py.detach(|| {
        guarded("leapfmm.ics", None, || {
            let model = ModelFile::load(&path).map_err(value_error)?;
            Ok(generate(&model, n, seed))
        })
    })?;
    Ok((arrays(py, &particles, false)?, warnings))
}

/// Reads a snapshot (any GADGET-format HDF5 file, single- or multi-file): the particles,
/// the time, and the units (cgs factors of length, mass and velocity, or "nbody").
#[pyfunction]
pub(crate) fn load<'py>(py: Python<'py>, path: PathBuf) -> PyResult<Bound<'py, PyDict>> {
    let data = py.detach(|| {
        guarded("leapfmm.load", None, || {
            read_snapshot(&path).map_err(value_error)
        })
    })?;
    let d = arrays(py, &data.particles, false)?;
    d.set_item("time", data.time)?;
    match data.units {
        Some(u) => {
            let units = PyDict::new(py);
            units.set_item("length_cm", u.length_cm)?;
            units.set_item("mass_g", u.mass_g)?;
            units.set_item("velocity_cm_per_s", u.velocity_cm_per_s)?;
            d.set_item("units", units)?;
        }
        None if data.nbody => d.set_item("units", "nbody")?,
        None => d.set_item("units", py.None())?,
    }
    Ok(d)
}

/// What `run` will run: ("run", its run folder, its end time) or ("campaign", its folder,
/// the number of runs).
#[pyfunction]
pub(crate) fn run_plan(config: PathBuf) -> PyResult<(String, PathBuf, f64)> {
    let text = leapfmm::files::read_regular_text(&config).unwrap_or_default();
    if is_campaign(&text) {
        let campaign = Campaign::load(&config).map_err(value_error)?;
        return Ok(("campaign".into(), campaign.dir, campaign.runs.len() as f64));
    }
    let spec = RunSpec::load(&config).map_err(value_error)?;
    Ok(("run".into(), spec.run_dir, spec.config.integrator.t_end))
}

/// A stop the Python caller requests for a run in progress (on another thread): the run
/// finishes its step, writes a checkpoint and returns. Runs started from Python install no
/// signal handlers of their own (a second Ctrl-C would otherwise end the interpreter).
#[pyclass(module = "leapfmm._native")]
#[derive(Default)]
pub(crate) struct RunStop(StopRequest);

#[pymethods]
impl RunStop {
    #[new]
    fn new() -> Self {
        Self::default()
    }

    /// Asks the run to stop after its current step.
    fn request(&self) {
        self.0.request();
    }
}

/// Runs (or, with `resume`, continues) the run or campaign of a TOML file, as `leapfmm run`
/// does; returns a one-line summary of how it ended, or raises `KeyboardInterrupt` when
/// `stop` stopped it (at a checkpoint).
#[pyfunction]
#[pyo3(signature = (config, resume, quiet, ranks, stop))]
pub(crate) fn run(
    py: Python<'_>,
    config: PathBuf,
    resume: bool,
    quiet: bool,
    ranks: usize,
    stop: PyRef<'_, RunStop>,
) -> PyResult<String> {
    let stop = stop.0.clone();
    let text = leapfmm::files::read_regular_text(&config).unwrap_or_default();
    let outcome = py.detach(|| {
        guarded("leapfmm.run", None, || {
            if is_campaign(&text) {
                let campaign = Campaign::load(&config).map_err(value_error)?;
                let options = CampaignOptions {
                    quiet,
                    ranks,
                    stop: Some(stop),
                };
                let (statuses, signal) = run_campaign(&campaign, &options).map_err(value_error)?;
                let done = statuses.iter().filter(|s| s.complete()).count();
                let line = format!(
                    "campaign {}: {done} of {} runs complete",
                    campaign.name,
                    statuses.len()
                );
                return Ok((line, signal.is_some()));
            }
            let spec = RunSpec::load(&config).map_err(value_error)?;
            let options = RunOptions {
                resume,
                quiet,
                ranks,
                group: None,
                stop: Some(stop),
            };
            let outcome = run_spec(&spec, options).map_err(value_error)?;
            let dir = spec.run_dir.display();
            Ok(match outcome {
                RunOutcome::Finished { steps, time } => (
                    format!("{dir}: finished at t = {time} after {steps} steps"),
                    false,
                ),
                RunOutcome::AlreadyFinished { time } => {
                    (format!("{dir}: already finished at t = {time}"), false)
                }
                RunOutcome::Interrupted {
                    time, checkpoint, ..
                } => (
                    format!(
                        "{dir}: stopped at t = {time}, checkpoint {}",
                        checkpoint.display()
                    ),
                    true,
                ),
            })
        })
    })?;
    match outcome {
        (line, true) => Err(PyKeyboardInterrupt::new_err(format!(
            "{line} (run again with resume=True to continue)"
        ))),
        (line, false) => Ok(line),
    }
}
