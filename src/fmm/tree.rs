//! The octree: particles sorted by (Morton key, ID), cells as key prefixes with contiguous
//! particle ranges, split while they hold more than `leaf_size` particles. Cells are stored
//! level by level (breadth first) with the children of a cell contiguous, so every pass can
//! run one level at a time in parallel.
//!
//! At ~830 lines without its tests this file is one structure that reads best whole: the
//! sort, the split into cells, the adopted device cells and the moments all keep the same
//! layout invariants (breadth-first levels, contiguous children, f32-representable
//! geometry) stated once here.

use super::morton::{BoundingCube, MAX_LEVEL, digit, extremes};
use rayon::prelude::*;

/// One octree cell.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Cell {
    /// Expansion centre: the centre of mass, rounded to the nearest f32.
    pub centre: [f64; 3],
    /// Largest distance of any of its particles from `centre`, rounded up to an f32 (a
    /// rigorous bounding sphere).
    pub r_max: f64,
    /// Total mass.
    pub mass: f64,
    /// The weakest acceleration any of its particles is expected to feel (an f32 value,
    /// rounded down), which the error-controlled MAC holds each interaction's error to a
    /// fraction of; 0 when not known (the MAC is then geometric only).
    pub accel: f64,
    /// First particle (in sorted order).
    pub begin: u32,
    /// One past the last particle.
    pub end: u32,
    /// Index of the first child (children are contiguous); unused for leaves.
    pub first_child: u32,
    /// Number of children; 0 for a leaf.
    pub child_count: u8,
    /// Depth (root = 0).
    pub level: u8,
    /// Index of the parent (the root points to itself).
    pub parent: u32,
    /// Another rank's cell that has children there, none of which were sent: it only ever
    /// acts as a multipole here.
    pub opaque: bool,
}

impl Cell {
    /// True when the cell has no children (here).
    #[inline]
    pub fn is_leaf(&self) -> bool {
        self.child_count == 0
    }

    /// True when the cell is a leaf of its rank's tree (an opaque remote cell is not): the
    /// walks decide by this, so that every rank decides alike about the same cell.
    #[inline]
    pub fn is_tree_leaf(&self) -> bool {
        self.child_count == 0 && !self.opaque
    }

    /// Particles in the cell.
    #[inline]
    pub fn count(&self) -> usize {
        (self.end - self.begin) as usize
    }

    /// Indices of the children.
    #[inline]
    pub fn children(&self) -> std::ops::Range<u32> {
        self.first_child..self.first_child + self.child_count as u32
    }
}

/// Particles in tree order plus the cells over them.
#[derive(Debug, Default)]
pub struct Tree {
    /// Cells, breadth first.
    pub cells: Vec<Cell>,
    /// `cells[level_start[l]..level_start[l + 1]]` are the cells of level `l`.
    pub level_start: Vec<usize>,
    /// Leaf cell indices, in particle order.
    pub leaves: Vec<u32>,
    /// Sorted position → index in the caller's arrays.
    pub order: Vec<u32>,
    /// Positions in sorted order.
    pub pos: Vec<[f64; 3]>,
    /// Masses in sorted order.
    pub mass: Vec<f64>,
    /// Softening lengths in sorted order, when they differ between particles (empty when
    /// one length serves all).
    pub eps: Vec<f64>,
    /// Morton keys of the particles, in sorted order.
    pub keys: Vec<u64>,
    /// The cube the keys refer to.
    pub cube: Option<BoundingCube>,
    /// Cells of this tree's own particles; cells after them were appended from other ranks
    /// (`append_remote`) and only ever act as sources.
    pub own_cells: usize,
    /// Particles owned by this tree; those after them came with remote cells.
    pub own_particles: usize,
    /// (key, index) records of the last sort, kept so that every build sorts in the same
    /// memory.
    sort_scratch: Vec<(u64, u32)>,
}

/// Particles already keyed and sorted by key where they are (on a device), for
/// `Tree::adopt_sorted`: equal keys in particle-index order, every array in sorted order.
/// Positions and masses are either all there or left out (both empty): then they stay where
/// the sort ran, and the cells' moments must come from there too (`Tree::set_moments`).
#[derive(Debug, Clone, Default)]
pub struct SortedParticles {
    /// The cube the keys refer to.
    pub cube: Option<BoundingCube>,
    /// Morton keys, non-decreasing.
    pub keys: Vec<u64>,
    /// Sorted position → index in the caller's arrays.
    pub order: Vec<u32>,
    /// Positions in sorted order (or none).
    pub pos: Vec<[f64; 3]>,
    /// Masses in sorted order (or none).
    pub mass: Vec<f64>,
}

/// `SortedParticles` that are not what they claim (arrays of different lengths, a key
/// smaller than the one before it, or an index outside the caller's particles), or cells
/// split elsewhere that are not a tree of them (`Tree::adopt_cells`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the sorted particles or their cells are not a tree of the run's particles ({0})")]
pub struct NotSorted(pub &'static str);

/// What a pass over `n` sorted keys and their particle indices finds, for the checks of a
/// sort made elsewhere (kernels/split.cu: sort_scan): counts of adjacent keys out of order
/// and equal, the largest index, and the sums of the indices and of their squares modulo
/// 2^64.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SortSummary {
    /// Adjacent pairs with the first key larger.
    pub out_of_order: u64,
    /// Adjacent pairs with equal keys (runs that `adopt_sorted` orders by id).
    pub equal_neighbours: u64,
    /// The largest particle index.
    pub largest: u64,
    /// Sum of the indices, modulo 2^64.
    pub sum: u64,
    /// Sum of the squared indices, modulo 2^64.
    pub squares: u64,
}

impl SortSummary {
    /// Fails unless the keys are in order and the indices are those of `n` particles, each
    /// once: below n, with the sums of 0..n (a sort that lost one record and wrote another
    /// twice would have to keep both sums).
    pub fn check(&self, n: usize) -> Result<(), NotSorted> {
        if self.out_of_order > 0 {
            return Err(NotSorted("keys out of order"));
        }
        if n > 0 && self.largest >= n as u64 {
            return Err(NotSorted("an index past the particles"));
        }
        let (m, last) = (n as u128, (n as u128).saturating_sub(1));
        if (self.sum, self.squares)
            != (
                (m * last / 2) as u64,
                (last * m * (2 * last + 1) / 6) as u64,
            )
        {
            return Err(NotSorted("an index twice"));
        }
        Ok(())
    }
}

/// A tree's cells as columns (breadth first), the form a device splits them in
/// (`Tree::adopt_cells`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CellColumns {
    /// Each cell's first particle.
    pub begin: Vec<u32>,
    /// One past each cell's last particle.
    pub end: Vec<u32>,
    /// Each cell's first child (0 for a leaf).
    pub first_child: Vec<u32>,
    /// Each cell's number of children.
    pub child_count: Vec<u32>,
    /// Where each level's cells start, then the number of cells.
    pub level_start: Vec<usize>,
}

/// Values of a cell's moments as `Tree::set_moments` takes them: mass, centre (3), r_max.
pub const MOMENT_VALUES: usize = 5;

/// Moments for a different number of cells than the tree has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("moments for {given} cells given to a tree of {cells}")]
pub struct WrongMoments {
    /// Cells the moments were for.
    pub given: usize,
    /// Cells of the tree.
    pub cells: usize,
}

/// The tree needed more cells than its cap allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CellsOverflow {
    /// At least this many cells are needed.
    pub needed: usize,
}

impl Tree {
    /// The smallest cube around `pos` (min/max reductions: independent of order and threads).
    pub fn bounding_cube(pos: &[[f64; 3]]) -> BoundingCube {
        let (lo, hi) = extremes(pos);
        BoundingCube::around(lo, hi)
    }

    /// Sorts the particles by (key, id) in `cube` (their own bounding cube if none: ranks of
    /// a distributed run pass the global one so that keys agree) and builds the cells,
    /// reusing this tree's buffers. Fails without building when the tree would exceed
    /// `cells_cap` cells.
    pub fn build(
        &mut self,
        pos: &[[f64; 3]],
        mass: &[f64],
        id: &[u64],
        cube: Option<BoundingCube>,
        leaf_size: usize,
        cells_cap: usize,
    ) -> Result<(), CellsOverflow> {
        let n = pos.len();
        let cube = cube.unwrap_or_else(|| Self::bounding_cube(pos));
        self.cube = Some(cube);
        // (key, index) records sorted on the key, then the rare runs of equal keys (particles
        // in the same grid cell of 2^-21 of the cube's side) sorted by id, so that the order never depends on the
        // input order. Comparing the keys inside the records (no lookup of `id` through the
        // index) and keeping the buffer between builds (fresh memory costs more in page
        // faults than the keys take to compute) halved the build at N = 1e7.
        let mut sort_keys = std::mem::take(&mut self.sort_scratch);
        sort_keys.clear();
        sort_keys.par_extend((0..n).into_par_iter().map(|i| (cube.key(pos[i]), i as u32)));
        sort_keys.par_sort_unstable_by_key(|k| k.0);
        sort_keys
            .par_chunk_by_mut(|a, b| a.0 == b.0)
            .filter(|run| run.len() > 1)
            .for_each(|run| run.sort_unstable_by_key(|k| id[k.1 as usize]));
        self.order.clear();
        self.order.par_extend(sort_keys.par_iter().map(|k| k.1));
        self.keys.clear();
        self.keys.par_extend(sort_keys.par_iter().map(|k| k.0));
        self.sort_scratch = sort_keys;
        self.pos.clear();
        self.pos
            .par_extend(self.order.par_iter().map(|&i| pos[i as usize]));
        self.mass.clear();
        self.mass
            .par_extend(self.order.par_iter().map(|&i| mass[i as usize]));
        self.build_cells(leaf_size, cells_cap)
    }

    /// Takes the particles of `sorted` (sorted by key, equal keys in index order) as this
    /// tree's, in `build`'s order: the rare runs of equal keys are ordered by `id` here. The
    /// buffers are swapped, so `sorted` gets this tree's previous ones to fill next time.
    /// The cells are left to `build_cells`. True when a run of equal keys changed order
    /// (the tree's order is then not the sorter's). Without positions and masses in
    /// `sorted`, the tree has none either.
    pub fn adopt_sorted(
        &mut self,
        sorted: &mut SortedParticles,
        id: &[u64],
    ) -> Result<bool, NotSorted> {
        let n = sorted.keys.len();
        let (p, m) = (sorted.pos.len(), sorted.mass.len());
        let particles = (p == n && m == n) || (p == 0 && m == 0);
        if sorted.order.len() != n || !particles {
            return Err(NotSorted("arrays of different lengths"));
        }
        if n != id.len() {
            return Err(NotSorted("not as many as the particles"));
        }
        // One pass over keys and order: keys in order, every index below n and each once
        // (the sums of the indices and of their squares, modulo 2^64, are those of 0..n: a
        // sort that lost one record and wrote another twice would have to keep both sums),
        // and where the runs of equal keys start.
        let scan = SortScan::of(&sorted.keys, &sorted.order);
        SortSummary {
            out_of_order: u64::from(scan.out_of_order),
            equal_neighbours: 0,
            largest: u64::from(scan.largest),
            sum: scan.sum,
            squares: scan.squares,
        }
        .check(n)?;
        let cube = sorted.cube.ok_or(NotSorted("no cube"))?;
        std::mem::swap(&mut self.keys, &mut sorted.keys);
        std::mem::swap(&mut self.order, &mut sorted.order);
        std::mem::swap(&mut self.pos, &mut sorted.pos);
        std::mem::swap(&mut self.mass, &mut sorted.mass);
        self.cube = Some(cube);
        let run_starts = scan.run_starts;
        let with_particles = !self.pos.is_empty();
        let mut run = Vec::new();
        let mut reordered = false;
        for start in run_starts {
            let end = start + self.keys[start..].partition_point(|&k| k == self.keys[start]);
            run.clear();
            run.extend((start..end).map(|s| (id[self.order[s] as usize], s)));
            if run.is_sorted_by_key(|r| r.0) {
                continue;
            }
            reordered = true;
            run.sort_unstable_by_key(|r| r.0);
            let order: Vec<u32> = run.iter().map(|r| self.order[r.1]).collect();
            self.order[start..end].copy_from_slice(&order);
            if with_particles {
                let pos: Vec<[f64; 3]> = run.iter().map(|r| self.pos[r.1]).collect();
                let mass: Vec<f64> = run.iter().map(|r| self.mass[r.1]).collect();
                self.pos[start..end].copy_from_slice(&pos);
                self.mass[start..end].copy_from_slice(&mass);
            }
        }
        Ok(reordered)
    }

    /// Sets every cell's mass, centre and radius from `moments` (mass, centre, r_max per
    /// cell, in cell order): the values of `compute_moments`, found where the particles are
    /// when this tree holds none (`adopt_sorted` without positions).
    pub fn set_moments(&mut self, moments: &[[f64; MOMENT_VALUES]]) -> Result<(), WrongMoments> {
        if moments.len() != self.cells.len() {
            return Err(WrongMoments {
                given: moments.len(),
                cells: self.cells.len(),
            });
        }
        self.cells
            .par_iter_mut()
            .zip(moments)
            .with_min_len(4096)
            .for_each(|(cell, m)| {
                cell.mass = m[0];
                cell.centre = [m[1], m[2], m[3]];
                cell.r_max = m[4];
            });
        Ok(())
    }

    /// Sets every own cell's `accel` to the smallest of `expected` (a magnitude per
    /// particle, in the caller's order as given to `build`) over its particles, rounded
    /// down to an f32 (other ranks receive it in f32 and must decide alike on it). A build
    /// leaves every cell's `accel` at 0 (unknown: the MAC is then geometric only).
    pub fn set_expected_accel(&mut self, expected: &[f32]) {
        let order = std::mem::take(&mut self.order);
        self.set_expected_with(|i| expected[order[i as usize] as usize]);
        self.order = order;
    }

    /// `set_expected_accel` with `expected` in tree order (one value per sorted particle):
    /// no gather through `order`.
    pub fn set_expected_accel_sorted(&mut self, expected: &[f32]) {
        self.set_expected_with(|i| expected[i as usize]);
    }

    /// Sets every cell's `accel` from the expected acceleration of sorted particle i,
    /// `expected_at(i)`.
    fn set_expected_with(&mut self, expected_at: impl Fn(u32) -> f32 + Sync) {
        let weakest = |b: u32, e: u32| {
            (b..e)
                .map(|i| f64::from(expected_at(i)))
                .fold(f64::INFINITY, f64::min)
        };
        // Deepest level first, each cell from its children (the leaves from particles).
        for level in (0..self.depth()).rev() {
            let (lo, hi) = (self.level_start[level], self.level_start[level + 1]);
            let (done, rest) = self.cells.split_at_mut(hi);
            let this_level = &mut done[lo..];
            this_level
                .par_iter_mut()
                .with_min_len(256)
                .for_each(|cell| {
                    cell.accel = if cell.is_leaf() {
                        f32_at_most(weakest(cell.begin, cell.end))
                    } else {
                        cell.children()
                            .map(|ch| rest[ch as usize - hi].accel)
                            .fold(f64::INFINITY, f64::min)
                    };
                });
        }
    }

    /// Each cell's mass, centre and radius, as `set_moments` takes them.
    pub fn moments(&self) -> Vec<[f64; MOMENT_VALUES]> {
        self.cells
            .iter()
            .map(|c| [c.mass, c.centre[0], c.centre[1], c.centre[2], c.r_max])
            .collect()
    }

    /// Splits the sorted particles into cells (at most `leaf_size` particles in a leaf),
    /// level by level: every cell of a level finds its children's particle ranges in
    /// parallel, then the children are numbered in the order of their parents (breadth
    /// first, the numbering a serial split gives). Fails when the tree would exceed `cap`
    /// cells.
    pub fn build_cells(&mut self, leaf_size: usize, cap: usize) -> Result<(), CellsOverflow> {
        let leaf_size = leaf_size.max(1);
        self.cells.clear();
        self.level_start.clear();
        self.leaves.clear();
        let n = self.keys.len();
        if cap == 0 {
            return Err(CellsOverflow { needed: 1 });
        }
        self.cells.push(Cell {
            begin: 0,
            end: n as u32,
            ..Cell::default()
        });
        self.level_start.push(0);
        let mut lo = 0;
        loop {
            let hi = self.cells.len();
            let keys = &self.keys;
            let splits: Vec<Split> = self.cells[lo..hi]
                .par_iter()
                .with_min_len(256)
                .map(|cell| Split::of(cell, keys, leaf_size))
                .collect();
            let children: usize = splits.iter().map(|s| s.count as usize).sum();
            if children == 0 {
                break;
            }
            if hi + children > cap {
                return Err(CellsOverflow { needed: cap + 1 });
            }
            self.level_start.push(hi);
            for (i, split) in (lo..hi).zip(&splits) {
                if split.count == 0 {
                    continue;
                }
                let first = self.cells.len() as u32;
                let parent = &mut self.cells[i];
                parent.first_child = first;
                parent.child_count = split.count;
                let level = parent.level + 1;
                for &(begin, end) in &split.ranges[..split.count as usize] {
                    self.cells.push(Cell {
                        begin,
                        end,
                        level,
                        parent: i as u32,
                        ..Cell::default()
                    });
                }
            }
            lo = hi;
        }
        self.level_start.push(self.cells.len());
        self.own_cells = self.cells.len();
        self.own_particles = n;
        self.list_leaves();
        Ok(())
    }

    /// Lists the leaves in particle order (every leaf's range follows the previous one's):
    /// depth first, children in octant order, which is their particles' order.
    fn list_leaves(&mut self) {
        self.leaves.clear();
        let mut stack = vec![0u32];
        while let Some(c) = stack.pop() {
            let cell = &self.cells[c as usize];
            if cell.is_leaf() {
                self.leaves.push(c);
            } else {
                stack.extend(cell.children().rev());
            }
        }
    }

    /// This tree's own cells as columns (`adopt_cells` takes them back).
    pub fn cell_columns(&self) -> CellColumns {
        let own = &self.cells[..self.own_cells];
        CellColumns {
            begin: own.iter().map(|c| c.begin).collect(),
            end: own.iter().map(|c| c.end).collect(),
            first_child: own.iter().map(|c| c.first_child).collect(),
            child_count: own.iter().map(|c| u32::from(c.child_count)).collect(),
            level_start: self.level_start.clone(),
        }
    }

    /// Takes the cells a device split `n` sorted particles into (in `cube`, at most
    /// `leaf_size` particles a leaf) as this tree's, the particles staying there: no keys,
    /// order, positions or masses here, the moments to come from there
    /// (`Tree::set_moments`). Fails unless the columns form the tree `build_cells` makes of
    /// some sorted particles: the root holds all n, every level's children are the next
    /// level's cells in their parents' order, each cell's children split its range into
    /// consecutive non-empty ranges, and a cell splits exactly when it holds more than
    /// `leaf_size` above the deepest level. (Where the splits fall is the device's word.)
    pub fn adopt_cells(
        &mut self,
        cube: BoundingCube,
        n: usize,
        columns: &CellColumns,
        leaf_size: usize,
    ) -> Result<(), NotSorted> {
        let CellColumns {
            begin,
            end,
            first_child,
            child_count,
            level_start,
        } = columns;
        let cells = begin.len();
        let bad = |why| Err(NotSorted(why));
        if [end.len(), first_child.len(), child_count.len()] != [cells; 3] {
            return bad("cell columns of different lengths");
        }
        if cells == 0
            || level_start.first() != Some(&0)
            || level_start.last() != Some(&cells)
            || !level_start.is_sorted()
            || level_start.len() > MAX_LEVEL as usize + 2
        {
            return bad("levels that do not cover the cells");
        }
        if (begin[0], end[0]) != (0, n as u32) || n > u32::MAX as usize {
            return bad("a root that does not hold every particle");
        }
        let leaf_size = leaf_size.max(1);
        self.cells.clear();
        self.cells.reserve(cells);
        self.cells.push(Cell {
            begin: 0,
            end: n as u32,
            ..Cell::default()
        });
        for level in 0..level_start.len() - 1 {
            let mut next = level_start[level + 1];
            for c in level_start[level]..level_start[level + 1] {
                let (count, children) = (end[c].wrapping_sub(begin[c]), child_count[c]);
                let splits = count as usize > leaf_size && (level as u32) < MAX_LEVEL;
                if splits != (children > 0) || children > 8 {
                    return bad("a cell split against the leaf size");
                }
                let (first, stop) = (next, next + children as usize);
                if children > 0 && (first_child[c] as usize != first || stop > cells) {
                    return bad("children out of their parents' order");
                }
                let mut at = begin[c];
                for child in first..stop {
                    if begin[child] != at || end[child] <= at {
                        return bad("children that do not split their parent's particles");
                    }
                    at = end[child];
                    self.cells.push(Cell {
                        begin: begin[child],
                        end: end[child],
                        level: level as u8 + 1,
                        parent: c as u32,
                        ..Cell::default()
                    });
                }
                if children > 0 && at != end[c] {
                    return bad("children that do not split their parent's particles");
                }
                let cell = &mut self.cells[c];
                cell.first_child = if children > 0 { first as u32 } else { 0 };
                cell.child_count = children as u8;
                next = stop;
            }
            if next != level_start[(level + 2).min(level_start.len() - 1)] {
                return bad("a level whose cells are not the children of the one above");
            }
        }
        self.level_start.clone_from(level_start);
        self.own_cells = cells;
        self.own_particles = n;
        self.list_leaves();
        self.order.clear();
        self.keys.clear();
        self.pos.clear();
        self.mass.clear();
        self.eps.clear();
        self.cube = Some(cube);
        Ok(())
    }

    /// Zero positions and masses for the own particles, whose real ones a device holds
    /// (`FmmSolver::plan_split_with`): the other ranks' particles appended after them land
    /// at the right places, and the exchange's export lists them (the devices send the real
    /// ones).
    pub fn hold_placeholders(&mut self) {
        self.pos.clear();
        self.pos.resize(self.own_particles, [0.0; 3]);
        self.mass.clear();
        self.mass.resize(self.own_particles, 0.0);
    }

    /// Appends cells received from another rank (children and particle ranges relative to
    /// the appended slices) with their particles; returns the index of the first appended
    /// cell. Appended cells are sources only: they take no part in the level passes.
    pub fn append_remote(
        &mut self,
        cells: &[Cell],
        pos: &[[f64; 3]],
        mass: &[f64],
        eps: &[f64],
    ) -> u32 {
        self.eps.extend_from_slice(eps);
        let (cell_base, particle_base) = (self.cells.len() as u32, self.pos.len() as u32);
        self.cells.extend(cells.iter().map(|c| Cell {
            begin: c.begin + particle_base,
            end: c.end + particle_base,
            first_child: c.first_child + cell_base,
            ..*c
        }));
        self.pos.extend_from_slice(pos);
        self.mass.extend_from_slice(mass);
        cell_base
    }

    /// For each own cell, whether it holds a particle flagged in `flags` (the caller's
    /// order, as given to `build`).
    pub fn cells_holding(&self, flags: &[bool]) -> Vec<bool> {
        let mut before = Vec::with_capacity(self.own_particles + 1);
        before.push(0u32);
        let mut count = 0;
        for &orig in &self.order {
            count += u32::from(flags[orig as usize]);
            before.push(count);
        }
        self.cells[..self.own_cells]
            .iter()
            .map(|c| before[c.end as usize] > before[c.begin as usize])
            .collect()
    }

    /// Moves every own particle to its position as other ranks receive it
    /// (`quantise_position` in its leaf; the cells' centres and radii stay as they are). A
    /// rank of a distributed evaluation then uses these positions for every purpose, its
    /// multipoles, near pairs and targets alike, so that each particle is at the same place
    /// for every rank: the ranks' mutual forces stay mirror images and momentum stays
    /// conserved, however coarse the rounding.
    pub fn quantise_own_positions(&mut self) {
        for &leaf in &self.leaves {
            let c = self.cells[leaf as usize];
            for x in &mut self.pos[c.begin as usize..c.end as usize] {
                *x = dequantise_position(
                    quantise_position(*x, c.centre, c.r_max),
                    c.centre,
                    c.r_max,
                );
            }
        }
    }

    /// Number of levels.
    pub fn depth(&self) -> usize {
        self.level_start.len() - 1
    }

    /// Fills mass, centre of mass and bounding r_max of every cell, deepest level first.
    pub fn compute_moments(&mut self) {
        for level in (0..self.depth()).rev() {
            let (lo, hi) = (self.level_start[level], self.level_start[level + 1]);
            let (done, rest) = self.cells.split_at_mut(hi);
            let (_, this_level) = done.split_at_mut(lo);
            let deeper = Deeper {
                cells: rest,
                first: hi,
            };
            let (pos, mass) = (&self.pos, &self.mass);
            this_level.par_iter_mut().for_each(|cell| {
                let (b, e) = (cell.begin as usize, cell.end as usize);
                let (m, c) = if cell.is_leaf() {
                    let mut m = 0.0;
                    let mut s = [0.0; 3];
                    for i in b..e {
                        m += mass[i];
                        for k in 0..3 {
                            s[k] += mass[i] * pos[i][k];
                        }
                    }
                    (m, s)
                } else {
                    let mut m = 0.0;
                    let mut s = [0.0; 3];
                    for ch in cell.children() {
                        let child = deeper.get(ch);
                        m += child.mass;
                        for k in 0..3 {
                            s[k] += child.mass * child.centre[k];
                        }
                    }
                    (m, s)
                };
                cell.mass = m;
                // A cell of massless particles (test points evaluated with the sources) has
                // no centre of mass: its particles' mean stands in, so that its local
                // expansion is taken among them (its multipoles are zero either way).
                let (c, m) = if m > 0.0 {
                    (c, m)
                } else {
                    let mut s = [0.0; 3];
                    for x in &pos[b..e] {
                        for k in 0..3 {
                            s[k] += x[k];
                        }
                    }
                    (s, (e - b) as f64)
                };
                // Geometry in f32-representable values: other ranks receive it in f32 and
                // must see the same bits as the owner (their walks decide alike on it).
                cell.centre = [c[0] / m, c[1] / m, c[2] / m].map(|v| f64::from(v as f32));
                let r2 = if cell.is_leaf() {
                    farthest_r2(cell.centre, &pos[b..e], 0.0)
                } else {
                    deeper.farthest_r2(cell, pos)
                };
                cell.r_max = f32_at_least(r2.sqrt());
            });
        }
    }
}

/// What one pass over sorted keys and their particle indices finds (`Tree::adopt_sorted`).
#[derive(Default)]
struct SortScan {
    /// A key below the one before it.
    out_of_order: bool,
    /// The largest index.
    largest: u32,
    /// Sum of the indices, and of their squares, modulo 2^64.
    sum: u64,
    squares: u64,
    /// Where each run of two or more equal keys starts, in increasing order.
    run_starts: Vec<usize>,
}

impl SortScan {
    /// Records per task of the pass.
    const CHUNK: usize = 1 << 16;

    fn of(keys: &[u64], order: &[u32]) -> SortScan {
        let chunks = keys.len().div_ceil(Self::CHUNK);
        (0..chunks)
            .into_par_iter()
            .map(|c| {
                let (lo, hi) = (c * Self::CHUNK, ((c + 1) * Self::CHUNK).min(keys.len()));
                let mut scan = SortScan::default();
                for &i in &order[lo..hi] {
                    scan.largest = scan.largest.max(i);
                    scan.sum = scan.sum.wrapping_add(u64::from(i));
                    scan.squares = scan.squares.wrapping_add(u64::from(i) * u64::from(i));
                }
                for j in lo.max(1)..hi {
                    let (a, b) = (keys[j - 1], keys[j]);
                    scan.out_of_order |= a > b;
                    if a == b && (j == 1 || keys[j - 2] != a) {
                        scan.run_starts.push(j - 1);
                    }
                }
                scan
            })
            .reduce(SortScan::default, |mut a, b| {
                a.out_of_order |= b.out_of_order;
                a.largest = a.largest.max(b.largest);
                a.sum = a.sum.wrapping_add(b.sum);
                a.squares = a.squares.wrapping_add(b.squares);
                a.run_starts.extend(b.run_starts);
                a
            })
    }
}

/// The children a cell splits into: their particle ranges, in octant order.
struct Split {
    ranges: [(u32, u32); 8],
    count: u8,
}

impl Split {
    /// The non-empty octants of `cell` (none when it is a leaf: at most `leaf_size`
    /// particles, or at the deepest level), from the sorted `keys`.
    fn of(cell: &Cell, keys: &[u64], leaf_size: usize) -> Split {
        let mut split = Split {
            ranges: [(0, 0); 8],
            count: 0,
        };
        let level = cell.level as u32;
        if cell.count() <= leaf_size || level >= MAX_LEVEL {
            return split;
        }
        let keys = &keys[cell.begin as usize..cell.end as usize];
        let mut start = 0;
        for d in 0..8u64 {
            let stop = start + keys[start..].partition_point(|&k| digit(k, level + 1) <= d);
            if stop > start {
                split.ranges[split.count as usize] =
                    (cell.begin + start as u32, cell.begin + stop as u32);
                split.count += 1;
            }
            start = stop;
        }
        split
    }
}

/// The cells below the level `compute_moments` is working on (their moments are final).
struct Deeper<'a> {
    cells: &'a [Cell],
    /// Index of `cells[0]` in the tree.
    first: usize,
}

/// Relative slack on the bound that lets `Deeper::farthest_r2` skip a subtree: far above
/// the rounding of the distances, so a skipped particle is never the farthest.
const BOUND_SLACK: f64 = 1e-9;

impl Deeper<'_> {
    fn get(&self, cell: u32) -> &Cell {
        &self.cells[cell as usize - self.first]
    }

    /// The largest squared distance of `cell`'s particles from its centre: a branch and
    /// bound over its subtree that scans only the leaves whose bounding sphere reaches past
    /// the farthest particle found so far (nearest-bound-last, so the farthest are found
    /// first). The same value as scanning every particle, at a fraction of the cost: a scan
    /// per level would read every particle once per level.
    fn farthest_r2(&self, cell: &Cell, pos: &[[f64; 3]]) -> f64 {
        let centre = cell.centre;
        let mut best: f64 = 0.0;
        let mut stack: Vec<(f64, u32)> = Vec::with_capacity(64);
        let push_children = |parent: &Cell, stack: &mut Vec<(f64, u32)>| {
            let start = stack.len();
            for ch in parent.children() {
                let c = self.get(ch);
                let d = distance(c.centre, centre);
                stack.push(((d + c.r_max) * (1.0 + BOUND_SLACK), ch));
            }
            stack[start..].sort_unstable_by(|a, b| a.0.total_cmp(&b.0));
        };
        push_children(cell, &mut stack);
        while let Some((bound, ch)) = stack.pop() {
            if bound * bound <= best {
                continue;
            }
            let c = self.get(ch);
            if c.is_leaf() {
                best = farthest_r2(centre, &pos[c.begin as usize..c.end as usize], best);
            } else {
                push_children(c, &mut stack);
            }
        }
        best
    }
}

/// The largest of `start` and the squared distances of `pos` from `centre`.
fn farthest_r2(centre: [f64; 3], pos: &[[f64; 3]], start: f64) -> f64 {
    let mut r2 = start;
    for x in pos {
        let d = [x[0] - centre[0], x[1] - centre[1], x[2] - centre[2]];
        r2 = r2.max(d[0] * d[0] + d[1] * d[1] + d[2] * d[2]);
    }
    r2
}

/// Euclidean distance.
fn distance(a: [f64; 3], b: [f64; 3]) -> f64 {
    let d = [a[0] - b[0], a[1] - b[1], a[2] - b[2]];
    (d[0] * d[0] + d[1] * d[1] + d[2] * d[2]).sqrt()
}

/// Bits of a position coordinate as other ranks receive it (sign included): a rounding of
/// at most 4e-6 of the leaf's radius, far below the FMM's error. Every rank of a
/// distributed evaluation puts its particles there for all purposes, so the rounding costs
/// no symmetry (on the galaxy, 16 bits kept momentum conservation too but moved the K = 4
/// run measurably away from the K = 1 one; docs/benchmarks.md).
pub const WIRE_POSITION_BITS: u32 = 18;

/// Steps either side of a leaf's centre in a position coordinate as other ranks receive it.
const WIRE_POSITION_STEPS: f64 = ((1 << (WIRE_POSITION_BITS - 1)) - 1) as f64;

/// `position` (in a leaf with `centre` and `r_max`) as other ranks receive it: 18-bit
/// offsets from the centre in units of `r_max / (2^17 - 1)` (every coordinate of a leaf's
/// particle lies within `r_max` of its centre). `dequantise_position` gives the position
/// they stand for, the same bits on every rank.
pub fn quantise_position(position: [f64; 3], centre: [f64; 3], r_max: f64) -> [i32; 3] {
    let step = r_max / WIRE_POSITION_STEPS;
    std::array::from_fn(|k| {
        if step > 0.0 {
            ((position[k] - centre[k]) / step)
                .round()
                .clamp(-WIRE_POSITION_STEPS, WIRE_POSITION_STEPS) as i32
        } else {
            0
        }
    })
}

/// The position `quantise_position`'s offsets stand for.
pub fn dequantise_position(q: [i32; 3], centre: [f64; 3], r_max: f64) -> [f64; 3] {
    let step = r_max / WIRE_POSITION_STEPS;
    std::array::from_fn(|k| centre[k] + f64::from(q[k]) * step)
}

/// The largest f32 value not above `x` (0 for a negative or NaN `x`).
/// An acceleration magnitude as `set_expected_accel` takes it: rounded down to an f32, 0 for
/// none or a negative one, and infinite (ignored by the cells' minimum) for NaN.
pub fn expected_f32(x: f64) -> f32 {
    if x.is_nan() {
        f32::INFINITY
    } else {
        f32_at_most(x) as f32
    }
}

fn f32_at_most(x: f64) -> f64 {
    if x.is_nan() || x <= 0.0 {
        return 0.0;
    }
    let y = x as f32;
    if f64::from(y) > x {
        f64::from(y.next_down())
    } else {
        f64::from(y)
    }
}

/// The smallest f32-representable value not below `x` (a radius rounded up still bounds).
fn f32_at_least(x: f64) -> f64 {
    let y = x as f32;
    if f64::from(y) < x {
        f64::from(y.next_up())
    } else {
        f64::from(y)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounding_cube_is_that_of_the_extremes_whatever_the_count() {
        // Counts around the four-way unrolling and the chunk length, each extreme placed
        // at a different position (first, last, in the remainder of a chunk).
        for n in [1, 3, 4, 5, 4099, (1 << 14) + 7, 3 * (1 << 14) + 2] {
            let (mut pos, _, _) = cloud(n);
            pos[0][0] = -5.0;
            pos[n - 1][1] = 7.0;
            pos[n / 2][2] = -3.0;
            pos[n - 1 - n / 3][2] = 4.0;
            let (mut lo, mut hi) = ([f64::MAX; 3], [f64::MIN; 3]);
            for x in &pos {
                for k in 0..3 {
                    lo[k] = lo[k].min(x[k]);
                    hi[k] = hi[k].max(x[k]);
                }
            }
            assert_eq!(
                Tree::bounding_cube(&pos),
                BoundingCube::around(lo, hi),
                "n = {n}"
            );
        }
    }

    fn cloud(n: usize) -> (Vec<[f64; 3]>, Vec<f64>, Vec<u64>) {
        let mut s = 3u64;
        let mut rnd = move || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 11) as f64 / (1u64 << 53) as f64
        };
        let pos: Vec<[f64; 3]> = (0..n).map(|_| [rnd(), rnd().powi(3), rnd()]).collect();
        let mass = (0..n).map(|_| 0.5 + rnd()).collect();
        (pos, mass, (0..n as u64).collect())
    }

    #[test]
    fn cells_partition_particles_and_bound_them() {
        let (pos, mass, id) = cloud(5000);
        let mut t = Tree::default();
        t.build(&pos, &mass, &id, None, 16, 100_000).unwrap();
        t.compute_moments();
        // Leaves partition the particles in order.
        let mut next = 0;
        for &l in &t.leaves {
            let c = t.cells[l as usize];
            assert_eq!(c.begin, next);
            assert!(c.count() <= 16 && c.count() > 0);
            next = c.end;
        }
        assert_eq!(next as usize, pos.len());
        // r_max bounds every particle; children cover their parent.
        for c in &t.cells {
            for x in &t.pos[c.begin as usize..c.end as usize] {
                let d = ((x[0] - c.centre[0]).powi(2)
                    + (x[1] - c.centre[1]).powi(2)
                    + (x[2] - c.centre[2]).powi(2))
                .sqrt();
                assert!(d <= c.r_max);
            }
            if !c.is_leaf() {
                let n: usize = c.children().map(|ch| t.cells[ch as usize].count()).sum();
                assert_eq!(n, c.count());
            }
        }
        let total: f64 = mass.iter().sum();
        assert!((t.cells[0].mass - total).abs() < 1e-9 * total);
    }

    #[test]
    fn equal_keys_are_ordered_by_id_whatever_the_input_order() {
        // Groups of four coincident particles (equal keys) among distinct ones, ids scrambled:
        // the tree order is by (key, id), so the reversed input gives the same particles in
        // the same order.
        let n = 3000;
        let (mut pos, mass, _) = cloud(n);
        for i in (0..n - 3).step_by(7) {
            for k in 1..4 {
                pos[i + k] = pos[i];
            }
        }
        let id: Vec<u64> = (0..n as u64)
            .map(|i| (i * 2654435761) % 1_000_003)
            .collect();
        let mut forward = Tree::default();
        forward.build(&pos, &mass, &id, None, 16, 100_000).unwrap();
        let rev = |v: &[u64]| v.iter().rev().copied().collect::<Vec<_>>();
        let pos_r: Vec<[f64; 3]> = pos.iter().rev().copied().collect();
        let mass_r: Vec<f64> = mass.iter().rev().copied().collect();
        let mut backward = Tree::default();
        backward
            .build(&pos_r, &mass_r, &rev(&id), None, 16, 100_000)
            .unwrap();
        let ids_in_order = |t: &Tree, id: &[u64]| -> Vec<u64> {
            t.order.iter().map(|&i| id[i as usize]).collect()
        };
        assert_eq!(
            ids_in_order(&forward, &id),
            ids_in_order(&backward, &rev(&id))
        );
        // Within every run of equal keys the ids increase.
        let sorted_ids = ids_in_order(&forward, &id);
        let mut equal_neighbours = 0;
        for k in 1..n {
            if forward.keys[k] == forward.keys[k - 1] {
                assert!(sorted_ids[k] > sorted_ids[k - 1]);
                equal_neighbours += 1;
            }
        }
        // Each group of four gives three equal neighbours.
        assert!(equal_neighbours >= 3 * (n / 7) - 3);
    }

    #[test]
    fn overflow_is_reported() {
        let (pos, mass, id) = cloud(2000);
        let mut t = Tree::default();
        assert!(t.build(&pos, &mass, &id, None, 8, 10).is_err());
        assert!(t.build(&pos, &mass, &id, None, 8, 100_000).is_ok());
    }

    /// `cloud(n)` keyed and sorted as a device hands it over (equal keys in index order).
    fn sorted_cloud(n: usize) -> (SortedParticles, Vec<u64>) {
        let (pos, mass, id) = cloud(n);
        let cube = Tree::bounding_cube(&pos);
        let mut order: Vec<u32> = (0..n as u32).collect();
        order.sort_by_key(|&i| cube.key(pos[i as usize]));
        let sorted = SortedParticles {
            cube: Some(cube),
            keys: order.iter().map(|&i| cube.key(pos[i as usize])).collect(),
            pos: order.iter().map(|&i| pos[i as usize]).collect(),
            mass: order.iter().map(|&i| mass[i as usize]).collect(),
            order,
        };
        (sorted, id)
    }

    #[test]
    fn adopted_cells_are_the_split_cells_and_bad_ones_are_refused() {
        let (mut sorted, id) = sorted_cloud(5000);
        let cube = sorted.cube.unwrap();
        let mut host = Tree::default();
        host.adopt_sorted(&mut sorted, &id).unwrap();
        host.build_cells(8, usize::MAX).unwrap();
        let good = host.cell_columns();
        let mut t = Tree::default();
        t.adopt_cells(cube, 5000, &good, 8).unwrap();
        assert_eq!(t.cells, host.cells);
        assert_eq!(t.level_start, host.level_start);
        assert_eq!(t.leaves, host.leaves);
        assert_eq!((t.own_cells, t.own_particles), (host.cells.len(), 5000));
        assert!(t.order.is_empty() && t.keys.is_empty() && t.pos.is_empty());
        assert_eq!(t.cell_columns(), good);
        // One change each, and the check that catches it.
        let parent = host.cells.iter().position(|c| c.child_count >= 2).unwrap();
        let first = host.cells[parent].first_child as usize;
        type Change = Box<dyn Fn(&mut CellColumns)>;
        let cases: Vec<(Change, usize, usize, &str)> = vec![
            (
                Box::new(|c| {
                    c.end.pop();
                }),
                5000,
                8,
                "cell columns of different lengths",
            ),
            (
                Box::new(|c| {
                    c.level_start.pop();
                }),
                5000,
                8,
                "levels that do not cover the cells",
            ),
            (
                Box::new(|_| ()),
                4999,
                8,
                "a root that does not hold every particle",
            ),
            (
                Box::new(|_| ()),
                5000,
                9,
                "a cell split against the leaf size",
            ),
            (
                Box::new(move |c| c.end[first] -= 1),
                5000,
                8,
                "children that do not split their parent's particles",
            ),
            (
                Box::new(move |c| c.begin[first + 1] -= 1),
                5000,
                8,
                "children that do not split their parent's particles",
            ),
            (
                Box::new(move |c| c.first_child[parent] += 1),
                5000,
                8,
                "children out of their parents' order",
            ),
            (
                Box::new(move |c| c.child_count[parent] -= 1),
                5000,
                8,
                "children that do not split their parent's particles",
            ),
        ];
        for (change, n, leaf_size, why) in cases {
            let mut bad = good.clone();
            change(&mut bad);
            assert_eq!(t.adopt_cells(cube, n, &bad, leaf_size), Err(NotSorted(why)));
        }
    }

    #[test]
    fn adopt_sorted_rejects_what_is_not_sorted_and_swaps_buffers() {
        let (good, id) = sorted_cloud(3000);
        let mut t = Tree::default();
        let copy = SortedParticles::clone;
        let mut bad = copy(&good);
        bad.keys.swap(10, 2000);
        assert_eq!(
            t.adopt_sorted(&mut bad, &id),
            Err(NotSorted("keys out of order"))
        );
        let mut bad = copy(&good);
        bad.order[5] = 3000;
        assert!(t.adopt_sorted(&mut bad, &id).is_err());
        let mut bad = copy(&good);
        bad.order[5] = bad.order[6];
        assert_eq!(
            t.adopt_sorted(&mut bad, &id),
            Err(NotSorted("an index twice"))
        );
        let mut bad = copy(&good);
        bad.mass.pop();
        assert!(t.adopt_sorted(&mut bad, &id).is_err());
        assert!(t.adopt_sorted(&mut copy(&good), &id[1..]).is_err());
        let mut bad = copy(&good);
        bad.cube = None;
        assert!(t.adopt_sorted(&mut bad, &id).is_err());
        // Nothing was taken from the rejected ones; the good one hands back the tree's
        // previous (here empty) buffers.
        assert!(t.keys.is_empty());
        let mut ok = copy(&good);
        t.adopt_sorted(&mut ok, &id).unwrap();
        assert!(ok.keys.is_empty() && ok.pos.is_empty());
        assert_eq!(t.keys, good.keys);
        t.build_cells(8, 100_000).unwrap();
        let (pos, mass, id) = cloud(3000);
        let mut host = Tree::default();
        host.build(&pos, &mass, &id, None, 8, 100_000).unwrap();
        assert_eq!((&t.order, &t.cells), (&host.order, &host.cells));
    }

    #[test]
    fn a_tree_without_positions_takes_its_moments_from_outside() {
        let (good, id) = sorted_cloud(3000);
        let mut with = Tree::default();
        with.adopt_sorted(&mut good.clone(), &id).unwrap();
        with.build_cells(8, 100_000).unwrap();
        with.compute_moments();
        let mut keys_only = good.clone();
        keys_only.pos.clear();
        let mut t = Tree::default();
        assert!(
            t.adopt_sorted(&mut keys_only.clone(), &id).is_err(),
            "masses without positions"
        );
        keys_only.mass.clear();
        t.adopt_sorted(&mut keys_only, &id).unwrap();
        assert!(t.pos.is_empty() && t.mass.is_empty());
        t.build_cells(8, 100_000).unwrap();
        assert_eq!(t.order, with.order);
        let moments = with.moments();
        assert_eq!(
            t.set_moments(&moments[1..]),
            Err(WrongMoments {
                given: moments.len() - 1,
                cells: moments.len()
            })
        );
        t.set_moments(&moments).unwrap();
        assert_eq!(t.cells, with.cells);
    }
}
