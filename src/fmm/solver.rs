//! The FMM force evaluation's orchestration on the CPU: the tree (`tree`), the list-building
//! walk (`traversal`), then the passes (`passes`: P2M … P2P), with capped buffers, selective
//! retries and caps carried between evaluations (and across runs through the presets file).
//! A plan for passes run elsewhere (`plan`: `device_plan`) follows the interface of `backend`;
//! other ranks' trees come in through `remote`; what an evaluation reports is `stats`.

use super::backend::{DeviceLists, DevicePlan, DeviceTree};
use super::caps::{CapKind, CappedBuffer, Caps, CapsPolicy, CapsTracker};
use super::expansion::{Operators, real_len};
use super::morton::BoundingCube;
use super::p2p::{NearField, NearFieldPrecision};
use super::presets::{PresetKey, PresetsStore};
use super::remote::RemoteSource;
use super::stats::FmmStats;
use super::traversal::{Mac, Spans, span, unpack, walk};
use super::tree::{MOMENT_VALUES, NotSorted, SortedParticles, Tree, expected_f32};
use super::unsort;
use crate::gravity::softening::{SPLINE_SUPPORT_PER_EPSILON, Softening, SofteningKernel};
use crate::gravity::{ForceReport, GravityError, GravitySolver, check_finite};
use crate::particles::Particles;
use rayon::prelude::*;
use std::time::Instant;

/// Far pairs under Plummer softening must be at least this many softening lengths apart:
/// the far field is Newtonian, and there the Plummer force differs by 1.5 (ε/r)² ≤ 1.5%.
pub const PLUMMER_FAR_SEPARATION: f64 = 10.0;

/// A far pair under Plummer softening taken as Newtonian is stronger than Plummer's by
/// `(1 + ε²/s²)^(3/2) - 1 ≤ 1.5 ε²/s²` of its force: the error-controlled MAC adds this term
/// (`Mac::bias`) so that an accuracy target holds with that kernel too.
pub const PLUMMER_BIAS: f64 = 1.5;

/// Default relative force error (`gravity.accuracy`, `--accuracy`): every particle's force,
/// the tail included, within it (p99 ≤ 1e-3, max ≤ 1e-2 on the accuracy test set).
pub const DEFAULT_ACCURACY: f64 = 1e-3;
/// FMM expansion order of the opening angle alone (accuracy 0; see docs/config.md for why
/// not 4).
pub const DEFAULT_ORDER: usize = 7;
/// Default FMM opening angle parameter.
pub const DEFAULT_THETA: f64 = 0.75;
/// Default FMM leaf size.
pub const DEFAULT_LEAF_SIZE: usize = 128;

/// Retries before an evaluation gives up (each grows a cap by at least the growth factor).
const MAX_RETRIES: usize = 200;

/// Settings of an FMM solver.
#[derive(Debug, Clone, PartialEq)]
pub struct FmmSettings {
    /// Expansion order p (1..=12).
    pub order: usize,
    /// Opening angle parameter θ of the MAC (with `accuracy`, the largest it accepts).
    pub theta: f64,
    /// Relative force error the MAC aims for (`Mac::tolerance`); 0 for the geometric MAC
    /// alone.
    pub accuracy: f64,
    /// Most particles in a leaf.
    pub leaf_size: usize,
    /// Softening of the near field (and the far-pair separation it implies).
    pub softening: Softening,
    /// Gravitational constant.
    pub g: f64,
    /// Near-field precision.
    pub near_field: NearFieldPrecision,
    /// How caps adapt.
    pub caps_policy: CapsPolicy,
}

impl FmmSettings {
    /// The config's defaults (the accuracy target `DEFAULT_ACCURACY` and its order, θ, leaf
    /// size, the mixed-precision near field, default caps policy) for `softening` and `g`.
    pub fn defaults(softening: Softening, g: f64) -> Self {
        FmmSettings {
            accuracy: DEFAULT_ACCURACY,
            order: default_order(DEFAULT_ACCURACY),
            ..Self::geometric(softening, g)
        }
    }

    /// `defaults` with the opening angle alone deciding (accuracy 0, order `DEFAULT_ORDER`):
    /// what the GPU backend's walk does.
    pub fn geometric(softening: Softening, g: f64) -> Self {
        FmmSettings {
            order: DEFAULT_ORDER,
            theta: DEFAULT_THETA,
            accuracy: 0.0,
            leaf_size: DEFAULT_LEAF_SIZE,
            softening,
            g,
            near_field: NearFieldPrecision::Mixed,
            caps_policy: CapsPolicy::default(),
        }
    }

    /// The acceptance criterion these settings imply.
    pub fn mac(&self) -> Mac {
        let eps = self.softening.epsilon;
        let support = match self.softening.kernel {
            SofteningKernel::Spline => SPLINE_SUPPORT_PER_EPSILON * eps,
            SofteningKernel::Plummer => PLUMMER_FAR_SEPARATION * eps,
        };
        Mac {
            theta: self.theta,
            support,
            order: self.order as u32,
            tolerance: self.accuracy * bound_slack(self.order) / self.g,
            total_mass: 1.0,
            g_total: self.g,
            bias: match self.softening.kernel {
                SofteningKernel::Plummer if self.accuracy > 0.0 => PLUMMER_BIAS * eps * eps,
                _ => 0.0,
            },
        }
    }
}

/// How far the MAC's error bound may exceed the accuracy asked for (`Mac::tolerance`) at
/// expansion order `p`: the mass bound overstates a populated cell's high multipoles, the
/// more so the higher the order, so the bound is pessimistic by more than this on every
/// distribution of the accuracy test set and the errors still come out within the accuracy
/// (3 at p = 7 and 10 at p = 12 hold it down to accuracy 1e-5; docs/config.md, "Accuracy target").
pub fn bound_slack(p: usize) -> f64 {
    3.0 * 1.27f64.powi(p as i32 - 7)
}

/// The expansion order an accuracy target uses unless one is given: higher orders let the
/// error-controlled MAC accept more pairs, and 9, the highest whose M2L is straight-line
/// code (`expansion::STRAIGHT_LINE_ORDER`), costs least: at 1e6 1.95 s against 3.13 s at
/// 12 (12 was the cheapest while every order went through the sparse rows), on the test
/// set at 1e5 0.18–0.57 s against 0.29–0.53 s (docs/benchmarks.md).
pub const ACCURATE_ORDER: usize = 9;

/// The default expansion order for `accuracy` (0: the geometric MAC).
pub fn default_order(accuracy: f64) -> usize {
    if accuracy > 0.0 {
        ACCURATE_ORDER
    } else {
        DEFAULT_ORDER
    }
}

/// Cost of one M2L in units of one particle–particle interaction (measured: ~100 ns vs
/// ~0.35 ns per interaction at p = 7 on this CPU), for the load balance.
const M2L_COST: f64 = 250.0;

/// Gives up on buffers that keep overflowing (a growth factor barely above 1).
fn check_retries(stats: &FmmStats) -> Result<(), GravityError> {
    if stats.retries > MAX_RETRIES {
        return Err(GravityError::CapsDiverged {
            retries: stats.retries,
        });
    }
    Ok(())
}

/// Each own cell's sources from the walk: those of target `t` are
/// `sources[start..start + len]` with `(start, len) = unpack(spans[t])`, in increasing
/// cell index. The sources vector is the capped buffer's own memory, lent out between traversal
/// and the next evaluation.
#[derive(Debug, Default)]
pub(super) struct PairList {
    pub(super) sources: Vec<u32>,
    pub(super) spans: Spans,
}

impl PairList {
    pub(super) fn of(&self, target: usize) -> impl ExactSizeIterator<Item = u32> + Clone + '_ {
        span(self.spans[target], &self.sources).iter().copied()
    }

    pub(super) fn len_of(&self, target: usize) -> usize {
        unpack(self.spans[target]).1 as usize
    }
}

/// Where an evaluation's tree gets its particles.
enum TreeInput<'a> {
    /// Positions and masses in the caller's order, keyed and sorted by the tree.
    Unsorted {
        pos: &'a [[f64; 3]],
        mass: &'a [f64],
    },
    /// Keyed and sorted already (on a device); the tree takes the buffers, and the
    /// moments (and the lists, if it walks) come from `device` when given.
    Sorted {
        sorted: &'a mut SortedParticles,
        device: Option<&'a mut dyn DeviceTree>,
    },
    /// Sorted and split into cells on `device`, which keeps the particles and hands over
    /// the cells, computes their moments and may walk; with `partial`, it also flags the
    /// cells the lists are for (`DeviceTree::active_cells`).
    Split {
        device: &'a mut dyn DeviceTree,
        partial: bool,
    },
    /// The tree and multipoles of the last evaluation, of the same particles on this rank
    /// alone (`evaluate_twice`'s second pass); `sorted`: `Evaluation::expected_accel` is
    /// in tree order.
    Kept { sorted: bool },
}

/// How one evaluation differs from the plain single-rank one (`Default`).
#[derive(Default)]
pub struct Evaluation<'a, 'r> {
    /// Every particle's own softening length (a pair uses the larger of its two);
    /// `settings.softening.epsilon` must then be the largest (it sets the far pairs'
    /// minimum separation).
    pub eps: Option<&'a [f64]>,
    /// The global cube of a distributed run, in which the keys are taken.
    pub cube: Option<BoundingCube>,
    /// The other ranks' particles (their locally essential trees), brought in after the
    /// local upward pass.
    pub remote: Option<&'r mut dyn RemoteSource>,
    /// Forces only for the flagged particles (block time steps); the others' values are
    /// left as they are.
    pub active: Option<&'a [bool]>,
    /// The magnitude of each particle's acceleration as expected (the last evaluation's),
    /// which the error-controlled MAC (`FmmSettings::accuracy`) holds the errors to a
    /// fraction of. Without it, an evaluation with `accuracy` first evaluates with the
    /// geometric MAC alone to find it.
    pub expected_accel: Option<&'a [f32]>,
    /// The total mass of every rank's particles (the accuracy's allowance is shared by mass,
    /// `Mac`); this rank's own when not given.
    pub total_mass: Option<f64>,
    /// Sum the forces in the caller's arrays, in tree order, and put them in the caller's
    /// order in place, instead of through the solver's own arrays: 32 bytes a particle less
    /// at the peak (`leapfmm forces` at 1e7: 234 → 194), but the permutation's cycles are
    /// walked one dependent load at a time (~2 s at 1e7 against the copy's 0.5 s; the same
    /// at 1e6). Not with `active`.
    pub in_place: bool,
}

/// A reusable FMM solver: buffers and caps persist between evaluations.
#[derive(Debug)]
pub struct FmmSolver {
    pub(super) settings: FmmSettings,
    pub(super) ops: Operators,
    pub(super) near: NearField,
    pub(super) tracker: CapsTracker,
    pub(super) caps_known: bool,
    pub(super) presets: Option<PresetsStore>,
    pub(super) saved_caps: Option<Caps>,
    pub(super) ranks: u32,
    /// Which own cells hold particles that receive forces in this evaluation (empty: all).
    pub(super) targets: Vec<bool>,
    /// The backend that runs the passes (part of the caps presets key).
    pub(super) backend: &'static str,
    pub(super) warnings: Vec<String>,
    pub(super) tree: Tree,
    pub(super) multipoles: Vec<f64>,
    /// Whether the last evaluation or plan computed the own cells' multipoles here.
    pub(super) upward_on_host: bool,
    /// The local expansions of `internal`'s cells (a leaf's lives only in `leaf_pass`).
    pub(super) locals: Vec<f64>,
    /// The own cells that have children, in cell order.
    pub(super) internal: Vec<u32>,
    /// Each own cell's index in `internal` (`u32::MAX` for a leaf).
    pub(super) local_slot: Vec<u32>,
    pub(super) m2l_buf: CappedBuffer,
    pub(super) p2p_buf: CappedBuffer,
    pub(super) m2l: PairList,
    pub(super) p2p: PairList,
    pub(super) acc: Vec<[f64; 3]>,
    pub(super) pot: Vec<f64>,
    /// One bit a particle: the scratch of `unsort`'s permutation check and in-place move.
    visited: Vec<u64>,
    /// The cells' moments from a `DeviceTree`, kept between evaluations.
    pub(super) moments_scratch: Vec<[f64; MOMENT_VALUES]>,
    /// The last evaluation's lists when a `DeviceTree` walked and keeps them (`m2l` and
    /// `p2p` are then empty).
    pub(super) device_lists: Option<DeviceLists>,
    /// Set when the last plan's cell moments stayed with its `DeviceTree` (which walked):
    /// the tree's cells here hold none.
    pub(super) moments_on_device: bool,
    /// The own particles' positions are placeholders: a device holds them and found their
    /// leaves (`plan_split_with`), so `device_plan` lists none.
    pub(super) own_on_device: bool,
}

impl FmmSolver {
    /// A solver with the given settings; `presets` names a caps presets file to start from
    /// and to record converged caps in.
    pub fn new(settings: FmmSettings, presets: Option<PresetsStore>) -> Self {
        let ops = Operators::new(settings.order);
        let near = NearField::new(settings.near_field, settings.g, settings.softening);
        let tracker = CapsTracker::new(Caps::guess(0, settings.leaf_size), settings.caps_policy);
        FmmSolver {
            settings,
            ops,
            near,
            tracker,
            caps_known: false,
            presets,
            saved_caps: None,
            ranks: 1,
            targets: Vec::new(),
            backend: "cpu",
            warnings: Vec::new(),
            tree: Tree::default(),
            multipoles: Vec::new(),
            upward_on_host: false,
            locals: Vec::new(),
            internal: Vec::new(),
            local_slot: Vec::new(),
            m2l_buf: CappedBuffer::default(),
            p2p_buf: CappedBuffer::default(),
            m2l: PairList::default(),
            p2p: PairList::default(),
            acc: Vec::new(),
            pot: Vec::new(),
            visited: Vec::new(),
            moments_scratch: Vec::new(),
            device_lists: None,
            moments_on_device: false,
            own_on_device: false,
        }
    }

    /// Marks the solver as one of `ranks` ranks (the caps presets are keyed by it).
    pub fn with_ranks(mut self, ranks: usize) -> Self {
        self.ranks = ranks as u32;
        self
    }

    /// Raises every cap to at least `floor` (see `CapsTracker::raise_to`).
    pub fn raise_caps(&mut self, floor: &Caps) {
        self.tracker.raise_to(floor);
    }

    /// The solver's settings.
    pub fn settings(&self) -> &FmmSettings {
        &self.settings
    }

    /// The tree of the last evaluation (for tests and diagnostics).
    pub fn tree(&self) -> &Tree {
        &self.tree
    }

    /// The M2L list of the last evaluation as (target, source) cell pairs.
    pub fn m2l_pairs(&self) -> Vec<(u32, u32)> {
        (0..self.tree.cells.len())
            .flat_map(|t| self.m2l.of(t).map(move |s| (t as u32, s)))
            .collect()
    }

    /// Marks the passes as run by `backend` ("cuda"): its caps presets are kept apart.
    pub fn with_backend(mut self, backend: &'static str) -> Self {
        self.backend = backend;
        self
    }

    /// The caps presets key of this solver for `n` particles per rank.
    pub fn preset_key(&self, n: usize) -> PresetKey {
        PresetKey {
            particles_per_rank: n as u64,
            ranks: self.ranks,
            leaf_size: self.settings.leaf_size as u32,
            order: self.settings.order as u32,
            theta: self.settings.theta,
            backend: self.backend.into(),
        }
    }

    /// Accelerations and potentials of every particle (written, not added, into `acc` and
    /// `pot`). The result depends only on the particle set, not on its order or the number
    /// of threads.
    pub fn evaluate(
        &mut self,
        pos: &[[f64; 3]],
        mass: &[f64],
        id: &[u64],
        acc: &mut [[f64; 3]],
        pot: &mut [f64],
    ) -> Result<FmmStats, GravityError> {
        self.evaluate_with(pos, mass, id, Evaluation::default(), acc, pot)
    }

    /// `evaluate` with the options of `with` (a rank of a distributed run, per-particle
    /// softening, forces for some particles only; see `Evaluation`).
    pub fn evaluate_with(
        &mut self,
        pos: &[[f64; 3]],
        mass: &[f64],
        id: &[u64],
        with: Evaluation,
        acc: &mut [[f64; 3]],
        pot: &mut [f64],
    ) -> Result<FmmStats, GravityError> {
        if self.settings.accuracy > 0.0 && with.expected_accel.is_none() {
            return self.evaluate_twice(pos, mass, id, with, acc, pot);
        }
        let input = TreeInput::Unsorted { pos, mass };
        self.evaluate_from(input, id, with, acc, pot, false)
    }

    /// One evaluation with the tree from `input` (`evaluate_with`'s body); with
    /// `tree_order`, for every particle, the sums are left in the caller's arrays in tree
    /// order (`evaluate_twice`'s first pass, whose sums only set the second's thresholds).
    fn evaluate_from(
        &mut self,
        input: TreeInput,
        id: &[u64],
        with: Evaluation,
        acc: &mut [[f64; 3]],
        pot: &mut [f64],
        tree_order: bool,
    ) -> Result<FmmStats, GravityError> {
        let n = id.len();
        let mut stats = FmmStats::default();
        let active = with.active;
        let in_place = (with.in_place || tree_order) && active.is_none();
        self.build_lists(input, id, with, true, &mut stats)?;
        let len = real_len(self.settings.order);
        let t0 = Instant::now();
        self.m2l_pass(len);
        let m2l_seconds = t0.elapsed().as_secs_f64();
        let t0 = Instant::now();
        self.l2l_pass(len);
        let l2l_seconds = t0.elapsed().as_secs_f64();
        // The sums in tree order: in the caller's arrays (`Evaluation::in_place`) or in the
        // solver's, copied to the caller's particles after (only the active ones' with
        // block steps: the others' values stay).
        let (mut own_acc, mut own_pot) =
            (std::mem::take(&mut self.acc), std::mem::take(&mut self.pot));
        let (out_acc, out_pot): (&mut [[f64; 3]], &mut [f64]) = if in_place {
            (&mut *acc, &mut *pot)
        } else {
            own_acc.resize(n, [0.0; 3]);
            own_pot.resize(n, 0.0);
            (&mut own_acc, &mut own_pot)
        };
        out_acc.fill([0.0; 3]);
        out_pot.fill(0.0);
        let t0 = Instant::now();
        let [m2l_share, down_share] = self.leaf_pass(len, out_acc, out_pot);
        // The leaves' M2L and L2P run together: their wall time is split as the threads'.
        let leaves = t0.elapsed().as_secs_f64();
        let m2l_part = leaves * m2l_share / (m2l_share + down_share).max(f64::MIN_POSITIVE);
        stats.seconds.m2l = m2l_seconds + m2l_part;
        stats.seconds.downward = l2l_seconds + leaves - m2l_part;
        let t0 = Instant::now();
        stats.p2p_interactions = self.p2p_pass(out_acc, out_pot);
        stats.seconds.p2p = t0.elapsed().as_secs_f64();
        if tree_order && in_place {
            // Left in tree order.
        } else if let Some(active) = active {
            for (sorted, &orig) in self.tree.order.iter().enumerate() {
                if active[orig as usize] {
                    acc[orig as usize] = own_acc[sorted];
                    pot[orig as usize] = own_pot[sorted];
                }
            }
        } else if self.tree.order.len() != n
            || !unsort::is_permutation(&self.tree.order, &mut self.visited)
        {
            // The parallel moves below write disjoint slots only for a permutation.
            return Err(GravityError::NotSorted(NotSorted(
                "a tree order that is not a permutation of the particles",
            )));
        } else if in_place {
            // The multipoles are not read again before the next upward pass rebuilds them:
            // their memory serves as the scratch, so the peak stays where the passes put it.
            if self.multipoles.len() >= n {
                unsort::unsort_through(acc, pot, &self.tree.order, &mut self.multipoles);
                self.multipoles.clear();
            } else {
                unsort::unsort_in_place(acc, pot, &self.tree.order, &mut self.visited);
            }
        } else {
            unsort::unsort_into(&own_acc, &own_pot, &self.tree.order, acc, pot);
        }
        (self.acc, self.pot) = (own_acc, own_pot);
        // An evaluation for some particles (block time steps) needs less than a full one: the
        // caps stay sized for the full evaluations around it instead of shrinking and then
        // overflowing there.
        if active.is_none() {
            self.tracker.settle(&stats.used);
            self.record_presets(n);
        }
        Ok(stats)
    }

    /// An evaluation with the error-controlled MAC where no accelerations are expected yet:
    /// one with the geometric MAC alone (its tail may be tens of per cent off, which moves
    /// the criterion's thresholds by as much: within the slack `bound_slack` leaves), then
    /// the real one. Its statistics add both.
    fn evaluate_twice(
        &mut self,
        pos: &[[f64; 3]],
        mass: &[f64],
        id: &[u64],
        with: Evaluation,
        acc: &mut [[f64; 3]],
        pot: &mut [f64],
    ) -> Result<FmmStats, GravityError> {
        let mut with = with;
        // The same particles give the same tree and multipoles: the second pass keeps
        // them, unless other ranks' cells were appended to them. For every particle, the
        // first pass's sums can then stay in tree order: they only set the thresholds.
        let keep = with.remote.is_none();
        let sorted = keep && with.active.is_none();
        let accuracy = std::mem::replace(&mut self.settings.accuracy, 0.0);
        let first_with = Evaluation {
            eps: with.eps,
            cube: with.cube,
            remote: with
                .remote
                .as_mut()
                .map(|r| &mut **r as &mut dyn RemoteSource),
            active: with.active,
            in_place: with.in_place,
            ..Evaluation::default()
        };
        let input = TreeInput::Unsorted { pos, mass };
        let first = self.evaluate_from(input, id, first_with, acc, pot, sorted);
        self.settings.accuracy = accuracy;
        let first = first?;
        let expected = expected_accelerations(acc);
        let input = if keep {
            TreeInput::Kept { sorted }
        } else {
            TreeInput::Unsorted { pos, mass }
        };
        let with = Evaluation {
            eps: with.eps,
            cube: with.cube,
            remote: with.remote,
            active: with.active,
            expected_accel: Some(&expected),
            total_mass: with.total_mass,
            in_place: with.in_place,
        };
        let mut stats = self.evaluate_from(input, id, with, acc, pot, false)?;
        stats.add_first_pass(&first);
        Ok(stats)
    }

    /// The tree and interaction lists of one rank's particles, for a device to run the
    /// passes on (`DevicePlan`): `evaluate`'s tree build and walk without the passes (and
    /// without the host's multipoles). One softening length for all particles.
    pub fn plan(
        &mut self,
        pos: &[[f64; 3]],
        mass: &[f64],
        id: &[u64],
    ) -> Result<(DevicePlan<'_>, FmmStats), GravityError> {
        let stats = self.plan_with(pos, mass, id, Evaluation::default())?;
        Ok((self.device_plan()?, stats))
    }

    /// `plan` with the options of `with`, leaving the plan in the solver for `device_plan`
    /// (a shared borrow, so the caller can read the caps and settings alongside the plan).
    /// On a rank of a distributed evaluation (`with.remote`) the host computes
    /// the multipoles, which the exchange needs anyway, and they travel in the plan with the
    /// other ranks' cells and particles; unless the devices move the exchange's payload
    /// (`RemoteSource::payload_on_device`): then each device computes its own and the plan
    /// holds placeholders.
    pub fn plan_with(
        &mut self,
        pos: &[[f64; 3]],
        mass: &[f64],
        id: &[u64],
        with: Evaluation,
    ) -> Result<FmmStats, GravityError> {
        let mut stats = FmmStats::default();
        // The exchange needs the own multipoles, unless the devices compute them and move
        // them between themselves.
        let host_upward = with.remote.as_ref().is_some_and(|r| !r.payload_on_device());
        let some = with.active.is_some();
        let input = TreeInput::Unsorted { pos, mass };
        self.build_lists(input, id, with, host_upward, &mut stats)?;
        if !some {
            self.tracker.settle(&stats.used);
            self.record_presets(pos.len());
        }
        Ok(stats)
    }

    /// `plan` for the particles of one rank that a device has keyed and sorted already
    /// (`sorted`, which gets this solver's previous buffers back to fill next time): the
    /// host only splits the cells and walks, or, given the `device` that holds the
    /// particles (needed when `sorted` has no positions), takes the cells' moments from it
    /// and lets it walk. The same tree, lists and plan as `plan` on the same particles.
    /// With `active` (the caller's order, as `id`), the lists only for the cells holding
    /// those particles.
    pub fn plan_sorted(
        &mut self,
        sorted: &mut SortedParticles,
        id: &[u64],
        device: Option<&mut dyn DeviceTree>,
        active: Option<&[bool]>,
    ) -> Result<FmmStats, GravityError> {
        if sorted.pos.is_empty() && !sorted.keys.is_empty() && device.is_none() {
            return Err(GravityError::NotSorted(NotSorted(
                "no positions and nothing to compute the moments from",
            )));
        }
        // A shorter borrow of the device, as long as the one of `sorted`.
        let device = device.map(|d| d as &mut dyn DeviceTree);
        self.plan_from(TreeInput::Sorted { sorted, device }, id, active)
    }

    /// As `plan_sorted`, for particles that `device` sorted and splits into cells itself:
    /// only the cells come here (`DeviceTree::split_cells`). With `partial`, the lists only
    /// for the cells the device flags (`DeviceTree::active_cells`: those holding a block
    /// sub-step's active particles).
    pub fn plan_split(
        &mut self,
        id: &[u64],
        device: &mut dyn DeviceTree,
        partial: bool,
    ) -> Result<FmmStats, GravityError> {
        self.plan_from(TreeInput::Split { device, partial }, id, None)
    }

    /// `plan_split` on a rank of a distributed evaluation (`with.remote`, whose payload the
    /// devices move; every particle a target): the cells split where `device` sorted the
    /// rank's particles in `with.cube`, their moments found there and brought here for the
    /// exchange, the other ranks' cells imported and the lists walked here. The own
    /// particles' positions and masses stay on the device (zero placeholders here, as the
    /// other ranks' are); the tree order comes here for `particle_work`. The same tree,
    /// lists and plan as `plan_with` on the same particles.
    pub fn plan_split_with(
        &mut self,
        id: &[u64],
        device: &mut dyn DeviceTree,
        with: Evaluation,
    ) -> Result<FmmStats, GravityError> {
        if with.active.is_some()
            || with.eps.is_some()
            || with.cube.is_none()
            || !with.remote.as_ref().is_some_and(|r| r.payload_on_device())
        {
            return Err(GravityError::Device(
                "a device's tree for another rank's exchange needs the cube, every particle, one softening length and the payload on the devices".into(),
            ));
        }
        let mut stats = FmmStats::default();
        let input = TreeInput::Split {
            device,
            partial: false,
        };
        self.build_lists(input, id, with, false, &mut stats)?;
        self.tracker.settle(&stats.used);
        self.record_presets(id.len());
        Ok(stats)
    }

    /// The tree and lists from `input` (sorted elsewhere), for the cells holding `active`
    /// particles when given (or flagged by a partial split's device); the caps and presets
    /// learn only from full evaluations (a partial one's needs say nothing of a full
    /// one's, as in `plan_with`).
    fn plan_from(
        &mut self,
        input: TreeInput,
        id: &[u64],
        active: Option<&[bool]>,
    ) -> Result<FmmStats, GravityError> {
        let mut stats = FmmStats::default();
        let partial = active.is_some() || matches!(input, TreeInput::Split { partial: true, .. });
        let with = Evaluation {
            active,
            ..Evaluation::default()
        };
        self.build_lists(input, id, with, false, &mut stats)?;
        if !partial {
            self.tracker.settle(&stats.used);
            self.record_presets(id.len());
        }
        Ok(stats)
    }

    /// The cells' moments `device` computed for the tree, set on the tree here.
    fn fetch_moments(&mut self, device: &mut dyn DeviceTree) -> Result<(), GravityError> {
        let mut moments = std::mem::take(&mut self.moments_scratch);
        let fetched = device.download_moments(&mut moments);
        let set = fetched.and_then(|()| {
            self.tree
                .set_moments(&moments)
                .map_err(|e| GravityError::Device(e.to_string()))
        });
        self.moments_scratch = moments;
        set?;
        self.moments_on_device = false;
        Ok(())
    }

    /// Builds the tree (with multipoles when `host_upward`, which an exchange with other
    /// ranks needs), imports the other ranks' trees from `with.remote`, and walks the lists
    /// for the cells holding `with.active` particles, growing the caps and retrying until
    /// everything fits.
    fn build_lists(
        &mut self,
        input: TreeInput,
        id: &[u64],
        with: Evaluation,
        host_upward: bool,
        stats: &mut FmmStats,
    ) -> Result<(), GravityError> {
        let Evaluation {
            eps,
            cube,
            remote,
            active,
            expected_accel,
            total_mass,
            in_place: _,
        } = with;
        let n = id.len();
        if !self.caps_known {
            self.start_caps(n);
        }
        let mut mac = self.settings.mac();
        let len = real_len(self.settings.order);
        // The lists of the previous evaluation lend their memory back to the buffers.
        self.m2l_buf
            .give_back(std::mem::take(&mut self.m2l.sources));
        self.p2p_buf
            .give_back(std::mem::take(&mut self.p2p.sources));
        // Particles sorted elsewhere are taken once; a retry for more cells only splits again.
        let (kept, expected_sorted) = match input {
            TreeInput::Kept { sorted } => (true, sorted),
            _ => (false, false),
        };
        let t0 = Instant::now();
        let (unsorted, mut device_tree, reordered, split_there, flagged_there) = match input {
            TreeInput::Unsorted { pos, mass } => (Some((pos, mass)), None, false, false, false),
            TreeInput::Sorted { sorted, device } => {
                let reordered = self.tree.adopt_sorted(sorted, id)?;
                (None, device, reordered, false, false)
            }
            TreeInput::Split { device, partial } => (None, Some(device), false, true, partial),
            TreeInput::Kept { .. } => (None, None, false, false, false),
        };
        stats.seconds.tree += t0.elapsed().as_secs_f64();
        if !kept {
            loop {
                let t0 = Instant::now();
                let (leaf_size, cap) = (self.settings.leaf_size, self.tracker.caps().cells);
                let built = match (unsorted, device_tree.as_mut()) {
                    (Some((pos, mass)), _) => self.tree.build(pos, mass, id, cube, leaf_size, cap),
                    (None, Some(device)) if split_there => {
                        let split = device.split_cells(&mut self.tree, leaf_size, cap)?;
                        if split.is_ok() && self.tree.own_particles != n {
                            return Err(GravityError::NotSorted(NotSorted(
                                "cells of another number of particles",
                            )));
                        }
                        split
                    }
                    (None, _) => self.tree.build_cells(leaf_size, cap),
                };
                stats.seconds.tree += t0.elapsed().as_secs_f64();
                match built {
                    Ok(()) => break,
                    Err(over) => {
                        stats.retries += 1;
                        stats.overflows[CapKind::Cells as usize] += 1;
                        self.tracker.grow(CapKind::Cells, over.needed);
                        check_retries(stats)?;
                    }
                }
            }
        }
        self.own_on_device = split_there && remote.is_some();
        if self.own_on_device {
            // Other ranks' cells follow the own ones, and their particles the own ones'
            // (placeholders, like theirs: the devices move the payload); the order comes
            // from the device.
            if let Some(device) = device_tree.as_mut() {
                device.tree_order(&mut self.tree.order)?;
            }
            if self.tree.order.len() != n {
                return Err(GravityError::NotSorted(NotSorted(
                    "a device's tree order of another number of particles",
                )));
            }
            self.tree.hold_placeholders();
        }
        self.tree.eps.clear();
        if let Some(eps) = eps {
            let order = &self.tree.order;
            self.tree.eps.extend(order.iter().map(|&i| eps[i as usize]));
        }
        self.targets.clear();
        if let Some(active) = active {
            if self.tree.order.len() != n || active.len() != n {
                return Err(GravityError::NotSorted(NotSorted(
                    "no tree order to find the active particles' cells in",
                )));
            }
            self.targets = self.tree.cells_holding(active);
        }
        let t0 = Instant::now();
        // Moments a device computed come here only when the host needs them: for its own
        // upward pass or walk, or an exchange with other ranks.
        self.moments_on_device = false;
        if n > 0 {
            match device_tree.as_mut() {
                Some(device) => {
                    device.cell_moments(&self.tree, reordered)?;
                    self.moments_on_device = true;
                    if flagged_there {
                        device.active_cells(&self.tree, &mut self.targets)?;
                    }
                    if host_upward || remote.is_some() {
                        self.fetch_moments(&mut **device)?;
                    }
                }
                None if kept => {}
                None => self.tree.compute_moments(),
            }
        }
        if mac.tolerance > 0.0 {
            // The device walk (kernels/walk.cu) does not test the error yet, and a device
            // that sorts keeps the accelerations to expect.
            if device_tree.is_some() {
                return Err(GravityError::AccuracyUnsupported(
                    "runs on the CPU only, for now (not with the GPU backend)",
                ));
            }
            let expected = expected_accel
                .filter(|e| e.len() == n && self.tree.order.len() == n)
                .ok_or(GravityError::AccuracyUnsupported(
                    "needs the accelerations to expect, one per particle",
                ))?;
            if expected_sorted {
                self.tree.set_expected_accel_sorted(expected);
            } else {
                self.tree.set_expected_accel(expected);
            }
            // The share of the allowance of each source is its share of the total mass.
            let total = total_mass.or_else(|| self.tree.cells.first().map(|root| root.mass));
            if let Some(total) = total.filter(|&m| m > 0.0) {
                mac.tolerance /= total;
                mac.total_mass = total;
                mac.g_total = self.settings.g * total;
            }
        }
        if remote.as_ref().is_some_and(|r| r.quantises_positions()) {
            self.tree.quantise_own_positions();
        }
        if kept {
            // The kept tree's multipoles hold (the pass that built it computed them here).
        } else if host_upward {
            self.upward(len);
        } else if remote.is_some() {
            // Placeholders for the own cells, which the other ranks' cells follow.
            self.multipoles.clear();
            self.multipoles.resize(self.tree.cells.len() * len, 0.0);
        }
        self.upward_on_host = host_upward;
        stats.seconds.upward += t0.elapsed().as_secs_f64();

        let mut remote_roots = Vec::new();
        if let Some(source) = remote {
            let t0 = Instant::now();
            let placeholders = source.payload_on_device();
            for r in source.remote_trees(
                &self.tree,
                &self.multipoles,
                len,
                mac,
                &mut self.tracker,
                stats,
            )? {
                if r.cells.is_empty() {
                    continue;
                }
                let root = self.tree.append_remote(&r.cells, &r.pos, &r.mass, &r.eps);
                self.multipoles.extend_from_slice(&r.multipoles);
                if !placeholders {
                    self.rebuild_remote_multipoles(root as usize, r.cells.len(), len);
                }
                remote_roots.push(root);
            }
            stats.seconds.exchange = t0.elapsed().as_secs_f64();
        }

        self.device_lists = None;
        let cells = self.tree.own_cells;
        let own_tree = remote_roots.is_empty() && n > 0;
        if let (Some(device), true) = (device_tree.as_mut(), own_tree) {
            let t0 = Instant::now();
            let caps = self.tracker.caps();
            let targets = (!self.targets.is_empty()).then_some(self.targets.as_slice());
            let lists = device.walk(&self.tree, mac, &caps, targets)?;
            stats.seconds.traversal += t0.elapsed().as_secs_f64();
            if let Some(lists) = lists {
                self.device_lists = Some(lists);
                self.m2l = PairList::default();
                self.p2p = PairList::default();
                stats.caps = caps;
                stats.cells = cells;
                stats.remote_cells = 0;
                stats.remote_m2l = 0;
                stats.used = Caps {
                    cells,
                    m2l_pairs: lists.m2l,
                    p2p_pairs: lists.p2p,
                    ..stats.used
                };
                return Ok(());
            }
        }
        if let (Some(device), true) = (device_tree.as_mut(), self.moments_on_device) {
            self.fetch_moments(&mut **device)?;
        }
        let walked = loop {
            let caps = self.tracker.caps();
            let t0 = Instant::now();
            self.m2l_buf.reset(caps.m2l_pairs);
            self.p2p_buf.reset(caps.p2p_pairs);
            let targets = (!self.targets.is_empty()).then_some(self.targets.as_slice());
            let (m2l, p2p) = (&self.m2l_buf, &self.p2p_buf);
            let walked = walk(&self.tree, targets, mac, &remote_roots, m2l, p2p);
            if !walked.complete {
                return Err(GravityError::Communication(
                    "a locally essential tree from another rank lacks cells that this rank's walk needs; the exchange is inconsistent".into(),
                ));
            }
            stats.seconds.traversal += t0.elapsed().as_secs_f64();
            let over = [
                (CapKind::M2lPairs, &self.m2l_buf),
                (CapKind::P2pPairs, &self.p2p_buf),
            ]
            .into_iter()
            .filter(|(_, b)| b.overflowed())
            .map(|(k, b)| (k, b.needed()))
            .collect::<Vec<_>>();
            if over.is_empty() {
                stats.caps = caps;
                break walked;
            }
            stats.retries += 1;
            for (kind, needed) in over {
                stats.overflows[kind as usize] += 1;
                self.tracker.grow(kind, needed);
            }
            check_retries(stats)?;
        };
        stats.cells = cells;
        stats.remote_cells = self.tree.cells.len() - cells;
        stats.remote_m2l = 0;
        stats.used = Caps {
            cells,
            m2l_pairs: self.m2l_buf.needed(),
            p2p_pairs: self.p2p_buf.needed(),
            ..stats.used
        };
        let t0 = Instant::now();
        self.m2l = PairList {
            sources: self.m2l_buf.take(),
            spans: walked.m2l,
        };
        self.p2p = PairList {
            sources: self.p2p_buf.take(),
            spans: walked.p2p,
        };
        // A pass over every entry: only when there are other ranks' cells to count.
        stats.remote_m2l = if stats.remote_cells == 0 {
            0
        } else {
            self.m2l
                .sources
                .par_iter()
                .filter(|&&s| s as usize >= cells)
                .count()
        };
        stats.seconds.traversal += t0.elapsed().as_secs_f64();
        Ok(())
    }

    /// The cost of each particle in the last evaluation, in the caller's order: its leaf's
    /// particle interactions and `M2L_COST` per M2L of its leaf and of every ancestor (shared
    /// by the ancestor's particles), divided among the leaf's particles. Deterministic, so a
    /// decomposition balanced on it does not depend on timings.
    pub fn particle_work(&self) -> Vec<f64> {
        let tree = &self.tree;
        let mut per_cell = vec![0.0f64; tree.own_cells];
        // Top-down: a cell's M2L cost per particle, accumulated into its children.
        for level in 0..tree.depth() {
            for c in tree.level_start[level]..tree.level_start[level + 1] {
                let cell = &tree.cells[c];
                let own = M2L_COST * self.m2l.len_of(c) as f64 / cell.count().max(1) as f64;
                let inherited = if c == 0 {
                    0.0
                } else {
                    per_cell[cell.parent as usize]
                };
                per_cell[c] = inherited + own;
            }
        }
        let mut work = vec![0.0; tree.own_particles];
        for &leaf in &tree.leaves {
            let cell = &tree.cells[leaf as usize];
            let near: f64 = self
                .p2p
                .of(leaf as usize)
                .map(|s| tree.cells[s as usize].count() as f64)
                .sum();
            let w = near + per_cell[leaf as usize];
            for sorted in cell.begin as usize..cell.end as usize {
                work[tree.order[sorted] as usize] = w;
            }
        }
        work
    }

    fn start_caps(&mut self, n: usize) {
        let mut caps = Caps::guess(n, self.settings.leaf_size);
        if let Some(store) = &self.presets {
            let (file, warning) = store.load();
            self.warnings.extend(warning);
            if let Some(c) = file.lookup(&self.preset_key(n)) {
                caps = c;
            }
        }
        self.tracker.set_caps(caps);
        self.caps_known = true;
    }

    fn record_presets(&mut self, n: usize) {
        let caps = self.tracker.caps();
        if self.saved_caps == Some(caps) {
            return;
        }
        if let Some(store) = &self.presets {
            if let Err(e) = store.save(self.preset_key(n), caps) {
                self.warnings.push(e);
            }
            self.saved_caps = Some(caps);
        }
    }
}

/// The magnitude of each vector.
pub fn magnitudes(v: &[[f64; 3]]) -> Vec<f64> {
    v.par_iter().map(|a| magnitude(*a)).collect()
}

/// The accelerations an evaluation with an accuracy target expects
/// (`Evaluation::expected_accel`): each magnitude of `acc` rounded down to an f32, half the
/// memory of f64 (4 bytes a particle at the peak) for the same cells' thresholds, which
/// are f32 rounded down anyway (`Tree::set_expected_accel`).
pub fn expected_accelerations(acc: &[[f64; 3]]) -> Vec<f32> {
    acc.par_iter()
        .map(|a| expected_f32(magnitude(*a)))
        .collect()
}

fn magnitude(a: [f64; 3]) -> f64 {
    (a[0] * a[0] + a[1] * a[1] + a[2] * a[2]).sqrt()
}

impl GravitySolver for FmmSolver {
    fn name(&self) -> &'static str {
        "fmm"
    }

    fn compute(&mut self, particles: &mut Particles) -> Result<ForceReport, GravityError> {
        check_finite(particles)?;
        let start = Instant::now();
        let stats = self.evaluate(
            &particles.pos,
            &particles.mass,
            &particles.id,
            &mut particles.acc,
            &mut particles.pot,
        )?;
        Ok(ForceReport {
            pair_interactions: stats.p2p_interactions,
            seconds: start.elapsed().as_secs_f64(),
            stats: stats.solver_stats(),
        })
    }

    fn stat_names(&self) -> Vec<&'static str> {
        FmmStats::stat_names()
    }

    fn take_warnings(&mut self) -> Vec<String> {
        std::mem::take(&mut self.warnings)
    }

    fn caps(&self) -> Option<Caps> {
        Some(self.tracker.caps())
    }

    fn set_caps(&mut self, caps: Caps) {
        self.tracker.set_caps(caps);
        self.caps_known = true;
    }
}
