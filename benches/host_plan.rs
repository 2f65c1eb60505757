//! The host's share of a GPU force evaluation: the tree, the lists and the device plan
//! (`FmmSolver::plan_with`, then `device_plan`) on the disk-in-halo workload, default
//! settings, by phase. Needs no GPU: what a GPU step waits for on the CPU. Then the same
//! with the particles keyed and sorted as a device sorts them (`FmmSolver::plan_sorted`, the
//! resident run's path; the sort itself done here beforehand and not timed): what is left
//! to the host once the device sorts. Then with the cells' moments from the device too
//! (`plan_sorted` without positions and a `DeviceTree`; the moments computed here
//! beforehand and not timed): what is left once the device also computes them. Then with
//! the walk on the device as well (its list sizes handed over, found here beforehand). Last,
//! with the split into cells on the device too (`plan_split`: the cells handed over, split
//! here beforehand): what a resident run's host does each step.
//!
//! `cargo bench --bench host_plan` (N = 1e7, ~2.5 GB; `HOST_PLAN_N=1000000` for less);
//! figures go to docs/benchmarks.md (GPU backend).

use leapfmm::fmm::FmmStats;
use leapfmm::fmm::backend::{DeviceLists, DeviceTree};
use leapfmm::fmm::caps::Caps;
use leapfmm::fmm::morton::BoundingCube;
use leapfmm::fmm::solver::Evaluation;
use leapfmm::fmm::traversal::Mac;
use leapfmm::fmm::tree::{CellColumns, CellsOverflow, MOMENT_VALUES, SortedParticles, Tree};
use leapfmm::fmm::{FmmSettings, FmmSolver};
use leapfmm::gravity::GravityError;
use leapfmm::particles::Particles;
use leapfmm::workloads::Workload;
use rayon::prelude::*;
use std::time::Instant;

/// Plans timed; the first one also finds the caps.
const PLANS: usize = 4;

fn main() {
    let n: usize = std::env::var("HOST_PLAN_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000_000);
    let w = Workload::DiskInHalo;
    let p = w.particles(n, 1);
    let settings = w.fmm_settings(n);
    let mut solver = FmmSolver::new(settings.clone(), None);
    println!(
        "host plan, {} N = {n}, {} threads",
        w.name(),
        rayon::current_num_threads()
    );
    for k in 1..=PLANS {
        let start = Instant::now();
        let stats = solver
            .plan_with(&p.pos, &p.mass, &p.id, Evaluation::default())
            .expect("finite particles");
        report(&mut solver, k, start, stats);
    }
    println!("with the particles sorted as on a device (plan_sorted):");
    let mut solver = FmmSolver::new(settings.clone(), None);
    let mut sorted = SortedParticles::default();
    for k in 1..=PLANS {
        sort_as_a_device(&p, &mut sorted);
        let start = Instant::now();
        let stats = solver
            .plan_sorted(&mut sorted, &p.id, None, None)
            .expect("sorted particles");
        report(&mut solver, k, start, stats);
    }
    for (walk, split) in [(false, false), (true, false), (true, true)] {
        println!(
            "with the {}moments{} from the device too ({}):",
            if split { "cells, " } else { "" },
            if walk { " and the walk" } else { "" },
            if split {
                "plan_split"
            } else {
                "plan_sorted without positions"
            }
        );
        device_plans(&p, &settings, walk, split);
    }
}

/// `PLANS` plans from the particles sorted as on a device, with the cells' moments, with
/// `walk` the lists' sizes and with `split` the cells from a device (found beforehand, not
/// timed).
fn device_plans(p: &Particles, settings: &FmmSettings, walk: bool, split: bool) {
    let mut solver = FmmSolver::new(settings.clone(), None);
    let mut host = FmmSolver::new(settings.clone(), None);
    let mut sorted = SortedParticles::default();
    for k in 1..=PLANS {
        sort_as_a_device(p, &mut sorted);
        let mut tree = Tree::default();
        tree.adopt_sorted(&mut sorted.clone(), &p.id)
            .expect("sorted particles");
        tree.build_cells(settings.leaf_size, usize::MAX)
            .expect("no cap");
        tree.compute_moments();
        let lists = walk.then(|| {
            host.plan_with(&p.pos, &p.mass, &p.id, Evaluation::default())
                .expect("finite particles");
            let plan = host.device_plan().expect("one softening length");
            DeviceLists {
                m2l: plan.m2l_sources.len(),
                p2p: plan.p2p_sources.len(),
                p2p_interactions: plan.p2p_interactions(),
            }
        });
        let mut device = Precomputed {
            moments: tree.moments(),
            lists,
            cells: split.then(|| (tree.cube.expect("a cube"), tree.cell_columns())),
        };
        sorted.pos.clear();
        sorted.mass.clear();
        let start = Instant::now();
        let stats = if split {
            solver.plan_split(&p.id, &mut device, false)
        } else {
            solver.plan_sorted(&mut sorted, &p.id, Some(&mut device), None)
        };
        report(&mut solver, k, start, stats.expect("sorted particles"));
    }
}

/// The cells' moments, (when walked there) the lists' sizes and (when split there) the
/// cells as a device hands them over, found beforehand.
struct Precomputed {
    moments: Vec<[f64; MOMENT_VALUES]>,
    lists: Option<DeviceLists>,
    cells: Option<(BoundingCube, CellColumns)>,
}

impl DeviceTree for Precomputed {
    fn cell_moments(&mut self, _tree: &Tree, _reordered: bool) -> Result<(), GravityError> {
        Ok(())
    }

    fn download_moments(
        &mut self,
        out: &mut Vec<[f64; MOMENT_VALUES]>,
    ) -> Result<(), GravityError> {
        out.clone_from(&self.moments);
        Ok(())
    }

    fn walk(
        &mut self,
        _tree: &Tree,
        _mac: Mac,
        _caps: &Caps,
        _targets: Option<&[bool]>,
    ) -> Result<Option<DeviceLists>, GravityError> {
        Ok(self.lists)
    }

    fn split_cells(
        &mut self,
        tree: &mut Tree,
        leaf_size: usize,
        cap: usize,
    ) -> Result<Result<(), CellsOverflow>, GravityError> {
        let (cube, columns) = self.cells.as_ref().expect("cells split beforehand");
        if columns.begin.len() > cap {
            return Ok(Err(CellsOverflow { needed: cap + 1 }));
        }
        let n = columns.end[0] as usize;
        tree.adopt_cells(*cube, n, columns, leaf_size)?;
        Ok(Ok(()))
    }
}

/// What `GpuFmm::sort_resident` hands the host: keys in the particles' bounding cube,
/// sorted stably (equal keys in index order), positions and masses in that order.
fn sort_as_a_device(p: &Particles, out: &mut SortedParticles) {
    let cube = Tree::bounding_cube(&p.pos);
    let keys: Vec<u64> = p.pos.par_iter().map(|&x| cube.key(x)).collect();
    out.order.clear();
    out.order.extend(0..p.len() as u32);
    out.order.par_sort_by_key(|&i| keys[i as usize]);
    out.keys.clear();
    out.keys
        .par_extend(out.order.par_iter().map(|&i| keys[i as usize]));
    out.pos.clear();
    out.pos
        .par_extend(out.order.par_iter().map(|&i| p.pos[i as usize]));
    out.mass.clear();
    out.mass
        .par_extend(out.order.par_iter().map(|&i| p.mass[i as usize]));
    out.cube = Some(cube);
}

/// Prints plan `k`, whose lists `solver` made from `start` on with `stats`, after
/// assembling its device plan.
fn report(solver: &mut FmmSolver, k: usize, start: Instant, stats: FmmStats) {
    let lists = start.elapsed().as_secs_f64();
    let start = Instant::now();
    let plan = solver.device_plan().expect("one softening length");
    let assembly = start.elapsed().as_secs_f64();
    let s = stats.seconds;
    let (m2l, p2p) = plan
        .device_lists
        .map_or((plan.m2l_sources.len(), plan.p2p_sources.len()), |l| {
            (l.m2l, l.p2p)
        });
    println!(
        "plan {k}: {:.3} s = tree {:.3} + moments {:.3} + traversal {:.3} + assembly {assembly:.3} (+ {:.3} other); {} cells, {} M2L and {} P2P entries",
        lists + assembly,
        s.tree,
        s.upward,
        s.traversal,
        lists - s.tree - s.upward - s.traversal,
        plan.centre.len(),
        m2l,
        p2p
    );
}
