//! Radial profiles of particle sets.

use crate::gravity::direct::DirectSummation;
use crate::gravity::direct::SourceSet;
use crate::gravity::{Softening, SofteningKernel};
use crate::particles::{Component, Particles};

/// (spherical radius, mass) of the `component` particles, by increasing radius.
fn by_radius(p: &Particles, component: Component) -> Vec<(f64, f64)> {
    let mut rm: Vec<(f64, f64)> = (0..p.len())
        .filter(|&i| p.component[i] == component)
        .map(|i| {
            let x = p.pos[i];
            ((x[0] * x[0] + x[1] * x[1] + x[2] * x[2]).sqrt(), p.mass[i])
        })
        .collect();
    rm.sort_by(|a, b| a.0.total_cmp(&b.0));
    rm
}

/// Radii (about the origin) enclosing the given mass fractions of `component`.
pub fn lagrangian_radii(p: &Particles, component: Component, fractions: &[f64]) -> Vec<f64> {
    let rm = by_radius(p, component);
    let total: f64 = rm.iter().map(|x| x.1).sum();
    fractions
        .iter()
        .map(|&f| {
            let mut acc = 0.0;
            for &(r, m) in &rm {
                acc += m;
                if acc >= f * total {
                    return r;
                }
            }
            rm.last().map_or(0.0, |x| x.0)
        })
        .collect()
}

/// Statistics of the `component` particles in the cylindrical annulus [r0, r1).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Annulus {
    /// Particles in it.
    pub count: usize,
    /// Surface density Σ = mass / area.
    pub surface_density: f64,
    /// Mass-weighted mean rotation velocity.
    pub mean_vphi: f64,
    /// Radial velocity dispersion.
    pub sigma_r: f64,
    /// Azimuthal velocity dispersion.
    pub sigma_phi: f64,
    /// Vertical velocity dispersion.
    pub sigma_z: f64,
    /// sech² scale height estimated from the median |z|: z0 = median|z| / artanh(1/2).
    pub scale_height: f64,
}

/// Measures one annulus.
pub fn annulus(p: &Particles, component: Component, r0: f64, r1: f64) -> Annulus {
    let mut m = 0.0;
    let mut sums = [0.0f64; 6];
    let mut heights = Vec::new();
    for i in 0..p.len() {
        if p.component[i] != component {
            continue;
        }
        let (x, v) = (p.pos[i], p.vel[i]);
        let r = (x[0] * x[0] + x[1] * x[1]).sqrt();
        if r < r0 || r >= r1 || r == 0.0 {
            continue;
        }
        let (c, s) = (x[0] / r, x[1] / r);
        let vr = v[0] * c + v[1] * s;
        let vphi = -v[0] * s + v[1] * c;
        let w = p.mass[i];
        m += w;
        for (k, q) in [vr, vphi, v[2], vr * vr, vphi * vphi, v[2] * v[2]]
            .into_iter()
            .enumerate()
        {
            sums[k] += w * q;
        }
        heights.push(x[2].abs());
    }
    heights.sort_by(f64::total_cmp);
    let mean = |k: usize| if m > 0.0 { sums[k] / m } else { 0.0 };
    let disp = |k: usize| (mean(k + 3) - mean(k) * mean(k)).max(0.0).sqrt();
    Annulus {
        count: heights.len(),
        surface_density: m / (std::f64::consts::PI * (r1 * r1 - r0 * r0)),
        mean_vphi: mean(1),
        sigma_r: disp(0),
        sigma_phi: disp(1),
        sigma_z: disp(2),
        scale_height: heights.get(heights.len() / 2).copied().unwrap_or(0.0) / 0.5f64.atanh(),
    }
}

/// One radial bin of a disk's profile.
#[derive(Debug, Clone, PartialEq)]
pub struct ProfileRow {
    /// Bin centre (cylindrical radius).
    pub radius: f64,
    /// The disk's statistics in the annulus.
    pub disk: Annulus,
    /// Circular velocity of each component present (`Component::ALL` order, zero where
    /// absent or pulling outward) in the midplane: sqrt(−R a_R) from its particles.
    pub v_circ: [f64; 4],
    /// Total circular velocity.
    pub v_circ_total: f64,
    /// Toomre Q of a stellar disk, σ_R κ / (3.36 G Σ), with κ from the total circular
    /// velocity (zero where Σ is).
    pub toomre_q: f64,
}

/// Points per ring on which the midplane circular velocity is averaged.
const RING_POINTS: usize = 64;

/// Circular velocity of each component (`Component::ALL` order) at each of `radii` in the
/// plane z = 0: sqrt(−R ⟨a_R⟩) from that component's particles by direct summation (spline
/// softening `eps`, at least a quarter bin). averaged over `RING_POINTS` azimuths. Returned as v² (signed: a
/// component may pull outward), so that the total is their sum. This is the speed of a
/// circular orbit in the disk's plane (what pynbody's `v_circ` computes); the spherical
/// sqrt(G M(<r)/r) is a few per cent low for a flattened disk.
fn midplane_v_circ_squared(p: &Particles, radii: &[f64], g: f64, eps: f64) -> Vec<[f64; 4]> {
    let solver = DirectSummation::new(
        g,
        Softening {
            kernel: SofteningKernel::Spline,
            epsilon: eps,
        },
    );
    let ring: Vec<[f64; 3]> = radii
        .iter()
        .flat_map(|&r| {
            (0..RING_POINTS).map(move |k| {
                let phi = std::f64::consts::TAU * k as f64 / RING_POINTS as f64;
                [r * phi.cos(), r * phi.sin(), 0.0]
            })
        })
        .collect();
    let mut out = vec![[0.0; 4]; radii.len()];
    for c in Component::ALL {
        let members: Vec<usize> = (0..p.len()).filter(|&i| p.component[i] == c).collect();
        if members.is_empty() {
            continue;
        }
        let pos: Vec<[f64; 3]> = members.iter().map(|&i| p.pos[i]).collect();
        let mass: Vec<f64> = members.iter().map(|&i| p.mass[i]).collect();
        let mut acc = vec![[0.0; 3]; ring.len()];
        let mut pot = vec![0.0; ring.len()];
        solver.evaluate(&SourceSet::new(&pos, &mass), &ring, &mut acc, &mut pot);
        for (b, row) in out.iter_mut().enumerate() {
            let points = b * RING_POINTS..(b + 1) * RING_POINTS;
            // −R a_R = −(x a_x + y a_y) at each point, averaged over the ring.
            let v2: f64 = points
                .map(|k| -(ring[k][0] * acc[k][0] + ring[k][1] * acc[k][1]))
                .sum::<f64>()
                / RING_POINTS as f64;
            row[c.index()] = v2;
        }
    }
    out
}

/// The profile of the `disk` component in `bins` annuli of equal width out to `r_max`, with
/// every component's circular velocity in the midplane (gravitational constant `g`,
/// softening `eps`, at least a quarter bin).
pub fn disk_profile(
    p: &Particles,
    disk: Component,
    r_max: f64,
    bins: usize,
    g: f64,
    eps: f64,
) -> Vec<ProfileRow> {
    let width = r_max / bins as f64;
    let radii: Vec<f64> = (0..bins).map(|b| (b as f64 + 0.5) * width).collect();
    // A quarter bin of softening at least: it smooths the pull of the few particles next to
    // a ring point (noise), and changes the mean pull of the rest by nothing measurable.
    let v2 = midplane_v_circ_squared(p, &radii, g, eps.max(0.25 * width));
    let mut rows: Vec<ProfileRow> = (0..bins)
        .map(|b| {
            let (r0, r1) = (b as f64 * width, (b + 1) as f64 * width);
            let radius = radii[b];
            let v_circ: [f64; 4] = v2[b].map(|v| v.max(0.0).sqrt());
            let v_circ_total = v2[b].iter().sum::<f64>().max(0.0).sqrt();
            ProfileRow {
                radius,
                disk: annulus(p, disk, r0, r1),
                v_circ,
                v_circ_total,
                toomre_q: 0.0,
            }
        })
        .collect();
    // κ² = 2 (v/R²) d(R v)/dR, by central differences over ±1/20 of the bins (at least
    // one; one-sided at the ends): adjacent bins' particle noise would dominate the slope.
    let n = rows.len();
    let reach = (n / 20).max(1);
    for b in 0..n {
        let (lo, hi) = (b.saturating_sub(reach), (b + reach).min(n - 1));
        if lo == hi {
            continue;
        }
        let rv = |k: usize| rows[k].radius * rows[k].v_circ_total;
        let slope = (rv(hi) - rv(lo)) / (rows[hi].radius - rows[lo].radius);
        let row = &rows[b];
        let kappa2 = 2.0 * row.v_circ_total / (row.radius * row.radius) * slope;
        let sigma = row.disk.surface_density;
        rows[b].toomre_q = if sigma > 0.0 && kappa2 > 0.0 {
            row.disk.sigma_r * kappa2.sqrt() / (3.36 * g * sigma)
        } else {
            0.0
        };
    }
    rows
}
