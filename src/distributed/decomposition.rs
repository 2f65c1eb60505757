//! Domain decomposition along the Morton curve (design §6): splitters chosen for equal work
//! by bisection over octree-cell-aligned keys, with global sums by allreduce, and particle
//! migration by alltoallv. Because splitters sit on boundaries of cells at `ALIGN_LEVEL`,
//! every rank's tree is a set of subtrees of one global tree.

use super::comm::{CommError, Communicator, allreduce_max, allreduce_sum, alltoallv};
use crate::fmm::morton::{BITS, BoundingCube, extremes};
use crate::particles::{Component, Particles};
use bytemuck::{Pod, Zeroable};
use rayon::prelude::*;

/// Domain boundaries are boundaries of octree cells at this level (side = box / 2^12).
pub const ALIGN_LEVEL: u32 = 12;

/// The key ranges of the ranks: rank r owns keys in `[splitters[r], splitters[r + 1])`.
#[derive(Debug, Clone, PartialEq)]
pub struct Domains {
    /// The global cube the keys refer to.
    pub cube: BoundingCube,
    /// K + 1 boundaries, from 0 to u64::MAX.
    pub splitters: Vec<u64>,
}

impl Domains {
    /// The rank owning `key`.
    pub fn owner(&self, key: u64) -> usize {
        self.splitters
            .partition_point(|&s| s <= key)
            .saturating_sub(1)
            .min(self.splitters.len() - 2)
    }

    /// The rank owning each of `keys`.
    pub fn owners(&self, keys: &[u64]) -> Vec<usize> {
        keys.par_iter().map(|&key| self.owner(key)).collect()
    }
}

/// The cube around every rank's particles.
pub fn global_cube(comm: &dyn Communicator, pos: &[[f64; 3]]) -> Result<BoundingCube, CommError> {
    let (lo, hi) = extremes(pos);
    let ext = [-lo[0], -lo[1], -lo[2], hi[0], hi[1], hi[2]];
    let e = allreduce_max(comm, &ext)?;
    if e[0] == f64::MIN {
        return Ok(BoundingCube::around([0.0; 3], [0.0; 3]));
    }
    Ok(BoundingCube::around(
        [-e[0], -e[1], -e[2]],
        [e[3], e[4], e[5]],
    ))
}

/// Splitters giving every rank an equal share of the total `work`, for particles with the
/// given keys (any order). Work 0 everywhere counts particles instead.
pub fn balance(comm: &dyn Communicator, keys: &[u64], work: &[f64]) -> Result<Vec<u64>, CommError> {
    let k = comm.size();
    let use_counts = allreduce_sum(comm, &[work.iter().sum::<f64>()])?[0] <= 0.0;
    let shift = 3 * (BITS - ALIGN_LEVEL);
    let units: u64 = 1 << (3 * ALIGN_LEVEL);
    // Splitters sit on aligned boundaries, so only the keys' aligned part matters: the
    // particles sorted by it, ties in their order here (a serial, stable sort: the prefix
    // sums are the same bits for any thread count).
    let weights = keys
        .iter()
        .enumerate()
        .map(|(i, &key)| (key >> shift, if use_counts { 1.0 } else { work[i] }));
    let pairs = sort_by_unit(weights.collect());
    let sorted: Vec<u64> = pairs.iter().map(|p| p.0).collect();
    let mut prefix = Vec::with_capacity(keys.len() + 1);
    prefix.push(0.0);
    for &(_, w) in &pairs {
        prefix.push(prefix[prefix.len() - 1] + w);
    }
    let total = allreduce_sum(comm, &[prefix[prefix.len() - 1]])?[0];
    // For each splitter, the smallest aligned key s with work(keys < s) >= target (units
    // when there is none), searched in [lo, hi] by SEARCH_FANOUT - 1 points a round: ~10
    // rounds of allreduce instead of a bisection's 37, each rank waiting on the slowest at
    // every one. The work below a point only grows with it, so this finds what a bisection
    // finds.
    let mut lo = vec![0u64; k.saturating_sub(1)];
    let mut hi = vec![units; k.saturating_sub(1)];
    while lo != hi {
        let points: Vec<u64> = lo
            .iter()
            .zip(&hi)
            .flat_map(|(&l, &h)| (1..SEARCH_FANOUT).map(move |q| l + (h - l) * q / SEARCH_FANOUT))
            .collect();
        let below: Vec<f64> = points
            .iter()
            .map(|&m| prefix[sorted.partition_point(|&unit| unit < m)])
            .collect();
        let below = allreduce_sum(comm, &below)?;
        let per = (SEARCH_FANOUT - 1) as usize;
        for j in 0..lo.len() {
            let target = total * (j + 1) as f64 / k as f64;
            let at = j * per..(j + 1) * per;
            for (&m, &b) in points[at.clone()].iter().zip(&below[at]) {
                if b >= target {
                    hi[j] = hi[j].min(m);
                } else {
                    lo[j] = lo[j].max(m + 1);
                }
            }
        }
    }
    let mut splitters = vec![0u64];
    splitters.extend(
        hi.iter()
            .map(|&h| if h >= units { u64::MAX } else { h << shift }),
    );
    splitters.push(u64::MAX);
    for j in 1..splitters.len() {
        splitters[j] = splitters[j].max(splitters[j - 1]);
    }
    Ok(splitters)
}

/// Points a round of the splitters' search tries in each one's interval, plus one.
const SEARCH_FANOUT: u64 = 16;

/// Bits of the aligned part of a key a pass of `sort_by_unit` sorts on.
const UNIT_DIGIT: u32 = 12;

/// (aligned key, work) pairs sorted by aligned key, stably: a least-significant-digit
/// radix sort, `UNIT_DIGIT` bits a pass (with the bisection's 37 rounds, a comparison sort
/// of the whole keys took about half of a rebalance: 0.02–0.03 s for 250,000 particles a
/// rank, 4 ranks on 2 cores).
fn sort_by_unit(mut pairs: Vec<(u64, f64)>) -> Vec<(u64, f64)> {
    const _: () = assert!((3 * ALIGN_LEVEL).is_multiple_of(UNIT_DIGIT));
    let mask = (1u64 << UNIT_DIGIT) - 1;
    let mut out = vec![(0, 0.0); pairs.len()];
    for pass in 0..3 * ALIGN_LEVEL / UNIT_DIGIT {
        let shift = pass * UNIT_DIGIT;
        let digit = |unit: u64| ((unit >> shift) & mask) as usize;
        let mut next = vec![0usize; 1 << UNIT_DIGIT];
        for &(unit, _) in &pairs {
            next[digit(unit)] += 1;
        }
        let mut at = 0;
        for slot in &mut next {
            (*slot, at) = (at, at + *slot);
        }
        for &pair in &pairs {
            let d = digit(pair.0);
            out[next[d]] = pair;
            next[d] += 1;
        }
        std::mem::swap(&mut pairs, &mut out);
    }
    pairs
}

/// One particle on its way to another rank.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
struct Record {
    pos: [f64; 3],
    vel: [f64; 3],
    acc: [f64; 3],
    mass: f64,
    work: f64,
    id: u64,
    component: u64,
    rung: u64,
}

fn component_code(c: Component) -> u64 {
    Component::ALL.iter().position(|&x| x == c).unwrap_or(3) as u64
}

/// Moves every particle (with its work) to its owner (`owners[i]`, particle i's rank from
/// `Domains::owners` of the keys `balance` had). Particles that stay keep their order (and their accelerations and potentials); the arrivals follow, by source
/// rank, then in the source's order, with their accelerations (the accuracy target's
/// expectation, `fmm::solver::Evaluation::expected_accel`) and zero potentials until the
/// next evaluation: deterministic. Velocities and block-scheme rungs are kept when any rank has
/// them. Returns how many left.
pub fn migrate(
    comm: &dyn Communicator,
    owners: &[usize],
    p: &mut Particles,
    work: &mut Vec<f64>,
) -> Result<usize, CommError> {
    let me = comm.rank();
    // Decided together: a rank that holds no particles (say, one that sampled none of the
    // initial conditions) must still keep the velocities of those it receives.
    let has = allreduce_sum(
        comm,
        &[u64::from(!p.vel.is_empty()), u64::from(!p.rung.is_empty())],
    )?;
    let (has_vel, has_rung) = (has[0] > 0, has[1] > 0);
    let mut outgoing: Vec<Vec<Record>> = vec![Vec::new(); comm.size()];
    for (i, &owner) in owners.iter().enumerate() {
        if owner != me {
            outgoing[owner].push(Record {
                pos: p.pos[i],
                vel: p.vel.get(i).copied().unwrap_or([0.0; 3]),
                acc: p.acc.get(i).copied().unwrap_or([0.0; 3]),
                mass: p.mass[i],
                work: work.get(i).copied().unwrap_or(0.0),
                id: p.id[i],
                component: component_code(p.component[i]),
                rung: p.rung.get(i).copied().map_or(0, u64::from),
            });
        }
    }
    let moved: usize = outgoing.iter().map(Vec::len).sum();
    let incoming = alltoallv(comm, &outgoing)?;
    if moved > 0 {
        let stays: Vec<bool> = owners.iter().map(|&o| o == me).collect();
        keep(&mut p.pos, &stays);
        keep(&mut p.vel, &stays);
        keep(&mut p.acc, &stays);
        keep(&mut p.pot, &stays);
        keep(&mut p.mass, &stays);
        keep(&mut p.id, &stays);
        keep(&mut p.component, &stays);
        keep(&mut p.rung, &stays);
        keep(work, &stays);
    }
    work.resize(p.len(), 0.0);
    p.acc.resize(p.len(), [0.0; 3]);
    for r in incoming.iter().flatten() {
        let c = Component::ALL
            .get(r.component as usize)
            .copied()
            .unwrap_or(Component::Generic);
        p.pos.push(r.pos);
        if has_vel {
            p.vel.push(r.vel);
        }
        p.acc.push(r.acc);
        p.mass.push(r.mass);
        p.id.push(r.id);
        p.component.push(c);
        if has_rung {
            p.rung.push(r.rung as u8);
        }
        work.push(r.work);
    }
    p.acc.resize(p.len(), [0.0; 3]);
    p.pot.resize(p.len(), 0.0);
    Ok(moved)
}

/// Keeps the entries of `v` whose flag in `stays` is set (an empty `v` stays empty).
fn keep<T>(v: &mut Vec<T>, stays: &[bool]) {
    if v.is_empty() {
        return;
    }
    let mut k = 0;
    v.retain(|_| {
        let s = stays[k];
        k += 1;
        s
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::distributed::comm::{ThreadRank, run_thread_ranks};
    use std::time::Duration;

    #[test]
    fn units_sort_stably() {
        // Units over all 36 bits, many equal ones (their works tell their input order).
        let mut s = 5u64;
        let pairs: Vec<(u64, f64)> = (0..5000)
            .map(|i| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let unit = if i % 3 == 0 { (s >> 28) % 40 } else { s >> 28 };
                (unit, i as f64)
            })
            .collect();
        assert!(pairs.iter().any(|p| p.0 >= 1 << 35));
        let mut want = pairs.clone();
        want.sort_by_key(|p| p.0);
        assert_eq!(sort_by_unit(pairs), want);
    }

    #[test]
    fn balanced_splitters_and_migration() {
        let out = run_thread_ranks(
            3,
            1,
            Duration::from_secs(30),
            |c: &ThreadRank| -> Result<_, CommError> {
                // Each rank starts with a different, skewed slice of one cloud.
                let mut p = Particles::default();
                let mut s = 17 + c.rank() as u64;
                for i in 0..3000 {
                    s = s
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let u = (s >> 11) as f64 / (1u64 << 53) as f64;
                    let x = [u.powi(3), (u * 7.0).fract(), (u * 13.0).fract()];
                    p.push(
                        x,
                        [0.0; 3],
                        1.0,
                        (c.rank() * 10_000 + i) as u64,
                        Component::Halo,
                    );
                }
                let cube = global_cube(c, &p.pos)?;
                let keys: Vec<u64> = p.pos.iter().map(|&x| cube.key(x)).collect();
                let splitters = balance(c, &keys, &vec![0.0; keys.len()])?;
                let domains = Domains { cube, splitters };
                let mut work = vec![1.0; p.len()];
                migrate(c, &domains.owners(&keys), &mut p, &mut work)?;
                let owned_ok = p
                    .pos
                    .iter()
                    .all(|&x| domains.owner(cube.key(x)) == c.rank());
                Ok((p.len(), owned_ok, domains.splitters))
            },
        )
        .unwrap();
        let counts: Vec<usize> = out.iter().map(|o| o.0).collect();
        assert_eq!(counts.iter().sum::<usize>(), 9000);
        for &n in &counts {
            assert!(
                (n as f64 / 3000.0 - 1.0).abs() < 0.05,
                "unbalanced: {counts:?}"
            );
        }
        assert!(
            out.iter().all(|o| o.1),
            "particles must end on their owners"
        );
        assert!(
            out.windows(2).all(|w| w[0].2 == w[1].2),
            "all ranks agree on the splitters"
        );
        let shift = 3 * (BITS - ALIGN_LEVEL);
        for &s in &out[0].2[1..3] {
            assert_eq!(s % (1u64 << shift), 0, "splitters sit on cell boundaries");
        }
    }
}
