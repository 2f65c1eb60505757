//! Morton (Z-order) keys: 21 bits per axis interleaved into a 63-bit key, so that sorting by
//! key groups particles by octree cell at every level.

use rayon::prelude::*;

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

    /// The factor from a point's offset from the lower corner to its grid coordinate
    /// (2^21 cells per side).
    #[inline]
    pub fn scale(&self) -> f64 {
        (1u64 << BITS) as f64 / self.side
    }

    /// Morton key of a point inside the cube.
    #[inline]
    pub fn key(&self, x: [f64; 3]) -> u64 {
        let scale = self.scale();
        let max = (1u64 << BITS) - 1;
        let q = |k: usize| (((x[k] - self.lo[k]) * scale) as i64).clamp(0, max as i64) as u64;
        spread(q(2)) | (spread(q(1)) << 1) | (spread(q(0)) << 2)
    }
}

/// The smallest and largest coordinate along each axis over `pos` ([f64::MAX; 3] and
/// [f64::MIN; 3] for none; NaNs ignored), in parallel; a min/max reduction, so independent
/// of the order and the number of threads.
pub fn extremes(pos: &[[f64; 3]]) -> ([f64; 3], [f64; 3]) {
    pos.par_chunks(1 << 14)
        .map(|chunk| {
            // Four running extremes per coordinate, taken in turn: with one, every
            // comparison waits for the previous one (0.054 s at 1e7 on 2 cores, against
            // 0.012 s to read the positions). A NaN never replaces an extreme, as with
            // `f64::min`.
            let (mut lo, mut hi) = ([[f64::MAX; 3]; 4], [[f64::MIN; 3]; 4]);
            let mut quads = chunk.chunks_exact(4);
            for quad in &mut quads {
                for (j, x) in quad.iter().enumerate() {
                    for k in 0..3 {
                        if x[k] < lo[j][k] {
                            lo[j][k] = x[k];
                        }
                        if x[k] > hi[j][k] {
                            hi[j][k] = x[k];
                        }
                    }
                }
            }
            for x in quads.remainder() {
                for k in 0..3 {
                    lo[0][k] = lo[0][k].min(x[k]);
                    hi[0][k] = hi[0][k].max(x[k]);
                }
            }
            let (mut l, mut h) = (lo[0], hi[0]);
            for j in 1..4 {
                for k in 0..3 {
                    l[k] = l[k].min(lo[j][k]);
                    h[k] = h[k].max(hi[j][k]);
                }
            }
            (l, h)
        })
        .reduce(
            || ([f64::MAX; 3], [f64::MIN; 3]),
            |a, b| {
                (
                    [a.0[0].min(b.0[0]), a.0[1].min(b.0[1]), a.0[2].min(b.0[2])],
                    [a.1[0].max(b.1[0]), a.1[1].max(b.1[1]), a.1[2].max(b.1[2])],
                )
            },
        )
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
