//! Bar strength: the m = 2 Fourier amplitude of the disk, A2 = |Σ m e^{2iφ}| / Σ m.

use crate::particles::{Component, Particles};

/// A2 of the `component` particles within cylindrical radius `r_max`.
pub fn a2(p: &Particles, component: Component, r_max: f64) -> f64 {
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
        (re * re + im * im).sqrt() / m
    } else {
        0.0
    }
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
}
