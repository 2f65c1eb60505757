//! Several galaxies in one run (issue 40): two small disks on a parabolic orbit follow the
//! two-body Keplerian orbit of their masses until their halos touch, conserve energy as one
//! galaxy does, start with zero momentum at the origin, carry their galaxy in their IDs,
//! give the same bits on any number of ranks; bad `[[ics.galaxies]]` / `[ics.orbit]` keys
//! are refused with one line.

mod common;

use common::*;
use leapfmm::analysis::galaxies::galaxy_of;
use leapfmm::analysis::report::find_snapshots;
use leapfmm::ics::encounter::KeplerOrbit;
use leapfmm::io::snapshot::read_snapshot;
use leapfmm::particles::{Component, Particles};
use std::path::Path;

/// Particles per galaxy.
const N: usize = 4000;
/// The orbit: start 60 kpc apart, pericentre 4 kpc, parabolic.
const SEPARATION: f64 = 60.0;
const PERICENTRE: f64 = 4.0;
/// The small disk's halo is cut at 20 kpc: until the centres are 40 kpc apart no particle
/// of one galaxy lies inside the other's sphere of that radius (the exponential taper
/// beyond it holds ~1 % of a halo's mass).
const TOUCH: f64 = 40.0;

fn config(name: &str, galaxies: &str, extra_ics: &str, t_end: f64) -> String {
    seeded_config(name, galaxies, extra_ics, t_end, 5)
}

fn seeded_config(name: &str, galaxies: &str, extra_ics: &str, t_end: f64, seed: u64) -> String {
    format!(
        r#"name = "{name}"
output_dir = "runs"
seed = {seed}
units = "galactic"
{galaxies}
{extra_ics}
[gravity]
softening = 0.1
[integrator]
t_end = {t_end}
dt_max = 0.00125
fixed_step = true
[output]
snapshot_interval = 0.025
snapshot_precision = "double"
"#
    )
}

fn two_disks() -> String {
    let model = repo("ics/small_disk.toml").display().to_string();
    format!(
        r#"[[ics.galaxies]]
model = "{model}"
n = {N}
[[ics.galaxies]]
model = "{model}"
n = {N}
inclination = 60.0
argument_of_pericentre = 30.0
"#
    )
}

fn orbit() -> String {
    format!("[ics.orbit]\nseparation = {SEPARATION}\npericentre = {PERICENTRE}\n")
}

fn run(dir: &Path, name: &str, text: &str, extra: &[&str]) {
    run_config(dir, name, text, extra);
}

fn snapshots(run_dir: &Path) -> Vec<(f64, Particles)> {
    let _hdf5 = hdf5_lock();
    find_snapshots(run_dir)
        .unwrap()
        .iter()
        .map(|f| {
            let s = read_snapshot(f).unwrap();
            (s.time, s.particles)
        })
        .collect()
}

/// Mass and centre of mass of galaxy `g`'s particles.
fn centre_of_mass(p: &Particles, g: usize) -> (f64, [f64; 3], [f64; 3]) {
    let (mut m, mut x, mut v) = (0.0, [0.0; 3], [0.0; 3]);
    for i in (0..p.len()).filter(|&i| galaxy_of(p.id[i]) == g) {
        m += p.mass[i];
        for k in 0..3 {
            x[k] += p.mass[i] * p.pos[i][k];
            v[k] += p.mass[i] * p.vel[i][k];
        }
    }
    (m, x.map(|c| c / m), v.map(|c| c / m))
}

fn distance(a: [f64; 3], b: [f64; 3]) -> f64 {
    (0..3).map(|k| (a[k] - b[k]).powi(2)).sum::<f64>().sqrt()
}

fn max_energy_error(run_dir: &Path) -> f64 {
    Diagnostics::read(&run_dir.join("diagnostics.csv"))
        .column("rel_energy_error")
        .iter()
        .fold(0.0, |a, e| a.max(e.abs()))
}

#[test]
fn two_disks_follow_the_two_body_orbit_until_their_halos_touch() {
    let dir = tempfile::tempdir().unwrap();
    // Past the pericentre (0.35 for these masses).
    let t_end = 0.5;
    run(
        dir.path(),
        "pair",
        &config("pair", &two_disks(), &orbit(), t_end),
        &[],
    );
    let snaps = snapshots(&dir.path().join("runs/pair"));
    let (_, first) = &snaps[0];

    // IDs unique and tagged with their galaxy; N particles each.
    let mut ids = first.id.clone();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 2 * N);
    for g in 0..2 {
        assert_eq!(first.id.iter().filter(|&&id| galaxy_of(id) == g).count(), N);
    }
    // The system's centre of mass at rest at the origin; the galaxies 60 kpc apart.
    let (m0, x0, v0) = centre_of_mass(first, 0);
    let (m1, x1, v1) = centre_of_mass(first, 1);
    assert!(
        (m0 - m1).abs() < 1e-12 * m0,
        "copies of one model: {m0} {m1}"
    );
    for k in 0..3 {
        assert!(
            (m0 * x0[k] + m1 * x1[k]).abs() < 1e-9 * m0,
            "centre {x0:?} {x1:?}"
        );
        assert!(
            (m0 * v0[k] + m1 * v1[k]).abs() < 1e-9 * m0,
            "momentum {v0:?} {v1:?}"
        );
    }
    assert!((distance(x0, x1) - SEPARATION).abs() < 1e-9);
    // The second disk's spin along (-sin i sin ω, -sin i cos ω, cos i), i = 60°, ω = 30°.
    let mut spin = [0.0; 3];
    for i in (0..first.len())
        .filter(|&i| galaxy_of(first.id[i]) == 1 && first.component[i] == Component::Disk)
    {
        let (x, v) = (
            [0, 1, 2].map(|k| first.pos[i][k] - x1[k]),
            [0, 1, 2].map(|k| first.vel[i][k] - v1[k]),
        );
        spin[0] += x[1] * v[2] - x[2] * v[1];
        spin[1] += x[2] * v[0] - x[0] * v[2];
        spin[2] += x[0] * v[1] - x[1] * v[0];
    }
    let norm = spin.iter().map(|s| s * s).sum::<f64>().sqrt();
    let (si, ci) = 60f64.to_radians().sin_cos();
    let (so, co) = 30f64.to_radians().sin_cos();
    let expected = [-si * so, -si * co, ci];
    let cos_angle: f64 = (0..3).map(|k| spin[k] / norm * expected[k]).sum();
    assert!(
        cos_angle > 0.999,
        "disk spin {spin:?}, expected along {expected:?}"
    );

    // The two-body orbit of the two masses, started where the run starts.
    let kepler = KeplerOrbit {
        gm: 43_009.17 * (m0 + m1),
        pericentre: PERICENTRE,
        eccentricity: 1.0,
    };
    let start = kepler.time_from_pericentre(kepler.incoming_anomaly(SEPARATION));
    // Until the halos touch, each galaxy's centre of mass moves under the other's pull as
    // two point masses would (shell theorem), up to the disks' quadrupoles (a relative
    // force of ~3 (M_disk/M) (R_d/d)^2 ≈ 8e-4 at d = 40) and the tapered halo tails
    // (~1 % of the mass, most of it still outside the other's reach). A relative force
    // error δ displaces the orbit by about δ times the distance fallen, so
    // |r - r_kepler| ≤ 2e-3 (60 - r).
    let mut compared = 0;
    for (t, p) in &snaps {
        let r_kepler = kepler.separation_at_time(start + t);
        if r_kepler < TOUCH {
            break;
        }
        let r = distance(centre_of_mass(p, 0).1, centre_of_mass(p, 1).1);
        let bound = 2e-3 * (SEPARATION - r_kepler) + 1e-6;
        assert!(
            (r - r_kepler).abs() <= bound,
            "t = {t}: centres {r} apart, the two-body orbit {r_kepler} (bound {bound})"
        );
        compared += 1;
    }
    assert!(
        compared >= 6,
        "only {compared} snapshots before the halos touch"
    );
    // Past the pericentre: they came within a few pericentre distances.
    let closest = snaps
        .iter()
        .map(|(_, p)| distance(centre_of_mass(p, 0).1, centre_of_mass(p, 1).1))
        .fold(f64::INFINITY, f64::min);
    assert!(closest < 3.0 * PERICENTRE, "closest approach {closest}");

    // Energy: the pair through its pericentre against one of the galaxies alone, same
    // steps. Both errors are the leapfrog's truncation error, set by a few close passes, so
    // round-off moves them: one galaxy alone gave 1.0–2.4e-3 over seeds 5–8 and the pair
    // 0.9–2.4x the galaxy of its own seed (the near field's `1/sqrt` estimate alone moved
    // seed 5's galaxy from 2.0e-3 to 1.6e-3). So the pair is held to twice the largest of
    // three seeds' galaxies (1.6x at seed 5 with either estimate).
    let model = repo("ics/small_disk.toml").display().to_string();
    let alone = format!("[[ics.galaxies]]\nmodel = \"{model}\"\nn = {N}\n");
    let mut single: f64 = 0.0;
    for seed in [5, 6, 7] {
        let name = format!("alone{seed}");
        let text = seeded_config(&name, &alone, "", t_end, seed);
        run(dir.path(), &name, &text, &[]);
        single = single.max(max_energy_error(&dir.path().join("runs").join(&name)));
    }
    let pair = max_energy_error(&dir.path().join("runs/pair"));
    assert!(
        pair <= 2.0 * single,
        "max |ΔE/E| {pair:.2e} for the pair against {single:.2e} for one galaxy (3 seeds)"
    );
}

/// Sorted by ID: (id, position, velocity, mass) bits.
fn bits(p: &Particles) -> Vec<(u64, [u64; 3], [u64; 3], u64)> {
    let mut out: Vec<_> = (0..p.len())
        .map(|i| {
            (
                p.id[i],
                p.pos[i].map(f64::to_bits),
                p.vel[i].map(f64::to_bits),
                p.mass[i].to_bits(),
            )
        })
        .collect();
    out.sort_unstable_by_key(|b| b.0);
    out
}

#[test]
fn any_number_of_ranks_starts_from_the_same_bits() {
    let dir = tempfile::tempdir().unwrap();
    let text = |name: &str| config(name, &two_disks(), &orbit(), 0.025);
    run(dir.path(), "one", &text("one"), &[]);
    run(dir.path(), "three", &text("three"), &["--ranks", "3"]);
    let (one, three) = (
        snapshots(&dir.path().join("runs/one")),
        snapshots(&dir.path().join("runs/three")),
    );
    assert_eq!(bits(&one[0].1), bits(&three[0].1), "initial conditions");
    assert_eq!(one.len(), three.len());
}

/// Runs a config with `galaxies` and `extra_ics` and asserts a one-line error naming each
/// of `needles`.
fn assert_refused(dir: &Path, galaxies: &str, extra_ics: &str, needles: &[&str]) {
    let cfg = write(dir, "bad.toml", &config("bad", galaxies, extra_ics, 0.025));
    let out = run_in(dir, &["run", cfg.to_str().unwrap(), "--quiet"]);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "accepted: {galaxies} {extra_ics}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(!err.contains("panicked"), "{err}");
    for n in ["bad.toml"].iter().chain(needles) {
        assert!(err.contains(n), "should name {n:?}: {err}");
    }
    assert!(
        !dir.join("runs/bad").exists(),
        "a run folder was made for {err}"
    );
}

#[test]
fn bad_galaxy_and_orbit_keys_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let model = repo("ics/small_disk.toml").display().to_string();
    let two = two_disks();
    let orbit_with = |key: &str, value: &str| {
        orbit().replace(&format!("{key} = "), &format!("{key} = {value} # "))
    };
    assert_refused(
        d,
        &two,
        &orbit_with("separation", "3.0"),
        &["ics.orbit.separation", "pericentre distance"],
    );
    assert_refused(
        d,
        &two,
        &orbit_with("pericentre", "-1.0"),
        &["ics.orbit.pericentre", "-1", "positive"],
    );
    assert_refused(
        d,
        &two,
        &format!(
            "{}eccentricity = 0.5\n",
            orbit().replace("separation = 60", "separation = 600")
        ),
        &["ics.orbit.separation", "apocentre"],
    );
    assert_refused(d, &two, "", &["ics.galaxies.0.position", "(missing)"]);
    let three = format!("{two}[[ics.galaxies]]\nmodel = \"{model}\"\nn = 100\n");
    assert_refused(d, &three, &orbit(), &["ics.orbit", "exactly two"]);
    assert_refused(
        d,
        &two.replacen(&format!("n = {N}"), "n = 1", 1),
        &orbit(),
        &["ics.galaxies.0.n", "= 1"],
    );
    assert_refused(
        d,
        &two.replacen(
            "inclination = 60.0",
            "inclination = 60.0\nmass_scale = 0.0",
            1,
        ),
        &orbit(),
        &["ics.galaxies.1.mass_scale", "positive"],
    );
    assert_refused(
        d,
        &two.replacen(&model, "no/such.toml", 1),
        &orbit(),
        &["ics.galaxies.0.model", "no/such.toml", "no such file"],
    );
    assert_refused(
        d,
        &two.replacen("inclination = 60.0", "inclinaton = 60.0", 1),
        &orbit(),
        &["inclinaton"],
    );
    assert_refused(
        d,
        &format!("[ics]\nmodel = \"{model}\"\nn = 100\n{two}"),
        &orbit(),
        &["ics.model", "not both"],
    );
    let positioned = format!("{two}position = [1.0, 0.0, 0.0]\nvelocity = [0.0, 0.0, 0.0]\n");
    assert_refused(
        d,
        &positioned,
        &orbit(),
        &["ics.galaxies.1.position", "[ics.orbit] places"],
    );
}

#[test]
fn a_campaign_sweeps_the_orbit_and_each_galaxy_and_its_model() {
    let dir = tempfile::tempdir().unwrap();
    let shipped = std::fs::read_to_string(repo("configs/campaigns/merger_sweep.toml")).unwrap();
    let model = repo("ics/small_disk.toml").display().to_string();
    let text = shipped
        .replace("ics/small_disk.toml", &model)
        .replace(
            "output_dir = \"runs\"",
            &format!("output_dir = \"{}\"", dir.path().display()),
        )
        .replace(
            "[sweep]",
            "[sweep]\n\"ics.galaxies.1.disk.toomre_q\" = [1.5]",
        );
    let path = write(dir.path(), "sweep.toml", &text);
    let campaign = leapfmm::campaign::Campaign::load(&path).unwrap();
    assert_eq!(campaign.runs.len(), 9);
    // Named from the values, keys in alphabetical order (the galaxy's model key first).
    let names: Vec<&str> = campaign.runs.iter().map(|r| r.name.as_str()).collect();
    assert!(
        names.contains(&"toomre_q=1.5_inclination=60.0_pericentre=4.0"),
        "{names:?}"
    );
    for run in &campaign.runs {
        let spec = run.spec.as_ref().unwrap();
        let leapfmm::config::IcSource::Galaxies(encounter) = &spec.ics else {
            panic!("{}: not a run of galaxies", run.name);
        };
        let value = |key: &str| {
            run.params
                .iter()
                .find(|(k, _)| k == key)
                .and_then(|(_, v)| v.as_float())
                .unwrap()
        };
        let orbit = encounter.orbit.unwrap();
        assert_eq!(orbit.pericentre, value("ics.orbit.pericentre"));
        assert_eq!(orbit.separation, 60.0, "unswept keys keep the base's");
        // The second disk's spin: cos i in the rotation's last column.
        let i = value("ics.galaxies.1.inclination").to_radians();
        assert!((encounter.galaxies[1].rotation[2][2] - i.cos()).abs() < 1e-15);
        assert_eq!(encounter.galaxies[0].rotation[2][2], 1.0);
        // The model key went to the second galaxy's model only.
        let q = |g: usize| encounter.galaxies[g].model.disk.as_ref().unwrap().toomre_q;
        assert_eq!((q(0), q(1)), (2.0, 1.5), "{}", run.name);
    }
}
