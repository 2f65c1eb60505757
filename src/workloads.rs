//! The particle distributions forces are benchmarked on (`leapfmm bench`, `benches/`, and
//! tests that want a realistic galaxy without a model file).
//!
//! Owns benchmark distributions. Must not be used by a run.

use crate::ics::galaxy::disk::DiskProfile;
use crate::ics::hernquist::Hernquist;
use crate::ics::plummer::Plummer;
use crate::ics::sampling::{Share, SphericalModel, Stream, isotropic_unit, sample_blocks};
use crate::particles::{Component, Particles};
use rand::RngExt;

/// A benchmark particle distribution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// Plummer sphere in Hénon units (G = 1, M = 1, a = 3π/16).
    Plummer,
    /// A Milky-Way-like exponential disk (5e10 Msun, R_d = 3 kpc, z_0 = 0.3 kpc, truncated at
    /// 30 kpc, one third of the particles) inside a Hernquist halo (1e12 Msun, a = 30 kpc,
    /// cut at 300 kpc), galactic units.
    DiskInHalo,
}

impl Workload {
    /// Name in tables.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Plummer => "plummer",
            Workload::DiskInHalo => "disk-in-halo",
        }
    }

    /// Gravitational constant of the workload's units.
    pub fn g(self) -> f64 {
        match self {
            Workload::Plummer => crate::units::UnitSystem::Nbody.gravitational_constant(),
            Workload::DiskInHalo => crate::units::UnitSystem::Galactic.gravitational_constant(),
        }
    }

    /// A softening length typical of production runs at `n` particles.
    pub fn softening(self, n: usize) -> f64 {
        let scale = (1e6 / n as f64).cbrt();
        match self {
            Workload::Plummer => 0.01 * scale,
            Workload::DiskInHalo => 0.05 * scale,
        }
    }

    /// The default FMM settings at `n` particles: spline softening of `softening(n)`, the
    /// workload's G.
    pub fn fmm_settings(self, n: usize) -> crate::fmm::FmmSettings {
        let softening = crate::gravity::Softening {
            kernel: crate::gravity::SofteningKernel::Spline,
            epsilon: self.softening(n),
        };
        crate::fmm::FmmSettings::defaults(softening, self.g())
    }

    /// `n` particles (positions and masses; velocities zero), reproducible from `seed`.
    pub fn particles(self, n: usize, seed: u64) -> Particles {
        match self {
            Workload::Plummer => {
                let model = Plummer::new(1.0, 3.0 * std::f64::consts::PI / 16.0, 1.0);
                positions(&model, None, n, Component::Generic, stream(seed, 0, 1))
            }
            Workload::DiskInHalo => {
                let n_disk = n / 3;
                let n_halo = n - n_disk;
                let halo = Hernquist::new(100.0, 30.0, 1.0);
                let mut p = positions(
                    &halo,
                    Some(300.0),
                    n_halo,
                    Component::Halo,
                    stream(seed, 1, 1),
                );
                let disk_mass = 5.0 / n_disk.max(1) as f64;
                let profile = DiskProfile::new(5.0, 3.0, 0.3, 30.0);
                p.extend(sample_blocks(
                    n_disk,
                    stream(seed, 2, n_halo as u64 + 1),
                    Share::WHOLE,
                    |rng| {
                        (
                            profile.sample_position(rng),
                            [0.0; 3],
                            disk_mass,
                            Component::Disk,
                        )
                    },
                ));
                p
            }
        }
    }
}

fn stream(seed: u64, stream: u64, first_id: u64) -> Stream {
    Stream {
        seed,
        stream,
        first_id,
    }
}

/// Positions (no velocities) of a spherical model, in substreams like the IC samplers.
fn positions<M: SphericalModel>(
    model: &M,
    truncation: Option<f64>,
    n: usize,
    component: Component,
    stream: Stream,
) -> Particles {
    let u_max = truncation.map_or(1.0, |rt| model.mass_fraction(rt));
    let mass = model.total_mass() * u_max / n.max(1) as f64;
    sample_blocks(n, stream, Share::WHOLE, |rng| {
        let r = model.radius_of_mass_fraction(u_max * rng.random::<f64>());
        let d = isotropic_unit(rng);
        ([r * d[0], r * d[1], r * d[2]], [0.0; 3], mass, component)
    })
}
