//! The distributed force solver: every evaluation rebalances the domains on the work measured
//! in the previous one (particle counts the first time), migrates particles, builds the local
//! tree in the global cube, exchanges locally essential trees, and runs the FMM passes over
//! local and imported cells: on the host, or with `with_device` on a device (the host keeps
//! the tree, the lists and the exchange; the plan carries the imported cells and the own
//! multipoles over, and the imported multipoles and particles too unless the devices move
//! them between themselves, `super::payload`). A device that keeps the rank's particles
//! (`ResidentPasses`) makes the solver a `ResidentState`: the particles stay there between
//! evaluations, and each evaluation brings their positions down for the host's part.

use super::comm::{Communicator, ThreadRank, allgatherv, allreduce_sum, run_thread_ranks};
use super::decomposition::{Domains, balance, global_cube, migrate};
use super::exchange::{Exchange, comm_err};
use super::stats::{RankFigures, RankStats, rank_stat_names};
use crate::fmm::FmmStats;
use crate::fmm::backend::{DevicePasses, ResidentPasses};
use crate::fmm::caps::{CapKind, Caps};
use crate::fmm::presets::PresetsStore;
use crate::fmm::solver::{Evaluation, expected_accelerations};
use crate::fmm::{FmmSettings, FmmSolver};
use crate::gravity::{
    ForceReport, GravityError, GravitySolver, ResidentState, active_flags, check_finite,
};
use crate::integrate::diagnostics::CONSERVED_SUMS;
use crate::particles::Particles;
use bytemuck::{Pod, Zeroable};
use rayon::prelude::*;
use std::time::Instant;

/// A force solver for one rank of a distributed run.
pub struct DistributedFmm<C: Communicator> {
    comm: C,
    solver: FmmSolver,
    /// Per-particle work of the last evaluation, for the next decomposition.
    work: Vec<f64>,
    last: RankStats,
    presets: Option<PresetsStore>,
    caps_known: bool,
    saved_caps: Option<Caps>,
    warnings: Vec<String>,
    /// What `notes` says (e.g. how the payload travels).
    notes: Vec<String>,
    /// Softening length per component (`Component::index`), when they differ.
    component_softening: Option<[f64; 4]>,
    /// Where the passes run when not on the host.
    device: Option<Box<dyn DevicePasses>>,
    /// Set once the warning that the device declined to build the tree has been given.
    tree_declined_said: bool,
}

impl<C: Communicator> std::fmt::Debug for DistributedFmm<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DistributedFmm")
            .field("rank", &self.comm.rank())
            .field("size", &self.comm.size())
            .finish()
    }
}

impl<C: Communicator> DistributedFmm<C> {
    /// A solver for the rank `comm`; `solver` holds the FMM settings and caps, and `presets`
    /// names the caps presets file (read and written by rank 0, caps the largest over ranks).
    pub fn new(comm: C, solver: FmmSolver, presets: Option<PresetsStore>) -> Self {
        let ranks = comm.size();
        DistributedFmm {
            comm,
            solver: solver.with_ranks(ranks),
            work: Vec::new(),
            last: RankStats::default(),
            presets,
            caps_known: false,
            saved_caps: None,
            warnings: Vec::new(),
            notes: Vec::new(),
            component_softening: None,
            device: None,
            tree_declined_said: false,
        }
    }

    /// Runs the passes on `device` (one softening length for all particles; the tree, the
    /// lists and the exchange stay on the host).
    pub fn with_device(mut self, device: Box<dyn DevicePasses>) -> Self {
        self.device = Some(device);
        self
    }

    /// Adds a warning for the next `take_warnings` (e.g. about the device link).
    pub fn with_warning(mut self, warning: String) -> Self {
        self.warnings.push(warning);
        self
    }

    /// Adds a line for `notes` (e.g. how the payload travels between the devices).
    pub fn with_note(mut self, note: String) -> Self {
        self.notes.push(note);
        self
    }

    /// Gives every component its own softening length (indexed by `Component::index`; a
    /// pair uses the larger of its two). The solver's `softening.epsilon` must be the
    /// largest of them.
    pub fn with_component_softening(mut self, table: Option<[f64; 4]>) -> Self {
        self.component_softening = table;
        self
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
    /// with accelerations and potentials. With `active` (block time steps), only those
    /// particles receive forces, and unless every particle of every rank is active the
    /// particles stay where they are (their integrator state stays aligned with them); the
    /// work of such evaluations adds up until the next rebalance, so the domains balance
    /// the work of the whole cycle of time steps.
    pub fn evaluate(
        &mut self,
        particles: &mut Particles,
        active: Option<&[bool]>,
    ) -> Result<RankStats, GravityError> {
        self.evaluate_where(particles, active, false)
    }

    /// `evaluate`, with `resident` on the particles kept on the device
    /// (`ResidentPasses`): `particles` holds their positions as the device has them now,
    /// and their ids, masses and components; the leaving particles' velocities come down
    /// for the migration, the device arranges the rank's new set as `migrate` arranges
    /// `particles`, and the forces stay there.
    fn evaluate_where(
        &mut self,
        particles: &mut Particles,
        active: Option<&[bool]>,
        resident: bool,
    ) -> Result<RankStats, GravityError> {
        let comm: &dyn Communicator = &self.comm;
        let t0 = Instant::now();
        let cube = global_cube(comm, &particles.pos).map_err(comm_err)?;
        // Every rank passes `active` or none does (the integrator's scheme decides).
        let everyone = match active {
            None => true,
            Some(a) => {
                let idle = a.iter().filter(|&&x| !x).count() as u64;
                allreduce_sum(comm, &[idle]).map_err(comm_err)?[0] == 0
            }
        };
        let active = if everyone { None } else { active };
        let mut migrated = 0;
        if comm.size() > 1 && everyone {
            let keys: Vec<u64> = particles.pos.par_iter().map(|&x| cube.key(x)).collect();
            if self.work.len() != particles.len() {
                self.work = vec![0.0; particles.len()];
            }
            let splitters = balance(comm, &keys, &self.work).map_err(comm_err)?;
            let owners = Domains { cube, splitters }.owners(&keys);
            let me = comm.rank();
            let leaving: Vec<u32> = (0..owners.len() as u32)
                .filter(|&i| owners[i as usize] != me)
                .collect();
            if resident {
                particles.vel.resize(particles.len(), [0.0; 3]);
                resident_passes(&mut self.device)?.velocities(&leaving, &mut particles.vel)?;
            }
            migrated = migrate(comm, &owners, particles, &mut self.work).map_err(comm_err)?;
            if resident && (migrated > 0 || particles.len() != owners.len()) {
                resident_passes(&mut self.device)?.migrate(&leaving, particles)?;
            }
        }
        let decomposition_s = t0.elapsed().as_secs_f64();
        let n = particles.len();
        if !self.caps_known {
            self.start_caps(n)?;
        }
        let comm: &dyn Communicator = &self.comm;
        particles.acc.resize(n, [0.0; 3]);
        particles.pot.resize(n, 0.0);
        let settings = self.solver.settings().clone();
        let eps: Option<Vec<f64>> = self.component_softening.map(|table| {
            particles
                .component
                .iter()
                .map(|c| table[c.index()])
                .collect()
        });
        let mut exchange = Exchange {
            comm,
            settings: &settings,
            stats: RankStats::default(),
            payload_on_device: comm.size() > 1
                && self.device.as_ref().is_some_and(|d| d.moves_payload()),
            routes: None,
        };
        // The accuracy target's expectations: the last evaluation's accelerations, when any
        // rank has some (all decide alike; a fresh run's first evaluation finds them), and
        // every rank's mass.
        let (expected, total_mass) = if settings.accuracy > 0.0 {
            let known = particles.acc.iter().any(|a| *a != [0.0; 3]);
            let local = [
                particles.mass.iter().sum::<f64>(),
                f64::from(u8::from(known)),
            ];
            let sums = allreduce_sum(comm, &local).map_err(comm_err)?;
            let expected = (sums[1] > 0.0).then(|| expected_accelerations(&particles.acc));
            (expected, Some(sums[0]))
        } else {
            (None, None)
        };
        // The evaluation's options (a macro: the exchange is lent to each use in turn).
        macro_rules! with {
            () => {
                Evaluation {
                    eps: eps.as_deref(),
                    cube: Some(cube),
                    remote: Some(&mut exchange),
                    active,
                    expected_accel: expected.as_deref(),
                    total_mass,
                    // A run's steps keep the solver's copy: at 1e7 the in-place permutation
                    // would cost ~1.5 s a step more.
                    in_place: false,
                }
            };
        }
        let fmm = match &mut self.device {
            None => self.solver.evaluate_with(
                &particles.pos,
                &particles.mass,
                &particles.id,
                with!(),
                &mut particles.acc,
                &mut particles.pot,
            )?,
            Some(device) => {
                // Particles kept on the device, every one a target: their tree is built
                // there (the host gets the cells), unless the device declines it.
                let on_device = match (resident, everyone) {
                    (true, true) => device.resident().ok_or_else(not_resident)?.plan_tree(
                        &mut self.solver,
                        &particles.id,
                        with!(),
                    )?,
                    _ => None,
                };
                if resident && everyone && on_device.is_none() && !self.tree_declined_said {
                    self.tree_declined_said = true;
                    self.warnings.push(format!(
                        "rank {}: the device declined to build the tree (a position that is not finite, a sort that failed its check or a run of equal keys too long for it); the host built it from the positions, and will whenever that happens again",
                        comm.rank()
                    ));
                }
                let mut stats = match on_device {
                    Some(stats) => stats,
                    None => self.solver.plan_with(
                        &particles.pos,
                        &particles.mass,
                        &particles.id,
                        with!(),
                    )?,
                };
                let caps = self.solver.caps().unwrap_or_default();
                let force = (settings.softening, settings.g);
                let plan = match &exchange.routes {
                    Some(routes) => {
                        // The devices move the payload together (NCCL would wait for a
                        // rank that gave up): all go on, or every rank stops here.
                        let plan = self.solver.device_plan().and_then(|plan| {
                            let (cells, n) = (plan.centre.len(), plan.particles());
                            routes
                                .check(plan.own_cells, plan.own_particles, cells, n)
                                .map_err(GravityError::Communication)?;
                            Ok(plan)
                        });
                        let ready =
                            allreduce_sum(comm, &[u64::from(plan.is_ok())]).map_err(comm_err)?[0];
                        let plan = plan?;
                        if ready != comm.size() as u64 {
                            return Err(GravityError::Device(
                                "another rank could not run its passes on its device".into(),
                            ));
                        }
                        plan
                    }
                    None => self.solver.device_plan()?,
                };
                let payload = exchange.routes.as_ref().map(|routes| (routes, comm));
                let seconds = match (resident, payload) {
                    (true, payload) => device
                        .resident()
                        .ok_or_else(not_resident)?
                        .run_passes_resident(&plan, &caps, force, payload)?,
                    (false, payload) => {
                        let forces = match payload {
                            Some((routes, comm)) => {
                                device.run_passes_with_payload(&plan, &caps, force, routes, comm)?
                            }
                            None => device.run_passes(&plan, &caps, force.0, force.1)?,
                        };
                        forces.write_to(
                            plan.order_of,
                            active,
                            &mut particles.acc,
                            &mut particles.pot,
                        );
                        forces.seconds
                    }
                };
                stats.add_device_seconds(&seconds);
                stats.p2p_interactions = plan.p2p_interactions();
                stats
            }
        };
        let added = self.solver.particle_work();
        let work: f64 = added.iter().sum();
        if everyone || self.work.len() != n {
            self.work = added;
        } else {
            for (w, add) in self.work.iter_mut().zip(added) {
                *w += add;
            }
        }
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
        self.share_caps()?;
        Ok(self.last)
    }

    /// The caps of the first evaluation: rank 0's preset for this size, on every rank.
    fn start_caps(&mut self, n: usize) -> Result<(), GravityError> {
        let comm: &dyn Communicator = &self.comm;
        let total = allreduce_sum(comm, &[n as u64]).map_err(comm_err)?[0];
        let per_rank = (total as usize).div_ceil(comm.size());
        let mut found = [0u64; CAP_KINDS];
        if comm.rank() == 0
            && let Some(store) = &self.presets
        {
            let (file, warning) = store.load();
            self.warnings.extend(warning);
            if let Some(caps) = file.lookup(&self.solver.preset_key(per_rank)) {
                found = caps_to_array(&caps);
            }
        }
        let found = allreduce_sum(comm, &found).map_err(comm_err)?;
        if found.iter().any(|&c| c > 0) {
            self.solver.set_caps(caps_from_array(&found));
        }
        self.caps_known = true;
        Ok(())
    }

    /// Gives every rank the largest of every rank's caps, and records them as the preset for
    /// this size when they changed.
    fn share_caps(&mut self) -> Result<(), GravityError> {
        let comm: &dyn Communicator = &self.comm;
        let mut mine = self
            .solver
            .caps()
            .map(|c| caps_to_array(&c))
            .unwrap_or_default()
            .to_vec();
        mine.push(self.last.particles as u64);
        let all = allgatherv(comm, &mine).map_err(comm_err)?;
        let mut max = [0u64; CAP_KINDS];
        for caps in &all {
            for (m, &c) in max.iter_mut().zip(caps) {
                *m = (*m).max(c);
            }
        }
        let caps = caps_from_array(&max);
        self.solver.raise_caps(&caps);
        if self.saved_caps != Some(caps) {
            let total: u64 = all.iter().map(|v| v[CAP_KINDS]).sum();
            let key = self
                .solver
                .preset_key((total as usize).div_ceil(comm.size()));
            if comm.rank() == 0
                && let Some(store) = &self.presets
                && let Err(e) = store.save(key, caps)
            {
                self.warnings.push(e);
            }
            self.saved_caps = Some(caps);
        }
        Ok(())
    }
}

/// Number of cap kinds.
const CAP_KINDS: usize = CapKind::ALL.len();

fn caps_to_array(caps: &Caps) -> [u64; CAP_KINDS] {
    CapKind::ALL.map(|k| caps.get(k) as u64)
}

fn caps_from_array(values: &[u64]) -> Caps {
    let mut caps = Caps::default();
    for (k, &v) in CapKind::ALL.iter().zip(values) {
        caps.set(*k, v as usize);
    }
    caps
}

/// The device of a distributed solver as the keeper of its rank's particles.
fn resident_passes(
    device: &mut Option<Box<dyn DevicePasses>>,
) -> Result<&mut dyn ResidentPasses, GravityError> {
    device
        .as_mut()
        .and_then(|d| d.resident())
        .ok_or_else(not_resident)
}

/// Using the resident path of a solver whose device does not keep particles.
fn not_resident() -> GravityError {
    GravityError::Device("this solver's device does not keep the particles".into())
}

impl<C: Communicator + 'static> DistributedFmm<C> {
    /// `compute` or `compute_active`: the evaluation with its figures as a report; with
    /// `resident`, of the particles kept on the device (their positions come down first).
    fn compute_some(
        &mut self,
        particles: &mut Particles,
        active: Option<&[bool]>,
        resident: bool,
    ) -> Result<ForceReport, GravityError> {
        let start = Instant::now();
        if resident {
            resident_passes(&mut self.device)?.positions(&mut particles.pos)?;
        }
        if let Err(e) = check_finite(particles) {
            self.comm.abort(&e.to_string());
            return Err(e);
        }
        let s = self.evaluate_where(particles, active, resident)?;
        let mut stats = s.fmm.solver_stats();
        stats.extend(s.solver_stats());
        Ok(ForceReport {
            pair_interactions: s.fmm.p2p_interactions,
            seconds: start.elapsed().as_secs_f64(),
            stats,
        })
    }
}

impl<C: Communicator + 'static> GravitySolver for DistributedFmm<C> {
    fn name(&self) -> &'static str {
        match self.device {
            Some(_) => "fmm-cuda",
            None => "fmm",
        }
    }

    fn compute(&mut self, particles: &mut Particles) -> Result<ForceReport, GravityError> {
        self.compute_some(particles, None, false)
    }

    fn compute_active(
        &mut self,
        particles: &mut Particles,
        active: &[bool],
    ) -> Result<ForceReport, GravityError> {
        self.compute_some(particles, Some(active), false)
    }

    fn stat_names(&self) -> Vec<&'static str> {
        let mut names = FmmStats::stat_names();
        names.extend(rank_stat_names());
        names
    }

    fn notes(&self) -> Vec<String> {
        self.notes.clone()
    }

    fn take_warnings(&mut self) -> Vec<String> {
        let mut w = std::mem::take(&mut self.warnings);
        w.extend(self.solver.take_warnings());
        w
    }

    fn caps(&self) -> Option<Caps> {
        self.solver.caps()
    }

    fn set_caps(&mut self, caps: Caps) {
        self.solver.set_caps(caps);
        self.caps_known = true;
    }

    fn decomposition_work(&self) -> Vec<f64> {
        self.work.clone()
    }

    fn set_decomposition_work(&mut self, work: Vec<f64>) {
        self.work = work;
    }

    /// The particles stay on the rank's device when it can keep them and moves the LET
    /// payload itself (then the plan's own positions are the device's exactly: none are
    /// rounded for the wire).
    fn resident(&mut self) -> Option<&mut dyn ResidentState> {
        let keeps = self
            .device
            .as_mut()
            .is_some_and(|d| d.moves_payload() && d.resident().is_some());
        if keeps { Some(self) } else { None }
    }
}

/// The distributed FMM with its rank's particles on its device (`ResidentPasses`): the
/// integrator's operations go to the device; an evaluation brings the positions down for
/// the host's decomposition, tree and LET (`evaluate_where`).
impl<C: Communicator + 'static> ResidentState for DistributedFmm<C> {
    fn load(&mut self, particles: &Particles) -> Result<(), GravityError> {
        resident_passes(&mut self.device)?.load(particles)
    }

    fn kick(&mut self, h: f64) -> Result<(), GravityError> {
        resident_passes(&mut self.device)?.kick(h)
    }

    fn drift(&mut self, h: f64) -> Result<(), GravityError> {
        resident_passes(&mut self.device)?.drift(h)
    }

    fn compute(&mut self, particles: &mut Particles) -> Result<ForceReport, GravityError> {
        self.compute_some(particles, None, true)
    }

    fn compute_active(
        &mut self,
        particles: &mut Particles,
        active: &[u32],
    ) -> Result<ForceReport, GravityError> {
        let flags = active_flags(active, particles.len());
        self.compute_some(particles, Some(&flags), true)
    }

    fn kick_each(&mut self, rows: Option<&[u32]>, h: &[f64]) -> Result<(), GravityError> {
        resident_passes(&mut self.device)?.kick_each(rows, h)
    }

    fn accelerations(
        &mut self,
        particles: &mut Particles,
        only: Option<&[u32]>,
    ) -> Result<(), GravityError> {
        particles.acc.resize(particles.len(), [0.0; 3]);
        resident_passes(&mut self.device)?.accelerations(&mut particles.acc, only)
    }

    fn max_acceleration_by_component(&mut self) -> Result<[f64; 4], GravityError> {
        resident_passes(&mut self.device)?.max_acceleration_by_component()
    }

    fn conserved_sums(&mut self) -> Result<[f64; CONSERVED_SUMS], GravityError> {
        resident_passes(&mut self.device)?.conserved_sums()
    }

    fn store(&mut self, particles: &mut Particles) -> Result<(), GravityError> {
        resident_passes(&mut self.device)?.store(particles)
    }

    fn add_external(&mut self, terms: &[f64], rows: Option<&[u32]>) -> Result<(), GravityError> {
        resident_passes(&mut self.device)?.add_external(terms, rows)
    }

    fn external_energy(&mut self, terms: &[f64]) -> Result<f64, GravityError> {
        resident_passes(&mut self.device)?.external_energy(terms)
    }
}

/// Forces of a distributed evaluation, back in the caller's order.
#[derive(Debug, Clone, Default)]
pub struct GatheredForces {
    /// Accelerations, in the order of the input particles.
    pub acc: Vec<[f64; 3]>,
    /// Potentials, in the order of the input particles.
    pub pot: Vec<f64>,
    /// `figures[e][r]`: rank r's figures of evaluation e.
    pub figures: Vec<Vec<RankFigures>>,
}

/// One particle's force on the way back to every rank.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
struct ForceRecord {
    id: u64,
    acc: [f64; 3],
    pot: f64,
}

/// Opens the device that runs the passes of the rank it is given (`DistributedFmm::with_device`;
/// every rank calls it together, so it may link the ranks' devices).
pub type DeviceOpener<'a> =
    dyn Fn(&dyn Communicator) -> Result<Box<dyn DevicePasses>, GravityError> + Sync + 'a;

/// One rank's part of evaluating a whole particle set (every rank holds all of
/// `particles`, as after reading a snapshot): it starts from an equal contiguous share,
/// evaluates `repeat` times, and every rank gets all forces, in the input order, and every
/// rank's figures. With `device`, each rank runs its passes on the device it opens.
/// `leapfmm forces --ranks K` (thread ranks) and under mpirun use it.
pub fn evaluate_share<C: Communicator + Clone + 'static>(
    comm: &C,
    particles: &Particles,
    settings: &FmmSettings,
    repeat: usize,
    presets: Option<PresetsStore>,
    device: Option<&DeviceOpener<'_>>,
) -> Result<GatheredForces, GravityError> {
    let n = particles.len();
    let (r, k) = (comm.rank(), comm.size());
    let mut mine = particles.slice(n * r / k..n * (r + 1) / k);
    let mut solver = DistributedFmm::new(
        comm.clone(),
        FmmSolver::new(settings.clone(), None),
        presets,
    );
    if let Some(open) = device {
        solver = solver.with_device(open(comm)?);
    }
    let mut figures = Vec::with_capacity(repeat.max(1));
    for _ in 0..repeat.max(1) {
        let stats = solver.evaluate(&mut mine, None)?;
        let all = allgatherv(comm, &[RankFigures::from(&stats)]).map_err(comm_err)?;
        figures.push(all.into_iter().flatten().collect());
    }
    let records: Vec<ForceRecord> = (0..mine.len())
        .map(|i| ForceRecord {
            id: mine.id[i],
            acc: mine.acc[i],
            pot: mine.pot[i],
        })
        .collect();
    let all = allgatherv(comm, &records).map_err(comm_err)?;
    let mut index: Vec<(u64, usize)> = particles
        .id
        .iter()
        .enumerate()
        .map(|(i, &id)| (id, i))
        .collect();
    index.sort_unstable();
    let mut out = GatheredForces {
        acc: vec![[0.0; 3]; n],
        pot: vec![0.0; n],
        figures,
    };
    for rec in all.iter().flatten() {
        let k = index.partition_point(|&(id, _)| id < rec.id);
        if let Some(&(id, at)) = index.get(k)
            && id == rec.id
        {
            out.acc[at] = rec.acc;
            out.pot[at] = rec.pot;
        }
    }
    Ok(out)
}

/// `evaluate_share` on `ranks` thread ranks of this process.
pub fn evaluate_on_thread_ranks(
    particles: &Particles,
    settings: &FmmSettings,
    ranks: usize,
    repeat: usize,
    presets: Option<PresetsStore>,
    device: Option<&DeviceOpener<'_>>,
) -> Result<GatheredForces, GravityError> {
    let threads = (rayon::current_num_threads() / ranks.max(1)).max(1);
    let timeout = std::time::Duration::from_secs(3600);
    let mut all = run_thread_ranks(ranks, threads, timeout, |comm: &ThreadRank| {
        let out = evaluate_share(comm, particles, settings, repeat, presets.clone(), device)?;
        // Every rank holds the same result; only rank 0's travels back.
        Ok::<_, GravityError>((comm.rank() == 0).then_some(out))
    })
    .map_err(|(rank, reason)| {
        GravityError::Communication(format!("rank {rank} of {ranks} failed: {reason}"))
    })?;
    Ok(all.swap_remove(0).unwrap_or_default())
}
