//! `leapfmm bench`: FMM cost and accuracy on standard workloads, plus an accuracy–cost scan
//! over order and opening angle. Prints Markdown tables (and JSON with `--json`).

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use leapfmm::config::Precision;
use leapfmm::config::{DEFAULT_ACCURACY, DEFAULT_LEAF_SIZE, DEFAULT_THETA, default_order};
use leapfmm::fmm::caps::CapsPolicy;
use leapfmm::fmm::p2p::NearFieldPrecision;
use leapfmm::fmm::solver::{Evaluation, expected_accelerations};
use leapfmm::fmm::{FmmSettings, FmmSolver};
use leapfmm::gravity::accuracy::{Reference, sample_indices, tail_indices};
use leapfmm::gravity::{Softening, SofteningKernel};
use leapfmm::io::snapshot::{SnapshotInfo, write_snapshot};
use leapfmm::memory::{peak_rss_bytes, reset_peak_rss};
use leapfmm::units::UnitSystem;
use leapfmm::workloads::Workload;
use serde::Serialize;
use std::path::PathBuf;
use std::time::Instant;

/// Arguments of `leapfmm bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Workloads to run.
    #[arg(long, value_enum, default_value_t = WorkloadArg::Both)]
    workload: WorkloadArg,
    /// Particle counts (`--sizes 10000 50000` or `--sizes 10000,50000`).
    #[arg(long, num_args = 1.., value_delimiter = ',', allow_negative_numbers = true,
          value_parser = super::particle_count, default_values_t = [10_000u64, 100_000, 1_000_000])]
    sizes: Vec<u64>,
    /// Also run N = 1e7.
    #[arg(long)]
    large: bool,
    /// Expansion order [default: 7, or 9 with --accuracy].
    #[arg(long)]
    order: Option<usize>,
    /// Opening angle parameter.
    #[arg(long, default_value_t = DEFAULT_THETA)]
    theta: f64,
    /// Relative force error the MAC aims for (0: the geometric MAC of --theta alone).
    #[arg(long, default_value_t = DEFAULT_ACCURACY)]
    accuracy: f64,
    /// Leaf size.
    #[arg(long, default_value_t = DEFAULT_LEAF_SIZE)]
    leaf_size: usize,
    /// Particles compared with direct summation per case.
    #[arg(long, default_value_t = 1000)]
    compare_direct: usize,
    /// Also compare on this many particles with the weakest forces and as many farthest
    /// from the centre, where errors concentrate (the "+ tail" columns).
    #[arg(long, default_value_t = 500)]
    tail: usize,
    /// Also print the accuracy–cost table over order and θ (disk-in-halo).
    #[arg(long)]
    scan: bool,
    /// Particle count of the scan.
    #[arg(long, default_value_t = 100_000)]
    scan_n: usize,
    /// Skip the size table (with --scan: only the scan).
    #[arg(long)]
    no_sizes: bool,
    /// Write all results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Instead of measuring, write the particle set of the (single) --workload at the first
    /// of --sizes to this GADGET-4 HDF5 file (f64), e.g. for benches/peers.py.
    #[arg(long)]
    export: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum WorkloadArg {
    Plummer,
    DiskInHalo,
    /// Plummer and disk-in-halo.
    Both,
    HernquistCusp,
    TruncatedHalo,
    TwoGalaxies,
    UniformCube,
    Clump,
    /// The six distributions of the accuracy test set (plummer, hernquist-cusp,
    /// truncated-halo, two-galaxies, uniform-cube, clump).
    TestSet,
}

/// One measured case.
#[derive(Debug, Clone, Serialize)]
struct Case {
    workload: &'static str,
    n: usize,
    order: usize,
    theta: f64,
    accuracy: f64,
    leaf_size: usize,
    near_field: &'static str,
    seconds: f64,
    particles_per_second: f64,
    first_evaluation_retries: usize,
    m2l_pairs: usize,
    p2p_interactions: u64,
    median: f64,
    p99: f64,
    max: f64,
    agg_l2: f64,
    /// p99 and max over the random particles and the tail together.
    p99_with_tail: f64,
    max_with_tail: f64,
    peak_rss_bytes: Option<u64>,
}

/// The solver settings a case measures.
#[derive(Debug, Clone, Copy)]
struct Knobs {
    order: usize,
    theta: f64,
    accuracy: f64,
    leaf: usize,
    near: NearFieldPrecision,
}

/// One case: two evaluations (the first finds the caps and the accelerations to expect),
/// the second timed, as a run's step is; errors against direct summation on `compare_m`
/// random particles and, with them, the `tail`.
fn measure(w: Workload, n: usize, knobs: Knobs, (compare_m, tail): (usize, usize)) -> Result<Case> {
    let Knobs {
        order,
        theta,
        accuracy,
        leaf,
        near,
    } = knobs;
    let p = w.particles(n, 1);
    let softening = Softening {
        kernel: SofteningKernel::Spline,
        epsilon: w.softening(n),
    };
    let settings = FmmSettings {
        order,
        theta,
        accuracy,
        leaf_size: leaf,
        softening,
        g: w.g(),
        near_field: near,
        caps_policy: CapsPolicy::default(),
    };
    reset_peak_rss();
    let mut solver = FmmSolver::new(settings, None);
    let mut acc = vec![[0.0; 3]; n];
    let mut pot = vec![0.0; n];
    let first = solver.evaluate(&p.pos, &p.mass, &p.id, &mut acc, &mut pot)?;
    let expected = expected_accelerations(&acc);
    let with = Evaluation {
        expected_accel: Some(&expected),
        ..Evaluation::default()
    };
    let start = Instant::now();
    let stats = solver.evaluate_with(&p.pos, &p.mass, &p.id, with, &mut acc, &mut pot)?;
    let seconds = start.elapsed().as_secs_f64();
    let peak = peak_rss_bytes();
    let random = sample_indices(n, compare_m, 7);
    let tail = tail_indices(&p.pos, &p.mass, &acc, tail);
    let reference = Reference::at(&p.pos, &p.mass, &[&random, &tail], w.g(), softening);
    let e = reference.compare(&acc, &random);
    let with_tail = reference.compare(&acc, reference.indices());
    Ok(Case {
        workload: w.name(),
        n,
        order,
        theta,
        accuracy,
        leaf_size: leaf,
        near_field: match near {
            NearFieldPrecision::Mixed => "mixed",
            NearFieldPrecision::Double => "double",
        },
        seconds,
        particles_per_second: n as f64 / seconds,
        first_evaluation_retries: first.retries,
        m2l_pairs: stats.used.m2l_pairs,
        p2p_interactions: stats.p2p_interactions,
        median: e.median,
        p99: e.p99,
        max: e.max,
        agg_l2: e.agg_l2,
        p99_with_tail: with_tail.p99,
        max_with_tail: with_tail.max,
        peak_rss_bytes: peak,
    })
}

fn print_header() {
    println!(
        "| workload | N | p | θ | accuracy | leaf | near field | s/eval | particles/s | median | p99 | max | aggL2 | p99 + tail | max + tail | peak RSS (B/particle) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
}

fn print_row(c: &Case) {
    let rss = c
        .peak_rss_bytes
        .map(|b| format!("{:.0} MB ({:.0})", b as f64 / 1e6, b as f64 / c.n as f64))
        .unwrap_or_else(|| "?".into());
    println!(
        "| {} | {:.0e} | {} | {} | {} | {} | {} | {:.3} | {:.3e} | {:.2e} | {:.2e} | {:.2e} | {:.2e} | {:.2e} | {:.2e} | {rss} |",
        c.workload,
        c.n as f64,
        c.order,
        c.theta,
        if c.accuracy > 0.0 {
            format!("{:.0e}", c.accuracy)
        } else {
            "-".into()
        },
        c.leaf_size,
        c.near_field,
        c.seconds,
        c.particles_per_second,
        c.median,
        c.p99,
        c.max,
        c.agg_l2,
        c.p99_with_tail,
        c.max_with_tail
    );
}

/// Runs the requested tables.
pub fn execute(args: BenchArgs) -> Result<()> {
    let workloads: Vec<Workload> = match args.workload {
        WorkloadArg::Plummer => vec![Workload::Plummer],
        WorkloadArg::DiskInHalo => vec![Workload::DiskInHalo],
        WorkloadArg::Both => vec![Workload::Plummer, Workload::DiskInHalo],
        WorkloadArg::HernquistCusp => vec![Workload::HernquistCusp],
        WorkloadArg::TruncatedHalo => vec![Workload::TruncatedHalo],
        WorkloadArg::TwoGalaxies => vec![Workload::TwoGalaxies],
        WorkloadArg::UniformCube => vec![Workload::UniformCube],
        WorkloadArg::Clump => vec![Workload::Clump],
        WorkloadArg::TestSet => Workload::TEST_SET.to_vec(),
    };
    let mut sizes: Vec<usize> = args.sizes.iter().map(|&n| n as usize).collect();
    if let Some(path) = &args.export {
        return export(path, &workloads, &sizes);
    }
    if args.large {
        sizes.push(10_000_000);
    }
    println!("threads: {}", rayon::current_num_threads());
    let mut cases = Vec::new();
    if !args.no_sizes {
        println!("\n## Cost and accuracy by size (second evaluation; the first finds the caps)\n");
        print_header();
        for &w in &workloads {
            for &n in &sizes {
                let knobs = Knobs {
                    order: args.order.unwrap_or_else(|| default_order(args.accuracy)),
                    theta: args.theta,
                    accuracy: args.accuracy,
                    leaf: args.leaf_size,
                    near: NearFieldPrecision::Mixed,
                };
                let c = measure(w, n, knobs, (args.compare_direct, args.tail))?;
                print_row(&c);
                cases.push(c);
            }
        }
    }
    if args.scan {
        println!(
            "\n## Accuracy–cost scan (disk-in-halo, N = {})\n",
            args.scan_n
        );
        print_header();
        for order in [2, 4, 6, 8] {
            for theta in [0.4, 0.5, 0.6, 0.7, 0.8] {
                let knobs = Knobs {
                    order,
                    theta,
                    accuracy: 0.0,
                    leaf: args.leaf_size,
                    near: NearFieldPrecision::Mixed,
                };
                let c = measure(
                    Workload::DiskInHalo,
                    args.scan_n,
                    knobs,
                    (args.compare_direct, args.tail),
                )?;
                print_row(&c);
                cases.push(c);
            }
        }
        for theta in [0.4, 0.5] {
            let knobs = Knobs {
                order: 8,
                theta,
                accuracy: 0.0,
                leaf: args.leaf_size,
                near: NearFieldPrecision::Double,
            };
            let c = measure(
                Workload::DiskInHalo,
                args.scan_n,
                knobs,
                (args.compare_direct, args.tail),
            )?;
            print_row(&c);
            cases.push(c);
        }
    }
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&cases)?;
        std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

/// Writes one workload's particle set as a snapshot (units and softening recorded).
fn export(path: &std::path::Path, workloads: &[Workload], sizes: &[usize]) -> Result<()> {
    let (&w, &n) = match (workloads, sizes.first()) {
        ([w], Some(n)) => (w, n),
        _ => anyhow::bail!("--export needs one --workload (not both or test-set) and a size"),
    };
    let particles = w.particles(n, 1);
    let units = if w.galactic() {
        UnitSystem::Galactic
    } else {
        UnitSystem::Nbody
    };
    let info = SnapshotInfo {
        parameters: vec![(
            "gravity.softening".into(),
            toml::Value::Float(w.softening(n)),
        )],
        softening: Some([w.softening(n); 4]),
        ..SnapshotInfo::new(0.0, units, Precision::Double)
    };
    write_snapshot(path, &particles, &info)?;
    eprintln!(
        "wrote the {} set with {n} particles to {}",
        w.name(),
        path.display()
    );
    Ok(())
}
