//! Hierarchical (block) time steps (design §9): every particle on its own rung k, a step of
//! `dt_max / 2^k` on the integer timeline, kick-drift-kick on the hierarchy. A cycle starts
//! where every particle is synchronised; at each tick where some steps end, everybody
//! drifts there, the particles whose step ends get forces and their closing half kick, and,
//! unless everybody is synchronised again (the cycle's end), a new rung and the opening
//! half kick of their next step. A particle may move to a shorter rung at any end of its own
//! step, to a longer one only where that rung is synchronised (`rung_for`); since every rung
//! divides `dt_max`, every multiple of `dt_max` (every output time) ends a cycle.

use super::timestep::{TICKS_PER_DT_MAX, Timeline, TimestepError};
use rayon::prelude::*;

/// The rung a particle takes when its step ends at tick `ti`: the longest step no longer than
/// `wanted` that is synchronised at `ti` (so a longer rung only where it is synchronised),
/// at most `max_rungs` deep.
pub fn rung_for(
    timeline: &Timeline,
    ti: u64,
    wanted: f64,
    max_rungs: u32,
) -> Result<u32, TimestepError> {
    let rung = timeline.choose_level(ti, wanted)?;
    if rung > max_rungs {
        return Err(TimestepError {
            time: timeline.time(ti),
            wanted,
            deepest: max_rungs,
        });
    }
    Ok(rung)
}

/// `rung_for` of each of `wanted` (a cycle's start: every particle's rung), in parallel; the
/// error is the first failing particle's in index order, whatever the threads.
pub fn rungs_for(
    timeline: &Timeline,
    ti: u64,
    wanted: &[f64],
    max_rungs: u32,
) -> Result<Vec<u32>, TimestepError> {
    // A rung no particle can have marks a failure (an error per particle would take 32 B
    // each); the first one's error is found again.
    const FAILED: u32 = u32::MAX;
    let rungs: Vec<u32> = wanted
        .par_iter()
        .map(|&w| rung_for(timeline, ti, w, max_rungs).unwrap_or(FAILED))
        .collect();
    // (A serial scan: rayon's position_first took 47 ms at 1e7 on 2 cores, this 8.)
    match rungs.iter().position(|&r| r == FAILED) {
        Some(i) => rung_for(timeline, ti, wanted[i], max_rungs).map(|_| Vec::new()),
        None => Ok(rungs),
    }
}

/// Particles per chunk of `Rungs::start`'s parallel passes.
const START_CHUNK: usize = 1 << 16;

/// Every particle's rung (one rank's particles, in their order), kept by rung so that a
/// sub-step's bookkeeping costs in proportion to the particles whose steps end there, not
/// to all of them (a deep hierarchy's finest rungs hold few: at 1e7 particles a scan of
/// all per sub-step cost more than the device's whole sub-step).
///
/// Each particle's current step began at a multiple of its rung's ticks no later than
/// `now` (`rung_for` picks only rungs synchronised where a step starts) and ends after it,
/// so a particle on rung r ends its step at the first multiple of r's ticks after `now`,
/// and the particles whose steps end at the next such tick are whole rungs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Rungs {
    /// Rung of each particle (read through `rung`: the lists below follow it).
    rung: Vec<u32>,
    /// The particles on each rung, in the order they joined it.
    members: Vec<Vec<u32>>,
    /// Each particle's place in its rung's `members`.
    slot: Vec<u32>,
    /// The tick the hierarchy is at (where the last steps ended).
    now: u64,
}

impl Rungs {
    /// Everybody's first step of a cycle, starting at `ti`.
    pub fn start(ti: u64, rung: Vec<u32>) -> Self {
        // In parallel over chunks of particles (a serial pass took ~80 ms at 1e7 over 3
        // rungs on 2 cores, this ~45): each chunk counts its particles per rung, the
        // counts' prefix sums give each chunk its places in every rung's members, and each
        // chunk fills those, in index order.
        let rungs = rung.iter().copied().max().map_or(0, |r| r as usize + 1);
        let chunks: Vec<&[u32]> = rung.chunks(START_CHUNK).collect();
        let counts: Vec<Vec<u32>> = chunks
            .par_iter()
            .map(|chunk| {
                let mut count = vec![0u32; rungs];
                for &r in *chunk {
                    count[r as usize] += 1;
                }
                count
            })
            .collect();
        // Each chunk's first place in every rung's members (the counts' prefix sums), and
        // the rungs' sizes.
        let mut size = vec![0u32; rungs];
        let firsts: Vec<Vec<u32>> = counts
            .iter()
            .map(|count| {
                let first = size.clone();
                for (s, &c) in size.iter_mut().zip(count) {
                    *s += c;
                }
                first
            })
            .collect();
        let mut members: Vec<Vec<u32>> = size.iter().map(|&s| vec![0; s as usize]).collect();
        // Each chunk's share of every rung's members, cut off in chunk order.
        let mut shares: Vec<Vec<&mut [u32]>> = (0..chunks.len()).map(|_| Vec::new()).collect();
        for (r, list) in members.iter_mut().enumerate() {
            let mut rest = list.as_mut_slice();
            for (share, count) in shares.iter_mut().zip(&counts) {
                let (mine, after) = rest.split_at_mut(count[r] as usize);
                share.push(mine);
                rest = after;
            }
        }
        let mut slot = vec![0u32; rung.len()];
        slot.par_chunks_mut(START_CHUNK)
            .zip(shares.par_iter_mut())
            .zip(firsts.par_iter())
            .enumerate()
            .for_each(|(c, ((slots, share), first))| {
                let mut next = vec![0usize; rungs];
                let base = c * START_CHUNK;
                for (k, (s, &r)) in slots.iter_mut().zip(chunks[c]).enumerate() {
                    let r = r as usize;
                    share[r][next[r]] = (base + k) as u32;
                    *s = first[r] + next[r] as u32;
                    next[r] += 1;
                }
            });
        Rungs {
            rung,
            members,
            slot,
            now: ti,
        }
    }

    /// Puts particle `i` into its rung's members.
    fn join(&mut self, i: u32) {
        let r = self.rung[i as usize] as usize;
        if self.members.len() <= r {
            self.members.resize_with(r + 1, Vec::new);
        }
        self.slot[i as usize] = self.members[r].len() as u32;
        self.members[r].push(i);
    }

    /// The rungs holding particles, with their step in ticks.
    fn occupied(&self) -> impl Iterator<Item = (usize, u64)> + '_ {
        (0..self.members.len())
            .filter(|&r| !self.members[r].is_empty())
            .map(|r| (r, Timeline::level_ticks(r as u32)))
    }

    /// The first tick after `now` where one of these particles' steps ends (`u64::MAX`
    /// for none).
    pub fn next_end(&self) -> u64 {
        self.occupied()
            .map(|(_, ticks)| (self.now / ticks + 1) * ticks)
            .min()
            .unwrap_or(u64::MAX)
    }

    /// Moves the hierarchy to `ti`, where steps end (at most the `next_end` of every rank,
    /// so that no step here ends before it).
    pub fn advance(&mut self, ti: u64) {
        debug_assert!(ti > self.now && ti <= self.next_end());
        self.now = ti;
    }

    /// The rungs whose steps end at `now`.
    fn ending(&self) -> impl Iterator<Item = &Vec<u32>> + '_ {
        self.occupied()
            .filter(|&(_, ticks)| self.now.is_multiple_of(ticks))
            .map(|(r, _)| &self.members[r])
    }

    /// Each particle's rung.
    pub fn rung(&self) -> &[u32] {
        &self.rung
    }

    /// How many particles' steps end at `now`.
    pub fn count_ending(&self) -> usize {
        self.ending().map(Vec::len).sum()
    }

    /// The particles whose steps end at `now`, rung by rung (not in index order).
    pub fn ending_rows(&self) -> Vec<u32> {
        let mut rows = Vec::with_capacity(self.count_ending());
        for members in self.ending() {
            rows.extend_from_slice(members);
        }
        rows
    }

    /// Starts particle `i`'s next step at `now`, where its last one ended, on `rung`.
    pub fn restart(&mut self, i: u32, rung: u32) {
        let old = self.rung[i as usize] as usize;
        debug_assert!(self.now.is_multiple_of(Timeline::level_ticks(old as u32)));
        debug_assert!(self.now.is_multiple_of(Timeline::level_ticks(rung)));
        if old == rung as usize {
            return;
        }
        let at = self.slot[i as usize] as usize;
        self.members[old].swap_remove(at);
        if let Some(&moved) = self.members[old].get(at) {
            self.slot[moved as usize] = at as u32;
        }
        self.rung[i as usize] = rung;
        self.join(i);
    }

    /// Particles on each rung 0..=`deepest`.
    pub fn histogram(&self, deepest: u32) -> Vec<u64> {
        let mut h = vec![0u64; deepest as usize + 1];
        for (r, members) in self.members.iter().enumerate() {
            h[r.min(deepest as usize)] += members.len() as u64;
        }
        h
    }
}

/// What one block cycle (`cycle`) asks of whoever keeps the particles: one rank of a run
/// (on the host or a device; its collectives make every rank agree) or a Python simulation
/// (one rank, its collectives the identity).
pub trait BlockKeeper {
    /// Its error (a rung too deep among them).
    type Error: From<TimestepError>;
    /// Particles on this rank.
    fn own_particles(&self) -> usize;
    /// The step each particle's acceleration asks for (of `rows`, or of all).
    fn wanted_steps(&mut self, rows: Option<&[u32]>) -> Result<Vec<f64>, Self::Error>;
    /// `v += a h[k]` for the k-th particle of `rows` (of all without them).
    fn kick_each(&mut self, rows: Option<&[u32]>, h: &[f64]) -> Result<(), Self::Error>;
    /// `x += v h` for every particle.
    fn drift(&mut self, h: f64) -> Result<(), Self::Error>;
    /// Forces at simulation time `time` on the particles of `rows`, their accelerations
    /// then readable by `wanted_steps`.
    fn forces_of(&mut self, rows: &[u32], time: f64) -> Result<(), Self::Error>;
    /// Forces on every particle at `time` (a cycle's end), which may move particles between
    /// ranks: `rung` (one per particle) travels with them and comes back in their new order.
    fn forces_of_all(&mut self, rung: Vec<u8>, time: f64) -> Result<Vec<u8>, Self::Error>;
    /// The smallest of every rank's `tick`.
    fn earliest(&mut self, tick: u64) -> Result<u64, Self::Error>;
    /// Every rank's `values` added up.
    fn sum(&mut self, values: &[u64]) -> Result<Vec<u64>, Self::Error>;
    /// The largest of every rank's `value`.
    fn largest(&mut self, value: f64) -> Result<f64, Self::Error>;
}

/// How a block cycle ended (`cycle`).
#[derive(Debug, Clone, PartialEq)]
pub struct CycleEnd {
    /// The tick it ended at (a synchronisation point).
    pub ti: u64,
    /// The finest rung any rank used.
    pub finest: u32,
    /// Particles per rung at its start, over every rank.
    pub histogram: Vec<u64>,
    /// Particle force evaluations it made, over every rank.
    pub evaluations: u64,
    /// Those the global scheme would have made at its shortest step.
    pub global_evaluations: f64,
}

/// One cycle of the block scheme from the synchronisation point `ti0` to the next: rungs
/// from every particle's acceleration (at most `deepest`), the opening half kicks, then at
/// each tick where steps end a drift of everybody, forces for the particles whose step ends,
/// their closing half kick, and (unless everybody is synchronised) a new rung and opening
/// half kick. The bookkeeping of a sub-step goes with its active particles only.
pub fn cycle<K: BlockKeeper>(
    keeper: &mut K,
    timeline: &Timeline,
    ti0: u64,
    deepest: u32,
) -> Result<CycleEnd, K::Error> {
    let n = keeper.own_particles();
    let wanted = keeper.wanted_steps(None)?;
    let mut rungs = Rungs::start(ti0, rungs_for(timeline, ti0, &wanted, deepest)?);
    let own = rungs.histogram(deepest);
    let mut finest = own.iter().rposition(|&c| c > 0).unwrap_or(0) as u32;
    let histogram = keeper.sum(&own)?;
    let timeline = *timeline;
    let half_step = move |r: u32| 0.5 * timeline.level_dt(r);
    let half: Vec<f64> = rungs.rung().par_iter().map(|&r| half_step(r)).collect();
    keeper.kick_each(None, &half)?;
    let mut ti = ti0;
    let mut evaluations = 0;
    loop {
        let next = keeper.earliest(rungs.next_end())?;
        if next == u64::MAX {
            // No particle on any rank: on to the next multiple of dt_max.
            ti = (ti0 / TICKS_PER_DT_MAX + 1) * TICKS_PER_DT_MAX;
            break;
        }
        keeper.drift(timeline.span(ti, next))?;
        ti = next;
        rungs.advance(ti);
        let counts = keeper.sum(&[rungs.count_ending() as u64, n as u64])?;
        evaluations += counts[0];
        if counts[0] == counts[1] {
            let rung = rungs.rung().iter().map(|&r| r as u8).collect();
            let rung = keeper.forces_of_all(rung, timeline.time(ti))?;
            let half: Vec<f64> = rung.par_iter().map(|&r| half_step(u32::from(r))).collect();
            keeper.kick_each(None, &half)?;
            break;
        }
        let active = rungs.ending_rows();
        keeper.forces_of(&active, timeline.time(ti))?;
        let closing: Vec<f64> = active
            .par_iter()
            .map(|&i| half_step(rungs.rung()[i as usize]))
            .collect();
        keeper.kick_each(Some(&active), &closing)?;
        let wanted = keeper.wanted_steps(Some(&active))?;
        let mut opening = Vec::with_capacity(active.len());
        for (&i, &w) in active.iter().zip(&wanted) {
            let r = rung_for(&timeline, ti, w, deepest)?;
            rungs.restart(i, r);
            finest = finest.max(r);
            opening.push(half_step(r));
        }
        keeper.kick_each(Some(&active), &opening)?;
    }
    let finest = keeper.largest(f64::from(finest))? as u32;
    let steps = (ti - ti0) / Timeline::level_ticks(finest);
    Ok(CycleEnd {
        ti,
        finest,
        global_evaluations: (histogram.iter().sum::<u64>() * steps) as f64,
        histogram,
        evaluations,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ics::sampling::block_rng;
    use crate::integrate::timestep::TICKS_PER_DT_MAX;
    use rand::RngExt;

    #[test]
    fn rung_rules_hold_over_random_sequences() {
        // Property test: random step wishes for 40 particles over 6 dt_max; the rungs' steps
        // end where a brute-force model of every particle's step (its begin tick) says; no
        // particle moves to a longer rung off that rung's synchronisation points, every step
        // stays inside one dt_max (so every output time synchronises everybody), and the
        // ticks advance.
        let tl = Timeline { dt_max: 0.5 };
        let mut rng = block_rng(12345, 0, 0);
        let mut random = move || rng.random::<f64>();
        for trial in 0..50 {
            let n = 40;
            let deepest = 1 + trial % 8;
            let wish = |r: f64| 0.5 * 2f64.powf(-(r * deepest as f64));
            let mut rungs = Rungs::start(
                0,
                (0..n)
                    .map(|_| rung_for(&tl, 0, wish(random()), deepest).unwrap())
                    .collect(),
            );
            let mut begin = vec![0u64; n];
            let end_of = |rungs: &Rungs, begin: &[u64], i: usize| {
                begin[i] + Timeline::level_ticks(rungs.rung()[i])
            };
            let mut ti = 0;
            let end = 6 * TICKS_PER_DT_MAX;
            let mut events = 0;
            while ti < end {
                let next = rungs.next_end();
                let model = (0..n).map(|i| end_of(&rungs, &begin, i)).min().unwrap();
                assert_eq!(next, model);
                assert!(next > ti);
                assert_eq!(
                    ti / TICKS_PER_DT_MAX,
                    (next - 1) / TICKS_PER_DT_MAX,
                    "a step crosses an output time"
                );
                ti = next;
                rungs.advance(ti);
                events += 1;
                let mut ending = rungs.ending_rows();
                ending.sort_unstable();
                let model: Vec<u32> = (0..n as u32)
                    .filter(|&i| end_of(&rungs, &begin, i as usize) == ti)
                    .collect();
                assert_eq!(ending, model);
                assert_eq!(rungs.count_ending(), model.len());
                if ti.is_multiple_of(TICKS_PER_DT_MAX) {
                    assert_eq!(ending.len(), n, "not everybody synchronised at {ti}");
                }
                for &i in &ending {
                    let old = rungs.rung()[i as usize];
                    let new = rung_for(&tl, ti, wish(random()), deepest).unwrap();
                    if new < old {
                        assert!(
                            ti.is_multiple_of(Timeline::level_ticks(new)),
                            "particle {i} moved to rung {new} off its synchronisation point"
                        );
                    }
                    rungs.restart(i, new);
                    begin[i as usize] = ti;
                }
                let mut model = vec![0u64; deepest as usize + 1];
                for &r in rungs.rung() {
                    model[r as usize] += 1;
                }
                assert_eq!(rungs.histogram(deepest), model);
            }
            assert_eq!(ti, end);
            assert!(events >= 6);
        }
    }

    #[test]
    fn rung_lists_built_in_chunks_hold_every_particle_once_in_order() {
        // Several of `start`'s chunks and a partial one, rungs 0..6 with gaps; then moves
        // between rungs keep each particle's slot.
        let n = 3 * START_CHUNK + 123;
        let mut rng = block_rng(7, 0, 0);
        let rung: Vec<u32> = (0..n)
            .map(|_| [0, 1, 3, 6][rng.random_range(0..4)])
            .collect();
        let mut rungs = Rungs::start(0, rung.clone());
        let check = |rungs: &Rungs| {
            let total: usize = rungs.members.iter().map(Vec::len).sum();
            assert_eq!(total, n);
            for i in 0..n {
                let on = &rungs.members[rungs.rung[i] as usize];
                assert_eq!(on[rungs.slot[i] as usize], i as u32, "particle {i}");
            }
        };
        check(&rungs);
        for list in &rungs.members {
            assert!(list.windows(2).all(|w| w[0] < w[1]), "members out of order");
        }
        assert_eq!(
            rungs.histogram(6),
            vec![
                rung.iter().filter(|&&r| r == 0).count() as u64,
                rung.iter().filter(|&&r| r == 1).count() as u64,
                0,
                rung.iter().filter(|&&r| r == 3).count() as u64,
                0,
                0,
                rung.iter().filter(|&&r| r == 6).count() as u64,
            ]
        );
        rungs.advance(Timeline::level_ticks(0));
        for i in (0..n as u32).step_by(7) {
            rungs.restart(i, [2, 6, 0][i as usize % 3]);
        }
        check(&rungs);
        assert!(Rungs::start(5, Vec::new()).ending_rows().is_empty());
    }

    #[test]
    fn rungs_deeper_than_allowed_are_an_error() {
        let tl = Timeline { dt_max: 1.0 };
        assert_eq!(rung_for(&tl, 0, 0.3, 4).unwrap(), 2);
        let e = rung_for(&tl, 0, 0.01, 4).unwrap_err();
        assert!(e.to_string().contains("dt_max/2^4"), "{e}");
        let wanted = [1.0, 0.3, 0.01, 0.6, 0.001];
        assert_eq!(rungs_for(&tl, 0, &wanted[..2], 4).unwrap(), vec![0, 2]);
        // The first failing particle's error: 0.01 (dt_max/2^7), not 0.001.
        let e = rungs_for(&tl, 0, &wanted, 4).unwrap_err();
        assert_eq!(e.wanted, 0.01);
        let mut r = Rungs::start(0, vec![0, 2, 1]);
        assert_eq!(r.next_end(), Timeline::level_ticks(2));
        r.advance(Timeline::level_ticks(2));
        assert_eq!(r.ending_rows(), vec![1]);
        assert_eq!(r.histogram(3), vec![1, 1, 1, 0]);
    }
}
