//! Spherical components (halo, bulge): density profiles with a smooth outer taper, radial
//! tables of mass and potential, and the isotropic distribution function from Eddington's
//! formula in the total (spherically averaged) potential, sampled by rejection.

use super::tables::{LogGrid, cumulative_trapezoid, gauss_legendre};
use crate::ics::sampling::unimodal_max;
use rand::RngExt;
use rand_pcg::Pcg64;
use std::f64::consts::PI;

/// A density profile before tapering.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Profile {
    /// Hernquist (1990): ρ = M a / (2π r (r + a)^3).
    Hernquist {
        /// Total mass of the untapered profile.
        mass: f64,
        /// Scale radius.
        a: f64,
    },
    /// Navarro, Frenk & White: ρ = ρ_s / ((r/r_s)(1 + r/r_s)^2).
    Nfw {
        /// Characteristic density.
        rho_s: f64,
        /// Scale radius.
        rs: f64,
    },
}

impl Profile {
    fn density(&self, r: f64) -> f64 {
        match *self {
            Profile::Hernquist { mass, a } => mass * a / (2.0 * PI * r * (r + a).powi(3)),
            Profile::Nfw { rho_s, rs } => {
                let x = r / rs;
                rho_s / (x * (1.0 + x) * (1.0 + x))
            }
        }
    }

    /// d ln ρ / d ln r.
    fn log_slope(&self, r: f64) -> f64 {
        match *self {
            Profile::Hernquist { a, .. } => -1.0 - 3.0 * r / (r + a),
            Profile::Nfw { rs, .. } => -1.0 - 2.0 * r / (r + rs),
        }
    }

    /// The scale radius.
    pub fn scale(&self) -> f64 {
        match *self {
            Profile::Hernquist { a, .. } => a,
            Profile::Nfw { rs, .. } => rs,
        }
    }
}

/// A profile with an optional exponential taper beyond `r_t` (Kazantzidis, Magorrian & Moore
/// 2004): ρ(r) = ρ(r_t) (r/r_t)^κ exp(-(r - r_t)/r_d), with κ making d ln ρ/d ln r continuous.
/// The taper keeps the distribution function positive where a sharp cut would not.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spheroid {
    /// The profile.
    pub profile: Profile,
    taper: Option<(f64, f64, f64, f64)>,
}

impl Spheroid {
    /// `profile`, tapered beyond `truncation` (if any) over a decay length of a tenth of it.
    pub fn new(profile: Profile, truncation: Option<f64>) -> Self {
        let taper = truncation.map(|rt| {
            let rd = 0.1 * rt;
            let kappa = profile.log_slope(rt) + rt / rd;
            (rt, rd, kappa, profile.density(rt))
        });
        Spheroid { profile, taper }
    }

    /// Density at radius `r`.
    pub fn density(&self, r: f64) -> f64 {
        match self.taper {
            Some((rt, rd, kappa, rho_t)) if r > rt => {
                rho_t * (r / rt).powf(kappa) * (-(r - rt) / rd).exp()
            }
            _ => self.profile.density(r),
        }
    }

    /// Outermost radius worth tabulating.
    pub fn extent(&self) -> f64 {
        match self.taper {
            Some((rt, rd, _, _)) => rt + 40.0 * rd,
            None => 1e4 * self.profile.scale(),
        }
    }
}

/// Mass and potential of a spherical density on a radial grid.
#[derive(Debug, Clone)]
pub struct RadialTable {
    /// Density at the grid radii.
    pub density: Vec<f64>,
    /// Enclosed mass M(<r).
    pub mass: Vec<f64>,
    /// Potential Φ(r) (Φ → 0 at infinity).
    pub potential: Vec<f64>,
}

impl RadialTable {
    /// Tabulates a spherical density on `grid` for gravitational constant `g`.
    pub fn new(grid: &LogGrid, g: f64, density: impl Fn(f64) -> f64) -> Self {
        let r = &grid.r;
        let rho: Vec<f64> = r.iter().map(|&r| density(r)).collect();
        let n = r.len();
        // Inside the first grid radius, ρ ∝ r^γ: M(<r0) = 4π ρ0 r0^3 / (3 + γ).
        let gamma = ((rho[1] / rho[0]).ln() / grid.dln()).max(-2.9);
        let m0 = 4.0 * PI * rho[0] * r[0].powi(3) / (3.0 + gamma);
        let lnr: Vec<f64> = r.iter().map(|r| r.ln()).collect();
        let dm: Vec<f64> = (0..n).map(|i| 4.0 * PI * rho[i] * r[i].powi(3)).collect();
        let mass: Vec<f64> = cumulative_trapezoid(&lnr, &dm)
            .iter()
            .map(|m| m + m0)
            .collect();
        // ∫_r^∞ ρ s ds, with a tail ρ ∝ r^-4 beyond the grid.
        let ds: Vec<f64> = (0..n).map(|i| rho[i] * r[i] * r[i]).collect();
        let inner = cumulative_trapezoid(&lnr, &ds);
        let tail = rho[n - 1] * r[n - 1] * r[n - 1] / 2.0;
        let potential = (0..n)
            .map(|i| -g * (mass[i] / r[i] + 4.0 * PI * (inner[n - 1] - inner[i] + tail)))
            .collect();
        RadialTable {
            density: rho,
            mass,
            potential,
        }
    }

    /// Total mass on the grid.
    pub fn total_mass(&self) -> f64 {
        self.mass[self.mass.len() - 1]
    }

    /// The radius enclosing mass fraction `u` (inverse of M(<r), linear in ln r).
    pub fn radius_of_mass_fraction(&self, grid: &LogGrid, u: f64) -> f64 {
        let target = u * self.total_mass();
        let i = self.mass.partition_point(|&m| m < target);
        if i == 0 {
            // Inside the first node: M ∝ r^(3+γ) ≈ r^3 scaling is close enough there.
            return grid.r[0] * (target / self.mass[0]).max(0.0).cbrt();
        }
        if i >= self.mass.len() {
            return grid.r[grid.r.len() - 1];
        }
        let t = (target - self.mass[i - 1]) / (self.mass[i] - self.mass[i - 1]);
        (grid.r[i - 1].ln() + t * (grid.r[i].ln() - grid.r[i - 1].ln())).exp()
    }
}

/// An isotropic distribution function f(E) of binding energy E = Ψ − v²/2 from Eddington's
/// formula f(E) = (1/√8π²) d/dE ∫_0^E (dρ/dΨ) dΨ / √(E − Ψ), tabulated.
#[derive(Debug, Clone)]
pub struct Eddington {
    /// Binding energies, ascending.
    energy: Vec<f64>,
    /// ln f at those energies (f clamped to a tiny positive value where the formula gives ≤ 0).
    ln_f: Vec<f64>,
    /// Largest |f| among the negative values, relative to the largest f (0 if none).
    pub negative_fraction: f64,
}

impl Eddington {
    /// The DF of a component of density `rho[i]` in the relative potential `psi[i]`
    /// (positive, decreasing outwards), both on the same radial grid.
    pub fn new(rho: &[f64], psi: &[f64]) -> Self {
        // Ascending Ψ: walk the grid from the outside in.
        let psi_up: Vec<f64> = psi.iter().rev().copied().collect();
        let rho_up: Vec<f64> = rho.iter().rev().copied().collect();
        let n = psi_up.len();
        let drho: Vec<f64> = (0..n)
            .map(|k| {
                let (a, b) = (k.saturating_sub(1), (k + 1).min(n - 1));
                ((rho_up[b] - rho_up[a]) / (psi_up[b] - psi_up[a])).max(0.0)
            })
            .collect();
        let drho_at = |x: f64| -> f64 {
            if x <= psi_up[0] {
                return drho[0] * (x / psi_up[0]).max(0.0);
            }
            let k = psi_up.partition_point(|&p| p < x).min(n - 1);
            let t = (x - psi_up[k - 1]) / (psi_up[k] - psi_up[k - 1]);
            drho[k - 1] + t * (drho[k] - drho[k - 1])
        };
        let (nodes, weights) = gauss_legendre(96);
        // F(E) = 2 ∫_0^√E ρ'(E − s²) ds.
        let big_f: Vec<f64> = psi_up
            .iter()
            .map(|&e| {
                let smax = e.sqrt();
                nodes
                    .iter()
                    .zip(&weights)
                    .map(|(x, w)| {
                        let s = 0.5 * smax * (x + 1.0);
                        w * 0.5 * smax * 2.0 * drho_at(e - s * s)
                    })
                    .sum()
            })
            .collect();
        let norm = 1.0 / (8f64.sqrt() * PI * PI);
        let f: Vec<f64> = (0..n)
            .map(|k| {
                let (a, b) = (k.saturating_sub(1), (k + 1).min(n - 1));
                norm * (big_f[b] - big_f[a]) / (psi_up[b] - psi_up[a])
            })
            .collect();
        let fmax = f.iter().fold(0.0f64, |m, &x| m.max(x));
        let fneg = f.iter().fold(0.0f64, |m, &x| m.max(-x));
        let floor = fmax * 1e-30 + f64::MIN_POSITIVE;
        Eddington {
            ln_f: f.iter().map(|&x| x.max(floor).ln()).collect(),
            energy: psi_up,
            negative_fraction: if fmax > 0.0 { fneg / fmax } else { 1.0 },
        }
    }

    /// f(E), interpolated linearly in (E, ln f); zero for E ≤ 0.
    pub fn f(&self, e: f64) -> f64 {
        if e <= 0.0 {
            return 0.0;
        }
        let n = self.energy.len();
        let k = self.energy.partition_point(|&x| x < e).clamp(1, n - 1);
        let t = ((e - self.energy[k - 1]) / (self.energy[k] - self.energy[k - 1])).clamp(0.0, 1.0);
        (self.ln_f[k - 1] + t * (self.ln_f[k] - self.ln_f[k - 1])).exp()
    }

    /// The density of w = v/v_esc at relative potential `psi`: w² f(ψ (1 − w²)).
    pub fn speed_density(&self, psi: f64, w: f64) -> f64 {
        w * w * self.f(psi * (1.0 - w * w))
    }
}

/// Speed sampler for one spheroid: the DF plus the maximum of the speed density at every
/// grid radius (for rejection sampling).
#[derive(Debug, Clone)]
pub struct SpeedSampler {
    df: Eddington,
    peak: Vec<f64>,
}

impl SpeedSampler {
    /// Tabulates the rejection bounds on the grid radii with relative potential `psi`.
    pub fn new(df: Eddington, psi: &[f64]) -> Self {
        let peak = psi
            .iter()
            .map(|&p| unimodal_max(&|w| df.speed_density(p, w)))
            .collect();
        SpeedSampler { df, peak }
    }

    /// The distribution function.
    pub fn df(&self) -> &Eddington {
        &self.df
    }

    /// A speed at radius `r` (relative potential `psi` there), by rejection against the
    /// tabulated peak of the neighbouring grid radii with 20% margin; a proposal above the
    /// bound (never expected) switches to the exact peak for this radius.
    pub fn sample(&self, grid: &LogGrid, r: f64, psi: f64, rng: &mut Pcg64) -> f64 {
        let (i, _) = grid.locate(r);
        let mut bound = 1.2 * self.peak[i].max(self.peak[i + 1]);
        loop {
            let w: f64 = rng.random();
            let y: f64 = rng.random::<f64>() * bound;
            let d = self.df.speed_density(psi, w);
            if d > bound {
                bound = 1.05 * unimodal_max(&|w| self.df.speed_density(psi, w));
                continue;
            }
            if y <= d {
                return w * (2.0 * psi).sqrt();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hernquist_table_and_df_match_the_analytic_ones() {
        let (m, a, g) = (1.0, 1.0, 1.0);
        let s = Spheroid::new(Profile::Hernquist { mass: m, a }, None);
        let grid = LogGrid::new(1e-4, 1e4, 2000);
        let t = RadialTable::new(&grid, g, |r| s.density(r));
        for &r in &[0.01, 0.3, 1.0, 7.0, 100.0] {
            let i = grid.r.partition_point(|&x| x < r);
            let rr = grid.r[i];
            let exact_m = m * rr * rr / ((rr + a) * (rr + a));
            let exact_phi = -g * m / (rr + a);
            assert!(
                (t.mass[i] / exact_m - 1.0).abs() < 2e-3,
                "M({rr}) {} vs {exact_m}",
                t.mass[i]
            );
            assert!((t.potential[i] / exact_phi - 1.0).abs() < 2e-3, "Φ({rr})");
        }
        // Eddington's f against Hernquist (1990) eq. 17 (up to its constant).
        let psi: Vec<f64> = t.potential.iter().map(|p| -p).collect();
        let df = Eddington::new(&t.density, &psi);
        assert!(df.negative_fraction < 1e-6);
        let exact = |e: f64| {
            let q2: f64 = e * a / (g * m);
            let q = q2.sqrt();
            (3.0 * q.asin()
                + q * (1.0 - q2).sqrt() * (1.0 - 2.0 * q2) * (8.0 * q2 * q2 - 8.0 * q2 - 3.0))
                / (1.0 - q2).powf(2.5)
                * m
                / (8.0 * 2f64.sqrt() * PI.powi(3) * a.powi(3) * (g * m / a).powf(1.5))
        };
        for &e in &[0.05, 0.2, 0.5, 0.8, 0.95] {
            let (num, ex) = (df.f(e), exact(e));
            assert!((num / ex - 1.0).abs() < 0.02, "f({e}) = {num} vs {ex}");
        }
    }
}
