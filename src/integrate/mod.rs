//! Time integration: the kick-drift-kick leapfrog, its step choice, and diagnostics.

pub mod block;
pub mod diagnostics;
pub mod leapfrog;
pub mod timestep;
