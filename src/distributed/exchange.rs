//! The locally essential tree exchange of one evaluation (`Exchange`, the FMM's
//! `RemoteSource`): the coarse top trees shared, the export walks' geometry rounds, the
//! packets sent and imported, and the routes of a payload the devices move themselves.

use super::comm::{Communicator, allgatherv, allreduce_sum, alltoallv};
use super::let_tree::{ExportWalk, SentGeometry, import};
use super::let_wire::{LetPacket, WirePrecision, decode_geometry, encode_geometry};
use super::payload::{Landing, PayloadRoutes};
use super::stats::RankStats;
use crate::fmm::FmmSettings;
use crate::fmm::FmmStats;
use crate::fmm::caps::{CapKind, Caps, CapsTracker};
use crate::fmm::p2p::NearFieldPrecision;
use crate::fmm::remote::{RemoteSource, RemoteTree};
use crate::fmm::traversal::Mac;
use crate::fmm::tree::Tree;
use crate::gravity::GravityError;
use rayon::prelude::*;

/// Cells with at least this many leaves' worth of particles have their children in the
/// coarse top tree every rank shares: a few hundred cells per rank, while the finer
/// geometry travels only where another rank's walk needs it.
pub(super) const COARSE_LEAVES: usize = 32;

/// The LET exchange of one evaluation, as the FMM's remote source.
pub(super) struct Exchange<'a> {
    pub(super) comm: &'a dyn Communicator,
    pub(super) settings: &'a FmmSettings,
    pub(super) stats: RankStats,
    /// Whether the payload (multipoles, positions, masses) moves between the devices
    /// (`payload`), which then need `routes`.
    pub(super) payload_on_device: bool,
    pub(super) routes: Option<PayloadRoutes>,
}

impl Exchange<'_> {
    /// How the packets travel: cells only when the devices move the rest, else compressed
    /// for the mixed-precision near field.
    pub(super) fn precision(&self) -> WirePrecision {
        match (self.payload_on_device, self.settings.near_field) {
            (true, _) => WirePrecision::CellsOnly,
            (false, NearFieldPrecision::Mixed) => WirePrecision::Single,
            (false, NearFieldPrecision::Double) => WirePrecision::Double,
        }
    }
}

/// The routes of the payload of `packets` (what this rank sends each rank, in its order)
/// and of what it receives, the cells and particles `received` counts from each rank,
/// which `FmmSolver` appends in rank order after `tree`'s own.
pub(super) fn payload_routes(
    tree: &Tree,
    packets: &[LetPacket],
    received: &[(usize, usize)],
    len: usize,
) -> PayloadRoutes {
    let send_particles = packets
        .iter()
        .map(|p| {
            p.cells
                .iter()
                .zip(&p.sources)
                .filter(|(c, _)| c.end > c.begin)
                .flat_map(|(_, &own)| {
                    let cell = &tree.cells[own as usize];
                    cell.begin..cell.end
                })
                .collect()
        })
        .collect();
    let (mut first_cell, mut first_particle) = (tree.cells.len(), tree.pos.len());
    let receive = received
        .iter()
        .map(|&(cells, particles)| {
            let landing = Landing {
                first_cell,
                cells,
                first_particle,
                particles,
            };
            first_cell += cells;
            first_particle += particles;
            landing
        })
        .collect();
    PayloadRoutes {
        len,
        send_cells: packets.iter().map(|p| p.sources.clone()).collect(),
        send_particles,
        receive,
    }
}

pub(super) fn comm_err(e: super::comm::CommError) -> GravityError {
    GravityError::Communication(e.to_string())
}

impl RemoteSource for Exchange<'_> {
    fn quantises_positions(&self) -> bool {
        self.comm.size() > 1 && self.precision() == WirePrecision::Single
    }

    fn payload_on_device(&self) -> bool {
        self.payload_on_device
    }

    fn remote_trees(
        &mut self,
        tree: &Tree,
        multipoles: &[f64],
        len: usize,
        mac: Mac,
        caps: &mut CapsTracker,
        stats: &mut FmmStats,
    ) -> Result<Vec<RemoteTree>, GravityError> {
        let comm = self.comm;
        let (me, k) = (comm.rank(), comm.size());
        if k == 1 {
            return Ok(Vec::new());
        }
        // Geometry: every rank's coarse top, then, round by round, the children of the
        // cells each exporter's walk needs to open; with the masses and expected
        // accelerations when the walk controls the error (every rank has the same `mac`).
        let for_error = mac.tolerance > 0.0;
        let min_count = COARSE_LEAVES * self.settings.leaf_size.max(1);
        let (coarse_sent, coarse) = SentGeometry::coarse(tree, min_count);
        let coarse = allgatherv(comm, &encode_geometry(&coarse, for_error)).map_err(comm_err)?;
        let mut geometry_bytes: usize = (0..k).filter(|&r| r != me).map(|r| coarse[r].len()).sum();
        let mut sent = vec![coarse_sent; k];
        let mut walks = Vec::with_capacity(k);
        for (j, bytes) in coarse.iter().enumerate() {
            let cells = if j == me {
                Vec::new()
            } else {
                decode_geometry(bytes, for_error).map_err(GravityError::Communication)?
            };
            walks.push(ExportWalk::new(tree, cells));
        }
        loop {
            let requests: Vec<Vec<u32>> =
                walks.par_iter_mut().map(|w| w.advance(tree, mac)).collect();
            let wanted: u64 = requests.iter().map(|r| r.len() as u64).sum();
            if allreduce_sum(comm, &[wanted]).map_err(comm_err)?[0] == 0 {
                break;
            }
            let asked = alltoallv(comm, &requests).map_err(comm_err)?;
            let replies = sent
                .iter_mut()
                .zip(&asked)
                .map(|(s, a)| s.children(tree, a).map(|c| encode_geometry(&c, for_error)))
                .collect::<Result<Vec<_>, String>>()
                .map_err(GravityError::Communication)?;
            let got = alltoallv(comm, &replies).map_err(comm_err)?;
            for ((w, r), g) in walks.iter_mut().zip(&requests).zip(&got) {
                let children =
                    decode_geometry(g, for_error).map_err(GravityError::Communication)?;
                w.add_children(r, &children)
                    .map_err(GravityError::Communication)?;
                geometry_bytes += g.len();
            }
            geometry_bytes += asked.iter().map(|a| a.len() * 4).sum::<usize>();
        }
        self.stats.geometry_bytes_received = geometry_bytes;
        let packets: Vec<LetPacket> = walks
            .par_iter()
            .map(|w| w.finish(tree, multipoles, len))
            .collect();
        // Counts first: every receiver checks them against its caps, and all ranks grow and
        // retry together until the data fits.
        let counts: Vec<Vec<u64>> = packets
            .iter()
            .map(|p| vec![p.cells.len() as u64, p.particles.len() as u64])
            .collect();
        let incoming = alltoallv(comm, &counts).map_err(comm_err)?;
        let need_cells: usize = incoming.iter().map(|c| c[0] as usize).sum();
        let need_particles: usize = incoming.iter().map(|c| c[1] as usize).sum();
        loop {
            let current = caps.caps();
            let mut overflow = 0u64;
            for (kind, need) in [
                (CapKind::LetCells, need_cells),
                (CapKind::LetParticles, need_particles),
            ] {
                if need > current.get(kind) {
                    stats.overflows[kind as usize] += 1;
                    caps.grow(kind, need);
                    overflow = 1;
                }
            }
            if allreduce_sum(comm, &[overflow]).map_err(comm_err)?[0] == 0 {
                break;
            }
            stats.retries += 1;
        }
        stats.used = Caps {
            let_cells: need_cells,
            let_particles: need_particles,
            ..stats.used
        };
        let precision = self.precision();
        let out: Vec<Vec<u8>> = packets.iter().map(|p| p.encode(precision)).collect();
        self.stats.let_bytes_sent = out.iter().map(Vec::len).sum();
        let incoming = comm.alltoall_bytes(out).map_err(comm_err)?;
        let mut trees = Vec::new();
        let mut received = 0;
        let mut counts = vec![(0, 0); k];
        for (j, bytes) in incoming.iter().enumerate() {
            if j == me || bytes.is_empty() {
                continue;
            }
            received += bytes.len();
            let packet = LetPacket::decode(bytes, precision, walks[j].receiver_cells())
                .map_err(GravityError::Communication)?;
            if !packet.cells.is_empty() {
                counts[j] = (packet.cells.len(), packet.particles.len());
                trees.push(import(&packet, len));
            }
        }
        if self.payload_on_device {
            let routes = payload_routes(tree, &packets, &counts, len);
            self.stats.payload_bytes_received =
                (0..k).map(|j| 8 * routes.receive_values(j)).sum::<usize>();
            self.routes = Some(routes);
        }
        self.stats.let_bytes_received = received;
        self.stats.let_cells = need_cells;
        self.stats.let_particles = need_particles;
        Ok(trees)
    }
}
