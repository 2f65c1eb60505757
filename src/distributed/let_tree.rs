//! Locally essential trees (Warren & Salmon 1993; design §6). Every rank exports to every
//! other exactly what the receiver's walk of its own tree against the exporter's will touch:
//! multipoles of the cells it accepts, children of the cells it opens, particles of the
//! leaves it pairs with leaves. Nothing else travels (a cell that is only opened sends no
//! multipole), so the traffic follows the domain's surface, and because the walk's
//! decisions are symmetric (`open_second`), the cross-domain pairs the two ranks of a pair
//! use are mirror images: every far interaction acts both ways, as within one rank.
//!
//! To emulate the receiver's walk the exporter needs the geometry of the receiver's cells
//! that walk visits, and no more. Every rank shares a coarse top of its tree (`coarse_tree`:
//! children only below cells with many particles); an exporter's walk (`ExportWalk`) stops
//! where it must open a receiver cell whose children it lacks, asks for them, and goes on
//! when they arrive (`SentGeometry` answers on the receiver's side), a few rounds in all. So
//! the geometry that travels is what the walk visits, and scales with the domain surface
//! like the LET itself.

use crate::fmm::remote::RemoteTree;
use crate::fmm::traversal::{Mac, open_second};
use crate::fmm::tree::{Cell, Tree};
use bytemuck::Zeroable;
use std::collections::VecDeque;

/// The geometry of one cell of `tree`, its children not (yet) sent.
fn top_cell(tree: &Tree, index: u32) -> TopCell {
    let c = &tree.cells[index as usize];
    TopCell {
        centre: c.centre.map(|v| v as f32),
        r_max: c.r_max as f32,
        mass: c.mass as f32,
        accel: c.accel as f32,
        first_child: if c.is_leaf() { 0 } else { CHILDREN_NOT_SENT },
        child_count: c.child_count as u32,
    }
}

/// The cells of this rank's tree that one exporter has received, in the order it received
/// them: the coarse top first, then children as it asks for them.
#[derive(Debug, Clone, Default)]
pub struct SentGeometry {
    /// Own tree cell of each cell sent.
    own: Vec<u32>,
}

impl SentGeometry {
    /// The coarse top of `tree` that every rank shares, breadth first with children
    /// contiguous, root first: the children of every cell with at least `min_count`
    /// particles. Returns it with the record of what it contains.
    pub fn coarse(tree: &Tree, min_count: usize) -> (SentGeometry, Vec<TopCell>) {
        if tree.own_particles == 0 {
            return (SentGeometry::default(), Vec::new());
        }
        let mut own = vec![0u32];
        let mut out = Vec::new();
        let mut next = 0;
        while next < own.len() {
            let index = own[next];
            let c = &tree.cells[index as usize];
            let mut cell = top_cell(tree, index);
            if !c.is_leaf() && c.count() >= min_count {
                cell.first_child = own.len() as u32;
                own.extend(c.children());
            }
            out.push(cell);
            next += 1;
        }
        (SentGeometry { own }, out)
    }

    /// The children of the sent cells `requested` (indices in the order sent), one cell's
    /// children after the other's, each without its own children.
    pub fn children(&mut self, tree: &Tree, requested: &[u32]) -> Result<Vec<TopCell>, String> {
        let mut out = Vec::new();
        for &g in requested {
            let index = *self.own.get(g as usize).ok_or_else(|| {
                format!("another rank asked for the children of cell {g}, which was never sent")
            })?;
            for k in tree.cells[index as usize].children() {
                out.push(top_cell(tree, k));
                self.own.push(k);
            }
        }
        Ok(out)
    }
}

/// What the receiver's walk needs of one own cell.
const NEED_MULTIPOLE: u8 = 1;
const NEED_CHILDREN: u8 = 2;
const NEED_PARTICLES: u8 = 4;

/// An exporter's emulation of one receiver's walk of its tree against ours, pair by pair
/// with the receiver's own decisions: what it touches is the receiver's locally essential
/// tree (`finish`). It pauses at receiver cells whose children it has not received.
#[derive(Debug, Clone)]
pub struct ExportWalk {
    /// The receiver's cells received so far.
    receiver: Vec<TopCell>,
    /// What the walk needs of each own cell (`NEED_*` bits).
    need: Vec<u8>,
    /// Pairs (receiver cell, own cell) still to visit.
    pairs: Vec<(u32, u32)>,
    /// Pairs waiting for the children of their receiver cell.
    blocked: Vec<(u32, u32)>,
}

impl ExportWalk {
    /// The receiver's cells received so far, root first: after the walk, all the geometry
    /// of the receiver's tree that the packet it sends back refers to (the two walks are
    /// mirror images; `LetPacket::decode`).
    pub fn receiver_cells(&self) -> &[TopCell] {
        &self.receiver
    }

    /// The walk of `tree` for the receiver whose coarse tree is `receiver`.
    pub fn new(tree: &Tree, receiver: Vec<TopCell>) -> Self {
        let start = if tree.own_particles == 0 || receiver.is_empty() {
            Vec::new()
        } else {
            vec![(0, 0)]
        };
        ExportWalk {
            receiver,
            need: vec![0; tree.own_cells],
            pairs: start,
            blocked: Vec::new(),
        }
    }

    /// Walks as far as the receiver's cells received so far allow; returns the receiver
    /// cells whose children it needs to go on (ascending; empty when the walk is done).
    pub fn advance(&mut self, tree: &Tree, mac: Mac) -> Vec<u32> {
        while let Some((a, b)) = self.pairs.pop() {
            let ra = &self.receiver[a as usize];
            let ca = ra.as_cell();
            let cb = &tree.cells[b as usize];
            let n = &mut self.need[b as usize];
            if mac.accepts(&ca, cb) {
                *n |= NEED_MULTIPOLE;
            } else if ca.is_tree_leaf() && cb.is_tree_leaf() {
                *n |= NEED_PARTICLES;
            } else if open_second(&ca, cb) {
                *n |= NEED_CHILDREN;
                self.pairs.extend(cb.children().map(|k| (a, k)));
            } else if ra.hides_children() {
                self.blocked.push((a, b));
            } else {
                self.pairs.extend(ra.children().map(|k| (k, b)));
            }
        }
        let mut wanted: Vec<u32> = self.blocked.iter().map(|&(a, _)| a).collect();
        wanted.sort_unstable();
        wanted.dedup();
        wanted
    }

    /// Takes the receiver's answer to `advance`'s request `requested`: their children, one
    /// cell's after the other's.
    pub fn add_children(&mut self, requested: &[u32], children: &[TopCell]) -> Result<(), String> {
        let mut next = 0usize;
        for &g in requested {
            let first = self.receiver.len() as u32;
            let cell = &mut self.receiver[g as usize];
            let count = cell.child_count as usize;
            cell.first_child = first;
            let part = children
                .get(next..next + count)
                .ok_or("another rank sent fewer cells of its tree than asked for")?;
            self.receiver.extend_from_slice(part);
            next += count;
        }
        if next != children.len() {
            return Err("another rank sent more cells of its tree than asked for".into());
        }
        self.pairs.append(&mut self.blocked);
        Ok(())
    }

    /// The locally essential tree the walk collected, with `len` multipole values per own
    /// cell in `multipoles`.
    pub fn finish(&self, tree: &Tree, multipoles: &[f64], len: usize) -> LetPacket {
        let mut out = LetPacket {
            len,
            ..LetPacket::default()
        };
        if tree.own_particles == 0 || self.receiver.is_empty() {
            return out;
        }
        let need = &self.need;
        let mut queue = VecDeque::from([(0u32, 0usize)]);
        out.cells.push(LetCell::zeroed());
        out.sources.push(0);
        while let Some((c, slot)) = queue.pop_front() {
            let cell = &tree.cells[c as usize];
            let n = need[c as usize];
            let mut entry = LetCell {
                centre: cell.centre,
                r_max: cell.r_max,
                mass: f64::from(cell.mass as f32),
                accel: cell.accel,
                flags: if cell.is_leaf() { TREE_LEAF } else { 0 },
                ..LetCell::zeroed()
            };
            // The receiver rebuilds the multipole of a cell it gets particles or children of.
            if n == NEED_MULTIPOLE {
                entry.flags |= HAS_MULTIPOLE;
                let off = c as usize * len;
                out.multipoles
                    .extend_from_slice(&multipoles[off..off + len]);
            }
            if n & NEED_PARTICLES != 0 {
                entry.begin = out.particles.len() as u32;
                for i in cell.begin as usize..cell.end as usize {
                    let x = tree.pos[i];
                    out.particles.push([x[0], x[1], x[2], tree.mass[i]]);
                }
                if !tree.eps.is_empty() {
                    out.eps
                        .extend_from_slice(&tree.eps[cell.begin as usize..cell.end as usize]);
                }
                entry.end = out.particles.len() as u32;
            }
            if n & NEED_CHILDREN != 0 {
                entry.first_child = out.cells.len() as u32;
                entry.flags |= u32::from(cell.child_count) << 8;
                for (k, child) in cell.children().enumerate() {
                    out.cells.push(LetCell::zeroed());
                    out.sources.push(child);
                    queue.push_back((child, entry.first_child as usize + k));
                }
            }
            out.cells[slot] = entry;
        }
        out
    }
}

use super::let_wire::{CHILDREN_NOT_SENT, HAS_MULTIPOLE, LetCell, LetPacket, TREE_LEAF, TopCell};

/// A received packet as a remote tree: cells sent without their children become opaque,
/// and the multipoles are laid out one per cell (zero where none was sent; the walk never
/// uses those).
pub fn import(packet: &LetPacket, len: usize) -> RemoteTree {
    let (cells, multipoles, particles) = (&packet.cells, &packet.multipoles, &packet.particles);
    let mut expanded = vec![0.0; cells.len() * len];
    let mut next = multipoles.chunks_exact(len);
    for (i, c) in cells.iter().enumerate() {
        if c.flags & HAS_MULTIPOLE != 0
            && let Some(m) = next.next()
        {
            expanded[i * len..(i + 1) * len].copy_from_slice(m);
        }
    }
    RemoteTree {
        cells: cells
            .iter()
            .map(|c| Cell {
                centre: c.centre,
                r_max: c.r_max,
                mass: c.mass,
                accel: c.accel,
                begin: c.begin,
                end: c.end,
                first_child: c.first_child,
                child_count: c.child_count() as u8,
                opaque: c.flags & TREE_LEAF == 0 && c.child_count() == 0,
                ..Cell::default()
            })
            .collect(),
        multipoles: expanded,
        pos: particles.iter().map(|q| [q[0], q[1], q[2]]).collect(),
        mass: particles.iter().map(|q| q[3]).collect(),
        eps: packet.eps.clone(),
    }
}
