//! The dual-tree walk (Dehnen 2002): it only builds lists — directed M2L pairs and directed
//! P2P leaf pairs — into capped buffers; the passes that execute them come afterwards, in the
//! same shape on the CPU and the GPU.

use super::caps::CappedBuffer;
use super::tree::{Cell, Tree};
use rayon::prelude::*;
use std::sync::atomic::{AtomicBool, Ordering};

/// The multipole acceptance criterion: cells A and B interact through their expansions when
/// `r_A + r_B < theta * d` and every particle pair is farther apart than `support`, the
/// radius beyond which the softened force is treated as Newtonian.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mac {
    /// Opening angle parameter.
    pub theta: f64,
    /// Minimum particle separation of a far pair.
    pub support: f64,
}

impl Mac {
    /// True when the pair may interact by M2L.
    #[inline]
    pub fn accepts(&self, a: &Cell, b: &Cell) -> bool {
        let d = [
            a.centre[0] - b.centre[0],
            a.centre[1] - b.centre[1],
            a.centre[2] - b.centre[2],
        ];
        let d = (d[0] * d[0] + d[1] * d[1] + d[2] * d[2]).sqrt();
        let r = a.r_max + b.r_max;
        r < self.theta * d && d - r > self.support
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

/// Packs a directed pair (target ← source) so that sorting groups by target.
#[inline]
pub fn pack(target: u32, source: u32) -> u64 {
    (u64::from(target) << 32) | u64::from(source)
}

/// Unpacks `pack`.
#[inline]
pub fn unpack(pair: u64) -> (u32, u32) {
    ((pair >> 32) as u32, pair as u32)
}

/// Entries a walk task collects before reserving room in a shared buffer.
const LOCAL_BATCH: usize = 1024;

struct Walker<'a> {
    cells: &'a [Cell],
    /// Which own cells receive forces (`None`: all of them).
    targets: Option<&'a [bool]>,
    mac: Mac,
    m2l: &'a CappedBuffer,
    p2p: &'a CappedBuffer,
    /// Set when a remote walk needed a part of a remote tree that was not sent.
    incomplete: AtomicBool,
}

/// One task's pending entries; flushed to the shared buffers in batches so threads rarely
/// touch the shared cursors.
#[derive(Default)]
struct Pending {
    m2l: Vec<u64>,
    p2p: Vec<u64>,
}

impl<'a> Walker<'a> {
    fn new(
        tree: &'a Tree,
        targets: Option<&'a [bool]>,
        mac: Mac,
        m2l: &'a CappedBuffer,
        p2p: &'a CappedBuffer,
    ) -> Self {
        Walker {
            cells: &tree.cells,
            targets,
            mac,
            m2l,
            p2p,
            incomplete: AtomicBool::new(false),
        }
    }

    /// Whether own cell `c` receives forces.
    fn is_target(&self, c: u32) -> bool {
        self.targets.is_none_or(|t| t[c as usize])
    }

    /// The directed pairs of `a` and `b` whose target receives forces.
    fn both_ways(&self, a: u32, b: u32) -> impl Iterator<Item = u64> {
        let ab = self.is_target(a).then(|| pack(a, b));
        let ba = self.is_target(b).then(|| pack(b, a));
        ab.into_iter().chain(ba)
    }

    fn push_m2l(&self, pending: &mut Pending, pairs: impl Iterator<Item = u64>) {
        pending.m2l.extend(pairs);
        if pending.m2l.len() >= LOCAL_BATCH {
            self.m2l.push_all(&pending.m2l);
            pending.m2l.clear();
        }
    }

    fn push_p2p(&self, pending: &mut Pending, pair: &[u64]) {
        pending.p2p.extend_from_slice(pair);
        if pending.p2p.len() >= LOCAL_BATCH {
            self.p2p.push_all(&pending.p2p);
            pending.p2p.clear();
        }
    }

    fn flush(&self, pending: &mut Pending) {
        self.m2l.push_all(&pending.m2l);
        self.p2p.push_all(&pending.p2p);
        pending.m2l.clear();
        pending.p2p.clear();
    }

    fn interact(&self, a: u32, b: u32, pending: &mut Pending) {
        if !self.is_target(a) && !self.is_target(b) {
            return;
        }
        let (ca, cb) = (&self.cells[a as usize], &self.cells[b as usize]);
        if a == b {
            if ca.is_leaf() {
                self.push_p2p(pending, &[pack(a, a)]);
            } else {
                for i in ca.children() {
                    for j in i..ca.first_child + ca.child_count as u32 {
                        self.interact(i, j, pending);
                    }
                }
            }
        } else if self.mac.accepts(ca, cb) {
            self.push_m2l(pending, self.both_ways(a, b));
        } else if ca.is_leaf() && cb.is_leaf() {
            let (mut pairs, mut k) = ([0u64; 2], 0);
            for pair in self.both_ways(a, b) {
                pairs[k] = pair;
                k += 1;
            }
            self.push_p2p(pending, &pairs[..k]);
        } else if open_second(ca, cb) {
            for c in cb.children() {
                self.interact(a, c, pending);
            }
        } else {
            for c in ca.children() {
                self.interact(c, b, pending);
            }
        }
    }

    /// One-sided walk of own cell `a` against remote cell `c` (from another rank's locally
    /// essential tree): only `a` receives. The sender emulated this very walk to choose what
    /// to send, so every cell it opens came with its children and every leaf pair with
    /// particles; anything missing marks the walk incomplete.
    fn interact_remote(&self, a: u32, c: u32, pending: &mut Pending) {
        match self.remote_step(a, c, pending) {
            RemoteStep::Done => {}
            RemoteStep::OpenRemote => {
                for k in self.cells[c as usize].children() {
                    self.interact_remote(a, k, pending);
                }
            }
            RemoteStep::OpenOwn => {
                for k in self.cells[a as usize].children() {
                    self.interact_remote(k, c, pending);
                }
            }
        }
    }

    /// What the walk does with the pair (own `a`, remote `c`): records an interaction, or
    /// says which cell to open.
    fn remote_step(&self, a: u32, c: u32, pending: &mut Pending) -> RemoteStep {
        if !self.is_target(a) {
            return RemoteStep::Done;
        }
        let (ca, cc) = (&self.cells[a as usize], &self.cells[c as usize]);
        if self.mac.accepts(ca, cc) {
            self.push_m2l(pending, std::iter::once(pack(a, c)));
            RemoteStep::Done
        } else if ca.is_tree_leaf() && cc.is_tree_leaf() {
            if cc.count() == 0 {
                self.incomplete.store(true, Ordering::Relaxed);
            }
            self.push_p2p(pending, &[pack(a, c)]);
            RemoteStep::Done
        } else if open_second(ca, cc) {
            if cc.is_leaf() {
                self.incomplete.store(true, Ordering::Relaxed);
                return RemoteStep::Done;
            }
            RemoteStep::OpenRemote
        } else {
            RemoteStep::OpenOwn
        }
    }

    /// Like `interact`, but stops after `depth` splits and returns the pending pairs as tasks.
    fn expand(&self, a: u32, b: u32, depth: u32, tasks: &mut Vec<(u32, u32)>) {
        if depth == 0 {
            tasks.push((a, b));
            return;
        }
        let ca = &self.cells[a as usize];
        if a == b && !ca.is_leaf() {
            for i in ca.children() {
                for j in i..ca.first_child + ca.child_count as u32 {
                    self.expand(i, j, depth - 1, tasks);
                }
            }
        } else {
            tasks.push((a, b));
        }
    }
}

/// Walks the tree and fills the two buffers with the pairs whose target is in `targets`
/// (every cell when `None`). Pairs are pushed from many threads in no particular order;
/// callers sort them.
pub fn walk(
    tree: &Tree,
    targets: Option<&[bool]>,
    mac: Mac,
    m2l: &CappedBuffer,
    p2p: &CappedBuffer,
) {
    let walker = Walker::new(tree, targets, mac, m2l, p2p);
    let mut tasks = Vec::new();
    // Two levels of self-interaction splitting give up to 36 * 36 subtree tasks.
    walker.expand(0, 0, 2, &mut tasks);
    tasks
        .par_iter()
        .for_each_init(Pending::default, |pending, &(a, b)| {
            walker.interact(a, b, pending);
            walker.flush(pending);
        });
}

/// What the remote walk does next with a pair.
enum RemoteStep {
    /// Interaction recorded (or the pair was dropped as incomplete).
    Done,
    /// Open the remote cell.
    OpenRemote,
    /// Open the own cell.
    OpenOwn,
}

/// Walks own root 0 against every remote root (one-sided), appending to the same buffers.
/// Returns false when a remote tree lacked something the walk needed (a bug in the
/// exchange: the forces would be incomplete).
pub fn walk_remote(
    tree: &Tree,
    targets: Option<&[bool]>,
    mac: Mac,
    remote_roots: &[u32],
    m2l: &CappedBuffer,
    p2p: &CappedBuffer,
) -> bool {
    let walker = Walker::new(tree, targets, mac, m2l, p2p);
    // Follow the walk's own decisions a few levels down, breadth first, to get tasks that
    // spread over the threads (the pairs are the same as a serial walk's).
    let mut pending = Pending::default();
    let mut tasks: Vec<(u32, u32)> = remote_roots.iter().map(|&r| (0, r)).collect();
    for _ in 0..4 {
        let mut next = Vec::with_capacity(tasks.len() * 8);
        for &(a, c) in &tasks {
            match walker.remote_step(a, c, &mut pending) {
                RemoteStep::Done => {}
                RemoteStep::OpenRemote => {
                    next.extend(tree.cells[c as usize].children().map(|k| (a, k)))
                }
                RemoteStep::OpenOwn => {
                    next.extend(tree.cells[a as usize].children().map(|k| (k, c)))
                }
            }
        }
        tasks = next;
    }
    walker.flush(&mut pending);
    tasks
        .par_iter()
        .for_each_init(Pending::default, |pending, &(a, c)| {
            walker.interact_remote(a, c, pending);
            walker.flush(pending);
        });
    !walker.incomplete.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fmm::caps::CappedBuffer;

    #[test]
    fn every_particle_pair_is_covered_exactly_once() {
        let n = 600;
        let mut s = 9u64;
        let mut rnd = move || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 11) as f64 / (1u64 << 53) as f64
        };
        let pos: Vec<[f64; 3]> = (0..n).map(|_| [rnd(), rnd(), rnd() * 0.1]).collect();
        let mass = vec![1.0; n];
        let id: Vec<u64> = (0..n as u64).collect();
        let mut tree = Tree::default();
        tree.build(&pos, &mass, &id, None, 8, 10_000).unwrap();
        tree.compute_moments();
        let (mut m2l, mut p2p) = (CappedBuffer::default(), CappedBuffer::default());
        m2l.reset(1_000_000);
        p2p.reset(1_000_000);
        let mac = Mac {
            theta: 0.6,
            support: 0.0,
        };
        walk(&tree, None, mac, &m2l, &p2p);
        let (a, b) = (m2l.take(), p2p.take());
        assert!(!a.is_empty(), "the test must exercise far pairs");
        // Count, for every directed particle pair, how many list entries cover it.
        let mut cover = vec![0u8; n * n];
        for (list, is_far) in [(&a, true), (&b, false)] {
            for &pair in list.iter() {
                let (t, s) = unpack(pair);
                let (ct, cs) = (tree.cells[t as usize], tree.cells[s as usize]);
                if is_far {
                    assert!(mac.accepts(&ct, &cs));
                }
                for i in ct.begin..ct.end {
                    for j in cs.begin..cs.end {
                        cover[i as usize * n + j as usize] += 1;
                    }
                }
            }
        }
        for i in 0..n {
            for j in 0..n {
                assert_eq!(cover[i * n + j], 1, "pair ({i}, {j})");
            }
        }
    }
}
