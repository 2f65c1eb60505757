//! Sampled Plummer and Hernquist spheres: analytic enclosed-mass profiles, virial
//! equilibrium, centring, and seed reproducibility independent of the thread count.

mod common;

use common::repo;
use leapfmm::gravity::direct::DirectSummation;
use leapfmm::gravity::{GravitySolver, Softening};
use leapfmm::ics::{self, ModelFile};
use leapfmm::integrate::diagnostics::Conserved;
use leapfmm::particles::Particles;

const N: usize = 100_000;

fn sample(model: &str, n: usize, seed: u64) -> (ModelFile, Particles) {
    let m = ModelFile::load(&repo(model)).unwrap();
    let (p, _) = ics::generate(&m, n, seed);
    (m, p)
}

/// Largest |M_sampled(<r) - M_model(<r)| / M over every particle radius.
fn max_mass_profile_error(p: &Particles, model_fraction: impl Fn(f64) -> f64, total: f64) -> f64 {
    let mut r: Vec<f64> = p
        .pos
        .iter()
        .map(|x| (x[0] * x[0] + x[1] * x[1] + x[2] * x[2]).sqrt())
        .collect();
    r.sort_by(f64::total_cmp);
    let m = p.mass[0];
    r.iter()
        .enumerate()
        .map(|(k, &rk)| {
            let model = total * model_fraction(rk);
            // The sampled CDF jumps at rk: compare both sides of the step.
            let below = k as f64 * m;
            let above = (k + 1) as f64 * m;
            (below - model).abs().max((above - model).abs()) / total
        })
        .fold(0.0, f64::max)
}

fn virial_ratio(p: &mut Particles, g: f64) -> f64 {
    DirectSummation::new(g, Softening::newtonian())
        .compute(p)
        .unwrap();
    Conserved::measure(p).virial_ratio()
}

#[test]
fn plummer_profile_and_virial_ratio() {
    let (m, mut p) = sample("ics/plummer.toml", N, 11);
    let s = m.sphere.as_ref().unwrap();
    let a = s.scale_radius;
    let err = max_mass_profile_error(&p, |r| (r * r / (r * r + a * a)).powf(1.5), s.mass);
    let q = virial_ratio(&mut p, 1.0);
    eprintln!("Plummer N={N}: max |dM(<r)|/M = {err:.5}, 2K/|W| = {q:.4}");
    assert!(err < 0.01, "enclosed mass error {err}");
    assert!((q - 1.0).abs() < 0.03, "virial ratio {q}");
}

#[test]
fn hernquist_profile_and_virial_ratio() {
    let (m, mut p) = sample("ics/hernquist.toml", N, 12);
    let s = m.sphere.as_ref().unwrap();
    let a = s.scale_radius;
    let rt = s.truncation_radius.unwrap();
    let frac = |r: f64| (r / (r + a)).powi(2);
    // Particles carry the mass inside the truncation radius; the profile inside it is the
    // untruncated model's.
    let err = max_mass_profile_error(&p, frac, s.mass);
    let total: f64 = p.mass.iter().sum();
    assert!((total / (s.mass * frac(rt)) - 1.0).abs() < 1e-9);
    let q = virial_ratio(&mut p, 1.0);
    eprintln!("Hernquist N={N}: max |dM(<r)|/M = {err:.5}, 2K/|W| = {q:.4}");
    assert!(err < 0.01, "enclosed mass error {err}");
    assert!((q - 1.0).abs() < 0.03, "virial ratio {q}");
}

#[test]
fn centred_and_reproducible_for_any_thread_count() {
    let pool = |k| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(k)
            .build()
            .unwrap()
    };
    let one = pool(1).install(|| sample("ics/hernquist.toml", 20_000, 5).1);
    let three = pool(3).install(|| sample("ics/hernquist.toml", 20_000, 5).1);
    assert!(
        one == three,
        "same seed must give the same bits for 1 and 3 threads"
    );
    let other = sample("ics/hernquist.toml", 20_000, 6).1;
    assert!(
        one.pos != other.pos,
        "a different seed must give different particles"
    );
    let c = Conserved::measure(&one);
    for k in 0..3 {
        assert!(c.com[k].abs() < 1e-12, "centre of mass {:?}", c.com);
        assert!(c.momentum[k].abs() < 1e-12, "momentum {:?}", c.momentum);
    }
    let mut ids = one.id.clone();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 20_000, "IDs must be unique");
}
