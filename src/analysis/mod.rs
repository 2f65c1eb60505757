//! Measurements on particle sets: Lagrangian radii, disk profiles, bar strength and pattern
//! speed, surface-density maps. Used by `leapfmm analyze` and the validation tests.

pub mod bar;
pub mod maps;
pub mod plot;
pub mod profiles;
pub mod report;
