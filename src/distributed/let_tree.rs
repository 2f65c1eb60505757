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
/// `LetCell::flags` bit: the cell's particles share one mass, sent once.
const UNIFORM_MASS: u32 = 4;
/// `LetCell::flags` bit: the cell's particles share one softening length, sent once.
const UNIFORM_EPS: u32 = 8;

/// One cell of a locally essential tree on the wire (48 bytes; the receiver needs no mass:
/// the monopole is in the multipole).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct LetCell {
    /// Centre of mass.
    pub centre: [f64; 3],
    /// Bounding radius.
    pub r_max: f64,
    /// First child (children contiguous); 0 when no children were sent.
    pub first_child: u32,
    /// Particle range (empty unless the particles were sent).
    pub begin: u32,
    /// End of the particle range.
    pub end: u32,
    /// `TREE_LEAF` | `HAS_MULTIPOLE` | `UNIFORM_MASS` | `UNIFORM_EPS` in the low byte, the
    /// number of children sent in the next.
    pub flags: u32,
}

impl LetCell {
    /// Number of children sent.
    pub fn child_count(&self) -> u32 {
        (self.flags >> 8) & 0xff
    }
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
    /// Their softening lengths, when these differ between particles (else empty).
    pub eps: Vec<f64>,
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
                queue.push_back((child, entry.first_child as usize + k));
            }
        }
        out.cells[slot] = entry;
    }
    out
}

/// How a packet travels. Positions: in single precision (with the mixed-precision near
/// field, whose own rounding is coarser) as f32 offsets from their leaf's centre, else as
/// f64; multipoles likewise f32 or f64. Masses always travel exactly (f64), once per leaf
/// when its particles share one mass, so the ranks' mutual forces stay symmetric. Cell
/// geometry always travels exactly, because both ranks' walks must decide alike on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WirePrecision {
    /// f32 positions (12 bytes per particle) and multipoles.
    Single,
    /// f64 positions (24 bytes per particle) and multipoles.
    Double,
}

/// Bytes of the count header of an encoded packet.
const HEADER: usize = 5 * 8;

/// A per-particle quantity of a packet's particles, in cell order: one value for a leaf
/// whose particles all share it (flagged `flag`), else one per particle.
fn leaf_stream(cells: &mut [LetCell], values: &[f64], flag: u32) -> Vec<f64> {
    let mut out = Vec::new();
    for c in cells.iter_mut().filter(|c| c.end > c.begin) {
        let part = &values[c.begin as usize..c.end as usize];
        if part.iter().all(|v| v.to_bits() == part[0].to_bits()) {
            c.flags |= flag;
            out.push(part[0]);
        } else {
            out.extend_from_slice(part);
        }
    }
    out
}

/// The inverse of `leaf_stream`: the per-particle values of `np` particles.
fn unstream(cells: &[LetCell], stream: &[f64], flag: u32, np: usize) -> Option<Vec<f64>> {
    let mut out = vec![0.0; np];
    let mut next = stream.iter();
    for c in cells.iter().filter(|c| c.end > c.begin) {
        let part = out.get_mut(c.begin as usize..c.end as usize)?;
        if c.flags & flag != 0 {
            part.fill(*next.next()?);
        } else {
            for v in part {
                *v = *next.next()?;
            }
        }
    }
    Some(out)
}

impl LetPacket {
    /// The packet as bytes: five u64 counts (cells, multipole values, particles, mass
    /// values, softening values), the cells, the multipoles, the positions, the masses, the
    /// softening lengths.
    pub fn encode(&self, precision: WirePrecision) -> Vec<u8> {
        let mut cells = self.cells.clone();
        let m: Vec<f64> = self.particles.iter().map(|q| q[3]).collect();
        let masses = leaf_stream(&mut cells, &m, UNIFORM_MASS);
        let eps = if self.eps.is_empty() {
            Vec::new()
        } else {
            leaf_stream(&mut cells, &self.eps, UNIFORM_EPS)
        };
        let mut out = Vec::new();
        for count in [
            cells.len(),
            self.multipoles.len(),
            self.particles.len(),
            masses.len(),
            eps.len(),
        ] {
            out.extend_from_slice(&(count as u64).to_le_bytes());
        }
        out.extend_from_slice(bytemuck::cast_slice(&cells));
        match precision {
            WirePrecision::Double => {
                out.extend_from_slice(bytemuck::cast_slice(&self.multipoles));
                let x: Vec<[f64; 3]> = self.particles.iter().map(|q| [q[0], q[1], q[2]]).collect();
                out.extend_from_slice(bytemuck::cast_slice(&x));
            }
            WirePrecision::Single => {
                let m: Vec<f32> = self.multipoles.iter().map(|&v| v as f32).collect();
                out.extend_from_slice(bytemuck::cast_slice(&m));
                let mut x = vec![[0f32; 3]; self.particles.len()];
                for c in &cells {
                    for i in c.begin as usize..c.end as usize {
                        let q = self.particles[i];
                        x[i] = std::array::from_fn(|k| (q[k] - c.centre[k]) as f32);
                    }
                }
                out.extend_from_slice(bytemuck::cast_slice(&x));
            }
        }
        out.extend_from_slice(bytemuck::cast_slice(&masses));
        out.extend_from_slice(bytemuck::cast_slice(&eps));
        out
    }

    /// Decodes `encode`'s bytes (positions back to absolute f64).
    pub fn decode(bytes: &[u8], precision: WirePrecision) -> Result<LetPacket, String> {
        let bad = || "a locally essential tree arrived truncated".to_string();
        let count = |k: usize| -> Result<usize, String> {
            let b = bytes.get(8 * k..8 * k + 8).ok_or_else(bad)?;
            let mut a = [0u8; 8];
            a.copy_from_slice(b);
            Ok(u64::from_le_bytes(a) as usize)
        };
        let (nc, nm, np, nq, ne) = (count(0)?, count(1)?, count(2)?, count(3)?, count(4)?);
        let (value, position) = match precision {
            WirePrecision::Single => (4, 12),
            WirePrecision::Double => (8, 24),
        };
        let cell_bytes = nc * std::mem::size_of::<LetCell>();
        if bytes.len() != HEADER + cell_bytes + nm * value + np * position + (nq + ne) * 8 {
            return Err(bad());
        }
        let mut at = HEADER;
        let mut take = |n: usize| {
            let part = &bytes[at..at + n];
            at += n;
            part
        };
        let cells: Vec<LetCell> = bytemuck::pod_collect_to_vec(take(cell_bytes));
        let (multipoles, positions): (Vec<f64>, Vec<[f64; 3]>) = match precision {
            WirePrecision::Double => (
                bytemuck::pod_collect_to_vec(take(nm * 8)),
                bytemuck::pod_collect_to_vec(take(np * 24)),
            ),
            WirePrecision::Single => {
                let m: Vec<f32> = bytemuck::pod_collect_to_vec(take(nm * 4));
                let x: Vec<[f32; 3]> = bytemuck::pod_collect_to_vec(take(np * 12));
                (
                    m.iter().map(|&v| f64::from(v)).collect(),
                    x.iter().map(|v| v.map(f64::from)).collect(),
                )
            }
        };
        let masses: Vec<f64> = bytemuck::pod_collect_to_vec(take(nq * 8));
        let eps_stream: Vec<f64> = bytemuck::pod_collect_to_vec(take(ne * 8));
        let masses = unstream(&cells, &masses, UNIFORM_MASS, np).ok_or_else(bad)?;
        let eps = if ne == 0 {
            Vec::new()
        } else {
            unstream(&cells, &eps_stream, UNIFORM_EPS, np).ok_or_else(bad)?
        };
        let mut particles = vec![[0.0; 4]; np];
        for c in cells.iter().filter(|c| c.end > c.begin) {
            let range = c.begin as usize..c.end as usize;
            let xs = positions.get(range.clone()).ok_or_else(bad)?;
            for (i, x) in range.zip(xs) {
                let x = match precision {
                    WirePrecision::Single => std::array::from_fn(|k| x[k] + c.centre[k]),
                    WirePrecision::Double => *x,
                };
                particles[i] = [x[0], x[1], x[2], masses[i]];
            }
        }
        Ok(LetPacket {
            cells,
            multipoles,
            particles,
            eps,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn packet() -> LetPacket {
        let leaf = |centre: [f64; 3], begin: u32, end: u32| LetCell {
            centre,
            r_max: 0.5,
            begin,
            end,
            flags: TREE_LEAF,
            ..LetCell::zeroed()
        };
        LetPacket {
            cells: vec![
                LetCell {
                    first_child: 1,
                    flags: 2 << 8,
                    ..LetCell::zeroed()
                },
                leaf([1.0, 2.0, 3.0], 0, 3),
                leaf([-4.0, 0.5, 0.0], 3, 5),
            ],
            multipoles: vec![0.25, -1.5, 3.0],
            particles: vec![
                [1.1, 2.2, 3.3, 0.125],
                [0.9, 1.8, 2.7, 0.125],
                [1.0, 2.0, 3.05, 0.125],
                [-4.1, 0.5, 0.1, 0.3],
                [-3.9, 0.4, -0.1, 0.7],
            ],
            eps: Vec::new(),
        }
    }

    #[test]
    fn packets_round_trip_exactly_in_double_and_closely_in_single() {
        let p = packet();
        let d = LetPacket::decode(&p.encode(WirePrecision::Double), WirePrecision::Double).unwrap();
        assert_eq!(d.particles, p.particles);
        assert_eq!(d.multipoles, p.multipoles);
        assert_eq!(d.cells[1].flags, TREE_LEAF | UNIFORM_MASS);
        assert_eq!(d.cells[2].flags, TREE_LEAF);
        let single = p.encode(WirePrecision::Single);
        // 3 cells, 3 f32 multipole values, 5 f32 positions, masses: 1 (uniform leaf) + 2.
        assert_eq!(single.len(), HEADER + 3 * 48 + 3 * 4 + 5 * 12 + 3 * 8);
        let mut varied = p.clone();
        varied.eps = vec![0.1, 0.1, 0.1, 0.2, 0.05];
        let v = LetPacket::decode(&varied.encode(WirePrecision::Single), WirePrecision::Single)
            .unwrap();
        assert_eq!(v.eps, varied.eps);
        let s = LetPacket::decode(&single, WirePrecision::Single).unwrap();
        for (a, b) in s.particles.iter().zip(&p.particles) {
            assert_eq!(a[3], b[3], "masses travel exactly");
            for k in 0..3 {
                assert!((a[k] - b[k]).abs() < 1e-6, "{a:?} vs {b:?}");
            }
        }
        assert!(LetPacket::decode(&single[..single.len() - 1], WirePrecision::Single).is_err());
    }
}
