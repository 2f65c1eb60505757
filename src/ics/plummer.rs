//! The Plummer sphere: analytic profile and isotropic distribution function
//! f(E) ∝ (-E)^(7/2), sampled as in Aarseth, Hénon & Wielen (1974).

use super::sampling::SphericalModel;
use rand::RngExt;
use rand_pcg::Pcg64;

/// A Plummer model of mass `mass` and scale radius `a` for gravitational constant `g`.
#[derive(Debug, Clone, Copy)]
pub struct Plummer {
    mass: f64,
    a: f64,
    g: f64,
}

impl Plummer {
    /// The model with the given mass, scale radius and G.
    pub fn new(mass: f64, a: f64, g: f64) -> Self {
        Plummer { mass, a, g }
    }

    /// Potential at radius `r`.
    pub fn potential(&self, r: f64) -> f64 {
        -self.g * self.mass / (r * r + self.a * self.a).sqrt()
    }
}

impl SphericalModel for Plummer {
    fn mass_fraction(&self, r: f64) -> f64 {
        let x = r / self.a;
        (x * x / (1.0 + x * x)).powf(1.5)
    }

    fn radius_of_mass_fraction(&self, u: f64) -> f64 {
        if u <= 0.0 {
            return 0.0;
        }
        self.a / (u.powf(-2.0 / 3.0) - 1.0).max(f64::MIN_POSITIVE).sqrt()
    }

    fn total_mass(&self) -> f64 {
        self.mass
    }

    fn sample_speed(&self, r: f64, rng: &mut Pcg64) -> f64 {
        let v_esc = (-2.0 * self.potential(r)).sqrt();
        // q = v / v_esc has density ∝ q² (1 - q²)^(7/2); its maximum (at q² = 2/9) is 0.0922.
        loop {
            let q: f64 = rng.random();
            let y: f64 = 0.1 * rng.random::<f64>();
            if y <= q * q * (1.0 - q * q).powf(3.5) {
                return q * v_esc;
            }
        }
    }
}
