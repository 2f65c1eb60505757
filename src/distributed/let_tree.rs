//! Locally essential trees (Warren & Salmon 1993; design §6). Every rank shares the geometry
//! of its tree (the top tree); every other rank then runs, on its own tree against that
//! geometry, exactly the walk the receiver will run against it, and sends what that walk
//! touches: multipoles of the cells it accepts, children of the cells it opens, particles of
//! the leaves it pairs with leaves. Nothing else travels (a cell that is only opened sends
//! no multipole), so the traffic follows the domain's surface, and because the walk's
//! decisions are symmetric (`open_second`), the cross-domain pairs the two ranks of a pair
//! use are mirror images: every far interaction acts both ways, as within one rank.

use crate::fmm::solver::RemoteTree;
use crate::fmm::traversal::{Mac, open_second};
use crate::fmm::tree::{Cell, Tree};
use bytemuck::{Pod, Zeroable};
use std::collections::VecDeque;

/// Geometry of one cell of a rank's tree, as other ranks see it.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct TopCell {
    /// Centre of mass.
    pub centre: [f64; 3],
    /// Bounding radius about the centre.
    pub r_max: f64,
    /// First child (children contiguous).
    pub first_child: u32,
    /// Number of children (0 for a leaf).
    pub child_count: u32,
}

impl TopCell {
    /// The cell as the walks see it: the same centre and radius bits as the owner's cell.
    fn as_cell(&self) -> Cell {
        Cell {
            centre: self.centre,
            r_max: self.r_max,
            child_count: self.child_count as u8,
            ..Cell::default()
        }
    }

    fn children(&self) -> std::ops::Range<u32> {
        self.first_child..self.first_child + self.child_count
    }
}

/// The geometry of every cell of `tree`, breadth first with children contiguous (56 bytes
/// per cell).
pub fn top_tree(tree: &Tree) -> Vec<TopCell> {
    if tree.own_particles == 0 {
        return Vec::new();
    }
    let mut out = Vec::with_capacity(tree.own_cells);
    let mut source = vec![0u32];
    let mut next = 0;
    while next < source.len() {
        let c = &tree.cells[source[next] as usize];
        let first_child = source.len() as u32;
        source.extend(c.children());
        out.push(TopCell {
            centre: c.centre,
            r_max: c.r_max,
            first_child: if c.is_leaf() { 0 } else { first_child },
            child_count: c.child_count as u32,
        });
        next += 1;
    }
    out
}

/// `LetCell::flags` bit: the cell is a leaf of the sender's tree.
const TREE_LEAF: u32 = 1;
/// `LetCell::flags` bit: the cell's multipole was sent.
const HAS_MULTIPOLE: u32 = 2;

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
    /// First child (children contiguous); 0 when no children were sent.
    pub first_child: u32,
    /// Number of children sent.
    pub child_count: u32,
    /// Particle range (empty unless the particles were sent).
    pub begin: u32,
    /// End of the particle range.
    pub end: u32,
    /// `TREE_LEAF` | `HAS_MULTIPOLE`.
    pub flags: u32,
    /// Padding (Pod layout).
    pub pad: u32,
}

/// What one rank sends another.
#[derive(Debug, Clone, Default)]
pub struct LetPacket {
    /// Cells, root first, breadth first.
    pub cells: Vec<LetCell>,
    /// The multipoles of the cells flagged `HAS_MULTIPOLE`, in cell order.
    pub multipoles: Vec<f64>,
    /// Particles of the leaves sent with particles: x, y, z, m.
    pub particles: Vec<[f64; 4]>,
}

/// What the receiver's walk needs of one own cell.
const NEED_MULTIPOLE: u8 = 1;
const NEED_CHILDREN: u8 = 2;
const NEED_PARTICLES: u8 = 4;

/// The locally essential tree of `tree` (with `len` multipole values per cell) for the
/// receiver whose tree geometry is `receiver`: the receiver's walk of its tree against ours,
/// emulated pair by pair with the receiver's own decisions.
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
    let mut need = vec![0u8; tree.own_cells];
    let mut pairs = vec![(0u32, 0u32)];
    while let Some((a, b)) = pairs.pop() {
        let ra = &receiver[a as usize];
        let ca = ra.as_cell();
        let cb = &tree.cells[b as usize];
        let n = &mut need[b as usize];
        if mac.accepts(&ca, cb) {
            *n |= NEED_MULTIPOLE;
        } else if ca.is_tree_leaf() && cb.is_tree_leaf() {
            *n |= NEED_PARTICLES;
        } else if open_second(&ca, cb) {
            *n |= NEED_CHILDREN;
            pairs.extend(cb.children().map(|k| (a, k)));
        } else {
            pairs.extend(ra.children().map(|k| (k, b)));
        }
    }
    let mut queue = VecDeque::from([(0u32, 0usize)]);
    out.cells.push(LetCell::zeroed());
    while let Some((c, slot)) = queue.pop_front() {
        let cell = &tree.cells[c as usize];
        let n = need[c as usize];
        let mut entry = LetCell {
            centre: cell.centre,
            r_max: cell.r_max,
            mass: cell.mass,
            flags: if cell.is_leaf() { TREE_LEAF } else { 0 },
            ..LetCell::zeroed()
        };
        if n & NEED_MULTIPOLE != 0 {
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
            entry.end = out.particles.len() as u32;
        }
        if n & NEED_CHILDREN != 0 {
            entry.first_child = out.cells.len() as u32;
            entry.child_count = cell.child_count as u32;
            for (k, child) in cell.children().enumerate() {
                out.cells.push(LetCell::zeroed());
                queue.push_back((child, entry.first_child as usize + k));
            }
        }
        out.cells[slot] = entry;
    }
    out
}

/// How a packet travels: in single precision (with the mixed-precision near field, whose
/// own rounding is coarser) multipoles go as f32 and particles as f32 offsets from their
/// leaf's centre with an f32 mass, half the bytes of f64; cell geometry always travels
/// exactly, because both ranks' walks must take the same decisions on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WirePrecision {
    /// f32 multipoles and particle records (16 bytes per particle).
    Single,
    /// f64 throughout (32 bytes per particle).
    Double,
}

/// Bytes of the count header of an encoded packet.
const HEADER: usize = 3 * 8;

impl LetPacket {
    /// The packet as bytes: three u64 counts (cells, multipole values, particles), the cells,
    /// the multipoles, the particles.
    pub fn encode(&self, precision: WirePrecision) -> Vec<u8> {
        let mut out = Vec::new();
        for count in [
            self.cells.len(),
            self.multipoles.len(),
            self.particles.len(),
        ] {
            out.extend_from_slice(&(count as u64).to_le_bytes());
        }
        out.extend_from_slice(bytemuck::cast_slice(&self.cells));
        match precision {
            WirePrecision::Double => {
                out.extend_from_slice(bytemuck::cast_slice(&self.multipoles));
                out.extend_from_slice(bytemuck::cast_slice(&self.particles));
            }
            WirePrecision::Single => {
                let m: Vec<f32> = self.multipoles.iter().map(|&v| v as f32).collect();
                out.extend_from_slice(bytemuck::cast_slice(&m));
                let mut q = vec![[0f32; 4]; self.particles.len()];
                for c in &self.cells {
                    for i in c.begin as usize..c.end as usize {
                        let x = self.particles[i];
                        q[i] = [
                            (x[0] - c.centre[0]) as f32,
                            (x[1] - c.centre[1]) as f32,
                            (x[2] - c.centre[2]) as f32,
                            x[3] as f32,
                        ];
                    }
                }
                out.extend_from_slice(bytemuck::cast_slice(&q));
            }
        }
        out
    }

    /// Decodes `encode`'s bytes (particles back to absolute f64 positions).
    pub fn decode(bytes: &[u8], precision: WirePrecision) -> Result<LetPacket, String> {
        let bad = || "a locally essential tree arrived truncated".to_string();
        let count = |k: usize| -> Result<usize, String> {
            let b = bytes.get(8 * k..8 * k + 8).ok_or_else(bad)?;
            let mut a = [0u8; 8];
            a.copy_from_slice(b);
            Ok(u64::from_le_bytes(a) as usize)
        };
        let (nc, nm, np) = (count(0)?, count(1)?, count(2)?);
        let (value, record) = match precision {
            WirePrecision::Single => (4, 16),
            WirePrecision::Double => (8, 32),
        };
        let cell_bytes = nc * std::mem::size_of::<LetCell>();
        if bytes.len() != HEADER + cell_bytes + nm * value + np * record {
            return Err(bad());
        }
        let mut at = HEADER;
        let mut take = |n: usize| {
            let part = &bytes[at..at + n];
            at += n;
            part
        };
        let cells: Vec<LetCell> = bytemuck::pod_collect_to_vec(take(cell_bytes));
        let (multipoles, mut particles) = match precision {
            WirePrecision::Double => (
                bytemuck::pod_collect_to_vec::<u8, f64>(take(nm * 8)),
                bytemuck::pod_collect_to_vec::<u8, [f64; 4]>(take(np * 32)),
            ),
            WirePrecision::Single => {
                let m: Vec<f32> = bytemuck::pod_collect_to_vec(take(nm * 4));
                let q: Vec<[f32; 4]> = bytemuck::pod_collect_to_vec(take(np * 16));
                (
                    m.iter().map(|&v| f64::from(v)).collect(),
                    q.iter()
                        .map(|v| {
                            [
                                f64::from(v[0]),
                                f64::from(v[1]),
                                f64::from(v[2]),
                                f64::from(v[3]),
                            ]
                        })
                        .collect(),
                )
            }
        };
        if precision == WirePrecision::Single {
            for c in &cells {
                let range = c.begin as usize..c.end as usize;
                let part = particles.get_mut(range).ok_or_else(bad)?;
                for x in part {
                    for k in 0..3 {
                        x[k] += c.centre[k];
                    }
                }
            }
        }
        Ok(LetPacket {
            cells,
            multipoles,
            particles,
        })
    }
}

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
                begin: c.begin,
                end: c.end,
                first_child: c.first_child,
                child_count: c.child_count as u8,
                opaque: c.flags & TREE_LEAF == 0 && c.child_count == 0,
                ..Cell::default()
            })
            .collect(),
        multipoles: expanded,
        pos: particles.iter().map(|q| [q[0], q[1], q[2]]).collect(),
        mass: particles.iter().map(|q| q[3]).collect(),
    }
}
