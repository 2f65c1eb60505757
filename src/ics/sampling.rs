//! Shared sampling machinery: seeded substreams, isotropic directions, speeds from a
//! distribution function, and centring.

use crate::particles::{Component, Particles};
use rand::RngExt;
use rand_pcg::Pcg64;
use rayon::prelude::*;

/// Particles per random substream; IDs `first_id + k*BLOCK ..` share one stream.
pub const BLOCK: usize = 4096;

/// The random streams of one model component (one per block of `BLOCK` IDs) and the first
/// ID it numbers its particles from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stream {
    /// The run's seed.
    pub seed: u64,
    /// The component's stream number.
    pub stream: u64,
    /// ID of the component's first particle.
    pub first_id: u64,
}

/// The part of every component's blocks that one rank generates: a contiguous run of whole
/// blocks, so a distributed run samples exactly the particles a serial one would.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share {
    /// This rank.
    pub rank: usize,
    /// Number of ranks.
    pub ranks: usize,
}

impl Share {
    /// Everything, for a serial run.
    pub const WHOLE: Share = Share { rank: 0, ranks: 1 };

    /// This share's blocks out of `blocks`.
    pub fn blocks(self, blocks: usize) -> std::ops::Range<usize> {
        let ranks = self.ranks.max(1);
        blocks * self.rank / ranks..blocks * (self.rank + 1) / ranks
    }
}

/// The random stream of one block of particles of one model component. Streams are distinct
/// for every (seed, component stream, block), so blocks can be generated in any order or
/// on any rank.
pub fn block_rng(seed: u64, stream: u64, block: u64) -> Pcg64 {
    let state = (u128::from(splitmix64(seed)) << 64) | u128::from(splitmix64(seed ^ 0x9e37_79b9));
    let increment = (u128::from(stream) << 64) | u128::from(block);
    Pcg64::new(state, increment)
}

/// SplitMix64 finaliser: spreads nearby seeds over the whole state space.
fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A uniformly random unit vector.
pub fn isotropic_unit(rng: &mut Pcg64) -> [f64; 3] {
    let cos_t: f64 = 2.0 * rng.random::<f64>() - 1.0;
    let phi: f64 = 2.0 * std::f64::consts::PI * rng.random::<f64>();
    let sin_t = (1.0 - cos_t * cos_t).max(0.0).sqrt();
    [sin_t * phi.cos(), sin_t * phi.sin(), cos_t]
}

/// A spherical model with an isotropic distribution function.
pub trait SphericalModel: Sync {
    /// Enclosed mass fraction M(<r)/M of the untruncated model.
    fn mass_fraction(&self, r: f64) -> f64;
    /// Inverse of `mass_fraction`.
    fn radius_of_mass_fraction(&self, u: f64) -> f64;
    /// Total mass of the untruncated model.
    fn total_mass(&self) -> f64;
    /// A speed drawn from the distribution function at radius `r`.
    fn sample_speed(&self, r: f64, rng: &mut Pcg64) -> f64;
}

/// Samples `n` particles of a spherical model inside `truncation` (if any). Particles carry
/// equal masses adding up to the model's mass inside the truncation radius, so the enclosed
/// mass profile is exactly the analytic one there.
pub fn sample_sphere<M: SphericalModel>(
    model: &M,
    truncation: Option<f64>,
    n: usize,
    component: Component,
    stream: Stream,
    share: Share,
) -> Particles {
    let u_max = truncation.map_or(1.0, |rt| model.mass_fraction(rt));
    let mass = model.total_mass() * u_max / n.max(1) as f64;
    sample_blocks(n, stream, share, |rng| {
        let r = model.radius_of_mass_fraction(u_max * rng.random::<f64>());
        let dir = isotropic_unit(rng);
        let v = model.sample_speed(r, rng);
        let vdir = isotropic_unit(rng);
        (
            [r * dir[0], r * dir[1], r * dir[2]],
            [v * vdir[0], v * vdir[1], v * vdir[2]],
            mass,
            component,
        )
    })
}

/// Samples the blocks in `share` of `n` particles in blocks of `BLOCK` IDs (starting at
/// `first_id`), each block with its own stream, in parallel. Particles come in antipodal pairs, (x, v) and (−x, −v) —
/// which keeps the sense of rotation — so each component is centred exactly in position and
/// velocity. (Without it the halo's sampling noise, ~r/√N in its centre of mass, leaves a
/// disk off the halo's centre, and the disk sloshes and heats within a rotation.)
pub fn sample_blocks(
    n: usize,
    stream: Stream,
    share: Share,
    draw: impl Fn(&mut Pcg64) -> ([f64; 3], [f64; 3], f64, Component) + Sync,
) -> Particles {
    let blocks: Vec<Particles> = share
        .blocks(n.div_ceil(BLOCK))
        .into_par_iter()
        .map(|b| {
            let mut rng = block_rng(stream.seed, stream.stream, b as u64);
            let count = BLOCK.min(n - b * BLOCK);
            let mut out = Particles::with_capacity(count);
            let mut last = None;
            for k in 0..count {
                let (x, v, m, c) = match last.take() {
                    Some((x, v, m, c)) => (neg(x), neg(v), m, c),
                    None => {
                        let drawn = draw(&mut rng);
                        last = Some(drawn);
                        drawn
                    }
                };
                out.push(x, v, m, stream.first_id + (b * BLOCK + k) as u64, c);
            }
            out
        })
        .collect();
    let mut p = Particles::with_capacity(blocks.iter().map(Particles::len).sum());
    for b in blocks {
        p.extend(b);
    }
    p
}

const _: () = assert!(
    BLOCK.is_multiple_of(2),
    "antipodal pairs must not straddle blocks"
);

fn neg(x: [f64; 3]) -> [f64; 3] {
    [-x[0], -x[1], -x[2]]
}

/// Draws `w` in [0, 1] with density proportional to `density(w)` by rejection against a
/// numerically located maximum. `density` must be unimodal (true of `w^2 f(E)` for the
/// monotonic distribution functions used here).
pub fn sample_unimodal(density: impl Fn(f64) -> f64, rng: &mut Pcg64) -> f64 {
    let peak = unimodal_max(&density) * 1.02;
    loop {
        let w: f64 = rng.random();
        let y: f64 = rng.random::<f64>() * peak;
        if y <= density(w) {
            return w;
        }
    }
}

/// Maximum of a unimodal function on [0, 1]: a grid dense near 0 (where sharp peaks occur
/// close to a cusp) followed by golden-section refinement.
pub fn unimodal_max(density: &impl Fn(f64) -> f64) -> f64 {
    const GRID: usize = 48;
    let grid: Vec<f64> = (0..=GRID)
        .map(|k| {
            let t = k as f64 / GRID as f64;
            // Log-spaced from 1e-8 to 1, then every point is also shifted linearly.
            (1e-8f64).powf(1.0 - t).max(t)
        })
        .collect();
    let mut best = 0;
    for k in 1..grid.len() {
        if density(grid[k]) > density(grid[best]) {
            best = k;
        }
    }
    let (mut lo, mut hi) = (
        if best == 0 { 0.0 } else { grid[best - 1] },
        grid[(best + 1).min(GRID)],
    );
    let golden = 0.618_033_988_749_894_8;
    for _ in 0..60 {
        let a = hi - golden * (hi - lo);
        let b = lo + golden * (hi - lo);
        if density(a) < density(b) {
            lo = a;
        } else {
            hi = b;
        }
    }
    density(0.5 * (lo + hi)).max(density(grid[best]))
}

/// Mass, mass-weighted position and mass-weighted velocity of one sampling block, keyed by
/// the ID of its first particle: the unit from which centring sums are built, so the sums
/// (and the centred bits) do not depend on how the blocks were spread over ranks.
#[derive(Debug, Clone, Copy, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockMoments {
    /// ID of the block's first particle.
    pub first_id: u64,
    /// m, m·x, m·y, m·z, m·vx, m·vy, m·vz.
    pub sums: [f64; 7],
}

/// The moments of every sampling block of freshly generated particles (in generation order:
/// a block ends where the component changes or after `BLOCK` particles).
pub fn block_moments(p: &Particles) -> Vec<BlockMoments> {
    let mut out: Vec<BlockMoments> = Vec::new();
    let mut len = 0;
    for i in 0..p.len() {
        if i == 0 || len == BLOCK || p.component[i] != p.component[i - 1] {
            out.push(BlockMoments {
                first_id: p.id[i],
                sums: [0.0; 7],
            });
            len = 0;
        }
        len += 1;
        let (m, x, v) = (p.mass[i], p.pos[i], p.vel[i]);
        let last = out.len() - 1;
        let s = &mut out[last].sums;
        let add = [
            m,
            m * x[0],
            m * x[1],
            m * x[2],
            m * v[0],
            m * v[1],
            m * v[2],
        ];
        for k in 0..7 {
            s[k] += add[k];
        }
    }
    out
}

/// Moves the centre of mass to the origin and removes its velocity, from the moments of all
/// blocks of the model (on every rank); the sum runs in block order.
pub fn centre_on(p: &mut Particles, moments: &[BlockMoments]) {
    let mut sorted = moments.to_vec();
    sorted.sort_by_key(|b| b.first_id);
    let mut s = [0.0; 7];
    for b in &sorted {
        for k in 0..7 {
            s[k] += b.sums[k];
        }
    }
    if s[0] <= 0.0 {
        return;
    }
    let com = [s[1] / s[0], s[2] / s[0], s[3] / s[0]];
    let vcom = [s[4] / s[0], s[5] / s[0], s[6] / s[0]];
    p.pos.par_iter_mut().for_each(|x| {
        for k in 0..3 {
            x[k] -= com[k];
        }
    });
    p.vel.par_iter_mut().for_each(|v| {
        for k in 0..3 {
            v[k] -= vcom[k];
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_differ_and_repeat() {
        let a: Vec<u64> = (0..4).map(|_| block_rng(1, 0, 0).random()).collect();
        let mut r = block_rng(1, 0, 0);
        let b: u64 = r.random();
        assert_eq!(a[0], b);
        let c: u64 = block_rng(1, 0, 1).random();
        let d: u64 = block_rng(2, 0, 0).random();
        let e: u64 = block_rng(1, 1, 0).random();
        assert!(b != c && b != d && b != e && c != d);
    }

    #[test]
    fn finds_sharp_peak_near_zero() {
        let delta: f64 = 1e-6;
        let f = |w: f64| w * w / (delta + w * w).powf(2.5);
        let w_peak = (2.0 * delta / 3.0).sqrt();
        let exact = f(w_peak);
        let found = unimodal_max(&f);
        assert!((found / exact - 1.0).abs() < 1e-6, "{found} vs {exact}");
    }
}
