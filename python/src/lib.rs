//! `leapfmm._native`: the leapfmm crate as a Python extension module. The Python package
//! (`python/leapfmm/__init__.py`) checks and converts the arguments (shapes, dtypes, finite
//! values) and calls these functions with C-ordered float64 arrays; everything numerical is
//! the crate's own code, the same as the command line's.
//!
//! Every entry point releases the GIL while it computes and turns a Rust panic into a
//! `RuntimeError` (`guarded`), so that no panic crosses into Python.

mod files;
mod forces;
mod stepping;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use std::panic::{AssertUnwindSafe, catch_unwind};

/// Runs `f` on a thread pool of `threads` threads (all cores when `None`), catching a panic
/// as a `RuntimeError` that names `what`.
pub(crate) fn guarded<T: Send>(
    what: &str,
    threads: Option<usize>,
    f: impl FnOnce() -> PyResult<T> + Send,
) -> PyResult<T> {
    let run = || match threads {
        None => f(),
        Some(t) => rayon::ThreadPoolBuilder::new()
            .num_threads(t)
            .build()
            .map_err(|e| PyRuntimeError::new_err(format!("{what}: no thread pool: {e}")))?
            .install(f),
    };
    catch_unwind(AssertUnwindSafe(run)).unwrap_or_else(|panic| {
        let reason = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "unknown reason".into());
        Err(PyRuntimeError::new_err(format!(
            "{what}: internal error ({reason}); please report it"
        )))
    })
}

/// A `ValueError` from any error the crate returns.
pub(crate) fn value_error(e: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// A panic on purpose, to test that none crosses into Python (`_native._panic_for_tests`).
#[pyfunction]
fn _panic_for_tests(py: Python<'_>) -> PyResult<()> {
    py.detach(|| guarded("_panic_for_tests", None, || panic!("a test panic")))
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(forces::fmm, m)?)?;
    m.add_function(wrap_pyfunction!(forces::direct, m)?)?;
    m.add_function(wrap_pyfunction!(files::ics, m)?)?;
    m.add_function(wrap_pyfunction!(files::load, m)?)?;
    m.add_function(wrap_pyfunction!(files::run, m)?)?;
    m.add_function(wrap_pyfunction!(files::run_plan, m)?)?;
    m.add_function(wrap_pyfunction!(_panic_for_tests, m)?)?;
    m.add_class::<stepping::Simulation>()?;
    m.add_class::<files::RunStop>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
