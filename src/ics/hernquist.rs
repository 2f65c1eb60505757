//! The Hernquist (1990) sphere: analytic profile and its isotropic distribution function
//! (Hernquist 1990, eq. 17), sampled by rejection in v / v_esc.

use super::sampling::{SphericalModel, sample_unimodal};
use rand_pcg::Pcg64;

/// Below this q², `df_shape` uses the series (relative truncation error ~ q^4 < 1e-6).
const SERIES_BELOW: f64 = 1e-3;

/// A Hernquist model of mass `mass` and scale radius `a` for gravitational constant `g`.
#[derive(Debug, Clone, Copy)]
pub struct Hernquist {
    mass: f64,
    a: f64,
    g: f64,
}

impl Hernquist {
    /// The model with the given mass, scale radius and G.
    pub fn new(mass: f64, a: f64, g: f64) -> Self {
        Hernquist { mass, a, g }
    }

    /// Potential at radius `r`.
    pub fn potential(&self, r: f64) -> f64 {
        -self.g * self.mass / (r + self.a)
    }

    /// The distribution function without its constant prefactor, as a function of the
    /// dimensionless binding energy q² = -E a / (G M) in [0, 1).
    fn df_shape(q2: f64) -> f64 {
        let q2 = q2.clamp(0.0, 1.0 - 1e-15);
        let q = q2.sqrt();
        if q2 < SERIES_BELOW {
            // The closed form cancels catastrophically for weakly bound orbits (its terms are
            // O(q), the sum O(q^5)); use its Taylor series there.
            return q2 * q2 * q * (128.0 / 5.0 - 192.0 / 7.0 * q2) / (1.0 - q2).powf(2.5);
        }
        let s = (1.0 - q2).sqrt();
        (3.0 * q.asin() + q * s * (1.0 - 2.0 * q2) * (8.0 * q2 * q2 - 8.0 * q2 - 3.0))
            / (1.0 - q2).powf(2.5)
    }
}

impl SphericalModel for Hernquist {
    fn mass_fraction(&self, r: f64) -> f64 {
        let x = r / (r + self.a);
        x * x
    }

    fn radius_of_mass_fraction(&self, u: f64) -> f64 {
        let s = u.clamp(0.0, 1.0).sqrt();
        if s >= 1.0 {
            return f64::MAX;
        }
        self.a * s / (1.0 - s)
    }

    fn total_mass(&self) -> f64 {
        self.mass
    }

    fn sample_speed(&self, r: f64, rng: &mut Pcg64) -> f64 {
        let psi = -self.potential(r);
        let v_esc = (2.0 * psi).sqrt();
        let psi_tilde = psi * self.a / (self.g * self.mass);
        // With w = v / v_esc the binding energy is psi (1 - w²).
        let w = sample_unimodal(|w| w * w * Self::df_shape(psi_tilde * (1.0 - w * w)), rng);
        w * v_esc
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn df_series_joins_closed_form() {
        let below = Hernquist::df_shape(SERIES_BELOW * (1.0 - 1e-9));
        let above = Hernquist::df_shape(SERIES_BELOW * (1.0 + 1e-9));
        assert!((below / above - 1.0).abs() < 1e-5, "{below} vs {above}");
        assert!(Hernquist::df_shape(1e-12) > 0.0);
    }
}
