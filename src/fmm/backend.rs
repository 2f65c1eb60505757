//! What a device must do for the FMM (design §7): the interface between the algorithm
//! (`solver`, which builds the tree and the lists on the host) and a back-end that runs the
//! passes elsewhere — `gpu/` on a CUDA device, or the kernels' CPU emulation in tests. A
//! `DevicePlan` goes in (tree, lists, particles as the host left them) and `DeviceForces`
//! come out (`DevicePasses`); for resident particles the device also keys, sorts, splits,
//! computes moments and walks (`DeviceTree`) and runs the passes on its own state
//! (`ResidentPasses`). Nothing here computes: the CPU's own passes are `solver`'s.

use super::caps::Caps;
use super::solver::{Evaluation, FmmSolver};
use super::stats::FmmStats;
use super::traversal::{Mac, span};
use super::tree::{CellsOverflow, MOMENT_VALUES, Tree};
use crate::distributed::comm::Communicator;
use crate::distributed::payload::PayloadRoutes;
use crate::gravity::GravityError;
use crate::gravity::softening::Softening;
use crate::particles::Particles;

/// Where the particles of a tree that holds none of their positions are (`plan_sorted`
/// with `SortedParticles` without them, or `plan_split`: a device that sorted them): it
/// computes the cells' moments there, may walk the tree there too, and for `plan_split`
/// splits the particles into the cells.
pub trait DeviceTree {
    /// Computes the mass, centre and r_max of every cell of `tree` (its cells built, its
    /// `order` final) there, for its `walk` and passes: what `Tree::compute_moments` would
    /// give, bit for bit. `reordered`: the tree's order differs from the one the sorter
    /// handed over (`Tree::adopt_sorted` reordered equal keys), so the particles must first
    /// be put into `tree.order`.
    fn cell_moments(&mut self, tree: &Tree, reordered: bool) -> Result<(), GravityError>;

    /// The moments the last `cell_moments` computed, into `out` in cell order (asked only
    /// when the host needs them: for its own walk, or its own upward pass).
    fn download_moments(&mut self, out: &mut Vec<[f64; MOMENT_VALUES]>)
    -> Result<(), GravityError>;

    /// Walks `tree` (its moments set) with `mac`, every own cell a target or with
    /// `targets` those flagged (`Tree::cells_holding`: the others' lists empty), and keeps
    /// the lists where the tree is (the ones `traversal::walk` makes, for passes run
    /// there); `None` when it does not (the host walks). `caps`: the lists' expected sizes.
    fn walk(
        &mut self,
        _tree: &Tree,
        _mac: Mac,
        _caps: &Caps,
        _targets: Option<&[bool]>,
    ) -> Result<Option<DeviceLists>, GravityError> {
        Ok(None)
    }

    /// Splits the particles it sorted into cells there (at most `leaf_size` a leaf, the
    /// cells of `Tree::build_cells`) and hands them to `tree` (`Tree::adopt_cells`);
    /// `Ok(Err(..))` when they need more than `cap` cells. Asked only by
    /// `FmmSolver::plan_split`.
    fn split_cells(
        &mut self,
        _tree: &mut Tree,
        _leaf_size: usize,
        _cap: usize,
    ) -> Result<Result<(), CellsOverflow>, GravityError> {
        Err(GravityError::Device(
            "this device does not split cells; plan with plan_sorted".into(),
        ))
    }

    /// The tree order of the particles it sorted (tree position → the caller's index) into
    /// `out`: asked by `FmmSolver::plan_split_with`, whose cells came from `split_cells`,
    /// for the work of each particle that balances the ranks (`particle_work`).
    fn tree_order(&mut self, _out: &mut Vec<u32>) -> Result<(), GravityError> {
        Err(GravityError::Device(
            "this device does not hand its tree order over".into(),
        ))
    }

    /// For each cell of `tree` (split there, its moments computed there), whether the
    /// lists are for it: whether it holds one of the particles the caller named to the
    /// device (`Tree::cells_holding`'s flags, found there), into `out`. Asked only by a
    /// partial `FmmSolver::plan_split`.
    fn active_cells(&mut self, _tree: &Tree, _out: &mut Vec<bool>) -> Result<(), GravityError> {
        Err(GravityError::Device(
            "this device does not flag active cells; plan with active particles".into(),
        ))
    }
}

/// The sizes of lists a `DeviceTree` walked and keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceLists {
    /// M2L entries.
    pub m2l: usize,
    /// P2P entries.
    pub p2p: usize,
    /// Particle pairs the P2P entries make (self-pairs of a leaf included).
    pub p2p_interactions: u64,
}

/// What a device needs to run the FMM passes of the last evaluation (design §7: the tree and
/// the lists are built on the host and copied over in one transfer): the sorted particles,
/// the cells, and the M2L and P2P lists as the walk left them. It borrows the solver's own
/// arrays (particles, leaves, lists), so making one copies only the per-cell columns and
/// the leaf of each particle.
#[derive(Debug, Clone)]
pub struct DevicePlan<'a> {
    /// Expansion order.
    pub order: usize,
    /// Particle positions in tree order: the rank's own, then those that came with other
    /// ranks' cells (sources only). Empty when they stay on the device (a plan from
    /// `plan_sorted` without positions).
    pub pos: &'a [[f64; 3]],
    /// Masses in the same order (or none, with `pos`).
    pub mass: &'a [f64],
    /// The rank's own particles (the first of `pos`), which receive forces.
    pub own_particles: usize,
    /// The rank's own cells (the first of the cell arrays); the others came from other
    /// ranks and are sources only.
    pub own_cells: usize,
    /// Every cell's multipole (`(order + 1) (order + 2)` values each) when other ranks' cells
    /// came (a distributed evaluation), whose own cells' the host computed unless
    /// `upward_on_device` (zero placeholders then, as are the other ranks' cells' when the
    /// devices move them); `None`: the device computes them (P2M, M2M).
    pub multipoles: Option<&'a [f64]>,
    /// The device computes the own cells' multipoles (P2M, M2M): always without
    /// `multipoles`, and with them when the host left them to it.
    pub upward_on_device: bool,
    /// Tree order → the caller's index (own particles).
    pub order_of: &'a [u32],
    /// Expansion centre of each cell (own and received); zeros when `moments_on_device`.
    pub centre: Vec<[f64; 3]>,
    /// Set when the cells' moments stayed on the device that computed them and walked the
    /// tree (`DeviceTree::cell_moments`): its centres are the ones to use, `centre` holds
    /// none.
    pub moments_on_device: bool,
    /// First particle of each cell.
    pub begin: Vec<u32>,
    /// One past the last particle of each cell.
    pub end: Vec<u32>,
    /// First child of each cell (children contiguous).
    pub first_child: Vec<u32>,
    /// Children of each cell (0 for a leaf).
    pub child_count: Vec<u32>,
    /// Parent of each cell (the root its own).
    pub parent: Vec<u32>,
    /// Own cells of level l: `level_start[l]..level_start[l + 1]`.
    pub level_start: Vec<u32>,
    /// Own leaf cells, in particle order.
    pub leaves: &'a [u32],
    /// The leaf of each own particle (tree order); empty with `pos` (the device that holds
    /// the particles finds their leaves).
    pub leaf_of: Vec<u32>,
    /// M2L sources of own cell c: `m2l_sources[start..start + len]` with
    /// `(start, len) = unpack(m2l_spans[c])` (the high and low 32 bits). The walk writes each
    /// cell's sources in one piece, wherever its thread found room, so the spans are in no
    /// particular order, while each cell's sources are in increasing index.
    pub m2l_spans: &'a [u64],
    /// See `m2l_spans`: every entry belongs to one cell's span.
    pub m2l_sources: &'a [u32],
    /// P2P source leaves of own leaf c (self included), as `m2l_spans` (indexed by cell).
    pub p2p_spans: &'a [u64],
    /// See `p2p_spans`.
    pub p2p_sources: &'a [u32],
    /// Set when the lists were walked on the device and stay there (`DeviceTree::walk`):
    /// the spans and sources above are then empty.
    pub device_lists: Option<DeviceLists>,
}

impl DevicePlan<'_> {
    /// Particles of the plan, own and received, whether or not their positions are in it.
    pub fn particles(&self) -> usize {
        self.pos.len().max(self.own_particles)
    }

    /// The M2L sources of own cell `c` (lists in the plan: not `device_lists`).
    pub fn m2l_of(&self, c: usize) -> &[u32] {
        span(self.m2l_spans[c], self.m2l_sources)
    }

    /// The P2P source leaves of own leaf `c` (a cell index; lists in the plan).
    pub fn p2p_of(&self, c: usize) -> &[u32] {
        span(self.p2p_spans[c], self.p2p_sources)
    }

    /// Particle pairs the P2P lists make (self-pairs of a leaf included).
    pub fn p2p_interactions(&self) -> u64 {
        if let Some(lists) = self.device_lists {
            return lists.p2p_interactions;
        }
        let count = |c: u32| u64::from(self.end[c as usize] - self.begin[c as usize]);
        self.leaves
            .iter()
            .map(|&leaf| {
                let sources: u64 = self.p2p_of(leaf as usize).iter().map(|&c| count(c)).sum();
                count(leaf) * sources
            })
            .sum()
    }
}

/// Accelerations and potentials of a plan's own particles (tree order, G applied) from
/// passes run on a device, and the seconds of each phase.
#[derive(Debug, Clone, Default)]
pub struct DeviceForces {
    /// Accelerations.
    pub acc: Vec<[f64; 3]>,
    /// Potentials.
    pub pot: Vec<f64>,
    /// Seconds by phase.
    pub seconds: DeviceSeconds,
}

impl DeviceForces {
    /// Writes the forces back in the caller's order (`order_of` of the plan), only for the
    /// particles flagged in `active` when given.
    pub fn write_to(
        &self,
        order_of: &[u32],
        active: Option<&[bool]>,
        acc: &mut [[f64; 3]],
        pot: &mut [f64],
    ) {
        for (sorted, &orig) in order_of.iter().enumerate() {
            let i = orig as usize;
            if active.is_none_or(|a| a[i]) {
                acc[i] = self.acc[sorted];
                pot[i] = self.pot[sorted];
            }
        }
    }
}

/// Seconds of one device evaluation by phase.
#[derive(Debug, Clone, Copy, Default)]
pub struct DeviceSeconds {
    /// Host → device copies.
    pub upload: f64,
    /// P2M and M2M.
    pub upward: f64,
    /// M2L.
    pub m2l: f64,
    /// L2L and L2P.
    pub downward: f64,
    /// P2P.
    pub p2p: f64,
    /// Device → host copies.
    pub download: f64,
}

/// Runs the passes of a `DevicePlan` away from the host's FMM: on a GPU
/// (`gpu::context::GpuFmm`), or in tests under the kernels' CPU emulation.
pub trait DevicePasses: Send {
    /// The forces of `plan`, in buffers sized at least by `caps`.
    fn run_passes(
        &mut self,
        plan: &DevicePlan,
        caps: &Caps,
        softening: Softening,
        g: f64,
    ) -> Result<DeviceForces, GravityError>;

    /// Whether `run_passes_with_payload` moves a distributed evaluation's LET payload
    /// between the ranks' devices.
    fn moves_payload(&self) -> bool {
        false
    }

    /// As `run_passes`, for a plan whose other ranks' multipoles, positions and masses are
    /// placeholders: first this rank's device sends every rank what `routes` says, from
    /// its own cells and particles in the plan, and puts what it receives in its place,
    /// through the devices' own link or `comm` (every rank calls this together).
    fn run_passes_with_payload(
        &mut self,
        _plan: &DevicePlan,
        _caps: &Caps,
        _force: (Softening, f64),
        _routes: &PayloadRoutes,
        _comm: &dyn Communicator,
    ) -> Result<DeviceForces, GravityError> {
        Err(GravityError::Device(
            "this device does not move a LET payload".into(),
        ))
    }

    /// The device as the keeper of its rank's particles between evaluations, when it can be.
    fn resident(&mut self) -> Option<&mut dyn ResidentPasses> {
        None
    }
}

/// A device that keeps one rank's particles between a distributed run's evaluations
/// (design §7): the integrator's operations run there (as `ResidentState`'s); at each
/// evaluation the positions come down for the host's decomposition, tree and walk, the
/// velocities of the particles leaving the rank come down too, the rank's new set is
/// arranged there as `distributed::decomposition::migrate` arranges the host's, and the
/// passes read the positions and masses there and leave the forces there.
pub trait ResidentPasses: Send {
    /// Takes `particles` onto the device (their order is the device's from now on).
    fn load(&mut self, particles: &Particles) -> Result<(), GravityError>;

    /// `v += a h` there.
    fn kick(&mut self, h: f64) -> Result<(), GravityError>;

    /// `x += v h` there.
    fn drift(&mut self, h: f64) -> Result<(), GravityError>;

    /// `v += a h[k]` there for the k-th particle of `rows`, or of all without them.
    fn kick_each(&mut self, rows: Option<&[u32]>, h: &[f64]) -> Result<(), GravityError>;

    /// The accelerations there into `acc`, or with `only` those of the listed particles.
    fn accelerations(
        &mut self,
        acc: &mut [[f64; 3]],
        only: Option<&[u32]>,
    ) -> Result<(), GravityError>;

    /// The largest |a| of each component's particles there.
    fn max_acceleration_by_component(&mut self) -> Result<[f64; 4], GravityError>;

    /// The sums behind the diagnostics' conserved quantities of the particles there.
    fn conserved_sums(
        &mut self,
    ) -> Result<[f64; crate::integrate::diagnostics::CONSERVED_SUMS], GravityError>;

    /// Positions, velocities, accelerations and potentials back into `particles`.
    fn store(&mut self, particles: &mut Particles) -> Result<(), GravityError>;

    /// As `ResidentState::add_external`.
    fn add_external(&mut self, terms: &[f64], rows: Option<&[u32]>) -> Result<(), GravityError>;

    /// As `ResidentState::external_energy`.
    fn external_energy(&mut self, terms: &[f64]) -> Result<f64, GravityError>;

    /// The positions there into `pos`.
    fn positions(&mut self, pos: &mut [[f64; 3]]) -> Result<(), GravityError>;

    /// The velocities of the particles of `rows` into those rows of `vel` (the particles
    /// about to leave the rank; the other rows stay as they were).
    fn velocities(&mut self, rows: &[u32], vel: &mut [[f64; 3]]) -> Result<(), GravityError>;

    /// The rank's new set after `migrate`: the rows not in `leaving` (strictly increasing)
    /// keep their state there, in order, and `particles`' rows after them (the arrivals)
    /// come up with zero accelerations and potentials.
    fn migrate(&mut self, leaving: &[u32], particles: &Particles) -> Result<(), GravityError>;

    /// The rank's tree built where its particles are (`FmmSolver::plan_split_with` on
    /// `solver`, the particles sorted there in `with.cube`), for the passes of the next
    /// `run_passes_resident`; `None` when this device does not build trees or rejects this
    /// one (the host then builds it from the positions).
    fn plan_tree(
        &mut self,
        _solver: &mut FmmSolver,
        _id: &[u64],
        _with: Evaluation,
    ) -> Result<Option<FmmStats>, GravityError> {
        Ok(None)
    }

    /// The passes of `plan` (its own particles those there, gathered into tree order; the
    /// other ranks' from the plan, or moved by the devices with `payload`, as in
    /// `DevicePasses::run_passes_with_payload`), with the forces left there. A plan from
    /// `plan_tree` is the last one this asks for.
    fn run_passes_resident(
        &mut self,
        plan: &DevicePlan,
        caps: &Caps,
        force: (Softening, f64),
        payload: Option<(&PayloadRoutes, &dyn Communicator)>,
    ) -> Result<DeviceSeconds, GravityError>;
}
