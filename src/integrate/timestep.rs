//! The integer timeline and the global step choice of design §9.
//!
//! Time is counted in ticks of `dt_max / 2^MAX_LEVEL`. A step on level k lasts
//! `2^(MAX_LEVEL - k)` ticks (`dt_max / 2^k`) and may only start at a tick that is a multiple
//! of its length, so steps never straddle a multiple of `dt_max` — which is where every output
//! time lies — and every step length is an exact power-of-two fraction of `dt_max`.

use thiserror::Error;

/// Deepest subdivision of `dt_max` (steps down to `dt_max / 2^40`).
pub const MAX_LEVEL: u32 = 40;
/// Ticks in one `dt_max`.
pub const TICKS_PER_DT_MAX: u64 = 1 << MAX_LEVEL;

/// The step the accuracy criterion asks for cannot be represented.
#[derive(Debug, Error)]
#[error(
    "at t = {time} the time step criterion asks for dt = {wanted:e}, below dt_max/2^{deepest}; the run is unresolved (check the softening, eta and the initial conditions, or raise integrator.max_rungs)"
)]
pub struct TimestepError {
    /// Simulation time.
    pub time: f64,
    /// Step the criterion asked for.
    pub wanted: f64,
    /// Deepest level allowed.
    pub deepest: u32,
}

/// Integer timeline of one run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timeline {
    /// Largest step.
    pub dt_max: f64,
}

impl Timeline {
    /// Simulation time at tick `ti` (exact for every tick that is a multiple of `dt_max`).
    pub fn time(&self, ti: u64) -> f64 {
        let whole = (ti / TICKS_PER_DT_MAX) as f64 * self.dt_max;
        let frac = (ti % TICKS_PER_DT_MAX) as f64 * (self.dt_max / TICKS_PER_DT_MAX as f64);
        whole + frac
    }

    /// Time from tick `from` to tick `to` (exact: a whole number of ticks below 2^53,
    /// scaled by a power of two).
    pub fn span(&self, from: u64, to: u64) -> f64 {
        (to - from) as f64 * (self.dt_max / TICKS_PER_DT_MAX as f64)
    }

    /// Ticks in `count` whole steps of `dt_max`.
    pub fn ticks(count: u64) -> u64 {
        count.saturating_mul(TICKS_PER_DT_MAX)
    }

    /// Length in ticks of a step on `level`.
    pub fn level_ticks(level: u32) -> u64 {
        1 << (MAX_LEVEL - level)
    }

    /// Length in time of a step on `level` (exact: a power-of-two scaling of `dt_max`).
    pub fn level_dt(&self, level: u32) -> f64 {
        self.dt_max / (1u64 << level) as f64
    }

    /// The shallowest level whose step is at most `wanted` and which may start at `ti`.
    pub fn choose_level(&self, ti: u64, wanted: f64) -> Result<u32, TimestepError> {
        let mut level = 0;
        while self.level_dt(level) > wanted {
            level += 1;
            if level > MAX_LEVEL {
                return Err(TimestepError {
                    time: self.time(ti),
                    wanted,
                    deepest: MAX_LEVEL,
                });
            }
        }
        while !ti.is_multiple_of(Self::level_ticks(level)) {
            level += 1;
        }
        Ok(level)
    }
}

/// The step `eta sqrt(eps / max|a|)` asks for; unbounded when it cannot be evaluated
/// (zero softening or no acceleration), in which case `dt_max` applies.
pub fn criterion_dt(eta: f64, softening: f64, max_acc: f64) -> f64 {
    if softening > 0.0 && max_acc > 0.0 {
        eta * (softening / max_acc).sqrt()
    } else {
        f64::INFINITY
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_are_aligned_and_hit_dt_max_multiples() {
        let tl = Timeline { dt_max: 0.1 };
        assert_eq!(tl.choose_level(0, 1.0).unwrap(), 0);
        assert_eq!(tl.choose_level(0, 0.05).unwrap(), 1);
        assert_eq!(tl.choose_level(0, 0.049).unwrap(), 2);
        // After a quarter step, a half step may not start: it would straddle 0.1.
        let quarter = Timeline::level_ticks(2);
        assert_eq!(tl.choose_level(quarter, 1.0).unwrap(), 2);
        assert_eq!(tl.choose_level(2 * quarter, 1.0).unwrap(), 1);
        assert_eq!(tl.time(Timeline::ticks(3)), 0.30000000000000004);
        assert!(tl.choose_level(0, 1e-30).is_err());
    }
}
