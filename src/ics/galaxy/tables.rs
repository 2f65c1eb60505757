//! Numerical tables and quadrature shared by the galaxy model: logarithmic radial grids with
//! interpolation, cumulative integrals, Gauss–Legendre nodes and Legendre polynomials.

/// A logarithmically spaced grid of radii.
#[derive(Debug, Clone)]
pub struct LogGrid {
    /// The radii, ascending.
    pub r: Vec<f64>,
    ln_min: f64,
    dln: f64,
}

impl LogGrid {
    /// `n` radii from `r_min` to `r_max`.
    pub fn new(r_min: f64, r_max: f64, n: usize) -> Self {
        let (ln_min, ln_max) = (r_min.ln(), r_max.ln());
        let dln = (ln_max - ln_min) / (n - 1) as f64;
        LogGrid {
            r: (0..n).map(|i| (ln_min + dln * i as f64).exp()).collect(),
            ln_min,
            dln,
        }
    }

    /// Index `i` and weight `t` with r between `r[i]` and `r[i+1]` (linear in ln r), clamped
    /// to the grid.
    pub fn locate(&self, r: f64) -> (usize, f64) {
        let x =
            ((r.max(1e-300).ln() - self.ln_min) / self.dln).clamp(0.0, (self.r.len() - 1) as f64);
        let i = (x.floor() as usize).min(self.r.len() - 2);
        (i, x - i as f64)
    }

    /// `values` interpolated linearly in ln r (constant beyond the ends).
    pub fn interp(&self, values: &[f64], r: f64) -> f64 {
        let (i, t) = self.locate(r);
        values[i] + t * (values[i + 1] - values[i])
    }

    /// Spacing in ln r.
    pub fn dln(&self) -> f64 {
        self.dln
    }
}

/// ∫ y dx from `x[0]` to each `x[i]` by the trapezoid rule.
pub fn cumulative_trapezoid(x: &[f64], y: &[f64]) -> Vec<f64> {
    let mut out = vec![0.0; x.len()];
    for i in 1..x.len() {
        out[i] = out[i - 1] + 0.5 * (y[i] + y[i - 1]) * (x[i] - x[i - 1]);
    }
    out
}

/// Gauss–Legendre nodes and weights on [-1, 1].
pub fn gauss_legendre(n: usize) -> (Vec<f64>, Vec<f64>) {
    let mut nodes = vec![0.0; n];
    let mut weights = vec![0.0; n];
    for i in 0..n.div_ceil(2) {
        let mut x = (std::f64::consts::PI * (i as f64 + 0.75) / (n as f64 + 0.5)).cos();
        let mut dp = 1.0;
        for _ in 0..100 {
            let (p, d) = legendre_with_derivative(n, x);
            dp = d;
            let dx = p / d;
            x -= dx;
            if dx.abs() < 1e-15 {
                break;
            }
        }
        nodes[i] = -x;
        nodes[n - 1 - i] = x;
        let w = 2.0 / ((1.0 - x * x) * dp * dp);
        weights[i] = w;
        weights[n - 1 - i] = w;
    }
    (nodes, weights)
}

/// P_n(x) and P_n'(x).
fn legendre_with_derivative(n: usize, x: f64) -> (f64, f64) {
    let (mut p0, mut p1) = (1.0, x);
    if n == 0 {
        return (1.0, 0.0);
    }
    for k in 2..=n {
        let p2 = ((2 * k - 1) as f64 * x * p1 - (k - 1) as f64 * p0) / k as f64;
        p0 = p1;
        p1 = p2;
    }
    let d = n as f64 * (x * p1 - p0) / (x * x - 1.0);
    (p1, d)
}

/// P_l(mu) for l = 0..=lmax, and their derivatives dP_l/dmu.
pub fn legendre_table(lmax: usize, mu: f64) -> (Vec<f64>, Vec<f64>) {
    let mut p = vec![0.0; lmax + 1];
    let mut dp = vec![0.0; lmax + 1];
    p[0] = 1.0;
    if lmax >= 1 {
        p[1] = mu;
        dp[1] = 1.0;
    }
    for l in 2..=lmax {
        p[l] = ((2 * l - 1) as f64 * mu * p[l - 1] - (l - 1) as f64 * p[l - 2]) / l as f64;
        // dP_l = dP_{l-2} + (2l - 1) P_{l-1}: stable at mu = ±1.
        dp[l] = dp[l - 2] + (2 * l - 1) as f64 * p[l - 1];
    }
    (p, dp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quadrature_and_interpolation() {
        let (x, w) = gauss_legendre(12);
        let integral: f64 = x.iter().zip(&w).map(|(x, w)| w * x.powi(10)).sum();
        assert!((integral - 2.0 / 11.0).abs() < 1e-14);
        let g = LogGrid::new(1e-2, 1e2, 401);
        let v: Vec<f64> = g.r.iter().map(|r| r.ln()).collect();
        assert!((g.interp(&v, 3.0) - 3f64.ln()).abs() < 1e-12);
        let (p, dp) = legendre_table(6, 0.3);
        let (p6, d6) = legendre_with_derivative(6, 0.3);
        assert!((p[6] - p6).abs() < 1e-14 && (dp[6] - d6).abs() < 1e-12);
    }
}
