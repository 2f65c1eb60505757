//! Moving an evaluation's sums from tree order to the caller's order: position `s` of the
//! sums holds particle `order[s]`'s values. Pure data movement, so every way gives the same
//! bits; they differ in time and memory.
//!
//! With a scratch of one value a particle the move is a parallel scatter per component
//! (independent writes, which the memory system overlaps); without one it follows the
//! permutation's cycles in place (each step a dependent random load: 2.2 s at 1e7
//! particles, against ~0.2 s through a scratch).

use rayon::prelude::*;

/// True when `order` is a permutation of `0..order.len()`, using `seen` (one bit a
/// particle) as scratch. What makes the parallel scatters' writes disjoint.
pub fn is_permutation(order: &[u32], seen: &mut Vec<u64>) -> bool {
    let n = order.len();
    seen.clear();
    seen.resize(n.div_ceil(64), 0);
    for &j in order {
        let j = j as usize;
        if j >= n || seen[j / 64] & (1 << (j % 64)) != 0 {
            return false;
        }
        seen[j / 64] |= 1 << (j % 64);
    }
    true
}

/// A destination that threads write at disjoint indices.
struct Disjoint<T>(*mut T);

// SAFETY: only used by `scatter`, whose writes go to distinct indices of one slice.
unsafe impl<T: Send> Sync for Disjoint<T> {}

/// `out[order[s]] = value(s)` for every `s`, in parallel. `order` must be a permutation
/// of `0..out.len()` (`is_permutation`), so that every slot is written exactly once.
fn scatter<T: Copy + Send>(order: &[u32], value: impl Fn(usize) -> T + Sync, out: &mut [T]) {
    assert_eq!(order.len(), out.len(), "a scatter onto another length");
    let n = out.len();
    let dst = Disjoint(out.as_mut_ptr());
    let dst = &dst;
    order
        .par_iter()
        .with_min_len(1 << 14)
        .enumerate()
        .for_each(|(s, &j)| {
            let j = j as usize;
            assert!(j < n, "a scatter outside its slice");
            // SAFETY: j < n, and `order` being a permutation, no other iteration writes
            // index j while this one does.
            unsafe { *dst.0.add(j) = value(s) };
        });
}

/// Copies `sorted_acc`/`sorted_pot` (tree order) to `acc`/`pot` (the caller's order), in
/// parallel; `order` must be a permutation (`is_permutation`).
pub fn unsort_into(
    sorted_acc: &[[f64; 3]],
    sorted_pot: &[f64],
    order: &[u32],
    acc: &mut [[f64; 3]],
    pot: &mut [f64],
) {
    scatter(order, |s| sorted_acc[s], acc);
    scatter(order, |s| sorted_pot[s], pot);
}

/// Moves `acc` and `pot` from tree order to the caller's order in place, through
/// `scratch` (at least `order.len()` values; its contents are lost): each of the four
/// components is scattered into it in parallel and copied back. `order` must be a
/// permutation (`is_permutation`).
pub fn unsort_through(acc: &mut [[f64; 3]], pot: &mut [f64], order: &[u32], scratch: &mut [f64]) {
    let scratch = &mut scratch[..order.len()];
    for k in 0..3 {
        scatter(order, |s| acc[s][k], scratch);
        acc.par_iter_mut()
            .zip(scratch.par_iter())
            .for_each(|(a, &v)| a[k] = v);
    }
    scatter(order, |s| pot[s], scratch);
    pot.copy_from_slice(scratch);
}

/// Moves `acc` and `pot` from tree order to the caller's order in place without scratch:
/// each cycle of the permutation is followed once, `visited` marking the tree positions
/// already moved. One thread; for when no scratch is at hand.
pub fn unsort_in_place(
    acc: &mut [[f64; 3]],
    pot: &mut [f64],
    order: &[u32],
    visited: &mut Vec<u64>,
) {
    visited.clear();
    visited.resize(order.len().div_ceil(64), 0);
    for start in 0..order.len() {
        if visited[start / 64] & (1 << (start % 64)) != 0 {
            continue;
        }
        let mut carried = (acc[start], pot[start]);
        let mut i = start;
        loop {
            visited[i / 64] |= 1 << (i % 64);
            let dest = order[i] as usize;
            if dest == start {
                (acc[start], pot[start]) = carried;
                break;
            }
            let next = (acc[dest], pot[dest]);
            (acc[dest], pot[dest]) = carried;
            carried = next;
            i = dest;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A permutation of `n` with long cycles (a linear congruential walk).
    fn permutation(n: usize) -> Vec<u32> {
        let mut order: Vec<u32> = (0..n as u32).collect();
        let mut x = 12345u64;
        for i in (1..n).rev() {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            order.swap(i, (x >> 33) as usize % (i + 1));
        }
        order
    }

    #[test]
    fn every_way_gives_the_caller_order() {
        let n = 100_003;
        let order = permutation(n);
        let mut seen = Vec::new();
        assert!(is_permutation(&order, &mut seen));
        let sorted_acc: Vec<[f64; 3]> = (0..n).map(|s| [s as f64, -(s as f64), 0.5]).collect();
        let sorted_pot: Vec<f64> = (0..n).map(|s| 2.0 * s as f64).collect();
        let mut expected = (vec![[0.0; 3]; n], vec![0.0; n]);
        for (s, &j) in order.iter().enumerate() {
            expected.0[j as usize] = sorted_acc[s];
            expected.1[j as usize] = sorted_pot[s];
        }
        let mut into = (vec![[0.0; 3]; n], vec![0.0; n]);
        unsort_into(&sorted_acc, &sorted_pot, &order, &mut into.0, &mut into.1);
        assert_eq!(into, expected);
        let mut through = (sorted_acc.clone(), sorted_pot.clone());
        let mut scratch = vec![f64::NAN; n + 7];
        unsort_through(&mut through.0, &mut through.1, &order, &mut scratch);
        assert_eq!(through, expected);
        let mut in_place = (sorted_acc, sorted_pot);
        unsort_in_place(&mut in_place.0, &mut in_place.1, &order, &mut seen);
        assert_eq!(in_place, expected);
    }

    #[test]
    fn a_repeated_or_outside_index_is_not_a_permutation() {
        let mut seen = Vec::new();
        assert!(is_permutation(&[2, 0, 1], &mut seen));
        assert!(!is_permutation(&[2, 0, 2], &mut seen));
        assert!(!is_permutation(&[3, 0, 1], &mut seen));
        assert!(is_permutation(&[], &mut seen));
    }
}
