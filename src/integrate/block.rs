//! Hierarchical (block) time steps (design §9): every particle on its own rung k, a step of
//! `dt_max / 2^k` on the integer timeline, kick-drift-kick on the hierarchy. A cycle starts
//! where every particle is synchronised; at each tick where some steps end, everybody
//! drifts there, the particles whose step ends get forces and their closing half kick, and,
//! unless everybody is synchronised again (the cycle's end), a new rung and the opening
//! half kick of their next step. A particle may move to a shorter rung at any end of its own
//! step, to a longer one only where that rung is synchronised (`rung_for`); since every rung
//! divides `dt_max`, every multiple of `dt_max` (every output time) ends a cycle.

use super::timestep::{Timeline, TimestepError};

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

/// Every particle's rung and the tick where its current step began (one rank's particles,
/// in their order).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Rungs {
    /// Rung of each particle.
    pub rung: Vec<u32>,
    /// Tick where each particle's current step began.
    pub begin: Vec<u64>,
}

impl Rungs {
    /// Everybody's first step of a cycle, starting at `ti`.
    pub fn start(ti: u64, rung: Vec<u32>) -> Self {
        let begin = vec![ti; rung.len()];
        Rungs { rung, begin }
    }

    /// Tick where particle `i`'s step ends.
    pub fn end(&self, i: usize) -> u64 {
        self.begin[i] + Timeline::level_ticks(self.rung[i])
    }

    /// The first tick where one of these particles' steps ends (`u64::MAX` for none).
    pub fn next_end(&self) -> u64 {
        (0..self.rung.len())
            .map(|i| self.end(i))
            .min()
            .unwrap_or(u64::MAX)
    }

    /// Which particles' steps end at `ti`.
    pub fn ending_at(&self, ti: u64) -> Vec<bool> {
        (0..self.rung.len()).map(|i| self.end(i) == ti).collect()
    }

    /// Starts particle `i`'s next step at `ti`, where its last one ended, on `rung`.
    pub fn restart(&mut self, i: usize, ti: u64, rung: u32) {
        debug_assert_eq!(self.end(i), ti);
        debug_assert!(ti.is_multiple_of(Timeline::level_ticks(rung)));
        self.rung[i] = rung;
        self.begin[i] = ti;
    }

    /// Particles on each rung 0..=`deepest`.
    pub fn histogram(&self, deepest: u32) -> Vec<u64> {
        let mut h = vec![0u64; deepest as usize + 1];
        for &r in &self.rung {
            h[r.min(deepest) as usize] += 1;
        }
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ics::sampling::block_rng;
    use crate::integrate::timestep::TICKS_PER_DT_MAX;
    use rand::RngExt;

    #[test]
    fn rung_rules_hold_over_random_sequences() {
        // Property test: random step wishes for 40 particles over 6 dt_max; no particle moves
        // to a longer rung off that rung's synchronisation points, every step stays inside
        // one dt_max (so every output time synchronises everybody), and the ticks advance.
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
            let mut ti = 0;
            let end = 6 * TICKS_PER_DT_MAX;
            let mut events = 0;
            while ti < end {
                let next = rungs.next_end();
                assert!(next > ti);
                // No step straddles a multiple of dt_max.
                assert!(next.div_ceil(TICKS_PER_DT_MAX) * TICKS_PER_DT_MAX >= next);
                assert_eq!(
                    ti / TICKS_PER_DT_MAX,
                    (next - 1) / TICKS_PER_DT_MAX,
                    "a step crosses an output time"
                );
                ti = next;
                events += 1;
                let ending = rungs.ending_at(ti);
                if ti.is_multiple_of(TICKS_PER_DT_MAX) {
                    assert!(
                        ending.iter().all(|&e| e),
                        "not everybody synchronised at {ti}"
                    );
                }
                for i in (0..n).filter(|&i| ending[i]) {
                    let old = rungs.rung[i];
                    let new = rung_for(&tl, ti, wish(random()), deepest).unwrap();
                    if new < old {
                        assert!(
                            ti.is_multiple_of(Timeline::level_ticks(new)),
                            "particle {i} moved to rung {new} off its synchronisation point"
                        );
                    }
                    rungs.restart(i, ti, new);
                }
            }
            assert_eq!(ti, end);
            assert!(events >= 6);
        }
    }

    #[test]
    fn rungs_deeper_than_allowed_are_an_error() {
        let tl = Timeline { dt_max: 1.0 };
        assert_eq!(rung_for(&tl, 0, 0.3, 4).unwrap(), 2);
        let e = rung_for(&tl, 0, 0.01, 4).unwrap_err();
        assert!(e.to_string().contains("dt_max/2^4"), "{e}");
        let r = Rungs::start(0, vec![0, 2, 1]);
        assert_eq!(r.next_end(), Timeline::level_ticks(2));
        assert_eq!(
            r.ending_at(Timeline::level_ticks(2)),
            vec![false, true, false]
        );
        assert_eq!(r.histogram(3), vec![1, 1, 1, 0]);
    }
}
