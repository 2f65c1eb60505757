//! The exponential disk: surface density Σ(R) = Σ0 exp(−R/R_d) T(R), with a smooth
//! truncation T(R) = ½ erfc((R − R_t)/(√2 δ)), δ = R_d/4, and vertical density
//! ζ(z) = sech²(z/z0)/(2 z0), so ρ(R, z) = Σ(R) ζ(z). Radii are sampled from the tabulated
//! cumulative mass, heights from the sech² profile by its inverse CDF.

use super::tables::cumulative_trapezoid;
use rand::RngExt;
use rand_pcg::Pcg64;
use std::f64::consts::PI;

/// An exponential sech² disk.
#[derive(Debug, Clone)]
pub struct DiskProfile {
    /// Total mass.
    pub mass: f64,
    /// Scale length R_d.
    pub rd: f64,
    /// Scale height z0.
    pub z0: f64,
    /// Truncation radius R_t.
    pub rt: f64,
    width: f64,
    sigma0: f64,
    cdf_r: Vec<f64>,
    cdf_m: Vec<f64>,
}

impl DiskProfile {
    /// A disk of total `mass` with scale length `rd`, scale height `z0`, truncated at `rt`.
    pub fn new(mass: f64, rd: f64, z0: f64, rt: f64) -> Self {
        let mut d = DiskProfile {
            mass,
            rd,
            z0,
            rt,
            width: 0.25 * rd,
            sigma0: 1.0,
            cdf_r: Vec::new(),
            cdf_m: Vec::new(),
        };
        let r_end = rt + 8.0 * d.width;
        let n = 8001;
        let r: Vec<f64> = (0..n).map(|i| r_end * i as f64 / (n - 1) as f64).collect();
        let dm: Vec<f64> = r
            .iter()
            .map(|&r| 2.0 * PI * r * d.surface_density(r))
            .collect();
        let m = cumulative_trapezoid(&r, &dm);
        let unit_mass = m[n - 1];
        d.sigma0 = mass / unit_mass;
        d.cdf_m = m.iter().map(|x| x / unit_mass).collect();
        d.cdf_r = r;
        d
    }

    /// The truncation T(R) and its first two derivatives.
    fn taper(&self, r: f64) -> (f64, f64, f64) {
        let s = std::f64::consts::SQRT_2 * self.width;
        let u = (r - self.rt) / s;
        let t = 0.5 * libm::erfc(u);
        let g = (-u * u).exp() / ((2.0 * PI).sqrt() * self.width);
        (t, -g, g * 2.0 * u / s)
    }

    /// Σ(R).
    pub fn surface_density(&self, r: f64) -> f64 {
        self.sigma0 * (-r / self.rd).exp() * self.taper(r).0
    }

    /// Σ(R), Σ'(R), Σ''(R).
    pub fn surface_density_derivatives(&self, r: f64) -> (f64, f64, f64) {
        let e = self.sigma0 * (-r / self.rd).exp();
        let (t, t1, t2) = self.taper(r);
        let k = 1.0 / self.rd;
        (e * t, e * (t1 - k * t), e * (t2 - 2.0 * k * t1 + k * k * t))
    }

    /// ζ(z) = sech²(z/z0)/(2 z0), normalised to unit integral.
    pub fn zeta(&self, z: f64) -> f64 {
        let c = (z / self.z0).cosh();
        if c.is_finite() {
            0.5 / (self.z0 * c * c)
        } else {
            0.0
        }
    }

    /// Z(z) = ∫_0^z ∫_0^z' ζ = (z0/2) ln cosh(z/z0), and Z'(z) = tanh(z/z0)/2.
    pub fn zeta_integrals(&self, z: f64) -> (f64, f64) {
        let x = (z / self.z0).abs();
        // ln cosh x = x − ln 2 + ln(1 + e^{−2x}), stable for large x.
        let lncosh = x - std::f64::consts::LN_2 + (-2.0 * x).exp().ln_1p();
        (0.5 * self.z0 * lncosh, 0.5 * (z / self.z0).tanh())
    }

    /// ρ(R, z).
    pub fn density(&self, r: f64, z: f64) -> f64 {
        self.surface_density(r) * self.zeta(z)
    }

    /// Fraction of the disk mass inside cylindrical radius `r`.
    pub fn mass_fraction(&self, r: f64) -> f64 {
        let i = self.cdf_r.partition_point(|&x| x < r);
        if i == 0 {
            return 0.0;
        }
        if i >= self.cdf_r.len() {
            return 1.0;
        }
        let t = (r - self.cdf_r[i - 1]) / (self.cdf_r[i] - self.cdf_r[i - 1]);
        self.cdf_m[i - 1] + t * (self.cdf_m[i] - self.cdf_m[i - 1])
    }

    /// The cylindrical radius enclosing mass fraction `u`.
    pub fn radius_of_mass_fraction(&self, u: f64) -> f64 {
        let i = self
            .cdf_m
            .partition_point(|&m| m < u)
            .clamp(1, self.cdf_m.len() - 1);
        let (m0, m1) = (self.cdf_m[i - 1], self.cdf_m[i]);
        let t = if m1 > m0 {
            ((u - m0) / (m1 - m0)).clamp(0.0, 1.0)
        } else {
            0.0
        };
        self.cdf_r[i - 1] + t * (self.cdf_r[i] - self.cdf_r[i - 1])
    }

    /// A position drawn from ρ(R, z).
    pub fn sample_position(&self, rng: &mut Pcg64) -> [f64; 3] {
        let r = self.radius_of_mass_fraction(rng.random());
        let phi = 2.0 * PI * rng.random::<f64>();
        let u: f64 = rng.random();
        // The sech² CDF is (1 + tanh(z/z0))/2.
        let z = self.z0 * (2.0 * u - 1.0).clamp(-1.0 + 1e-16, 1.0 - 1e-16).atanh();
        [r * phi.cos(), r * phi.sin(), z]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_normalisation_and_inverse_cdf() {
        let d = DiskProfile::new(5.0, 3.0, 0.3, 30.0);
        // Far inside the truncation the profile is the plain exponential.
        let x: f64 = 1.0;
        let untapered = 1.0 - (1.0 + x) * (-x).exp();
        // The taper removes 5e-4 of the mass beyond R_t = 10 R_d.
        assert!((d.mass_fraction(3.0) / untapered - 1.0).abs() < 1e-3);
        for u in [0.01, 0.3, 0.5, 0.9, 0.999] {
            let r = d.radius_of_mass_fraction(u);
            assert!((d.mass_fraction(r) - u).abs() < 1e-6);
        }
        let (s, s1, s2) = d.surface_density_derivatives(5.0);
        let h = 1e-4;
        assert!(
            (s1 - (d.surface_density(5.0 + h) - d.surface_density(5.0 - h)) / (2.0 * h)).abs()
                < 1e-6 * s.abs().max(1e-3)
        );
        let num2 = (d.surface_density(5.0 + h) - 2.0 * s + d.surface_density(5.0 - h)) / (h * h);
        assert!((s2 - num2).abs() < 1e-4 * s2.abs().max(1e-3));
    }
}
