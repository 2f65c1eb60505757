//! The FMM's passes on the CPU (the host side of `gpu::passes`): P2M and M2M up the tree
//! (and for other ranks' cells that came without multipoles), M2L over the walk's list,
//! L2L down, L2P and P2P into the particles' accelerations — each parallel over cells with
//! rayon, in a fixed order so that the bits do not depend on the thread count.

use super::expansion::{self, M2L_LANES, Operators};
use super::p2p::NearScratch;
use super::solver::FmmSolver;
use super::tree::{Cell, Tree};
use rayon::prelude::*;

/// `a - b`.
#[inline]
fn sub(a: [f64; 3], b: [f64; 3]) -> [f64; 3] {
    [a[0] - b[0], a[1] - b[1], a[2] - b[2]]
}

/// P2M of a leaf's particles into `m`, in batches of `M2L_LANES`.
fn p2m_leaf(ops: &Operators, tree: &Tree, cell: &Cell, m: &mut [f64]) {
    let range = cell.begin as usize..cell.end as usize;
    for (x, q) in tree.pos[range.clone()]
        .chunks(M2L_LANES)
        .zip(tree.mass[range].chunks(M2L_LANES))
    {
        let y = std::array::from_fn(|w| x.get(w).map_or([0.0; 3], |x| sub(*x, cell.centre)));
        let q = std::array::from_fn(|w| q.get(w).copied().unwrap_or(0.0));
        ops.p2m_batch(&y, &q, m);
    }
}

/// Adds the multipole `child_m` of `child` to its parent's `m`.
fn m2m_child(
    p: usize,
    parent: &Cell,
    child: &Cell,
    child_m: &[f64],
    m: &mut [f64],
    scratch: &mut [f64],
) {
    let t = [
        child.centre[0] - parent.centre[0],
        child.centre[1] - parent.centre[1],
        child.centre[2] - parent.centre[2],
    ];
    expansion::m2m(p, t, child_m, m, scratch);
}

/// A leaf and the slices of the sorted output arrays that belong to its particles.
type LeafOutput<'a> = (u32, &'a mut [[f64; 3]], &'a mut [f64]);

impl FmmSolver {
    /// The multipoles of a remote tree's cells that came without one (the sender sends
    /// multipoles only for the cells it sends neither particles nor children of): P2M from
    /// the particles, M2M from the children, deepest first. With f64 on the wire these are
    /// the sender's own bits (same operations in the same order).
    pub(super) fn rebuild_remote_multipoles(&mut self, first: usize, count: usize, len: usize) {
        let p = self.settings.order;
        let (tree, ops) = (&self.tree, &self.ops);
        let mut scratch = vec![0.0; len];
        // Breadth first within the tree: children come after their parent.
        for c in (first..first + count).rev() {
            let cell = &tree.cells[c];
            if cell.count() == 0 && cell.is_leaf() {
                continue;
            }
            let (head, below) = self.multipoles.split_at_mut((c + 1) * len);
            let m = &mut head[c * len..];
            m.fill(0.0);
            if cell.is_leaf() {
                p2m_leaf(ops, tree, cell, m);
            } else {
                for ch in cell.children() {
                    let off = (ch as usize - c - 1) * len;
                    m2m_child(
                        p,
                        cell,
                        &tree.cells[ch as usize],
                        &below[off..off + len],
                        m,
                        &mut scratch,
                    );
                }
            }
        }
    }

    /// P2M at leaves, then M2M level by level towards the root.
    pub(super) fn upward(&mut self, len: usize) {
        let p = self.settings.order;
        let cells = self.tree.cells.len();
        self.multipoles.clear();
        self.multipoles.resize(cells * len, 0.0);
        let (tree, ops) = (&self.tree, &self.ops);
        for level in (0..tree.depth()).rev() {
            let (lo, hi) = (tree.level_start[level], tree.level_start[level + 1]);
            let (done, rest) = self.multipoles.split_at_mut(hi * len);
            let this_level = &mut done[lo * len..];
            let below: &[f64] = rest;
            this_level.par_chunks_mut(len).enumerate().for_each_init(
                || vec![0.0; len],
                |scratch, (i, m)| {
                    let cell = &tree.cells[lo + i];
                    if cell.is_leaf() {
                        p2m_leaf(ops, tree, cell, m);
                    } else {
                        for ch in cell.children() {
                            let c = &tree.cells[ch as usize];
                            let off = (ch as usize - hi) * len;
                            m2m_child(p, cell, c, &below[off..off + len], m, scratch);
                        }
                    }
                },
            );
        }
    }

    /// Every cell's local expansion from the multipoles on its M2L list.
    pub(super) fn m2l_pass(&mut self, len: usize) {
        let cells = self.tree.own_cells;
        self.locals.clear();
        self.locals.resize(cells * len, 0.0);
        let (tree, ops, list, multipoles) = (&self.tree, &self.ops, &self.m2l, &self.multipoles);
        let zero = vec![0.0; len];
        self.locals
            .par_chunks_mut(len)
            .enumerate()
            .with_min_len(16)
            .for_each(|(t, local)| {
                let target = tree.cells[t].centre;
                let mut sources = list.of(t);
                for _ in 0..list.len_of(t).div_ceil(M2L_LANES) {
                    // Unused lanes get an empty multipole at a harmless offset.
                    let mut r = [[0.0, 0.0, 1.0]; M2L_LANES];
                    let mut m: [&[f64]; M2L_LANES] = [&zero; M2L_LANES];
                    for (w, s) in sources.by_ref().take(M2L_LANES).enumerate() {
                        let c = tree.cells[s as usize].centre;
                        r[w] = [target[0] - c[0], target[1] - c[1], target[2] - c[2]];
                        m[w] = &multipoles[s as usize * len..(s as usize + 1) * len];
                    }
                    ops.m2l_batch(&r, &m, local);
                }
            });
    }

    /// Passes local expansions down, level by level.
    pub(super) fn l2l_pass(&mut self, len: usize) {
        let p = self.settings.order;
        let tree = &self.tree;
        for level in 1..tree.depth() {
            let (lo, hi) = (tree.level_start[level], tree.level_start[level + 1]);
            let (above, rest) = self.locals.split_at_mut(lo * len);
            let this_level = &mut rest[..(hi - lo) * len];
            let above: &[f64] = above;
            let targets = &self.targets;
            this_level.par_chunks_mut(len).enumerate().for_each_init(
                || vec![0.0; len],
                |scratch, (i, local)| {
                    if targets.get(lo + i) == Some(&false) {
                        return;
                    }
                    let cell = &tree.cells[lo + i];
                    let parent = &tree.cells[cell.parent as usize];
                    let s = [
                        cell.centre[0] - parent.centre[0],
                        cell.centre[1] - parent.centre[1],
                        cell.centre[2] - parent.centre[2],
                    ];
                    let off = cell.parent as usize * len;
                    expansion::l2l(p, s, &above[off..off + len], local, scratch);
                },
            );
        }
    }

    /// Splits the sorted output arrays into one (acc, pot) slice pair per leaf.
    fn leaf_slices<'a>(
        tree: &Tree,
        acc: &'a mut [[f64; 3]],
        pot: &'a mut [f64],
    ) -> Vec<LeafOutput<'a>> {
        let mut out = Vec::with_capacity(tree.leaves.len());
        let (mut acc, mut pot) = (acc, pot);
        for &leaf in &tree.leaves {
            let n = tree.cells[leaf as usize].count();
            let (a, ra) = acc.split_at_mut(n);
            let (p, rp) = pot.split_at_mut(n);
            out.push((leaf, a, p));
            acc = ra;
            pot = rp;
        }
        out
    }

    /// Evaluates each leaf's local expansion at its particles, writing `acc` and `pot` (in
    /// tree order; the particles of leaves that are not targets are left as they are).
    pub(super) fn l2p_pass(&self, len: usize, acc: &mut [[f64; 3]], pot: &mut [f64]) {
        let g = self.settings.g;
        let (tree, locals, ops) = (&self.tree, &self.locals, &self.ops);
        let targets = &self.targets;
        Self::leaf_slices(tree, acc, pot)
            .into_par_iter()
            .filter(|(leaf, _, _)| targets.get(*leaf as usize) != Some(&false))
            .for_each(|(leaf, acc, pot)| {
                let cell = &tree.cells[leaf as usize];
                let local = &locals[leaf as usize * len..(leaf as usize + 1) * len];
                let particles = &tree.pos[cell.begin as usize..cell.end as usize];
                for (b, x) in particles.chunks(M2L_LANES).enumerate() {
                    let y = std::array::from_fn(|w| {
                        x.get(w).map_or([0.0; 3], |x| sub(*x, cell.centre))
                    });
                    let out = ops.l2p_batch(&y, local);
                    for (w, o) in out.iter().take(x.len()).enumerate() {
                        let k = b * M2L_LANES + w;
                        acc[k] = [g * o[1], g * o[2], g * o[3]];
                        pot[k] = -g * o[0];
                    }
                }
            });
    }

    /// Adds the near field to `acc` and `pot` (in tree order); returns the particle
    /// interactions evaluated.
    pub(super) fn p2p_pass(&self, acc: &mut [[f64; 3]], pot: &mut [f64]) -> u64 {
        let (tree, list, near) = (&self.tree, &self.p2p, &self.near);
        Self::leaf_slices(tree, acc, pot)
            .into_par_iter()
            .map_init(NearScratch::default, |scratch, (leaf, acc, pot)| {
                near.leaf(tree, leaf, list.of(leaf as usize), scratch, acc, pot);
                let n = tree.cells[leaf as usize].count() as u64;
                list.of(leaf as usize)
                    .map(|s| n * tree.cells[s as usize].count() as u64)
                    .sum::<u64>()
            })
            .sum()
    }
}
