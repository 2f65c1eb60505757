//! Several galaxies in one run (`[[ics.galaxies]]`): each galaxy's centre in every snapshot
//! (a shrinking sphere on the particles its IDs give it), the distances between the
//! centres through the run, and, for two galaxies started on `[ics.orbit]`, the two-body
//! Keplerian orbit of their masses to compare with (`galaxies.csv`, `separation.png`).

use super::plot::{Series, line_chart};
use crate::ics::encounter::{GALAXY_ID_STRIDE, KeplerOrbit, OrbitEntry};
use crate::particles::Particles;
use std::fmt::Write;
use std::path::{Path, PathBuf};

/// The galaxy particle `id` came from.
pub fn galaxy_of(id: u64) -> usize {
    (id / GALAXY_ID_STRIDE) as usize
}

/// Number of galaxies in `p` (1 for a run of one model).
pub fn galaxy_count(p: &Particles) -> usize {
    p.id.iter().map(|&id| galaxy_of(id) + 1).max().unwrap_or(0)
}

/// The centre of a particle set by shrinking spheres (Power et al. 2003): from the centre
/// of mass and a sphere holding every particle, the centre of mass of the particles inside
/// a sphere 10 % smaller about the last centre, until fewer than 1 % of them (at least 100)
/// remain. It follows the densest part, which stripped tails and bridges do not pull away.
pub fn shrinking_sphere_centre(pos: &[[f64; 3]], mass: &[f64]) -> [f64; 3] {
    let centre_of = |inside: &dyn Fn(usize) -> bool| {
        let (mut m, mut s) = (0.0, [0.0; 3]);
        for i in (0..pos.len()).filter(|&i| inside(i)) {
            m += mass[i];
            for k in 0..3 {
                s[k] += mass[i] * pos[i][k];
            }
        }
        (m > 0.0).then(|| s.map(|v| v / m))
    };
    let Some(mut centre) = centre_of(&|_| true) else {
        return [0.0; 3];
    };
    let dist2 = |x: [f64; 3], c: [f64; 3]| (0..3).map(|k| (x[k] - c[k]).powi(2)).sum::<f64>();
    let mut r2 = pos.iter().map(|&x| dist2(x, centre)).fold(0.0, f64::max);
    let enough = (pos.len() / 100).max(100);
    loop {
        r2 *= 0.81;
        let inside = |i: usize| dist2(pos[i], centre) < r2;
        if (0..pos.len()).filter(|&i| inside(i)).count() < enough {
            return centre;
        }
        match centre_of(&inside) {
            Some(c) => centre = c,
            None => return centre,
        }
    }
}

/// Every galaxy's centre in `p` (index = galaxy).
pub fn centres(p: &Particles) -> Vec<[f64; 3]> {
    (0..galaxy_count(p))
        .map(|g| {
            let members: Vec<usize> = (0..p.len()).filter(|&i| galaxy_of(p.id[i]) == g).collect();
            let pos: Vec<[f64; 3]> = members.iter().map(|&i| p.pos[i]).collect();
            let mass: Vec<f64> = members.iter().map(|&i| p.mass[i]).collect();
            shrinking_sphere_centre(&pos, &mass)
        })
        .collect()
}

/// Each galaxy's total mass in `p`.
pub fn masses(p: &Particles) -> Vec<f64> {
    let mut out = vec![0.0; galaxy_count(p)];
    for (&id, &m) in p.id.iter().zip(&p.mass) {
        out[galaxy_of(id)] += m;
    }
    out
}

fn distance(a: [f64; 3], b: [f64; 3]) -> f64 {
    (0..3).map(|k| (a[k] - b[k]).powi(2)).sum::<f64>().sqrt()
}

/// The galaxies' centres through a run.
#[derive(Debug, Default)]
pub struct Encounters {
    times: Vec<f64>,
    centres: Vec<Vec<[f64; 3]>>,
    /// Each galaxy's mass in the first snapshot.
    masses: Vec<f64>,
}

impl Encounters {
    /// Adds the snapshot `p` at time `t`.
    pub fn add(&mut self, p: &Particles, t: f64) {
        if self.masses.is_empty() {
            self.masses = masses(p);
        }
        self.times.push(t);
        self.centres.push(centres(p));
    }

    /// The separation of galaxies 0 and `g` in each snapshot.
    fn separations(&self, g: usize) -> Vec<f64> {
        self.centres
            .iter()
            .map(|c| match (c.first(), c.get(g)) {
                (Some(&a), Some(&b)) => distance(a, b),
                _ => f64::NAN,
            })
            .collect()
    }

    /// The two-body orbit's separation at each snapshot's time, for an orbit started at
    /// the first snapshot (`orbit`, G = `g`).
    fn kepler(&self, orbit: &OrbitEntry, g: f64) -> Vec<f64> {
        let k = KeplerOrbit {
            gm: g * (self.masses[0] + self.masses.get(1).copied().unwrap_or(0.0)),
            pericentre: orbit.pericentre,
            eccentricity: orbit.eccentricity,
        };
        let (t0, start) = (
            self.times.first().copied().unwrap_or(0.0),
            k.time_from_pericentre(k.incoming_anomaly(orbit.separation)),
        );
        self.times
            .iter()
            .map(|&t| k.separation_at_time(start + (t - t0)))
            .collect()
    }

    /// Writes `galaxies.csv` (time, each centre, the separations from galaxy 0 and the
    /// two-body orbit's) and `separation.png` into `output`; `orbit` with G when the run
    /// started two galaxies on one; `time` the plot's time label and factor, `length` its
    /// length unit. Returns the files written.
    pub fn write(
        &self,
        output: &Path,
        orbit: Option<(&OrbitEntry, f64)>,
        time: (&str, f64),
        length: &str,
    ) -> Result<Vec<PathBuf>, super::report::AnalyzeError> {
        let count = self.masses.len();
        let kepler = orbit.filter(|_| count == 2).map(|(o, g)| self.kepler(o, g));
        let mut csv = String::from("time");
        for g in 0..count {
            let _ = write!(csv, ",galaxy{g}_x,galaxy{g}_y,galaxy{g}_z");
        }
        for g in 1..count {
            let _ = write!(csv, ",separation_0_{g}");
        }
        if kepler.is_some() {
            csv.push_str(",two_body_separation");
        }
        csv.push('\n');
        let separations: Vec<Vec<f64>> = (1..count).map(|g| self.separations(g)).collect();
        for (k, t) in self.times.iter().enumerate() {
            let _ = write!(csv, "{t}");
            for g in 0..count {
                let c = self.centres[k].get(g).copied().unwrap_or([f64::NAN; 3]);
                let _ = write!(csv, ",{},{},{}", c[0], c[1], c[2]);
            }
            for s in &separations {
                let _ = write!(csv, ",{}", s[k]);
            }
            if let Some(kepler) = &kepler {
                let _ = write!(csv, ",{}", kepler[k]);
            }
            csv.push('\n');
        }
        let mut files = Vec::new();
        let path = output.join("galaxies.csv");
        std::fs::write(&path, csv).map_err(|e| super::report::AnalyzeError::File {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        files.push(path);
        if self.times.len() >= 2 {
            let t: Vec<f64> = self.times.iter().map(|t| t * time.1).collect();
            let along = |v: &[f64]| t.iter().copied().zip(v.iter().copied()).collect();
            let mut series: Vec<Series> = separations
                .iter()
                .enumerate()
                .map(|(g, s)| Series {
                    name: format!("galaxies 0 and {}: centres (shrinking spheres)", g + 1),
                    points: along(s),
                })
                .collect();
            if let (Some(kepler), Some((o, _))) = (&kepler, orbit) {
                // Past 1.5 times the start the unbound orbit would only squeeze the curves.
                let near: Vec<f64> = kepler
                    .iter()
                    .map(|&r| if r <= 1.5 * o.separation { r } else { f64::NAN })
                    .collect();
                series.push(Series {
                    name: "two-body orbit of the galaxies' masses".into(),
                    points: along(&near),
                });
            }
            let path = output.join("separation.png");
            line_chart(
                &path,
                "Distance between the galaxies' centres",
                time.0,
                &format!("separation [{length}]"),
                &series,
            )?;
            files.push(path);
        }
        Ok(files)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shrinking_sphere_finds_the_dense_centre_past_a_far_tail() {
        // A dense clump of 1 000 particles at (5, 0, 0) and a tail of 500 heavier ones
        // spread to x = 100: the centre of mass is far off, the clump's centre is found.
        let mut pos = Vec::new();
        let mut mass = Vec::new();
        for i in 0..1000 {
            let a = i as f64 * 2.399_963;
            let r = 0.1 * ((i % 10) as f64 + 0.5) / 10.0;
            pos.push([
                5.0 + r * a.cos(),
                r * a.sin(),
                0.01 * ((i % 7) as f64 - 3.0),
            ]);
            mass.push(1.0);
        }
        for i in 0..500 {
            pos.push([10.0 + 0.18 * i as f64, 3.0, 0.0]);
            mass.push(2.0);
        }
        let c = shrinking_sphere_centre(&pos, &mass);
        assert!(distance(c, [5.0, 0.0, 0.0]) < 0.05, "{c:?}");
    }
}
