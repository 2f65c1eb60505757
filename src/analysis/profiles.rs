//! Radial profiles of particle sets.

use crate::particles::{Component, Particles};

/// Radii (about the origin) enclosing the given mass fractions of `component`.
pub fn lagrangian_radii(p: &Particles, component: Component, fractions: &[f64]) -> Vec<f64> {
    let mut rm: Vec<(f64, f64)> = (0..p.len())
        .filter(|&i| p.component[i] == component)
        .map(|i| {
            let x = p.pos[i];
            ((x[0] * x[0] + x[1] * x[1] + x[2] * x[2]).sqrt(), p.mass[i])
        })
        .collect();
    rm.sort_by(|a, b| a.0.total_cmp(&b.0));
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
