//! The tree of resident particles on the device (the GPU side of `fmm::tree`): keys and
//! the radix sort into tree order (`sort_resident`: the host gets five sums to check, or
//! `download_sorted` when a run of equal keys is too long for the device to order by id),
//! the split into cells (`split_cells`) and the cells' moments (`cell_moments`: the host gets
//! each cell's mass, centre and radius).

use super::buffers::{MomentsBuffers, SPARE_ROOM, SortBuffers};
use super::context::{GpuFmm, grid};
use super::error::GpuError;
use super::sort::{
    ANCESTOR_THREADS, BOUNDS_BLOCKS, BOUNDS_FIELDS, BOUNDS_THREADS, LEVEL_SLOTS, OFFSETS_THREADS,
    RADIX_BITS, RADIX_THREADS, SCAN_BLOCKS, SCAN_THREADS, SCAN_VALUES, cube_of_bounds, sort_blocks,
};
use super::state::DeviceState;
use crate::fmm::morton::BoundingCube;
use crate::fmm::tree::{
    CellColumns, CellsOverflow, MOMENT_VALUES, SortSummary, SortedParticles, Tree,
};
use cudarc::driver::{LaunchConfig, PushKernelArg};

/// What `GpuFmm::sort_resident` found.
#[derive(Debug, Clone, Copy)]
pub struct DeviceSort {
    /// The particles' bounding cube, which the keys refer to.
    pub cube: BoundingCube,
    /// The sort's sums, for `SortSummary::check`.
    pub summary: SortSummary,
    /// False when a run of equal keys was too long for the device to order by id
    /// (`RUN_LIMIT` in split.cu): the host must (`download_sorted`, `Tree::adopt_sorted`).
    pub runs_ordered: bool,
}

impl GpuFmm {
    /// The particles of `state` keyed and sorted into tree order on the device (design §5
    /// steps 1–2, kernels/keys.cu; runs of equal keys in id order, kernels/split.cu:
    /// order_equal_runs), the keys, order, positions and masses kept there for
    /// `split_cells` and `cell_moments` (or `download_sorted`): their cube, the summary of
    /// the sort the host checks (kernels/split.cu: sort_scan; `SortSummary::check`), and
    /// whether the runs are ordered. `None` when a position or mass is not finite (the
    /// caller names the particle from the host's copy).
    pub fn sort_resident(&mut self, state: &DeviceState) -> Result<Option<DeviceSort>, GpuError> {
        self.sort_resident_in(state, None)
    }

    /// `sort_resident`, keyed in `cube` when given (a rank of a distributed run: the cube
    /// of every rank's particles) instead of the cube of `state`'s own.
    pub fn sort_resident_in(
        &mut self,
        state: &DeviceState,
        cube: Option<BoundingCube>,
    ) -> Result<Option<DeviceSort>, GpuError> {
        self.split = None;
        self.moments_of = None;
        let (n, n32) = (state.n, state.n as u32);
        let stream = self.stream.clone();
        let s = match &mut self.sorting {
            Some(s) => s,
            // Room to spare, as the state has: a rank's particle count moves a little with
            // each migration, and a buffer that had to grow would allocate at every step.
            None => self
                .sorting
                .insert(SortBuffers::new(&stream, n + n.div_ceil(SPARE_ROOM))?),
        };
        s.fit(&stream, n)?;
        let k = &self.kernels;
        let config = |blocks: u32, threads: u32| LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut launch = stream.launch_builder(&k.bounds);
        launch
            .arg(&state.pos)
            .arg(&state.mass)
            .arg(&n32)
            .arg(&mut s.bounds);
        // No more blocks than a thread for each particle needs (the blocks stride over the
        // particles; the extremes are the same for any number): fewer values come back.
        let blocks = n
            .div_ceil(BOUNDS_THREADS as usize)
            .clamp(1, BOUNDS_BLOCKS as usize);
        // SAFETY: the arguments match bounds_blocks' signature; `bounds` holds
        // BOUNDS_FIELDS values for each of the BOUNDS_BLOCKS >= `blocks` blocks.
        unsafe { launch.launch(config(blocks as u32, BOUNDS_THREADS)) }?;
        let bounds = stream.clone_dtoh(&s.bounds.slice(0..blocks * BOUNDS_FIELDS))?;
        stream.synchronize()?;
        // The extremes also flag a position or mass that is not finite.
        let Some(own) = cube_of_bounds(&bounds) else {
            return Ok(None);
        };
        let cube = cube.unwrap_or(own);
        let [lo_x, lo_y, lo_z] = cube.lo;
        let scale = cube.scale();
        let [keys_a, keys_b] = &mut s.keys;
        let [index_a, index_b] = &mut s.index;
        let mut launch = stream.launch_builder(&k.keys);
        launch
            .arg(&state.pos)
            .arg(&n32)
            .arg(&lo_x)
            .arg(&lo_y)
            .arg(&lo_z)
            .arg(&scale)
            .arg(&mut keys_a.buf)
            .arg(&mut index_a.buf);
        // SAFETY: as above, for morton_keys; the key and index buffers hold n.
        unsafe { launch.launch(grid(n)) }?;
        let blocks = sort_blocks(n) as u32;
        let counts_len = RADIX_THREADS * blocks;
        // An even number of passes leaves the result where the keys started.
        const PASSES: u32 = 64 / RADIX_BITS;
        const _: () = assert!(PASSES.is_multiple_of(2));
        for pass in 0..PASSES {
            let shift = pass * RADIX_BITS;
            let (keys_in, keys_out, index_in, index_out) = if pass.is_multiple_of(2) {
                (&*keys_a, &mut *keys_b, &*index_a, &mut *index_b)
            } else {
                (&*keys_b, &mut *keys_a, &*index_b, &mut *index_a)
            };
            let mut launch = stream.launch_builder(&k.radix_count);
            launch
                .arg(&keys_in.buf)
                .arg(&n32)
                .arg(&shift)
                .arg(&mut s.counts.buf);
            // SAFETY: as above, for radix_count; `counts` holds RADIX_THREADS per block.
            unsafe { launch.launch(config(blocks, RADIX_THREADS)) }?;
            let mut launch = stream.launch_builder(&k.radix_offsets);
            launch.arg(&mut s.counts.buf).arg(&counts_len);
            // SAFETY: as above, for radix_offsets (one block).
            unsafe { launch.launch(config(1, OFFSETS_THREADS)) }?;
            let mut launch = stream.launch_builder(&k.radix_scatter);
            launch
                .arg(&keys_in.buf)
                .arg(&index_in.buf)
                .arg(&n32)
                .arg(&shift)
                .arg(&s.counts.buf)
                .arg(&mut keys_out.buf)
                .arg(&mut index_out.buf);
            // SAFETY: as above, for radix_scatter; every output position is below n.
            unsafe { launch.launch(config(blocks, RADIX_THREADS)) }?;
        }
        s.scan.zero(&stream, SCAN_VALUES)?;
        let mut launch = stream.launch_builder(&k.sort_scan);
        launch
            .arg(&keys_a.buf)
            .arg(&index_a.buf)
            .arg(&n32)
            .arg(&mut s.scan.buf);
        // SAFETY: as above, for sort_scan; `scan` holds SCAN_VALUES zeroes.
        unsafe { launch.launch(config(SCAN_BLOCKS, SCAN_THREADS)) }?;
        let scan = stream.clone_dtoh(&s.scan.buf.slice(0..SCAN_VALUES))?;
        stream.synchronize()?;
        let summary = SortSummary {
            out_of_order: scan[0],
            equal_neighbours: scan[1],
            largest: scan[2],
            sum: scan[3],
            squares: scan[4],
        };
        // What the checks reject is not read through (an index past the particles).
        let valid = summary.check(n).is_ok();
        let mut runs_ordered = true;
        if valid && summary.equal_neighbours > 0 {
            s.long_runs.zero(&stream, 1)?;
            let mut launch = stream.launch_builder(&k.order_runs);
            launch
                .arg(&keys_a.buf)
                .arg(&state.id)
                .arg(&n32)
                .arg(&mut index_a.buf)
                .arg(&mut s.long_runs.buf);
            // SAFETY: as above, for order_equal_runs; keys, ids and indices hold n.
            unsafe { launch.launch(grid(n)) }?;
            runs_ordered = stream.clone_dtoh(&s.long_runs.buf.slice(0..1))?[0] == 0;
        }
        if valid {
            let mut launch = stream.launch_builder(&k.gather);
            launch
                .arg(&state.pos)
                .arg(&state.mass)
                .arg(&index_a.buf)
                .arg(&n32)
                .arg(&mut s.pos.buf)
                .arg(&mut s.mass.buf);
            // SAFETY: as above, for gather_tree_order; every buffer holds n, every index is
            // below n.
            unsafe { launch.launch(grid(n)) }?;
            stream.synchronize()?;
        }
        Ok(Some(DeviceSort {
            cube,
            summary,
            runs_ordered,
        }))
    }

    /// The keys and order of `state`'s last `sort_resident` (in `cube`) downloaded into
    /// `out`, for the host to split into cells (`FmmSolver::plan_sorted`), and with
    /// `with_particles` the positions and masses in that order (without, they stay on the
    /// device for `cell_moments`, and `out` gets none).
    pub fn download_sorted(
        &self,
        state: &DeviceState,
        cube: BoundingCube,
        out: &mut SortedParticles,
        with_particles: bool,
    ) -> Result<(), GpuError> {
        let n = state.n;
        let stream = &self.stream;
        let s = self.sorted(n)?;
        out.keys.resize(n, 0);
        out.order.resize(n, 0);
        stream.memcpy_dtoh(&s.keys[0].buf.slice(0..n), &mut out.keys[..])?;
        stream.memcpy_dtoh(&s.index[0].buf.slice(0..n), &mut out.order[..])?;
        if with_particles {
            out.pos.resize(n, [0.0; 3]);
            out.mass.resize(n, 0.0);
            stream.memcpy_dtoh(&s.pos.buf.slice(0..3 * n), out.pos.as_flattened_mut())?;
            stream.memcpy_dtoh(&s.mass.buf.slice(0..n), &mut out.mass[..])?;
        } else {
            out.pos.clear();
            out.mass.clear();
        }
        stream.synchronize()?;
        out.cube = Some(cube);
        Ok(())
    }

    /// The tree order of `state`'s last `sort_resident` (tree position → row) into `out`.
    pub fn download_order(&self, state: &DeviceState, out: &mut Vec<u32>) -> Result<(), GpuError> {
        let n = state.n;
        let s = self.sorted(n)?;
        out.resize(n, 0);
        self.stream
            .memcpy_dtoh(&s.index[0].buf.slice(0..n), &mut out[..])?;
        self.stream.synchronize()?;
        Ok(())
    }

    /// The buffers of the last `sort_resident`, of (at least) `n` particles, for a download.
    pub(super) fn sorted(&self, n: usize) -> Result<&SortBuffers, GpuError> {
        let s = self.sorting.as_ref().ok_or_else(|| {
            GpuError::Unsupported("a download of the sort before the sort".into())
        })?;
        if s.keys[0].buf.len() < n || s.index[0].buf.len() < n {
            return Err(GpuError::Unsupported(
                "a download of a sort of fewer particles".into(),
            ));
        }
        Ok(s)
    }

    /// For each cell of `tree` (split on the device by the last `split_cells`, its moments
    /// computed by `cell_moments`), whether it holds one of the particles of `rows` (rows
    /// of `state`): `Tree::cells_holding`'s flags, found where the tree is (kernels
    /// mark_rows and flag_cells_holding), so that a block sub-step brings back a byte per
    /// cell instead of the sort's order (4 bytes a particle).
    pub fn cells_holding(
        &mut self,
        state: &DeviceState,
        tree: &Tree,
        rows: &[u32],
        out: &mut Vec<bool>,
    ) -> Result<(), GpuError> {
        let (n, cells) = (state.n, tree.cells.len());
        if self.split != Some(cells) || rows.iter().any(|&i| i as usize >= n) {
            return Err(GpuError::Unsupported(
                "active cells of a tree the device did not split, or of rows beyond its particles"
                    .into(),
            ));
        }
        let stream = self.stream.clone();
        let s = self
            .sorting
            .as_ref()
            .filter(|s| s.index[0].buf.len() >= n)
            .ok_or_else(|| GpuError::Unsupported("active cells before a sort".into()))?;
        let m = self
            .moments
            .as_mut()
            .ok_or_else(|| GpuError::Unsupported("active cells before the moments".into()))?;
        m.marked.room(&stream, n)?;
        m.marked.zero(&stream, n)?;
        m.flags.room(&stream, cells)?;
        m.flags.zero(&stream, cells)?;
        m.rows.room(&stream, rows.len())?;
        m.rows.upload(&stream, rows)?;
        let count = rows.len() as u32;
        let mut launch = stream.launch_builder(&self.kernels.mark_rows);
        launch.arg(&m.rows.buf).arg(&count).arg(&mut m.marked.buf);
        // SAFETY: the arguments match mark_rows's signature; every row is below n, the
        // marks' length.
        unsafe { launch.launch(grid(rows.len())) }?;
        let n_leaves = tree.leaves.len() as u32;
        let mut launch = stream.launch_builder(&self.kernels.flag_cells);
        launch
            .arg(&m.leaves.buf)
            .arg(&n_leaves)
            .arg(&m.begin.buf)
            .arg(&m.end.buf)
            .arg(&m.parent.buf)
            .arg(&s.index[0].buf)
            .arg(&m.marked.buf)
            .arg(&mut m.flags.buf);
        // SAFETY: the arguments match flag_cells_holding's signature; the cells' columns and
        // leaves are the tree's (its split and moments were the device's), the order holds n.
        unsafe { launch.launch(grid(tree.leaves.len())) }?;
        let mut flags = vec![0u8; cells];
        stream.memcpy_dtoh(&m.flags.buf.slice(0..cells), &mut flags[..])?;
        stream.synchronize()?;
        out.clear();
        out.extend(flags.iter().map(|&f| f != 0));
        Ok(())
    }

    /// The particles of `state`'s last `sort_resident` split into cells on the device
    /// (kernels/split.cu, level by level: counts, prefix sums, writes): at most
    /// `leaf_size` a leaf, the cells of `Tree::build_cells` in its numbering, their columns
    /// downloaded into `out` (16 bytes a cell) and kept for `cell_moments`. `Ok(Err(..))`
    /// when they need more than `cap` cells.
    pub fn split_cells(
        &mut self,
        state: &DeviceState,
        leaf_size: usize,
        cap: usize,
        out: &mut CellColumns,
    ) -> Result<Result<(), CellsOverflow>, GpuError> {
        self.split = None;
        let n = state.n;
        let stream = self.stream.clone();
        let k = &self.kernels;
        let s = self.sorting.as_ref().ok_or_else(|| {
            GpuError::Unsupported("a split into cells before a sort into tree order".into())
        })?;
        if cap == 0 {
            return Ok(Err(CellsOverflow { needed: 1 }));
        }
        let m = match &mut self.moments {
            Some(m) => m,
            None => {
                self.moments
                    .insert(MomentsBuffers::new(&stream, n + n.div_ceil(SPARE_ROOM), 1)?)
            }
        };
        let leaf_size = leaf_size.clamp(1, u32::MAX as usize) as u32;
        for column in m.cell_columns() {
            column.room(&stream, 1)?;
        }
        m.begin.upload(&stream, &[0])?;
        m.end.upload(&stream, &[n as u32])?;
        m.parent.upload(&stream, &[0])?;
        let mut level_start = vec![0usize];
        let (mut first, mut cells) = (0usize, 1usize);
        for level in 0u32.. {
            let count = cells - first;
            m.split_counts.room(&stream, count + 1)?;
            m.split_counts.zero(&stream, count + 1)?;
            let (first32, count32) = (first as u32, count as u32);
            let mut launch = stream.launch_builder(&k.split_count);
            launch
                .arg(&first32)
                .arg(&count32)
                .arg(&level)
                .arg(&leaf_size)
                .arg(&s.keys[0].buf)
                .arg(&m.begin.buf)
                .arg(&m.end.buf)
                .arg(&mut m.split_counts.buf);
            // SAFETY: the arguments match split_count's signature; the level's cells are
            // below `cells`, and the counts hold count + 1.
            unsafe { launch.launch(grid(count)) }?;
            let len = count32 + 1;
            let mut launch = stream.launch_builder(&k.radix_offsets);
            launch.arg(&mut m.split_counts.buf).arg(&len);
            // SAFETY: radix_offsets scans `len` counts in place (one block).
            unsafe {
                launch.launch(LaunchConfig {
                    grid_dim: (1, 1, 1),
                    block_dim: (OFFSETS_THREADS, 1, 1),
                    shared_mem_bytes: 0,
                })
            }?;
            let children =
                stream.clone_dtoh(&m.split_counts.buf.slice(count..count + 1))?[0] as usize;
            if cells + children > cap {
                return Ok(Err(CellsOverflow { needed: cap + 1 }));
            }
            for column in m.cell_columns() {
                column.room_keeping(&stream, cells + children, cells)?;
            }
            let mut launch = stream.launch_builder(&k.split_write);
            launch
                .arg(&first32)
                .arg(&count32)
                .arg(&level)
                .arg(&leaf_size)
                .arg(&s.keys[0].buf)
                .arg(&m.split_counts.buf)
                .arg(&mut m.begin.buf)
                .arg(&mut m.end.buf)
                .arg(&mut m.first_child.buf)
                .arg(&mut m.child_count.buf)
                .arg(&mut m.parent.buf);
            // SAFETY: as above, for split_write; the columns hold the next level's cells.
            unsafe { launch.launch(grid(count)) }?;
            if children == 0 {
                break;
            }
            first = cells;
            cells += children;
            level_start.push(first);
        }
        level_start.push(cells);
        for (column, to) in [
            (&m.begin, &mut out.begin),
            (&m.end, &mut out.end),
            (&m.first_child, &mut out.first_child),
            (&m.child_count, &mut out.child_count),
        ] {
            to.resize(cells, 0);
            stream.memcpy_dtoh(&column.buf.slice(0..cells), &mut to[..])?;
        }
        stream.synchronize()?;
        out.level_start = level_start;
        self.split = Some(cells);
        Ok(Ok(()))
    }

    /// Mass, centre and r_max of every cell of `tree` (kernels/moments.cu: the values of
    /// `Tree::compute_moments`, bit for bit), computed and kept on the device (for `walk`
    /// and the passes; `download_moments` brings them to the host), from the particles the
    /// last `sort_resident` of `state` left on the device in tree order; with `reordered`
    /// they are first put into `tree.order` (the host reordered equal keys). Only the cells
    /// go up, none when `split_cells` made them there.
    pub fn cell_moments(
        &mut self,
        state: &DeviceState,
        tree: &Tree,
        reordered: bool,
    ) -> Result<(), GpuError> {
        self.moments_of = None;
        let (n, cells, levels) = (state.n, tree.cells.len(), tree.depth());
        if tree.own_particles != n || tree.own_cells != cells || levels + 1 > LEVEL_SLOTS {
            return Err(GpuError::Unsupported(format!(
                "moments of a tree of {} particles, {} cells ({cells} with received ones) and {levels} levels on a device state of {n} particles",
                tree.own_particles, tree.own_cells
            )));
        }
        let stream = self.stream.clone();
        let k = &self.kernels;
        let s = self.sorting.as_mut().ok_or_else(|| {
            GpuError::Unsupported("cell moments before a sort into tree order".into())
        })?;
        let n32 = n as u32;
        if reordered {
            s.index[0].upload(&stream, &tree.order)?;
            let mut launch = stream.launch_builder(&k.gather);
            launch
                .arg(&state.pos)
                .arg(&state.mass)
                .arg(&s.index[0].buf)
                .arg(&n32)
                .arg(&mut s.pos.buf)
                .arg(&mut s.mass.buf);
            // SAFETY: the arguments match gather_tree_order's signature; every buffer holds n.
            unsafe { launch.launch(grid(n)) }?;
        }
        let m = match &mut self.moments {
            Some(m) => m,
            None => self.moments.insert(MomentsBuffers::new(
                &stream,
                n + n.div_ceil(SPARE_ROOM),
                cells,
            )?),
        };
        m.fit(&stream, n, cells, levels)?;
        // Cells split here are there already (`Tree::adopt_cells` checked them).
        if self.split != Some(cells) {
            let column = |f: fn(&crate::fmm::tree::Cell) -> u32| -> Vec<u32> {
                tree.cells.iter().map(f).collect()
            };
            m.begin.upload(&stream, &column(|c| c.begin))?;
            m.end.upload(&stream, &column(|c| c.end))?;
            m.first_child.upload(&stream, &column(|c| c.first_child))?;
            m.child_count
                .upload(&stream, &column(|c| u32::from(c.child_count)))?;
            m.parent.upload(&stream, &column(|c| c.parent))?;
        }
        m.leaves.upload(&stream, &tree.leaves)?;
        let level_start: Vec<u32> = tree.level_start.iter().map(|&l| l as u32).collect();
        m.level_start.upload(&stream, &level_start)?;
        let n_leaves = tree.leaves.len() as u32;
        let mut launch = stream.launch_builder(&k.leaf_of);
        launch
            .arg(&m.leaves.buf)
            .arg(&n_leaves)
            .arg(&m.begin.buf)
            .arg(&m.end.buf)
            .arg(&mut m.leaf_of.buf);
        // SAFETY: the arguments match leaf_of_particles' signature; the leaves' ranges
        // cover the n particles once.
        unsafe { launch.launch(grid(tree.leaves.len())) }?;
        for level in (0..levels).rev() {
            let (first, count) = (
                level_start[level],
                level_start[level + 1] - level_start[level],
            );
            let mut launch = stream.launch_builder(&k.level_moments);
            launch
                .arg(&first)
                .arg(&count)
                .arg(&m.begin.buf)
                .arg(&m.end.buf)
                .arg(&m.first_child.buf)
                .arg(&m.child_count.buf)
                .arg(&s.pos.buf)
                .arg(&s.mass.buf);
            launch
                .arg(&mut m.mass.buf)
                .arg(&mut m.centre.buf)
                .arg(&mut m.r2.buf);
            // SAFETY: as above, for level_moments; the level's children are done.
            unsafe { launch.launch(grid(count as usize)) }?;
        }
        let levels32 = levels as u32;
        let mut launch = stream.launch_builder(&k.ancestor_r2);
        launch
            .arg(&s.pos.buf)
            .arg(&n32)
            .arg(&m.leaf_of.buf)
            .arg(&m.parent.buf)
            .arg(&m.level_start.buf)
            .arg(&levels32)
            .arg(&m.centre.buf)
            .arg(&mut m.r2.buf);
        let blocks = (n as u32).div_ceil(ANCESTOR_THREADS).max(1);
        let config = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (ANCESTOR_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        if n > 0 {
            // SAFETY: as above, for ancestor_r2 (ANCESTOR_THREADS per block, every block
            // starting below n).
            unsafe { launch.launch(config) }?;
        }
        let cells32 = cells as u32;
        let mut launch = stream.launch_builder(&k.finish_moments);
        launch
            .arg(&cells32)
            .arg(&m.mass.buf)
            .arg(&m.centre.buf)
            .arg(&m.r2.buf)
            .arg(&mut m.out.buf);
        // SAFETY: as above, for finish_moments.
        unsafe { launch.launch(grid(cells)) }?;
        self.moments_of = Some(cells);
        Ok(())
    }

    /// The five values of every cell the last `cell_moments` computed, into `out` in cell
    /// order.
    pub fn download_moments(&self, out: &mut Vec<[f64; MOMENT_VALUES]>) -> Result<(), GpuError> {
        let (Some(cells), Some(m)) = (self.moments_of, &self.moments) else {
            return Err(GpuError::Unsupported(
                "a download of cell moments before any were computed".into(),
            ));
        };
        out.resize(cells, [0.0; MOMENT_VALUES]);
        self.stream.memcpy_dtoh(
            &m.out.buf.slice(0..MOMENT_VALUES * cells),
            out.as_flattened_mut(),
        )?;
        self.stream.synchronize()?;
        Ok(())
    }
}
