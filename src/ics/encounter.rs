//! Several galaxies in one run (mergers, flybys, satellites): the `[[ics.galaxies]]` and
//! `[ics.orbit]` keys of a run config, the two-body Keplerian orbit that places two galaxies,
//! and the transformation of each galaxy's sampled particles (mass scale, disk orientation,
//! position and velocity of its centre).
//!
//! Owns where galaxies start and how they are oriented. Sampling each galaxy is the model's
//! (`ics::generate_share`); running the encounter is the integrator's.

use super::ModelFile;
use super::sampling::{BlockMoments, Share, centre_on};
use crate::particles::Particles;
use crate::source::{ConfigError, SourceText};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Galaxy `g` (from 0) of a run numbers its particles from `g * GALAXY_ID_STRIDE + 1`, so
/// `id / GALAXY_ID_STRIDE` is the galaxy a particle came from.
pub const GALAXY_ID_STRIDE: u64 = 1_000_000_000;

/// One `[[ics.galaxies]]` entry of a run config, as written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GalaxyEntry {
    /// Model file (TOML, see `ics/`).
    pub model: PathBuf,
    /// Particle count of this galaxy.
    pub n: i64,
    /// Mass factor: masses scale by it, lengths and velocities by its cube root (same
    /// density and dynamical time, so the scaled galaxy is in equilibrium too).
    #[serde(default = "one")]
    pub mass_scale: f64,
    /// Angle between the disk's spin and the orbit's angular momentum, in degrees (0:
    /// prograde in the orbital plane, 180: retrograde).
    #[serde(default)]
    pub inclination: f64,
    /// Angle in the orbital plane from the disk's line of nodes to the pericentre direction,
    /// in degrees (Toomre & Toomre 1972's ω).
    #[serde(default)]
    pub argument_of_pericentre: f64,
    /// Position of the galaxy's centre (without `[ics.orbit]`).
    pub position: Option<[f64; 3]>,
    /// Velocity of the galaxy's centre (without `[ics.orbit]`).
    pub velocity: Option<[f64; 3]>,
}

fn one() -> f64 {
    1.0
}

/// `[ics.orbit]`: the Keplerian orbit of two galaxies' total masses.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OrbitEntry {
    /// Initial distance between the two centres.
    pub separation: f64,
    /// Pericentre distance of the point-mass orbit.
    pub pericentre: f64,
    /// Eccentricity (1: parabolic, below 1 bound, above 1 hyperbolic).
    #[serde(default = "one")]
    pub eccentricity: f64,
}

/// One galaxy of a run after validation.
#[derive(Debug, Clone)]
pub struct PlacedGalaxy {
    /// The model file.
    pub path: PathBuf,
    /// Its parsed content.
    pub model: Box<ModelFile>,
    /// Particle count.
    pub n: usize,
    /// Mass factor (`GalaxyEntry::mass_scale`).
    pub mass_scale: f64,
    /// Rotation taking the model's frame (disk in the x–y plane) to the run's.
    pub rotation: [[f64; 3]; 3],
    /// Centre's position and velocity when given (no orbit).
    pub centre: Option<([f64; 3], [f64; 3])>,
}

/// The galaxies of a run and, for two, their orbit.
#[derive(Debug, Clone)]
pub struct Encounter {
    /// In the order of the config (galaxy `g` has IDs from `g * GALAXY_ID_STRIDE + 1`).
    pub galaxies: Vec<PlacedGalaxy>,
    /// The two-body orbit that places two galaxies.
    pub orbit: Option<OrbitEntry>,
}

impl Encounter {
    /// Every galaxy's particle count together.
    pub fn particles(&self) -> usize {
        self.galaxies.iter().map(|g| g.n).sum()
    }

    /// Checks `[[ics.galaxies]]` and `[ics.orbit]` of the config `s` (models in `units`),
    /// loading every model file.
    pub fn validate(
        s: &SourceText,
        entries: &[GalaxyEntry],
        orbit: Option<OrbitEntry>,
        units: crate::units::UnitSystem,
    ) -> Result<Encounter, ConfigError> {
        let mut galaxies = Vec::with_capacity(entries.len());
        for (g, e) in entries.iter().enumerate() {
            let key = |k: &str| format!("ics.galaxies.{g}.{k}");
            let finite = |k: &str, v: f64| {
                if v.is_finite() {
                    Ok(())
                } else {
                    Err(s.invalid(&key(k), v, "must be a finite number"))
                }
            };
            if e.n < 2 || e.n as u64 >= GALAXY_ID_STRIDE {
                return Err(s.invalid(
                    &key("n"),
                    e.n,
                    format!(
                        "a galaxy's particle count must be between 2 and {}",
                        GALAXY_ID_STRIDE - 1
                    ),
                ));
            }
            if !(e.mass_scale.is_finite() && e.mass_scale > 0.0) {
                return Err(s.invalid(
                    &key("mass_scale"),
                    e.mass_scale,
                    "must be a positive number",
                ));
            }
            finite("inclination", e.inclination)?;
            finite("argument_of_pericentre", e.argument_of_pericentre)?;
            for (k, v) in [("position", e.position), ("velocity", e.velocity)] {
                if let Some(v) = v.filter(|v| v.iter().any(|x| !x.is_finite())) {
                    return Err(s.invalid(&key(k), format!("{v:?}"), "must be finite numbers"));
                }
            }
            if !e.model.is_file() {
                return Err(s.invalid(
                    &key("model"),
                    format!("{:?}", e.model.display().to_string()),
                    "no such file",
                ));
            }
            let model = ModelFile::load(&e.model)?;
            if model.units != units {
                return Err(s.invalid(
                    &key("model"),
                    format!("{:?}", e.model.display().to_string()),
                    format!(
                        "the model is in '{}' units and the run in '{}'; use the same unit system",
                        model.units.name(),
                        units.name()
                    ),
                ));
            }
            if (e.n as usize) < model.components() {
                return Err(s.invalid(
                    &key("n"),
                    e.n,
                    format!(
                        "the model has {} components; give at least one particle to each",
                        model.components()
                    ),
                ));
            }
            let centre = match (orbit, e.position, e.velocity) {
                (Some(_), None, None) => None,
                (Some(_), _, _) => {
                    return Err(s.invalid(
                        &key(if e.position.is_some() {
                            "position"
                        } else {
                            "velocity"
                        }),
                        "(given)",
                        "[ics.orbit] places the galaxies; give either the orbit or every galaxy's position and velocity",
                    ));
                }
                (None, Some(x), Some(v)) => Some((x, v)),
                (None, None, None) if entries.len() == 1 => Some(([0.0; 3], [0.0; 3])),
                (None, x, _) => {
                    return Err(s.invalid(
                        &key(if x.is_none() { "position" } else { "velocity" }),
                        "(missing)",
                        "several galaxies need [ics.orbit] (two galaxies) or each galaxy's position and velocity",
                    ));
                }
            };
            galaxies.push(PlacedGalaxy {
                path: e.model.clone(),
                model: Box::new(model),
                n: e.n as usize,
                mass_scale: e.mass_scale,
                rotation: disk_rotation(e.inclination, e.argument_of_pericentre),
                centre,
            });
        }
        if galaxies.is_empty() {
            return Err(s.invalid(
                "ics.galaxies",
                "[]",
                "list at least one galaxy ([[ics.galaxies]] with model and n)",
            ));
        }
        if let Some(o) = orbit {
            if galaxies.len() != 2 {
                return Err(s.invalid(
                    "ics.orbit",
                    format!("{} galaxies", galaxies.len()),
                    "an orbit places exactly two galaxies; give three or more their positions and velocities",
                ));
            }
            validate_orbit(s, o)?;
        }
        for (g, galaxy) in galaxies.iter().enumerate() {
            let own = softening_keys(&galaxy.model);
            let clash = galaxies[..g].iter().any(|earlier| {
                softening_keys(&earlier.model)
                    .iter()
                    .zip(&own)
                    .any(|(a, b)| matches!((a, b), (Some(a), Some(b)) if a != b))
            });
            if clash {
                return Err(s.invalid(
                    &format!("ics.galaxies.{g}.model"),
                    format!("{:?}", galaxy.path.display().to_string()),
                    "gives a component another softening length than an earlier galaxy's model does; a component's particles share one softening length in every galaxy",
                ));
            }
        }
        Ok(Encounter { galaxies, orbit })
    }

    /// Softening lengths per component (as `ModelFile::component_softening`: `None` when
    /// every particle uses `default`), from the galaxies' models, which agree (validated).
    pub fn component_softening(&self, default: f64) -> Option<[f64; 4]> {
        let mut out = [0.0; 4];
        let mut own = false;
        for (k, slot) in out.iter_mut().enumerate() {
            if let Some(e) = self
                .galaxies
                .iter()
                .find_map(|g| softening_keys(&g.model)[k])
            {
                *slot = e.unwrap_or(default);
                own |= e.is_some_and(|e| e != default);
            }
        }
        own.then_some(out)
    }

    /// Each galaxy's centre (position, velocity) for galaxies of total masses `masses`, with
    /// the centre of mass at rest at the origin.
    pub fn centres(&self, masses: &[f64], g: f64) -> Vec<([f64; 3], [f64; 3])> {
        let mut centres: Vec<([f64; 3], [f64; 3])> = match self.orbit {
            Some(o) => {
                let kepler = KeplerOrbit {
                    gm: g * (masses[0] + masses[1]),
                    pericentre: o.pericentre,
                    eccentricity: o.eccentricity,
                };
                let (x, v) = kepler.incoming_at(o.separation);
                // The first galaxy moves along -m1/M of the relative orbit, the second along
                // +m0/M of it.
                let total = masses[0] + masses[1];
                let (w0, w1) = (-masses[1] / total, masses[0] / total);
                vec![
                    (x.map(|c| w0 * c), v.map(|c| w0 * c)),
                    (x.map(|c| w1 * c), v.map(|c| w1 * c)),
                ]
            }
            None => self
                .galaxies
                .iter()
                .map(|g| g.centre.unwrap_or(([0.0; 3], [0.0; 3])))
                .collect(),
        };
        let total: f64 = masses.iter().sum();
        if total > 0.0 {
            let mean = |k: usize, velocity: bool| {
                centres
                    .iter()
                    .zip(masses)
                    .map(|(c, m)| m * if velocity { c.1[k] } else { c.0[k] })
                    .sum::<f64>()
                    / total
            };
            let (x0, v0): ([f64; 3], [f64; 3]) = (
                std::array::from_fn(|k| mean(k, false)),
                std::array::from_fn(|k| mean(k, true)),
            );
            for c in &mut centres {
                for k in 0..3 {
                    c.0[k] -= x0[k];
                    c.1[k] -= v0[k];
                }
            }
        }
        centres
    }
}

/// The particles of `share` of every galaxy of `encounter`, each as its model samples
/// them (seed `seed` for the first galaxy, derived ones for the others, so that copies of
/// one model are different samples) with the IDs of its galaxy, not yet centred or placed:
/// `assemble` does that from the `block_moments` of every share. Warnings come with them.
pub fn sample_share(
    encounter: &Encounter,
    seed: u64,
    share: Share,
) -> (Vec<Particles>, Vec<String>) {
    let mut warnings = Vec::new();
    let parts = encounter
        .galaxies
        .iter()
        .enumerate()
        .map(|(g, galaxy)| {
            let seed = seed.wrapping_add((g as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let (mut p, w) = super::generate_share(&galaxy.model, galaxy.n, seed, share);
            for id in &mut p.id {
                *id += g as u64 * GALAXY_ID_STRIDE;
            }
            warnings.extend(w.into_iter().map(|w| format!("galaxy {g}: {w}")));
            p
        })
        .collect();
    (parts, warnings)
}

/// This rank's particles of every galaxy (`parts`, from `sample_share`), each centred with
/// the block moments of every rank's share (`moments`), scaled, turned and moved to its
/// place (`Encounter::centres`), one after the other. The same bits for any number of
/// ranks, as for one model.
pub fn assemble(
    encounter: &Encounter,
    mut parts: Vec<Particles>,
    moments: &[BlockMoments],
    g: f64,
) -> Particles {
    // Each galaxy's blocks, in ID order (the order every sum runs in).
    let mut of_galaxy = vec![Vec::new(); encounter.galaxies.len()];
    for b in moments {
        if let Some(blocks) = of_galaxy.get_mut((b.first_id / GALAXY_ID_STRIDE) as usize) {
            blocks.push(*b);
        }
    }
    for blocks in &mut of_galaxy {
        blocks.sort_by_key(|b| b.first_id);
    }
    let masses: Vec<f64> = encounter
        .galaxies
        .iter()
        .zip(&of_galaxy)
        .map(|(galaxy, blocks)| galaxy.mass_scale * blocks.iter().map(|b| b.sums[0]).sum::<f64>())
        .collect();
    let centres = encounter.centres(&masses, g);
    let mut out = Particles::default();
    for (k, (p, galaxy)) in parts.iter_mut().zip(&encounter.galaxies).enumerate() {
        centre_on(p, &of_galaxy[k]);
        place(p, galaxy.mass_scale, &galaxy.rotation, centres[k]);
        out.extend(std::mem::take(p));
    }
    out
}

/// Each component's `softening` key (`Component::ALL` order): `None` for an absent
/// component, `Some(None)` for one that uses the run's length.
fn softening_keys(m: &ModelFile) -> [Option<Option<f64>>; 4] {
    [
        m.halo.as_ref().map(|h| h.softening),
        m.disk.as_ref().map(|d| d.softening),
        m.bulge.as_ref().map(|b| b.softening),
        m.sphere.as_ref().map(|_| None),
    ]
}

fn validate_orbit(s: &SourceText, o: OrbitEntry) -> Result<(), ConfigError> {
    let positive = |k: &str, v: f64| {
        if v.is_finite() && v > 0.0 {
            Ok(())
        } else {
            Err(s.invalid(&format!("ics.orbit.{k}"), v, "must be a positive number"))
        }
    };
    positive("separation", o.separation)?;
    positive("pericentre", o.pericentre)?;
    let e = o.eccentricity;
    if !(e.is_finite() && e >= 0.0) {
        return Err(s.invalid("ics.orbit.eccentricity", e, "must be a number >= 0"));
    }
    if o.separation < o.pericentre {
        return Err(s.invalid(
            "ics.orbit.separation",
            o.separation,
            format!(
                "the galaxies cannot start closer than the pericentre distance {}",
                o.pericentre
            ),
        ));
    }
    if e < 1.0 {
        let apocentre = o.pericentre * (1.0 + e) / (1.0 - e);
        if o.separation > apocentre * (1.0 + 1e-12) {
            return Err(s.invalid(
                "ics.orbit.separation",
                o.separation,
                format!(
                    "a bound orbit of eccentricity {e} and pericentre {} never goes farther than its apocentre {apocentre}",
                    o.pericentre
                ),
            ));
        }
    }
    Ok(())
}

/// The rotation taking a model's frame (disk in the x–y plane, spinning about +z) to the
/// run's, for the orbital plane x–y with the orbit's angular momentum along +z and
/// pericentre along +x: the disk is tilted by `inclination` about its line of nodes, which
/// lies in the orbital plane at `argument_of_pericentre` before the pericentre direction.
/// The spin axis ends up at `(-sin i sin ω, -sin i cos ω, cos i)`.
pub fn disk_rotation(inclination_deg: f64, argument_of_pericentre_deg: f64) -> [[f64; 3]; 3] {
    let (si, ci) = inclination_deg.to_radians().sin_cos();
    // The line of nodes at angle -ω from +x.
    let (so, co) = (-argument_of_pericentre_deg.to_radians()).sin_cos();
    // R_z(-ω) R_x(i).
    let rx = [[1.0, 0.0, 0.0], [0.0, ci, -si], [0.0, si, ci]];
    let rz = [[co, -so, 0.0], [so, co, 0.0], [0.0, 0.0, 1.0]];
    std::array::from_fn(|r| std::array::from_fn(|c| (0..3).map(|k| rz[r][k] * rx[k][c]).sum()))
}

/// Applies a galaxy's mass scale `s`, rotation and centre to its sampled particles, which
/// are centred on the origin at rest: `m → s m`, `x → R s^(1/3) x + X`, `v → R s^(1/3) v + V`.
pub fn place(
    p: &mut Particles,
    mass_scale: f64,
    rotation: &[[f64; 3]; 3],
    centre: ([f64; 3], [f64; 3]),
) {
    let stretch = mass_scale.cbrt();
    let turn = |x: [f64; 3], shift: [f64; 3]| -> [f64; 3] {
        std::array::from_fn(|r| {
            stretch * (rotation[r][0] * x[0] + rotation[r][1] * x[1] + rotation[r][2] * x[2])
                + shift[r]
        })
    };
    for x in &mut p.pos {
        *x = turn(*x, centre.0);
    }
    for v in &mut p.vel {
        *v = turn(*v, centre.1);
    }
    for m in &mut p.mass {
        *m *= mass_scale;
    }
}

/// The relative Keplerian orbit of two point masses of total `gm` (G times their mass), in
/// the x–y plane with its pericentre along +x and angular momentum along +z.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KeplerOrbit {
    /// G times the total mass.
    pub gm: f64,
    /// Pericentre distance.
    pub pericentre: f64,
    /// Eccentricity.
    pub eccentricity: f64,
}

impl KeplerOrbit {
    fn semi_latus_rectum(&self) -> f64 {
        self.pericentre * (1.0 + self.eccentricity)
    }

    /// Separation at true anomaly `f`.
    pub fn separation_at_anomaly(&self, f: f64) -> f64 {
        self.semi_latus_rectum() / (1.0 + self.eccentricity * f.cos())
    }

    /// The true anomaly (≤ 0) at which the incoming orbit reaches separation `r`.
    pub fn incoming_anomaly(&self, r: f64) -> f64 {
        let e = self.eccentricity;
        if e == 0.0 {
            return 0.0;
        }
        -((self.semi_latus_rectum() / r - 1.0) / e)
            .clamp(-1.0, 1.0)
            .acos()
    }

    /// Relative position and velocity (second body minus first) at true anomaly `f`.
    pub fn state_at_anomaly(&self, f: f64) -> ([f64; 3], [f64; 3]) {
        let (e, l) = (self.eccentricity, self.semi_latus_rectum());
        let r = self.separation_at_anomaly(f);
        let (s, c) = f.sin_cos();
        let scale = (self.gm / l).sqrt();
        let (vr, vt) = (scale * e * s, scale * (1.0 + e * c));
        ([r * c, r * s, 0.0], [vr * c - vt * s, vr * s + vt * c, 0.0])
    }

    /// Relative position and velocity where the incoming orbit is `r` apart.
    pub fn incoming_at(&self, r: f64) -> ([f64; 3], [f64; 3]) {
        self.state_at_anomaly(self.incoming_anomaly(r))
    }

    /// Time from pericentre to true anomaly `f` (negative before pericentre), for
    /// `|f|` below π (and, for a hyperbolic orbit, below its asymptote's angle).
    pub fn time_from_pericentre(&self, f: f64) -> f64 {
        let (e, q) = (self.eccentricity, self.pericentre);
        let half = (0.5 * f).tan();
        if (e - 1.0).abs() < 1e-9 {
            // Barker's equation.
            let l = self.semi_latus_rectum();
            0.5 * (l * l * l / self.gm).sqrt() * (half + half * half * half / 3.0)
        } else if e < 1.0 {
            let a = q / (1.0 - e);
            let big_e = 2.0 * (((1.0 - e) / (1.0 + e)).sqrt() * half).atan();
            (big_e - e * big_e.sin()) * (a * a * a / self.gm).sqrt()
        } else {
            let a = q / (e - 1.0);
            let big_f = 2.0 * (((e - 1.0) / (e + 1.0)).sqrt() * half).atanh();
            (e * big_f.sinh() - big_f) * (a * a * a / self.gm).sqrt()
        }
    }

    /// The separation at time `t` from pericentre (negative before it), within half an
    /// orbit of it for a bound orbit.
    pub fn separation_at_time(&self, t: f64) -> f64 {
        let e = self.eccentricity;
        // The true anomaly's range: (-π, π), or inside the asymptotes of a hyperbola.
        let limit = if e > 1.0 {
            (-1.0 / e).acos()
        } else {
            std::f64::consts::PI
        } * (1.0 - 1e-12);
        let (mut lo, mut hi) = if t < 0.0 { (-limit, 0.0) } else { (0.0, limit) };
        // The time grows with the anomaly: bisection to the last bit.
        for _ in 0..200 {
            let mid = 0.5 * (lo + hi);
            if mid == lo || mid == hi {
                break;
            }
            if self.time_from_pericentre(mid) < t {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        self.separation_at_anomaly(0.5 * (lo + hi))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kepler(e: f64) -> KeplerOrbit {
        KeplerOrbit {
            gm: 3.0,
            pericentre: 0.7,
            eccentricity: e,
        }
    }

    /// A start inside a bound orbit's apocentre.
    fn start_of(e: f64) -> f64 {
        if e < 1.0 {
            (0.95 * 0.7 * (1.0 + e) / (1.0 - e)).min(3.0)
        } else {
            3.0
        }
    }

    #[test]
    fn the_orbit_conserves_energy_and_angular_momentum_and_starts_where_asked() {
        for e in [0.0, 0.4, 1.0, 1.7] {
            let k = kepler(e);
            let start = if e == 0.0 { 0.7 } else { start_of(e) };
            let (x, v) = k.incoming_at(start);
            let r = (x[0] * x[0] + x[1] * x[1]).sqrt();
            assert!((r - start).abs() < 1e-12, "e {e}: {r}");
            // Approaching: r·v < 0 (or circular).
            assert!(x[0] * v[0] + x[1] * v[1] <= 1e-12, "e {e}");
            let energy = 0.5 * (v[0] * v[0] + v[1] * v[1]) - k.gm / r;
            let expected = -k.gm * (1.0 - e) / (2.0 * k.pericentre);
            assert!(
                (energy - expected).abs() < 1e-12 * k.gm,
                "e {e}: {energy} vs {expected}"
            );
            let lz = x[0] * v[1] - x[1] * v[0];
            let expected = (k.gm * k.pericentre * (1.0 + e)).sqrt();
            assert!((lz - expected).abs() < 1e-12 * expected, "e {e}: {lz}");
        }
    }

    #[test]
    fn the_time_to_pericentre_matches_a_numerical_integration() {
        for e in [0.5, 1.0, 1.5] {
            let k = kepler(e);
            let start = start_of(e);
            let (mut x, mut v) = k.incoming_at(start);
            let f0 = k.incoming_anomaly(start);
            let t_peri = -k.time_from_pericentre(f0);
            // Leapfrog of the relative orbit with tiny steps, to the pericentre's time.
            let steps = 200_000;
            let dt = t_peri / steps as f64;
            let acc = |x: [f64; 3]| {
                let r3 = (x[0] * x[0] + x[1] * x[1]).powf(1.5);
                [-k.gm * x[0] / r3, -k.gm * x[1] / r3, 0.0]
            };
            for _ in 0..steps {
                let a = acc(x);
                for i in 0..3 {
                    v[i] += 0.5 * dt * a[i];
                    x[i] += dt * v[i];
                }
                let a = acc(x);
                for i in 0..3 {
                    v[i] += 0.5 * dt * a[i];
                }
            }
            let r = (x[0] * x[0] + x[1] * x[1]).sqrt();
            assert!(
                (r - 0.7).abs() < 1e-6,
                "e {e}: {r} at the pericentre's time"
            );
            let half = k.separation_at_time(-0.5 * t_peri);
            assert!(half > 0.7 && half < start, "e {e}: {half}");
            assert!(
                (k.separation_at_time(-t_peri) - start).abs() < 1e-9,
                "e {e}"
            );
        }
    }

    #[test]
    fn the_disk_rotation_is_proper_and_puts_the_spin_where_documented() {
        for (i, w) in [(0.0, 0.0), (60.0, 30.0), (180.0, 0.0), (-71.0, 30.0)] {
            let r = disk_rotation(i, w);
            let spin = [r[0][2], r[1][2], r[2][2]];
            let (si, ci) = f64::to_radians(i).sin_cos();
            let (so, co) = f64::to_radians(w).sin_cos();
            let expected = [-si * so, -si * co, ci];
            for k in 0..3 {
                assert!((spin[k] - expected[k]).abs() < 1e-15, "{i} {w}: {spin:?}");
            }
            let det = r[0][0] * (r[1][1] * r[2][2] - r[1][2] * r[2][1])
                - r[0][1] * (r[1][0] * r[2][2] - r[1][2] * r[2][0])
                + r[0][2] * (r[1][0] * r[2][1] - r[1][1] * r[2][0]);
            assert!((det - 1.0).abs() < 1e-15);
        }
    }
}
