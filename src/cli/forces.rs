//! `leapfmm forces SNAPSHOT [--order P --theta T --leaf-size L --softening E]
//! [-o OUT.hdf5] [--compare-direct M] [--ranks K]`: FMM accelerations and potentials of a
//! snapshot, on one rank or distributed over K thread ranks.

use anyhow::{Context, Result, bail};
use clap::builder::TypedValueParser;
use clap::{Args, ValueEnum};
use leapfmm::config::{DEFAULT_ACCURACY, DEFAULT_LEAF_SIZE, DEFAULT_THETA, default_order};
#[cfg(any(feature = "mpi", feature = "cuda"))]
use leapfmm::distributed::comm::Communicator;
#[cfg(feature = "mpi")]
use leapfmm::distributed::driver::evaluate_share;
use leapfmm::distributed::driver::{GatheredForces, evaluate_on_thread_ranks};
#[cfg(feature = "mpi")]
use leapfmm::distributed::mpi_rank::MpiRank;
use leapfmm::distributed::stats::RankFigures;
use leapfmm::fmm::caps::CapsPolicy;
use leapfmm::fmm::expansion::MAX_ORDER;
use leapfmm::fmm::p2p::NearFieldPrecision;
use leapfmm::fmm::presets::PresetsStore;
use leapfmm::fmm::solver::{Evaluation, expected_accelerations};
use leapfmm::fmm::{FmmSettings, FmmSolver};
use leapfmm::gravity::accuracy::{AccuracyStats, Reference, sample_indices, tail_indices};
use leapfmm::gravity::{GravitySolver, Softening, SofteningKernel};
use leapfmm::io::snapshot::{
    SnapshotData, Velocities, read_parameter_f64, read_parameter_string, read_snapshot_with,
    write_forces,
};
use leapfmm::particles::Particles;
use std::path::PathBuf;
use std::time::Instant;

/// Arguments of `leapfmm forces`.
#[derive(Debug, Args)]
pub struct ForcesArgs {
    /// GADGET-format HDF5 snapshot (multi-file: give the .0.hdf5 file).
    snapshot: PathBuf,
    /// Expansion order p [default: 7, or 9 with --accuracy].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=MAX_ORDER as i64).map(|v| v as usize))]
    order: Option<usize>,
    /// Opening angle parameter θ (0 < θ < 1).
    #[arg(long, default_value_t = DEFAULT_THETA, value_parser = parse_theta)]
    theta: f64,
    /// Relative force error the MAC aims for, in every particle's force (default 1e-3; 0:
    /// the geometric MAC of --theta alone, which `--backend cuda` uses when none is given)
    #[arg(long, value_parser = parse_accuracy)]
    accuracy: Option<f64>,
    /// Most particles per leaf.
    #[arg(long, default_value_t = DEFAULT_LEAF_SIZE, value_parser = clap::value_parser!(u32).range(1..=65536).map(|v| v as usize))]
    leaf_size: usize,
    /// Softening length (0 = Newtonian); default: the run's, recorded in the snapshot.
    #[arg(long, value_parser = parse_softening)]
    softening: Option<f64>,
    /// Softening kernel; default: the run's, or spline.
    #[arg(long, value_enum)]
    kernel: Option<KernelArg>,
    /// Near-field precision.
    #[arg(long, value_enum, default_value_t = NearArg::Mixed)]
    near_field: NearArg,
    /// Write a copy with the forces here instead of adding them to SNAPSHOT.
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// Compare with direct summation on this many random particles.
    #[arg(long)]
    compare_direct: Option<usize>,
    /// Seed of the particles chosen for --compare-direct.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// With --compare-direct: also compare on this many particles with the weakest forces
    /// and as many farthest from the centre, where errors concentrate (0: none).
    #[arg(long, default_value_t = 500)]
    tail: usize,
    /// Evaluate this many times and report each (the first finds the buffer capacities).
    #[arg(long, default_value_t = 1, allow_negative_numbers = true, value_parser = clap::value_parser!(u32).range(1..=1000).map(|v| v as usize))]
    repeat: usize,
    /// Caps presets file to start from and record in.
    #[arg(long)]
    presets: Option<PathBuf>,
    /// Evaluate with the distributed solver on K thread ranks sharing this machine's cores;
    /// with --backend cuda, then again with each rank's passes on GPU `rank mod GPUs`, and
    /// compare the two.
    #[arg(long, default_value_t = 1, allow_negative_numbers = true, value_parser = clap::value_parser!(u32).range(1..=1024).map(|v| v as usize))]
    ranks: usize,
    /// Where the FMM passes run: `cuda` runs them on GPU 0 from the CPU's tree and lists,
    /// reports the difference from the CPU's forces, and writes the GPU's (one rank).
    #[arg(long, value_enum, default_value_t = BackendArg::Cpu)]
    backend: BackendArg,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum BackendArg {
    Cpu,
    Cuda,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum KernelArg {
    Plummer,
    Spline,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum NearArg {
    Mixed,
    Double,
}

fn parse_theta(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("'{s}' is not a number"))?;
    if v > 0.0 && v < 1.0 {
        Ok(v)
    } else {
        Err(format!("{v} is not strictly between 0 and 1"))
    }
}

fn parse_accuracy(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("'{s}' is not a number"))?;
    if v.is_finite() && (0.0..1.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{v} is not in [0, 1)"))
    }
}

fn parse_softening(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("'{s}' is not a number"))?;
    if v.is_finite() && v >= 0.0 {
        Ok(v)
    } else {
        Err(format!("{v} must be a finite number >= 0"))
    }
}

/// Evaluates, writes, and reports.
pub fn execute(args: ForcesArgs, #[cfg(feature = "mpi")] mpi: Option<&MpiRank>) -> Result<()> {
    let path = &args.snapshot;
    let read_start = Instant::now();
    let data = read_snapshot_with(path, Velocities::Skip)?;
    let n = data.particles.len();
    if n == 0 {
        bail!("{}: the snapshot holds no particles", path.display());
    }
    // Refused rather than evaluated: one particle far out makes every force NaN.
    leapfmm::gravity::check_finite(&data.particles)
        .with_context(|| format!("{}: no forces computed", path.display()))?;
    if args.output.is_some() && data.files.len() > 1 {
        bail!(
            "{}: -o cannot copy a multi-file snapshot; omit -o to add the forces to its files",
            path.display()
        );
    }
    let g = read_parameter_f64(path, "GravityConstantInternal")
        .filter(|g| *g > 0.0)
        .or_else(|| data.units.map(|u| u.gravitational_constant()))
        .unwrap_or_else(|| {
            eprintln!("note: {} records no units; using G = 1", path.display());
            1.0
        });
    let epsilon = match args
        .softening
        .or_else(|| read_parameter_f64(path, "leapfmm.gravity.softening"))
    {
        Some(e) => e,
        None => bail!(
            "{}: the snapshot does not record a softening length; give --softening (0 for Newtonian)",
            path.display()
        ),
    };
    let kernel = match args.kernel {
        Some(KernelArg::Plummer) => SofteningKernel::Plummer,
        Some(KernelArg::Spline) => SofteningKernel::Spline,
        None => match read_parameter_string(path, "leapfmm.gravity.kernel").as_deref() {
            Some("plummer") => SofteningKernel::Plummer,
            _ => SofteningKernel::Spline,
        },
    };
    let softening = Softening { kernel, epsilon };
    // The device walk has no error test yet: with --backend cuda the default target gives
    // way to the opening angle, and an explicit one is refused.
    let accuracy = match (args.accuracy, args.backend) {
        (Some(a), BackendArg::Cuda) if a > 0.0 => bail!(
            "--accuracy {a} with --backend cuda: the GPU backend walks with the opening angle alone for now; use --accuracy 0 or the CPU"
        ),
        (None, BackendArg::Cuda) => {
            eprintln!(
                "--backend cuda: the opening angle alone (θ = {}), not the default accuracy target {DEFAULT_ACCURACY:e}, which the GPU backend does not hold yet",
                args.theta
            );
            0.0
        }
        (a, _) => a.unwrap_or(DEFAULT_ACCURACY),
    };
    let settings = FmmSettings {
        order: args.order.unwrap_or_else(|| default_order(accuracy)),
        theta: args.theta,
        accuracy,
        leaf_size: args.leaf_size,
        softening,
        g,
        near_field: match args.near_field {
            NearArg::Mixed => NearFieldPrecision::Mixed,
            NearArg::Double => NearFieldPrecision::Double,
        },
        caps_policy: CapsPolicy::default(),
    };
    eprintln!(
        "{}: {n} particles read in {:.2} s; FMM p = {}, θ = {}, leaf size {}, {} softening ε = {epsilon}, G = {g}",
        path.display(),
        read_start.elapsed().as_secs_f64(),
        settings.order,
        args.theta,
        args.leaf_size,
        kernel.name()
    );
    let presets = args.presets.clone().map(PresetsStore::new);
    let mut data = data;
    let p = std::mem::take(&mut data.particles);
    #[cfg(feature = "mpi")]
    if let Some(comm) = mpi {
        if args.ranks > 1 {
            bail!(
                "--ranks starts thread ranks; under mpirun, the MPI ranks are the ranks: drop --ranks"
            );
        }
        if args.backend == BackendArg::Cuda {
            bail!("--backend cuda runs on one GPU without mpirun");
        }
        let start = Instant::now();
        let out = evaluate_share(comm, &p, &settings, args.repeat, presets, None)?;
        if comm.rank() != 0 {
            return Ok(());
        }
        report_distributed(&out, comm.size(), start);
        return finish(path, data, p, &out.acc, &out.pot, &args, g, softening);
    }
    if args.backend == BackendArg::Cuda && args.ranks > 1 {
        // Before the CPU ranks' evaluation, which the GPU ranks' is compared with.
        leapfmm::gpu::backend::probe().map_err(|e| anyhow::anyhow!("--backend cuda: {e}"))?;
    }
    let (acc, pot) = if args.ranks > 1 {
        let start = Instant::now();
        let out = evaluate_on_thread_ranks(
            &p,
            &settings,
            args.ranks,
            args.repeat,
            presets.clone(),
            None,
        )?;
        report_distributed(&out, args.ranks, start);
        if args.backend == BackendArg::Cuda {
            distributed_on_gpu(&p, &settings, &out.acc, &args, presets)?
        } else {
            (out.acc, out.pot)
        }
    } else {
        single_rank(&p, settings, &args, presets)?
    };
    finish(path, data, p, &acc, &pot, &args, g, softening)
}

/// Accuracy report, then the forces written into the snapshot (or a copy).
#[allow(clippy::too_many_arguments)]
fn finish(
    path: &std::path::Path,
    data: SnapshotData,
    p: Particles,
    acc: &[[f64; 3]],
    pot: &[f64],
    args: &ForcesArgs,
    g: f64,
    softening: Softening,
) -> Result<()> {
    report_accuracy(&p, acc, args, g, softening);
    let mut data = SnapshotData {
        particles: p,
        ..data
    };
    if let Some(out) = &args.output {
        std::fs::copy(path, out)
            .with_context(|| format!("cannot copy {} to {}", path.display(), out.display()))?;
        data.files = vec![out.clone()];
    }
    write_forces(&data, acc, pot)?;
    eprintln!(
        "wrote Acceleration and Potential to {}",
        data.files
            .iter()
            .map(|f| f.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(())
}

/// Reports the figures of a distributed evaluation (rank 0 of an MPI job, or the thread
/// ranks' caller).
fn report_distributed(out: &GatheredForces, ranks: usize, start: Instant) {
    for (k, all) in out.figures.iter().enumerate() {
        let max = |f: &dyn Fn(&RankFigures) -> f64| all.iter().map(f).fold(0.0, f64::max);
        let wall = max(&|s| s.decomposition_s + s.exchange_s + s.local_s);
        println!(
            "evaluation {}: {wall:.3} s on {ranks} ranks (slowest rank; phases, slowest rank each: decomposition {:.3}, LET exchange {:.3}, local FMM {:.3} s); load imbalance {:.3}; {} retries; LET received per rank at most {} cells, {} particles, {} bytes through the host ({} bytes of tree geometry) and {} from the devices",
            k + 1,
            max(&|s| s.decomposition_s),
            max(&|s| s.exchange_s),
            max(&|s| s.local_s),
            all.first().map_or(1.0, |s| s.imbalance),
            all.iter().map(|s| s.retries).sum::<f64>(),
            max(&|s| s.let_cells),
            max(&|s| s.let_particles),
            max(&|s| s.let_bytes_received),
            max(&|s| s.geometry_bytes_received),
            max(&|s| s.payload_bytes_received),
        );
    }
    eprintln!(
        "{} evaluation(s) on {ranks} ranks in {:.2} s (including the split and gathering the forces)",
        out.figures.len(),
        start.elapsed().as_secs_f64()
    );
}

/// Forces and potentials from one rank, with per-phase figures.
fn single_rank(
    p: &Particles,
    settings: FmmSettings,
    args: &ForcesArgs,
    presets: Option<PresetsStore>,
) -> Result<(Vec<[f64; 3]>, Vec<f64>)> {
    let n = p.len();
    let mut solver = FmmSolver::new(settings, presets);
    let mut acc = vec![[0.0; 3]; n];
    let mut pot = vec![0.0; n];
    for k in 0..args.repeat {
        let start = Instant::now();
        // Repeats expect the last evaluation's accelerations, as a run's steps do.
        let expected = (k > 0).then(|| expected_accelerations(&acc));
        // In place: one copy of the forces at the peak (memory is what bounds N here).
        let with = Evaluation {
            expected_accel: expected.as_deref(),
            in_place: true,
            ..Evaluation::default()
        };
        let stats = solver.evaluate_with(&p.pos, &p.mass, &p.id, with, &mut acc, &mut pot)?;
        let secs = start.elapsed().as_secs_f64();
        let s = stats.seconds;
        println!(
            "evaluation {}: {secs:.3} s ({:.3e} particles/s), {} retries; tree {:.3} upward {:.3} traversal {:.3} m2l {:.3} downward {:.3} p2p {:.3} s; {} cells, {} M2L pairs, {} P2P pairs",
            k + 1,
            n as f64 / secs,
            stats.retries,
            s.tree,
            s.upward,
            s.traversal,
            s.m2l,
            s.downward,
            s.p2p,
            stats.cells,
            stats.used.m2l_pairs,
            stats.used.p2p_pairs
        );
    }
    for w in solver.take_warnings() {
        eprintln!("warning: {w}");
    }
    if args.backend == BackendArg::Cuda {
        return on_gpu(&solver, p, &acc, args);
    }
    Ok((acc, pot))
}

/// `--backend cuda`: the FMM passes of the solver's last evaluation on GPU 0, compared with
/// the CPU's accelerations `cpu_acc` (the caller's order), and the sort of `particles` into
/// tree order on the device (what a run does each step) compared with the host's tree;
/// returns the GPU's forces.
#[cfg(feature = "cuda")]
fn on_gpu(
    solver: &FmmSolver,
    particles: &Particles,
    cpu_acc: &[[f64; 3]],
    args: &ForcesArgs,
) -> Result<(Vec<[f64; 3]>, Vec<f64>)> {
    use leapfmm::gpu::context::GpuFmm;
    let plan = solver
        .device_plan()
        .context("the GPU passes need one softening length for all particles")?;
    let cache = leapfmm::gpu::kernel_cache();
    let start = Instant::now();
    let mut gpu = GpuFmm::open(0, cache.as_deref())?;
    eprintln!(
        "GPU {} ready in {:.2} s (kernels compiled or loaded from the cache)",
        gpu.device,
        start.elapsed().as_secs_f64()
    );
    let settings = solver.settings();
    let caps = solver.caps().unwrap_or_default();
    let n = plan.pos.len();
    let lengths = leapfmm::gpu::memory::DeviceLengths::of(&plan, &caps);
    eprintln!(
        "device buffers: {:.1} MB for the evaluation; {:.0} bytes per particle with a run's resident state",
        lengths.bytes() as f64 / 1e6,
        lengths.bytes_per_particle()
    );
    let (mut acc, mut pot) = (vec![[0.0; 3]; n], vec![0.0; n]);
    // Particle pairs of the P2P pass (each leaf with itself included): its rate.
    let interactions = plan.p2p_interactions() as f64;
    for k in 0..args.repeat {
        let start = Instant::now();
        let out = gpu.evaluate(&plan, &caps, settings.softening, settings.g)?;
        let s = out.seconds;
        let secs = start.elapsed().as_secs_f64();
        println!(
            "GPU evaluation {}: {secs:.3} s ({:.3e} particles/s; host tree and lists not included): upload {:.3} upward {:.3} m2l {:.3} downward {:.3} p2p {:.3} download {:.3} s; P2P kernel {:.3e} interactions/s ({:.3e} pairs)",
            k + 1,
            n as f64 / secs,
            s.upload,
            s.upward,
            s.m2l,
            s.downward,
            s.p2p,
            s.download,
            interactions / s.p2p.max(f64::MIN_POSITIVE),
            interactions
        );
        for (sorted, &orig) in plan.order_of.iter().enumerate() {
            acc[orig as usize] = out.acc[sorted];
            pot[orig as usize] = out.pot[sorted];
        }
    }
    device_tree_order(&mut gpu, particles, &plan, settings, &caps, args.repeat)?;
    report_gpu_difference(&acc, cpu_acc, "one rank");
    Ok((acc, pot))
}

/// `--backend cuda --ranks K`: the distributed evaluation again with each thread rank's
/// passes on GPU `rank mod devices` (tree, lists and exchange on the host), compared with
/// the CPU ranks' accelerations `cpu_acc`; returns the GPU's forces.
#[cfg(feature = "cuda")]
fn distributed_on_gpu(
    particles: &Particles,
    settings: &FmmSettings,
    cpu_acc: &[[f64; 3]],
    args: &ForcesArgs,
    presets: Option<PresetsStore>,
) -> Result<(Vec<[f64; 3]>, Vec<f64>)> {
    use leapfmm::fmm::backend::DevicePasses;
    use leapfmm::gpu::context::GpuFmm;
    use leapfmm::gravity::GravityError;
    let info = leapfmm::gpu::backend::probe().map_err(anyhow::Error::msg)?;
    let cache = leapfmm::gpu::kernel_cache();
    let device_err = |e: leapfmm::gpu::error::GpuError| GravityError::Device(e.to_string());
    let open = |comm: &dyn Communicator| -> Result<Box<dyn DevicePasses>, GravityError> {
        let mut gpu = GpuFmm::open(comm.rank() % info.devices.max(1), cache.as_deref())
            .map_err(device_err)?;
        gpu.connect_ranks(comm, comm.size() <= info.devices)
            .map_err(device_err)?;
        Ok(Box::new(gpu))
    };
    let link = if args.ranks <= info.devices && leapfmm::gpu::nccl::nccl_present() {
        "NCCL"
    } else {
        "the host (the ranks share GPUs, or there is no NCCL library)"
    };
    eprintln!(
        "the same on {} ranks with their passes on {} GPU(s) ({}), the LET payload through {link}:",
        args.ranks, info.devices, info.name
    );
    let start = Instant::now();
    let out = evaluate_on_thread_ranks(
        particles,
        settings,
        args.ranks,
        args.repeat,
        presets,
        Some(&open),
    )?;
    report_distributed(&out, args.ranks, start);
    report_gpu_difference(&out.acc, cpu_acc, &format!("{} ranks", args.ranks));
    Ok((out.acc, out.pot))
}

/// Without the `cuda` feature there is no GPU to run on.
#[cfg(not(feature = "cuda"))]
fn distributed_on_gpu(
    _particles: &Particles,
    _settings: &FmmSettings,
    _cpu_acc: &[[f64; 3]],
    _args: &ForcesArgs,
    _presets: Option<PresetsStore>,
) -> Result<(Vec<[f64; 3]>, Vec<f64>)> {
    bail!("this leapfmm was built without the `cuda` feature: --backend cuda is not available")
}

/// Prints the median, p99 and largest relative difference of the GPU's accelerations from
/// the CPU's (`what`: which evaluation).
#[cfg(feature = "cuda")]
fn report_gpu_difference(gpu_acc: &[[f64; 3]], cpu_acc: &[[f64; 3]], what: &str) {
    let n = gpu_acc.len();
    if n == 0 {
        return;
    }
    let mut diff: Vec<f64> = gpu_acc
        .iter()
        .zip(cpu_acc)
        .map(|(g, c)| {
            let d = (0..3).map(|k| (g[k] - c[k]).powi(2)).sum::<f64>().sqrt();
            d / (c[0] * c[0] + c[1] * c[1] + c[2] * c[2])
                .sqrt()
                .max(f64::MIN_POSITIVE)
        })
        .collect();
    diff.sort_by(f64::total_cmp);
    println!(
        "GPU vs CPU accelerations ({what}): median {:.3e}, p99 {:.3e}, max {:.3e} relative difference",
        diff[n / 2],
        diff[(n * 99 / 100).min(n - 1)],
        diff[n - 1]
    );
}

/// The device's sort of `particles` into tree order (`GpuFmm::sort_resident`), its split
/// into cells (`GpuFmm::split_cells`), its moments of the cells (`GpuFmm::cell_moments`)
/// and its walk (`GpuFmm::walk`), then a block sub-step's flags of the cells holding active
/// particles (`GpuFmm::cells_holding`) and walk for those, `repeat` times, against the
/// host's tree and lists of `plan` and the host's moments and flags of the same cells
/// (`settings` as the plan's, `caps` the solver's): the same order, positions, cells,
/// moments, flags and lists to the bit, or an error.
#[cfg(feature = "cuda")]
fn device_tree_order(
    gpu: &mut leapfmm::gpu::context::GpuFmm,
    particles: &Particles,
    plan: &leapfmm::fmm::backend::DevicePlan,
    settings: &leapfmm::fmm::FmmSettings,
    caps: &leapfmm::fmm::caps::Caps,
    repeat: usize,
) -> Result<()> {
    let (leaf_size, mac) = (settings.leaf_size, settings.mac());
    use leapfmm::fmm::tree::{CellColumns, SortedParticles, Tree};
    let state = gpu.load_state(particles)?;
    let mut sorted = SortedParticles::default();
    let mut tree = Tree::default();
    let mut columns = CellColumns::default();
    let mut moments = Vec::new();
    for k in 0..repeat.max(1) {
        let start = Instant::now();
        let Some(sort) = gpu.sort_resident(&state)? else {
            bail!("the device found a position or mass that is not finite");
        };
        gpu.download_sorted(&state, sort.cube, &mut sorted, true)?;
        let secs = start.elapsed().as_secs_f64();
        sort.summary.check(particles.len())?;
        let equal = sorted.keys.windows(2).filter(|w| w[0] == w[1]).count() as u64;
        // Runs of equal keys the device ordered by id need no reordering here.
        let reordered = tree.adopt_sorted(&mut sorted, &particles.id)?;
        let same = tree.order == plan.order_of
            && tree.pos == plan.pos
            && sort.summary.equal_neighbours == equal
            && !(reordered && sort.runs_ordered);
        println!(
            "GPU tree order {}: {secs:.3} s (bounds, keys, radix sort, gather, checks' sums, download of {} particles); the host's order, positions and sums: {}",
            k + 1,
            tree.order.len(),
            if same { "identical" } else { "DIFFERENT" }
        );
        if !same {
            bail!("the device's tree order differs from the host's");
        }
        tree.build_cells(leaf_size, usize::MAX)
            .map_err(|o| anyhow::anyhow!("a tree of more than {} cells", o.needed))?;
        let start = Instant::now();
        if let Err(o) = gpu.split_cells(&state, leaf_size, usize::MAX, &mut columns)? {
            bail!("the device's split asked for more than {} cells", o.needed);
        }
        let secs = start.elapsed().as_secs_f64();
        let host = tree.cell_columns();
        let same = columns == host;
        println!(
            "GPU cells {}: {secs:.3} s (split level by level, {} cells down); the host's cells: {}",
            k + 1,
            columns.begin.len(),
            if same { "identical" } else { "DIFFERENT" }
        );
        if !same {
            bail!("the device's cells differ from the host's");
        }
        tree.compute_moments();
        let start = Instant::now();
        gpu.cell_moments(&state, &tree, reordered)?;
        gpu.download_moments(&mut moments)?;
        let secs = start.elapsed().as_secs_f64();
        let host = tree.moments();
        let differ = moments
            .iter()
            .zip(&host)
            .filter(|(d, h)| d.map(f64::to_bits) != h.map(f64::to_bits))
            .count()
            + moments.len().abs_diff(host.len());
        println!(
            "GPU cell moments {}: {secs:.3} s (cells up, masses, centres and radii, {} cells down); the host's: {}",
            k + 1,
            host.len(),
            verdict(differ)
        );
        if differ > 0 {
            bail!("the device's cell moments differ from the host's");
        }
        let start = Instant::now();
        let Some(lists) = gpu.walk(&tree, mac, caps, None)? else {
            bail!(
                "the device's walk gave up (a ring of opened sources overflowed or a list came out of order)"
            );
        };
        let secs = start.elapsed().as_secs_f64();
        let walked = gpu.walked_lists(tree.cells.len(), lists)?;
        // Cell c's list (None for a span beyond the list: a fault, counted as a difference).
        let of = |spans: &[u64], list: &[u32], c: usize| -> Option<Vec<u32>> {
            let (start, len) = leapfmm::fmm::traversal::unpack(spans[c]);
            list.get(start as usize..(start + len) as usize)
                .map(<[u32]>::to_vec)
        };
        let differ = (0..tree.cells.len())
            .filter(|&c| {
                of(&walked.m2l_spans, &walked.m2l_sources, c).as_deref() != Some(plan.m2l_of(c))
                    || of(&walked.p2p_spans, &walked.p2p_sources, c).as_deref()
                        != Some(plan.p2p_of(c))
            })
            .count();
        let same = differ == 0
            && lists.p2p_interactions == plan.p2p_interactions()
            && (lists.m2l, lists.p2p) == (plan.m2l_sources.len(), plan.p2p_sources.len());
        println!(
            "GPU walk {}: {secs:.3} s ({} M2L and {} P2P entries); the host's lists: {}",
            k + 1,
            lists.m2l,
            lists.p2p,
            if same {
                verdict(0)
            } else {
                format!("DIFFERENT for {differ} cells or in the totals")
            }
        );
        if !same {
            bail!("the device's lists differ from the host's");
        }
        // A block sub-step: the cells holding every 64th particle, flagged on the device as
        // on the host; the walk for those only, whose lists are those of the whole walk; the
        // other cells' are empty.
        let rows: Vec<u32> = (0..tree.own_particles as u32)
            .filter(|i| i % 64 == 0)
            .collect();
        let targets =
            tree.cells_holding(&leapfmm::gravity::active_flags(&rows, tree.own_particles));
        let start = Instant::now();
        let mut flagged = Vec::new();
        gpu.cells_holding(&state, &tree, &rows, &mut flagged)?;
        let secs = start.elapsed().as_secs_f64();
        let differ = flagged.iter().zip(&targets).filter(|(d, h)| d != h).count()
            + flagged.len().abs_diff(targets.len());
        println!(
            "GPU active cells {}: {secs:.3} s ({} rows up, a flag per cell down); the host's flags: {}",
            k + 1,
            rows.len(),
            verdict(differ)
        );
        if differ > 0 {
            bail!("the device's cells holding the active particles differ from the host's");
        }
        let start = Instant::now();
        let Some(some) = gpu.walk(&tree, mac, caps, Some(&targets))? else {
            bail!("the device's walk for some targets gave up");
        };
        let secs = start.elapsed().as_secs_f64();
        let walked = gpu.walked_lists(tree.cells.len(), some)?;
        let differ = (0..tree.cells.len())
            .filter(|&c| {
                let m2l = of(&walked.m2l_spans, &walked.m2l_sources, c);
                let p2p = of(&walked.p2p_spans, &walked.p2p_sources, c);
                let (want_m2l, want_p2p) = if targets[c] {
                    (plan.m2l_of(c), plan.p2p_of(c))
                } else {
                    (&[][..], &[][..])
                };
                m2l.as_deref() != Some(want_m2l) || p2p.as_deref() != Some(want_p2p)
            })
            .count();
        println!(
            "GPU walk for a sub-step {}: {secs:.3} s ({} of {} cells, those of every 64th particle); the host's lists there: {}",
            k + 1,
            targets.iter().filter(|&&t| t).count(),
            targets.len(),
            verdict(differ)
        );
        if differ > 0 {
            bail!("the device's lists for some targets differ from the host's");
        }
    }
    Ok(())
}

/// "identical" for no cells that differ between the device and the host, else how many.
#[cfg(feature = "cuda")]
fn verdict(differ: usize) -> String {
    if differ == 0 {
        "identical".to_string()
    } else {
        format!("DIFFERENT in {differ} cells")
    }
}

/// `--backend cuda` in a build without the `cuda` feature.
#[cfg(not(feature = "cuda"))]
fn on_gpu(
    _solver: &FmmSolver,
    _particles: &Particles,
    _cpu_acc: &[[f64; 3]],
    _args: &ForcesArgs,
) -> Result<(Vec<[f64; 3]>, Vec<f64>)> {
    bail!("this leapfmm was built without the `cuda` feature: --backend cuda is not available")
}

/// With `--compare-direct M`: error statistics against direct summation on M particles.
fn report_accuracy(
    p: &Particles,
    acc: &[[f64; 3]],
    args: &ForcesArgs,
    g: f64,
    softening: Softening,
) {
    let Some(m) = args.compare_direct else {
        return;
    };
    let random = sample_indices(p.len(), m, args.seed);
    let tail = tail_indices(&p.pos, &p.mass, acc, args.tail);
    let start = Instant::now();
    let reference = Reference::at(&p.pos, &p.mass, &[&random, &tail], g, softening);
    let seconds = start.elapsed().as_secs_f64();
    let stats_of = |chosen: &[usize]| reference.compare(acc, chosen);
    let line = |what: &str, e: AccuracyStats| {
        println!(
            "{what} ({} particles): median {:.3e}, p99 {:.3e}, max {:.3e}, aggL2 {:.3e}",
            e.count, e.median, e.p99, e.max, e.agg_l2
        )
    };
    println!("accuracy vs direct summation ({seconds:.2} s):");
    line("  random", stats_of(&random));
    if !tail.is_empty() {
        line(
            &format!(
                "  tail: {} weakest forces + {} farthest",
                args.tail, args.tail
            ),
            stats_of(&tail),
        );
        line("  random + tail", stats_of(reference.indices()));
    }
}
