//! Unit systems and the gravitational constant in each.
//!
//! "galactic": length kpc, velocity km/s, mass 1e10 Msun (time unit ≈ 0.9778 Gyr).
//! "nbody": G = 1 with no physical scale attached.
//!
//! Owns unit systems and constants; depends on nothing in the crate.

use serde::{Deserialize, Serialize};

/// Kiloparsec in centimetres (IAU 2015 parsec).
pub const KPC_CM: f64 = 3.085_677_581_491_367e21;
/// Solar mass in grams (IAU 2015 nominal GM_sun / CODATA G).
pub const MSUN_G: f64 = 1.988_409_870_698_051e33;
/// Kilometre per second in cm/s.
const KMS_CMS: f64 = 1.0e5;
/// Seconds per Julian year (as pynbody and astropy count years).
pub const YEAR_S: f64 = 3.155_76e7;
/// Seconds per megayear.
pub const MYR_S: f64 = 3.155_76e13;
/// Seconds per gigayear.
pub const GYR_S: f64 = 3.155_76e16;

/// The unit system a run (and its files) are expressed in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum UnitSystem {
    /// kpc, km/s, 1e10 Msun; G = 43009.17.
    #[default]
    Galactic,
    /// Dimensionless N-body units with G = 1.
    Nbody,
}

impl UnitSystem {
    /// Gravitational constant in this system's units.
    pub fn gravitational_constant(self) -> f64 {
        match self {
            // 4.300917e-6 kpc (km/s)^2 / Msun times 1e10 Msun.
            UnitSystem::Galactic => 43_009.17,
            UnitSystem::Nbody => 1.0,
        }
    }

    /// The name used in config files and snapshots.
    pub fn name(self) -> &'static str {
        match self {
            UnitSystem::Galactic => "galactic",
            UnitSystem::Nbody => "nbody",
        }
    }

    /// Conversion factors of the code units to cgs, or `None` for dimensionless N-body units.
    pub fn cgs(self) -> Option<CgsUnits> {
        match self {
            UnitSystem::Galactic => Some(CgsUnits {
                length_cm: KPC_CM,
                mass_g: 1.0e10 * MSUN_G,
                velocity_cm_per_s: KMS_CMS,
            }),
            UnitSystem::Nbody => None,
        }
    }

    /// Length of one code time unit in Gyr, or `None` for N-body units.
    pub fn time_unit_gyr(self) -> Option<f64> {
        self.cgs().map(|c| c.time_s() / GYR_S)
    }
}

/// Code units expressed in cgs, as GADGET-4 (`UnitLength_in_cm` …) and SWIFT (`/Units`) record them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CgsUnits {
    /// One code length unit in cm.
    pub length_cm: f64,
    /// One code mass unit in g.
    pub mass_g: f64,
    /// One code velocity unit in cm/s.
    pub velocity_cm_per_s: f64,
}

/// Newton's constant in cgs (CODATA 2018).
const G_CGS: f64 = 6.674_30e-8;

impl CgsUnits {
    /// One code time unit in s.
    pub fn time_s(&self) -> f64 {
        self.length_cm / self.velocity_cm_per_s
    }

    /// G in these units; the galactic system's conventional value when they are (to 0.1%)
    /// galactic units, so that files agree with runs.
    pub fn gravitational_constant(&self) -> f64 {
        let galactic = UnitSystem::Galactic.cgs().map(|g| {
            [
                self.length_cm / g.length_cm,
                self.mass_g / g.mass_g,
                self.velocity_cm_per_s / g.velocity_cm_per_s,
            ]
        });
        if galactic.is_some_and(|r| r.iter().all(|x| (x - 1.0).abs() < 1e-3)) {
            return UnitSystem::Galactic.gravitational_constant();
        }
        G_CGS * self.mass_g * self.time_s().powi(2) / self.length_cm.powi(3)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn galactic_g_matches_cgs_factors() {
        let c = UnitSystem::Galactic.cgs().unwrap();
        let g_code = G_CGS * c.mass_g * c.time_s().powi(2) / c.length_cm.powi(3);
        let g = UnitSystem::Galactic.gravitational_constant();
        assert!(
            (g_code / g - 1.0).abs() < 2e-4,
            "G from cgs {g_code} vs {g}"
        );
        let t = UnitSystem::Galactic.time_unit_gyr().unwrap();
        assert!((t - 0.9778).abs() < 1e-3, "time unit {t} Gyr");
    }
}
