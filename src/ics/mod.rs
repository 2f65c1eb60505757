//! Initial conditions: model files and the samplers that turn them into particles.
//!
//! Every sampler draws from deterministic substreams (one per block of particle IDs), so the
//! same model, N and seed give the same bits for any number of threads.

pub mod disk;
pub mod hernquist;
pub mod plummer;
pub mod sampling;

use crate::config::{ConfigError, SourceText};
use crate::particles::{Component, Particles};
use crate::units::UnitSystem;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// A model file (`ics/*.toml`). See `docs/config.md`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelFile {
    /// Unit system the model's numbers are in.
    #[serde(default)]
    pub units: UnitSystem,
    /// A single spherical component (test problems with analytic answers).
    pub sphere: Option<SphereModel>,
}

/// Density profile of a spherical model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SphereProfile {
    /// Plummer (1911): rho ∝ (1 + r²/a²)^(-5/2).
    Plummer,
    /// Hernquist (1990): rho ∝ 1 / (r/a (1 + r/a)^3).
    Hernquist,
}

/// `[sphere]` in a model file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SphereModel {
    /// Density profile.
    pub profile: SphereProfile,
    /// Total mass of the untruncated profile.
    pub mass: f64,
    /// Scale radius `a`.
    pub scale_radius: f64,
    /// Particles are drawn only inside this radius (the profile is unchanged inside it).
    pub truncation_radius: Option<f64>,
}

impl ModelFile {
    /// Reads and validates a model file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let source = SourceText::read(path)?;
        let model: ModelFile = source.parse()?;
        model.validate(&source)?;
        Ok(model)
    }

    fn validate(&self, s: &SourceText) -> Result<(), ConfigError> {
        let Some(sphere) = &self.sphere else {
            return Err(s.invalid(
                "sphere",
                "(missing)",
                "the model file describes no component; add a [sphere] table",
            ));
        };
        for (key, v) in [
            ("sphere.mass", sphere.mass),
            ("sphere.scale_radius", sphere.scale_radius),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(s.invalid(key, v, "must be a positive number"));
            }
        }
        if let Some(rt) = sphere.truncation_radius
            && !(rt.is_finite() && rt > 0.0)
        {
            return Err(s.invalid(
                "sphere.truncation_radius",
                rt,
                "must be a positive number (or omitted for no truncation)",
            ));
        }
        Ok(())
    }
}

/// Samples `n` particles of `model` with random streams derived from `seed`; the result is
/// centred on the origin in position and velocity.
pub fn generate(model: &ModelFile, n: usize, seed: u64) -> Particles {
    let g = model.units.gravitational_constant();
    let mut particles = match &model.sphere {
        Some(sphere) => match sphere.profile {
            SphereProfile::Plummer => {
                let p = plummer::Plummer::new(sphere.mass, sphere.scale_radius, g);
                sampling::sample_sphere(
                    &p,
                    sphere.truncation_radius,
                    n,
                    seed,
                    0,
                    Component::Generic,
                    1,
                )
            }
            SphereProfile::Hernquist => {
                let h = hernquist::Hernquist::new(sphere.mass, sphere.scale_radius, g);
                sampling::sample_sphere(
                    &h,
                    sphere.truncation_radius,
                    n,
                    seed,
                    0,
                    Component::Generic,
                    1,
                )
            }
        },
        None => Particles::default(),
    };
    sampling::centre(&mut particles);
    particles
}
