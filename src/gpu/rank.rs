//! One rank of a distributed run on its GPU (design §7): the distributed FMM's passes run
//! there (`DevicePasses`), and the rank's particles stay there between evaluations
//! (`ResidentPasses`). The host keeps the ids, masses and components (which never change
//! on the device), and each evaluation brings the positions down for the decomposition,
//! the tree, the walk and the LET; a migration brings down only the leaving particles'
//! velocities and rearranges the rest on the device.

use super::context::GpuFmm;
use super::solver::{OnDevice, device_error, not_loaded};
use super::state::DeviceState;
use crate::distributed::comm::Communicator;
use crate::distributed::payload::PayloadRoutes;
use crate::fmm::backend::{DeviceForces, DevicePasses, DevicePlan, DeviceSeconds, ResidentPasses};
use crate::fmm::caps::Caps;
use crate::fmm::solver::{Evaluation, FmmSolver};
use crate::fmm::stats::FmmStats;
use crate::fmm::tree::CellColumns;
use crate::gravity::GravityError;
use crate::gravity::softening::Softening;
use crate::integrate::diagnostics::CONSERVED_SUMS;
use crate::particles::Particles;
use std::time::Instant;

/// A rank's GPU, and its particles there once loaded.
pub struct GpuRank {
    device: GpuFmm,
    state: Option<DeviceState>,
    /// The state a migration builds the rank's new set in (the last set's buffers).
    spare: Option<DeviceState>,
    /// The cells on their way from the device to the host's tree (`plan_tree`).
    columns: CellColumns,
    /// Set by `plan_tree` for the next passes: the plan's own tree is the device's.
    tree_here: bool,
}

impl GpuRank {
    /// The rank's `device`, with no particles on it yet.
    pub fn new(device: GpuFmm) -> Self {
        GpuRank {
            device,
            state: None,
            spare: None,
            columns: CellColumns::default(),
            tree_here: false,
        }
    }

    /// The device and the loaded state.
    fn loaded(&mut self) -> Result<(&mut GpuFmm, &mut DeviceState), GravityError> {
        match &mut self.state {
            Some(state) => Ok((&mut self.device, state)),
            None => Err(not_loaded()),
        }
    }
}

impl DevicePasses for GpuRank {
    fn run_passes(
        &mut self,
        plan: &DevicePlan,
        caps: &Caps,
        softening: Softening,
        g: f64,
    ) -> Result<DeviceForces, GravityError> {
        self.device.run_passes(plan, caps, softening, g)
    }

    fn moves_payload(&self) -> bool {
        self.device.moves_payload()
    }

    fn run_passes_with_payload(
        &mut self,
        plan: &DevicePlan,
        caps: &Caps,
        force: (Softening, f64),
        routes: &PayloadRoutes,
        comm: &dyn Communicator,
    ) -> Result<DeviceForces, GravityError> {
        self.device
            .run_passes_with_payload(plan, caps, force, routes, comm)
    }

    fn resident(&mut self) -> Option<&mut dyn ResidentPasses> {
        Some(self)
    }
}

impl ResidentPasses for GpuRank {
    fn load(&mut self, particles: &Particles) -> Result<(), GravityError> {
        self.spare = None;
        self.state = Some(self.device.load_state(particles).map_err(device_error)?);
        Ok(())
    }

    fn kick(&mut self, h: f64) -> Result<(), GravityError> {
        let (device, state) = self.loaded()?;
        device.kick(state, h).map_err(device_error)
    }

    fn drift(&mut self, h: f64) -> Result<(), GravityError> {
        let (device, state) = self.loaded()?;
        device.drift(state, h).map_err(device_error)
    }

    fn kick_each(&mut self, rows: Option<&[u32]>, h: &[f64]) -> Result<(), GravityError> {
        let (device, state) = self.loaded()?;
        device.kick_each(state, rows, h).map_err(device_error)
    }

    fn accelerations(
        &mut self,
        acc: &mut [[f64; 3]],
        only: Option<&[u32]>,
    ) -> Result<(), GravityError> {
        let (device, state) = self.loaded()?;
        device.accelerations(state, acc, only).map_err(device_error)
    }

    fn max_acceleration_by_component(&mut self) -> Result<[f64; 4], GravityError> {
        let (device, state) = self.loaded()?;
        device
            .max_acceleration_by_component(state)
            .map_err(device_error)
    }

    fn conserved_sums(&mut self) -> Result<[f64; CONSERVED_SUMS], GravityError> {
        let (device, state) = self.loaded()?;
        device.conserved_sums(state).map_err(device_error)
    }

    fn store(&mut self, particles: &mut Particles) -> Result<(), GravityError> {
        let (device, state) = self.loaded()?;
        device.store_state(state, particles).map_err(device_error)
    }

    fn add_external(&mut self, terms: &[f64], rows: Option<&[u32]>) -> Result<(), GravityError> {
        let (device, state) = self.loaded()?;
        device
            .add_external(state, terms, rows)
            .map_err(device_error)
    }

    fn external_energy(&mut self, terms: &[f64]) -> Result<f64, GravityError> {
        let (device, state) = self.loaded()?;
        device.external_energy(state, terms).map_err(device_error)
    }

    fn positions(&mut self, pos: &mut [[f64; 3]]) -> Result<(), GravityError> {
        let (device, state) = self.loaded()?;
        device.positions(state, pos).map_err(device_error)
    }

    fn velocities(&mut self, rows: &[u32], vel: &mut [[f64; 3]]) -> Result<(), GravityError> {
        let (device, state) = self.loaded()?;
        device.velocities(state, rows, vel).map_err(device_error)
    }

    fn migrate(&mut self, leaving: &[u32], particles: &Particles) -> Result<(), GravityError> {
        let (Some(state), device, spare) = (&mut self.state, &self.device, &mut self.spare) else {
            return Err(not_loaded());
        };
        device
            .migrate_state(state, spare, leaving, particles)
            .map_err(device_error)
    }

    fn plan_tree(
        &mut self,
        solver: &mut FmmSolver,
        id: &[u64],
        with: Evaluation,
    ) -> Result<Option<FmmStats>, GravityError> {
        self.tree_here = false;
        // What `plan_split_with` takes: the cube, every particle, one softening length and
        // the payload on the devices.
        let payload_here = with.remote.as_ref().is_some_and(|r| r.payload_on_device());
        let (Some(cube), None, None, true) = (with.cube, with.eps, with.active, payload_here)
        else {
            return Ok(None);
        };
        let (Some(state), device) = (&self.state, &mut self.device) else {
            return Err(not_loaded());
        };
        let t0 = Instant::now();
        // A position that is not finite, a sort that fails its check or runs of equal keys
        // too long for the device: the host builds the tree (and names the particle).
        let sorted = device
            .sort_resident_in(state, Some(cube))
            .map_err(device_error)?;
        let Some(sort) = sorted else {
            return Ok(None);
        };
        if sort.summary.check(state.particles()).is_err() || !sort.runs_ordered {
            return Ok(None);
        }
        let sorting = t0.elapsed().as_secs_f64();
        let mut walk_declined = false;
        let mut on_device = OnDevice {
            device,
            state,
            cube,
            columns: &mut self.columns,
            walk_declined: &mut walk_declined,
            active: None,
        };
        match solver.plan_split_with(id, &mut on_device, with) {
            Ok(mut stats) => {
                stats.seconds.tree += sorting;
                self.tree_here = true;
                Ok(Some(stats))
            }
            Err(GravityError::NotSorted(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn run_passes_resident(
        &mut self,
        plan: &DevicePlan,
        caps: &Caps,
        force: (Softening, f64),
        payload: Option<(&PayloadRoutes, &dyn Communicator)>,
    ) -> Result<DeviceSeconds, GravityError> {
        let tree_here = std::mem::take(&mut self.tree_here);
        let (device, state) = self.loaded()?;
        let forces = device
            .evaluate_moving(plan, caps, force, payload, Some(state), tree_here)
            .map_err(device_error)?;
        Ok(forces.seconds)
    }
}
