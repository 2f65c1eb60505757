//! Rigid external potentials (`[[gravity.external]]`): NFW, Hernquist, Plummer,
//! Miyamoto–Nagai and logarithmic potentials, any sum of them, each centred on a point at
//! rest, moving at a constant velocity or along a path read from a file. Their acceleration
//! is added to every particle's after the self-gravity, and their potential energy
//! Σ m Φ_ext to the run's total energy.
//!
//! Owns the analytic potentials and their config entries. The run adds them to the forces
//! (`simulation`); the model files' rigid halos are turned into entries here too
//! (`ExternalEntry::of_halo`).

use crate::source::{ConfigError, SourceText};
use serde::{Deserialize, Serialize};

/// The analytic form of one term.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExternalProfile {
    /// Φ = −G M ln(1 + r/r_s) / r, with M = 4π ρ_s r_s³ (`mass`, `scale_radius`).
    Nfw,
    /// Φ = −G M / (r + a) (`mass`, `scale_radius`).
    Hernquist,
    /// Φ = −G M / √(r² + a²) (`mass`, `scale_radius`).
    Plummer,
    /// Φ = −G M / √(R² + (a + √(z² + b²))²) (`mass`, `scale_radius` a, `scale_height` b).
    MiyamotoNagai,
    /// Φ = ½ v0² ln(r_c² + R² + z²/q²) (`circular_velocity` v0, `core_radius` r_c,
    /// `flattening` q).
    Logarithmic,
}

/// One `[[gravity.external]]` entry, as written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExternalEntry {
    /// The analytic form.
    pub profile: ExternalProfile,
    /// Mass (NFW: the scale mass 4π ρ_s r_s³).
    pub mass: Option<f64>,
    /// Scale radius (Miyamoto–Nagai: the radial scale a).
    pub scale_radius: Option<f64>,
    /// Miyamoto–Nagai: the vertical scale b.
    pub scale_height: Option<f64>,
    /// Logarithmic: the asymptotic circular velocity v0.
    pub circular_velocity: Option<f64>,
    /// Logarithmic: the core radius r_c.
    pub core_radius: Option<f64>,
    /// Logarithmic: the potential's axis ratio q (1: spherical).
    pub flattening: Option<f64>,
    /// Where the centre is at t = 0.
    #[serde(default)]
    pub centre: [f64; 3],
    /// The centre's velocity (it moves along a straight line).
    #[serde(default)]
    pub centre_velocity: [f64; 3],
    /// A CSV file of the centre's path instead (`time,x,y,z` rows, time increasing,
    /// linearly interpolated), covering the run from t = 0 to its end.
    pub centre_orbit: Option<std::path::PathBuf>,
}

/// Values per term in `ExternalPotential::device_terms` (kernels/external.cu's
/// `EXTERNAL_TERM`).
pub const EXTERNAL_TERM: usize = 7;

/// One term of the external potential, validated.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Form {
    Nfw { gm: f64, rs: f64 },
    Hernquist { gm: f64, a: f64 },
    Plummer { gm: f64, a: f64 },
    MiyamotoNagai { gm: f64, a: f64, b: f64 },
    Logarithmic { v02: f64, rc2: f64, q2: f64 },
}

/// Where a term's centre is at time t.
#[derive(Debug, Clone, PartialEq)]
enum Motion {
    /// `centre + velocity t`.
    Line {
        centre: [f64; 3],
        velocity: [f64; 3],
    },
    /// Linear interpolation between `(time, position)` points, time increasing.
    Path(Vec<(f64, [f64; 3])>),
}

impl Motion {
    fn centre_at(&self, t: f64) -> [f64; 3] {
        match self {
            Motion::Line { centre, velocity } => {
                std::array::from_fn(|k| centre[k] + velocity[k] * t)
            }
            Motion::Path(points) => {
                // The segment holding t (the ends extend the first and last segments).
                let next = points
                    .partition_point(|p| p.0 <= t)
                    .clamp(1, points.len() - 1);
                let ((t0, a), (t1, b)) = (points[next - 1], points[next]);
                let w = (t - t0) / (t1 - t0);
                std::array::from_fn(|k| a[k] + (b[k] - a[k]) * w)
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
struct Term {
    form: Form,
    motion: Motion,
}

/// The sum of a run's external potentials (G included).
#[derive(Debug, Clone, PartialEq)]
pub struct ExternalPotential {
    terms: Vec<Term>,
}

impl ExternalPotential {
    /// The potential of `entries` (validated against the config `s`, whose keys are
    /// `gravity.external.K.…`) for gravitational constant `g`, for a run to time `run_end`
    /// (which a centre's path must reach).
    pub fn new(
        s: &SourceText,
        entries: &[ExternalEntry],
        g: f64,
        run_end: f64,
    ) -> Result<ExternalPotential, ConfigError> {
        let mut terms = Vec::with_capacity(entries.len());
        for (k, e) in entries.iter().enumerate() {
            let key = |name: &str| format!("gravity.external.{k}.{name}");
            let required = |name: &str, v: Option<f64>| -> Result<f64, ConfigError> {
                match v {
                    Some(v) if v.is_finite() && v > 0.0 => Ok(v),
                    Some(v) => Err(s.invalid(&key(name), v, "must be a positive number")),
                    None => Err(s.invalid(
                        &key(name),
                        "(missing)",
                        format!("a {:?} potential needs it", e.profile).to_lowercase(),
                    )),
                }
            };
            let unused = |names: &[(&str, Option<f64>)]| -> Result<(), ConfigError> {
                match names.iter().find(|(_, v)| v.is_some()) {
                    Some((name, v)) => Err(s.invalid(
                        &key(name),
                        v.unwrap_or_default(),
                        format!("a {:?} potential does not take it", e.profile).to_lowercase(),
                    )),
                    None => Ok(()),
                }
            };
            let log_keys = [
                ("circular_velocity", e.circular_velocity),
                ("core_radius", e.core_radius),
                ("flattening", e.flattening),
            ];
            let form = match e.profile {
                ExternalProfile::Nfw | ExternalProfile::Hernquist | ExternalProfile::Plummer => {
                    unused(&log_keys)?;
                    unused(&[("scale_height", e.scale_height)])?;
                    let gm = g * required("mass", e.mass)?;
                    let a = required("scale_radius", e.scale_radius)?;
                    match e.profile {
                        ExternalProfile::Nfw => Form::Nfw { gm, rs: a },
                        ExternalProfile::Hernquist => Form::Hernquist { gm, a },
                        _ => Form::Plummer { gm, a },
                    }
                }
                ExternalProfile::MiyamotoNagai => {
                    unused(&log_keys)?;
                    Form::MiyamotoNagai {
                        gm: g * required("mass", e.mass)?,
                        a: required("scale_radius", e.scale_radius)?,
                        b: required("scale_height", e.scale_height)?,
                    }
                }
                ExternalProfile::Logarithmic => {
                    unused(&[
                        ("mass", e.mass),
                        ("scale_radius", e.scale_radius),
                        ("scale_height", e.scale_height),
                    ])?;
                    let v0 = required("circular_velocity", e.circular_velocity)?;
                    let rc = required("core_radius", e.core_radius)?;
                    let q = required("flattening", e.flattening.or(Some(1.0)))?;
                    Form::Logarithmic {
                        v02: v0 * v0,
                        rc2: rc * rc,
                        q2: q * q,
                    }
                }
            };
            for (name, v) in [("centre", e.centre), ("centre_velocity", e.centre_velocity)] {
                if v.iter().any(|x| !x.is_finite()) {
                    return Err(s.invalid(&key(name), format!("{v:?}"), "must be finite numbers"));
                }
            }
            let motion = match &e.centre_orbit {
                None => Motion::Line {
                    centre: e.centre,
                    velocity: e.centre_velocity,
                },
                Some(_) if e.centre != [0.0; 3] || e.centre_velocity != [0.0; 3] => {
                    return Err(s.invalid(
                        &key("centre_orbit"),
                        "(given)",
                        "the path gives the centre at every time; drop centre and centre_velocity",
                    ));
                }
                Some(path) => {
                    let points = read_orbit(path).map_err(|why| {
                        s.invalid(
                            &key("centre_orbit"),
                            format!("{:?}", path.display().to_string()),
                            why,
                        )
                    })?;
                    let (first, last) = (points[0].0, points[points.len() - 1].0);
                    if first > 0.0 || last < run_end {
                        return Err(s.invalid(
                            &key("centre_orbit"),
                            format!("{:?}", path.display().to_string()),
                            format!(
                                "its times run from {first} to {last}; the run needs its centre from 0 to {run_end}"
                            ),
                        ));
                    }
                    Motion::Path(points)
                }
            };
            terms.push(Term { form, motion });
        }
        Ok(ExternalPotential { terms })
    }

    /// The terms at time `t` as `kernels/external.cu` reads them: `EXTERNAL_TERM` values
    /// each (form, three parameters, the centre then).
    pub fn device_terms(&self, t: f64) -> Vec<f64> {
        let mut out = Vec::with_capacity(EXTERNAL_TERM * self.terms.len());
        for (term, centre) in self.terms.iter().zip(self.centres(t)) {
            let (form, p) = match term.form {
                Form::Nfw { gm, rs } => (0.0, [gm, rs, 0.0]),
                Form::Hernquist { gm, a } => (1.0, [gm, a, 0.0]),
                Form::Plummer { gm, a } => (2.0, [gm, a, 0.0]),
                Form::MiyamotoNagai { gm, a, b } => (3.0, [gm, a, b]),
                Form::Logarithmic { v02, rc2, q2 } => (4.0, [v02, rc2, q2]),
            };
            out.push(form);
            out.extend(p);
            out.extend(centre);
        }
        out
    }

    /// Every term's centre at time `t`.
    fn centres(&self, t: f64) -> Vec<[f64; 3]> {
        self.terms
            .iter()
            .map(|term| term.motion.centre_at(t))
            .collect()
    }

    /// True when a term's centre moves (the potential then depends on time, and the energy
    /// it exchanges with the particles is not conserved).
    pub fn moves(&self) -> bool {
        self.terms.iter().any(|t| match &t.motion {
            Motion::Line { velocity, .. } => *velocity != [0.0; 3],
            Motion::Path(_) => true,
        })
    }

    /// Acceleration and potential at `x` at time `t`.
    pub fn at(&self, x: [f64; 3], t: f64) -> ([f64; 3], f64) {
        self.at_centres(x, &self.centres(t))
    }

    /// Acceleration and potential at `x` with the terms centred on `centres`.
    #[inline]
    fn at_centres(&self, x: [f64; 3], centres: &[[f64; 3]]) -> ([f64; 3], f64) {
        let mut acc = [0.0; 3];
        let mut pot = 0.0;
        for (term, c) in self.terms.iter().zip(centres) {
            let d: [f64; 3] = std::array::from_fn(|k| x[k] - c[k]);
            let (a, p) = term.form.at(d);
            for k in 0..3 {
                acc[k] += a[k];
            }
            pot += p;
        }
        (acc, pot)
    }

    /// Adds the external acceleration at time `t` to the particles `which` (all when
    /// `None`) of `pos`, in `acc`.
    pub fn add_accelerations(
        &self,
        pos: &[[f64; 3]],
        acc: &mut [[f64; 3]],
        t: f64,
        which: Option<&[u32]>,
    ) {
        use rayon::prelude::*;
        let centres = self.centres(t);
        match which {
            None => acc.par_iter_mut().zip(pos).for_each(|(a, &x)| {
                let (ext, _) = self.at_centres(x, &centres);
                for k in 0..3 {
                    a[k] += ext[k];
                }
            }),
            Some(list) => {
                for &i in list {
                    let (ext, _) = self.at_centres(pos[i as usize], &centres);
                    for k in 0..3 {
                        acc[i as usize][k] += ext[k];
                    }
                }
            }
        }
    }

    /// Σ m Φ_ext at time `t`, in particle order (the same bits for any thread count).
    pub fn energy(&self, pos: &[[f64; 3]], mass: &[f64], t: f64) -> f64 {
        let centres = self.centres(t);
        crate::sum::sum_indexed(pos.len(), |i| {
            [mass[i] * self.at_centres(pos[i], &centres).1]
        })[0]
    }
}

/// The points of a centre's path file: `time,x,y,z` rows (a first line that is not numbers
/// is a header), at least two, time strictly increasing; why not, in words.
fn read_orbit(path: &std::path::Path) -> Result<Vec<(f64, [f64; 3])>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read it ({e})"))?;
    let mut points: Vec<(f64, [f64; 3])> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let values: Result<Vec<f64>, _> =
            line.split(',').map(|v| v.trim().parse::<f64>()).collect();
        match values {
            Ok(v) if v.len() == 4 && v.iter().all(|x| x.is_finite()) => {
                if points.last().is_some_and(|p| p.0 >= v[0]) {
                    return Err(format!("line {}: times must increase", n + 1));
                }
                points.push((v[0], [v[1], v[2], v[3]]));
            }
            Err(_) if points.is_empty() && n == 0 => {} // a header
            _ => return Err(format!("line {}: expected four numbers time,x,y,z", n + 1)),
        }
    }
    if points.len() < 2 {
        return Err("it needs at least two time,x,y,z rows".into());
    }
    Ok(points)
}

impl Form {
    /// Acceleration and potential at offset `d` from the centre.
    #[inline]
    fn at(&self, d: [f64; 3]) -> ([f64; 3], f64) {
        let r2 = d[0] * d[0] + d[1] * d[1] + d[2] * d[2];
        let radial = |g_over_r: f64| d.map(|c| -g_over_r * c);
        match *self {
            Form::Plummer { gm, a } => {
                let s2 = r2 + a * a;
                let s = s2.sqrt();
                (radial(gm / (s2 * s)), -gm / s)
            }
            Form::Hernquist { gm, a } => {
                let r = r2.sqrt();
                let ra = r + a;
                // |a| = G M / (r + a)^2, towards the centre (0 at the centre itself).
                let g_over_r = if r > 0.0 { gm / (r * ra * ra) } else { 0.0 };
                (radial(g_over_r), -gm / ra)
            }
            Form::Nfw { gm, rs } => {
                let r = r2.sqrt();
                let x = r / rs;
                if x < 1e-4 {
                    // Series of ln(1+x) - x/(1+x) and of ln(1+x)/x near the centre, where
                    // the closed forms cancel.
                    let enclosed = x * x * (0.5 - x * (2.0 / 3.0 - 0.75 * x));
                    let g_over_r = if r > 0.0 {
                        gm * enclosed / (r2 * r)
                    } else {
                        0.0
                    };
                    (radial(g_over_r), -gm / rs * (1.0 - x * (0.5 - x / 3.0)))
                } else {
                    let enclosed = x.ln_1p() - x / (1.0 + x);
                    (radial(gm * enclosed / (r2 * r)), -gm * x.ln_1p() / r)
                }
            }
            Form::MiyamotoNagai { gm, a, b } => {
                let zeta = (d[2] * d[2] + b * b).sqrt();
                let az = a + zeta;
                let s2 = d[0] * d[0] + d[1] * d[1] + az * az;
                let s = s2.sqrt();
                let f = gm / (s2 * s);
                // Grouped as kernels/external.cu does, for the same bits.
                (
                    [-(f * d[0]), -(f * d[1]), -(f * d[2] * (az / zeta))],
                    -gm / s,
                )
            }
            Form::Logarithmic { v02, rc2, q2 } => {
                let s = rc2 + d[0] * d[0] + d[1] * d[1] + d[2] * d[2] / q2;
                let f = v02 / s;
                (
                    [-(f * d[0]), -(f * d[1]), -(f * d[2] / q2)],
                    0.5 * v02 * s.ln(),
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn potential(text: &str) -> ExternalPotential {
        let source = SourceText {
            path: "test.toml".into(),
            text: text.into(),
        };
        #[derive(Deserialize)]
        struct Wrapper {
            external: Vec<ExternalEntry>,
        }
        let w: Wrapper = source.parse().unwrap();
        ExternalPotential::new(&source, &w.external, 2.0, 1.0).unwrap()
    }

    /// A potential's squared circular velocity in its plane of symmetry, as a formula.
    type CircularVelocity = Box<dyn Fn(f64) -> f64>;

    /// One term of each kind, G = 2.
    fn each() -> Vec<(&'static str, ExternalPotential, CircularVelocity)> {
        let (gm, a, b, rs) = (2.0 * 3.0, 0.7, 0.2, 1.3);
        vec![
            (
                "plummer",
                potential("[[external]]\nprofile = \"plummer\"\nmass = 3.0\nscale_radius = 0.7"),
                Box::new(move |r: f64| gm * r * r / (r * r + a * a).powf(1.5)),
            ),
            (
                "hernquist",
                potential("[[external]]\nprofile = \"hernquist\"\nmass = 3.0\nscale_radius = 0.7"),
                Box::new(move |r: f64| gm * r / ((r + a) * (r + a))),
            ),
            (
                "nfw",
                potential("[[external]]\nprofile = \"nfw\"\nmass = 3.0\nscale_radius = 1.3"),
                Box::new(move |r: f64| {
                    let x = r / rs;
                    gm * (x.ln_1p() - x / (1.0 + x)) / r
                }),
            ),
            (
                "miyamoto_nagai",
                potential(
                    "[[external]]\nprofile = \"miyamoto_nagai\"\nmass = 3.0\nscale_radius = 0.7\nscale_height = 0.2",
                ),
                Box::new(move |r: f64| gm * r * r / (r * r + (a + b) * (a + b)).powf(1.5)),
            ),
            (
                "logarithmic",
                potential(
                    "[[external]]\nprofile = \"logarithmic\"\ncircular_velocity = 1.5\ncore_radius = 0.4\nflattening = 0.8",
                ),
                Box::new(|r: f64| 2.25 * r * r / (0.16 + r * r)),
            ),
        ]
    }

    #[test]
    fn circular_velocities_match_their_formulas() {
        for (name, p, vc2) in each() {
            // From 0.05 out: nearer the centre the NFW formula's own difference
            // ln(1+x) - x/(1+x) loses digits (2e-16 / x relative).
            for r in [0.05, 0.5, 1.0, 3.0, 40.0] {
                // In the plane z = 0, along a direction off the axes.
                let (c, s) = (0.6, 0.8);
                let (a, _) = p.at([r * c, r * s, 0.0], 0.0);
                let got = r * (a[0] * c + a[1] * s).abs();
                let want = vc2(r);
                assert!(
                    (got - want).abs() <= 1e-13 * want,
                    "{name} at r = {r}: v² {got} against {want}"
                );
                assert!(a[2] == 0.0, "{name}: no vertical pull in the plane");
            }
        }
    }

    #[test]
    fn the_acceleration_is_minus_the_gradient_of_the_potential() {
        for (name, p, _) in each() {
            for x in [[0.3, -0.4, 0.25], [2.0, 1.0, -1.5], [1e-3, 2e-3, -1e-3]] {
                let (a, _) = p.at(x, 0.0);
                for k in 0..3 {
                    let h = 1e-5 * (x[0].abs() + x[1].abs() + x[2].abs());
                    let (mut up, mut down) = (x, x);
                    up[k] += h;
                    down[k] -= h;
                    let grad = (p.at(up, 0.0).1 - p.at(down, 0.0).1) / (2.0 * h);
                    let scale = a.iter().map(|v| v.abs()).fold(0.0, f64::max);
                    assert!(
                        (a[k] + grad).abs() <= 1e-6 * scale,
                        "{name} at {x:?}, axis {k}: a {} against -dΦ/dx {}",
                        a[k],
                        -grad
                    );
                }
            }
        }
    }

    #[test]
    fn a_centre_follows_its_path_file_and_a_bad_one_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("orbit.csv");
        std::fs::write(&path, "time,x,y,z\n0,0,0,0\n1,2,0,0\n3,2,4,0\n").unwrap();
        let text = format!(
            "[[external]]\nprofile = \"plummer\"\nmass = 1.0\nscale_radius = 1.0\ncentre_orbit = {:?}",
            path.display().to_string()
        );
        let p = potential(&text);
        assert!(p.moves());
        // At t = 2 the centre is halfway along the second segment: (2, 2, 0).
        let (a, _) = p.at([2.0, 2.0, 0.0], 2.0);
        assert_eq!(a, [0.0; 3]);
        assert_eq!(p.device_terms(0.5)[4..7], [1.0, 0.0, 0.0]);
        let source = |text: &str| SourceText {
            path: "test.toml".into(),
            text: text.into(),
        };
        #[derive(Deserialize)]
        struct Wrapper {
            external: Vec<ExternalEntry>,
        }
        let refused = |csv: &str, end: f64, needle: &str| {
            std::fs::write(&path, csv).unwrap();
            let s = source(&text);
            let w: Wrapper = s.parse().unwrap();
            let e = ExternalPotential::new(&s, &w.external, 2.0, end)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("gravity.external.0.centre_orbit") && e.contains(needle),
                "{e}"
            );
        };
        refused(
            "0,0,0,0\n1,1,1,1\n",
            2.0,
            "from 0 to 1; the run needs its centre from 0 to 2",
        );
        refused("0,0,0,0\n0,1,1,1\n", 1.0, "times must increase");
        refused("0,0,0\n", 1.0, "four numbers");
        refused("time,x,y,z\n0,0,0,0\n", 1.0, "at least two");
    }

    #[test]
    fn the_nfw_series_meets_the_closed_form_and_terms_add_and_move() {
        let p = potential("[[external]]\nprofile = \"nfw\"\nmass = 3.0\nscale_radius = 1.3");
        let r = 1e-4 * 1.3;
        let (below, _) = p.at([r * (1.0 - 1e-9), 0.0, 0.0], 0.0);
        let (above, _) = p.at([r * (1.0 + 1e-9), 0.0, 0.0], 0.0);
        assert!(
            (below[0] / above[0] - 1.0).abs() < 1e-8,
            "{below:?} {above:?}"
        );
        assert_eq!(p.at([0.0; 3], 0.0).0, [0.0; 3]);
        let two = potential(
            "[[external]]\nprofile = \"plummer\"\nmass = 1.0\nscale_radius = 1.0\n\
             [[external]]\nprofile = \"hernquist\"\nmass = 1.0\nscale_radius = 1.0\ncentre = [1.0, 0.0, 0.0]\ncentre_velocity = [0.0, 2.0, 0.0]",
        );
        assert!(two.moves());
        // At t = 1 the Hernquist centre is at (1, 2, 0).
        let (_, pot) = two.at([1.0, 2.0, 0.0], 1.0);
        let plummer = -2.0 / (5.0f64 + 1.0).sqrt();
        assert!((pot - (plummer - 2.0)).abs() < 1e-15, "{pot}");
    }
}
