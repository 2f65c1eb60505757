//! Distributed FMM across ranks (design §6).

pub mod comm;
pub mod decomposition;
pub mod driver;
pub mod let_tree;
#[cfg(feature = "mpi")]
pub mod mpi_rank;
pub mod payload;
