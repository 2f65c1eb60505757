//! Measurements on particle sets: Lagrangian radii, disk profiles, bar strength. Used by the
//! tests and validation of the galaxy models (and by `leapfmm analyze`, to come).

pub mod bar;
pub mod profiles;
