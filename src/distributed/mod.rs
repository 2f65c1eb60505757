//! Distributed FMM across ranks (design §6).

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
