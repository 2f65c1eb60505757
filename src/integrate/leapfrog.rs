//! Kick and drift operators of the kick-drift-kick leapfrog.

use crate::particles::Particles;
use rayon::prelude::*;

/// `v += a h` for every particle.
pub fn kick(p: &mut Particles, h: f64) {
    p.vel
        .par_iter_mut()
        .zip(p.acc.par_iter())
        .for_each(|(v, a)| {
            for k in 0..3 {
                v[k] += a[k] * h;
            }
        });
}

/// `x += v h` for every particle.
pub fn drift(p: &mut Particles, h: f64) {
    p.pos
        .par_iter_mut()
        .zip(p.vel.par_iter())
        .for_each(|(x, v)| {
            for k in 0..3 {
                x[k] += v[k] * h;
            }
        });
}

/// Largest |a| over all particles (exact, order-independent).
pub fn max_acceleration(p: &Particles) -> f64 {
    p.acc
        .par_iter()
        .map(|a| (a[0] * a[0] + a[1] * a[1] + a[2] * a[2]).sqrt())
        .reduce(|| 0.0, f64::max)
}
