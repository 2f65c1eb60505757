//! The potential of the full galaxy model, disk included.
//!
//! Spheroids are spherical: Φ(r) from their radial tables. The disk follows Kuijken &
//! Dubinski (1995): Φ_disk = Φ_app + Φ_res, with the analytic Φ_app = 4πG Σ(r) Z(z) (r the
//! spherical radius, Z'' = ζ) carrying the thin-layer structure, and the smooth residual
//! density ρ_res = ρ_disk − ∇²Φ_app/4πG expanded in Legendre multipoles (even l ≤ L_MAX).

use super::disk::DiskProfile;
use super::spheroid::RadialTable;
use super::tables::{LogGrid, gauss_legendre, legendre_table};
use std::f64::consts::PI;

/// Highest multipole of the disk residual.
const L_MAX: usize = 16;
/// Radial nodes of the multipole tables.
const RADIAL_NODES: usize = 600;
/// Gauss–Legendre nodes in μ = cos θ on [0, 1].
const ANGULAR_NODES: usize = 256;

/// The disk's potential.
#[derive(Debug, Clone)]
pub struct DiskPotential {
    disk: DiskProfile,
    g: f64,
    grid: LogGrid,
    /// Φ_l(r) and dΦ_l/dr for l = 0, 2, …, L_MAX.
    phi: Vec<Vec<f64>>,
    dphi: Vec<Vec<f64>>,
}

impl DiskPotential {
    /// Builds the multipole tables of `disk` for gravitational constant `g`.
    pub fn new(disk: DiskProfile, g: f64) -> Self {
        let r_max = 3.0 * (disk.rt + 2.0 * disk.rd + 20.0 * disk.z0);
        let grid = LogGrid::new(1e-4 * disk.rd.min(disk.z0), r_max, RADIAL_NODES);
        let (x, w) = gauss_legendre(ANGULAR_NODES);
        let mu: Vec<f64> = x.iter().map(|x| 0.5 * (x + 1.0)).collect();
        let wmu: Vec<f64> = w.iter().map(|w| 0.5 * w).collect();
        let legendre: Vec<Vec<f64>> = mu.iter().map(|&m| legendre_table(L_MAX, m).0).collect();
        let ls: Vec<usize> = (0..=L_MAX).step_by(2).collect();
        let mut rho_l = vec![vec![0.0; grid.r.len()]; ls.len()];
        let mut dp = DiskPotential {
            disk,
            g,
            grid,
            phi: Vec::new(),
            dphi: Vec::new(),
        };
        for (k, &r) in dp.grid.r.iter().enumerate() {
            for (j, &m) in mu.iter().enumerate() {
                let rho = dp.residual_density(r, m) * wmu[j];
                for (li, &l) in ls.iter().enumerate() {
                    rho_l[li][k] += (2 * l + 1) as f64 * rho * legendre[j][l];
                }
            }
        }
        let lnr: Vec<f64> = dp.grid.r.iter().map(|r| r.ln()).collect();
        for (li, &l) in ls.iter().enumerate() {
            let lf = l as f64;
            let a = cumulative_power_integral(&lnr, &rho_l[li], lf + 3.0);
            // ∫_r^∞ is accumulated from the outside in: near the centre ρ_l s^(1−l) can grow
            // like s^-3 (the exponential disk's cusp on the axis makes ρ_l ∝ r, not r^l), and
            // "total minus inner part" would cancel catastrophically.
            let rev_x: Vec<f64> = lnr.iter().rev().map(|x| -x).collect();
            let rev_rho: Vec<f64> = rho_l[li].iter().rev().copied().collect();
            let b_rev = cumulative_power_integral(&rev_x, &rev_rho, lf - 2.0);
            let c = -4.0 * PI * g / (2.0 * lf + 1.0);
            let mut phi = Vec::with_capacity(lnr.len());
            let mut dphi = Vec::with_capacity(lnr.len());
            for k in 0..lnr.len() {
                let r = dp.grid.r[k];
                let b = b_rev[lnr.len() - 1 - k];
                phi.push(c * (a[k] * r.powf(-(lf + 1.0)) + b * r.powf(lf)));
                dphi.push(
                    c * (-(lf + 1.0) * a[k] * r.powf(-(lf + 2.0)) + lf * b * r.powf(lf - 1.0)),
                );
            }
            dp.phi.push(phi);
            dp.dphi.push(dphi);
        }
        dp
    }

    /// ρ_disk − ∇²Φ_app/4πG at spherical radius `r` and μ = cos θ.
    fn residual_density(&self, r: f64, mu: f64) -> f64 {
        let d = &self.disk;
        let (cyl, z) = (r * (1.0 - mu * mu).max(0.0).sqrt(), r * mu);
        let (s, s1, s2) = d.surface_density_derivatives(r);
        let (zz, zz1) = d.zeta_integrals(z);
        let zeta = d.zeta(z);
        d.surface_density(cyl) * zeta - (s * zeta + zz * (s2 + 2.0 * s1 / r) + 2.0 * s1 * zz1 * mu)
    }

    /// Φ_l(r) and dΦ_l/dr for multipole index `li` (l = 2 li), extended beyond the table as
    /// r^l inside and r^-(l+1) outside.
    fn multipole(&self, li: usize, r: f64) -> (f64, f64) {
        let l = (2 * li) as f64;
        let (first, last) = (self.grid.r[0], self.grid.r[self.grid.r.len() - 1]);
        let (phi, dphi) = (&self.phi[li], &self.dphi[li]);
        if r >= last {
            let v = phi[phi.len() - 1] * (last / r).powf(l + 1.0);
            return (v, -(l + 1.0) * v / r);
        }
        if r <= first {
            let v = phi[0] * (r / first).powf(l);
            return (v, if li == 0 { 0.0 } else { l * v / r.max(1e-300) });
        }
        (self.grid.interp(phi, r), self.grid.interp(dphi, r))
    }

    /// Φ_disk(R, z) and its gradient (∂Φ/∂R, ∂Φ/∂z).
    pub fn evaluate(&self, cyl: f64, z: f64) -> (f64, [f64; 2]) {
        let d = &self.disk;
        let r = (cyl * cyl + z * z).sqrt().max(1e-12 * d.z0);
        let mu = z / r;
        let (s, s1, _) = d.surface_density_derivatives(r);
        let (zz, zz1) = d.zeta_integrals(z);
        let k = 4.0 * PI * self.g;
        let mut phi = k * s * zz;
        let mut grad = [k * s1 * (cyl / r) * zz, k * (s1 * (z / r) * zz + s * zz1)];
        let (p, dp) = legendre_table(L_MAX, mu);
        let (dmu_dr, dmu_dz) = (-z * cyl / (r * r * r), cyl * cyl / (r * r * r));
        for li in 0..self.phi.len() {
            let l = 2 * li;
            let (f, df) = self.multipole(li, r);
            phi += f * p[l];
            grad[0] += df * (cyl / r) * p[l] + f * dp[l] * dmu_dr;
            grad[1] += df * (z / r) * p[l] + f * dp[l] * dmu_dz;
        }
        (phi, grad)
    }

    /// The spherical average of Φ_disk at radius `r` (its monopole).
    pub fn monopole(&self, r: f64) -> f64 {
        let (x, w) = gauss_legendre(64);
        let s = self.disk.surface_density(r);
        let avg_z: f64 = x
            .iter()
            .zip(&w)
            .map(|(x, w)| 0.5 * w * self.disk.zeta_integrals(r * 0.5 * (x + 1.0)).0)
            .sum();
        4.0 * PI * self.g * s * avg_z + self.multipole(0, r).0
    }
}

/// ∫ ρ(x) e^{n x} dx from x[0] to each x[k], with ρ linear between nodes and the power
/// integrated exactly. (A trapezoid rule on ρ e^{nx} is off by ~(n h)²/12, which the
/// force Φ_l' = c(−(l+1)A r^-(l+2) + l B r^(l−1)) — a small difference of large terms —
/// turns into errors of order one at l ≥ 6.)
fn cumulative_power_integral(x: &[f64], rho: &[f64], n: f64) -> Vec<f64> {
    let mut out = vec![0.0; x.len()];
    for k in 1..x.len() {
        let h = x[k] - x[k - 1];
        let nh = n * h;
        // ∫_0^h e^{nt} dt and ∫_0^h t e^{nt} dt, stable for small n h.
        let (i0, i1) = if nh.abs() < 1e-6 {
            (h * (1.0 + 0.5 * nh), h * h * (0.5 + nh / 3.0))
        } else {
            let em1 = nh.exp_m1();
            (em1 / n, (h * (em1 + 1.0) - em1 / n) / n)
        };
        let slope = (rho[k] - rho[k - 1]) / h;
        out[k] = out[k - 1] + (n * x[k - 1]).exp() * (rho[k - 1] * i0 + slope * i1);
    }
    out
}

/// The potential of the whole model.
#[derive(Debug, Clone)]
pub struct GalaxyPotential {
    /// Radial grid of the spheroid tables.
    pub grid: LogGrid,
    spheroids: Vec<RadialTable>,
    disk: Option<DiskPotential>,
    g: f64,
}

impl GalaxyPotential {
    /// Combines spheroid tables on `grid` with an optional disk.
    pub fn new(
        grid: LogGrid,
        spheroids: Vec<RadialTable>,
        disk: Option<DiskPotential>,
        g: f64,
    ) -> Self {
        GalaxyPotential {
            grid,
            spheroids,
            disk,
            g,
        }
    }

    /// Φ(R, z) and its gradient (∂Φ/∂R, ∂Φ/∂z).
    pub fn evaluate(&self, cyl: f64, z: f64) -> (f64, [f64; 2]) {
        let r = (cyl * cyl + z * z).sqrt().max(1e-300);
        let mut phi = 0.0;
        let mut dphi_dr = 0.0;
        for t in &self.spheroids {
            phi += self.grid.interp(&t.potential, r);
            dphi_dr += self.g * self.grid.interp(&t.mass, r) / (r * r);
        }
        let mut grad = [dphi_dr * cyl / r, dphi_dr * z / r];
        if let Some(d) = &self.disk {
            let (p, g) = d.evaluate(cyl, z);
            phi += p;
            grad[0] += g[0];
            grad[1] += g[1];
        }
        (phi, grad)
    }

    /// The relative potential Ψ = −Φ of the spherically averaged model at the grid radii.
    pub fn spherical_psi(&self) -> Vec<f64> {
        self.grid
            .r
            .iter()
            .enumerate()
            .map(|(i, &r)| {
                let spheroids: f64 = self.spheroids.iter().map(|t| t.potential[i]).sum();
                let disk = self.disk.as_ref().map_or(0.0, |d| d.monopole(r));
                -(spheroids + disk)
            })
            .collect()
    }

    /// The disk part, if any.
    pub fn disk(&self) -> Option<&DiskPotential> {
        self.disk.as_ref()
    }

    /// Circular velocity squared in the midplane, R ∂Φ/∂R at z = 0.
    pub fn vc2(&self, cyl: f64) -> f64 {
        cyl * self.evaluate(cyl, 0.0).1[0]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Modified Bessel functions I0, I1, K0, K1 (Abramowitz & Stegun 9.8.1–9.8.8, |ε| < 2e-7).
    pub(super) fn bessel(x: f64) -> [f64; 4] {
        let t = x / 3.75;
        let (i0, i1) = if x <= 3.75 {
            let t2 = t * t;
            (
                1.0 + t2
                    * (3.5156229
                        + t2 * (3.0899424
                            + t2 * (1.2067492
                                + t2 * (0.2659732 + t2 * (0.0360768 + t2 * 0.0045813))))),
                x * (0.5
                    + t2 * (0.87890594
                        + t2 * (0.51498869
                            + t2 * (0.15084934
                                + t2 * (0.02658733 + t2 * (0.00301532 + t2 * 0.00032411)))))),
            )
        } else {
            let u = 1.0 / t;
            let e = x.exp() / x.sqrt();
            (
                e * (0.39894228
                    + u * (0.01328592
                        + u * (0.00225319
                            + u * (-0.00157565
                                + u * (0.00916281
                                    + u * (-0.02057706
                                        + u * (0.02635537
                                            + u * (-0.01647633 + u * 0.00392377)))))))),
                e * (0.39894228
                    + u * (-0.03988024
                        + u * (-0.00362018
                            + u * (0.00163801
                                + u * (-0.01031555
                                    + u * (0.02282967
                                        + u * (-0.02895312
                                            + u * (0.01787654 - u * 0.00420059)))))))),
            )
        };
        let (k0, k1) = if x <= 2.0 {
            let y = x * x / 4.0;
            (
                -(x / 2.0).ln() * i0
                    + (-0.57721566
                        + y * (0.42278420
                            + y * (0.23069756
                                + y * (0.03488590
                                    + y * (0.00262698 + y * (0.00010750 + y * 0.0000074)))))),
                (x / 2.0).ln() * i1
                    + (1.0 / x)
                        * (1.0
                            + y * (0.15443144
                                + y * (-0.67278579
                                    + y * (-0.18156897
                                        + y * (-0.01919402
                                            + y * (-0.00110404 - y * 0.00004686)))))),
            )
        } else {
            let y = 2.0 / x;
            let e = (-x).exp() / x.sqrt();
            (
                e * (1.25331414
                    + y * (-0.07832358
                        + y * (0.02189568
                            + y * (-0.01062446
                                + y * (0.00587872 + y * (-0.00251540 + y * 0.00053208)))))),
                e * (1.25331414
                    + y * (0.23498619
                        + y * (-0.03655620
                            + y * (0.01504268
                                + y * (-0.00780353 + y * (0.00325614 - y * 0.00068245)))))),
            )
        };
        [i0, i1, k0, k1]
    }

    #[test]
    fn thin_disk_matches_freeman() {
        // A nearly razor-thin disk (z0 = R_d/1000; thickness shifts v_c² by ~2πGΣ z0 ln 2 /R)
        // against Freeman (1970): v_c² = 4πGΣ0 R_d y²[I0K0 − I1K1], y = R/2R_d.
        let (m, rd, g) = (1.0, 1.0, 1.0);
        let disk = DiskProfile::new(m, rd, 0.001, 40.0);
        let sigma0 = disk.surface_density(0.0);
        let pot = DiskPotential::new(disk, g);
        for &r in &[0.3, 1.0, 2.2, 4.0, 8.0] {
            let y = r / (2.0 * rd);
            let [i0, i1, k0, k1] = bessel(y);
            let exact = 4.0 * PI * g * sigma0 * rd * y * y * (i0 * k0 - i1 * k1);
            let got = r * pot.evaluate(r, 0.0).1[0];
            assert!(
                (got / exact - 1.0).abs() < 0.005,
                "R={r}: v_c² {got} vs Freeman {exact}"
            );
        }
        // Far away the disk is a point mass.
        let (phi, _) = pot.evaluate(300.0, 100.0);
        let exact = -g * m / (300f64.powi(2) + 100f64.powi(2)).sqrt();
        assert!(
            (phi / exact - 1.0).abs() < 1e-3,
            "far field {phi} vs {exact}"
        );
    }
}
