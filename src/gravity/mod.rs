//! Gravity solvers behind one small interface.
//!
//! `direct` is the f64 reference every other solver is measured against; `softening` holds the
//! pair kernels both share.
//!
//! Owns the `GravitySolver` interface every solver implements, direct summation, the
//! softening kernels and the accuracy checks. Must not know ranks, devices or files.

pub mod accuracy;
pub mod direct;
pub mod external;
pub mod pairwise;
mod pairwise_fast;
pub mod softening;

use crate::fmm::caps::Caps;
use crate::format::short;
use crate::integrate::diagnostics::CONSERVED_SUMS;
use crate::particles::Particles;
use rayon::prelude::*;
use thiserror::Error;

pub use softening::{Softening, SofteningKernel};

/// What one force evaluation cost.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ForceReport {
    /// Particle–particle interactions evaluated.
    pub pair_interactions: u64,
    /// Wall-clock seconds spent.
    pub seconds: f64,
    /// Solver-specific figures, in the order of `GravitySolver::stat_names`.
    pub stats: Vec<SolverStat>,
}

/// One solver-specific figure of an evaluation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SolverStat {
    /// Column name in diagnostics.csv.
    pub name: &'static str,
    /// Its value.
    pub value: f64,
    /// Whether values add up between diagnostics rows (times, retries) or the last one
    /// stands (buffer use).
    pub summed: bool,
}

impl SolverStat {
    /// The figures of a table of columns (name, whether summed) with their values, in order.
    pub fn columns(columns: &[(&'static str, bool)], values: &[f64]) -> Vec<SolverStat> {
        columns
            .iter()
            .zip(values)
            .map(|(&(name, summed), &value)| SolverStat {
                name,
                value,
                summed,
            })
            .collect()
    }
}

/// Why a force evaluation failed.
#[derive(Debug, Error)]
pub enum GravityError {
    /// A particle position or mass is NaN or infinite: the state is already corrupt.
    #[error("particle {id} has a non-finite {what} ({value}); the simulation state is corrupt")]
    NonFinite {
        /// Particle ID.
        id: u64,
        /// Which quantity ("position" or "mass").
        what: &'static str,
        /// The offending value.
        value: f64,
    },
    /// A particle lies farther out than the solvers can represent.
    #[error(
        "particle {id} is at ({}, {}, {}), beyond |x| = 1e15 code units, where the expansions overflow; the input or the integration is wrong",
        short(pos[0]), short(pos[1]), short(pos[2])
    )]
    OutOfRange {
        /// Particle ID.
        id: u64,
        /// Its position.
        pos: [f64; 3],
    },
    /// Ranks could not exchange data (another rank failed, or a timeout).
    #[error("{0}")]
    Communication(String),
    /// The GPU backend failed (driver, kernels, or an evaluation it cannot run).
    #[error("GPU backend: {0}")]
    Device(String),
    /// A device's sort of the particles into tree order is not one (`Tree::adopt_sorted`).
    #[error("GPU backend: {0}")]
    NotSorted(#[from] crate::fmm::tree::NotSorted),
    /// An evaluation the error-controlled MAC (`FmmSettings::accuracy`) does not run yet.
    #[error("the FMM's accuracy target {0}")]
    AccuracyUnsupported(&'static str),
    /// The FMM's buffers kept overflowing.
    #[error("the FMM buffers still overflowed after {retries} retries; raise gravity.cap_growth")]
    CapsDiverged {
        /// Retries made.
        retries: usize,
    },
}

/// Computes accelerations and potentials of every particle from all the others.
pub trait GravitySolver: Send {
    /// Short name for logs ("direct", "fmm").
    fn name(&self) -> &'static str;

    /// Fills `particles.acc` and `particles.pot` (self-interaction excluded).
    fn compute(&mut self, particles: &mut Particles) -> Result<ForceReport, GravityError>;

    /// Accelerations and potentials of the particles flagged in `active`, from every
    /// particle (block time steps). The others keep theirs, or get fresh values too: a
    /// solver may compute more than it is asked for (the default computes all).
    fn compute_active(
        &mut self,
        particles: &mut Particles,
        active: &[bool],
    ) -> Result<ForceReport, GravityError> {
        let _ = active;
        self.compute(particles)
    }

    /// Names of the figures in `ForceReport::stats`.
    fn stat_names(&self) -> Vec<&'static str> {
        Vec::new()
    }

    /// Warnings gathered since the last call (e.g. an unreadable presets file).
    fn take_warnings(&mut self) -> Vec<String> {
        Vec::new()
    }

    /// Lines for the run's log on how the solver works (e.g. how the ranks' GPUs exchange
    /// data), printed once at the start.
    fn notes(&self) -> Vec<String> {
        Vec::new()
    }

    /// Buffer capacities to store in a checkpoint, if the solver has any.
    fn caps(&self) -> Option<Caps> {
        None
    }

    /// Restores capacities from a checkpoint.
    fn set_caps(&mut self, _caps: Caps) {}

    /// Per-particle work of the last evaluation (in the particles' current order) that the
    /// next domain decomposition balances on; empty for a solver without one. Stored in
    /// checkpoints so that a resumed run decomposes, and computes, exactly as it would have.
    fn decomposition_work(&self) -> Vec<f64> {
        Vec::new()
    }

    /// Restores `decomposition_work` from a checkpoint.
    fn set_decomposition_work(&mut self, _work: Vec<f64>) {}

    /// The particle state on this solver's device, when it can keep it there between
    /// steps (the GPU backend); `None` for a solver that works on the host's particles.
    fn resident(&mut self) -> Option<&mut dyn ResidentState> {
        None
    }
}

/// Particles kept on a solver's device for a whole run (design §7): once `load`ed, the
/// device copy is the state; the integrator kicks and drifts it there, each force
/// evaluation brings back only what the host needs for its tree (the GPU solver: the cells,
/// their moments and the sort's sums; the lists are found on the device), and `store`
/// brings the rest back when the host reads it (snapshots, checkpoints); the diagnostics'
/// sums are taken on the device.
/// Masses and components never change during a run and are not brought back.
pub trait ResidentState {
    /// Takes positions, velocities, masses, accelerations, potentials and components of
    /// `particles` onto the device (their order is the device's from now on).
    fn load(&mut self, particles: &Particles) -> Result<(), GravityError>;

    /// `v += a h` on the device.
    fn kick(&mut self, h: f64) -> Result<(), GravityError>;

    /// `x += v h` on the device.
    fn drift(&mut self, h: f64) -> Result<(), GravityError>;

    /// Forces on the device state, which stays there (accelerations and potentials
    /// included); `particles.id` and `mass` serve as the device's, the host's positions are
    /// not brought up to date (`store` does that).
    fn compute(&mut self, particles: &mut Particles) -> Result<ForceReport, GravityError>;

    /// `compute` for the particles listed in `active` (rows of the device's order: the
    /// block scheme's sub-steps): their accelerations and potentials on the device are the
    /// host's `compute_active` would give; the others' are left undefined there (the scheme
    /// reads them only after their own next evaluation).
    fn compute_active(
        &mut self,
        particles: &mut Particles,
        active: &[u32],
    ) -> Result<ForceReport, GravityError>;

    /// `v += a h[k]` on the device for the k-th particle of `rows`, or of all without them
    /// (`leapfrog::kick_each`).
    fn kick_each(&mut self, rows: Option<&[u32]>, h: &[f64]) -> Result<(), GravityError>;

    /// The device's accelerations into `particles.acc`, or with `only` those of the listed
    /// particles (the block scheme's step criterion reads them on the host).
    fn accelerations(
        &mut self,
        particles: &mut Particles,
        only: Option<&[u32]>,
    ) -> Result<(), GravityError>;

    /// The largest |a| of each component's particles, as
    /// `integrate::leapfrog::max_acceleration_by_component` gives it on the host.
    fn max_acceleration_by_component(&mut self) -> Result<[f64; 4], GravityError>;

    /// The sums behind the diagnostics' conserved quantities, as
    /// `integrate::diagnostics::Conserved::sums` gives them on the host (same bits).
    fn conserved_sums(&mut self) -> Result<[f64; CONSERVED_SUMS], GravityError>;

    /// Positions, velocities, accelerations and potentials back into `particles`.
    fn store(&mut self, particles: &mut Particles) -> Result<(), GravityError>;

    /// Adds the external potential `terms` (`ExternalPotential::device_terms` at the
    /// evaluation's time) to the accelerations on the device, of the listed rows or of all.
    fn add_external(&mut self, terms: &[f64], rows: Option<&[u32]>) -> Result<(), GravityError>;

    /// Σ m Φ_ext of the device's particles for the external potential `terms`
    /// (`ExternalPotential::device_terms` at the time wanted), summed as
    /// `ExternalPotential::energy` does.
    fn external_energy(&mut self, terms: &[f64]) -> Result<f64, GravityError>;
}

/// The flags of `n` particles, set for the rows listed in `rows` (a block sub-step's
/// active particles, for a solver that takes flags).
pub fn active_flags(rows: &[u32], n: usize) -> Vec<bool> {
    let mut flags = vec![false; n];
    for &i in rows {
        flags[i as usize] = true;
    }
    flags
}

/// Largest coordinate magnitude the force solvers accept, in code units (kpc in galactic
/// units): an FMM expansion of order p holds powers of the cell size up to about 2p, which
/// overflow f64 near 1e30 (NaN for every particle at 1e40, measured). 1e15 kpc is 2e8 times
/// the Hubble radius: a position beyond it is an input or integration error.
pub const MAX_COORDINATE: f64 = 1e15;

/// Rejects NaN/Inf or out-of-range (|x| > `MAX_COORDINATE`) positions and non-finite masses
/// before a solver turns them into garbage forces.
pub fn check_finite(particles: &Particles) -> Result<(), GravityError> {
    // In parallel, chunk by chunk (a serial scan took 0.030 s of every evaluation at 1e7
    // particles, this 0.020 s on two cores and less on more); the first bad particle in
    // index order is the one reported, whatever the threads.
    const CHUNK: usize = 1 << 14;
    // Folded with `&` rather than stopped at the first bad value, so the compiler can test
    // many values at once; a NaN fails the comparison too.
    let in_range = |v: &[f64]| {
        v.iter()
            .fold(true, |ok, x| ok & (x.abs() <= MAX_COORDINATE))
    };
    let all_finite = |v: &[f64]| v.iter().fold(true, |ok, x| ok & x.is_finite());
    let range = |c: usize| c * CHUNK..((c + 1) * CHUNK).min(particles.len());
    let first = (0..particles.len().div_ceil(CHUNK))
        .into_par_iter()
        .find_first(|&c| {
            let r = range(c);
            !(in_range(particles.pos[r.clone()].as_flattened()) && all_finite(&particles.mass[r]))
        })
        .and_then(|c| {
            range(c).find(|&i| !in_range(&particles.pos[i]) || !particles.mass[i].is_finite())
        });
    if let Some(i) = first {
        let id = particles.id[i];
        for &x in &particles.pos[i] {
            if !x.is_finite() {
                return Err(GravityError::NonFinite {
                    id,
                    what: "position",
                    value: x,
                });
            }
        }
        if !in_range(&particles.pos[i]) {
            return Err(GravityError::OutOfRange {
                id,
                pos: particles.pos[i],
            });
        }
        return Err(GravityError::NonFinite {
            id,
            what: "mass",
            value: particles.mass[i],
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::particles::Component;

    #[test]
    fn check_finite_names_the_first_bad_particle_in_index_order() {
        let n = 3 * (1 << 14) + 5;
        let mut p = Particles::with_capacity(n);
        for i in 0..n {
            let x = i as f64;
            p.push(
                [x, -x, 0.5],
                [0.0; 3],
                1.0,
                1000 + i as u64,
                Component::Halo,
            );
        }
        assert!(check_finite(&p).is_ok());
        // Bad values in a later chunk, an earlier chunk's last particle and the very end.
        p.pos[2 * (1 << 14) + 3][1] = f64::NAN;
        p.mass[n - 1] = f64::INFINITY;
        p.mass[(1 << 14) - 1] = f64::NEG_INFINITY;
        let e = check_finite(&p).unwrap_err().to_string();
        assert_eq!(
            e,
            "particle 17383 has a non-finite mass (-inf); the simulation state is corrupt"
        );
        p.mass[(1 << 14) - 1] = 1.0;
        p.pos[5][2] = f64::INFINITY;
        p.mass[5] = f64::NAN;
        let e = check_finite(&p).unwrap_err().to_string();
        assert!(
            e.starts_with("particle 1005 has a non-finite position (inf)"),
            "{e}"
        );
        p.pos[5] = [5.0, -5.0, 0.5];
        p.mass[5] = 1.0;
        p.pos[7][0] = -1e40;
        let e = check_finite(&p).unwrap_err().to_string();
        assert!(
            e.starts_with("particle 1007 is at (-1e40, -7, 0.5), beyond |x| = 1e15"),
            "{e}"
        );
    }
}
