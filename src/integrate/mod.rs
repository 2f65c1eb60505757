//! Time integration: the kick-drift-kick leapfrog, its step choice, and diagnostics.
//!
//! Owns the leapfrog operators, the time line and step criteria, block rungs, and the
//! diagnostics' sums and logs. Must not know solvers beyond their accelerations, or files
//! beyond its logs.

pub mod block;
pub mod diagnostics;
pub mod leapfrog;
pub mod timestep;
