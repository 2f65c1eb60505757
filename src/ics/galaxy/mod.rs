//! Equilibrium galaxy models (design §10): exponential sech² disk, Hernquist bulge,
//! Hernquist or NFW halo; the full-model potential (disk included); spheroid velocities from
//! Eddington's formula in the spherically averaged total potential, disk velocities from the
//! Jeans equations.

pub mod disk;
pub mod potential;
pub mod spheroid;
pub mod tables;
pub mod velocities;

use super::sampling::{Share, Stream, isotropic_unit, sample_blocks};
use super::{BulgeModel, DiskModel, HaloModel, HaloProfile, ModelFile, QProfileKind};
use crate::particles::{Component, Particles};
use disk::DiskProfile;
use potential::{DiskPotential, GalaxyPotential};
use rand::RngExt;
use rand_distr::StandardNormal;
use rand_pcg::Pcg64;
use spheroid::{Eddington, Profile, RadialTable, SpeedSampler, Spheroid};
use tables::{LogGrid, cumulative_trapezoid};
use velocities::{DiskKinematics, QProfile};

/// Radial nodes of the spheroid tables.
const RADIAL_NODES: usize = 3000;
/// Distribution functions negative beyond this fraction of their peak fall back to Jeans.
const DF_FALLBACK: f64 = 1e-2;
/// Critical-density factor of the NFW virial radius (r200).
const OVERDENSITY: f64 = 200.0;

/// How a spheroid's velocities are drawn.
#[derive(Debug, Clone)]
enum SpheroidVelocities {
    /// From its distribution function (Eddington).
    Eddington(SpeedSampler),
    /// Isotropic Gaussian with the Jeans dispersion σ²(r) (fallback, with a warning).
    Jeans(Vec<f64>),
}

/// A spherical component ready to sample.
#[derive(Debug, Clone)]
pub struct SpheroidComponent {
    /// The density.
    pub spheroid: Spheroid,
    /// Its mass and potential tables on the galaxy grid.
    pub table: RadialTable,
    velocities: SpheroidVelocities,
    weight: f64,
}

/// The disk ready to sample.
#[derive(Debug, Clone)]
pub struct DiskComponent {
    /// The density.
    pub profile: DiskProfile,
    /// Its velocity moments.
    pub kinematics: DiskKinematics,
    weight: f64,
}

/// A galaxy model with everything needed to sample it.
#[derive(Debug, Clone)]
pub struct Galaxy {
    /// Gravitational constant.
    pub g: f64,
    /// The full-model potential.
    pub potential: GalaxyPotential,
    /// Ψ = −Φ of the spherically averaged model on the potential's grid.
    pub psi: Vec<f64>,
    /// The halo.
    pub halo: Option<SpheroidComponent>,
    /// The disk.
    pub disk: Option<DiskComponent>,
    /// The bulge.
    pub bulge: Option<SpheroidComponent>,
    /// Warnings raised while building the model.
    pub warnings: Vec<String>,
}

fn halo_spheroid(h: &HaloModel, g: f64) -> Spheroid {
    match h.profile {
        HaloProfile::Hernquist => Spheroid::new(
            Profile::Hernquist {
                mass: h.mass.unwrap_or(0.0),
                a: h.scale_radius.unwrap_or(1.0),
            },
            h.truncation_radius,
        ),
        HaloProfile::Nfw => {
            let (rho_s, rs, r200) = nfw_scales(h, g);
            // A rigid halo is untapered (its potential is the analytic one).
            let taper = (!h.rigid).then(|| h.truncation_radius.unwrap_or(r200));
            Spheroid::new(Profile::Nfw { rho_s, rs }, taper)
        }
    }
}

/// An NFW halo's ρ_s, r_s and r200 from its m200, concentration and Hubble parameter.
fn nfw_scales(h: &HaloModel, g: f64) -> (f64, f64, f64) {
    let (m200, c) = (h.m200.unwrap_or(0.0), h.concentration.unwrap_or(1.0));
    // H0 = 100 h km/s/Mpc = 0.1 h km/s/kpc: the galactic unit of velocity/length.
    let h0 = 0.1 * h.hubble;
    let r200 = (g * m200 / (0.5 * OVERDENSITY * h0 * h0)).cbrt();
    let rs = r200 / c;
    let rho_s = m200 / (4.0 * std::f64::consts::PI * rs.powi(3) * ((1.0 + c).ln() - c / (1.0 + c)));
    (rho_s, rs, r200)
}

/// A model's rigid halo (`[halo] rigid = true`) as the run adds it, centred on the origin at
/// rest: the untapered profile the model's velocities were set in.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RigidHalo {
    /// Hernquist or NFW.
    pub profile: HaloProfile,
    /// Hernquist: the total mass; NFW: the scale mass 4π ρ_s r_s³.
    pub mass: f64,
    /// a, or r_s.
    pub scale_radius: f64,
}

/// The rigid halo of `model`; `None` without one.
pub fn rigid_halo(model: &ModelFile) -> Option<RigidHalo> {
    let h = model.halo.as_ref().filter(|h| h.rigid)?;
    let g = model.units.gravitational_constant();
    let (mass, scale_radius) = match h.profile {
        HaloProfile::Hernquist => (h.mass.unwrap_or(0.0), h.scale_radius.unwrap_or(1.0)),
        HaloProfile::Nfw => {
            let (rho_s, rs, _) = nfw_scales(h, g);
            (4.0 * std::f64::consts::PI * rho_s * rs.powi(3), rs)
        }
    };
    Some(RigidHalo {
        profile: h.profile,
        mass,
        scale_radius,
    })
}

fn bulge_spheroid(b: &BulgeModel) -> Spheroid {
    Spheroid::new(
        Profile::Hernquist {
            mass: b.mass,
            a: b.scale_radius,
        },
        b.truncation_radius,
    )
}

fn disk_profile(d: &DiskModel) -> DiskProfile {
    DiskProfile::new(
        d.mass,
        d.scale_length,
        d.scale_height,
        d.truncation_radius.unwrap_or(8.0 * d.scale_length),
    )
}

impl Galaxy {
    /// Builds the potential, distribution functions and velocity tables of a galaxy model.
    pub fn new(model: &ModelFile) -> Self {
        let g = model.units.gravitational_constant();
        // A rigid halo is in the potential but gets no particles.
        let halo = model
            .halo
            .as_ref()
            .map(|h| (halo_spheroid(h, g), if h.rigid { 0.0 } else { h.particles }));
        let bulge = model
            .bulge
            .as_ref()
            .map(|b| (bulge_spheroid(b), b.particles));
        let disk = model.disk.as_ref().map(|d| (disk_profile(d), d));
        let mut smallest = f64::MAX;
        let mut largest: f64 = 0.0;
        for (s, _) in halo.iter().chain(bulge.iter()) {
            smallest = smallest.min(s.profile.scale());
            largest = largest.max(s.extent());
        }
        if let Some((d, _)) = &disk {
            smallest = smallest.min(d.z0);
            largest = largest.max(10.0 * d.rt);
        }
        let grid = LogGrid::new(1e-4 * smallest, largest, RADIAL_NODES);
        let tables: Vec<RadialTable> = halo
            .iter()
            .chain(bulge.iter())
            .map(|(s, _)| RadialTable::new(&grid, g, |r| s.density(r)))
            .collect();
        let disk_potential = disk.as_ref().map(|(d, _)| DiskPotential::new(d.clone(), g));
        let potential = GalaxyPotential::new(grid.clone(), tables.clone(), disk_potential, g);
        let psi = potential.spherical_psi();
        let mut warnings = Vec::new();
        let mut tables = tables.into_iter();
        let mut spheroid = |(s, weight): (Spheroid, f64), name: &str| {
            let table = tables
                .next()
                .unwrap_or_else(|| RadialTable::new(&grid, g, |r| s.density(r)));
            let df = Eddington::new(&table.density, &psi);
            let velocities = if df.negative_fraction > DF_FALLBACK {
                warnings.push(format!(
                    "the {name}'s distribution function is negative in places (down to {:.1}% of its peak) in this potential; its velocities fall back to the Jeans equations (Gaussian), which are only approximately in equilibrium",
                    100.0 * df.negative_fraction
                ));
                SpheroidVelocities::Jeans(jeans_dispersion(&grid, &table.density, &psi))
            } else {
                SpheroidVelocities::Eddington(SpeedSampler::new(df, &psi))
            };
            SpheroidComponent {
                spheroid: s,
                table,
                velocities,
                weight,
            }
        };
        let halo = halo.map(|h| spheroid(h, "halo"));
        let bulge = bulge.map(|b| spheroid(b, "bulge"));
        let disk = disk.map(|(profile, d)| {
            let q = match d.q_profile {
                QProfileKind::Exponential => QProfile::Exponential {
                    q: d.toomre_q,
                    radius: d.q_radius.unwrap_or(2.5 * d.scale_length),
                },
                QProfileKind::Constant => QProfile::Constant { q: d.toomre_q },
            };
            let kinematics = DiskKinematics::new(&profile, &potential, q, g);
            DiskComponent {
                profile,
                kinematics,
                weight: d.particles,
            }
        });
        Galaxy {
            g,
            potential,
            psi,
            halo,
            disk,
            bulge,
            warnings,
        }
    }

    /// Midplane circular speed at `r` by component: (total, halo, disk, bulge).
    pub fn rotation_curve(&self, r: f64) -> [f64; 4] {
        let grid = &self.potential.grid;
        let spheroid = |c: &Option<SpheroidComponent>| {
            c.as_ref()
                .map_or(0.0, |c| (self.g * grid.interp(&c.table.mass, r) / r).sqrt())
        };
        let disk = self
            .potential
            .disk()
            .map_or(0.0, |d| (r * d.evaluate(r, 0.0).1[0]).max(0.0).sqrt());
        [
            self.potential.vc2(r).max(0.0).sqrt(),
            spheroid(&self.halo),
            disk,
            spheroid(&self.bulge),
        ]
    }

    /// A table of the model's radial profiles every `step` out to `r_max`, as CSV: midplane
    /// circular speeds by component, and for the disk Σ, Toomre Q, σ_R, σ_z(z=0), mean v_φ.
    pub fn curves_csv(&self, r_max: f64, step: f64) -> String {
        let mut out = String::from(
            "R,vc_total,vc_halo,vc_disk,vc_bulge,surface_density,toomre_q,sigma_r,sigma_z,mean_vphi\n",
        );
        let mut r = step;
        while r <= r_max + 1e-12 {
            let [t, h, d, b] = self.rotation_curve(r);
            let disk = self.disk.as_ref().map(|c| {
                let k = &c.kinematics;
                [
                    c.profile.surface_density(r),
                    k.toomre_q(r),
                    k.sigma_r2(r).sqrt(),
                    k.sigma_z2(r, 0.0).sqrt(),
                    k.mean_vphi(r, 0.0),
                ]
            });
            let d5 = disk.unwrap_or([0.0; 5]);
            out.push_str(&format!(
                "{r},{t},{h},{d},{b},{},{},{},{},{}\n",
                d5[0], d5[1], d5[2], d5[3], d5[4]
            ));
            r += step;
        }
        out
    }

    /// Particle counts per component (halo, disk, bulge) for `n` in all: proportional to the
    /// model's relative counts, at least one per component when `n` allows.
    pub fn counts(&self, n: usize) -> [usize; 3] {
        let w = [
            self.halo.as_ref().map_or(0.0, |c| c.weight),
            self.disk.as_ref().map_or(0.0, |c| c.weight),
            self.bulge.as_ref().map_or(0.0, |c| c.weight),
        ];
        let total: f64 = w.iter().sum();
        let mut counts = w.map(|x| {
            if x > 0.0 {
                ((n as f64 * x / total).floor() as usize).max(1)
            } else {
                0
            }
        });
        // Give the remainder (or take the excess) from the component with the largest share.
        let largest = (0..3).max_by(|&a, &b| w[a].total_cmp(&w[b])).unwrap_or(0);
        let assigned: usize = counts.iter().sum();
        counts[largest] = (counts[largest] + n).saturating_sub(assigned);
        counts
    }

    /// Samples `n` particles from `seed`: halo IDs first, then disk, then bulge. Each block of
    /// 4096 IDs of each component has its own random stream, so the result does not depend on
    /// the number of threads.
    pub fn generate(&self, n: usize, seed: u64, share: Share) -> Particles {
        let [nh, nd, nb] = self.counts(n);
        let stream = |stream: u64, first_id: usize| Stream {
            seed,
            stream,
            first_id: first_id as u64,
        };
        let mut out = Particles::with_capacity(n);
        if let Some(h) = &self.halo {
            out.extend(self.sample_spheroid(h, nh, Component::Halo, stream(1, 1), share));
        }
        if let Some(d) = &self.disk {
            out.extend(sample_blocks(nd, stream(2, nh + 1), share, |rng| {
                let x = d.profile.sample_position(rng);
                let v = d.kinematics.sample(x, rng);
                (x, v, d.profile.mass / nd as f64, Component::Disk)
            }));
        }
        if let Some(b) = &self.bulge {
            out.extend(self.sample_spheroid(
                b,
                nb,
                Component::Bulge,
                stream(3, nh + nd + 1),
                share,
            ));
        }
        out
    }

    fn sample_spheroid(
        &self,
        c: &SpheroidComponent,
        n: usize,
        component: Component,
        stream: Stream,
        share: Share,
    ) -> Particles {
        let grid = &self.potential.grid;
        let mass = c.table.total_mass() / n.max(1) as f64;
        sample_blocks(n, stream, share, |rng| {
            let r = c.table.radius_of_mass_fraction(grid, rng.random());
            let d = isotropic_unit(rng);
            let psi = grid.interp(&self.psi, r).max(0.0);
            let v = match &c.velocities {
                SpheroidVelocities::Eddington(s) => {
                    let speed = s.sample(grid, r, psi, rng);
                    let u = isotropic_unit(rng);
                    [speed * u[0], speed * u[1], speed * u[2]]
                }
                SpheroidVelocities::Jeans(sigma2) => {
                    jeans_velocity(grid.interp(sigma2, r), psi, rng)
                }
            };
            ([r * d[0], r * d[1], r * d[2]], v, mass, component)
        })
    }
}

/// The isotropic Jeans dispersion σ²(r) = (1/ρ) ∫_r^∞ ρ (−dΨ/dr) dr on the grid.
fn jeans_dispersion(grid: &LogGrid, rho: &[f64], psi: &[f64]) -> Vec<f64> {
    let n = grid.r.len();
    let lnr: Vec<f64> = grid.r.iter().map(|r| r.ln()).collect();
    // ρ (−dΨ/dr) dr = ρ (−dΨ/d ln r) d ln r.
    let integrand: Vec<f64> = (0..n)
        .map(|i| {
            let (a, b) = (i.saturating_sub(1), (i + 1).min(n - 1));
            rho[i] * -(psi[b] - psi[a]) / (lnr[b] - lnr[a])
        })
        .collect();
    let cum = cumulative_trapezoid(&lnr, &integrand);
    (0..n)
        .map(|i| {
            if rho[i] > 0.0 {
                (cum[n - 1] - cum[i]) / rho[i]
            } else {
                0.0
            }
        })
        .collect()
}

/// A Gaussian velocity with dispersion² `sigma2` per axis, redrawn until bound.
fn jeans_velocity(sigma2: f64, psi: f64, rng: &mut Pcg64) -> [f64; 3] {
    let s = sigma2.max(0.0).sqrt();
    let v_esc2 = 2.0 * psi;
    loop {
        let v: [f64; 3] = std::array::from_fn(|_| s * rng.sample::<f64, _>(StandardNormal));
        if v[0] * v[0] + v[1] * v[1] + v[2] * v[2] < v_esc2 {
            return v;
        }
    }
}
