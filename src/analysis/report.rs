//! `leapfmm analyze`: CSV tables and PNG plots of a run folder or one snapshot — the
//! conservation record, and per snapshot surface-density maps and radial profiles, and
//! across snapshots the bar (A2, pattern speed), vertical heating and Lagrangian radii.

use super::bar::{a2_noise, m2_mode, pattern_speeds};
use super::galaxies::{Encounters, galaxy_count};
use super::maps::{Frame, View, surface_density};
use super::plot::{EDGE_ON_SIZE, MAP_SIZE, PlotError, Series, line_chart, map_image};
use super::profiles::{annulus, disk_profile, lagrangian_radii};
use crate::io::snapshot::{SnapshotData, SnapshotError, read_parameter_f64, read_snapshot};
use crate::particles::{Component, Particles};
use crate::units::CgsUnits;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Why an analysis could not be done.
#[derive(Debug, thiserror::Error)]
pub enum AnalyzeError {
    /// The input names no snapshot.
    #[error("{0}")]
    Input(String),
    /// A snapshot could not be read.
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    /// A plot could not be written.
    #[error(transparent)]
    Plot(#[from] PlotError),
    /// A table could not be read or written.
    #[error("{path}: {reason}")]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
}

/// Choices of an analysis.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Options {
    /// Outer radius of the profiles and half width of the maps (default: 1.5x the disk's
    /// 90% Lagrangian radius in the first snapshot).
    pub r_max: Option<f64>,
    /// Radial bins of the profiles (default: ~400 disk particles per bin, 10 to 40 bins).
    pub bins: Option<usize>,
    /// Cells across the maps (face-on maps are square; edge-on maps have half as many rows).
    pub pixels: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            r_max: None,
            bins: None,
            pixels: 200,
        }
    }
}

/// What an analysis wrote.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Snapshots analysed, in time order.
    pub snapshots: Vec<PathBuf>,
    /// Every file written.
    pub files: Vec<PathBuf>,
}

/// The snapshots of a run folder (`snapshots/snap_NNN.hdf5` and multi-file
/// `snapshots/snapdir_NNN/snap_NNN.0.hdf5`), or the one snapshot `input` names.
pub fn find_snapshots(input: &Path) -> Result<Vec<PathBuf>, AnalyzeError> {
    if input.is_file() {
        return Ok(vec![input.to_path_buf()]);
    }
    let dir = input.join("snapshots");
    let entries = std::fs::read_dir(&dir).map_err(|e| {
        AnalyzeError::Input(format!(
            "{}: neither a snapshot file nor a run folder with a snapshots/ folder ({e})",
            input.display()
        ))
    })?;
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(num) = name.strip_prefix("snapdir_") {
            let first = path.join(format!("snap_{num}.0.hdf5"));
            if first.is_file() {
                found.push(first);
            }
        } else if name.starts_with("snap_") && name.ends_with(".hdf5") {
            found.push(path);
        }
    }
    found.sort();
    if found.is_empty() {
        return Err(AnalyzeError::Input(format!(
            "{}: no snapshots (snap_NNN.hdf5 or snapdir_NNN/) in it",
            dir.display()
        )));
    }
    Ok(found)
}

/// Axis labels and conversions of a snapshot's units.
#[derive(Debug, Clone, Copy)]
struct Units {
    g: f64,
    /// Code time unit in Myr (None: code units).
    myr: Option<f64>,
    galactic: bool,
}

impl Units {
    fn of(units: Option<CgsUnits>) -> Units {
        match units {
            Some(u) => {
                let galactic = (u.length_cm / 3.085_677_581e21 - 1.0).abs() < 1e-3
                    && (u.velocity_cm_per_s / 1e5 - 1.0).abs() < 1e-3;
                Units {
                    g: u.gravitational_constant(),
                    myr: Some(u.time_s() / crate::units::MYR_S),
                    galactic,
                }
            }
            None => Units {
                g: 1.0,
                myr: None,
                galactic: false,
            },
        }
    }

    fn length(&self) -> &'static str {
        if self.galactic { "kpc" } else { "length units" }
    }

    fn velocity(&self) -> &'static str {
        if self.galactic {
            "km/s"
        } else {
            "velocity units"
        }
    }

    fn time(&self) -> (&'static str, f64) {
        match self.myr {
            Some(m) => ("t [Myr]", m),
            None => ("t [time units]", 1.0),
        }
    }

    /// "t = 300.2 Myr" (or in code units).
    fn when(&self, t: f64) -> String {
        match self.myr {
            Some(m) => format!("t = {:.1} Myr", t * m),
            None => format!("t = {t:.4}"),
        }
    }

    fn surface_density(&self) -> &'static str {
        if self.galactic {
            "log10 Σ [1e10 Msun / kpc²]"
        } else {
            "log10 Σ [mass / length²]"
        }
    }
}

/// The disk of a snapshot: its disk particles, or the first component present otherwise.
fn disk_component(p: &Particles) -> Component {
    [
        Component::Disk,
        Component::Generic,
        Component::Bulge,
        Component::Halo,
    ]
    .into_iter()
    .find(|c| p.component.contains(c))
    .unwrap_or(Component::Disk)
}

/// Cylindrical half-mass radius of `component`.
fn half_mass_radius(p: &Particles, component: Component) -> f64 {
    let mut rm: Vec<(f64, f64)> = (0..p.len())
        .filter(|&i| p.component[i] == component)
        .map(|i| (p.pos[i][0].hypot(p.pos[i][1]), p.mass[i]))
        .collect();
    rm.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total: f64 = rm.iter().map(|x| x.1).sum();
    let mut acc = 0.0;
    for (r, m) in rm {
        acc += m;
        if acc >= 0.5 * total {
            return r;
        }
    }
    0.0
}

fn write_file(path: &Path, text: &str, report: &mut Report) -> Result<(), AnalyzeError> {
    std::fs::write(path, text).map_err(|e| AnalyzeError::File {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    report.files.push(path.to_path_buf());
    Ok(())
}

/// Radii of the disk in the first snapshot, which fix the maps' windows and the profiles'
/// range for the whole run (so that pictures at different times compare).
#[derive(Debug, Clone, Copy)]
struct Geometry {
    /// Outer radius of the profiles and half width of the maps.
    r_max: f64,
    /// Cylindrical half-mass radius of the disk.
    r_half: f64,
    /// Half height of the edge-on maps: twice the 95th percentile of |z| within r_max
    /// (≈ 3.7 z0 for a sech²(z/z0) layer), at most r_max.
    z_max: f64,
}

impl Geometry {
    fn of(p: &Particles, disk: Component, options: Options) -> Geometry {
        let r90 = lagrangian_radii(p, disk, &[0.9])[0];
        let r_max = options.r_max.unwrap_or(1.5 * r90);
        let mut heights: Vec<f64> = (0..p.len())
            .filter(|&i| p.component[i] == disk && p.pos[i][0].hypot(p.pos[i][1]) < r_max)
            .map(|i| p.pos[i][2].abs())
            .collect();
        heights.sort_by(f64::total_cmp);
        let z95 = heights
            .get((0.95 * heights.len() as f64) as usize)
            .copied()
            .unwrap_or(r_max);
        let z_max = if z95 > 0.0 {
            (2.0 * z95).min(r_max)
        } else {
            r_max
        };
        Geometry {
            r_max,
            r_half: half_mass_radius(p, disk),
            z_max,
        }
    }
}

/// Analyses `input` (a run folder or one snapshot) into the folder `output`.
pub fn analyze(input: &Path, output: &Path, options: Options) -> Result<Report, AnalyzeError> {
    let snapshots = find_snapshots(input)?;
    let mut report = Report::default();
    let mut evolution = Evolution::default();
    let mut reference: Option<Geometry> = None;
    let mut encounters: Option<Encounters> = None;
    for (k, path) in snapshots.iter().enumerate() {
        let data = read_snapshot(path)?;
        let p = &data.particles;
        if p.is_empty() {
            // Every profile and map of it would be NaN.
            return Err(AnalyzeError::Input(format!(
                "{}: the snapshot holds no particles",
                path.display()
            )));
        }
        if k == 0 {
            // Only once there is something to write.
            std::fs::create_dir_all(output).map_err(|e| AnalyzeError::File {
                path: output.to_path_buf(),
                reason: e.to_string(),
            })?;
        }
        let disk = disk_component(p);
        let geometry = *reference.get_or_insert_with(|| Geometry::of(p, disk, options));
        let tag = format!("{k:03}");
        one_snapshot(&data, disk, geometry, &tag, output, options, &mut report)?;
        evolution.add(&data, disk, geometry.r_max, geometry.r_half);
        if k == 0 && galaxy_count(p) > 1 {
            encounters = Some(Encounters::default());
        }
        if let Some(e) = &mut encounters {
            e.add(p, data.time);
        }
    }
    evolution.write(output, &mut report)?;
    if let Some(e) = &encounters {
        let units = evolution.units.unwrap_or(Units::of(None));
        let orbit = run_orbit(input);
        let files = e.write(
            output,
            orbit.as_ref().map(|(o, g)| (o, *g)),
            units.time(),
            units.length(),
        )?;
        report.files.extend(files);
    }
    let diagnostics = input.join("diagnostics.csv");
    if input.is_dir() && diagnostics.is_file() {
        let units = evolution.units.unwrap_or(Units::of(None));
        conservation(&diagnostics, units, output, &mut report)?;
    }
    report.snapshots = snapshots;
    Ok(report)
}

/// The orbit two galaxies of the run folder `input` started on (`[ics.orbit]` in its
/// `config.toml`) and the run's G; `None` for a snapshot, or a run without an orbit.
fn run_orbit(input: &Path) -> Option<(crate::ics::encounter::OrbitEntry, f64)> {
    let path = input.join("config.toml");
    let source = crate::source::SourceText::read(&path).ok()?;
    let config = crate::config::parse_run_config(&source).ok()?;
    Some((config.ics.orbit?, config.units.gravitational_constant()))
}

/// The softening for the midplane circular velocity: the run's (or the disk type's GADGET-4
/// softening class) when the file records it, else 1 % of the profile's radius; beyond a few
/// softening lengths from the ring points it changes nothing.
fn softening_of(data: &SnapshotData, disk: Component, r_max: f64) -> f64 {
    let file = data.files.first();
    let read = |name: &str| file.and_then(|f| read_parameter_f64(f, name));
    read("leapfmm.gravity.softening")
        .or_else(|| read(&format!("SofteningComovingClass{}", disk.part_type())))
        .filter(|e| e.is_finite() && *e >= 0.0)
        .unwrap_or(0.01 * r_max)
}

/// Maps and profiles of one snapshot.
fn one_snapshot(
    data: &SnapshotData,
    disk: Component,
    geometry: Geometry,
    tag: &str,
    output: &Path,
    options: Options,
    report: &mut Report,
) -> Result<(), AnalyzeError> {
    let p = &data.particles;
    let units = Units::of(data.units);
    let when = units.when(data.time);
    let len = units.length();
    let r_max = geometry.r_max;
    let face_on = Frame {
        half_width: r_max,
        half_height: r_max,
        columns: options.pixels,
        rows: options.pixels,
    };
    let edge_on = Frame {
        half_height: geometry.z_max,
        rows: options.pixels.div_ceil(2),
        ..face_on
    };
    for (view, frame, size, name, y) in [
        (View::FaceOn, face_on, MAP_SIZE, "faceon", "y"),
        (View::EdgeOn, edge_on, EDGE_ON_SIZE, "edgeon", "z"),
    ] {
        let map = surface_density(p, disk, view, frame);
        let path = output.join(format!("{name}_{tag}.png"));
        map_image(
            &path,
            size,
            &format!("{disk:?} surface density, {name}, {when}"),
            &map,
            &format!("x [{len}]"),
            &format!("{y} [{len}]"),
            units.surface_density(),
        )?;
        report.files.push(path);
    }
    let disk_count = p.component.iter().filter(|&&c| c == disk).count();
    let bins = options.bins.unwrap_or((disk_count / 400).clamp(10, 40));
    let rows = disk_profile(
        p,
        disk,
        r_max,
        bins,
        units.g,
        softening_of(data, disk, r_max),
    );
    let mut csv = String::from(
        "radius,count,surface_density,mean_vphi,sigma_r,sigma_phi,sigma_z,scale_height,vc_halo,vc_disk,vc_bulge,vc_other,vc_total,toomre_q\n",
    );
    for r in &rows {
        let d = &r.disk;
        let _ = writeln!(
            csv,
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            r.radius,
            d.count,
            d.surface_density,
            d.mean_vphi,
            d.sigma_r,
            d.sigma_phi,
            d.sigma_z,
            d.scale_height,
            r.v_circ[0],
            r.v_circ[1],
            r.v_circ[2],
            r.v_circ[3],
            r.v_circ_total,
            r.toomre_q
        );
    }
    write_file(&output.join(format!("profile_{tag}.csv")), &csv, report)?;
    let filled = |f: &dyn Fn(&super::profiles::ProfileRow) -> f64| -> Vec<(f64, f64)> {
        rows.iter()
            .filter(|r| r.disk.count > 0)
            .map(|r| (r.radius, f(r)))
            .collect()
    };
    let series = |name: &str, f: &dyn Fn(&super::profiles::ProfileRow) -> f64| Series {
        name: name.to_string(),
        points: filled(f),
    };
    let r_label = format!("R [{len}]");
    let vel = units.velocity();
    let charts: Vec<(&str, String, String, Vec<Series>)> = vec![
        (
            "surface_density_profile",
            format!("{disk:?} surface density, {when}"),
            units.surface_density().into(),
            vec![series("Σ(R)", &|r| r.disk.surface_density.log10())],
        ),
        (
            "rotation",
            format!("Circular velocity by component (midplane force), {when}"),
            format!("v_c [{vel}]"),
            {
                let mut s: Vec<Series> = Component::ALL
                    .iter()
                    .filter(|c| p.component.contains(c))
                    .map(|&c| Series {
                        name: format!("{c:?}"),
                        points: rows
                            .iter()
                            .map(|r| (r.radius, r.v_circ[c.index()]))
                            .collect(),
                    })
                    .collect();
                s.push(Series {
                    name: "total".into(),
                    points: rows.iter().map(|r| (r.radius, r.v_circ_total)).collect(),
                });
                s.push(series("disk mean v_φ", &|r| r.disk.mean_vphi));
                s
            },
        ),
        (
            "velocity_dispersion",
            format!("{disk:?} velocity dispersions, {when}"),
            format!("σ [{vel}]"),
            vec![
                series("σ_R", &|r| r.disk.sigma_r),
                series("σ_φ", &|r| r.disk.sigma_phi),
                series("σ_z", &|r| r.disk.sigma_z),
            ],
        ),
        (
            "toomre",
            format!("Toomre Q of the {disk:?}, {when}"),
            "Q".into(),
            vec![series("Q(R)", &|r| r.toomre_q)],
        ),
    ];
    for (name, title, y_label, s) in charts {
        let path = output.join(format!("{name}_{tag}.png"));
        line_chart(&path, &title, &r_label, &y_label, &s)?;
        report.files.push(path);
    }
    Ok(())
}

/// A2 above this many times its noise level counts as a bar.
const BAR_THRESHOLD: f64 = 3.0;

/// Figures across snapshots.
#[derive(Debug, Default)]
struct Evolution {
    units: Option<Units>,
    times: Vec<f64>,
    a2: Vec<f64>,
    angle: Vec<f64>,
    sigma_z: Vec<f64>,
    scale_height: Vec<f64>,
    /// The mean A2 of particle noise in the first snapshot (`bar::a2_noise`).
    noise: f64,
    /// Per component present in the first snapshot: 10/50/90% radii per snapshot.
    lagrangian: Vec<(Component, Vec<[f64; 3]>)>,
}

impl Evolution {
    fn add(&mut self, data: &SnapshotData, disk: Component, r_max: f64, r_half: f64) {
        let p = &data.particles;
        self.units.get_or_insert(Units::of(data.units));
        self.times.push(data.time);
        let mode = m2_mode(p, disk, r_max);
        self.a2.push(mode.amplitude);
        self.angle.push(mode.angle);
        let ring = annulus(p, disk, 0.5 * r_half, 2.0 * r_half);
        self.sigma_z.push(ring.sigma_z);
        self.scale_height.push(ring.scale_height);
        if self.lagrangian.is_empty() {
            self.noise = a2_noise(p, disk, r_max);
            self.lagrangian = Component::ALL
                .iter()
                .filter(|c| p.component.contains(c))
                .map(|&c| (c, Vec::new()))
                .collect();
        }
        for (c, radii) in &mut self.lagrangian {
            let r = lagrangian_radii(p, *c, &[0.1, 0.5, 0.9]);
            radii.push([r[0], r[1], r[2]]);
        }
    }

    fn write(&self, output: &Path, report: &mut Report) -> Result<(), AnalyzeError> {
        let units = self.units.unwrap_or(Units::of(None));
        let (time_label, to_time) = units.time();
        let speeds = pattern_speeds(&self.times, &self.angle);
        let mut csv = String::from("time,a2,a2_noise,bar_angle,pattern_speed,sigma_z,scale_height");
        for (c, _) in &self.lagrangian {
            let _ = write!(csv, ",{c:?}_r10,{c:?}_r50,{c:?}_r90");
        }
        csv.push('\n');
        for k in 0..self.times.len() {
            // The pattern speed between this snapshot and the previous one.
            let speed = if k == 0 { f64::NAN } else { speeds[k - 1] };
            let _ = write!(
                csv,
                "{},{},{},{},{},{},{}",
                self.times[k],
                self.a2[k],
                self.noise,
                self.angle[k],
                speed,
                self.sigma_z[k],
                self.scale_height[k]
            );
            for (_, radii) in &self.lagrangian {
                let r = radii[k];
                let _ = write!(csv, ",{},{},{}", r[0], r[1], r[2]);
            }
            csv.push('\n');
        }
        write_file(&output.join("evolution.csv"), &csv, report)?;
        if self.times.len() < 2 {
            return Ok(());
        }
        let t: Vec<f64> = self.times.iter().map(|t| t * to_time).collect();
        let along = |v: &[f64]| t.iter().copied().zip(v.iter().copied()).collect();
        let len = units.length();
        // A bar is claimed where A2 exceeds BAR_THRESHOLD (3) times the noise's mean: A2 of
        // noise alone is Rayleigh-distributed, so it passes that line with probability
        // e^{-9π/4} ≈ 8.5e-4 per snapshot. The pattern speed is drawn only between snapshots that both pass it.
        let threshold = BAR_THRESHOLD * self.noise;
        let barred = |k: usize| self.a2[k] > threshold;
        let speed_points: Vec<(f64, f64)> = (1..t.len())
            .map(|k| {
                let w = if barred(k - 1) && barred(k) {
                    speeds[k - 1]
                } else {
                    f64::NAN
                };
                (t[k], w)
            })
            .collect();
        let any_bar = speed_points.iter().any(|p| p.1.is_finite());
        let mut charts = vec![
            (
                "bar",
                "Bar amplitude A2 of the disk".to_string(),
                "A2".to_string(),
                vec![
                    Series {
                        name: "A2".into(),
                        points: along(&self.a2),
                    },
                    Series {
                        name: "particle noise (mean A2 of random azimuths)".into(),
                        points: along(&vec![self.noise; t.len()]),
                    },
                    Series {
                        name: format!("bar threshold ({BAR_THRESHOLD}x noise)"),
                        points: along(&vec![threshold; t.len()]),
                    },
                ],
            ),
            (
                "pattern_speed",
                if any_bar {
                    format!("Bar pattern speed (where A2 > {BAR_THRESHOLD}x noise at both ends)")
                } else {
                    format!("No bar: A2 below {BAR_THRESHOLD}x particle noise, no pattern speed")
                },
                // A radian per kpc/(km/s) is a km/s/kpc.
                if units.galactic {
                    "Ω_p [km/s/kpc]".to_string()
                } else {
                    "Ω_p [rad / time unit]".to_string()
                },
                vec![Series {
                    name: "Ω_p".into(),
                    points: speed_points,
                }],
            ),
            (
                "heating",
                "Vertical heating of the disk (R_half/2 to 2 R_half)".to_string(),
                format!("σ_z [{}]", units.velocity()),
                vec![Series {
                    name: "σ_z".into(),
                    points: along(&self.sigma_z),
                }],
            ),
        ];
        charts.push((
            "lagrangian",
            "Lagrangian radii (10, 50, 90% of each component's mass)".to_string(),
            format!("r [{len}]"),
            self.lagrangian
                .iter()
                .flat_map(|(c, radii)| (0..3).map(move |k| (c, k, radii)))
                .map(|(c, k, radii)| Series {
                    name: format!("{c:?} {}%", [10, 50, 90][k]),
                    points: t.iter().copied().zip(radii.iter().map(|r| r[k])).collect(),
                })
                .collect(),
        ));
        for (name, title, y_label, s) in charts {
            let path = output.join(format!("{name}.png"));
            line_chart(&path, &title, time_label, &y_label, &s)?;
            report.files.push(path);
        }
        Ok(())
    }
}

/// ΔE/E, ΔLz/Lz and the virial ratio against time from a run's diagnostics.csv.
fn conservation(
    path: &Path,
    units: Units,
    output: &Path,
    report: &mut Report,
) -> Result<(), AnalyzeError> {
    let (time_label, to_time) = units.time();
    let bad = |reason: String| AnalyzeError::File {
        path: path.to_path_buf(),
        reason,
    };
    let mut reader = csv::Reader::from_path(path).map_err(|e| bad(e.to_string()))?;
    let headers = reader.headers().map_err(|e| bad(e.to_string()))?.clone();
    let column = |name: &str| {
        headers
            .iter()
            .position(|h| h == name)
            .ok_or_else(|| bad(format!("no column {name}")))
    };
    let (ct, ce, cl, cv) = (
        column("time")?,
        column("rel_energy_error")?,
        column("lz")?,
        column("virial_ratio")?,
    );
    let mut rows: Vec<[f64; 4]> = Vec::new();
    for record in reader.records() {
        let record = record.map_err(|e| bad(e.to_string()))?;
        let value = |c: usize| record.get(c).and_then(|v| v.parse::<f64>().ok());
        if let (Some(t), Some(e), Some(l), Some(v)) = (value(ct), value(ce), value(cl), value(cv)) {
            rows.push([t, e, l, v]);
        }
    }
    let Some(first) = rows.first().copied() else {
        return Ok(());
    };
    let lz0 = if first[2] != 0.0 { first[2] } else { 1.0 };
    let pts = |f: &dyn Fn(&[f64; 4]) -> f64| rows.iter().map(|r| (r[0] * to_time, f(r))).collect();
    let out = output.join("conservation.png");
    line_chart(
        &out,
        "Conservation (diagnostics.csv)",
        time_label,
        "relative change",
        &[
            Series {
                name: "ΔE/E".into(),
                points: pts(&|r| r[1]),
            },
            Series {
                name: "ΔLz/Lz".into(),
                points: pts(&|r| (r[2] - first[2]) / lz0),
            },
        ],
    )?;
    report.files.push(out);
    let out = output.join("virial.png");
    line_chart(
        &out,
        "Virial ratio 2K/|W| (diagnostics.csv)",
        time_label,
        "2K/|W|",
        &[Series {
            name: "2K/|W|".into(),
            points: pts(&|r| r[3]),
        }],
    )?;
    report.files.push(out);
    Ok(())
}
