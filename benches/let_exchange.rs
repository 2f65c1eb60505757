//! The host's share of a distributed GPU evaluation on K thread ranks (disk-in-halo,
//! default settings): decomposition, tree, upward pass, LET exchange and traversal, by
//! phase on the slowest rank, and the LET bytes through the host. Twice: with the payload
//! through the host's exchange (each rank's host computes its multipoles and packs them
//! with its particles; the receiver unpacks them and rebuilds the multipoles of the cells
//! it got particles or children of), and with the payload left to the devices (only the
//! cells through the host; each device computes its own multipoles). The devices are a
//! stand-in that runs no passes and moves nothing, so the figures are the host's alone.
//! Needs no GPU.
//!
//! `cargo bench --bench let_exchange` (N = 1e6 on 4 ranks; `LET_N`, `LET_RANKS` to change);
//! figures go to docs/benchmarks.md (GPU backend).

use leapfmm::distributed::comm::{Communicator, ThreadRank, run_thread_ranks};
use leapfmm::distributed::driver::DistributedFmm;
use leapfmm::distributed::payload::PayloadRoutes;
use leapfmm::distributed::stats::RankStats;
use leapfmm::fmm::FmmSolver;
use leapfmm::fmm::backend::{DeviceForces, DevicePasses, DevicePlan};
use leapfmm::fmm::caps::Caps;
use leapfmm::gravity::{GravityError, Softening};
use leapfmm::workloads::Workload;
use std::time::Duration;

/// Evaluations timed after the first (which finds the caps and the first decomposition).
const TIMED: usize = 3;

/// A device that runs no passes: zero forces, and with `payload` it says it moves the
/// payload (and moves none).
struct StandIn {
    payload: bool,
}

impl StandIn {
    fn zero(plan: &DevicePlan) -> DeviceForces {
        DeviceForces {
            acc: vec![[0.0; 3]; plan.own_particles],
            pot: vec![0.0; plan.own_particles],
            seconds: Default::default(),
        }
    }
}

impl DevicePasses for StandIn {
    fn run_passes(
        &mut self,
        plan: &DevicePlan,
        _caps: &Caps,
        _softening: Softening,
        _g: f64,
    ) -> Result<DeviceForces, GravityError> {
        Ok(Self::zero(plan))
    }

    fn moves_payload(&self) -> bool {
        self.payload
    }

    fn run_passes_with_payload(
        &mut self,
        plan: &DevicePlan,
        _caps: &Caps,
        _force: (Softening, f64),
        _routes: &PayloadRoutes,
        _comm: &dyn Communicator,
    ) -> Result<DeviceForces, GravityError> {
        Ok(Self::zero(plan))
    }
}

fn main() {
    let var = |name: &str, default: usize| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let (n, ranks) = (var("LET_N", 1_000_000), var("LET_RANKS", 4));
    let w = Workload::DiskInHalo;
    let p = w.particles(n, 1);
    let settings = w.fmm_settings(n);
    let threads = (rayon::current_num_threads() / ranks).max(1);
    println!(
        "LET exchange, {} N = {n} on {ranks} thread ranks of {threads} thread(s) each",
        w.name()
    );
    for payload in [false, true] {
        let per_rank = run_thread_ranks(
            ranks,
            threads,
            Duration::from_secs(3600),
            |comm: &ThreadRank| {
                let (r, k) = (comm.rank(), comm.size());
                let mut mine = p.slice(n * r / k..n * (r + 1) / k);
                let solver = FmmSolver::new(settings.clone(), None);
                let mut fmm = DistributedFmm::new(comm.clone(), solver, None)
                    .with_device(Box::new(StandIn { payload }));
                let mut timed = Vec::new();
                for k in 0..=TIMED {
                    let stats = fmm.evaluate(&mut mine, None)?;
                    if k > 0 {
                        timed.push(stats);
                    }
                }
                Ok::<_, GravityError>(timed)
            },
        )
        .expect("the ranks evaluate");
        println!(
            "{}:",
            match payload {
                false => "payload through the host's exchange",
                true => "payload left to the devices (cells only through the host)",
            }
        );
        for k in 0..TIMED {
            report(k + 1, &per_rank.iter().map(|r| r[k]).collect::<Vec<_>>());
        }
    }
}

/// One evaluation's figures: each phase's slowest rank, and the bytes per rank.
fn report(k: usize, ranks: &[RankStats]) {
    let max = |f: &dyn Fn(&RankStats) -> f64| ranks.iter().map(f).fold(0.0, f64::max);
    let s = |f: fn(&leapfmm::fmm::stats::PhaseSeconds) -> f64| max(&|r| f(&r.fmm.seconds));
    let host = max(&|r| {
        let t = &r.fmm.seconds;
        r.decomposition_s + t.tree + t.upward + t.exchange + t.traversal
    });
    println!(
        "  evaluation {k}: host {host:.3} s on the slowest rank (decomposition {:.3}, tree {:.3}, upward {:.3}, exchange {:.3}, traversal {:.3}); LET per rank at most {:.2} MB through the host, {:.2} MB from the devices",
        max(&|r| r.decomposition_s),
        s(|t| t.tree),
        s(|t| t.upward),
        s(|t| t.exchange),
        s(|t| t.traversal),
        max(&|r| r.let_bytes_received as f64) / 1e6,
        max(&|r| r.payload_bytes_received as f64) / 1e6,
    );
}
