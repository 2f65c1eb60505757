//! `leapfmm analyze` on synthetic snapshots with known answers: an exponential disk's
//! surface density, a sech² layer's scale height, a rigidly rotating bar's amplitude and
//! pattern speed; and every plot a real, non-blank PNG of the expected size.

mod common;

use leapfmm::analysis::plot::{CHART_SIZE, EDGE_ON_SIZE, MAP_SIZE};
use leapfmm::analysis::profiles::{annulus, disk_profile};
use leapfmm::analysis::report::{Options, analyze};
use leapfmm::config::Precision;
use leapfmm::io::snapshot::{SnapshotInfo, write_snapshot};
use leapfmm::particles::{Component, Particles};
use leapfmm::units::UnitSystem;
use std::f64::consts::PI;
use std::path::Path;

const N: usize = 100_000;
const RD: f64 = 3.0;
const MASS: f64 = 5.0;

/// x with f(x) = target for an increasing f, by bisection on [lo, hi].
fn invert(f: impl Fn(f64) -> f64, target: f64, mut lo: f64, mut hi: f64) -> f64 {
    for _ in 0..100 {
        let mid = 0.5 * (lo + hi);
        if f(mid) < target { lo = mid } else { hi = mid }
    }
    0.5 * (lo + hi)
}

/// Stratified samples (no shot noise): radius from the exponential disk's cumulative mass
/// 1 - (1 + x) e^-x, azimuth from the density 1 + a cos 2(φ - angle) (a golden-ratio
/// sequence of quantiles, independent of the radius), height from sech²(z / z0).
fn disk(a: f64, angle: f64, z0: f64) -> Particles {
    let mut p = Particles::default();
    let golden = 0.5 * (5f64.sqrt() - 1.0);
    for i in 0..N {
        let u = (i as f64 + 0.5) / N as f64;
        let x = invert(|x| 1.0 - (1.0 + x) * (-x).exp(), u, 0.0, 60.0);
        let w = (i as f64 * golden).fract();
        let phi0 = invert(
            |f| (f + 0.5 * a * (2.0 * f).sin()) / (2.0 * PI),
            w,
            0.0,
            2.0 * PI,
        );
        let phi = phi0 + angle;
        let v = ((i * 7919) % N) as f64 / N as f64 + 0.5 / N as f64;
        let z = z0 * (2.0 * v - 1.0).atanh();
        let r = x * RD;
        p.push(
            [r * phi.cos(), r * phi.sin(), z],
            [0.0; 3],
            MASS / N as f64,
            i as u64 + 1,
            Component::Disk,
        );
    }
    p
}

#[test]
fn exponential_disk_profile_within_two_percent() {
    let p = disk(0.0, 0.0, 0.3);
    let rows = disk_profile(&p, Component::Disk, 5.0 * RD, 40, 43009.17, 0.05);
    let mut checked = 0;
    for r in rows
        .iter()
        .filter(|r| r.radius >= 0.5 * RD && r.radius <= 4.0 * RD)
    {
        let exact = MASS / (2.0 * PI * RD * RD) * (-r.radius / RD).exp();
        let rel = r.disk.surface_density / exact - 1.0;
        assert!(rel.abs() < 0.02, "R = {}: Σ off by {rel:.4}", r.radius);
        checked += 1;
    }
    assert!(checked >= 25);
    // The midplane circular velocity of a thin exponential disk peaks at 2.15 R_d with
    // 0.6222 sqrt(G M / R_d) (Freeman 1970); this sech² layer's thickness (z0 = 0.1 R_d)
    // lowers it by a few per cent (measured 2.2 %), never raises it.
    let peak = rows
        .iter()
        .max_by(|a, b| a.v_circ_total.total_cmp(&b.v_circ_total))
        .unwrap();
    let freeman = 0.6222 * (43009.17 * MASS / RD).sqrt();
    let ratio = peak.v_circ_total / freeman;
    println!(
        "peak {} at R = {} R_d: {ratio:.4} of Freeman's thin disk",
        peak.v_circ_total,
        peak.radius / RD
    );
    assert!(
        (0.93..1.01).contains(&ratio),
        "peak v_circ {ratio:.4} of the thin disk's"
    );
    assert!(
        (1.9..2.5).contains(&(peak.radius / RD)),
        "peak at {} R_d",
        peak.radius / RD
    );
}

#[test]
fn sech2_layer_scale_height_within_two_percent() {
    let z0 = 0.3;
    let p = disk(0.0, 0.0, z0);
    let h = annulus(&p, Component::Disk, 0.5 * RD, 2.0 * RD).scale_height;
    assert!((h / z0 - 1.0).abs() < 0.02, "scale height {h} for z0 {z0}");
}

fn png_pixels(path: &Path) -> ((u32, u32), Vec<u8>) {
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(path).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    buf.truncate(info.buffer_size());
    ((info.width, info.height), buf)
}

#[test]
fn rotating_bar_amplitude_pattern_speed_and_plots() {
    let dir = tempfile::tempdir().unwrap();
    let snaps = dir.path().join("snapshots");
    std::fs::create_dir_all(&snaps).unwrap();
    // Density 1 + a cos 2(φ - Ωt): A2 = a / 2.
    let (a, omega, dt) = (0.5, 2.0, 0.1);
    for k in 0..4 {
        let t = k as f64 * dt;
        let p = disk(a, omega * t, 0.3);
        let info = SnapshotInfo::new(t, UnitSystem::Galactic, Precision::Double);
        write_snapshot(&snaps.join(format!("snap_{k:03}.hdf5")), &p, &info).unwrap();
    }
    let out = dir.path().join("analysis");
    let options = Options {
        r_max: Some(4.0 * RD),
        bins: Some(20),
        pixels: 64,
    };
    let report = analyze(dir.path(), &out, options).unwrap();
    assert_eq!(report.snapshots.len(), 4);
    let text = std::fs::read_to_string(out.join("evolution.csv")).unwrap();
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let rows: Vec<Vec<f64>> = lines
        .map(|l| l.split(',').map(|v| v.parse().unwrap()).collect())
        .collect();
    // The expected A2 within r_max (4 R_d holds 91% of the mass; the pattern is the same
    // at every radius).
    for (k, row) in rows.iter().enumerate() {
        let a2 = row[col("a2")];
        assert!((a2 / (0.5 * a) - 1.0).abs() < 0.05, "snapshot {k}: A2 {a2}");
        if k > 0 {
            let w = row[col("pattern_speed")];
            assert!(
                (w / omega - 1.0).abs() < 0.02,
                "snapshot {k}: pattern speed {w}"
            );
        }
    }
    // Every plot is a PNG of the expected size with structure (not one flat colour).
    let pngs: Vec<_> = report
        .files
        .iter()
        .filter(|f| f.extension().is_some_and(|e| e == "png"))
        .collect();
    assert_eq!(pngs.len(), 4 * 6 + 4, "{pngs:?}");
    for f in pngs {
        let (size, pixels) = png_pixels(f);
        let name = f.file_name().unwrap().to_string_lossy();
        let expected = if name.starts_with("faceon") {
            MAP_SIZE
        } else if name.starts_with("edgeon") {
            EDGE_ON_SIZE
        } else {
            CHART_SIZE
        };
        assert_eq!(size, expected, "{name}");
        let n = pixels.len() as f64;
        let mean = pixels.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
        let var = pixels
            .iter()
            .map(|&v| (f64::from(v) - mean).powi(2))
            .sum::<f64>()
            / n;
        assert!(var > 100.0, "{name} is nearly blank (pixel variance {var})");
    }
}

#[test]
fn a_multi_file_run_is_analysed_snapshot_by_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = format!(
        "name = \"two\"\noutput_dir = \"runs\"\nseed = 3\nunits = \"nbody\"\n[ics]\nmodel = \"{}\"\nn = 2000\n[gravity]\nsolver = \"fmm\"\nsoftening = 0.05\n[integrator]\nt_end = 0.125\ndt_max = 0.03125\nfixed_step = true\n[output]\nsnapshot_interval = 0.0625\n",
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("ics/plummer.toml")
            .display()
    );
    std::fs::write(dir.path().join("two.toml"), cfg).unwrap();
    for args in [
        &["run", "two.toml", "--ranks", "2", "--quiet"][..],
        &["analyze", "runs/two"][..],
    ] {
        let out = common::run_in(dir.path(), args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let analysis = dir.path().join("runs/two/analysis");
    let evolution = std::fs::read_to_string(analysis.join("evolution.csv")).unwrap();
    // Snapshots at t = 0, 0.0625, 0.125, each a two-file set (snapdir_NNN).
    assert_eq!(evolution.lines().count(), 4, "{evolution}");
    assert!(analysis.join("conservation.png").is_file());
    assert!(analysis.join("lagrangian.png").is_file());
}

#[test]
fn a_snapshot_with_no_particles_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("empty.hdf5");
    {
        let _guard = common::hdf5_lock();
        let f = hdf5::File::create(&path).unwrap();
        let h = f.create_group("Header").unwrap();
        h.new_attr::<i64>()
            .shape(6)
            .create("NumPart_ThisFile")
            .unwrap()
            .write_raw(&[0i64; 6])
            .unwrap();
        f.close().unwrap();
    }
    let out = common::run_in(dir.path(), &["analyze", "empty.hdf5"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("empty.hdf5: the snapshot holds no particles"),
        "{err}"
    );
    assert!(
        !dir.path().join("empty_analysis").exists(),
        "no folder of NaN files"
    );
}
