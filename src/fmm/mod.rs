//! The fast multipole method (design §5): Morton-sorted octree with centre-of-mass
//! expansion centres and exact bounding spheres, solid-harmonic expansions with O(p^3)
//! rotated M2L, a dual-tree walk that only builds lists, and batched passes over them.
//!
//! Owns the tree, the walk, the expansions, the passes on the CPU and the interface a
//! device implements (`backend`). Must not know ranks beyond the remote trees it is handed
//! (`remote`) and the payload interface, nor files beyond the presets.

pub mod backend;
pub mod caps;
pub mod expansion;
pub mod morton;
pub mod p2p;
pub mod passes;
pub mod plan;
pub mod presets;
pub mod remote;
pub mod solver;
pub mod stats;
// Generated (`expansion::swap_lanes_source`); a test keeps it current, so not reformatted.
#[rustfmt::skip]
mod swap_lanes;
pub mod traversal;
pub mod tree;
pub mod unsort;

pub use solver::{FmmSettings, FmmSolver};
pub use stats::FmmStats;
