//! Gravity solvers behind one small interface.
//!
//! `direct` is the f64 reference every other solver is measured against; `softening` holds the
//! pair kernels both share.

pub mod direct;
pub mod softening;

use crate::particles::Particles;
use thiserror::Error;

pub use direct::DirectSummation;
pub use softening::{Softening, SofteningKernel};

/// What one force evaluation cost.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ForceReport {
    /// Particle–particle interactions evaluated.
    pub pair_interactions: u64,
    /// Wall-clock seconds spent.
    pub seconds: f64,
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
}

/// Computes accelerations and potentials of every particle from all the others.
pub trait GravitySolver: Send {
    /// Short name for logs ("direct", "fmm").
    fn name(&self) -> &'static str;

    /// Fills `particles.acc` and `particles.pot` (self-interaction excluded).
    fn compute(&mut self, particles: &mut Particles) -> Result<ForceReport, GravityError>;
}

/// Rejects NaN/Inf positions and masses before a solver turns them into garbage forces.
pub fn check_finite(particles: &Particles) -> Result<(), GravityError> {
    for i in 0..particles.len() {
        for &x in &particles.pos[i] {
            if !x.is_finite() {
                return Err(GravityError::NonFinite {
                    id: particles.id[i],
                    what: "position",
                    value: x,
                });
            }
        }
        if !particles.mass[i].is_finite() {
            return Err(GravityError::NonFinite {
                id: particles.id[i],
                what: "mass",
                value: particles.mass[i],
            });
        }
    }
    Ok(())
}
