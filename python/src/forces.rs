//! Forces of arrays held in Python: the FMM (`fmm`, what `leapfmm forces` runs) and direct
//! summation (`direct`, the reference).

use crate::{guarded, value_error};
use leapfmm::fmm::solver::{Evaluation, FmmSettings, FmmSolver, default_order};
use leapfmm::gravity::direct::{DirectSummation, SourceSet};
use leapfmm::gravity::{Softening, SofteningKernel};
use numpy::ndarray::{Array1, Array2};
use numpy::{
    IntoPyArray, PyArray1, PyArray2, PyReadonlyArray1, PyReadonlyArray2, PyUntypedArrayMethods,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// Accelerations (n × 3) and potentials (n) as numpy arrays.
pub(crate) type Forces<'py> = (Bound<'py, PyArray2<f64>>, Bound<'py, PyArray1<f64>>);

/// The rows of a C-ordered (n, 3) float64 array.
pub(crate) fn rows<'a>(a: &'a PyReadonlyArray2<'_, f64>, name: &str) -> PyResult<&'a [[f64; 3]]> {
    let flat = a
        .as_slice()
        .map_err(|_| PyValueError::new_err(format!("{name} must be C-contiguous")))?;
    if a.shape()[1] != 3 {
        return Err(PyValueError::new_err(format!(
            "{name} must have shape (n, 3)"
        )));
    }
    Ok(bytemuck::cast_slice(flat))
}

/// The values of a contiguous 1-d float64 array.
pub(crate) fn values<'a>(a: &'a PyReadonlyArray1<'_, f64>, name: &str) -> PyResult<&'a [f64]> {
    a.as_slice()
        .map_err(|_| PyValueError::new_err(format!("{name} must be contiguous")))
}

/// The softening kernel named `kernel` ("spline" or "plummer").
pub(crate) fn kernel_of(kernel: &str) -> PyResult<SofteningKernel> {
    match kernel {
        "spline" => Ok(SofteningKernel::Spline),
        "plummer" => Ok(SofteningKernel::Plummer),
        other => Err(PyValueError::new_err(format!(
            "kernel must be 'spline' or 'plummer', not {other:?}"
        ))),
    }
}

/// The particles and points of one force call: slices of the caller's arrays.
struct Field<'a> {
    pos: &'a [[f64; 3]],
    mass: &'a [f64],
    /// Each particle's softening length, when they have their own.
    each: Option<&'a [f64]>,
    /// The points the field is wanted at, when not the particles.
    at: Option<&'a [[f64; 3]]>,
}

impl<'a> Field<'a> {
    fn of(
        pos: &'a PyReadonlyArray2<'_, f64>,
        mass: &'a PyReadonlyArray1<'_, f64>,
        each: &'a Option<PyReadonlyArray1<'_, f64>>,
        at: &'a Option<PyReadonlyArray2<'_, f64>>,
    ) -> PyResult<Self> {
        Ok(Field {
            pos: rows(pos, "pos")?,
            mass: values(mass, "mass")?,
            each: each.as_ref().map(|e| values(e, "softening")).transpose()?,
            at: at.as_ref().map(|t| rows(t, "targets")).transpose()?,
        })
    }
}

/// (n, 3) values as a numpy array.
pub(crate) fn vectors<'py>(py: Python<'py>, v: &[[f64; 3]]) -> Bound<'py, PyArray2<f64>> {
    let flat: Vec<f64> = v.iter().flatten().copied().collect();
    Array2::from_shape_vec((v.len(), 3), flat)
        .expect("n rows of 3 values")
        .into_pyarray(py)
}

/// Accelerations and potentials as numpy arrays.
pub(crate) fn to_numpy<'py>(py: Python<'py>, acc: Vec<[f64; 3]>, pot: Vec<f64>) -> Forces<'py> {
    (vectors(py, &acc), Array1::from(pot).into_pyarray(py))
}

/// FMM accelerations and potentials of the particles (`targets`: at those points instead,
/// from the particles, as massless test particles of the same evaluation).
#[pyfunction]
#[pyo3(signature = (pos, mass, softening, softening_each, kernel, g, accuracy, theta, order, leaf_size, threads, targets))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn fmm<'py>(
    py: Python<'py>,
    pos: PyReadonlyArray2<'py, f64>,
    mass: PyReadonlyArray1<'py, f64>,
    softening: f64,
    softening_each: Option<PyReadonlyArray1<'py, f64>>,
    kernel: &str,
    g: f64,
    accuracy: f64,
    theta: f64,
    order: Option<usize>,
    leaf_size: usize,
    threads: Option<usize>,
    targets: Option<PyReadonlyArray2<'py, f64>>,
) -> PyResult<Forces<'py>> {
    let Field {
        pos,
        mass,
        each,
        at,
    } = Field::of(&pos, &mass, &softening_each, &targets)?;
    let kernel = kernel_of(kernel)?;
    let (acc, pot) = py.detach(|| {
        guarded("leapfmm.accelerations", threads, || {
            let epsilon = each.map_or(softening, |e| e.iter().fold(0.0, |m: f64, &x| m.max(x)));
            let settings = FmmSettings {
                order: order.unwrap_or_else(|| default_order(accuracy)),
                theta,
                accuracy,
                leaf_size,
                ..FmmSettings::defaults(Softening { kernel, epsilon }, g)
            };
            fmm_forces(settings, pos, mass, each, at)
        })
    })?;
    Ok(to_numpy(py, acc, pot))
}

/// One FMM evaluation as `leapfmm forces` makes it (in place, the first evaluation finding
/// the caps and, with an accuracy target, the expected accelerations).
fn fmm_forces(
    settings: FmmSettings,
    pos: &[[f64; 3]],
    mass: &[f64],
    each: Option<&[f64]>,
    targets: Option<&[[f64; 3]]>,
) -> PyResult<(Vec<[f64; 3]>, Vec<f64>)> {
    let mut solver = FmmSolver::new(settings, None);
    // Targets join the sources as massless particles: the same tree, walk and expansions.
    let (all_pos, all_mass, all_eps);
    let (pos_in, mass_in, eps_in) = match targets {
        None => (pos, mass, each),
        Some(t) => {
            all_pos = [pos, t].concat();
            all_mass = [mass, &vec![0.0; t.len()]].concat();
            all_eps = each.map(|e| [e, &vec![0.0; t.len()]].concat());
            (&all_pos[..], &all_mass[..], all_eps.as_deref())
        }
    };
    let n = pos_in.len();
    let id: Vec<u64> = (0..n as u64).collect();
    let (mut acc, mut pot) = (vec![[0.0; 3]; n], vec![0.0; n]);
    let with = Evaluation {
        eps: eps_in,
        in_place: true,
        ..Evaluation::default()
    };
    solver
        .evaluate_with(pos_in, mass_in, &id, with, &mut acc, &mut pot)
        .map_err(value_error)?;
    if targets.is_some() {
        acc.drain(..pos.len());
        pot.drain(..pos.len());
    }
    Ok((acc, pot))
}

/// Direct-summation accelerations and potentials of the particles, in f64 (`targets`: at
/// those points instead, from the particles).
#[pyfunction]
#[pyo3(signature = (pos, mass, softening, softening_each, kernel, g, threads, targets))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn direct<'py>(
    py: Python<'py>,
    pos: PyReadonlyArray2<'py, f64>,
    mass: PyReadonlyArray1<'py, f64>,
    softening: f64,
    softening_each: Option<PyReadonlyArray1<'py, f64>>,
    kernel: &str,
    g: f64,
    threads: Option<usize>,
    targets: Option<PyReadonlyArray2<'py, f64>>,
) -> PyResult<Forces<'py>> {
    let Field {
        pos,
        mass,
        each,
        at,
    } = Field::of(&pos, &mass, &softening_each, &targets)?;
    let kernel = kernel_of(kernel)?;
    let (acc, pot) = py.detach(|| {
        guarded("leapfmm.direct", threads, || {
            let solver = DirectSummation::new(
                g,
                Softening {
                    kernel,
                    epsilon: softening,
                },
            );
            let points = at.unwrap_or(pos);
            let (mut acc, mut pot) = (vec![[0.0; 3]; points.len()], vec![0.0; points.len()]);
            match each {
                None => solver.evaluate(&SourceSet::new(pos, mass), points, &mut acc, &mut pot),
                Some(e) => {
                    let sources = SourceSet::with_softening(pos, mass, e);
                    // Test points carry no softening of their own: a pair uses the source's.
                    let zeros;
                    let target_eps = match at {
                        None => e,
                        Some(t) => {
                            zeros = vec![0.0; t.len()];
                            &zeros[..]
                        }
                    };
                    solver.evaluate_softened(&sources, points, Some(target_eps), &mut acc, &mut pot)
                }
            }
            // A particle does not feel itself: take back its zero-separation pair's potential.
            if at.is_none() {
                for (i, p) in pot.iter_mut().enumerate() {
                    *p += solver.self_term(mass[i], each.map(|e| e[i]));
                }
            }
            Ok((acc, pot))
        })
    })?;
    Ok(to_numpy(py, acc, pot))
}
