//! The distributed force solver: every evaluation rebalances the domains on the work measured
//! in the previous one (particle counts the first time), migrates particles, builds the local
//! tree in the global cube, exchanges locally essential trees, and runs the FMM passes over
//! local and imported cells.

use super::comm::{Communicator, allgatherv, allreduce_sum, alltoallv};
use super::decomposition::{Domains, balance, global_cube, migrate};
use super::let_tree::{LetCell, TopCell, export, import_cells, top_tree};
use crate::fmm::caps::{CapKind, Caps, CapsTracker};
use crate::fmm::solver::{FmmStats, RemoteSource, RemoteTree};
use crate::fmm::tree::Tree;
use crate::fmm::{FmmSettings, FmmSolver};
use crate::gravity::{ForceReport, GravityError, GravitySolver, SolverStat, check_finite};
use crate::particles::Particles;
use std::time::Instant;

/// Cells with more particles than this keep their children in the shared top tree. 0 shares
/// every cell's geometry (56 bytes per cell, about 17% of the LET at N = 1e6, K = 4): a
/// coarser top tree forces the conservative test in `let_tree::far` on big sparse halo cells,
/// which measured more total traffic at every threshold tried (256: +36%, 1024: 4.6x).
const TOP_TREE_MIN_PARTICLES: usize = 0;

/// What one distributed evaluation did on this rank.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RankStats {
    /// Particles on this rank after migration.
    pub particles: usize,
    /// Particles that left this rank.
    pub migrated: usize,
    /// This rank's work in the evaluation (see `FmmSolver::particle_work`).
    pub work: f64,
    /// Largest rank work over mean rank work.
    pub imbalance: f64,
    /// LET cells received.
    pub let_cells: usize,
    /// LET particles received.
    pub let_particles: usize,
    /// Bytes of LET data sent (cells, multipoles, particles).
    pub let_bytes_sent: usize,
    /// Bytes of LET data received.
    pub let_bytes_received: usize,
    /// Bytes of top-tree geometry received (every rank's top tree).
    pub top_bytes_received: usize,
    /// Seconds in decomposition and migration.
    pub decomposition_s: f64,
    /// The local FMM's own figures (exchange time included as `seconds.exchange`).
    pub fmm: FmmStats,
}

/// A force solver for one rank of a distributed run.
pub struct DistributedFmm<C: Communicator> {
    comm: C,
    solver: FmmSolver,
    work: Vec<f64>,
    last: RankStats,
}

impl<C: Communicator> std::fmt::Debug for DistributedFmm<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DistributedFmm")
            .field("rank", &self.comm.rank())
            .field("size", &self.comm.size())
            .finish()
    }
}

/// The LET exchange of one evaluation, as the FMM's remote source.
struct Exchange<'a> {
    comm: &'a dyn Communicator,
    settings: &'a FmmSettings,
    stats: RankStats,
}

fn comm_err(e: super::comm::CommError) -> GravityError {
    GravityError::Communication(e.to_string())
}

impl RemoteSource for Exchange<'_> {
    fn remote_trees(
        &mut self,
        tree: &Tree,
        multipoles: &[f64],
        len: usize,
        caps: &mut CapsTracker,
        stats: &mut FmmStats,
    ) -> Result<Vec<RemoteTree>, GravityError> {
        let comm = self.comm;
        let (me, k) = (comm.rank(), comm.size());
        let tops: Vec<Vec<TopCell>> =
            allgatherv(comm, &top_tree(tree, TOP_TREE_MIN_PARTICLES)).map_err(comm_err)?;
        self.stats.top_bytes_received = tops
            .iter()
            .enumerate()
            .filter(|(r, _)| *r != me)
            .map(|(_, t)| std::mem::size_of_val(t.as_slice()))
            .sum();
        let mac = self.settings.mac();
        let packets: Vec<_> = (0..k)
            .map(|j| {
                if j == me {
                    Default::default()
                } else {
                    export(tree, multipoles, len, &tops[j], mac)
                }
            })
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
        let cells_out: Vec<Vec<LetCell>> = packets.iter().map(|p| p.cells.clone()).collect();
        let multipoles_out: Vec<Vec<f64>> = packets.iter().map(|p| p.multipoles.clone()).collect();
        let particles_out: Vec<Vec<[f64; 4]>> =
            packets.iter().map(|p| p.particles.clone()).collect();
        self.stats.let_bytes_sent = packets
            .iter()
            .map(|p| {
                std::mem::size_of_val(p.cells.as_slice())
                    + std::mem::size_of_val(p.multipoles.as_slice())
                    + std::mem::size_of_val(p.particles.as_slice())
            })
            .sum();
        let cells_in = alltoallv(comm, &cells_out).map_err(comm_err)?;
        let multipoles_in = alltoallv(comm, &multipoles_out).map_err(comm_err)?;
        let particles_in = alltoallv(comm, &particles_out).map_err(comm_err)?;
        let mut trees = Vec::new();
        let mut received = 0;
        for j in 0..k {
            if j == me || cells_in[j].is_empty() {
                continue;
            }
            let packet = super::let_tree::LetPacket {
                cells: cells_in[j].clone(),
                multipoles: Vec::new(),
                particles: Vec::new(),
            };
            received += std::mem::size_of_val(cells_in[j].as_slice())
                + std::mem::size_of_val(multipoles_in[j].as_slice())
                + std::mem::size_of_val(particles_in[j].as_slice());
            trees.push(RemoteTree {
                cells: import_cells(&packet),
                multipoles: multipoles_in[j].clone(),
                pos: particles_in[j].iter().map(|q| [q[0], q[1], q[2]]).collect(),
                mass: particles_in[j].iter().map(|q| q[3]).collect(),
            });
        }
        self.stats.let_bytes_received = received;
        self.stats.let_cells = need_cells;
        self.stats.let_particles = need_particles;
        Ok(trees)
    }
}

impl<C: Communicator> DistributedFmm<C> {
    /// A solver for the rank `comm`; `solver` holds the FMM settings and caps.
    pub fn new(comm: C, solver: FmmSolver) -> Self {
        DistributedFmm {
            comm,
            solver,
            work: Vec::new(),
            last: RankStats::default(),
        }
    }

    /// The communicator.
    pub fn comm(&self) -> &C {
        &self.comm
    }

    /// Figures of the last evaluation on this rank.
    pub fn last_stats(&self) -> RankStats {
        self.last
    }

    /// Rebalances, migrates and evaluates: afterwards `particles` holds this rank's new set
    /// with accelerations and potentials.
    pub fn evaluate(&mut self, particles: &mut Particles) -> Result<RankStats, GravityError> {
        let comm: &dyn Communicator = &self.comm;
        let t0 = Instant::now();
        let cube = global_cube(comm, &particles.pos).map_err(comm_err)?;
        let keys: Vec<u64> = particles.pos.iter().map(|&x| cube.key(x)).collect();
        if self.work.len() != particles.len() {
            self.work = vec![0.0; particles.len()];
        }
        let splitters = balance(comm, &keys, &self.work).map_err(comm_err)?;
        let domains = Domains { cube, splitters };
        let migrated = migrate(comm, &domains, particles, &mut self.work).map_err(comm_err)?;
        let decomposition_s = t0.elapsed().as_secs_f64();
        let n = particles.len();
        particles.acc.resize(n, [0.0; 3]);
        particles.pot.resize(n, 0.0);
        let settings = self.solver.settings().clone();
        let mut exchange = Exchange {
            comm,
            settings: &settings,
            stats: RankStats::default(),
        };
        let fmm = self.solver.evaluate_with(
            &particles.pos,
            &particles.mass,
            &particles.id,
            Some(cube),
            Some(&mut exchange),
            &mut particles.acc,
            &mut particles.pot,
        )?;
        self.work = self.solver.particle_work();
        let work: f64 = self.work.iter().sum();
        let all = allgatherv(comm, &[work]).map_err(comm_err)?;
        let mean = all.iter().map(|w| w[0]).sum::<f64>() / all.len() as f64;
        let max = all.iter().map(|w| w[0]).fold(0.0, f64::max);
        self.last = RankStats {
            particles: n,
            migrated,
            work,
            imbalance: if mean > 0.0 { max / mean } else { 1.0 },
            decomposition_s,
            fmm,
            ..exchange.stats
        };
        Ok(self.last)
    }
}

impl<C: Communicator + 'static> GravitySolver for DistributedFmm<C> {
    fn name(&self) -> &'static str {
        "fmm"
    }

    fn compute(&mut self, particles: &mut Particles) -> Result<ForceReport, GravityError> {
        if let Err(e) = check_finite(particles) {
            self.comm.abort(&e.to_string());
            return Err(e);
        }
        let start = Instant::now();
        let s = self.evaluate(particles)?;
        let stats = [
            ("rank_particles", s.particles as f64, false),
            ("rank_work", s.work, false),
            ("load_imbalance", s.imbalance, false),
            ("let_cells_received", s.let_cells as f64, false),
            ("let_particles_received", s.let_particles as f64, false),
            ("let_bytes_sent", s.let_bytes_sent as f64, false),
            ("let_bytes_received", s.let_bytes_received as f64, false),
            ("fmm_retries", s.fmm.retries as f64, true),
            ("decomposition_s", s.decomposition_s, true),
            ("exchange_s", s.fmm.seconds.exchange, true),
        ]
        .into_iter()
        .map(|(name, value, summed)| SolverStat {
            name,
            value,
            summed,
        })
        .collect();
        Ok(ForceReport {
            pair_interactions: s.fmm.p2p_interactions,
            seconds: start.elapsed().as_secs_f64(),
            stats,
        })
    }

    fn stat_names(&self) -> Vec<&'static str> {
        vec![
            "rank_particles",
            "rank_work",
            "load_imbalance",
            "let_cells_received",
            "let_particles_received",
            "let_bytes_sent",
            "let_bytes_received",
            "fmm_retries",
            "decomposition_s",
            "exchange_s",
        ]
    }

    fn take_warnings(&mut self) -> Vec<String> {
        self.solver.take_warnings()
    }

    fn caps(&self) -> Option<Caps> {
        self.solver.caps()
    }

    fn set_caps(&mut self, caps: Caps) {
        self.solver.set_caps(caps);
    }
}
