//! Locally essential trees (Warren & Salmon 1993; design §6). Each rank shares the top of its
//! tree (the geometry of its cells that hold many particles); every other rank then sends it exactly
//! what it needs: a pruned copy of its own tree in which a cell far from every part of the
//! receiver's domain travels as a multipole (never to be opened), and a leaf that is not far
//! travels with its particles. The traffic therefore follows the domain's surface.

use crate::fmm::traversal::Mac;
use crate::fmm::tree::{Cell, Tree};
use bytemuck::{Pod, Zeroable};

/// Geometry of one cell of a rank's top tree.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct TopCell {
    /// Centre of mass.
    pub centre: [f64; 3],
    /// Bounding radius about the centre.
    pub r_max: f64,
    /// Largest bounding radius of the rank's tree leaves inside this cell.
    pub leaf_r_max: f64,
    /// First child in the top tree (children contiguous).
    pub first_child: u32,
    /// Children in the top tree (0: a leaf of the rank's tree, or a cell whose deeper
    /// children were cut off).
    pub child_count: u32,
    /// 1 when the cell is a leaf of the rank's tree (its geometry is exact for every target
    /// inside it), 0 otherwise.
    pub leaf: u32,
    /// Padding (Pod layout).
    pub pad: u32,
}

impl TopCell {
    fn as_cell(&self) -> Cell {
        Cell {
            centre: self.centre,
            r_max: self.r_max,
            ..Cell::default()
        }
    }
}

/// The top of `tree` that other ranks test their cells against: every cell holding more
/// than `min_particles` particles keeps its children, the rest are cut off (so the top tree
/// stays small: about 8 N / `min_particles` cells). Breadth first, children contiguous.
pub fn top_tree(tree: &Tree, min_particles: usize) -> Vec<TopCell> {
    if tree.own_particles == 0 {
        return Vec::new();
    }
    // Largest leaf radius below every cell; children come after their parents.
    let mut leaf_r = vec![0.0f64; tree.own_cells];
    for (i, c) in tree.cells[..tree.own_cells].iter().enumerate().rev() {
        leaf_r[i] = if c.is_leaf() {
            c.r_max
        } else {
            c.children().map(|k| leaf_r[k as usize]).fold(0.0, f64::max)
        };
    }
    let mut out = Vec::new();
    let mut source = vec![0u32];
    let mut next = 0;
    while next < source.len() {
        let c = &tree.cells[source[next] as usize];
        let keep = !c.is_leaf() && c.count() > min_particles;
        let first_child = if keep { source.len() as u32 } else { 0 };
        if keep {
            source.extend(c.children());
        }
        out.push(TopCell {
            centre: c.centre,
            r_max: c.r_max,
            leaf_r_max: leaf_r[source[next] as usize],
            first_child,
            child_count: if keep { c.child_count as u32 } else { 0 },
            leaf: u32::from(c.is_leaf()),
            pad: 0,
        });
        next += 1;
    }
    out
}

/// True when `c` passes the MAC against every leaf of the receiver's tree that can lie
/// inside the receiver's top cell `n` (the receiver only opens a remote cell when one of
/// its leaves fails against it). For a leaf `n` this is the MAC itself, computed exactly as
/// the receiver will. Otherwise every leaf A inside has |z_A − z_n| ≤ r_n and
/// r_A ≤ `leaf_r_max`, so the MAC at the distance d − r_n suffices (with a relative margin
/// of 1e-12 against rounding).
fn far(mac: Mac, c: &Cell, n: &TopCell) -> bool {
    if n.leaf == 1 {
        return mac.accepts(&n.as_cell(), c);
    }
    let d = ((c.centre[0] - n.centre[0]).powi(2)
        + (c.centre[1] - n.centre[1]).powi(2)
        + (c.centre[2] - n.centre[2]).powi(2))
    .sqrt();
    let d = (d - n.r_max) * (1.0 - 1e-12);
    let r = (c.r_max + n.leaf_r_max) * (1.0 + 1e-12);
    r < mac.theta * d && d - r > mac.support
}

/// One cell of a locally essential tree on the wire.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct LetCell {
    /// Centre of mass.
    pub centre: [f64; 3],
    /// Bounding radius.
    pub r_max: f64,
    /// Mass.
    pub mass: f64,
    /// First child (children contiguous); 0 without children.
    pub first_child: u32,
    /// Number of children.
    pub child_count: u32,
    /// Particle range (empty for a multipole-only cell).
    pub begin: u32,
    /// End of the particle range.
    pub end: u32,
}

/// What one rank sends another.
#[derive(Debug, Clone, Default)]
pub struct LetPacket {
    /// Cells, root first, breadth first.
    pub cells: Vec<LetCell>,
    /// One multipole per cell.
    pub multipoles: Vec<f64>,
    /// Particles of the leaves sent with particles: x, y, z, m.
    pub particles: Vec<[f64; 4]>,
}

/// The locally essential tree of `tree` for a receiver whose top tree is `receiver`.
pub fn export(
    tree: &Tree,
    multipoles: &[f64],
    len: usize,
    receiver: &[TopCell],
    mac: Mac,
) -> LetPacket {
    let mut out = LetPacket::default();
    if tree.own_particles == 0 || receiver.is_empty() {
        return out;
    }
    let empty = LetCell::zeroed();
    out.cells.push(empty);
    out.multipoles.extend_from_slice(&multipoles[..len]);
    let mut queue = std::collections::VecDeque::from([(0u32, 0usize, vec![0u32])]);
    let mut stack = Vec::new();
    while let Some((c, slot, candidates)) = queue.pop_front() {
        let cell = &tree.cells[c as usize];
        // The receiver's branches this cell is not yet far from.
        let mut near = Vec::new();
        stack.clear();
        stack.extend(candidates);
        while let Some(k) = stack.pop() {
            let n = &receiver[k as usize];
            if far(mac, cell, n) {
                continue;
            }
            if n.child_count == 0 {
                near.push(k);
            } else {
                stack.extend(n.first_child..n.first_child + n.child_count);
            }
        }
        near.sort_unstable();
        let mut entry = LetCell {
            centre: cell.centre,
            r_max: cell.r_max,
            mass: cell.mass,
            ..empty
        };
        if near.is_empty() {
            // A multipole the receiver never opens.
        } else if cell.is_leaf() {
            entry.begin = out.particles.len() as u32;
            for i in cell.begin as usize..cell.end as usize {
                let x = tree.pos[i];
                out.particles.push([x[0], x[1], x[2], tree.mass[i]]);
            }
            entry.end = out.particles.len() as u32;
        } else {
            entry.first_child = out.cells.len() as u32;
            entry.child_count = cell.child_count as u32;
            for (k, child) in cell.children().enumerate() {
                out.cells.push(empty);
                let off = child as usize * len;
                out.multipoles
                    .extend_from_slice(&multipoles[off..off + len]);
                queue.push_back((child, entry.first_child as usize + k, near.clone()));
            }
        }
        out.cells[slot] = entry;
    }
    out
}

/// Converts received cells into tree cells (ranges and children relative to the packet).
pub fn import_cells(packet: &LetPacket) -> Vec<Cell> {
    packet
        .cells
        .iter()
        .map(|c| Cell {
            centre: c.centre,
            r_max: c.r_max,
            mass: c.mass,
            begin: c.begin,
            end: c.end,
            first_child: c.first_child,
            child_count: c.child_count as u8,
            level: 0,
            parent: 0,
        })
        .collect()
}
