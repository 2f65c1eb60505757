//! Softened pair interactions: Plummer and the GADGET cubic-spline kernel.
//!
//! Both are written as two scale factors of the separation vector so that every solver
//! (direct, FMM near field, GPU) evaluates exactly the same function:
//! `a_i += G m_j f(r) (x_j - x_i)` and `phi_i -= G m_j p(r)`.

use serde::{Deserialize, Serialize};

/// Spline support radius in units of the Plummer-equivalent softening (GADGET: h = 2.8 ε).
pub const SPLINE_SUPPORT_PER_EPSILON: f64 = 2.8;

/// The softening kernel family. The spline is the default: it is exactly Newtonian beyond
/// its support, so the FMM's far field is exact, as in GADGET (see docs/config.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SofteningKernel {
    /// `phi = -G m / sqrt(r^2 + eps^2)`: smooth, never exactly Newtonian.
    Plummer,
    /// GADGET-2 cubic spline with support h = 2.8 eps: exactly Newtonian beyond h,
    /// same central potential `-G m / eps` as Plummer.
    #[default]
    Spline,
}

impl SofteningKernel {
    /// The name used in config files.
    pub fn name(self) -> &'static str {
        match self {
            SofteningKernel::Plummer => "plummer",
            SofteningKernel::Spline => "spline",
        }
    }
}

/// A softening kernel with its length.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Softening {
    /// Kernel family.
    pub kernel: SofteningKernel,
    /// Plummer-equivalent softening length (0 = Newtonian).
    pub epsilon: f64,
}

impl Softening {
    /// Newtonian gravity (no softening).
    pub fn newtonian() -> Self {
        Softening {
            kernel: SofteningKernel::Plummer,
            epsilon: 0.0,
        }
    }

    /// Force and potential factors `(f, p)` at squared separation `r2 > 0`: for Newtonian
    /// gravity `f = 1/r^3`, `p = 1/r`.
    #[inline(always)]
    pub fn factors(&self, r2: f64) -> (f64, f64) {
        match self.kernel {
            SofteningKernel::Plummer => plummer_factors(r2, self.epsilon * self.epsilon),
            SofteningKernel::Spline => {
                spline_factors(r2, SPLINE_SUPPORT_PER_EPSILON * self.epsilon)
            }
        }
    }
}

/// The floating-point operations the pair kernels need, so that one kernel source serves
/// the f64 reference and the f32 near field.
pub trait Real:
    Copy
    + PartialOrd
    + std::ops::Add<Output = Self>
    + std::ops::Sub<Output = Self>
    + std::ops::Mul<Output = Self>
    + std::ops::Div<Output = Self>
    + std::ops::Neg<Output = Self>
    + std::ops::AddAssign
{
    /// Zero.
    const ZERO: Self;
    /// One.
    const ONE: Self;
    /// Converts a constant (rounded to nearest).
    fn lit(x: f64) -> Self;
    /// Square root (IEEE, correctly rounded).
    fn sqrt(self) -> Self;
    /// Widens to f64.
    fn to_f64(self) -> f64;
}

impl Real for f64 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    #[inline(always)]
    fn lit(x: f64) -> Self {
        x
    }
    #[inline(always)]
    fn sqrt(self) -> Self {
        f64::sqrt(self)
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self
    }
}

impl Real for f32 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    #[inline(always)]
    fn lit(x: f64) -> Self {
        x as f32
    }
    #[inline(always)]
    fn sqrt(self) -> Self {
        f32::sqrt(self)
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self as f64
    }
}

/// Plummer kernel factors for squared separation `r2` and squared softening `eps2`.
#[inline(always)]
pub fn plummer_factors<T: Real>(r2: T, eps2: T) -> (T, T) {
    let inv = T::ONE / (r2 + eps2).sqrt();
    (inv * inv * inv, inv)
}

/// GADGET-2 cubic-spline kernel factors (forcetree.c) for squared separation `r2` and
/// support `h`. Written branch-free over the three regions so that it vectorises.
#[inline(always)]
pub fn spline_factors<T: Real>(r2: T, h: T) -> (T, T) {
    let c = T::lit;
    let r = r2.sqrt();
    let inv_r = T::ONE / r;
    let newton_f = inv_r * inv_r * inv_r;
    let h_inv = T::ONE / h;
    let h3_inv = h_inv * h_inv * h_inv;
    let u = r * h_inv;
    let u2 = u * u;
    let inner_f = h3_inv * (c(32.0 / 3.0) + u2 * (c(32.0) * u - c(192.0 / 5.0)));
    let inner_p =
        -h_inv * (c(-14.0 / 5.0) + u2 * (c(16.0 / 3.0) + u2 * (c(32.0 / 5.0) * u - c(48.0 / 5.0))));
    let inv_u = h * inv_r;
    let outer_f = h3_inv
        * (c(64.0 / 3.0) - c(48.0) * u + c(192.0 / 5.0) * u2
            - c(32.0 / 3.0) * u2 * u
            - c(1.0 / 15.0) * inv_u * inv_u * inv_u);
    let outer_p = -h_inv
        * (c(-16.0 / 5.0)
            + c(1.0 / 15.0) * inv_u
            + u2 * (c(32.0 / 3.0) + u * (c(-16.0) + u * (c(48.0 / 5.0) - c(32.0 / 15.0) * u))));
    let (soft_f, soft_p) = if u < c(0.5) {
        (inner_f, inner_p)
    } else {
        (outer_f, outer_p)
    };
    if r >= h {
        (newton_f, inv_r)
    } else {
        (soft_f, soft_p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spline_is_continuous_and_newtonian_outside_support() {
        let h = 2.8;
        for &u in &[0.5f64, 1.0] {
            let (fa, pa) = spline_factors::<f64>((u * h * (1.0 - 1e-12)).powi(2), h);
            let (fb, pb) = spline_factors::<f64>((u * h * (1.0 + 1e-12)).powi(2), h);
            assert!(
                (fa / fb - 1.0).abs() < 1e-9,
                "force jump at u={u}: {fa} vs {fb}"
            );
            assert!(
                (pa / pb - 1.0).abs() < 1e-9,
                "potential jump at u={u}: {pa} vs {pb}"
            );
        }
        let r = 3.5;
        let (f, p) = spline_factors::<f64>(r * r, h);
        assert!((f * r * r * r - 1.0).abs() < 1e-15);
        assert!((p * r - 1.0).abs() < 1e-15);
        // Central potential equals Plummer's -1/eps.
        let (_, p0) = spline_factors::<f64>(1e-30, h);
        assert!((p0 - 1.0).abs() < 1e-9, "central potential factor {p0}");
    }

    #[test]
    fn spline_force_is_minus_gradient_of_potential() {
        let h = 1.0;
        for &r in &[0.1, 0.3, 0.49, 0.51, 0.7, 0.95] {
            let d = 1e-6;
            let (_, p1) = spline_factors::<f64>((r - d) * (r - d), h);
            let (_, p2) = spline_factors::<f64>((r + d) * (r + d), h);
            // phi = -p, |F| = dphi/dr = -(dp/dr); f = |F| / r.
            let numeric = -(p2 - p1) / (2.0 * d) / r;
            let (f, _) = spline_factors::<f64>(r * r, h);
            assert!((numeric / f - 1.0).abs() < 1e-6, "r={r}: {numeric} vs {f}");
        }
    }

    #[test]
    fn plummer_limits() {
        let (f, p) = plummer_factors::<f64>(4.0, 0.0);
        assert_eq!((f, p), (0.125, 0.5));
        let (f0, p0) = plummer_factors::<f64>(0.0, 0.25);
        assert_eq!((f0, p0), (8.0, 2.0));
    }
}
