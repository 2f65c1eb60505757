//! Deterministic parallel reductions.
//!
//! rayon's own `sum` splits work adaptively, so the order of floating-point additions (and
//! hence the bits of the result) can change with the thread count. These helpers reduce
//! fixed-size chunks in parallel and combine the partial results sequentially, so the result
//! depends only on the data.
//!
//! Owns deterministic reductions; depends on nothing in the crate.

use rayon::prelude::*;

/// Chunk length of the fixed reduction tree (the device's conserved sums use the same:
/// SUM_CHUNK in kernels/integrate.cu).
pub const CHUNK: usize = 4096;

/// Sums `f(i)` for `i in 0..n` into an array of `K` accumulators, deterministically.
pub fn sum_indexed<const K: usize, F>(n: usize, f: F) -> [f64; K]
where
    F: Fn(usize) -> [f64; K] + Sync,
{
    let partials: Vec<[f64; K]> = (0..n.div_ceil(CHUNK))
        .into_par_iter()
        .map(|c| {
            let mut acc = [0.0; K];
            for i in c * CHUNK..((c + 1) * CHUNK).min(n) {
                let v = f(i);
                for k in 0..K {
                    acc[k] += v[k];
                }
            }
            acc
        })
        .collect();
    let mut total = [0.0; K];
    for p in partials {
        for k in 0..K {
            total[k] += p[k];
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn independent_of_thread_count() {
        let n = 100_003;
        let f = |i: usize| [((i as f64) * 0.37).sin(), 1.0 / (1.0 + i as f64)];
        let one = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap()
            .install(|| sum_indexed(n, f));
        let three = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap()
            .install(|| sum_indexed(n, f));
        assert_eq!(one[0].to_bits(), three[0].to_bits());
        assert_eq!(one[1].to_bits(), three[1].to_bits());
        let serial: f64 = (0..n).map(|i| f(i)[1]).sum();
        assert!((serial - one[1]).abs() < 1e-12 * serial);
    }
}
