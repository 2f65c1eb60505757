//! The GPU force solver of a run (design §7's pipeline). With the particles resident on the
//! device (`ResidentState`), the device keys and sorts them into tree order and splits
//! them into cells (the sort's sums and the cells come back for the host to check; when a
//! run of equal keys is too long for the device to order by id, the keys and order come
//! back instead for the host to order it and split), computes the cells' moments and walks
//! the tree (the moments come back; the lists stay there, unless the device's walk gives up
//! on a step and the host walks), and runs the passes. For the block scheme's sub-steps
//! (`ResidentState::compute_active`) the device also flags the cells holding the active
//! particles (a byte per cell comes back) and walks for those only. Otherwise
//! (`GravitySolver::compute`, the first evaluation before the state is loaded) the host
//! builds the tree and lists (`FmmSolver::plan`), positions go up and forces come down.

use super::context::GpuFmm;
use super::error::GpuError;
use super::state::DeviceState;
use crate::distributed::stats::{RankStats, rank_stat_names};
use crate::fmm::FmmSolver;
use crate::fmm::FmmStats;
use crate::fmm::backend::{DeviceLists, DevicePlan, DeviceSeconds, DeviceTree};
use crate::fmm::caps::Caps;
use crate::fmm::morton::BoundingCube;
use crate::fmm::solver::Evaluation;
use crate::fmm::traversal::Mac;
use crate::fmm::tree::{CellColumns, CellsOverflow, MOMENT_VALUES, SortedParticles, Tree};
use crate::gravity::{
    ForceReport, GravityError, GravitySolver, ResidentState, active_flags, check_finite,
};
use crate::integrate::diagnostics::CONSERVED_SUMS;
use crate::particles::Particles;
use std::time::Instant;

/// FMM forces with the passes on a CUDA device.
pub struct GpuSolver {
    host: FmmSolver,
    device: GpuFmm,
    /// The run's particles on the device, once `ResidentState::load`ed.
    state: Option<DeviceState>,
    /// The device's sort of them into tree order, on its way to the host's tree when equal
    /// keys need ordering by id (buffers swapped with the tree's each step).
    sorted: SortedParticles,
    /// The device's split of them into cells, on its way to the host's tree.
    columns: CellColumns,
    /// False once the host has rejected a device sort: the host sorts from then on.
    sort_on_device: bool,
    /// True once the warning that the device's walk gave up was said.
    walk_declined_said: bool,
    /// Said once, at the next `take_warnings`.
    warnings: Vec<String>,
}

/// A device failure as the solver's error.
pub(super) fn device_error(e: GpuError) -> GravityError {
    GravityError::Device(e.to_string())
}

impl GpuSolver {
    /// `host` (its settings, caps and presets) with the passes on `device`.
    pub fn new(host: FmmSolver, device: GpuFmm) -> Self {
        GpuSolver {
            host: host.with_backend("cuda"),
            device,
            state: None,
            sorted: SortedParticles::default(),
            columns: CellColumns::default(),
            sort_on_device: true,
            walk_declined_said: false,
            warnings: Vec::new(),
        }
    }

    /// The host's tree and lists for `particles` (positions as they are now), the lists
    /// only for the cells holding `active` particles when given; `host.device_plan()`
    /// then hands them out.
    fn plan(
        &mut self,
        particles: &Particles,
        active: Option<&[bool]>,
    ) -> Result<FmmStats, GravityError> {
        check_finite(particles)?;
        let with = Evaluation {
            active,
            ..Evaluation::default()
        };
        self.host
            .plan_with(&particles.pos, &particles.mass, &particles.id, with)
    }

    /// The plan from the device's sort of the resident particles into tree order, its
    /// split into cells (or the host's, when a run of equal keys was too long for the
    /// device to order by id), its moments of the cells and its walk; `None` when the host
    /// rejects that sort or split (then, with a warning, the host sorts from now on: a
    /// fault of the device's tree costs speed, not the run).
    /// With `active` (rows), the lists only for the cells holding those particles (flagged
    /// and walked on the device, or on the host when it splits or gives up).
    fn plan_device_sorted(
        &mut self,
        particles: &mut Particles,
        active: Option<&[u32]>,
    ) -> Result<Option<FmmStats>, GravityError> {
        let state = self.state.as_ref().ok_or_else(not_loaded)?;
        let t0 = Instant::now();
        let sorted = self.device.sort_resident(state).map_err(device_error)?;
        let Some(sort) = sorted else {
            // The host's copy names the particle (its masses are the device's).
            self.device
                .positions(state, &mut particles.pos)
                .map_err(device_error)?;
            check_finite(particles)?;
            return Err(GravityError::Device(
                "a position on the device is not finite".into(),
            ));
        };
        let checked = sort.summary.check(state.particles());
        // Runs of equal keys too long for the device are ordered by id on the host, from
        // the downloaded sort.
        let host_splits = checked.is_ok() && !sort.runs_ordered;
        if host_splits {
            self.device
                .download_sorted(state, sort.cube, &mut self.sorted, false)
                .map_err(device_error)?;
        }
        let sorting = t0.elapsed().as_secs_f64();
        let mut walk_declined = false;
        let mut on_device = OnDevice {
            device: &mut self.device,
            state,
            cube: sort.cube,
            columns: &mut self.columns,
            walk_declined: &mut walk_declined,
            active,
        };
        let planned = match checked {
            Err(why) => Err(GravityError::NotSorted(why)),
            Ok(()) if host_splits => {
                let flags = active.map(|rows| active_flags(rows, particles.len()));
                self.host.plan_sorted(
                    &mut self.sorted,
                    &particles.id,
                    Some(&mut on_device),
                    flags.as_deref(),
                )
            }
            Ok(()) => self
                .host
                .plan_split(&particles.id, &mut on_device, active.is_some()),
        };
        if walk_declined && !self.walk_declined_said {
            self.walk_declined_said = true;
            self.warnings.push(
                "the device's walk gave up on a step (a target with too many opened sources, or a list out of order); the host walked it, and will whenever that happens again".into(),
            );
        }
        match planned {
            Ok(mut stats) => {
                stats.seconds.tree += sorting;
                Ok(Some(stats))
            }
            Err(GravityError::NotSorted(why)) => {
                self.sort_on_device = false;
                self.warnings.push(format!(
                    "the device's tree was rejected ({why}); the host sorts from now on"
                ));
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Forces for every particle, with positions going up and forces coming down (the
    /// particles on the host: a run's first evaluation, before they are loaded onto the
    /// device).
    fn compute_on_host(&mut self, particles: &mut Particles) -> Result<ForceReport, GravityError> {
        let start = Instant::now();
        let n = particles.len();
        particles.acc.resize(n, [0.0; 3]);
        particles.pot.resize(n, 0.0);
        if n == 0 {
            return Ok(no_work());
        }
        let stats = self.plan(particles, None)?;
        let plan = self.host.device_plan()?;
        let settings = self.host.settings();
        let caps = self.host.caps().unwrap_or_default();
        let out = self
            .device
            .evaluate(&plan, &caps, settings.softening, settings.g)
            .map_err(device_error)?;
        out.write_to(plan.order_of, None, &mut particles.acc, &mut particles.pot);
        Ok(Self::report(&plan, stats, out.seconds, start))
    }

    /// Forces on the resident particles, or with `active` on those listed (the others'
    /// left undefined on the device): the device sorts them into tree order and computes
    /// the cells' moments; it also splits them into cells and walks, unless the host must
    /// (`plan_device_sorted`); when the device's tree is rejected, the host's from the
    /// downloaded positions.
    fn compute_resident(
        &mut self,
        particles: &mut Particles,
        active: Option<&[u32]>,
    ) -> Result<ForceReport, GravityError> {
        let start = Instant::now();
        if particles.is_empty() {
            return Ok(no_work());
        }
        let sorted_plan = if self.sort_on_device {
            self.plan_device_sorted(particles, active)?
        } else {
            None
        };
        let tree_on_device = sorted_plan.is_some();
        let stats = match sorted_plan {
            Some(stats) => stats,
            None => {
                let state = self.state.as_ref().ok_or_else(not_loaded)?;
                self.device
                    .positions(state, &mut particles.pos)
                    .map_err(device_error)?;
                let flags = active.map(|rows| active_flags(rows, particles.len()));
                self.plan(particles, flags.as_deref())?
            }
        };
        let plan = self.host.device_plan()?;
        let settings = self.host.settings();
        let caps = self.host.caps().unwrap_or_default();
        let state = self.state.as_mut().ok_or_else(not_loaded)?;
        let seconds = self
            .device
            .evaluate_resident(
                &plan,
                &caps,
                settings.softening,
                settings.g,
                state,
                tree_on_device,
            )
            .map_err(device_error)?;
        Ok(Self::report(&plan, stats, seconds, start))
    }

    /// The report of an evaluation of `plan` whose device phases took `s`.
    fn report(
        plan: &DevicePlan,
        mut stats: FmmStats,
        s: DeviceSeconds,
        start: Instant,
    ) -> ForceReport {
        stats.add_device_seconds(&s);
        stats.p2p_interactions = plan.p2p_interactions();
        let mut figures = stats.solver_stats();
        figures.extend(RankStats::alone(plan.own_particles).solver_stats());
        ForceReport {
            pair_interactions: stats.p2p_interactions,
            seconds: start.elapsed().as_secs_f64(),
            stats: figures,
        }
    }
}

impl GravitySolver for GpuSolver {
    fn name(&self) -> &'static str {
        "fmm-cuda"
    }

    fn compute(&mut self, particles: &mut Particles) -> Result<ForceReport, GravityError> {
        self.compute_on_host(particles)
    }

    fn stat_names(&self) -> Vec<&'static str> {
        let mut names = FmmStats::stat_names();
        names.extend(rank_stat_names());
        names
    }

    fn take_warnings(&mut self) -> Vec<String> {
        let mut warnings = std::mem::take(&mut self.warnings);
        warnings.extend(self.host.take_warnings());
        warnings
    }

    fn caps(&self) -> Option<Caps> {
        self.host.caps()
    }

    fn set_caps(&mut self, caps: Caps) {
        self.host.set_caps(caps);
    }

    fn resident(&mut self) -> Option<&mut dyn ResidentState> {
        Some(self)
    }
}

impl ResidentState for GpuSolver {
    fn load(&mut self, particles: &Particles) -> Result<(), GravityError> {
        self.state = Some(self.device.load_state(particles).map_err(device_error)?);
        Ok(())
    }

    fn kick(&mut self, h: f64) -> Result<(), GravityError> {
        let state = self.state.as_mut().ok_or_else(not_loaded)?;
        self.device.kick(state, h).map_err(device_error)
    }

    fn drift(&mut self, h: f64) -> Result<(), GravityError> {
        let state = self.state.as_mut().ok_or_else(not_loaded)?;
        self.device.drift(state, h).map_err(device_error)
    }

    fn compute(&mut self, particles: &mut Particles) -> Result<ForceReport, GravityError> {
        self.compute_resident(particles, None)
    }

    fn compute_active(
        &mut self,
        particles: &mut Particles,
        active: &[u32],
    ) -> Result<ForceReport, GravityError> {
        self.compute_resident(particles, Some(active))
    }

    fn kick_each(&mut self, rows: Option<&[u32]>, h: &[f64]) -> Result<(), GravityError> {
        let state = self.state.as_mut().ok_or_else(not_loaded)?;
        self.device.kick_each(state, rows, h).map_err(device_error)
    }

    fn accelerations(
        &mut self,
        particles: &mut Particles,
        only: Option<&[u32]>,
    ) -> Result<(), GravityError> {
        let state = self.state.as_mut().ok_or_else(not_loaded)?;
        self.device
            .accelerations(state, &mut particles.acc, only)
            .map_err(device_error)
    }

    fn max_acceleration_by_component(&mut self) -> Result<[f64; 4], GravityError> {
        let state = self.state.as_mut().ok_or_else(not_loaded)?;
        self.device
            .max_acceleration_by_component(state)
            .map_err(device_error)
    }

    fn conserved_sums(&mut self) -> Result<[f64; CONSERVED_SUMS], GravityError> {
        let state = self.state.as_mut().ok_or_else(not_loaded)?;
        self.device.conserved_sums(state).map_err(device_error)
    }

    fn store(&mut self, particles: &mut Particles) -> Result<(), GravityError> {
        let state = self.state.as_ref().ok_or_else(not_loaded)?;
        self.device
            .store_state(state, particles)
            .map_err(device_error)
    }

    fn add_external(&mut self, terms: &[f64], rows: Option<&[u32]>) -> Result<(), GravityError> {
        let state = self.state.as_mut().ok_or_else(not_loaded)?;
        self.device
            .add_external(state, terms, rows)
            .map_err(device_error)
    }

    fn external_energy(&mut self, terms: &[f64]) -> Result<f64, GravityError> {
        let state = self.state.as_mut().ok_or_else(not_loaded)?;
        self.device
            .external_energy(state, terms)
            .map_err(device_error)
    }
}

/// The tree where the device sorted the particles: its cells (`GpuFmm::split_cells`),
/// their moments (`GpuFmm::cell_moments`) and lists (`GpuFmm::walk`) found there.
pub(super) struct OnDevice<'a> {
    pub(super) device: &'a mut GpuFmm,
    pub(super) state: &'a DeviceState,
    /// The cube of the device's sort.
    pub(super) cube: BoundingCube,
    /// The cells on their way from the device to the host's tree.
    pub(super) columns: &'a mut CellColumns,
    /// Set when the device's walk gave up on a step (the host walked).
    pub(super) walk_declined: &'a mut bool,
    /// A block sub-step's active particles (rows of the state), whose cells the device
    /// flags (`DeviceTree::active_cells`).
    pub(super) active: Option<&'a [u32]>,
}

impl DeviceTree for OnDevice<'_> {
    fn cell_moments(&mut self, tree: &Tree, reordered: bool) -> Result<(), GravityError> {
        self.device
            .cell_moments(self.state, tree, reordered)
            .map_err(device_error)
    }

    fn download_moments(
        &mut self,
        out: &mut Vec<[f64; MOMENT_VALUES]>,
    ) -> Result<(), GravityError> {
        self.device.download_moments(out).map_err(device_error)
    }

    fn walk(
        &mut self,
        tree: &Tree,
        mac: Mac,
        caps: &Caps,
        targets: Option<&[bool]>,
    ) -> Result<Option<DeviceLists>, GravityError> {
        let lists = self
            .device
            .walk(tree, mac, caps, targets)
            .map_err(device_error)?;
        *self.walk_declined |= lists.is_none();
        Ok(lists)
    }

    fn split_cells(
        &mut self,
        tree: &mut Tree,
        leaf_size: usize,
        cap: usize,
    ) -> Result<Result<(), CellsOverflow>, GravityError> {
        let split = self
            .device
            .split_cells(self.state, leaf_size, cap, self.columns)
            .map_err(device_error)?;
        if split.is_ok() {
            let n = self.state.particles();
            tree.adopt_cells(self.cube, n, self.columns, leaf_size)?;
        }
        Ok(split)
    }

    fn tree_order(&mut self, out: &mut Vec<u32>) -> Result<(), GravityError> {
        self.device
            .download_order(self.state, out)
            .map_err(device_error)
    }

    fn active_cells(&mut self, tree: &Tree, out: &mut Vec<bool>) -> Result<(), GravityError> {
        let rows = self.active.ok_or_else(|| {
            GravityError::Device("active cells of an evaluation for every particle".into())
        })?;
        self.device
            .cells_holding(self.state, tree, rows, out)
            .map_err(device_error)
    }
}

/// The report of an evaluation without particles.
fn no_work() -> ForceReport {
    let mut stats = FmmStats::default().solver_stats();
    stats.extend(RankStats::alone(0).solver_stats());
    ForceReport {
        pair_interactions: 0,
        seconds: 0.0,
        stats,
    }
}

/// Using the device state before it is loaded (`ResidentState::load`).
pub(super) fn not_loaded() -> GravityError {
    GravityError::Device("the particles were not loaded onto the device".into())
}
