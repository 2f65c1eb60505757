//! Initial conditions: model files and the samplers that turn them into particles.
//!
//! Every sampler draws from deterministic substreams (one per block of particle IDs), so the
//! same model, N and seed give the same bits for any number of threads.
//!
//! Owns model files and sampling (equilibrium models, galaxies). Must not run forces or
//! integrate.

pub mod encounter;
pub mod galaxy;
pub mod hernquist;
pub mod plummer;
pub mod sampling;

use crate::particles::{Component, Particles};
use crate::source::{ConfigError, SourceText};
use crate::units::UnitSystem;
pub use sampling::Share;
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
    /// Dark-matter halo of a galaxy.
    pub halo: Option<HaloModel>,
    /// Stellar disk of a galaxy.
    pub disk: Option<DiskModel>,
    /// Stellar bulge of a galaxy.
    pub bulge: Option<BulgeModel>,
}

/// Halo density profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HaloProfile {
    /// Hernquist (`mass`, `scale_radius`).
    Hernquist,
    /// NFW (`m200`, `concentration`), galactic units only.
    Nfw,
}

/// `[halo]` in a model file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HaloModel {
    /// Density profile.
    pub profile: HaloProfile,
    /// Hernquist: total mass of the untapered profile.
    pub mass: Option<f64>,
    /// Hernquist: scale radius.
    pub scale_radius: Option<f64>,
    /// NFW: mass inside r200 (200 times the critical density).
    pub m200: Option<f64>,
    /// NFW: r200 / r_s.
    pub concentration: Option<f64>,
    /// NFW: Hubble parameter h (H0 = 100 h km/s/Mpc).
    #[serde(default = "default_hubble")]
    pub hubble: f64,
    /// Radius beyond which the density is tapered exponentially (NFW default: r200).
    pub truncation_radius: Option<f64>,
    /// Relative particle count (scaled with the others to the requested N).
    pub particles: f64,
    /// The component's own softening length (default: the run's `gravity.softening`).
    pub softening: Option<f64>,
    /// A rigid halo: not sampled, but its (untapered) potential sets the other components'
    /// velocities and acts on every particle of the run as an external potential.
    #[serde(default)]
    pub rigid: bool,
}

fn default_hubble() -> f64 {
    0.7
}

/// `[bulge]` in a model file (Hernquist).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BulgeModel {
    /// Total mass of the untapered profile.
    pub mass: f64,
    /// Scale radius.
    pub scale_radius: f64,
    /// Radius beyond which the density is tapered exponentially.
    pub truncation_radius: Option<f64>,
    /// Relative particle count.
    pub particles: f64,
    /// The component's own softening length (default: the run's `gravity.softening`).
    pub softening: Option<f64>,
}

/// How the disk's radial dispersion follows the Toomre Q.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum QProfileKind {
    /// σ_R ∝ exp(−R/2R_d), Q = toomre_q at q_radius.
    #[default]
    Exponential,
    /// Q = toomre_q at every radius.
    Constant,
}

/// `[disk]` in a model file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiskModel {
    /// Total mass.
    pub mass: f64,
    /// Exponential scale length R_d.
    pub scale_length: f64,
    /// sech² scale height z0.
    pub scale_height: f64,
    /// Truncation radius (smooth, width R_d/4); default 8 R_d.
    pub truncation_radius: Option<f64>,
    /// Toomre Q.
    pub toomre_q: f64,
    /// Q profile.
    #[serde(default)]
    pub q_profile: QProfileKind,
    /// Radius where Q = toomre_q for the exponential profile; default 2.5 R_d.
    pub q_radius: Option<f64>,
    /// Relative particle count.
    pub particles: f64,
    /// The component's own softening length (default: the run's `gravity.softening`).
    pub softening: Option<f64>,
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
        let positive = |key: &str, v: f64| -> Result<(), ConfigError> {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(s.invalid(key, v, "must be a positive number"))
            }
        };
        let optional = |key: &str, v: Option<f64>| match v {
            Some(v) => positive(key, v),
            None => Ok(()),
        };
        let galaxy = self.halo.is_some() || self.disk.is_some() || self.bulge.is_some();
        match (&self.sphere, galaxy) {
            (Some(_), true) => {
                return Err(s.invalid(
                    "sphere",
                    "[sphere]",
                    "a model is either one [sphere] or a galaxy of [halo], [disk] and [bulge]; not both",
                ));
            }
            (None, false) => {
                return Err(s.invalid(
                    "sphere",
                    "(missing)",
                    "the model file describes no component; add [sphere], or any of [halo], [disk], [bulge]",
                ));
            }
            _ => {}
        }
        if let Some(sphere) = &self.sphere {
            positive("sphere.mass", sphere.mass)?;
            positive("sphere.scale_radius", sphere.scale_radius)?;
            optional("sphere.truncation_radius", sphere.truncation_radius)?;
        }
        if let Some(h) = &self.halo {
            if h.rigid && h.truncation_radius.is_some() {
                return Err(s.invalid(
                    "halo.truncation_radius",
                    h.truncation_radius.unwrap_or_default(),
                    "a rigid halo is the untapered profile (its potential is analytic); drop truncation_radius or set rigid = false",
                ));
            }
            if h.rigid && self.disk.is_none() && self.bulge.is_none() {
                return Err(s.invalid(
                    "halo.rigid",
                    true,
                    "a rigid halo alone leaves no particles to sample; add a [disk] or [bulge]",
                ));
            }
            positive("halo.particles", h.particles)?;
            optional("halo.truncation_radius", h.truncation_radius)?;
            optional("halo.softening", h.softening)?;
            match h.profile {
                HaloProfile::Hernquist => {
                    positive("halo.mass", h.mass.unwrap_or(f64::NAN))?;
                    positive("halo.scale_radius", h.scale_radius.unwrap_or(f64::NAN))?;
                }
                HaloProfile::Nfw => {
                    if self.units != UnitSystem::Galactic {
                        return Err(s.invalid(
                            "halo.profile",
                            "\"nfw\"",
                            "an NFW halo is given by m200 and a concentration, which need galactic units",
                        ));
                    }
                    positive("halo.m200", h.m200.unwrap_or(f64::NAN))?;
                    positive("halo.concentration", h.concentration.unwrap_or(f64::NAN))?;
                    positive("halo.hubble", h.hubble)?;
                }
            }
        }
        if let Some(b) = &self.bulge {
            positive("bulge.mass", b.mass)?;
            positive("bulge.scale_radius", b.scale_radius)?;
            optional("bulge.truncation_radius", b.truncation_radius)?;
            optional("bulge.softening", b.softening)?;
            positive("bulge.particles", b.particles)?;
        }
        if let Some(d) = &self.disk {
            positive("disk.mass", d.mass)?;
            positive("disk.scale_length", d.scale_length)?;
            positive("disk.scale_height", d.scale_height)?;
            optional("disk.truncation_radius", d.truncation_radius)?;
            positive("disk.toomre_q", d.toomre_q)?;
            optional("disk.q_radius", d.q_radius)?;
            optional("disk.softening", d.softening)?;
            positive("disk.particles", d.particles)?;
        }
        Ok(())
    }

    /// Softening lengths per component (`Component::index`) for a run whose own length is
    /// `default`: the components' `softening` keys where given. `None` when every component
    /// uses the same length.
    pub fn component_softening(&self, default: f64) -> Option<[f64; 4]> {
        // Absent components get 0: they have no particles to use it.
        let present = [
            self.halo.as_ref().map(|h| h.softening.unwrap_or(default)),
            self.disk.as_ref().map(|d| d.softening.unwrap_or(default)),
            self.bulge.as_ref().map(|b| b.softening.unwrap_or(default)),
            self.sphere.as_ref().map(|_| default),
        ];
        present
            .iter()
            .flatten()
            .any(|&e| e != default)
            .then(|| present.map(|e| e.unwrap_or(0.0)))
    }

    /// Every present component's own `softening` (`Component::ALL` order, 0 for absent
    /// ones), when each gives one; `None` when any relies on the run's length.
    pub fn own_softening(&self) -> Option<[f64; 4]> {
        let own = [
            self.halo.as_ref().map(|h| h.softening),
            self.disk.as_ref().map(|d| d.softening),
            self.bulge.as_ref().map(|b| b.softening),
            self.sphere.as_ref().map(|_| None),
        ];
        let mut out = [0.0; 4];
        for (slot, given) in out.iter_mut().zip(own) {
            match given {
                Some(Some(e)) => *slot = e,
                Some(None) => return None,
                None => {}
            }
        }
        Some(out)
    }

    /// Number of components with particles.
    pub fn components(&self) -> usize {
        if self.sphere.is_some() {
            1
        } else {
            [
                self.halo.as_ref().is_some_and(|h| !h.rigid),
                self.disk.is_some(),
                self.bulge.is_some(),
            ]
            .iter()
            .filter(|&&x| x)
            .count()
        }
    }
}

/// Samples `n` particles of `model` with random streams derived from `seed`; the result is
/// centred on the origin in position and velocity. Warnings (e.g. a distribution function
/// that had to fall back to the Jeans equations) come with it.
pub fn generate(model: &ModelFile, n: usize, seed: u64) -> (Particles, Vec<String>) {
    let (mut particles, warnings) = generate_share(model, n, seed, Share::WHOLE);
    let moments = sampling::block_moments(&particles);
    sampling::centre_on(&mut particles, &moments);
    (particles, warnings)
}

/// The particles of `share` out of the `n` that `generate` samples, not yet centred: centre
/// them with `sampling::centre_on` and the `block_moments` of every share, which gives the
/// bits of `generate` for any number of ranks.
pub fn generate_share(
    model: &ModelFile,
    n: usize,
    seed: u64,
    share: Share,
) -> (Particles, Vec<String>) {
    let g = model.units.gravitational_constant();
    let Some(sphere) = &model.sphere else {
        let galaxy = galaxy::Galaxy::new(model);
        let particles = galaxy.generate(n, seed, share);
        return (particles, galaxy.warnings.clone());
    };
    let (a, rt) = (sphere.scale_radius, sphere.truncation_radius);
    let stream = sampling::Stream {
        seed,
        stream: 0,
        first_id: 1,
    };
    let particles = match sphere.profile {
        SphereProfile::Plummer => {
            let p = plummer::Plummer::new(sphere.mass, a, g);
            sampling::sample_sphere(&p, rt, n, Component::Generic, stream, share)
        }
        SphereProfile::Hernquist => {
            let h = hernquist::Hernquist::new(sphere.mass, a, g);
            sampling::sample_sphere(&h, rt, n, Component::Generic, stream, share)
        }
    };
    (particles, Vec::new())
}
