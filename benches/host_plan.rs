//! The host's share of a GPU force evaluation: the tree, the lists and the device plan
//! (`FmmSolver::plan_with`, then `device_plan`) on the disk-in-halo workload, default
//! settings, by phase. Needs no GPU: what a GPU step waits for on the CPU.
//!
//! `cargo bench --bench host_plan` (N = 1e7, ~2.5 GB; `HOST_PLAN_N=1000000` for less);
//! figures go to docs/benchmarks.md (GPU backend).

use leapfmm::bench::Workload;
use leapfmm::fmm::solver::Evaluation;
use leapfmm::fmm::{FmmSettings, FmmSolver};
use leapfmm::gravity::{Softening, SofteningKernel};
use std::time::Instant;

/// Plans timed; the first one also finds the caps.
const PLANS: usize = 4;

fn main() {
    let n: usize = std::env::var("HOST_PLAN_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000_000);
    let w = Workload::DiskInHalo;
    let p = w.particles(n, 1);
    let softening = Softening {
        kernel: SofteningKernel::Spline,
        epsilon: w.softening(n),
    };
    let settings = FmmSettings::defaults(softening, w.g());
    let mut solver = FmmSolver::new(settings, None);
    println!(
        "host plan, {} N = {n}, {} threads",
        w.name(),
        rayon::current_num_threads()
    );
    for k in 1..=PLANS {
        let start = Instant::now();
        let stats = solver
            .plan_with(&p.pos, &p.mass, &p.id, Evaluation::default())
            .expect("finite particles");
        let lists = start.elapsed().as_secs_f64();
        let start = Instant::now();
        let plan = solver.device_plan().expect("one softening length");
        let assembly = start.elapsed().as_secs_f64();
        let s = stats.seconds;
        println!(
            "plan {k}: {:.3} s = tree {:.3} + moments {:.3} + traversal {:.3} + assembly {assembly:.3} (+ {:.3} other); {} cells, {} M2L and {} P2P entries",
            lists + assembly,
            s.tree,
            s.upward,
            s.traversal,
            lists - s.tree - s.upward - s.traversal,
            plan.centre.len(),
            plan.m2l_sources.len(),
            plan.p2p_sources.len()
        );
    }
}
