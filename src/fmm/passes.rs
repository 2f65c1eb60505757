//! The FMM's passes on the CPU (the host side of `gpu::passes`): P2M and M2M up the tree
//! (and for other ranks' cells that came without multipoles), M2L over the walk's list,
//! L2L down, L2P and P2P into the particles' accelerations — each parallel over cells with
//! rayon, in a fixed order so that the bits do not depend on the thread count.

use super::expansion::{M2L_LANES, Operators, V, add_lane};
use super::p2p::NearScratch;
use super::solver::FmmSolver;
use super::tree::{Cell, Tree};
use rayon::prelude::*;
use std::time::Instant;

/// `a - b`.
#[inline]
fn sub(a: [f64; 3], b: [f64; 3]) -> [f64; 3] {
    [a[0] - b[0], a[1] - b[1], a[2] - b[2]]
}

/// The parents' local expansions, for L2L into their children.
struct Downward<'a> {
    ops: &'a Operators,
    len: usize,
    cells: &'a [Cell],
    slot: &'a [u32],
    locals: &'a [f64],
}

impl Downward<'_> {
    /// L2L of the parent of the cells of `run` (`cell_of`; at most `M2L_LANES` entries
    /// whose cells share a parent, not the root) to each of them, into `rows`
    /// (`Operators::l2l_batch`: lane w is what `run[w]`'s local expansion gets).
    fn parents_to<T>(&self, run: &[T], cell_of: impl Fn(&T) -> u32, rows: &mut [V]) {
        let parent = self.cells[cell_of(&run[0]) as usize].parent as usize;
        let (centre, off) = (
            self.cells[parent].centre,
            self.slot[parent] as usize * self.len,
        );
        let mut s = [[0.0; 3]; M2L_LANES];
        for (s, item) in s.iter_mut().zip(run) {
            *s = sub(self.cells[cell_of(item) as usize].centre, centre);
        }
        self.ops
            .l2l_batch(&s, &self.locals[off..off + self.len], rows);
    }
}

/// `items` in runs of consecutive entries whose cells (`cell_of`) share a parent, at most
/// `M2L_LANES` long: the batches of one L2L.
fn sibling_runs<'a, T>(
    items: &'a mut [T],
    cells: &[Cell],
    cell_of: impl Fn(&T) -> u32,
) -> Vec<&'a mut [T]> {
    let parent = |item: &T| cells[cell_of(item) as usize].parent;
    items
        .chunk_by_mut(|a, b| parent(a) == parent(b))
        .flat_map(|run| run.chunks_mut(M2L_LANES))
        .collect()
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

/// Adds the multipoles of `parent`'s children (`multipole_of(child's cell index)`) to its
/// `m`, `M2L_LANES` children at a time (an octree cell has at most 8: one batch).
fn m2m_children<'a>(
    ops: &Operators,
    cells: &[Cell],
    parent: &Cell,
    multipole_of: impl Fn(usize) -> &'a [f64],
    m: &mut [f64],
) {
    let (first, count) = (parent.first_child as usize, parent.child_count as usize);
    for start in (first..first + count).step_by(M2L_LANES) {
        let batch = (first + count - start).min(M2L_LANES);
        let mut t = [[0.0; 3]; M2L_LANES];
        let mut children: [&[f64]; M2L_LANES] = [&[]; M2L_LANES];
        for w in 0..batch {
            t[w] = sub(cells[start + w].centre, parent.centre);
            children[w] = multipole_of(start + w);
        }
        ops.m2m_batch(&t, &children[..batch], m);
    }
}

/// A leaf and the slices of the sorted output arrays that belong to its particles.
type LeafOutput<'a> = (u32, &'a mut [[f64; 3]], &'a mut [f64]);

impl FmmSolver {
    /// The multipoles of a remote tree's cells that came without one (the sender sends
    /// multipoles only for the cells it sends neither particles nor children of): P2M from
    /// the particles, M2M from the children, deepest first. With f64 on the wire these are
    /// the sender's own bits (same operations in the same order).
    pub(super) fn rebuild_remote_multipoles(&mut self, first: usize, count: usize, len: usize) {
        let (tree, ops) = (&self.tree, &self.ops);
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
                let below: &[f64] = below;
                let multipole_of = |ch: usize| &below[(ch - c - 1) * len..(ch - c) * len];
                m2m_children(ops, &tree.cells, cell, multipole_of, m);
            }
        }
    }

    /// P2M at leaves, then M2M level by level towards the root.
    pub(super) fn upward(&mut self, len: usize) {
        let cells = self.tree.cells.len();
        self.multipoles.clear();
        self.multipoles.resize(cells * len, 0.0);
        let (tree, ops) = (&self.tree, &self.ops);
        for level in (0..tree.depth()).rev() {
            let (lo, hi) = (tree.level_start[level], tree.level_start[level + 1]);
            let (done, rest) = self.multipoles.split_at_mut(hi * len);
            let this_level = &mut done[lo * len..];
            let below: &[f64] = rest;
            this_level
                .par_chunks_mut(len)
                .enumerate()
                .for_each(|(i, m)| {
                    let cell = &tree.cells[lo + i];
                    if cell.is_leaf() {
                        p2m_leaf(ops, tree, cell, m);
                    } else {
                        let multipole_of = |ch: usize| &below[(ch - hi) * len..(ch - hi + 1) * len];
                        m2m_children(ops, &tree.cells, cell, multipole_of, m);
                    }
                });
        }
    }

    /// Adds M2L from the multipoles on cell `t`'s list to `local`, `M2L_LANES` at a time.
    fn m2l_into(&self, t: usize, len: usize, local: &mut [f64], zero: &[f64]) {
        let (tree, list, multipoles) = (&self.tree, &self.m2l, &self.multipoles);
        let target = tree.cells[t].centre;
        let mut sources = list.of(t);
        for _ in 0..list.len_of(t).div_ceil(M2L_LANES) {
            // Unused lanes get an empty multipole at a harmless offset.
            let mut r = [[0.0, 0.0, 1.0]; M2L_LANES];
            let mut m: [&[f64]; M2L_LANES] = [zero; M2L_LANES];
            for (w, s) in sources.by_ref().take(M2L_LANES).enumerate() {
                let c = tree.cells[s as usize].centre;
                r[w] = [target[0] - c[0], target[1] - c[1], target[2] - c[2]];
                m[w] = &multipoles[s as usize * len..(s as usize + 1) * len];
            }
            self.ops.m2l_batch(&r, &m, local);
        }
    }

    /// Numbers the own cells that have children: `locals` holds only theirs (a leaf's local
    /// expansion is summed in `leaf_pass` and used at once, ~7/8 of the cells: 23 bytes a
    /// particle at p = 9).
    fn number_internal_cells(&mut self) {
        let cells = &self.tree.cells[..self.tree.own_cells];
        self.internal.clear();
        self.internal
            .extend((0..cells.len() as u32).filter(|&c| !cells[c as usize].is_leaf()));
        self.local_slot.clear();
        self.local_slot.resize(cells.len(), u32::MAX);
        for (slot, &c) in self.internal.iter().enumerate() {
            self.local_slot[c as usize] = slot as u32;
        }
    }

    /// The local expansion of every own cell that has children, from the multipoles on its
    /// M2L list.
    pub(super) fn m2l_pass(&mut self, len: usize) {
        self.number_internal_cells();
        let mut locals = std::mem::take(&mut self.locals);
        locals.clear();
        locals.resize(self.internal.len() * len, 0.0);
        let zero = vec![0.0; len];
        locals
            .par_chunks_mut(len)
            .zip(self.internal.par_iter())
            .with_min_len(16)
            .for_each(|(local, &t)| self.m2l_into(t as usize, len, local, &zero));
        self.locals = locals;
    }

    /// Passes local expansions down the cells that have children, level by level.
    pub(super) fn l2l_pass(&mut self, len: usize) {
        let mut locals = std::mem::take(&mut self.locals);
        let tree = &self.tree;
        for level in 1..tree.depth() {
            let (lo, hi) = (tree.level_start[level], tree.level_start[level + 1]);
            let first = self.internal.partition_point(|&c| (c as usize) < lo);
            let last = self.internal.partition_point(|&c| (c as usize) < hi);
            // The parents are on the levels above: their slots come before `first`.
            let (above, rest) = locals.split_at_mut(first * len);
            let down = self.downward(above, len);
            let targets = &self.targets;
            let mut wanted: Vec<(u32, &mut [f64])> = rest[..(last - first) * len]
                .chunks_mut(len)
                .zip(self.internal[first..last].iter().copied())
                .filter(|(_, c)| targets.get(*c as usize) != Some(&false))
                .map(|(local, c)| (c, local))
                .collect();
            sibling_runs(&mut wanted, &tree.cells, |(c, _)| *c)
                .into_par_iter()
                .for_each_init(
                    || vec![[0.0; M2L_LANES]; len],
                    |rows, run| {
                        down.parents_to(run, |(c, _)| *c, rows);
                        for (w, (_, local)) in run.iter_mut().enumerate() {
                            add_lane(rows, w, local);
                        }
                    },
                );
        }
        self.locals = locals;
    }

    /// L2L from the parents' local expansions in `locals` (slots of `local_slot`).
    fn downward<'a>(&'a self, locals: &'a [f64], len: usize) -> Downward<'a> {
        Downward {
            ops: &self.ops,
            len,
            cells: &self.tree.cells,
            slot: &self.local_slot,
            locals,
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

    /// Each target leaf's local expansion — M2L from its list, then L2L from its parent, the
    /// operations `m2l_pass` and `l2l_pass` do for the other cells, in the same order —
    /// evaluated at once at its particles (L2P), writing `acc` and `pot` (in tree order; the
    /// particles of leaves that are not targets are left as they are). Returns the threads'
    /// seconds in M2L and in L2L + L2P, to tell the phases apart.
    pub(super) fn leaf_pass(&self, len: usize, acc: &mut [[f64; 3]], pot: &mut [f64]) -> [f64; 2] {
        let g = self.settings.g;
        let (tree, ops) = (&self.tree, &self.ops);
        let targets = &self.targets;
        let down = self.downward(&self.locals, len);
        let zero = vec![0.0; len];
        let mut wanted: Vec<LeafOutput> = Self::leaf_slices(tree, acc, pot)
            .into_iter()
            .filter(|(leaf, _, _)| targets.get(*leaf as usize) != Some(&false))
            .collect();
        sibling_runs(&mut wanted, &tree.cells, |(leaf, _, _)| *leaf)
            .into_par_iter()
            .map_init(
                || (vec![0.0; len], vec![[0.0; M2L_LANES]; len]),
                |(local, rows), run| {
                    let start = Instant::now();
                    let leaf_of = |(leaf, _, _): &LeafOutput| *leaf;
                    let below_root = tree.cells[leaf_of(&run[0]) as usize].level > 0;
                    if below_root {
                        down.parents_to(run, leaf_of, rows);
                    }
                    let mut seconds = [0.0, start.elapsed().as_secs_f64()];
                    for (w, (leaf, acc, pot)) in run.iter_mut().enumerate() {
                        let leaf = *leaf;
                        let start = Instant::now();
                        let cell = &tree.cells[leaf as usize];
                        local.fill(0.0);
                        self.m2l_into(leaf as usize, len, local, &zero);
                        let m2l_done = Instant::now();
                        if below_root {
                            add_lane(rows, w, local);
                        }
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
                        seconds[0] += (m2l_done - start).as_secs_f64();
                        seconds[1] += m2l_done.elapsed().as_secs_f64();
                    }
                    seconds
                },
            )
            .reduce(|| [0.0; 2], |a, b| [a[0] + b[0], a[1] + b[1]])
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
