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
    /// A Hernquist cusp (G = 1, M = 1, a = 1, cut at 100 a).
    HernquistCusp,
    /// The disk of `DiskInHalo` in a Hernquist halo of a = 10 kpc truncated at 200 kpc
    /// (20 scale radii): a sparse outer shell, whose weak forces come from the far field.
    TruncatedHalo,
    /// Two `DiskInHalo` galaxies (half the particles each) 150 kpc (50 disk scale lengths)
    /// apart on the x axis: a merger's first snapshot.
    TwoGalaxies,
    /// A cold uniform cube of side 1 (G = 1, M = 1).
    UniformCube,
    /// A Plummer sphere (G = 1, M = 0.9) with a tenth of the particles (M = 0.1) in a clump
    /// of scale 0.01 at (1, 0, 0).
    Clump,
}

impl Workload {
    /// Name in tables.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Plummer => "plummer",
            Workload::DiskInHalo => "disk-in-halo",
            Workload::HernquistCusp => "hernquist-cusp",
            Workload::TruncatedHalo => "truncated-halo",
            Workload::TwoGalaxies => "two-galaxies",
            Workload::UniformCube => "uniform-cube",
            Workload::Clump => "clump",
        }
    }

    /// The accuracy test set of issue 42: every workload but the two standard ones'
    /// repeats, from cusps and clumps to sparse shells.
    pub const TEST_SET: [Workload; 6] = [
        Workload::Plummer,
        Workload::HernquistCusp,
        Workload::TruncatedHalo,
        Workload::TwoGalaxies,
        Workload::UniformCube,
        Workload::Clump,
    ];

    /// Whether the workload is in galactic units (else G = 1).
    pub fn galactic(self) -> bool {
        matches!(
            self,
            Workload::DiskInHalo | Workload::TruncatedHalo | Workload::TwoGalaxies
        )
    }

    /// Gravitational constant of the workload's units.
    pub fn g(self) -> f64 {
        if self.galactic() {
            crate::units::UnitSystem::Galactic.gravitational_constant()
        } else {
            crate::units::UnitSystem::Nbody.gravitational_constant()
        }
    }

    /// A softening length typical of production runs at `n` particles.
    pub fn softening(self, n: usize) -> f64 {
        let scale = (1e6 / n as f64).cbrt();
        if self.galactic() {
            0.05 * scale
        } else {
            0.01 * scale
        }
    }

    /// The FMM settings of the opening angle alone (`FmmSettings::geometric`, the GPU
    /// backend's) at `n` particles: spline softening of `softening(n)`, the workload's G.
    pub fn fmm_settings(self, n: usize) -> crate::fmm::FmmSettings {
        let softening = crate::gravity::Softening {
            kernel: crate::gravity::SofteningKernel::Spline,
            epsilon: self.softening(n),
        };
        crate::fmm::FmmSettings::geometric(softening, self.g())
    }

    /// `n` particles (positions and masses; velocities zero), reproducible from `seed`.
    pub fn particles(self, n: usize, seed: u64) -> Particles {
        match self {
            Workload::Plummer => {
                let model = Plummer::new(1.0, 3.0 * std::f64::consts::PI / 16.0, 1.0);
                positions(&model, None, n, Component::Generic, stream(seed, 0, 1))
            }
            Workload::DiskInHalo => disk_in_halo(n, seed, Hernquist::new(100.0, 30.0, 1.0), 300.0),
            Workload::TruncatedHalo => {
                disk_in_halo(n, seed, Hernquist::new(100.0, 10.0, 1.0), 200.0)
            }
            Workload::HernquistCusp => positions(
                &Hernquist::new(1.0, 1.0, 1.0),
                Some(100.0),
                n,
                Component::Generic,
                stream(seed, 0, 1),
            ),
            Workload::TwoGalaxies => {
                let half = n / 2;
                let mut p = Workload::DiskInHalo.particles(half, seed);
                let mut other = Workload::DiskInHalo.particles(n - half, seed.wrapping_add(1));
                for (x, id) in other.pos.iter_mut().zip(other.id.iter_mut()) {
                    x[0] += 75.0;
                    *id += half as u64;
                }
                p.pos.iter_mut().for_each(|x| x[0] -= 75.0);
                p.extend(other);
                p
            }
            Workload::UniformCube => {
                let mass = 1.0 / n.max(1) as f64;
                sample_blocks(n, stream(seed, 0, 1), Share::WHOLE, |rng| {
                    let x = [0, 1, 2].map(|_| rng.random::<f64>() - 0.5);
                    (x, [0.0; 3], mass, Component::Generic)
                })
            }
            Workload::Clump => {
                let n_clump = n / 10;
                let n_main = n - n_clump;
                let main = Plummer::new(0.9, 3.0 * std::f64::consts::PI / 16.0, 1.0);
                let mut p = positions(&main, None, n_main, Component::Generic, stream(seed, 0, 1));
                let clump = Plummer::new(0.1, 0.01, 1.0);
                let mut c = positions(
                    &clump,
                    None,
                    n_clump,
                    Component::Generic,
                    stream(seed, 1, n_main as u64 + 1),
                );
                c.pos.iter_mut().for_each(|x| x[0] += 1.0);
                p.extend(c);
                p
            }
        }
    }
}

/// The disk of `DiskInHalo` (a third of the particles) in `halo` cut at `cut`.
fn disk_in_halo(n: usize, seed: u64, halo: Hernquist, cut: f64) -> Particles {
    let n_disk = n / 3;
    let n_halo = n - n_disk;
    let mut p = positions(
        &halo,
        Some(cut),
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
