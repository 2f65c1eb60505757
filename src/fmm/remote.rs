//! Other ranks' trees as the FMM sees them (design §6): `RemoteTree` (cells, multipoles and
//! particles a locally essential tree brought) and `RemoteSource` (what hands them to an
//! evaluation after its local upward pass: the distributed solver's exchange).

use super::caps::CapsTracker;
use super::stats::FmmStats;
use super::traversal::Mac;
use super::tree::{Cell, Tree};
use crate::gravity::GravityError;

/// A locally essential tree received from another rank: `cells[0]` is its root, children
/// and particle ranges index these vectors, and `multipoles` holds one expansion per cell.
#[derive(Debug, Clone, Default)]
pub struct RemoteTree {
    /// The cells (remote leaves without particles are multipoles never to be opened).
    pub cells: Vec<Cell>,
    /// Their multipoles, `real_len(p)` values per cell.
    pub multipoles: Vec<f64>,
    /// Particles of the leaves sent with particles.
    pub pos: Vec<[f64; 3]>,
    /// Their masses.
    pub mass: Vec<f64>,
    /// Their softening lengths (empty when one length serves all).
    pub eps: Vec<f64>,
}

/// Supplies the other ranks' locally essential trees once the local tree and its multipoles
/// exist (the distributed driver's exchange).
pub trait RemoteSource {
    /// The remote trees for this rank, given its tree and multipoles (`len` values per cell),
    /// for a walk with `mac` (the exporters emulate it to choose what to send).
    /// The exchange receives through buffers capped by `caps` (LET kinds), grows them on
    /// overflow and retries, and records its retries and use in `stats`.
    fn remote_trees(
        &mut self,
        tree: &Tree,
        multipoles: &[f64],
        len: usize,
        mac: Mac,
        caps: &mut CapsTracker,
        stats: &mut FmmStats,
    ) -> Result<Vec<RemoteTree>, GravityError>;

    /// True when other ranks receive this rank's positions rounded (`quantise_position`):
    /// the evaluation then puts its own particles there for every purpose
    /// (`Tree::quantise_own_positions`).
    fn quantises_positions(&self) -> bool;

    /// True when the remote trees come without their multipoles and particles (zero
    /// placeholders: the devices move them, `crate::distributed::payload`), so the host
    /// leaves the multipoles of the cells they were sent with unbuilt.
    fn payload_on_device(&self) -> bool {
        false
    }
}
