//! Exponential disk geometry: surface density ∝ exp(-R/R_d), vertical density ∝ sech²(z/z_0),
//! sampled by inverse CDF.

use rand::RngExt;
use rand_pcg::Pcg64;

/// Cylindrical radius of mass fraction `u` of an exponential disk of scale length `rd`,
/// truncated at `r_max`: solves 1 - (1 + x) e^{-x} = u · F(r_max/rd) by Newton iteration.
pub fn radius_of_mass_fraction(u: f64, rd: f64, r_max: f64) -> f64 {
    let cdf = |x: f64| 1.0 - (1.0 + x) * (-x).exp();
    let target = u * cdf(r_max / rd);
    // Start from the small-x expansion x²/2 or a large value, then Newton on x e^{-x} > 0.
    let mut x = (2.0 * target).sqrt().clamp(1e-12, r_max / rd);
    for _ in 0..60 {
        let f = cdf(x) - target;
        let df = x * (-x).exp();
        if df <= 0.0 {
            break;
        }
        let step = f / df;
        x = (x - step).clamp(x * 0.1, (x * 10.0).min(r_max / rd));
        if step.abs() < 1e-14 * x {
            break;
        }
    }
    x * rd
}

/// A height drawn from the sech²(z/z0) profile.
pub fn sech2_height(z0: f64, rng: &mut Pcg64) -> f64 {
    let u: f64 = rng.random();
    // CDF (1 + tanh(z/z0)) / 2.
    z0 * (2.0 * u - 1.0).clamp(-1.0 + 1e-16, 1.0 - 1e-16).atanh()
}

/// A position in an exponential disk truncated at `r_max`.
pub fn sample_position(rd: f64, z0: f64, r_max: f64, rng: &mut Pcg64) -> [f64; 3] {
    let r = radius_of_mass_fraction(rng.random(), rd, r_max);
    let phi = 2.0 * std::f64::consts::PI * rng.random::<f64>();
    [r * phi.cos(), r * phi.sin(), sech2_height(z0, rng)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inverse_cdf_inverts() {
        for u in [1e-6, 0.1, 0.5, 0.9, 0.999] {
            let r = radius_of_mass_fraction(u, 3.0, 1e9);
            let x = r / 3.0;
            let f = 1.0 - (1.0 + x) * (-x).exp();
            assert!((f - u).abs() < 1e-12, "u={u}: F={f}");
        }
        assert!(radius_of_mass_fraction(1.0, 3.0, 30.0) <= 30.0);
    }
}
