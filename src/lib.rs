//! leapfmm: a GPU-native N-body time integrator for galaxy dynamics.

pub mod config;
pub mod gravity;
pub mod ics;
pub mod integrate;
pub mod io;
pub mod particles;
pub mod progress;
pub mod simulation;
pub mod sum;
pub mod units;
