//! leapfmm: a GPU-native N-body time integrator for galaxy dynamics.

// Numerical kernels index several parallel arrays (lanes, coefficients, axes) with one loop
// variable; iterator rewrites of those loops hide the structure the vectoriser relies on.
#![allow(clippy::needless_range_loop)]

pub mod analysis;
pub mod campaign;
pub mod config;
pub mod distributed;
pub mod files;
pub mod fmm;
pub mod format;
pub mod gpu;
pub mod gravity;
pub mod ics;
pub mod integrate;
pub mod io;
pub mod memory;
pub mod particles;
pub mod progress;
pub mod simulation;
pub mod source;
pub mod sum;
pub mod units;
pub mod workloads;
