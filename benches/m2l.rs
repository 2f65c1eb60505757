//! M2L throughput on one core: `Operators::m2l_batch` (the rotated M2L, `M2L_LANES`
//! translations into one local expansion per call) at orders 5 to 12, with offsets and
//! multipoles as the FMM's M2L pass gives them (a target and sources at 2 to 4 cell radii).
//!
//! `cargo bench --bench m2l`; figures go to docs/benchmarks.md ("M2L").

use leapfmm::fmm::expansion::{M2L_LANES, Operators, real_len};
use std::hint::black_box;
use std::time::Instant;

/// Batches per timing.
const BATCHES: usize = 5_000;

/// Floating-point operations of one translation as `m2l_lanes` does them: four z
/// rotations (6 a coefficient and 6 a step of the cos/sin recursion), four swap matrices
/// (a multiply–add a non-zero; the swap and its inverse have about as many), the
/// translation along z (a multiply for the factor and two multiply–adds a term, and the
/// sign), and ~25 for the geometry.
fn flops(ops: &Operators) -> f64 {
    let p = ops.order();
    let rotation: usize = (1..=p).map(|m| 6 + 6 * (p + 1 - m)).sum();
    let swaps = 4 * 2 * ops.swap_nonzeros();
    let mut translation = 0;
    for l in 0..=p {
        for k in l..=p - l {
            translation += 2 + 5 * (p - k + 1 - l);
        }
    }
    (4 * rotation + swaps + translation + 25) as f64
}

fn main() {
    let mut s = 7u64;
    let mut next = move || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (s >> 11) as f64 / (1u64 << 53) as f64 - 0.5
    };
    // `cargo bench --bench m2l -- 7 9` times only those orders.
    let mut orders: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    if orders.is_empty() {
        orders = vec![5, 7, 9, 12];
    }
    for p in orders {
        let ops = Operators::new(p);
        let len = real_len(p);
        // 64 distinct sources (multipoles of order p with decaying coefficients).
        let multipoles: Vec<Vec<f64>> = (0..64)
            .map(|_| (0..len).map(|i| next() / (1 + i) as f64).collect())
            .collect();
        let offsets: Vec<[f64; 3]> = (0..64)
            .map(|_| {
                let v = [next(), next(), next()];
                let n = (v[0] * v[0] + v[1] * v[1] + v[2] * v[2]).sqrt();
                let d = 3.0 + next() * 2.0;
                [d * v[0] / n, d * v[1] / n, d * v[2] / n]
            })
            .collect();
        let mut local = vec![0.0; len];
        let mut seconds = f64::INFINITY;
        // The best of 41 short timings (this box's clock varies from one second to the next).
        for _ in 0..41 {
            let start = Instant::now();
            for b in 0..BATCHES {
                let first = (b * M2L_LANES) % 64;
                let r: [[f64; 3]; M2L_LANES] = std::array::from_fn(|w| offsets[(first + w) % 64]);
                let m: [&[f64]; M2L_LANES] =
                    std::array::from_fn(|w| multipoles[(first + w) % 64].as_slice());
                ops.m2l_batch(black_box(&r), black_box(&m), &mut local);
            }
            seconds = seconds.min(start.elapsed().as_secs_f64());
        }
        let translations = (BATCHES * M2L_LANES) as f64;
        let rate = translations / seconds;
        println!(
            "m2l p = {p:2}: {:6.1} ns a translation, {rate:.3e} translations/s, {:.1} GFlop/s f64 on one core ({:.1e})",
            1e9 * seconds / translations,
            rate * flops(&ops) / 1e9,
            local[0]
        );
    }
}
