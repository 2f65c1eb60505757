//! Distributed FMM across ranks (design §6).
//!
//! Owns ranks (thread ranks and MPI), the domain decomposition, migration, the locally
//! essential trees and their wire format, and the payload routes. Must not know the step
//! loop (`simulation`) or the device (`gpu` plugs in through `fmm::backend`).

pub mod comm;
pub mod decomposition;
pub mod driver;
pub mod exchange;
pub mod let_tree;
pub mod let_wire;
#[cfg(feature = "mpi")]
pub mod mpi_rank;
pub mod payload;
pub mod stats;
