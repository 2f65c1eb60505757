//! Snapshot files: the GADGET-4 layout of design §8 checked name by name and type by type,
//! and runs started from GADGET-format files written by another code.

mod common;

use common::*;
use hdf5::types::{FloatSize, IntSize, TypeDescriptor};
use leapfmm::io::snapshot::read_snapshot;
use std::path::Path;

fn descriptor(t: hdf5::Result<hdf5::Datatype>) -> TypeDescriptor {
    t.unwrap().to_descriptor().unwrap()
}

fn attr_type(loc: &hdf5::Location, name: &str) -> (TypeDescriptor, Vec<usize>) {
    let a = loc
        .attr(name)
        .unwrap_or_else(|_| panic!("missing attribute {name}"));
    (descriptor(a.dtype()), a.shape())
}

const U32: TypeDescriptor = TypeDescriptor::Unsigned(IntSize::U4);
const U64: TypeDescriptor = TypeDescriptor::Unsigned(IntSize::U8);
const I32: TypeDescriptor = TypeDescriptor::Integer(IntSize::U4);
const F32: TypeDescriptor = TypeDescriptor::Float(FloatSize::U4);
const F64: TypeDescriptor = TypeDescriptor::Float(FloatSize::U8);

#[test]
fn written_snapshot_has_the_gadget4_layout() {
    let _hdf5 = hdf5_lock();
    let dir = tempfile::tempdir().unwrap();
    let cfg = format!(
        r#"name = "layout"
units = "galactic"
[ics]
model = "{}"
n = 300
[gravity]
softening = 0.1
[integrator]
t_end = 0.01
dt_max = 0.01
[output]
snapshot_potential = true
snapshot_acceleration = true
"#,
        repo("ics/dwarf_spheroid.toml").display()
    );
    let cfg = write(dir.path(), "run.toml", &cfg);
    let out = run_in(dir.path(), &["run", cfg.to_str().unwrap(), "--quiet"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = dir.path().join("runs/layout/snapshots/snap_001.hdf5");
    let f = hdf5::File::open(&path).unwrap();

    let h = f.group("Header").unwrap();
    for name in [
        "NumPart_ThisFile",
        "NumPart_Total",
        "NumPart_Total_HighWord",
    ] {
        assert_eq!(attr_type(&h, name), (U32, vec![6]), "{name}");
    }
    assert_eq!(attr_type(&h, "MassTable"), (F64, vec![6]));
    for name in [
        "Time",
        "Redshift",
        "BoxSize",
        "Omega0",
        "OmegaLambda",
        "HubbleParam",
    ] {
        assert_eq!(attr_type(&h, name), (F64, vec![]), "{name}");
    }
    for name in [
        "NumFilesPerSnapshot",
        "Flag_Sfr",
        "Flag_Cooling",
        "Flag_StellarAge",
        "Flag_Metals",
        "Flag_Feedback",
        "Flag_DoublePrecision",
    ] {
        assert_eq!(attr_type(&h, name), (I32, vec![]), "{name}");
    }
    let counts = h
        .attr("NumPart_ThisFile")
        .unwrap()
        .read_raw::<u32>()
        .unwrap();
    assert_eq!(counts, vec![0, 0, 0, 0, 300, 0]);
    assert_eq!(h.attr("Time").unwrap().read_scalar::<f64>().unwrap(), 0.01);
    assert_eq!(
        h.attr("NumFilesPerSnapshot")
            .unwrap()
            .read_scalar::<i32>()
            .unwrap(),
        1
    );

    let g = f.group("PartType4").unwrap();
    let datasets = [
        ("Coordinates", F32, vec![300, 3]),
        ("Velocities", F32, vec![300, 3]),
        ("Acceleration", F32, vec![300, 3]),
        ("ParticleIDs", U64, vec![300]),
        ("Masses", F64, vec![300]),
        ("Potential", F32, vec![300]),
    ];
    for (name, t, shape) in datasets {
        let ds = g.dataset(name).unwrap_or_else(|_| panic!("missing {name}"));
        assert_eq!((descriptor(ds.dtype()), ds.shape()), (t, shape), "{name}");
        // Every dataset is stored with a checksum, so damage fails the read.
        assert!(
            ds.filters().contains(&hdf5::filters::Filter::Fletcher32),
            "{name} has no Fletcher32 filter"
        );
    }
    let ids = g.dataset("ParticleIDs").unwrap().read_raw::<u64>().unwrap();
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "IDs sorted within the type"
    );

    let u = f.group("Units").unwrap();
    for name in [
        "Unit length in cgs (U_L)",
        "Unit mass in cgs (U_M)",
        "Unit time in cgs (U_t)",
        "Unit current in cgs (U_I)",
        "Unit temperature in cgs (U_T)",
    ] {
        assert_eq!(attr_type(&u, name), (F64, vec![]), "{name}");
    }
    let kpc = u
        .attr("Unit length in cgs (U_L)")
        .unwrap()
        .read_scalar::<f64>()
        .unwrap();
    assert!((kpc / 3.0857e21 - 1.0).abs() < 1e-4);
    let p = f.group("Parameters").unwrap();
    for name in [
        "UnitLength_in_cm",
        "UnitMass_in_g",
        "UnitVelocity_in_cm_per_s",
        "GravityConstantInternal",
    ] {
        assert_eq!(attr_type(&p, name), (F64, vec![]), "{name}");
    }
    // Fixed-length strings, as GADGET-4 writes them (a variable-length string would live in
    // HDF5's global heap, which has no checksum).
    assert!(matches!(
        attr_type(&p, "leapfmm_config").0,
        TypeDescriptor::FixedUnicode(n) if n > 100
    ));
    assert_eq!(attr_type(&p, "leapfmm.gravity.softening"), (F64, vec![]));

    // Round trip through the reader.
    let back = read_snapshot(&path).unwrap();
    assert_eq!(back.particles.len(), 300);
    assert_eq!(back.time, 0.01);
}

/// Writes a GADGET-2-style IC file the way other codes do: i32 counts, u32 IDs, f32
/// coordinates, PartType1 masses in MassTable only, and the given unit length.
fn write_foreign_ic(path: &Path, length_cm: f64, poison: Option<f32>) {
    let f = hdf5::File::create(path).unwrap();
    let h = f.create_group("Header").unwrap();
    let counts = [0i32, 200, 100, 0, 0, 0];
    for name in ["NumPart_ThisFile", "NumPart_Total"] {
        h.new_attr::<i32>()
            .shape(6)
            .create(name)
            .unwrap()
            .write_raw(&counts)
            .unwrap();
    }
    h.new_attr::<f64>()
        .shape(6)
        .create("MassTable")
        .unwrap()
        .write_raw(&[0.0, 0.005, 0.0, 0.0, 0.0, 0.0])
        .unwrap();
    h.new_attr::<f64>()
        .create("Time")
        .unwrap()
        .write_scalar(&0.0)
        .unwrap();
    h.new_attr::<i32>()
        .create("NumFilesPerSnapshot")
        .unwrap()
        .write_scalar(&1)
        .unwrap();
    let par = f.create_group("Parameters").unwrap();
    for (name, v) in [
        ("UnitLength_in_cm", length_cm),
        ("UnitMass_in_g", 1.989e43),
        ("UnitVelocity_in_cm_per_s", 1e5),
    ] {
        par.new_attr::<f64>()
            .create(name)
            .unwrap()
            .write_scalar(&v)
            .unwrap();
    }
    let mut s = 99u64;
    let mut rnd = move || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((s >> 11) as f64 / (1u64 << 53) as f64 - 0.5) as f32
    };
    for (pt, n, first_id) in [(1usize, 200usize, 1000u32), (2, 100, 5000)] {
        let g = f.create_group(&format!("PartType{pt}")).unwrap();
        let mut pos: Vec<f32> = (0..3 * n).map(|_| 20.0 * rnd()).collect();
        if pt == 2
            && let Some(bad) = poison
        {
            pos[3 * 17 + 1] = bad;
        }
        let vel: Vec<f32> = (0..3 * n).map(|_| 50.0 * rnd()).collect();
        let ids: Vec<u32> = (0..n as u32).map(|i| first_id + i).collect();
        g.new_dataset::<f32>()
            .shape((n, 3))
            .create("Coordinates")
            .unwrap()
            .write_raw(&pos)
            .unwrap();
        g.new_dataset::<f32>()
            .shape((n, 3))
            .create("Velocities")
            .unwrap()
            .write_raw(&vel)
            .unwrap();
        g.new_dataset::<u32>()
            .shape(n)
            .create("ParticleIDs")
            .unwrap()
            .write_raw(&ids)
            .unwrap();
        if pt == 2 {
            g.new_dataset::<f32>()
                .shape(n)
                .create("Masses")
                .unwrap()
                .write_raw(&vec![0.002f32; n])
                .unwrap();
        }
    }
    f.close().unwrap();
}

fn file_run_config(dir: &Path, ic: &Path) -> std::path::PathBuf {
    let cfg = format!(
        r#"name = "foreign"
units = "galactic"
[ics]
file = "{}"
[gravity]
softening = 0.2
[integrator]
t_end = 0.004
dt_max = 0.002
"#,
        ic.display()
    );
    write(dir, "run.toml", &cfg)
}

#[test]
fn a_run_starts_from_another_codes_gadget_file() {
    let _hdf5 = hdf5_lock();
    let dir = tempfile::tempdir().unwrap();
    let ic = dir.path().join("foreign_ic.hdf5");
    write_foreign_ic(&ic, 3.085678e21, None);
    let cfg = file_run_config(dir.path(), &ic);
    let out = run_in(dir.path(), &["run", cfg.to_str().unwrap(), "--quiet"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let snap = read_snapshot(&dir.path().join("runs/foreign/snapshots/snap_000.hdf5")).unwrap();
    let p = &snap.particles;
    assert_eq!(p.len(), 300);
    let halo = p.indices_of(leapfmm::particles::Component::Halo);
    let disk = p.indices_of(leapfmm::particles::Component::Disk);
    assert_eq!((halo.len(), disk.len()), (200, 100));
    assert!(halo.iter().all(|&i| p.mass[i] == 0.005), "MassTable masses");
    assert!(
        disk.iter().all(|&i| (p.mass[i] - 0.002).abs() < 1e-9),
        "Masses dataset"
    );
    assert_eq!(halo.iter().map(|&i| p.id[i]).min(), Some(1000));
    let info = run_in(dir.path(), &["info", ic.to_str().unwrap()]);
    assert!(info.status.success());
    let text = String::from_utf8_lossy(&info.stdout);
    assert!(text.contains("halo (PartType1): 200 particles"), "{text}");
}

#[test]
fn foreign_units_are_converted_to_the_runs() {
    let _hdf5 = hdf5_lock();
    let dir = tempfile::tempdir().unwrap();
    let ic = dir.path().join("mpc_ic.hdf5");
    write_foreign_ic(&ic, 3.085678e24, None); // lengths in Mpc
    let original = read_snapshot(&ic).unwrap();
    let cfg = file_run_config(dir.path(), &ic);
    let out = run_in(dir.path(), &["run", cfg.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("converting from the file's units"));
    let snap = read_snapshot(&dir.path().join("runs/foreign/snapshots/snap_000.hdf5")).unwrap();
    let extent =
        |p: &leapfmm::particles::Particles| p.pos.iter().map(|x| x[0].abs()).fold(0.0, f64::max);
    let ratio = extent(&snap.particles) / extent(&original.particles);
    assert!(
        (ratio / 1000.0 - 1.0).abs() < 1e-3,
        "Mpc -> kpc scaling {ratio}"
    );
}

#[test]
fn non_finite_values_in_an_ic_file_are_rejected_by_name() {
    let _hdf5 = hdf5_lock();
    for bad in [f32::NAN, f32::INFINITY] {
        let dir = tempfile::tempdir().unwrap();
        let ic = dir.path().join("bad_ic.hdf5");
        write_foreign_ic(&ic, 3.085678e21, Some(bad));
        let cfg = file_run_config(dir.path(), &ic);
        let out = run_in(dir.path(), &["run", cfg.to_str().unwrap(), "--quiet"]);
        assert_eq!(out.status.code(), Some(1));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
        assert!(
            err.contains("bad_ic.hdf5") && err.contains("PartType2/Coordinates[17]"),
            "{err}"
        );
        assert!(
            !dir.path()
                .join("runs/foreign/snapshots/snap_000.hdf5")
                .exists()
        );
    }
}

#[test]
fn analyze_reads_another_codes_file_with_masstable_masses() {
    let dir = tempfile::tempdir().unwrap();
    let ic = dir.path().join("foreign.hdf5");
    {
        let _guard = hdf5_lock();
        write_foreign_ic(&ic, 3.085678e21, None);
    }
    let out = run_in(dir.path(), &["analyze", ic.to_str().unwrap(), "-o", "an"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The disk (PartType2, 100 particles) is analysed; the halo's MassTable masses count in
    // the circular velocity.
    let profile = std::fs::read_to_string(dir.path().join("an/profile_000.csv")).unwrap();
    let rows: Vec<Vec<f64>> = profile
        .lines()
        .skip(1)
        .map(|l| l.split(',').map(|v| v.parse().unwrap()).collect())
        .collect();
    let disk_count: f64 = rows.iter().map(|r| r[1]).sum();
    assert!(disk_count > 50.0 && disk_count <= 100.0, "{disk_count}");
    assert!(rows.iter().any(|r| r[8] > 0.0), "no halo circular velocity");
    assert!(dir.path().join("an/faceon_000.png").is_file());
}

/// A header of `count` PartType1 particles (i64 counts) of mass `mass` over `files` files.
fn write_header(f: &hdf5::File, count: i64, mass: f64, files: i32) {
    let h = f.create_group("Header").unwrap();
    h.new_attr::<i64>()
        .shape(6)
        .create("NumPart_ThisFile")
        .unwrap()
        .write_raw(&[0, count, 0, 0, 0, 0])
        .unwrap();
    h.new_attr::<f64>()
        .shape(6)
        .create("MassTable")
        .unwrap()
        .write_raw(&[0.0, mass, 0.0, 0.0, 0.0, 0.0])
        .unwrap();
    h.new_attr::<i32>()
        .create("NumFilesPerSnapshot")
        .unwrap()
        .write_scalar(&files)
        .unwrap();
}

/// A small GADGET file whose header lies: `count` particles of PartType1 declared,
/// `stored` actually written (or, with `unwritten`, chunked datasets of `count` rows with no
/// chunk ever written), over `files` files.
fn write_crafted(path: &Path, count: i64, stored: usize, unwritten: bool, files: i32) {
    let _guard = hdf5_lock();
    let f = hdf5::File::create(path).unwrap();
    write_header(&f, count, 0.001, files);
    let g = f.create_group("PartType1").unwrap();
    let rows = if unwritten { count as usize } else { stored };
    for name in ["Coordinates", "Velocities"] {
        let b = g.new_dataset::<f64>().shape((rows, 3));
        if unwritten {
            b.chunk((1000, 3)).create(name).unwrap();
        } else {
            let v: Vec<f64> = (0..3 * rows).map(|i| (i % 97) as f64 * 0.01).collect();
            b.create(name).unwrap().write_raw(&v).unwrap();
        }
    }
    let b = g.new_dataset::<u64>().shape(rows);
    if unwritten {
        b.chunk(1000).create("ParticleIDs").unwrap();
    } else {
        let ids: Vec<u64> = (0..rows as u64).collect();
        b.create("ParticleIDs").unwrap().write_raw(&ids).unwrap();
    }
    f.close().unwrap();
}

#[test]
fn header_counts_are_bounded_by_what_the_file_holds() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cases: [(&str, i64, usize, bool, i32, &str); 4] = [
        (
            "files.0.hdf5",
            1000,
            1000,
            false,
            1_000_000_000,
            "Header/NumFilesPerSnapshot = 1000000000 but",
        ),
        (
            "unwritten.hdf5",
            300_000_000,
            0,
            true,
            1,
            "PartType1/Coordinates declares 900000000 values",
        ),
        (
            "short.hdf5",
            300_000_000,
            100,
            false,
            1,
            "PartType1/Coordinates has shape [100, 3], expected [300000000, 3]",
        ),
        (
            "negative.hdf5",
            -1000,
            1000,
            false,
            1,
            "Header/NumPart_ThisFile[1] = -1000: a particle count cannot be negative",
        ),
    ];
    for (name, count, stored, unwritten, files, needle) in cases {
        let path = d.join(name);
        write_crafted(&path, count, stored, unwritten, files);
        assert!(std::fs::metadata(&path).unwrap().len() < 100_000);
        for cmd in ["info", "forces"] {
            let out = d.join("forces.hdf5");
            let mut args = vec![cmd, path.to_str().unwrap()];
            if cmd == "forces" {
                args.extend(["-o", out.to_str().unwrap()]);
            }
            let m = run_measured(d, &args);
            assert_eq!(m.code, Some(1), "{cmd} {name}: {}", m.stderr);
            assert!(m.stderr.contains(needle), "{cmd} {name}: {}", m.stderr);
            assert!(
                m.stderr.contains(path.to_str().unwrap()),
                "names the file: {}",
                m.stderr
            );
            assert!(
                m.wall.as_secs_f64() < 2.0 && m.peak_rss < 100 << 20,
                "{cmd} {name}: {:?}, peak RSS {} MB",
                m.wall,
                m.peak_rss >> 20
            );
        }
    }
}

/// An N-body-unit IC file of `n` particles in a unit cube, IDs from 100, with `edit`
/// applied to positions and velocities.
fn write_ic(path: &Path, n: usize, edit: impl FnOnce(&mut [[f64; 3]], &mut [[f64; 3]])) {
    let _guard = hdf5_lock();
    let mut s = 5u64;
    let mut rnd = move || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (s >> 11) as f64 / (1u64 << 53) as f64 - 0.5
    };
    let mut pos: Vec<[f64; 3]> = (0..n).map(|_| [rnd(), rnd(), rnd()]).collect();
    let mut vel = vec![[0.0; 3]; n];
    edit(&mut pos, &mut vel);
    let f = hdf5::File::create(path).unwrap();
    write_header(&f, n as i64, 1.0 / n as f64, 1);
    let g = f.create_group("PartType1").unwrap();
    for (name, v) in [("Coordinates", &pos), ("Velocities", &vel)] {
        g.new_dataset::<f64>()
            .shape((n, 3))
            .create(name)
            .unwrap()
            .write_raw(v.as_flattened())
            .unwrap();
    }
    let ids: Vec<u64> = (100..100 + n as u64).collect();
    g.new_dataset::<u64>()
        .shape(n)
        .create("ParticleIDs")
        .unwrap()
        .write_raw(&ids)
        .unwrap();
    f.close().unwrap();
}

#[test]
fn a_particle_far_out_is_refused_by_forces_and_stops_a_run_before_its_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // forces: one particle at |x| = 1e40 made every force NaN, exit 0.
    let far = d.join("far.hdf5");
    write_ic(&far, 1000, |pos, _| pos[17] = [1e40, 0.0, 0.0]);
    let out = run_in(
        d,
        &["forces", "far.hdf5", "-o", "f.hdf5", "--softening", "0.05"],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("far.hdf5") && err.contains("particle 117 is at (1e40, 0, 0)"),
        "{err}"
    );
    assert!(!d.join("f.hdf5").exists());
    // run: a particle launched at 1e20 leaves the range in its first drift; the run stops
    // there and no snapshot holds the bad state.
    let ic = d.join("fast.hdf5");
    write_ic(&ic, 1000, |_, vel| vel[3] = [1e20, 0.0, 0.0]);
    let cfg = format!(
        "name = \"fast\"\noutput_dir = \"runs\"\nunits = \"nbody\"\n[ics]\nfile = \"{}\"\n[gravity]\nsolver = \"fmm\"\nsoftening = 0.05\n[integrator]\nt_end = 0.1\ndt_max = 0.05\nfixed_step = true\n[output]\nsnapshot_interval = 0.05\n",
        ic.display()
    );
    let cfg = write(d, "fast.toml", &cfg);
    let out = run_in(d, &["run", cfg.to_str().unwrap(), "--quiet"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("particle 103 is at (5e18, ") && err.contains("beyond |x| = 1e15"),
        "{err}"
    );
    let snaps = d.join("runs/fast/snapshots");
    assert!(snaps.join("snap_000.hdf5").exists());
    assert!(!snaps.join("snap_001.hdf5").exists(), "no snapshot after");
}

#[test]
fn datasets_are_checked_by_shape_and_headers_by_value() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let n = 1000usize;
    // (name, dataset, shape, needle)
    let cases: [(&str, &str, Vec<usize>, &str); 4] = [
        (
            "transposed",
            "Coordinates",
            vec![3, n],
            "PartType1/Coordinates has shape [3, 1000], expected [1000, 3]",
        ),
        (
            "flat",
            "Velocities",
            vec![3 * n],
            "PartType1/Velocities has shape [3000], expected [1000, 3]",
        ),
        (
            "fours",
            "Coordinates",
            vec![3 * n / 4, 4],
            "PartType1/Coordinates has shape [750, 4], expected [1000, 3]",
        ),
        (
            "ids2d",
            "ParticleIDs",
            vec![n, 1],
            "PartType1/ParticleIDs has shape [1000, 1], expected [1000]",
        ),
    ];
    for (name, dataset, shape, needle) in cases {
        let path = d.join(format!("{name}.hdf5"));
        write_ic(&path, n, |_, _| {});
        {
            let _guard = hdf5_lock();
            let f = hdf5::File::open_rw(&path).unwrap();
            let g = f.group("PartType1").unwrap();
            let values: usize = shape.iter().product();
            g.unlink(dataset).unwrap();
            if dataset == "ParticleIDs" {
                let ids: Vec<u64> = (100..100 + values as u64).collect();
                g.new_dataset::<u64>()
                    .shape(shape.clone())
                    .create(dataset)
                    .unwrap()
                    .write_raw(&ids)
                    .unwrap();
            } else {
                let v: Vec<f64> = (0..values).map(|i| i as f64 * 1e-3).collect();
                g.new_dataset::<f64>()
                    .shape(shape.clone())
                    .create(dataset)
                    .unwrap()
                    .write_raw(&v)
                    .unwrap();
            }
        }
        for cmd in ["info", "forces", "analyze"] {
            if cmd == "forces" && dataset == "Velocities" {
                continue; // forces does not read velocities
            }
            let mut args = vec![cmd, path.to_str().unwrap()];
            if cmd == "forces" {
                args.extend(["--softening", "0.05"]);
            }
            let out = run_in(d, &args);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{cmd} {name}: {err}");
            assert!(
                err.contains(needle) && err.contains(&format!("{name}.hdf5")),
                "{cmd} {name}: {err}"
            );
        }
    }
    // NumPart_Total disagreeing with the file, and a NaN time.
    for (name, attr, needle) in [
        (
            "total",
            "NumPart_Total",
            "Header/NumPart_Total[1] = 999 but the 1 file(s) hold 1000",
        ),
        ("time", "Time", "Header/Time = NaN: it must be finite"),
    ] {
        let path = d.join(format!("{name}.hdf5"));
        write_ic(&path, n, |_, _| {});
        {
            let _guard = hdf5_lock();
            let f = hdf5::File::open_rw(&path).unwrap();
            let h = f.group("Header").unwrap();
            if attr == "Time" {
                h.new_attr::<f64>()
                    .create("Time")
                    .unwrap()
                    .write_scalar(&f64::NAN)
                    .unwrap();
            } else {
                h.new_attr::<i64>()
                    .shape(6)
                    .create(attr)
                    .unwrap()
                    .write_raw(&[0i64, 999, 0, 0, 0, 0])
                    .unwrap();
            }
        }
        let out = run_in(d, &["info", path.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{name}: {err}");
        assert!(err.contains(needle), "{name}: {err}");
    }
}

#[test]
fn unit_attributes_must_be_positive_finite_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let units = |path: &Path, mass: Option<f64>, label: Option<&str>| {
        let _guard = hdf5_lock();
        let f = hdf5::File::open_rw(path).unwrap();
        let g = f.create_group("Units").unwrap();
        if let Some(label) = label {
            let s: hdf5::types::VarLenUnicode = label.parse().unwrap();
            g.new_attr::<hdf5::types::VarLenUnicode>()
                .create("UnitSystem")
                .unwrap()
                .write_scalar(&s)
                .unwrap();
        }
        for (name, v) in [
            ("Unit length in cgs (U_L)", 3.085678e21),
            ("Unit time in cgs (U_t)", 3.085678e16),
        ] {
            g.new_attr::<f64>()
                .create(name)
                .unwrap()
                .write_scalar(&v)
                .unwrap();
        }
        match mass {
            Some(m) => g
                .new_attr::<f64>()
                .create("Unit mass in cgs (U_M)")
                .unwrap()
                .write_scalar(&m)
                .unwrap(),
            None => {
                let s: hdf5::types::VarLenUnicode = "heavy".parse().unwrap();
                g.new_attr::<hdf5::types::VarLenUnicode>()
                    .create("Unit mass in cgs (U_M)")
                    .unwrap()
                    .write_scalar(&s)
                    .unwrap()
            }
        }
    };
    let run_cfg = |name: &str, ic: &Path, system: &str| {
        let text = format!(
            "name = \"{name}\"\noutput_dir = \"runs\"\nunits = \"{system}\"\n[ics]\nfile = \"{}\"\n[gravity]\nsoftening = 0.05\n[integrator]\nt_end = 0.1\ndt_max = 0.05\n",
            ic.display()
        );
        write(d, &format!("{name}.toml"), &text)
    };
    for (k, (mass, needle)) in [
        (
            Some(-1.989e43),
            "/Units/Unit mass in cgs (U_M) = -1.989e43: a unit must be a positive, finite number",
        ),
        (
            Some(0.0),
            "/Units/Unit mass in cgs (U_M) = 0: a unit must be",
        ),
        (
            Some(f64::NAN),
            "/Units/Unit mass in cgs (U_M) = NaN: a unit must be",
        ),
        (None, "/Units/Unit mass in cgs (U_M) is not a number"),
    ]
    .into_iter()
    .enumerate()
    {
        let ic = d.join(format!("units{k}.hdf5"));
        write_ic(&ic, 100, |_, _| {});
        units(&ic, mass, None);
        let name = format!("u{k}");
        let cfg = run_cfg(&name, &ic, "galactic");
        for args in [
            vec!["info", ic.to_str().unwrap()],
            vec!["run", cfg.to_str().unwrap(), "--quiet"],
        ] {
            let out = run_in(d, &args);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
            assert!(err.contains(needle), "{args:?}: {err}");
        }
        assert!(
            !d.join("runs")
                .join(&name)
                .join("snapshots/snap_000.hdf5")
                .exists()
        );
    }
    // A file labelled N-body in a galactic run gets a note.
    let ic = d.join("nbody.hdf5");
    write_ic(&ic, 100, |_, _| {});
    units(&ic, Some(1.0), Some("nbody"));
    let out = run_in(
        d,
        &[
            "run",
            run_cfg("labelled", &ic, "galactic").to_str().unwrap(),
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("the file is in N-body units (G = 1), but the run uses 'galactic' units"),
        "{err}"
    );
}

/// A small deterministic generator for damage positions (xorshift64*).
struct Damage(u64);

impl Damage {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Flips one bit (even trials) or zero-fills 8–64 bytes (odd trials) of `bytes`.
    fn apply(&mut self, trial: usize, bytes: &mut [u8]) {
        let at = (self.next() % bytes.len() as u64) as usize;
        if trial.is_multiple_of(2) {
            bytes[at] ^= 1 << (self.next() % 8);
        } else {
            let len = 8 + (self.next() % 57) as usize;
            let end = (at + len).min(bytes.len());
            bytes[at..end].fill(0);
        }
    }
}

#[test]
fn damage_to_a_snapshot_is_refused_or_leaves_every_value_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let out = run_in(
        d,
        &[
            "ics",
            repo("ics/small_disk.toml").to_str().unwrap(),
            "--n",
            "3000",
            "-o",
            "ic.hdf5",
        ],
    );
    assert!(out.status.success());
    let clean = std::fs::read(d.join("ic.hdf5")).unwrap();
    let _hdf5 = hdf5_lock();
    let original = read_snapshot(&d.join("ic.hdf5")).unwrap();
    let damaged = d.join("damaged.hdf5");
    let trials: usize = std::env::var("DAMAGE_TRIALS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(400);
    let mut damage = Damage(0x9E37_79B9_7F4A_7C15);
    let (mut refused, mut unchanged) = (0, 0);
    for trial in 0..trials {
        let mut bytes = clean.clone();
        damage.apply(trial, &mut bytes);
        if bytes == clean {
            continue;
        }
        std::fs::write(&damaged, &bytes).unwrap();
        match read_snapshot(&damaged) {
            Err(e) => {
                let message = e.to_string();
                assert!(
                    message.contains("damaged.hdf5") && !message.contains('\n'),
                    "{message}"
                );
                if message.contains("Fletcher32") {
                    // A damaged dataset is named, with what to do.
                    assert!(
                        message.contains("PartType") && message.contains("is damaged"),
                        "{message}"
                    );
                }
                refused += 1;
            }
            Ok(read) => {
                // Accepted only when the damage missed everything the reader uses.
                assert!(
                    read.particles == original.particles
                        && read.time.to_bits() == original.time.to_bits()
                        && read.units == original.units
                        && read.nbody == original.nbody,
                    "trial {trial}: damaged data accepted"
                );
                unchanged += 1;
            }
        }
    }
    println!("{trials} damages: {refused} refused, {unchanged} read with every value unchanged");
    assert!(refused > trials / 4, "{refused} of {trials} refused");
}
