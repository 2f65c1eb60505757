//! Disk velocities from the Jeans equations in the full-model potential:
//! σ_z from vertical hydrostatic equilibrium, σ_R from the requested Toomre Q, σ_φ from the
//! epicyclic ratio, and the mean rotation from the asymmetric drift.
//!
//! The epicyclic approximation behind σ_φ and the drift needs σ_R ≪ v_c. Near the centre an
//! exponential Q profile asks for σ_R ≳ v_c; such stars are on nearly radial orbits that
//! reach the outer disk within a crossing time and heat it (σ_φ doubles there in a third of a
//! rotation). So σ_R is capped at `SIGMA_R_CAP` v_c: the disk is colder than the Q profile
//! only where the profile would not describe a disk. Where the drift equation still asks for
//! v̄_φ² < 0, v̄_φ = 0.

use super::disk::DiskProfile;
use super::potential::GalaxyPotential;
use rand::RngExt;
use rand_distr::StandardNormal;
use rand_pcg::Pcg64;

/// Toomre's stability parameter for a stellar disk: Q = σ_R κ / (3.36 G Σ).
pub const TOOMRE_STELLAR: f64 = 3.36;

/// How σ_R follows from the requested Q.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum QProfile {
    /// σ_R² ∝ Σ (σ_R ∝ exp(−R/2R_d)), normalised so that Q(radius) = q.
    Exponential {
        /// Q at `radius`.
        q: f64,
        /// Reference radius.
        radius: f64,
    },
    /// Q(R) = q at every radius.
    Constant {
        /// The Q value.
        q: f64,
    },
}

/// σ_R is held at or below this fraction of the local circular speed.
pub const SIGMA_R_CAP: f64 = 0.5;

const NR: usize = 400;
const NZ: usize = 200;
/// Heights are tabulated up to this many scale heights (the sech² tail beyond holds 2e-9).
const Z_EXTENT: f64 = 10.0;

/// Tables of the disk's velocity moments.
#[derive(Debug, Clone)]
pub struct DiskKinematics {
    g: f64,
    r_step: f64,
    z_step: f64,
    /// R ∂Φ/∂R on the (R, z) grid: the local circular speed squared.
    vc2: Vec<f64>,
    /// σ_z² on the (R, z) grid.
    sigma_z2: Vec<f64>,
    /// σ_R²(R), κ²(R), Σ(R) and the drift factor 1 − κ²/4Ω² + d ln(Σσ_R²)/d ln R.
    sigma_r2: Vec<f64>,
    kappa2: Vec<f64>,
    surface: Vec<f64>,
    drift: Vec<f64>,
}

impl DiskKinematics {
    /// Tabulates the moments of `disk` in `potential` for the Q profile `q`.
    pub fn new(disk: &DiskProfile, potential: &GalaxyPotential, q: QProfile, g: f64) -> Self {
        let r_end = disk.rt + 3.0 * disk.rd;
        let r_step = r_end / (NR - 1) as f64;
        let z_step = Z_EXTENT * disk.z0 / (NZ - 1) as f64;
        let radius = |i: usize| (i as f64 * r_step).max(1e-3 * r_step);
        let mut vc2 = vec![0.0; NR * NZ];
        let mut sigma_z2 = vec![0.0; NR * NZ];
        for i in 0..NR {
            let r = radius(i);
            let mut dphidz = vec![0.0; NZ];
            for j in 0..NZ {
                let z = j as f64 * z_step;
                let (_, grad) = potential.evaluate(r, z);
                vc2[i * NZ + j] = r * grad[0];
                dphidz[j] = grad[1];
            }
            // σ_z²(z) ζ(z) = ∫_z^∞ ζ ∂Φ/∂z dz, accumulated from the top.
            let mut acc = 0.0;
            for j in (0..NZ).rev() {
                if j + 1 < NZ {
                    let (za, zb) = (j as f64 * z_step, (j + 1) as f64 * z_step);
                    acc +=
                        0.5 * z_step * (disk.zeta(za) * dphidz[j] + disk.zeta(zb) * dphidz[j + 1]);
                }
                let zeta = disk.zeta(j as f64 * z_step);
                sigma_z2[i * NZ + j] = if zeta > 0.0 { acc / zeta } else { 0.0 };
            }
        }
        let mid = |i: usize| vc2[i * NZ];
        // κ² = 2 v_c²/R² + (1/R) d v_c²/dR, by central differences on the midplane.
        let kappa2: Vec<f64> = (0..NR)
            .map(|i| {
                let (a, b) = (i.saturating_sub(1), (i + 1).min(NR - 1));
                let slope = (mid(b) - mid(a)) / (radius(b) - radius(a));
                let r = radius(i);
                (2.0 * mid(i) / (r * r) + slope / r).max(0.0)
            })
            .collect();
        let surface: Vec<f64> = (0..NR).map(|i| disk.surface_density(radius(i))).collect();
        let toomre = |i: usize, q: f64| q * TOOMRE_STELLAR * g * surface[i] / kappa2[i].sqrt();
        let requested: Vec<f64> = match q {
            QProfile::Constant { q } => (0..NR).map(|i| toomre(i, q).powi(2)).collect(),
            QProfile::Exponential { q, radius: r_ref } => {
                let k = ((r_ref / r_step).round() as usize).clamp(1, NR - 1);
                let s_ref2 = toomre(k, q).powi(2);
                (0..NR)
                    .map(|i| s_ref2 * (-(radius(i) - radius(k)) / disk.rd).exp())
                    .collect()
            }
        };
        let sigma_r2: Vec<f64> = (0..NR)
            .map(|i| requested[i].min(SIGMA_R_CAP * SIGMA_R_CAP * mid(i).max(0.0)))
            .collect();
        let drift = (0..NR)
            .map(|i| {
                let (a, b) = (i.saturating_sub(1).max(1), (i + 1).min(NR - 1));
                let f = |k: usize| (surface[k] * sigma_r2[k]).max(1e-300).ln();
                let dln = (f(b) - f(a)) / (radius(b).ln() - radius(a).ln());
                let omega2 = mid(i) / (radius(i) * radius(i));
                let ratio = if omega2 > 0.0 {
                    kappa2[i] / (4.0 * omega2)
                } else {
                    1.0
                };
                1.0 - ratio + dln
            })
            .collect();
        DiskKinematics {
            g,
            r_step,
            z_step,
            vc2,
            sigma_z2,
            sigma_r2,
            kappa2,
            surface,
            drift,
        }
    }

    /// Linear interpolation of a radial table at `r`.
    fn radial(&self, table: &[f64], r: f64) -> f64 {
        let x = (r / self.r_step).clamp(0.0, (NR - 1) as f64);
        let i = (x as usize).min(NR - 2);
        let t = x - i as f64;
        table[i] + t * (table[i + 1] - table[i])
    }

    /// Bilinear interpolation of an (R, z) table at (r, |z|).
    fn planar(&self, table: &[f64], r: f64, z: f64) -> f64 {
        let x = (r / self.r_step).clamp(0.0, (NR - 1) as f64);
        let y = (z.abs() / self.z_step).clamp(0.0, (NZ - 1) as f64);
        let (i, j) = ((x as usize).min(NR - 2), (y as usize).min(NZ - 2));
        let (tx, ty) = (x - i as f64, y - j as f64);
        let v = |i: usize, j: usize| table[i * NZ + j];
        (1.0 - tx) * ((1.0 - ty) * v(i, j) + ty * v(i, j + 1))
            + tx * ((1.0 - ty) * v(i + 1, j) + ty * v(i + 1, j + 1))
    }

    /// σ_R²(R).
    pub fn sigma_r2(&self, r: f64) -> f64 {
        self.radial(&self.sigma_r2, r)
    }

    /// κ²(R) in the midplane.
    pub fn kappa2(&self, r: f64) -> f64 {
        self.radial(&self.kappa2, r)
    }

    /// The Toomre Q the tables realise at R: σ_R κ / (3.36 G Σ).
    pub fn toomre_q(&self, r: f64) -> f64 {
        self.sigma_r2(r).sqrt() * self.kappa2(r).sqrt()
            / (TOOMRE_STELLAR * self.g * self.radial(&self.surface, r))
    }

    /// σ_z²(R, z).
    pub fn sigma_z2(&self, r: f64, z: f64) -> f64 {
        self.planar(&self.sigma_z2, r, z)
    }

    /// Mean rotation speed at (R, z) from the asymmetric drift (0 where it fails).
    pub fn mean_vphi(&self, r: f64, z: f64) -> f64 {
        let v2 = self.planar(&self.vc2, r, z) + self.sigma_r2(r) * self.radial(&self.drift, r);
        v2.max(0.0).sqrt()
    }

    /// A velocity for a disk particle at `pos`.
    pub fn sample(&self, pos: [f64; 3], rng: &mut Pcg64) -> [f64; 3] {
        let r = (pos[0] * pos[0] + pos[1] * pos[1]).sqrt();
        let z = pos[2];
        let sr2 = self.sigma_r2(r);
        let vc2_mid = self.planar(&self.vc2, r, 0.0);
        let ratio = if vc2_mid > 0.0 {
            self.kappa2(r) * r * r / (4.0 * vc2_mid)
        } else {
            1.0
        };
        let sphi = (sr2 * ratio).max(0.0).sqrt();
        let gauss = |rng: &mut Pcg64| -> f64 { rng.sample(StandardNormal) };
        let v_r = sr2.sqrt() * gauss(rng);
        let v_phi = self.mean_vphi(r, z) + sphi * gauss(rng);
        let v_z = self.sigma_z2(r, z).max(0.0).sqrt() * gauss(rng);
        let (c, s) = if r > 0.0 {
            (pos[0] / r, pos[1] / r)
        } else {
            (1.0, 0.0)
        };
        [v_r * c - v_phi * s, v_r * s + v_phi * c, v_z]
    }
}
