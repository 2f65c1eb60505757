//! The dual-tree walk (Dehnen 2002): it only builds lists — directed M2L pairs and directed
//! P2P leaf pairs — into capped buffers; the passes that execute them come afterwards, in the
//! same shape on the CPU and the GPU.

use super::caps::CappedBuffer;
use super::tree::{Cell, Tree};
use rayon::prelude::*;

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
    mac: Mac,
    m2l: &'a CappedBuffer,
    p2p: &'a CappedBuffer,
}

/// One task's pending entries; flushed to the shared buffers in batches so threads rarely
/// touch the shared cursors.
#[derive(Default)]
struct Pending {
    m2l: Vec<u64>,
    p2p: Vec<u64>,
}

impl Walker<'_> {
    fn push_m2l(&self, pending: &mut Pending, pair: [u64; 2]) {
        pending.m2l.extend_from_slice(&pair);
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
            self.push_m2l(pending, [pack(a, b), pack(b, a)]);
        } else if ca.is_leaf() && cb.is_leaf() {
            self.push_p2p(pending, &[pack(a, b), pack(b, a)]);
        } else if ca.is_leaf() || (!cb.is_leaf() && cb.r_max > ca.r_max) {
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
    /// essential tree): only `a` receives. A remote leaf without particles is a multipole the
    /// other rank sent because it is far from all our cells' domains; it is never opened.
    fn interact_remote(&self, a: u32, c: u32, pending: &mut Pending) {
        let (ca, cc) = (&self.cells[a as usize], &self.cells[c as usize]);
        if self.mac.accepts(ca, cc) {
            self.push_m2l_one(pending, pack(a, c));
        } else if ca.is_leaf() && cc.is_leaf() {
            // The sender only stops at a particle-less cell that passes the MAC against
            // every own leaf, so `cc` carries particles here.
            self.push_p2p(pending, &[pack(a, c)]);
        } else if ca.is_leaf() || (!cc.is_leaf() && cc.r_max > ca.r_max) {
            for k in cc.children() {
                self.interact_remote(a, k, pending);
            }
        } else {
            for k in ca.children() {
                self.interact_remote(k, c, pending);
            }
        }
    }

    fn push_m2l_one(&self, pending: &mut Pending, pair: u64) {
        pending.m2l.push(pair);
        if pending.m2l.len() >= LOCAL_BATCH {
            self.m2l.push_all(&pending.m2l);
            pending.m2l.clear();
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

/// Walks the tree and fills the two buffers. Pairs are pushed from many threads in no
/// particular order; callers sort them.
pub fn walk(tree: &Tree, mac: Mac, m2l: &CappedBuffer, p2p: &CappedBuffer) {
    let walker = Walker {
        cells: &tree.cells,
        mac,
        m2l,
        p2p,
    };
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

/// Walks own root 0 against every remote root (one-sided), appending to the same buffers.
pub fn walk_remote(
    tree: &Tree,
    mac: Mac,
    remote_roots: &[u32],
    m2l: &CappedBuffer,
    p2p: &CappedBuffer,
) {
    let walker = Walker {
        cells: &tree.cells,
        mac,
        m2l,
        p2p,
    };
    // Split the own tree two levels down so that the tasks spread over the threads.
    let mut own = vec![0u32];
    for _ in 0..2 {
        own = own
            .iter()
            .flat_map(|&a| {
                let c = &tree.cells[a as usize];
                if c.is_leaf() {
                    vec![a]
                } else {
                    c.children().collect()
                }
            })
            .collect();
    }
    let tasks: Vec<(u32, u32)> = remote_roots
        .iter()
        .flat_map(|&r| own.iter().map(move |&a| (a, r)))
        .collect();
    tasks
        .par_iter()
        .for_each_init(Pending::default, |pending, &(a, c)| {
            walker.interact_remote(a, c, pending);
            walker.flush(pending);
        });
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
        walk(&tree, mac, &m2l, &p2p);
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
