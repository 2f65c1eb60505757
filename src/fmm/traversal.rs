//! The dual-tree walk (Dehnen 2002) in directed, target-by-target form: it only builds
//! lists — the M2L sources and the P2P source leaves of every own cell — into capped
//! buffers; the passes that execute them come afterwards, in the same shape on the CPU and
//! the GPU.
//!
//! Each target cell takes the sources its parent handed down, tests them, opens the sources
//! that must be opened on the spot, and hands the rest to its children. Every target's
//! sources are therefore complete at one moment, on one thread, and go to the buffer in one
//! piece, so the lists need no global sort afterwards (which cost more than the walk
//! itself). They come out in increasing cell index without sorting: the handed sources and
//! the children of opened ones are taken smallest first, and the tree numbers cells breadth
//! first with children in their parents' order, so an opened cell's children come after
//! everything taken so far and after the children already waiting. The decision for each
//! pair is the one the symmetric dual-tree walk makes (Dehnen's mutual walk), so the lists
//! hold the same pairs as that walk's, in the same order, whatever the number of threads.

use super::caps::CappedBuffer;
use super::tree::{Cell, Tree};
use rayon::prelude::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The multipole acceptance criterion: cells A and B interact through their expansions when
/// `r_A + r_B < theta * d`, every particle pair is farther apart than `support` (the radius
/// beyond which the softened force is treated as Newtonian), and, when the criterion
/// controls the error (`tolerance > 0`), the error estimated for either cell as the target
/// T of the other, the source S, is within T's share of the error allowed on it:
///
/// `w_S ρ^(p+1) / (d - r_A - r_B)^2 ≤ tolerance * accel_T`, ρ = (r_A + r_B) / d,
///
/// with `accel_T` T's weakest expected acceleration (`Cell::accel`) and
/// `tolerance = C ε / (G M)` (M the total mass). Why: `G M_S ρ^(p+1) / (d - r)^2` bounds the
/// error of the interaction; a source beyond `NEAR_FRACTION` of T's mass radius
/// `R_T = (G M / accel_T)^(1/2)` (where the whole mass would pull as hard as T is pulled)
/// is given the share `M_S / M` of the allowance (`w_S = 1`: its mass drops out), which
/// keeps the sum over any number of such sources within it, even when their errors add up
/// coherently (the outer halo, whose force comes from far away in one direction); a nearer
/// source, one of many pulling from every side whose errors add like random numbers, is
/// held to the allowance itself (`w_S = M_S / M`). Testing both cells keeps the decision
/// symmetric, so the far field acts both ways (momentum).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mac {
    /// Opening angle parameter (the largest ρ accepted).
    pub theta: f64,
    /// Minimum particle separation of a far pair.
    pub support: f64,
    /// Expansion order p.
    pub order: u32,
    /// Error allowed per unit of expected acceleration, over G and the total mass (see
    /// above); 0 for the geometric criterion alone.
    pub tolerance: f64,
    /// The total mass M of every rank's particles.
    pub total_mass: f64,
    /// G M.
    pub g_total: f64,
    /// `1.5 ε²` under Plummer softening with an error target (else 0): a far pair at
    /// separation s is taken as Newtonian, which overstates its force by up to
    /// `1.5 (ε / s)²` of it, so the estimate adds `bias / (d - r)^4` (times G M_S, always
    /// with the mass share: the bias has one sign, and adds up coherently).
    pub bias: f64,
}

/// Where a source stops being near its target, in units of the target's mass radius
/// (`Mac`): measured on the accuracy test set (docs/config.md, "Accuracy target"; 1 lets
/// the outer halo's errors through, 0.5 keeps them within the allowance and cut the time at
/// N = 1e6 from 12.1 to 3.1 s at p = 7 against 0).
pub const NEAR_FRACTION: f64 = 0.5;

/// Relative width of the band around the MAC's thresholds inside which `Mac::accepts`
/// takes the square root: far wider than the roundings of either form of the test (~1e-16
/// each), so that outside it the squared distances decide as the distance would (the
/// device walk, kernels/walk.cu, uses the same band).
pub const MAC_BAND: f64 = 1e-9;

impl Mac {
    /// True when the pair may interact by M2L.
    #[inline]
    pub fn accepts(&self, a: &Cell, b: &Cell) -> bool {
        let d = [
            a.centre[0] - b.centre[0],
            a.centre[1] - b.centre[1],
            a.centre[2] - b.centre[2],
        ];
        let d2 = d[0] * d[0] + d[1] * d[1] + d[2] * d[2];
        let r = a.r_max + b.r_max;
        // Most pairs lie clearly on one side of both thresholds: the squares decide without
        // the square root, whose latency was a fifth of the walk. Near a threshold, the
        // distance itself decides, so the answer is always `accepts_exactly`'s.
        let (near, far) = (r * r, (r + self.support) * (r + self.support));
        let reach = self.theta * self.theta * d2;
        let geometric = if reach > near * (1.0 + MAC_BAND) && d2 > far * (1.0 + MAC_BAND) {
            true
        } else if reach < near * (1.0 - MAC_BAND) || d2 < far * (1.0 - MAC_BAND) {
            false
        } else {
            self.accepts_exactly(d2, r)
        };
        geometric && (self.tolerance == 0.0 || self.error_within(a, b, d2.sqrt(), r))
    }

    /// The criterion on the distance: `r < theta d` and `d - r > support` for centres
    /// `d2.sqrt()` apart and radii adding up to `r`.
    #[inline]
    fn accepts_exactly(&self, d2: f64, r: f64) -> bool {
        let d = d2.sqrt();
        r < self.theta * d && d - r > self.support
    }

    /// The error condition for cells `d` apart with radii adding up to `r < d` (a cell whose
    /// expected acceleration is unknown, 0, sets none). Every operation is one IEEE rounding
    /// in a fixed order on f32-representable inputs (masses taken in f32, as other ranks
    /// receive them), so that any walk of the same cells decides alike.
    #[inline]
    fn error_within(&self, a: &Cell, b: &Cell, d: f64, r: f64) -> bool {
        if a.accel <= 0.0 && b.accel <= 0.0 {
            return true;
        }
        let rho = r / d;
        let mut power = rho;
        for _ in 0..self.order {
            power *= rho;
        }
        let gap = d - r;
        let gap2 = gap * gap;
        let scale = power / gap2;
        // The Plummer bias has one sign for every far pair (the Newtonian force is the
        // stronger): it adds up coherently, so it always gets the mass share.
        let bias = if self.bias > 0.0 {
            self.bias / (gap2 * gap2)
        } else {
            0.0
        };
        let near = NEAR_FRACTION * NEAR_FRACTION * self.g_total;
        let within = |target: &Cell, source: &Cell| {
            if target.accel <= 0.0 {
                return true;
            }
            let share = if d * d * target.accel < near {
                f64::from(source.mass as f32) / self.total_mass
            } else {
                1.0
            };
            share * scale + bias <= self.tolerance * target.accel
        };
        within(a, b) && within(b, a)
    }
}

/// Which cell of a pair that fails the MAC (and is not two leaves) a walk opens: `b` when
/// `a` is a leaf or when both have children and `b` is larger (ties broken by the centres),
/// otherwise `a`. Antisymmetric, so the pairs two ranks find for each other are mirror
/// images and every cross-domain interaction is used in both directions, as within a rank
/// (which is what keeps momentum conserved).
#[inline]
pub fn open_second(a: &Cell, b: &Cell) -> bool {
    if a.is_tree_leaf() {
        return true;
    }
    if b.is_tree_leaf() {
        return false;
    }
    let by_centre = || {
        (0..3)
            .map(|k| b.centre[k].total_cmp(&a.centre[k]))
            .find(|o| o.is_ne())
            .unwrap_or(std::cmp::Ordering::Equal)
    };
    b.r_max.total_cmp(&a.r_max).then_with(by_centre).is_gt()
}

/// Packs two 32-bit halves into one word (a target's (start, length) in a list buffer).
#[inline]
pub fn pack(high: u32, low: u32) -> u64 {
    (u64::from(high) << 32) | u64::from(low)
}

/// Unpacks `pack`.
#[inline]
pub fn unpack(pair: u64) -> (u32, u32) {
    ((pair >> 32) as u32, pair as u32)
}

/// The entries of `sources` that `packed` (`pack(start, len)`) names.
pub fn span(packed: u64, sources: &[u32]) -> &[u32] {
    let (start, len) = unpack(packed);
    &sources[start as usize..(start + len) as usize]
}

/// Entries a walk task collects before reserving room in a shared buffer.
const LOCAL_BATCH: usize = 1024;

/// Targets with at least this many particles walk their children in parallel.
const PARALLEL_PARTICLES: usize = 16_384;

/// Where a walk put each own cell's sources in one of its buffers: `pack(start, len)` per
/// cell, the sources being `buffer[start..start + len]` in increasing cell index.
pub type Spans = Vec<u64>;

/// What a walk produced besides the buffers' contents.
#[derive(Debug)]
pub struct Walked {
    /// Each own cell's M2L sources.
    pub m2l: Spans,
    /// Each own cell's P2P source leaves (empty but for leaves).
    pub p2p: Spans,
    /// False when another rank's tree lacked a part the walk needed (a bug in the
    /// exchange: the forces would be incomplete).
    pub complete: bool,
}

/// What the walk does with a (target, source) pair.
enum Step {
    /// The source's multipole acts on the target's local expansion.
    M2l,
    /// Two leaves: particle by particle.
    P2p,
    /// Test the source's children against the same target.
    OpenSource,
    /// Hand the source down to the target's children.
    OpenTarget,
    /// The pair needs a part of a remote tree that was not sent.
    Missing,
}

/// The sources of whole targets waiting for room in a shared buffer.
#[derive(Default)]
struct Batch {
    sources: Vec<u32>,
    /// (target, number of its sources), in the order of `sources`.
    runs: Vec<(u32, u32)>,
}

impl Batch {
    fn add(&mut self, target: u32, sources: &[u32]) {
        if !sources.is_empty() {
            self.sources.extend_from_slice(sources);
            self.runs.push((target, sources.len() as u32));
        }
    }

    /// Reserves room for the batch with one atomic operation and records where each
    /// target's sources went.
    fn place(&mut self, buffer: &CappedBuffer, spans: &[AtomicU64]) {
        let mut start = buffer.push_all(&self.sources);
        for &(target, len) in &self.runs {
            spans[target as usize].store(pack(start as u32, len), Ordering::Relaxed);
            start += len as usize;
        }
        self.sources.clear();
        self.runs.clear();
    }
}

/// One task's working lists, reused from target to target.
#[derive(Default)]
struct Scratch {
    /// Children of the sources opened for the current target, in the order they were
    /// opened (increasing index in a tree numbered breadth first).
    opened: Vec<u32>,
    m2l: Vec<u32>,
    p2p: Vec<u32>,
    m2l_batch: Batch,
    p2p_batch: Batch,
}

struct Walker<'a> {
    cells: &'a [Cell],
    /// Cells below this index are the rank's own, the others came from other ranks.
    own_cells: u32,
    /// Which own cells receive forces (`None`: all of them).
    targets: Option<&'a [bool]>,
    mac: Mac,
    m2l: &'a CappedBuffer,
    p2p: &'a CappedBuffer,
    m2l_spans: Vec<AtomicU64>,
    p2p_spans: Vec<AtomicU64>,
    /// Set when a remote pair needed a part of a remote tree that was not sent.
    incomplete: AtomicBool,
}

impl Walker<'_> {
    /// Whether own cell `c` receives forces (then so does its parent).
    fn is_target(&self, c: u32) -> bool {
        self.targets.is_none_or(|t| t[c as usize])
    }

    /// The decision for target `t` and source `s` (`s != t`): the one the symmetric
    /// walk makes for the unordered pair, so the lists do not depend on the direction.
    fn step(&self, t: u32, s: u32) -> Step {
        let (ct, cs) = (&self.cells[t as usize], &self.cells[s as usize]);
        if self.mac.accepts(ct, cs) {
            return Step::M2l;
        }
        if s < self.own_cells {
            if ct.is_leaf() && cs.is_leaf() {
                return Step::P2p;
            }
            // The symmetric walk meets two own cells as (first, second) in particle
            // order and decides with `open_second` on them in that order.
            let opens_source = if ct.begin < cs.begin {
                open_second(ct, cs)
            } else {
                !open_second(cs, ct)
            };
            if opens_source {
                Step::OpenSource
            } else {
                Step::OpenTarget
            }
        } else if ct.is_tree_leaf() && cs.is_tree_leaf() {
            if cs.count() == 0 {
                self.incomplete.store(true, Ordering::Relaxed);
            }
            Step::P2p
        } else if open_second(ct, cs) {
            // The sender emulated this walk to choose what to send, so every cell it
            // opens came with its children.
            if cs.is_leaf() {
                self.incomplete.store(true, Ordering::Relaxed);
                return Step::Missing;
            }
            Step::OpenSource
        } else {
            Step::OpenTarget
        }
    }

    /// Finds the sources of target `t` among `handed` (increasing cell index) and their
    /// descendants, writes them out, and walks `t`'s children with what `t` could not
    /// settle.
    fn visit(&self, t: u32, handed: &[u32], scratch: &mut Scratch) {
        if !self.is_target(t) {
            return;
        }
        let cell = &self.cells[t as usize];
        let mut deferred = Vec::new();
        let mut split_self = false;
        scratch.opened.clear();
        scratch.m2l.clear();
        scratch.p2p.clear();
        // Merge the handed sources with the children of opened ones, smallest index first.
        let (mut next_handed, mut next_opened) = (0, 0);
        loop {
            let s = match (handed.get(next_handed), scratch.opened.get(next_opened)) {
                (Some(&h), Some(&o)) if o < h => {
                    next_opened += 1;
                    o
                }
                (Some(&h), _) => {
                    next_handed += 1;
                    h
                }
                (None, Some(&o)) => {
                    next_opened += 1;
                    o
                }
                (None, None) => break,
            };
            if s == t {
                if cell.is_leaf() {
                    scratch.p2p.push(t);
                } else {
                    split_self = true;
                }
                continue;
            }
            match self.step(t, s) {
                Step::M2l => scratch.m2l.push(s),
                Step::P2p => scratch.p2p.push(s),
                Step::OpenSource => scratch.opened.extend(self.cells[s as usize].children()),
                Step::OpenTarget => deferred.push(s),
                Step::Missing => {}
            }
        }
        // In increasing index, the order the sums have always been taken in: the walk's
        // own order gives other round-off, and the f32 near field's momentum error at
        // 1e-8 moves with it. The merge above yields that order for the rank's own tree;
        // other ranks' trees are appended in the order they arrived, so their cells may
        // need the sort.
        for list in [&mut scratch.m2l, &mut scratch.p2p, &mut deferred] {
            if !list.is_sorted() {
                list.sort_unstable();
            }
        }
        scratch.m2l_batch.add(t, &scratch.m2l);
        scratch.p2p_batch.add(t, &scratch.p2p);
        if scratch.m2l_batch.sources.len() >= LOCAL_BATCH {
            scratch.m2l_batch.place(self.m2l, &self.m2l_spans);
        }
        if scratch.p2p_batch.sources.len() >= LOCAL_BATCH {
            scratch.p2p_batch.place(self.p2p, &self.p2p_spans);
        }
        if cell.is_leaf() {
            // A leaf target never defers (`step` opens the other cell of such a pair).
            debug_assert!(deferred.is_empty());
            return;
        }
        if split_self {
            // The self pair of a cell becomes every pair of its children, in their place
            // in the index order.
            let at = deferred.partition_point(|&d| d < cell.first_child);
            deferred.splice(at..at, cell.children());
        }
        if cell.count() >= PARALLEL_PARTICLES {
            cell.children()
                .into_par_iter()
                .for_each_init(Scratch::default, |scratch, c| {
                    self.visit(c, &deferred, scratch);
                    self.flush(scratch);
                });
        } else {
            for c in cell.children() {
                self.visit(c, &deferred, scratch);
            }
        }
    }

    fn flush(&self, scratch: &mut Scratch) {
        scratch.m2l_batch.place(self.m2l, &self.m2l_spans);
        scratch.p2p_batch.place(self.p2p, &self.p2p_spans);
    }
}

/// Walks own root 0 against itself and against every remote root (other ranks' locally
/// essential trees, appended to `tree`; only own cells receive), and writes the sources of
/// every own cell in `targets` (every own cell when `None`) to the two buffers.
pub fn walk(
    tree: &Tree,
    targets: Option<&[bool]>,
    mac: Mac,
    remote_roots: &[u32],
    m2l: &CappedBuffer,
    p2p: &CappedBuffer,
) -> Walked {
    let own_cells = tree.own_cells;
    let spans = || (0..own_cells).map(|_| AtomicU64::new(0)).collect();
    let walker = Walker {
        cells: &tree.cells,
        own_cells: own_cells as u32,
        targets,
        mac,
        m2l,
        p2p,
        m2l_spans: spans(),
        p2p_spans: spans(),
        incomplete: AtomicBool::new(false),
    };
    if tree.own_particles > 0 {
        let mut roots = vec![0];
        roots.extend_from_slice(remote_roots);
        roots.sort_unstable();
        let mut scratch = Scratch::default();
        walker.visit(0, &roots, &mut scratch);
        walker.flush(&mut scratch);
    }
    let unpacked = |spans: Vec<AtomicU64>| spans.into_iter().map(AtomicU64::into_inner).collect();
    Walked {
        complete: !walker.incomplete.load(Ordering::Relaxed),
        m2l: unpacked(walker.m2l_spans),
        p2p: unpacked(walker.p2p_spans),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fmm::caps::CappedBuffer;

    /// Uniform numbers in [0, 1) from a linear congruential generator seeded with `seed`.
    fn uniform(seed: u64) -> impl FnMut() -> f64 {
        let mut s = seed;
        move || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    /// Builds a tree over `n` particles of a flattened random cloud, walks it with only the
    /// particles flagged by `active` receiving, and counts, for every directed particle pair,
    /// how many list entries cover it, and how many particle pairs the far entries cover.
    /// With `tolerance`, the MAC also controls the error,
    /// against expected accelerations spread over two decades.
    fn cover(n: usize, active: impl Fn(usize) -> bool, tolerance: f64) -> (Vec<u8>, usize) {
        let mut rnd = uniform(9);
        let pos: Vec<[f64; 3]> = (0..n).map(|_| [rnd(), rnd(), rnd() * 0.1]).collect();
        let mass = vec![1.0; n];
        let id: Vec<u64> = (0..n as u64).collect();
        let mut tree = Tree::default();
        tree.build(&pos, &mass, &id, None, 8, 10_000).unwrap();
        tree.compute_moments();
        let expected: Vec<f32> = (0..n).map(|_| 10f32.powf(2.0 * rnd() as f32)).collect();
        if tolerance > 0.0 {
            tree.set_expected_accel(&expected);
        }
        let flags: Vec<bool> = (0..n).map(&active).collect();
        let targets = tree.cells_holding(&flags);
        let (mut m2l, mut p2p) = (CappedBuffer::default(), CappedBuffer::default());
        m2l.reset(1_000_000);
        p2p.reset(1_000_000);
        let mac = Mac {
            theta: 0.6,
            order: 7,
            tolerance,
            total_mass: 1.0,
            g_total: 1.0,
            bias: 0.0,
            support: 0.0,
        };
        let walked = walk(&tree, Some(&targets), mac, &[], &m2l, &p2p);
        assert!(walked.complete);
        let (far, near) = (m2l.take(), p2p.take());
        let mut cover = vec![0u8; n * n];
        let mut far_pairs = 0;
        for (list, spans, is_far) in [(&far, &walked.m2l, true), (&near, &walked.p2p, false)] {
            let mut entries = 0;
            for (t, &span) in spans.iter().enumerate() {
                let (start, len) = unpack(span);
                let sources = &list[start as usize..(start + len) as usize];
                assert!(sources.is_sorted(), "target {t}");
                entries += sources.len();
                let ct = tree.cells[t];
                for &s in sources {
                    let cs = tree.cells[s as usize];
                    assert_eq!(mac.accepts(&ct, &cs), is_far, "({t}, {s})");
                    if is_far {
                        far_pairs += ct.count() * cs.count();
                    }
                    for i in ct.begin..ct.end {
                        for j in cs.begin..cs.end {
                            let (i, j) = (tree.order[i as usize], tree.order[j as usize]);
                            cover[i as usize * n + j as usize] += 1;
                        }
                    }
                }
            }
            assert_eq!(entries, list.len(), "every entry belongs to one target");
        }
        (cover, far_pairs)
    }

    #[test]
    fn the_squared_test_decides_as_the_distance_does() {
        // Pairs at random and pairs placed at the thresholds (each within a few ulps of
        // where the exact test changes its answer), for several opening angles and
        // supports, zero radii and zero distances included.
        let mut rnd = uniform(5);
        let cell = |centre: [f64; 3], r_max: f64| Cell {
            centre,
            r_max,
            ..Cell::default()
        };
        let mut decided = [0usize; 2];
        for (theta, support) in [(0.6, 0.0), (0.5, 0.07), (0.3, 1.0), (1.0, 1e-3)] {
            let mac = Mac {
                theta,
                support,
                order: 7,
                tolerance: 0.0,
                total_mass: 1.0,
                g_total: 1.0,
                bias: 0.0,
            };
            for k in 0..200_000 {
                let (ra, rb) = (rnd() * 2.0, if k % 97 == 0 { 0.0 } else { rnd() });
                let r = ra + rb;
                let dist = match k % 4 {
                    0 => rnd() * 20.0,
                    1 => r / theta,
                    2 => r + support,
                    _ => 0.0,
                };
                let wiggle = 1.0 + (rnd() - 0.5) * 1e-15;
                let dir = [rnd() - 0.5, rnd() - 0.5, rnd() - 0.5];
                let norm = (dir[0] * dir[0] + dir[1] * dir[1] + dir[2] * dir[2]).sqrt();
                let at = dir.map(|x| 3.0 + x / norm * dist * wiggle);
                let (a, b) = (cell([3.0, 3.0, 3.0], ra), cell(at, rb));
                let d = [0, 1, 2].map(|i| a.centre[i] - b.centre[i]);
                let d2 = d[0] * d[0] + d[1] * d[1] + d[2] * d[2];
                let exact = mac.accepts_exactly(d2, r);
                assert_eq!(mac.accepts(&a, &b), exact, "{theta} {support} {a:?} {b:?}");
                assert_eq!(mac.accepts(&b, &a), exact);
                decided[usize::from(exact)] += 1;
            }
        }
        assert!(decided[0] > 100_000 && decided[1] > 100_000, "{decided:?}");
    }

    #[test]
    fn every_particle_pair_is_covered_exactly_once() {
        let n = 600;
        let mut far_pairs = Vec::new();
        // The geometric MAC, then the error-controlled one at two tolerances (the
        // expected accelerations are 1..100, the masses 1 each: 1e-3 rejects some pairs
        // the geometric MAC takes, 1e-5 most).
        for tolerance in [0.0, 1e-3, 1e-5] {
            let (cover, far) = cover(n, |_| true, tolerance);
            assert!(far > 0, "the test must exercise far pairs");
            for i in 0..n {
                for j in 0..n {
                    assert_eq!(
                        cover[i * n + j],
                        1,
                        "pair ({i}, {j}), tolerance {tolerance}"
                    );
                }
            }
            far_pairs.push(far);
        }
        assert!(
            far_pairs.is_sorted_by(|a, b| a > b),
            "a tighter tolerance must leave fewer particle pairs to the far field: {far_pairs:?}"
        );
    }

    #[test]
    fn the_error_condition_is_symmetric_and_tightens_with_the_weaker_cell() {
        let cell = |x: f64, accel: f64| Cell {
            centre: [x, 0.0, 0.0],
            r_max: 1.0,
            mass: 0.5,
            accel,
            ..Cell::default()
        };
        // A mass radius far beyond the pair: every source is held to its mass share.
        let far = Mac {
            theta: 0.75,
            support: 0.0,
            order: 7,
            tolerance: 1.0,
            total_mass: 1.0,
            g_total: 1e-9,
            bias: 0.0,
        };
        // ρ = 0.5, d - r = 2: ρ^8 / 4 = 9.8e-4.
        let (a, b) = (cell(0.0, 1e-3), cell(4.0, 1.0));
        assert!(far.accepts(&a, &b) && far.accepts(&b, &a));
        let weak = cell(0.0, 9e-4);
        assert!(!far.accepts(&weak, &b) && !far.accepts(&b, &weak));
        let unknown = cell(0.0, 0.0);
        assert!(far.accepts(&unknown, &b) && far.accepts(&b, &unknown));
        // Within half the weak cell's mass radius the source (half the mass) is held to the
        // whole allowance: 0.5 * 9.8e-4 ≤ 9e-4.
        let near = Mac {
            g_total: 1e9,
            ..far
        };
        assert!(near.accepts(&weak, &b) && near.accepts(&b, &weak));
        let weaker = cell(0.0, 4e-4);
        assert!(!near.accepts(&weaker, &b) && !near.accepts(&b, &weaker));
    }

    #[test]
    fn only_targets_receive_and_each_of_their_pairs_once() {
        let n = 600;
        let active = |i: usize| i % 7 == 3;
        let (cover, far) = cover(n, active, 0.0);
        assert!(far > 0, "the test must exercise far pairs");
        for i in 0..n {
            for j in 0..n {
                // A passive particle in a leaf with an active one receives too.
                let c = cover[i * n + j];
                if active(i) {
                    assert_eq!(c, 1, "pair ({i}, {j})");
                } else {
                    assert!(c <= 1, "pair ({i}, {j})");
                }
            }
        }
        let skipped = (0..n).filter(|&i| (0..n).any(|j| cover[i * n + j] == 0));
        assert!(
            skipped.count() > 0,
            "the walk must leave out pairs of passive cells"
        );
    }
}
