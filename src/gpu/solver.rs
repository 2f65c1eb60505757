//! The GPU force solver of a run: the host builds the tree and the lists each step
//! (`FmmSolver::plan`), the device runs the passes (`GpuFmm`). First form of design §7's
//! pipeline: positions go up and forces come down every step; device-resident state is
//! the next step.

use super::device::GpuFmm;
use crate::fmm::FmmSolver;
use crate::fmm::caps::Caps;
use crate::fmm::solver::FmmStats;
use crate::gravity::{ForceReport, GravityError, GravitySolver, check_finite};
use crate::particles::Particles;
use std::time::Instant;

/// FMM forces with the passes on a CUDA device.
pub struct GpuSolver {
    host: FmmSolver,
    device: GpuFmm,
}

impl GpuSolver {
    /// `host` (its settings, caps and presets) with the passes on `device`.
    pub fn new(host: FmmSolver, device: GpuFmm) -> Self {
        GpuSolver {
            host: host.with_backend("cuda"),
            device,
        }
    }
}

impl GravitySolver for GpuSolver {
    fn name(&self) -> &'static str {
        "fmm-cuda"
    }

    fn compute(&mut self, particles: &mut Particles) -> Result<ForceReport, GravityError> {
        check_finite(particles)?;
        let start = Instant::now();
        let n = particles.len();
        particles.acc.resize(n, [0.0; 3]);
        particles.pot.resize(n, 0.0);
        if n == 0 {
            return Ok(ForceReport {
                pair_interactions: 0,
                seconds: 0.0,
                stats: FmmStats::default().solver_stats(),
            });
        }
        let (plan, mut stats) = self
            .host
            .plan(&particles.pos, &particles.mass, &particles.id)?;
        let settings = self.host.settings();
        let caps = self.host.caps().unwrap_or_default();
        let out = self
            .device
            .evaluate(&plan, &caps, settings.softening, settings.g)
            .map_err(|e| GravityError::Device(e.to_string()))?;
        for (sorted, &orig) in plan.order_of.iter().enumerate() {
            particles.acc[orig as usize] = out.acc[sorted];
            particles.pot[orig as usize] = out.pot[sorted];
        }
        let s = out.seconds;
        stats.seconds.upward += s.upload + s.upward;
        stats.seconds.m2l += s.m2l;
        stats.seconds.downward += s.downward;
        stats.seconds.p2p += s.p2p + s.download;
        stats.p2p_interactions = plan.p2p_interactions();
        Ok(ForceReport {
            pair_interactions: stats.p2p_interactions,
            seconds: start.elapsed().as_secs_f64(),
            stats: stats.solver_stats(),
        })
    }

    fn stat_names(&self) -> Vec<&'static str> {
        FmmStats::stat_names()
    }

    fn take_warnings(&mut self) -> Vec<String> {
        self.host.take_warnings()
    }

    fn caps(&self) -> Option<Caps> {
        self.host.caps()
    }

    fn set_caps(&mut self, caps: Caps) {
        self.host.set_caps(caps);
    }
}
