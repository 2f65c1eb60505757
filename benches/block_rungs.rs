//! The host's bookkeeping of the block steps (`integrate::block`, as
//! `Simulation::block_cycle` uses it): at a cycle's start everybody's step criterion, rung
//! and opening step; at a sub-step which particles' steps end, their closing steps, their
//! step criterion and new rungs. N particles (`BLOCK_RUNGS_N`, default 1e7) with random
//! accelerations, then 1% of them on rung 3 and the rest on rung 0, so the first sub-step
//! has 1% active. Needs no GPU: with the state on a device this is what the host does per
//! sub-step, and what it sends (a row and a step per active particle, twice) and gets
//! back (an acceleration per active particle, a flag per cell).
//!
//! `cargo bench --bench block_rungs`; figures go to docs/benchmarks.md (GPU backend).

use leapfmm::integrate::block::{Rungs, rung_for, rungs_for};
use leapfmm::integrate::timestep::{Timeline, criterion_dt};
use rand::{RngExt, SeedableRng};
use rayon::prelude::*;
use std::time::Instant;

/// Sub-steps timed (each on fresh rungs, the first sub-step of a cycle).
const REPEATS: usize = 5;

fn main() {
    let n: usize = std::env::var("BLOCK_RUNGS_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000_000);
    let mut rng = rand_pcg::Pcg64::seed_from_u64(1);
    let acc: Vec<[f64; 3]> = (0..n)
        .map(|_| [0; 3].map(|_| rng.random_range(-1.0..1.0)))
        .collect();
    let rung: Vec<u32> = (0..n)
        .map(|_| {
            if rng.random_range(0.0..1.0) < 0.01 {
                3
            } else {
                0
            }
        })
        .collect();
    let tl = Timeline { dt_max: 0.5 };
    let criterion =
        |a: &[f64; 3]| criterion_dt(0.2, 0.01, (a[0] * a[0] + a[1] * a[1] + a[2] * a[2]).sqrt());
    println!(
        "block rungs, N = {n}, {} threads",
        rayon::current_num_threads()
    );
    for k in 1..=REPEATS {
        let start = Instant::now();
        let wanted: Vec<f64> = acc.par_iter().map(criterion).collect();
        let all = rungs_for(&tl, 0, &wanted, 20).expect("rungs within 20");
        let rungs = Rungs::start(0, all);
        let half: Vec<f64> = rungs
            .rung()
            .par_iter()
            .map(|&r| 0.5 * tl.level_dt(r))
            .collect();
        let cycle_start = start.elapsed().as_secs_f64();
        std::hint::black_box(half);
        let rung = rung.clone();
        let mut rungs = Rungs::start(0, rung);
        let start = Instant::now();
        let ti = rungs.next_end();
        rungs.advance(ti);
        let active = rungs.ending_rows();
        let closing: Vec<f64> = active
            .par_iter()
            .map(|&i| 0.5 * tl.level_dt(rungs.rung()[i as usize]))
            .collect();
        let wanted: Vec<f64> = active
            .par_iter()
            .map(|&i| criterion(&acc[i as usize]))
            .collect();
        let mut opening = Vec::with_capacity(active.len());
        for (&i, &w) in active.iter().zip(&wanted) {
            let r = rung_for(&tl, ti, w, 20).expect("a rung within 20");
            rungs.restart(i, r);
            opening.push(0.5 * tl.level_dt(r));
        }
        let sub_step = start.elapsed().as_secs_f64();
        std::hint::black_box((closing, opening));
        println!(
            "{k}: cycle start (criterion, rungs and opening steps of all) {:.1} ms; sub-step ({} active) {:.2} ms",
            1e3 * cycle_start,
            active.len(),
            1e3 * sub_step
        );
    }
}
