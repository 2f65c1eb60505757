//! Near-field kernel throughput (particle interactions per second on one core), for every
//! instruction set this CPU runs, in mixed precision (f32 pairs) with the spline kernel: a
//! leaf of 128 targets against 1 024 staged sources, as the FMM's P2P pass calls it, once
//! with every pair beyond the softening's support (the Newtonian fast path) and once with the
//! sources inside it (the softened branch).
//!
//! `cargo bench --bench p2p`; figures go to docs/benchmarks.md ("Near field").

use leapfmm::gravity::pairwise::{LANES_F32, PairParams, Staged, TARGET_BLOCK, all_f32};
use leapfmm::gravity::{Softening, SofteningKernel};
use std::hint::black_box;
use std::time::Instant;

const TARGETS: usize = 128;
const SOURCES: usize = 1024;
/// Repetitions of the whole leaf per timing.
const REPEAT: usize = 1_000;

/// A deterministic cloud in the unit cube.
fn cloud(n: usize, seed: u64) -> Vec<[f64; 3]> {
    let mut s = seed;
    let mut next = || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (s >> 11) as f64 / (1u64 << 53) as f64
    };
    (0..n).map(|_| [next(), next(), next()]).collect()
}

fn main() {
    let sources = cloud(SOURCES, 1);
    let mass = vec![1.0 / SOURCES as f64; SOURCES];
    let targets = cloud(TARGETS, 2);
    let mut staged = Staged::<f32, LANES_F32>::default();
    staged.push(&sources, &mass, None, [0.5; 3]);
    let blocks: Vec<[[f32; 3]; TARGET_BLOCK]> = targets
        .chunks(TARGET_BLOCK)
        .map(|b| std::array::from_fn(|t| std::array::from_fn(|k| (b[t][k] - 0.5) as f32)))
        .collect();
    let eps = [0.0f32; TARGET_BLOCK];
    // Newtonian: a support far below the typical separation, so nearly every chunk takes the
    // fast path; softened: a support of the cube's size, so every chunk takes the spline.
    for (case, epsilon) in [("newtonian", 1e-6), ("softened", 0.5)] {
        let params = PairParams::<f32>::new(Softening {
            kernel: SofteningKernel::Spline,
            epsilon,
        });
        let only = std::env::var("P2P_ONLY").unwrap_or_default();
        for (kernel, isa) in all_f32() {
            if !format!("{case} {isa}").contains(only.as_str()) {
                continue;
            }
            let mut sink = 0.0;
            // The best of five timings: this box's clock and neighbours vary by tens of per
            // cent from one second to the next.
            let mut seconds = f64::INFINITY;
            for _ in 0..5 {
                let start = Instant::now();
                for _ in 0..REPEAT {
                    for block in &blocks {
                        // SAFETY: `all_f32` lists only builds this CPU runs.
                        let sums = unsafe { kernel(black_box(&staged), block, &eps, params) };
                        sink += sums[0][0];
                    }
                }
                seconds = seconds.min(start.elapsed().as_secs_f64());
            }
            let pairs = (REPEAT * TARGETS * SOURCES) as f64;
            println!(
                "p2p spline {case:9} {isa:8}: {:.3e} interactions/s on one core ({sink:.1e})",
                pairs / seconds
            );
        }
    }
}
