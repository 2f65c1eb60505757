//! Bar strength: the m = 2 Fourier amplitude of the disk, A2 = |Σ m e^{2iφ}| / Σ m.

use crate::particles::{Component, Particles};

/// A2 of the `component` particles within cylindrical radius `r_max`.
pub fn a2(p: &Particles, component: Component, r_max: f64) -> f64 {
    m2_mode(p, component, r_max).amplitude
}

/// The m = 2 Fourier mode of a disk: its amplitude A2 and the bar's angle.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct M2Mode {
    /// A2 = |Σ m e^{2iφ}| / Σ m.
    pub amplitude: f64,
    /// The bar's major axis, arg(Σ m e^{2iφ}) / 2, in (-π/2, π/2].
    pub angle: f64,
}

/// The m = 2 mode of the `component` particles within cylindrical radius `r_max`.
pub fn m2_mode(p: &Particles, component: Component, r_max: f64) -> M2Mode {
    let (mut re, mut im, mut m) = (0.0, 0.0, 0.0);
    for i in 0..p.len() {
        if p.component[i] != component {
            continue;
        }
        let x = p.pos[i];
        let r2 = x[0] * x[0] + x[1] * x[1];
        if r2 >= r_max * r_max || r2 == 0.0 {
            continue;
        }
        // e^{2iφ} = (x + iy)² / r².
        let w = p.mass[i] / r2;
        re += w * (x[0] * x[0] - x[1] * x[1]);
        im += w * 2.0 * x[0] * x[1];
        m += p.mass[i];
    }
    if m > 0.0 {
        M2Mode {
            amplitude: (re * re + im * im).sqrt() / m,
            angle: 0.5 * im.atan2(re),
        }
    } else {
        M2Mode {
            amplitude: 0.0,
            angle: 0.0,
        }
    }
}

/// Pattern speeds between consecutive snapshots from the bar's angles at `times`: the angle
/// change taken modulo π into (-π/2, π/2] (a bar is symmetric under a half turn, so the
/// snapshots must be less than a quarter bar period apart), over the time between them.
pub fn pattern_speeds(times: &[f64], angles: &[f64]) -> Vec<f64> {
    use std::f64::consts::PI;
    times
        .windows(2)
        .zip(angles.windows(2))
        .map(|(t, a)| {
            let mut d = (a[1] - a[0]).rem_euclid(PI);
            if d > 0.5 * PI {
                d -= PI;
            }
            d / (t[1] - t[0])
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a2_of_a_bar_and_of_a_ring() {
        let mut bar = Particles::default();
        let mut ring = Particles::default();
        for k in 0..360 {
            let phi = (k as f64).to_radians();
            ring.push(
                [phi.cos(), phi.sin(), 0.0],
                [0.0; 3],
                1.0,
                k,
                Component::Disk,
            );
            // Points on the x axis only: a perfect m = 2 pattern.
            let x = if k % 2 == 0 { 1.0 } else { -1.0 };
            bar.push([x, 0.0, 0.0], [0.0; 3], 1.0, k, Component::Disk);
        }
        assert!(a2(&ring, Component::Disk, 2.0) < 1e-12);
        assert!((a2(&bar, Component::Disk, 2.0) - 1.0).abs() < 1e-12);
    }

    #[test]
    fn pattern_speed_unwraps_across_the_half_turn() {
        // A bar at 80° turning by 30° per unit time: 110° reads as -70°.
        let angles = [80f64.to_radians(), -70f64.to_radians(), -40f64.to_radians()];
        for w in pattern_speeds(&[0.0, 1.0, 2.0], &angles) {
            assert!((w - 30f64.to_radians()).abs() < 1e-12, "{w}");
        }
    }
}
