//! The LET payload on the device (the GPU side of `distributed::payload`): the multipoles
//! and particles another rank's walk needs go from this device's plan straight into the
//! other ranks' plans — through NCCL when every rank has its own GPU (`connect_ranks`), else
//! staged through the host.

use super::buffers::{Buffers, PayloadBuffers, Reused};
use super::context::{GpuFmm, Kernels, grid};
use super::error::GpuError;
use super::nccl::NcclLink;
use crate::distributed::comm::Communicator;
use crate::distributed::payload::PayloadRoutes;
use cudarc::driver::{CudaStream, PushKernelArg};
use std::sync::Arc;

impl GpuFmm {
    /// Joins the ranks of `comm` (all call this together) in NCCL for the LET payload when
    /// every rank has a GPU of its own (`own_gpu` says whether this one has) and the NCCL
    /// library; returns whether they did. Otherwise the payload goes through `comm`.
    pub fn connect_ranks(
        &mut self,
        comm: &dyn Communicator,
        own_gpu: bool,
    ) -> Result<bool, GpuError> {
        self.link = super::nccl::connect(comm, &self.stream, own_gpu).map_err(GpuError::Driver)?;
        Ok(self.link.is_some())
    }
}

/// Gathers the payload `routes` sends each rank from the plan in `b` (multipoles, and
/// positions and masses in tree order) into `scratch`, moves it through `link` (NCCL) or
/// else `comm`, and puts what arrives in its place in `b`.
/// The fewest cells and particles the payload's buffers have room for.
const PAYLOAD_FLOOR: usize = 1024;

pub(super) fn move_payload(
    k: &Kernels,
    stream: &Arc<CudaStream>,
    b: &mut Buffers,
    scratch: &mut Option<PayloadBuffers>,
    link: Option<&NcclLink>,
    routes: &PayloadRoutes,
    comm: &dyn Communicator,
) -> Result<(), GpuError> {
    let len = routes.len;
    let rows: Vec<u32> = routes.send_cells.concat();
    let particles: Vec<u32> = routes.send_particles.concat();
    let (nr, np) = (rows.len(), particles.len());
    let s = match scratch {
        Some(s) => s,
        none => none.insert(PayloadBuffers {
            rows: Reused::new(stream, nr)?,
            particles: Reused::new(stream, np)?,
            multipoles: Reused::new(stream, nr * len)?,
            pos: Reused::new(stream, 3 * np)?,
            mass: Reused::new(stream, np)?,
        }),
    };
    // Room for at least `PAYLOAD_FLOOR` of each: a payload of a few cells or particles
    // that grows by a few from one step to the next would otherwise allocate again.
    let (nr_room, np_room) = (nr.max(PAYLOAD_FLOOR), np.max(PAYLOAD_FLOOR));
    s.rows.room(stream, nr_room)?;
    s.particles.room(stream, np_room)?;
    s.multipoles.room(stream, nr_room * len)?;
    s.pos.room(stream, 3 * np_room)?;
    s.mass.room(stream, np_room)?;
    s.rows.upload(stream, &rows)?;
    s.particles.upload(stream, &particles)?;
    let (nr32, np32, len32) = (nr as u32, np as u32, len as u32);
    if nr > 0 {
        let mut launch = stream.launch_builder(&k.gather_rows);
        launch
            .arg(&b.multipoles.buf)
            .arg(&s.rows.buf)
            .arg(&nr32)
            .arg(&len32)
            .arg(&mut s.multipoles.buf);
        // SAFETY: the arguments match gather_rows's signature; `s.multipoles` holds nr * len
        // values and every row is an own cell of the plan (`PayloadRoutes::check`).
        unsafe { launch.launch(grid(nr * len)) }?;
    }
    if np > 0 {
        let mut launch = stream.launch_builder(&k.gather);
        launch
            .arg(&b.pos.buf)
            .arg(&b.mass.buf)
            .arg(&s.particles.buf)
            .arg(&np32)
            .arg(&mut s.pos.buf)
            .arg(&mut s.mass.buf);
        // SAFETY: as above, for gather_tree_order: np indices of own particles.
        unsafe { launch.launch(grid(np)) }?;
    }
    let parts = routes.send_parts();
    match link {
        Some(link) => {
            let nccl = link.comm();
            let err = |e| GpuError::Driver(format!("NCCL: {e:?}"));
            cudarc::nccl::safe::group_start().map_err(err)?;
            for (j, (m, q)) in parts.into_iter().enumerate() {
                let peer = j as i32;
                if !m.is_empty() {
                    nccl.send(&s.multipoles.buf.slice(m), peer).map_err(err)?;
                }
                if !q.is_empty() {
                    let x = 3 * q.start..3 * q.end;
                    nccl.send(&s.pos.buf.slice(x), peer).map_err(err)?;
                    nccl.send(&s.mass.buf.slice(q), peer).map_err(err)?;
                }
                let (m, q) = routes.landing(j);
                if !m.is_empty() {
                    nccl.recv(&mut b.multipoles.buf.slice_mut(m), peer)
                        .map_err(err)?;
                }
                if !q.is_empty() {
                    let x = 3 * q.start..3 * q.end;
                    nccl.recv(&mut b.pos.buf.slice_mut(x), peer).map_err(err)?;
                    nccl.recv(&mut b.mass.buf.slice_mut(q), peer).map_err(err)?;
                }
            }
            cudarc::nccl::safe::group_end().map_err(err)?;
        }
        None => {
            let m = stream.clone_dtoh(&s.multipoles.buf.slice(0..nr * len))?;
            let x = stream.clone_dtoh(&s.pos.buf.slice(0..3 * np))?;
            let q = stream.clone_dtoh(&s.mass.buf.slice(0..np))?;
            let messages = (0..parts.len())
                .map(|j| bytemuck::cast_slice(&routes.message(j, &m, &x, &q)).to_vec())
                .collect();
            let received = comm
                .alltoall_bytes(messages)
                .map_err(|e| GpuError::Driver(format!("the LET payload did not arrive: {e}")))?;
            for (j, bytes) in received.iter().enumerate() {
                let values: Vec<f64> = bytemuck::pod_collect_to_vec(bytes);
                let part = routes.split(j, &values).map_err(GpuError::Unsupported)?;
                let (m, q) = routes.landing(j);
                if !m.is_empty() {
                    stream.memcpy_htod(part.multipoles, &mut b.multipoles.buf.slice_mut(m))?;
                }
                if !q.is_empty() {
                    let x = 3 * q.start..3 * q.end;
                    stream.memcpy_htod(part.pos, &mut b.pos.buf.slice_mut(x))?;
                    stream.memcpy_htod(part.mass, &mut b.mass.buf.slice_mut(q))?;
                }
            }
        }
    }
    Ok(())
}
