//! Files: GADGET-4 HDF5 snapshots, checkpoints, the run folder's lock and input record,
//! and shared HDF5 helpers.
//!
//! Owns every file format a run writes or reads back (snapshots, checkpoints, the lock, the
//! inputs record). Must not decide when to write (that is `simulation`).

pub mod checkpoint;
pub mod hdf5_util;
pub mod inputs;
pub mod lock;
pub mod snapshot;

/// Lower-case hex of a digest.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
