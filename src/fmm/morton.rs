//! Morton (Z-order) keys: 21 bits per axis interleaved into a 63-bit key, so that sorting by
//! key groups particles by octree cell at every level.

/// Bits per axis.
pub const BITS: u32 = 21;
/// Deepest octree level a key resolves.
pub const MAX_LEVEL: u32 = BITS;

/// The cube that encloses all particles: its lower corner and side length.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BoundingCube {
    /// Lower corner.
    pub lo: [f64; 3],
    /// Side length (> 0).
    pub side: f64,
}

impl BoundingCube {
    /// The smallest cube (slightly enlarged) around the points; a point set of zero extent
    /// gets a unit cube.
    pub fn around(lo: [f64; 3], hi: [f64; 3]) -> Self {
        let extent = (0..3).map(|k| hi[k] - lo[k]).fold(0.0, f64::max);
        let side = if extent > 0.0 {
            extent * (1.0 + 1e-9)
        } else {
            1.0
        };
        let centre = [
            (lo[0] + hi[0]) * 0.5,
            (lo[1] + hi[1]) * 0.5,
            (lo[2] + hi[2]) * 0.5,
        ];
        BoundingCube {
            lo: [
                centre[0] - 0.5 * side,
                centre[1] - 0.5 * side,
                centre[2] - 0.5 * side,
            ],
            side,
        }
    }

    /// Morton key of a point inside the cube.
    #[inline]
    pub fn key(&self, x: [f64; 3]) -> u64 {
        let scale = (1u64 << BITS) as f64 / self.side;
        let max = (1u64 << BITS) - 1;
        let q = |k: usize| (((x[k] - self.lo[k]) * scale) as i64).clamp(0, max as i64) as u64;
        spread(q(2)) | (spread(q(1)) << 1) | (spread(q(0)) << 2)
    }
}

/// Spreads the low 21 bits of `v` so that bit i moves to bit 3i.
#[inline]
fn spread(v: u64) -> u64 {
    let mut x = v & 0x1f_ffff;
    x = (x | (x << 32)) & 0x001f_0000_0000_ffff;
    x = (x | (x << 16)) & 0x001f_0000_ff00_00ff;
    x = (x | (x << 8)) & 0x100f_00f0_0f00_f00f;
    x = (x | (x << 4)) & 0x10c3_0c30_c30c_30c3;
    x = (x | (x << 2)) & 0x1249_2492_4924_9249;
    x
}

/// The octant digit (0..8) of `key` at `level` (1 = the root's children).
#[inline]
pub fn digit(key: u64, level: u32) -> u64 {
    (key >> (3 * (MAX_LEVEL - level))) & 7
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_interleaves() {
        assert_eq!(spread(1), 1);
        assert_eq!(spread(0b11), 0b1001);
        assert_eq!(spread(0x1f_ffff).count_ones(), 21);
        let cube = BoundingCube::around([0.0; 3], [1.0; 3]);
        // x is the most significant bit of a digit (so the curve's first cuts are planes of
        // constant x, across a disk in the x-y plane), z the least.
        let k = cube.key([0.9, 0.1, 0.1]);
        assert_eq!(digit(k, 1), 4);
        let k = cube.key([0.1, 0.9, 0.1]);
        assert_eq!(digit(k, 1), 2);
        let k = cube.key([0.1, 0.1, 0.9]);
        assert_eq!(digit(k, 1), 1);
    }
}
