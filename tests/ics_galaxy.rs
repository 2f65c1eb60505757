//! Galaxy initial conditions: sampled profiles against the model, disk kinematics (Toomre Q,
//! rotation curve from the particles' own forces), virial equilibrium, reproducibility.

mod common;

use common::repo;
use leapfmm::analysis::profiles::annulus;
use leapfmm::fmm::caps::CapsPolicy;
use leapfmm::fmm::p2p::NearFieldPrecision;
use leapfmm::fmm::{FmmSettings, FmmSolver};
use leapfmm::gravity::{GravitySolver, Softening, SofteningKernel};
use leapfmm::ics::galaxy::Galaxy;
use leapfmm::ics::{self, ModelFile};
use leapfmm::integrate::diagnostics::Conserved;
use leapfmm::particles::{Component, Particles};

fn model(name: &str) -> ModelFile {
    ModelFile::load(&repo(name)).unwrap()
}

fn forces(p: &mut Particles, g: f64, eps: f64) {
    let mut solver = FmmSolver::new(
        FmmSettings {
            order: 8,
            theta: 0.6,
            accuracy: 0.0,
            leaf_size: 64,
            softening: Softening {
                kernel: SofteningKernel::Spline,
                epsilon: eps,
            },
            g,
            near_field: NearFieldPrecision::Mixed,
            caps_policy: CapsPolicy::default(),
        },
        None,
    );
    solver.compute(p).unwrap();
}

/// Largest |M_sampled(<x) − M_model(<x)| / M over the particles of one component, x being the
/// spherical (or, for the disk, cylindrical) radius.
fn profile_error(
    p: &Particles,
    component: Component,
    cylindrical: bool,
    model_fraction: impl Fn(f64) -> f64,
) -> (usize, f64) {
    let mut x: Vec<f64> = (0..p.len())
        .filter(|&i| p.component[i] == component)
        .map(|i| {
            let q = p.pos[i];
            if cylindrical {
                (q[0] * q[0] + q[1] * q[1]).sqrt()
            } else {
                (q[0] * q[0] + q[1] * q[1] + q[2] * q[2]).sqrt()
            }
        })
        .collect();
    x.sort_by(f64::total_cmp);
    let n = x.len() as f64;
    let err = x
        .iter()
        .enumerate()
        .map(|(k, &r)| {
            let f = model_fraction(r);
            (k as f64 / n - f).abs().max(((k + 1) as f64 / n - f).abs())
        })
        .fold(0.0, f64::max);
    (x.len(), err)
}

#[test]
fn sampled_profiles_match_the_model() {
    // 2e6 particles: 1.6e6 halo, 3e5 disk, 1e5 bulge.
    let m = model("ics/milky_way.toml");
    let galaxy = Galaxy::new(&m);
    assert!(galaxy.warnings.is_empty(), "{:?}", galaxy.warnings);
    let p = galaxy.generate(2_000_000, 3, leapfmm::ics::Share::WHOLE);
    let grid = &galaxy.potential.grid;
    for (c, comp) in [
        (Component::Halo, galaxy.halo.as_ref().unwrap()),
        (Component::Bulge, galaxy.bulge.as_ref().unwrap()),
    ] {
        let total = comp.table.total_mass();
        let (n, err) = profile_error(&p, c, false, |r| grid.interp(&comp.table.mass, r) / total);
        eprintln!("{c:?}: {n} particles, max |dM(<r)|/M = {err:.4}");
        assert!(n >= 100_000 && err < 0.01, "{c:?}: {err}");
    }
    let disk = &galaxy.disk.as_ref().unwrap().profile;
    let (n, err) = profile_error(&p, Component::Disk, true, |r| disk.mass_fraction(r));
    eprintln!("disk: {n} particles, max |dM(<R)|/M = {err:.4}");
    assert!(n >= 100_000 && err < 0.01, "disk: {err}");
    // sech² scale height from the median |z| over the whole disk.
    let a = annulus(&p, Component::Disk, 0.0, 1e9);
    eprintln!("disk scale height {:.4} vs {}", a.scale_height, disk.z0);
    assert!((a.scale_height / disk.z0 - 1.0).abs() < 0.03);
}

#[test]
fn disk_kinematics_rotation_curve_and_virial_ratio() {
    let m = model("ics/milky_way.toml");
    let galaxy = Galaxy::new(&m);
    let (mut p, _) = ics::generate(&m, 1_000_000, 5);
    let d = galaxy.disk.as_ref().unwrap();
    let rd = d.profile.rd;
    let g = galaxy.g;
    // Toomre Q measured in annuli against the tabulated profile, 1–3 R_d.
    for k in 0..8 {
        let (r0, r1) = (rd * (1.0 + 0.25 * k as f64), rd * (1.25 + 0.25 * k as f64));
        let a = annulus(&p, Component::Disk, r0, r1);
        let r = 0.5 * (r0 + r1);
        let q = a.sigma_r * d.kinematics.kappa2(r).sqrt() / (3.36 * g * a.surface_density);
        let want = d.kinematics.toomre_q(r);
        eprintln!(
            "R = {r:.2}: Q {q:.3} requested {want:.3} ({} particles)",
            a.count
        );
        assert!((q / want - 1.0).abs() < 0.10, "Q at R = {r}: {q} vs {want}");
    }
    // Rotation curve from the particles' own forces vs the model's, at the same positions.
    forces(&mut p, g, 0.02);
    for k in 0..10 {
        let (r0, r1) = (rd * (0.5 + 0.45 * k as f64), rd * (0.95 + 0.45 * k as f64));
        let (mut got, mut want, mut n) = (0.0, 0.0, 0);
        for i in 0..p.len() {
            if p.component[i] != Component::Disk {
                continue;
            }
            let x = p.pos[i];
            let r = (x[0] * x[0] + x[1] * x[1]).sqrt();
            if r < r0 || r >= r1 {
                continue;
            }
            let a_r = (p.acc[i][0] * x[0] + p.acc[i][1] * x[1]) / r;
            got += -a_r * r;
            want += r * galaxy.potential.evaluate(r, x[2]).1[0];
            n += 1;
        }
        let ratio = (got / want).sqrt();
        eprintln!(
            "R {:.2}-{:.2}: v_c particles/model = {ratio:.4} ({n} particles)",
            r0, r1
        );
        assert!(
            (ratio - 1.0).abs() < 0.02,
            "v_c ratio {ratio} at R = {r0}-{r1}"
        );
    }
    let c = Conserved::measure(&p);
    let q = c.virial_ratio();
    eprintln!("2K/|W| = {q:.4}, COM {:?}, P {:?}", c.com, c.momentum);
    assert!((q - 1.0).abs() < 0.05, "virial ratio {q}");
    let total: f64 = p.mass.iter().sum();
    let scale = (2.0 * c.kinetic * total).sqrt();
    for k in 0..3 {
        assert!(c.com[k].abs() < 1e-9, "COM {:?}", c.com);
        assert!(
            c.momentum[k].abs() < 1e-12 * scale,
            "momentum {:?}",
            c.momentum
        );
    }
}

#[test]
fn same_bits_for_one_and_two_threads() {
    let m = model("ics/small_disk.toml");
    let sample = |threads: usize| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
            .install(|| ics::generate(&m, 30_000, 9).0)
    };
    assert!(sample(1) == sample(2));
}

#[test]
fn ranks_generating_their_own_shares_give_the_same_bits() {
    use leapfmm::ics::Share;
    use leapfmm::ics::sampling::{block_moments, centre_on};
    let m = model("ics/milky_way.toml");
    let n = 50_000;
    let by_id = |p: &leapfmm::particles::Particles| {
        let mut v: Vec<_> = (0..p.len())
            .map(|i| (p.id[i], p.pos[i], p.vel[i], p.mass[i], p.component[i]))
            .collect();
        v.sort_by_key(|x| x.0);
        v
    };
    let whole = by_id(&ics::generate(&m, n, 4).0);
    for ranks in [2, 3, 7] {
        // Each rank samples its share; the block sums of all shares centre every one.
        let shares: Vec<_> = (0..ranks)
            .map(|rank| ics::generate_share(&m, n, 4, Share { rank, ranks }).0)
            .collect();
        let moments: Vec<_> = shares.iter().flat_map(block_moments).collect();
        let mut joined = leapfmm::particles::Particles::default();
        for mut s in shares {
            centre_on(&mut s, &moments);
            joined.extend(s);
        }
        assert!(by_id(&joined) == whole, "{ranks} ranks differ from one");
    }
}
