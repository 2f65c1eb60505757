//! The host's side of `backend`: the `DevicePlan` of the last evaluation, borrowed from the
//! solver's own arrays (particles, leaves, lists), for passes run on a device.

use super::backend::DevicePlan;
use super::solver::FmmSolver;
use crate::gravity::GravityError;
use rayon::prelude::*;

/// Why there is no device plan.
fn no_device_plan() -> GravityError {
    GravityError::Device(
        "a device plan needs at least one particle and one softening length for all".into(),
    )
}

impl FmmSolver {
    /// The device plan of the last evaluation or plan (an error for one with a softening
    /// length per particle, or before any). With other ranks' cells appended it carries
    /// the host's multipoles.
    pub fn device_plan(&self) -> Result<DevicePlan<'_>, GravityError> {
        let tree = &self.tree;
        let cells = tree.own_cells;
        if cells == 0 || !tree.eps.is_empty() {
            return Err(no_device_plan());
        }
        let remote = tree.cells.len() > cells;
        let all = &tree.cells;
        // Leaves are in particle order and cover the own particles: each fills its range.
        // Particles held on a device (no positions here, or placeholders) have their leaves
        // found there.
        let held_here = !self.own_on_device && tree.pos.len() >= tree.own_particles;
        let mut leaf_of = vec![0u32; if held_here { tree.own_particles } else { 0 }];
        let mut rest = leaf_of.as_mut_slice();
        let mut ranges = Vec::with_capacity(tree.leaves.len());
        for &leaf in tree.leaves.iter().filter(|_| held_here) {
            let c = &all[leaf as usize];
            debug_assert_eq!(c.begin as usize, tree.own_particles - rest.len());
            let (range, tail) = rest.split_at_mut((c.end - c.begin) as usize);
            ranges.push((range, leaf));
            rest = tail;
        }
        ranges
            .into_par_iter()
            .with_min_len(64)
            .for_each(|(range, leaf)| range.fill(leaf));
        Ok(DevicePlan {
            order: self.settings.order,
            pos: &tree.pos,
            mass: &tree.mass,
            own_particles: tree.own_particles,
            own_cells: cells,
            multipoles: remote.then_some(self.multipoles.as_slice()),
            upward_on_device: !(remote && self.upward_on_host),
            order_of: &tree.order,
            centre: if self.moments_on_device {
                vec![[0.0; 3]; all.len()]
            } else {
                all.par_iter().map(|c| c.centre).collect()
            },
            moments_on_device: self.moments_on_device,
            begin: all.par_iter().map(|c| c.begin).collect(),
            end: all.par_iter().map(|c| c.end).collect(),
            first_child: all.par_iter().map(|c| c.first_child).collect(),
            child_count: all.par_iter().map(|c| u32::from(c.child_count)).collect(),
            parent: all.par_iter().map(|c| c.parent).collect(),
            level_start: tree.level_start.iter().map(|&l| l as u32).collect(),
            leaves: &tree.leaves,
            leaf_of,
            m2l_spans: &self.m2l.spans,
            m2l_sources: &self.m2l.sources,
            p2p_spans: &self.p2p.spans,
            p2p_sources: &self.p2p.sources,
            device_lists: self.device_lists,
        })
    }
}
