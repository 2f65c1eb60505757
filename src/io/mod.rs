//! Files: GADGET-4 HDF5 snapshots, checkpoints, and shared HDF5 helpers.

pub mod checkpoint;
pub mod hdf5_util;
pub mod snapshot;
