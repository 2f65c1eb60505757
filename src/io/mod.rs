//! Files: GADGET-4 HDF5 snapshots, checkpoints, the run folder's lock, and shared HDF5
//! helpers.

pub mod checkpoint;
pub mod hdf5_util;
pub mod lock;
pub mod snapshot;
