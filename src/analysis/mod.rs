//! Measurements on particle sets: Lagrangian radii, disk profiles, bar strength and pattern
//! speed, surface-density maps. Used by `leapfmm analyze` and the validation tests.
//!
//! Owns the measurements and the plots and tables of `leapfmm analyze`; reads snapshots
//! through `io` and forces through `gravity::direct`. Must not touch a run (it reads files
//! only) or write into `snapshots/`.

pub mod bar;
pub mod galaxies;
pub mod maps;
pub mod plot;
pub mod profiles;
pub mod report;
