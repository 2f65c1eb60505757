//! A locally essential tree as it travels: the shared top-tree geometry (`TopCell`,
//! `encode_geometry`), and the packets (`LetPacket`, `LetCell`): a count header, the
//! cells bit-packed, multipoles in block floating point per degree, positions as 18-bit
//! offsets from their leaf's centre, masses and softening lengths through palettes — or
//! exact f64 (`WirePrecision`). What goes into a packet (the export walk) and how a
//! received one becomes a remote tree is `let_tree`'s.

use crate::fmm::tree::{Cell, WIRE_POSITION_BITS, dequantise_position, quantise_position};
use bytemuck::{Pod, Zeroable};

/// `TopCell::first_child` of a cell whose children were not sent.
pub(super) const CHILDREN_NOT_SENT: u32 = u32::MAX;

/// Geometry of one cell of a rank's tree, as other ranks see it (the tree keeps its
/// geometry f32-representable; `encode_geometry` for the wire).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TopCell {
    /// Centre of mass.
    pub centre: [f32; 3],
    /// Bounding radius about the centre.
    pub r_max: f32,
    /// Its mass in f32 and the weakest acceleration its particles are expected to feel
    /// (`Cell::accel`; 0 when not known), which the error-controlled MAC tests.
    pub mass: f32,
    /// See `mass`.
    pub accel: f32,
    /// First child (children contiguous); `CHILDREN_NOT_SENT` for a cell sent without them.
    pub first_child: u32,
    /// Number of children in the owner's tree (0 for a leaf).
    pub child_count: u32,
}

impl TopCell {
    /// The cell as the walks see it: the same centre and radius bits as the owner's cell.
    pub(super) fn as_cell(&self) -> Cell {
        Cell {
            centre: self.centre.map(f64::from),
            r_max: f64::from(self.r_max),
            mass: f64::from(self.mass),
            accel: f64::from(self.accel),
            child_count: self.child_count as u8,
            ..Cell::default()
        }
    }

    /// True when the cell has children in its owner's tree that were not sent.
    pub(super) fn hides_children(&self) -> bool {
        self.child_count > 0 && self.first_child == CHILDREN_NOT_SENT
    }

    /// The children sent (none for a leaf or a cell sent without them).
    pub(super) fn children(&self) -> std::ops::Range<u32> {
        if self.hides_children() {
            return 0..0;
        }
        self.first_child..self.first_child + self.child_count
    }
}

/// Bytes of one cell's geometry on the wire (`encode_geometry`): centre and radius (f32)
/// and the child count.
pub(super) const GEOMETRY_BYTES: usize = 17;

/// Bytes the error-controlled MAC adds to each record: mass and expected acceleration.
pub(super) const ERROR_BYTES: usize = 8;

/// `encode_geometry`'s flag in the byte of the child count: the children follow.
pub(super) const CHILDREN_FOLLOW: u8 = 0x80;

/// Cells' geometry as bytes, `GEOMETRY_BYTES` per cell: centre and radius (f32,
/// little-endian), with `for_error` (a walk that controls the error) mass and expected
/// acceleration too (`ERROR_BYTES` more), and the number of children, flagged when the
/// children were sent too (then they come later in the same list, breadth first, children
/// contiguous, as in `SentGeometry::coarse`).
pub fn encode_geometry(cells: &[TopCell], for_error: bool) -> Vec<u8> {
    let record = GEOMETRY_BYTES + if for_error { ERROR_BYTES } else { 0 };
    let mut out = Vec::with_capacity(cells.len() * record);
    for c in cells {
        for v in c.centre.iter().chain([&c.r_max]) {
            out.extend_from_slice(&v.to_le_bytes());
        }
        if for_error {
            for v in [c.mass, c.accel] {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        let follow = if c.child_count > 0 && !c.hides_children() {
            CHILDREN_FOLLOW
        } else {
            0
        };
        out.push(c.child_count as u8 | follow);
    }
    out
}

/// The inverse of `encode_geometry` (with the same `for_error`).
pub fn decode_geometry(bytes: &[u8], for_error: bool) -> Result<Vec<TopCell>, String> {
    let bad = || "another rank's tree geometry arrived malformed".to_string();
    let size = GEOMETRY_BYTES + if for_error { ERROR_BYTES } else { 0 };
    if !bytes.len().is_multiple_of(size) {
        return Err(bad());
    }
    let mut next = 1u32;
    let mut out = Vec::with_capacity(bytes.len() / size);
    for record in bytes.chunks_exact(size) {
        let f = |k: usize| {
            f32::from_le_bytes([
                record[4 * k],
                record[4 * k + 1],
                record[4 * k + 2],
                record[4 * k + 3],
            ])
        };
        let flags = record[size - 1];
        let count = u32::from(flags & !CHILDREN_FOLLOW);
        let first_child = if count == 0 {
            0
        } else if flags & CHILDREN_FOLLOW != 0 {
            next += count;
            next - count
        } else {
            CHILDREN_NOT_SENT
        };
        let (mass, accel) = if for_error { (f(4), f(5)) } else { (0.0, 0.0) };
        out.push(TopCell {
            centre: [f(0), f(1), f(2)],
            r_max: f(3),
            mass,
            accel,
            first_child,
            child_count: count,
        });
    }
    if next as usize > out.len().max(1) {
        return Err(bad());
    }
    Ok(out)
}

/// `LetCell::flags` bit: the cell is a leaf of the sender's tree.
pub(super) const TREE_LEAF: u32 = 1;
/// `LetCell::flags` bit: the cell's multipole was sent.
pub(super) const HAS_MULTIPOLE: u32 = 2;
/// `LetCell::flags` bit: the cell's particles share one mass, sent once.
pub(super) const UNIFORM_MASS: u32 = 4;
/// `LetCell::flags` bit: the cell's particles share one softening length, sent once.
pub(super) const UNIFORM_EPS: u32 = 8;

/// One cell of a locally essential tree (it travels as a few flag bits, `push_cells`; its
/// geometry, mass and expected acceleration came with the receiver's requests).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct LetCell {
    /// Centre of mass.
    pub centre: [f64; 3],
    /// Bounding radius.
    pub r_max: f64,
    /// Mass (f32-representable: the MAC's; the monopole is in the multipole).
    pub mass: f64,
    /// Expected weakest acceleration (`Cell::accel`).
    pub accel: f64,
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
    /// Values per multipole (`real_len` of the order).
    pub len: usize,
    /// Particles of the leaves sent with particles: x, y, z, m.
    pub particles: Vec<[f64; 4]>,
    /// Their softening lengths, when these differ between particles (else empty).
    pub eps: Vec<f64>,
    /// The sender's own cell of each cell (not encoded: with `WirePrecision::CellsOnly`,
    /// what the sender's device gathers the payload from).
    pub sources: Vec<u32>,
}

/// How a packet travels. Cell geometry always travels exactly (the tree keeps it
/// f32-representable, and both ranks' walks must decide alike on it), and masses and
/// softening lengths too (f64, once per leaf when its particles share one value, and as
/// indices into the packet's few distinct values when that is shorter), so the ranks'
/// mutual forces stay symmetric. Positions and multipoles are compressed for the mixed-precision near field,
/// whose own rounding is coarser, and exact otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WirePrecision {
    /// Positions as 18-bit offsets from their leaf's centre in units of `r_max / (2^17 - 1)`
    /// (6.75 bytes per particle, see `quantise_position`; the sender puts its particles at
    /// the same rounded positions for the whole evaluation, `Tree::quantise_own_positions`,
    /// so that both ranks of every pair see the same two positions); multipoles in
    /// block floating point per degree (`MANTISSA_BITS`-bit mantissas under one
    /// power-of-two scale).
    Single,
    /// f64 positions (24 bytes per particle) and multipoles.
    Double,
    /// The cells only: the multipoles of all of them and the particles' positions and masses
    /// move between the ranks' devices (`super::payload`); decoded particles are zero
    /// placeholders until they land there. One softening length for all particles.
    CellsOnly,
}

/// Bytes of the count header of an encoded packet.
pub(super) const HEADER: usize = 10 * 8;

/// Bits of each multipole coefficient's mantissa (sign included) in `WirePrecision::Single`:
/// the error is at most 2^-20 of the largest coefficient of the same degree, small enough
/// that cross-domain forces stay mirror images to well below the FMM's own asymmetry
/// (16 bits measurably degraded momentum conservation on 4 ranks).
pub(super) const MANTISSA_BITS: u32 = 24;

/// Bits of a degree's power-of-two scale.
pub(super) const EXPONENT_BITS: u32 = 16;

/// Bits of the sender's largest leaf particle count in a packet (`count_bits` of the header).
pub(super) fn count_bits(cells: &[LetCell]) -> u32 {
    let most = cells.iter().map(|c| c.end - c.begin).max().unwrap_or(0);
    index_bits(most as usize + 1)
}

/// Writes the cells as bits, a few per cell: whether its multipole, children and particles
/// were sent, and for a leaf with particles their count and whether they share one mass and
/// one softening length. Their geometry does not travel again: the receiver has every
/// cell's centre, radius and number of children from the geometry its own exports asked for
/// (`decode`).
pub(super) fn push_cells(cells: &[LetCell], bits: u32, out: &mut BitWriter) {
    let flag = |c: &LetCell, f: u32| u64::from(c.flags & f != 0);
    for c in cells {
        let count = c.end - c.begin;
        out.push(flag(c, HAS_MULTIPOLE), 1);
        out.push(u64::from(c.child_count() > 0), 1);
        out.push(u64::from(count > 0), 1);
        if count > 0 {
            out.push(flag(c, UNIFORM_MASS), 1);
            out.push(flag(c, UNIFORM_EPS), 1);
            out.push(u64::from(count), bits);
        }
    }
}

/// Reads `push_cells`' `nc` cells, taking their geometry from `geometry`, the sender's
/// cells as this rank received them (root first): the packet's root is `geometry[0]`, and
/// the children of a cell sent with children are its children there. Particle ranges
/// follow from the counts (particles in cell order).
pub(super) fn read_cells(
    bits: &mut BitReader,
    nc: usize,
    count_bits: u32,
    geometry: &[TopCell],
) -> Result<Vec<LetCell>, String> {
    let bad = || "a locally essential tree arrived truncated".to_string();
    let unknown = || {
        "a locally essential tree refers to cells of its sender's tree that this rank never \
         received"
            .to_string()
    };
    let mut cells = Vec::with_capacity(nc);
    let mut source = Vec::with_capacity(nc);
    source.extend((nc > 0).then_some(0u32));
    let mut next_particle = 0u32;
    for i in 0..nc {
        let top = geometry
            .get(*source.get(i).ok_or_else(bad)? as usize)
            .ok_or_else(unknown)?;
        let mut read = |n: u32| bits.read(n).ok_or_else(bad);
        let mut c = LetCell {
            centre: top.centre.map(f64::from),
            r_max: f64::from(top.r_max),
            mass: f64::from(top.mass),
            accel: f64::from(top.accel),
            flags: if top.child_count == 0 { TREE_LEAF } else { 0 },
            ..LetCell::zeroed()
        };
        if read(1)? == 1 {
            c.flags |= HAS_MULTIPOLE;
        }
        let has_children = read(1)? == 1;
        if read(1)? == 1 {
            if read(1)? == 1 {
                c.flags |= UNIFORM_MASS;
            }
            if read(1)? == 1 {
                c.flags |= UNIFORM_EPS;
            }
            let count = read(count_bits)? as u32;
            c.begin = next_particle;
            next_particle = next_particle.checked_add(count).ok_or_else(bad)?;
            c.end = next_particle;
        }
        if has_children {
            if top.hides_children() || top.child_count == 0 {
                return Err(unknown());
            }
            c.first_child = source.len() as u32;
            c.flags |= top.child_count << 8;
            source.extend(top.children());
        }
        cells.push(c);
    }
    if source.len() != nc {
        return Err(bad());
    }
    Ok(cells)
}

/// A per-particle quantity of a packet's particles, in cell order: one value for a leaf
/// whose particles all share it (flagged `flag`), else one per particle.
pub(super) fn leaf_stream(cells: &mut [LetCell], values: &[f64], flag: u32) -> Vec<f64> {
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
pub(super) fn unstream(
    cells: &[LetCell],
    stream: &[f64],
    flag: u32,
    np: usize,
) -> Option<Vec<f64>> {
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

/// Bits of an index into a palette of `p` values (0 for a single value).
pub(super) fn index_bits(p: usize) -> u32 {
    usize::BITS - p.saturating_sub(1).leading_zeros()
}

/// The distinct values of `stream` in order of first appearance, when sending them once
/// and an index per value is shorter than the values themselves (a galaxy's masses and
/// softening lengths take a few values, one per component); else empty.
pub(super) fn palette_of(stream: &[f64]) -> Vec<f64> {
    let mut seen = std::collections::HashSet::new();
    let mut palette = Vec::new();
    for v in stream {
        if seen.insert(v.to_bits()) {
            palette.push(*v);
            if 2 * palette.len() > stream.len() {
                return Vec::new();
            }
        }
    }
    palette
}

/// Bytes of a stream of `s` values with a palette of `p` (0: the values themselves).
pub(super) fn stream_bytes(s: usize, p: usize) -> usize {
    if p == 0 {
        8 * s
    } else {
        8 * p + (s * index_bits(p) as usize).div_ceil(8)
    }
}

/// Writes `stream`: the values, or the palette then each value's index in it.
pub(super) fn push_stream(stream: &[f64], palette: &[f64], out: &mut Vec<u8>) {
    if palette.is_empty() {
        out.extend_from_slice(bytemuck::cast_slice(stream));
        return;
    }
    out.extend_from_slice(bytemuck::cast_slice(palette));
    let index: std::collections::HashMap<u64, u64> = (0u64..)
        .zip(palette)
        .map(|(i, v)| (v.to_bits(), i))
        .collect();
    let bits = index_bits(palette.len());
    let mut w = BitWriter::default();
    for v in stream {
        w.push(index[&v.to_bits()], bits);
    }
    out.extend_from_slice(&w.finish());
}

/// Reads `push_stream`'s `s` values with a palette of `p` from `bytes`.
pub(super) fn read_stream(bytes: &[u8], s: usize, p: usize) -> Option<Vec<f64>> {
    if p == 0 {
        return Some(bytemuck::pod_collect_to_vec(bytes));
    }
    let palette: Vec<f64> = bytemuck::pod_collect_to_vec(bytes.get(..8 * p)?);
    let mut r = BitReader {
        bytes: &bytes[8 * p..],
        at: 0,
    };
    let bits = index_bits(p);
    (0..s)
        .map(|_| palette.get(r.read(bits)? as usize).copied())
        .collect()
}

/// Little-endian bit packing for the block-floating-point multipoles.
#[derive(Default)]
pub(super) struct BitWriter {
    out: Vec<u8>,
    acc: u64,
    bits: u32,
}

impl BitWriter {
    fn push(&mut self, value: u64, bits: u32) {
        self.acc |= value << self.bits;
        self.bits += bits;
        while self.bits >= 8 {
            self.out.push(self.acc as u8);
            self.acc >>= 8;
            self.bits -= 8;
        }
    }

    fn finish(mut self) -> Vec<u8> {
        if self.bits > 0 {
            self.out.push(self.acc as u8);
        }
        self.out
    }
}

pub(super) struct BitReader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl BitReader<'_> {
    fn read(&mut self, bits: u32) -> Option<u64> {
        let mut value = 0u64;
        for k in 0..bits as usize {
            let bit = self.at + k;
            let byte = *self.bytes.get(bit / 8)?;
            value |= u64::from((byte >> (bit % 8)) & 1) << k;
        }
        self.at += bits as usize;
        Some(value)
    }
}

/// 2^k as an f64 (|k| within the normal range).
pub(super) fn pow2(k: i32) -> f64 {
    f64::from_bits(((k + 1023) as u64) << 52)
}

/// Expansion order of multipoles of `len` f64 values ((p + 1)(p + 2) = len).
pub(super) fn order_of(len: usize) -> Option<usize> {
    (0..64).find(|p| (p + 1) * (p + 2) == len)
}

/// The f64 indices of degree `n`'s independent values: Re (n, 0), then Re and Im of (n, m)
/// for m = 1..=n (Im (n, 0) is zero for real sources and does not travel).
pub(super) fn degree_indices(n: usize) -> impl Iterator<Item = usize> {
    let first = n * (n + 1);
    std::iter::once(first).chain(first + 2..first + 2 * (n + 1))
}

/// Bits of one multipole of order `p` in block floating point.
pub(super) fn multipole_bits(p: usize) -> usize {
    (p + 1) * EXPONENT_BITS as usize + (p + 1) * (p + 1) * MANTISSA_BITS as usize
}

/// Writes one multipole of order `p`: per degree, a scale 2^e above its largest value
/// (e as a biased 16-bit integer, 0 for an all-zero degree), then each value as a signed
/// `MANTISSA_BITS`-bit multiple of 2^(e - MANTISSA_BITS + 1) in offset binary.
pub(super) fn pack_multipole(m: &[f64], p: usize, out: &mut BitWriter) {
    let half = 1i64 << (MANTISSA_BITS - 1);
    for n in 0..=p {
        let largest = degree_indices(n).map(|i| m[i].abs()).fold(0.0, f64::max);
        // The smallest e with largest < 2^e; degrees below 2^-1000 are zero for all uses.
        let e = ((largest.to_bits() >> 52) & 0x7ff) as i32 - 1022;
        if !(largest.is_finite() && e > -1000) {
            out.push(0, EXPONENT_BITS);
            for _ in degree_indices(n) {
                out.push(half as u64, MANTISSA_BITS);
            }
            continue;
        }
        out.push((e + 32768) as u64, EXPONENT_BITS);
        let scale = pow2(MANTISSA_BITS as i32 - 1) * pow2(-e);
        for i in degree_indices(n) {
            let q = (m[i] * scale)
                .round()
                .clamp(-(half - 1) as f64, (half - 1) as f64) as i64;
            out.push((q + half) as u64, MANTISSA_BITS);
        }
    }
}

/// Reads `pack_multipole`'s values into `m` (`real_len(p)` values).
pub(super) fn unpack_multipole(bits: &mut BitReader, p: usize, m: &mut [f64]) -> Option<()> {
    let half = 1i64 << (MANTISSA_BITS - 1);
    m.fill(0.0);
    for n in 0..=p {
        let biased = bits.read(EXPONENT_BITS)? as i32;
        let unit = if biased == 0 {
            0.0
        } else {
            pow2(biased - 32768) * pow2(1 - MANTISSA_BITS as i32)
        };
        for i in degree_indices(n) {
            let q = bits.read(MANTISSA_BITS)? as i64 - half;
            m[i] = q as f64 * unit;
        }
    }
    Some(())
}

impl LetPacket {
    /// The packet as bytes: ten u64 counts (cells, multipoles, values per multipole,
    /// particles, mass values and their palette, softening values and their palette, bits
    /// of a particle count, bytes of the cells), the cells (`push_cells`), the multipoles,
    /// the positions, the masses, the softening lengths.
    pub fn encode(&self, precision: WirePrecision) -> Vec<u8> {
        let cells_only = precision == WirePrecision::CellsOnly;
        let mut cells = self.cells.clone();
        let m: Vec<f64> = self.particles.iter().map(|q| q[3]).collect();
        let masses = if cells_only {
            Vec::new()
        } else {
            leaf_stream(&mut cells, &m, UNIFORM_MASS)
        };
        let eps = if self.eps.is_empty() || cells_only {
            Vec::new()
        } else {
            leaf_stream(&mut cells, &self.eps, UNIFORM_EPS)
        };
        let (mass_palette, eps_palette) = (palette_of(&masses), palette_of(&eps));
        let count = match cells_only {
            true => 0,
            false => self.multipoles.len().checked_div(self.len).unwrap_or(0),
        };
        let bits = count_bits(&cells);
        let mut wire = BitWriter::default();
        push_cells(&cells, bits, &mut wire);
        let wire = wire.finish();
        let mut out = Vec::new();
        for n in [
            cells.len(),
            count,
            self.len,
            self.particles.len(),
            masses.len(),
            mass_palette.len(),
            eps.len(),
            eps_palette.len(),
            bits as usize,
            wire.len(),
        ] {
            out.extend_from_slice(&(n as u64).to_le_bytes());
        }
        out.extend_from_slice(&wire);
        match precision {
            WirePrecision::Double => {
                out.extend_from_slice(bytemuck::cast_slice(&self.multipoles));
                let x: Vec<[f64; 3]> = self.particles.iter().map(|q| [q[0], q[1], q[2]]).collect();
                out.extend_from_slice(bytemuck::cast_slice(&x));
            }
            WirePrecision::Single => {
                let mut bits = BitWriter::default();
                if let Some(p) = order_of(self.len) {
                    for m in self.multipoles.chunks_exact(self.len) {
                        pack_multipole(m, p, &mut bits);
                    }
                }
                out.extend_from_slice(&bits.finish());
                let mut x = BitWriter::default();
                let half = 1i64 << (WIRE_POSITION_BITS - 1);
                for c in &cells {
                    for q in &self.particles[c.begin as usize..c.end as usize] {
                        for v in quantise_position([q[0], q[1], q[2]], c.centre, c.r_max) {
                            x.push((i64::from(v) + half) as u64, WIRE_POSITION_BITS);
                        }
                    }
                }
                out.extend_from_slice(&x.finish());
            }
            WirePrecision::CellsOnly => {}
        }
        push_stream(&masses, &mass_palette, &mut out);
        push_stream(&eps, &eps_palette, &mut out);
        out
    }

    /// Decodes `encode`'s bytes (positions back to absolute f64), with the cells' geometry
    /// from `geometry`: the sender's cells as this rank received them for its own exports
    /// (`ExportWalk::receiver_cells`; see `read_cells`).
    pub fn decode(
        bytes: &[u8],
        precision: WirePrecision,
        geometry: &[TopCell],
    ) -> Result<LetPacket, String> {
        let bad = || "a locally essential tree arrived truncated".to_string();
        let count = |k: usize| -> Result<usize, String> {
            let b = bytes.get(8 * k..8 * k + 8).ok_or_else(bad)?;
            let mut a = [0u8; 8];
            a.copy_from_slice(b);
            Ok(u64::from_le_bytes(a) as usize)
        };
        let (nc, nm, len) = (count(0)?, count(1)?, count(2)?);
        let (np, nq, pq) = (count(3)?, count(4)?, count(5)?);
        let (ne, pe) = (count(6)?, count(7)?);
        let (bits, cell_bytes) = (count(8)? as u32, count(9)?);
        if bits > 32 {
            return Err(bad());
        }
        let (mass_bytes, eps_bytes) = (stream_bytes(nq, pq), stream_bytes(ne, pe));
        let (multipole_bytes, position_bytes) = match precision {
            WirePrecision::Single => {
                let p = order_of(len).ok_or_else(bad)?;
                let position_bits = np * 3 * WIRE_POSITION_BITS as usize;
                (
                    (nm * multipole_bits(p)).div_ceil(8),
                    position_bits.div_ceil(8),
                )
            }
            WirePrecision::Double => (nm * len * 8, np * 24),
            WirePrecision::CellsOnly if nm == 0 && nq == 0 && ne == 0 => (0, 0),
            WirePrecision::CellsOnly => return Err(bad()),
        };
        if bytes.len()
            != HEADER + cell_bytes + multipole_bytes + position_bytes + mass_bytes + eps_bytes
        {
            return Err(bad());
        }
        let mut at = HEADER;
        let mut take = |n: usize| {
            let part = &bytes[at..at + n];
            at += n;
            part
        };
        let mut wire = BitReader {
            bytes: take(cell_bytes),
            at: 0,
        };
        let cells = read_cells(&mut wire, nc, bits, geometry)?;
        if cells
            .iter()
            .map(|c| (c.end - c.begin) as usize)
            .sum::<usize>()
            != np
        {
            return Err(bad());
        }
        let (multipoles, positions): (Vec<f64>, Vec<[f64; 3]>) = match precision {
            WirePrecision::Double => (
                bytemuck::pod_collect_to_vec(take(multipole_bytes)),
                bytemuck::pod_collect_to_vec(take(np * 24)),
            ),
            WirePrecision::Single => {
                let p = order_of(len).ok_or_else(bad)?;
                let mut bits = BitReader {
                    bytes: take(multipole_bytes),
                    at: 0,
                };
                let mut m = vec![0.0; nm * len];
                for chunk in m.chunks_exact_mut(len) {
                    unpack_multipole(&mut bits, p, chunk).ok_or_else(bad)?;
                }
                let mut q = BitReader {
                    bytes: take(position_bytes),
                    at: 0,
                };
                let half = 1i64 << (WIRE_POSITION_BITS - 1);
                let mut x = vec![[0.0; 3]; np];
                for c in cells.iter().filter(|c| c.end > c.begin) {
                    for x in &mut x[c.begin as usize..c.end as usize] {
                        let mut v = [0i32; 3];
                        for v in &mut v {
                            *v = (q.read(WIRE_POSITION_BITS).ok_or_else(bad)? as i64 - half) as i32;
                        }
                        *x = dequantise_position(v, c.centre, c.r_max);
                    }
                }
                (m, x)
            }
            WirePrecision::CellsOnly => (Vec::new(), vec![[0.0; 3]; np]),
        };
        let masses = read_stream(take(mass_bytes), nq, pq).ok_or_else(bad)?;
        let eps_stream = read_stream(take(eps_bytes), ne, pe).ok_or_else(bad)?;
        let masses = match precision {
            WirePrecision::CellsOnly => vec![0.0; np],
            _ => unstream(&cells, &masses, UNIFORM_MASS, np).ok_or_else(bad)?,
        };
        let eps = if ne == 0 {
            Vec::new()
        } else {
            unstream(&cells, &eps_stream, UNIFORM_EPS, np).ok_or_else(bad)?
        };
        let particles = positions
            .iter()
            .zip(&masses)
            .map(|(x, &m)| [x[0], x[1], x[2], m])
            .collect();
        Ok(LetPacket {
            cells,
            multipoles,
            len,
            particles,
            eps,
            sources: Vec::new(),
        })
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
            // One multipole of order 1: Re/Im of (0, 0), (1, 0), (1, 1).
            multipoles: vec![0.25, 0.0, -1.5, 0.0, 3.0, -0.75],
            len: 6,
            particles: vec![
                [1.1, 2.2, 3.3, 0.125],
                [0.9, 1.8, 2.7, 0.125],
                [1.0, 2.0, 3.05, 0.125],
                [-4.1, 0.5, 0.1, 0.3],
                [-3.9, 0.4, -0.1, 0.7],
            ],
            eps: Vec::new(),
            sources: vec![0, 4, 5],
        }
    }

    /// The sender's geometry of `packet()` as the receiver has it: a root with two leaves.
    fn geometry() -> Vec<TopCell> {
        let top = |centre: [f32; 3], r_max: f32, first_child: u32, child_count: u32| TopCell {
            centre,
            r_max,
            mass: 0.0,
            accel: 0.0,
            first_child,
            child_count,
        };
        vec![
            top([0.0; 3], 8.0, 1, 2),
            top([1.0, 2.0, 3.0], 0.5, 0, 0),
            top([-4.0, 0.5, 0.0], 0.5, 0, 0),
        ]
    }

    #[test]
    fn geometry_travels_in_17_bytes_a_cell_and_comes_back_exactly() {
        let mut cells = geometry();
        cells.push(TopCell {
            centre: [0.1, -0.2, 1e-30],
            r_max: 3.5,
            mass: 0.0,
            accel: 0.0,
            first_child: CHILDREN_NOT_SENT,
            child_count: 8,
        });
        let bytes = encode_geometry(&cells, false);
        assert_eq!(bytes.len(), 4 * GEOMETRY_BYTES);
        assert_eq!(decode_geometry(&bytes, false).unwrap(), cells);
        assert!(decode_geometry(&bytes[1..], false).is_err());
        // A cell whose children are said to follow, but do not.
        let mut orphan = cells.clone();
        orphan[3].first_child = 4;
        assert!(decode_geometry(&encode_geometry(&orphan, false), false).is_err());
        // With the error-controlled MAC's mass and expected acceleration: 8 bytes more.
        cells[3].mass = 1.25e3;
        cells[3].accel = 2.5e-7;
        let bytes = encode_geometry(&cells, true);
        assert_eq!(bytes.len(), 4 * (GEOMETRY_BYTES + ERROR_BYTES));
        assert_eq!(decode_geometry(&bytes, true).unwrap(), cells);
    }

    #[test]
    fn packets_round_trip_exactly_in_double_and_closely_in_single() {
        let p = packet();
        let g = geometry();
        let d =
            LetPacket::decode(&p.encode(WirePrecision::Double), WirePrecision::Double, &g).unwrap();
        assert_eq!(d.particles, p.particles);
        assert_eq!(d.multipoles, p.multipoles);
        assert_eq!(d.cells[1].flags, TREE_LEAF | UNIFORM_MASS);
        assert_eq!(d.cells[2].flags, TREE_LEAF);
        let single = p.encode(WirePrecision::Single);
        // 3 cells in 3 + 7 + 7 bits (flags, and 2-bit counts of the leaves' particles); one
        // order-1 multipole in 2 x 16 + 4 x 24 bits; 5 positions of 3 x WIRE_POSITION_BITS;
        // masses: 1 (uniform leaf) + 2, three distinct values (no palette pays off).
        let position_bytes = (5 * 3 * WIRE_POSITION_BITS as usize).div_ceil(8);
        assert_eq!(single.len(), HEADER + 3 + 16 + position_bytes + 3 * 8);
        let mut varied = p.clone();
        varied.eps = vec![0.1, 0.1, 0.1, 0.2, 0.05];
        let v = LetPacket::decode(
            &varied.encode(WirePrecision::Single),
            WirePrecision::Single,
            &g,
        )
        .unwrap();
        assert_eq!(v.eps, varied.eps);
        let s = LetPacket::decode(&single, WirePrecision::Single, &g).unwrap();
        assert_eq!(s.cells[0].first_child, 1);
        assert_eq!(
            s.cells[2].centre,
            [-4.0, 0.5, 0.0],
            "geometry from the receiver's copy"
        );
        assert_eq!((s.cells[2].begin, s.cells[2].end), (3, 5));
        for (a, b) in s.particles.iter().zip(&p.particles) {
            assert_eq!(a[3], b[3], "masses travel exactly");
            for k in 0..3 {
                let step = 0.5 / f64::from((1 << (WIRE_POSITION_BITS - 1)) - 1);
                assert!((a[k] - b[k]).abs() <= 0.5 * step, "{a:?} vs {b:?}");
            }
        }
        // Each value within half a step (2^-23 of its degree's scale: 1 and 4 here).
        for (i, (a, b)) in s.multipoles.iter().zip(&p.multipoles).enumerate() {
            let scale = if i < 2 { 1.0 } else { 4.0 };
            assert!((a - b).abs() <= scale * 2f64.powi(-24), "{i}: {a} vs {b}");
        }
        assert_eq!(s.multipoles[3], 0.0);
        // A quantised position is what the other rank reconstructs, bit for bit.
        let (c, r) = ([1.0, 2.0, 3.0], 0.5);
        let q = quantise_position(p.particles[0][..3].try_into().unwrap(), c, r);
        assert_eq!(
            dequantise_position(q, c, r),
            <[f64; 3]>::try_from(&s.particles[0][..3]).unwrap()
        );
        assert!(LetPacket::decode(&single[..single.len() - 1], WirePrecision::Single, &g).is_err());
        // A packet whose cells the receiver has no geometry for is refused, not misread.
        let mut hidden = g.clone();
        hidden[0].first_child = CHILDREN_NOT_SENT;
        let err = LetPacket::decode(&single, WirePrecision::Single, &hidden).unwrap_err();
        assert!(err.contains("never received"), "{err}");
    }

    #[test]
    fn cells_only_carry_the_cells_and_placeholders_for_the_payload() {
        let (p, g) = (packet(), geometry());
        let bytes = p.encode(WirePrecision::CellsOnly);
        // The cells' 3 + 7 + 7 bits, as on every wire, and nothing else.
        assert_eq!(bytes.len(), HEADER + 3);
        let d = LetPacket::decode(&bytes, WirePrecision::CellsOnly, &g).unwrap();
        let exact =
            LetPacket::decode(&p.encode(WirePrecision::Double), WirePrecision::Double, &g).unwrap();
        let strip = |c: &LetCell| LetCell {
            flags: c.flags & !(UNIFORM_MASS | UNIFORM_EPS),
            ..*c
        };
        let cells: Vec<LetCell> = exact.cells.iter().map(strip).collect();
        let bytes_of = |c: &[LetCell]| bytemuck::cast_slice::<LetCell, u8>(c).to_vec();
        assert_eq!(bytes_of(&d.cells), bytes_of(&cells));
        assert!(d.multipoles.is_empty() && d.eps.is_empty());
        assert_eq!(d.particles, vec![[0.0; 4]; 5]);
        // A cells-only reader refuses a packet with a payload in it.
        let double = p.encode(WirePrecision::Double);
        assert!(LetPacket::decode(&double, WirePrecision::CellsOnly, &g).is_err());
    }

    #[test]
    fn few_distinct_masses_and_softenings_travel_as_palette_indices() {
        let leaf = LetCell {
            r_max: 1.0,
            end: 40,
            flags: TREE_LEAF,
            ..LetCell::zeroed()
        };
        let masses = [1e-6, 3e-5, 2.5e-6];
        let p = LetPacket {
            cells: vec![leaf],
            multipoles: Vec::new(),
            len: 2,
            particles: (0..40)
                .map(|i| [0.01 * i as f64, 0.0, 0.0, masses[i * 7 % 3]])
                .collect(),
            eps: (0..40)
                .map(|i| if i % 5 == 0 { 0.1 } else { 0.02 })
                .collect(),
            sources: vec![0],
        };
        let bytes = p.encode(WirePrecision::Double);
        // One cell in 3 + 2 + 6 bits; three masses and two softenings once each, then 2- and
        // 1-bit indices.
        let expected = HEADER + 2 + 40 * 24 + (3 * 8 + 10) + (2 * 8 + 5);
        assert_eq!(bytes.len(), expected);
        let leaf_geometry = TopCell {
            centre: [0.0; 3],
            r_max: 1.0,
            mass: 0.0,
            accel: 0.0,
            first_child: 0,
            child_count: 0,
        };
        let d = LetPacket::decode(&bytes, WirePrecision::Double, &[leaf_geometry]).unwrap();
        assert_eq!(d.particles, p.particles);
        assert_eq!(d.eps, p.eps);
        assert_eq!(index_bits(1), 0);
        assert_eq!(index_bits(2), 1);
        assert_eq!(index_bits(3), 2);
        assert_eq!(index_bits(5), 3);
        assert!(
            palette_of(&[1.0, 2.0, 3.0]).is_empty(),
            "no palette when it does not pay"
        );
    }
}
