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

/// The block scheme's kicks: `v += a h[k]` for the k-th particle of `rows`, or of all
/// particles without them.
pub fn kick_each(p: &mut Particles, rows: Option<&[u32]>, h: &[f64]) {
    match rows {
        None => p
            .vel
            .par_iter_mut()
            .zip(p.acc.par_iter())
            .zip(h.par_iter())
            .for_each(|((v, a), &h)| kick_one(v, a, h)),
        Some(rows) => {
            for (&i, &h) in rows.iter().zip(h) {
                let i = i as usize;
                kick_one(&mut p.vel[i], &p.acc[i], h);
            }
        }
    }
}

/// `v += a h` for one particle.
fn kick_one(v: &mut [f64; 3], a: &[f64; 3], h: f64) {
    for k in 0..3 {
        v[k] += a[k] * h;
    }
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

/// Largest |a| of each component's particles (indexed by `Component::index`; 0 where a
/// component has none), for time steps from per-component softening lengths.
pub fn max_acceleration_by_component(p: &Particles) -> [f64; 4] {
    p.acc
        .par_iter()
        .zip(p.component.par_iter())
        .fold(
            || [0.0f64; 4],
            |mut m, (a, c)| {
                let k = c.index();
                m[k] = m[k].max((a[0] * a[0] + a[1] * a[1] + a[2] * a[2]).sqrt());
                m
            },
        )
        .reduce(|| [0.0; 4], |a, b| std::array::from_fn(|k| a[k].max(b[k])))
}
