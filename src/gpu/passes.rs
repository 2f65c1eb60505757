//! The FMM passes on the device (the GPU side of `fmm::solver`'s evaluation): one upload brings
//! the plan (tree and lists; sized by the caps, `memory::DeviceLengths`, grown when a plan
//! needs more) into buffers kept between evaluations, then P2M, M2M per level, M2L, L2L per
//! level, L2P and P2P run the kernels of kernels/. Either the plan's positions go up and the
//! forces come down (`evaluate`), or the particles are resident (`evaluate_resident`: gathered
//! into tree order on the device, forces scattered back). The kernels also run under the CPU
//! emulation (tests/gpu_kernels.rs, tests/gpu_emulated.rs); scripts/gpu-check.sh checks them
//! on a lent GPU (docs/benchmarks.md).

use super::buffers::{Buffers, MomentsBuffers, WalkBuffers};
use super::context::{GpuFmm, Kernels, grid, per_cell};
use super::error::GpuError;
use super::memory::{
    DeviceLengths, M2L_ROTATED_ORDER, M2L_ROTATED_THREADS, M2L_SMALL_ORDER, M2L_THREADS,
    P2P_THREADS,
};
use super::payload::move_payload;
use super::state::DeviceState;
use crate::distributed::comm::Communicator;
use crate::distributed::payload::PayloadRoutes;
use crate::fmm::backend::{DeviceForces, DevicePasses, DevicePlan, DeviceSeconds};
use crate::fmm::caps::Caps;
use crate::gravity::GravityError;
use crate::gravity::softening::{SPLINE_SUPPORT_PER_EPSILON, Softening, SofteningKernel};
use cudarc::driver::{CudaStream, LaunchConfig, PushKernelArg};
use std::sync::Arc;
use std::time::Instant;

impl GpuFmm {
    /// The forces of `plan` on the device, in buffers kept from the previous evaluation
    /// (sized by `caps` and the plan, grown when the plan needs more): the plan's positions
    /// and masses go up, the accelerations and potentials (tree order) come back.
    pub fn evaluate(
        &mut self,
        plan: &DevicePlan,
        caps: &Caps,
        softening: Softening,
        g: f64,
    ) -> Result<DeviceForces, GpuError> {
        self.evaluate_moving(plan, caps, (softening, g), None, None, false)
    }

    /// `evaluate`, and with `payload` (a distributed plan whose other ranks' multipoles,
    /// positions and masses are placeholders) the LET payload moved first: this device
    /// gathers what `routes` sends each rank from its plan, and what the others send lands
    /// in its plan's buffers, through NCCL when the ranks are linked, else through the host
    /// communicator (all ranks call this together; its seconds count as upload's).
    /// With `state` (a distributed run's rank's particles, `super::rank::GpuRank`), the own
    /// particles' positions and masses are gathered from it into tree order, not sent, and
    /// their forces scattered back into it: the forces returned are then empty. With
    /// `tree_on_device` (and `state`), the plan's own cells are those of this device's last
    /// `sort_resident_in`, `split_cells` and `cell_moments` of `state`
    /// (`FmmSolver::plan_split_with`): the tree order and each particle's leaf are copied
    /// there rather than sent.
    pub(super) fn evaluate_moving(
        &mut self,
        plan: &DevicePlan,
        caps: &Caps,
        (softening, g): (Softening, f64),
        payload: Option<(&PayloadRoutes, &dyn Communicator)>,
        state: Option<&mut DeviceState>,
        tree_on_device: bool,
    ) -> Result<DeviceForces, GpuError> {
        let (n, all) = (plan.own_particles, plan.particles());
        if plan.pos.len() != all || plan.device_lists.is_some() {
            return Err(GpuError::Unsupported(
                "a plan without positions or lists needs the particles on the device".into(),
            ));
        }
        if let Some(state) = &state
            && (state.n != n || plan.order_of.len() != n)
        {
            return Err(GpuError::Unsupported(format!(
                "a plan for {n} own particles on a device state of {}",
                state.n
            )));
        }
        let mut secs = DeviceSeconds::default();
        let t = Instant::now();
        let stream = self.stream.clone();
        let b = upload_plan(&stream, &mut self.buffers, plan, caps, None)?;
        match (
            state.is_some() && tree_on_device,
            &self.sorting,
            &self.moments,
        ) {
            (true, Some(s), Some(m)) if s.index[0].buf.len() >= n && m.leaf_of.buf.len() >= n => {
                stream.memcpy_dtod(&s.index[0].buf.slice(0..n), &mut b.order_of.buf)?;
                stream.memcpy_dtod(&m.leaf_of.buf.slice(0..n), &mut b.leaf_of.buf)?;
            }
            (true, ..) => {
                return Err(GpuError::Unsupported(
                    "no tree of these particles on the device: sort_resident_in, split_cells and cell_moments first".into(),
                ));
            }
            (false, ..) => {
                b.leaf_of.upload(&stream, &plan.leaf_of)?;
                if state.is_some() {
                    b.order_of.upload(&stream, plan.order_of)?;
                }
            }
        }
        match state.as_deref() {
            None => {
                b.pos.upload(&stream, plan.pos.as_flattened())?;
                b.mass.upload(&stream, plan.mass)?;
            }
            Some(state) => {
                gather_tree_order(&self.kernels, &stream, state, b)?;
                // The other ranks' particles: from the plan, unless the devices move them.
                if payload.is_none() && all > n {
                    let mut pos = b.pos.buf.slice_mut(3 * n..3 * all);
                    stream.memcpy_htod(plan.pos[n..].as_flattened(), &mut pos)?;
                    let mut mass = b.mass.buf.slice_mut(n..all);
                    stream.memcpy_htod(&plan.mass[n..], &mut mass)?;
                }
            }
        }
        stream.synchronize()?;
        secs.upload = t.elapsed().as_secs_f64();
        if plan.upward_on_device {
            upward_pass(&self.kernels, &stream, b, plan, &mut secs)?;
        }
        if let Some((routes, comm)) = payload {
            // The own multipoles just computed go out; the others' land next to them.
            let t = Instant::now();
            let link = self.link.as_ref();
            move_payload(
                &self.kernels,
                &stream,
                b,
                &mut self.payload,
                link,
                routes,
                comm,
            )?;
            stream.synchronize()?;
            secs.upload += t.elapsed().as_secs_f64();
        }
        run_passes(
            &self.kernels,
            &stream,
            b,
            None,
            plan,
            (softening, g),
            &mut secs,
        )?;
        let t = Instant::now();
        let (mut acc, mut pot) = (Vec::new(), Vec::new());
        match state {
            Some(state) => {
                scatter_forces(&self.kernels, &stream, b, state)?;
                stream.synchronize()?;
            }
            None => {
                (acc, pot) = (vec![[0.0; 3]; n], vec![0.0; n]);
                let stage = &mut self.stage;
                stage.download(&stream, &b.acc.buf.slice(0..3 * n), acc.as_flattened_mut())?;
                stage.download(&stream, &b.pot.buf.slice(0..n), &mut pot)?;
            }
        }
        secs.download = t.elapsed().as_secs_f64();
        Ok(DeviceForces {
            acc,
            pot,
            seconds: secs,
        })
    }

    /// The forces of `plan` on the particles of `state`, which stay on the device: their
    /// positions and masses are gathered into the plan's tree order there (the plan's own
    /// copies are not sent) and the accelerations and potentials scattered back into
    /// `state`; the cells and lists go up. With `tree_on_device`, the plan's tree is the
    /// one of the last `sort_resident` and `cell_moments`, whose tree order, leaf of each
    /// particle, cell centres, columns and leaves are on the device already and are not
    /// sent either; the lists too when the plan says they were walked there (`walk`).
    pub fn evaluate_resident(
        &mut self,
        plan: &DevicePlan,
        caps: &Caps,
        softening: Softening,
        g: f64,
        state: &mut DeviceState,
        tree_on_device: bool,
    ) -> Result<DeviceSeconds, GpuError> {
        let n = plan.own_particles;
        if n != state.n || plan.particles() != n {
            return Err(GpuError::Unsupported(format!(
                "a plan for {} particles on a device state of {}",
                plan.particles(),
                state.n
            )));
        }
        let mut secs = DeviceSeconds::default();
        let t = Instant::now();
        let stream = self.stream.clone();
        let cells_here = match (tree_on_device, &self.moments) {
            (true, Some(m)) if m.holds(plan) => Some(m),
            _ => None,
        };
        let b = upload_plan(&stream, &mut self.buffers, plan, caps, cells_here)?;
        match (tree_on_device, &self.sorting, &self.moments) {
            (true, Some(s), Some(m)) => {
                stream.memcpy_dtod(&s.index[0].buf.slice(0..n), &mut b.order_of.buf)?;
                stream.memcpy_dtod(&m.leaf_of.buf.slice(0..n), &mut b.leaf_of.buf)?;
            }
            (true, ..) => {
                return Err(GpuError::Unsupported(
                    "no tree on the device: sort_resident and cell_moments first".into(),
                ));
            }
            (false, ..) if plan.leaf_of.len() != n => {
                return Err(GpuError::Unsupported(
                    "a plan without the particles' leaves and no tree on the device".into(),
                ));
            }
            (false, ..) => {
                b.order_of.upload(&stream, plan.order_of)?;
                b.leaf_of.upload(&stream, &plan.leaf_of)?;
            }
        }
        gather_tree_order(&self.kernels, &stream, state, b)?;
        stream.synchronize()?;
        secs.upload = t.elapsed().as_secs_f64();
        let walked = match (plan.device_lists, &self.walking) {
            (None, _) => None,
            (Some(_), Some(w)) => Some(w),
            (Some(_), None) => {
                return Err(GpuError::Unsupported(
                    "a plan with lists on the device before a device walk".into(),
                ));
            }
        };
        if plan.upward_on_device {
            upward_pass(&self.kernels, &stream, b, plan, &mut secs)?;
        }
        run_passes(
            &self.kernels,
            &stream,
            b,
            walked,
            plan,
            (softening, g),
            &mut secs,
        )?;
        let t = Instant::now();
        scatter_forces(&self.kernels, &stream, b, state)?;
        stream.synchronize()?;
        secs.download = t.elapsed().as_secs_f64();
        Ok(secs)
    }
}

/// The buffers, grown to fit `plan` (and `caps`), with the plan's tree and lists
/// uploaded (the tree's centres, columns and leaves copied from `cells_here` instead, when
/// `cell_moments` left the plan's tree there) and the expansions and forces zeroed;
/// positions, masses and each particle's leaf are the caller's.
fn upload_plan<'a>(
    stream: &Arc<CudaStream>,
    buffers: &'a mut Option<Buffers>,
    plan: &DevicePlan,
    caps: &Caps,
    cells_here: Option<&MomentsBuffers>,
) -> Result<&'a mut Buffers, GpuError> {
    let lengths = DeviceLengths::of(plan, caps);
    let (n, cells, len) = (plan.particles(), plan.centre.len(), lengths.expansion);
    let stream = stream.clone();
    let b = match buffers {
        Some(b) => {
            b.fit(&stream, &lengths)?;
            b
        }
        none => none.insert(Buffers::new(&stream, &lengths)?),
    };
    if plan.moments_on_device && cells_here.is_none() {
        return Err(GpuError::Unsupported(
            "a plan whose cell centres stayed on a device that does not hold them".into(),
        ));
    }
    match cells_here {
        // The plan's tree is the one `cell_moments` left on the device: its centres,
        // columns and leaves are copied there rather than sent again (~45 bytes a cell).
        Some(m) => {
            let leaves = plan.leaves.len();
            stream.memcpy_dtod(&m.centre.buf.slice(0..3 * cells), &mut b.centre.buf)?;
            stream.memcpy_dtod(&m.begin.buf.slice(0..cells), &mut b.begin.buf)?;
            stream.memcpy_dtod(&m.end.buf.slice(0..cells), &mut b.end.buf)?;
            stream.memcpy_dtod(&m.first_child.buf.slice(0..cells), &mut b.first_child.buf)?;
            stream.memcpy_dtod(&m.child_count.buf.slice(0..cells), &mut b.child_count.buf)?;
            stream.memcpy_dtod(&m.parent.buf.slice(0..cells), &mut b.parent.buf)?;
            stream.memcpy_dtod(&m.leaves.buf.slice(0..leaves), &mut b.leaves.buf)?;
        }
        None => {
            b.centre.upload(&stream, plan.centre.as_flattened())?;
            b.begin.upload(&stream, &plan.begin)?;
            b.end.upload(&stream, &plan.end)?;
            b.first_child.upload(&stream, &plan.first_child)?;
            b.child_count.upload(&stream, &plan.child_count)?;
            b.parent.upload(&stream, &plan.parent)?;
            b.leaves.upload(&stream, plan.leaves)?;
        }
    }
    b.m2l_spans.upload(&stream, plan.m2l_spans)?;
    b.m2l_sources.upload(&stream, plan.m2l_sources)?;
    b.p2p_spans.upload(&stream, plan.p2p_spans)?;
    b.p2p_sources.upload(&stream, plan.p2p_sources)?;
    let all: Vec<u32> = (0..cells as u32).collect();
    b.all.upload(&stream, &all)?;
    let (parents, parent_levels) = parents_by_level(plan);
    b.parents.upload(&stream, &parents)?;
    b.parent_levels = parent_levels;
    // Multipoles the host computed (a distributed evaluation's, which other ranks' cells
    // came with) go up; otherwise the upward pass fills them. A plan whose own multipoles
    // the device computes holds only zero placeholders (the other ranks' cells' land
    // there from the payload): zeroed here rather than sent (8 (p + 1)(p + 2) bytes a
    // cell, 44 % of a step's upload on 2 ranks at 5e4).
    match plan.multipoles {
        Some(m) if m.len() != cells * len => {
            return Err(GpuError::Unsupported(format!(
                "a plan of {cells} cells came with {} multipole values, not {}",
                m.len(),
                cells * len
            )));
        }
        Some(m) if !plan.upward_on_device => b.multipoles.upload(&stream, m)?,
        _ => b.multipoles.zero(&stream, cells * len)?,
    }
    b.locals.zero(&stream, cells * len)?;
    b.acc.zero(&stream, 3 * n)?;
    b.pot.zero(&stream, n)?;
    Ok(b)
}

/// The cells with children of every level, one level after the other, and each level's
/// (offset, count) in that list: the per-level launches of M2M.
fn parents_by_level(plan: &DevicePlan) -> (Vec<u32>, Vec<(usize, usize)>) {
    let levels = plan.level_start.len().saturating_sub(1);
    let mut parents = Vec::new();
    let mut by_level = Vec::with_capacity(levels);
    for l in 0..levels {
        let (lo, hi) = (plan.level_start[l], plan.level_start[l + 1]);
        let start = parents.len();
        parents.extend((lo..hi).filter(|&c| plan.child_count[c as usize] > 0));
        by_level.push((start, parents.len() - start));
    }
    (parents, by_level)
}

/// M2L, L2L per level, L2P and P2P on buffers `upload_plan` filled (positions and masses in
/// tree order included, and the multipoles: the plan's, or `upward_pass`'s), with the
/// lists of `walked` when given, for the softening and G of `force`; their seconds into
/// `secs`.
pub(super) fn run_passes(
    k: &Kernels,
    stream: &Arc<CudaStream>,
    b: &mut Buffers,
    walked: Option<&WalkBuffers>,
    plan: &DevicePlan,
    force: (Softening, f64),
    secs: &mut DeviceSeconds,
) -> Result<(), GpuError> {
    let (softening, g) = force;
    // Forces for the own particles and cells; the received ones are sources only.
    let (n, cells) = (plan.own_particles, plan.own_cells);
    let p = plan.order as i32;
    let levels = plan.level_start.len().saturating_sub(1);
    let n_leaves = plan.leaves.len() as u32;
    // The lists: the device walk's, or those uploaded from the plan.
    let (m2l_spans, m2l_sources, p2p_spans, p2p_sources) = match walked {
        Some(w) => (
            &w.m2l_spans.buf,
            &w.m2l_sources.buf,
            &w.p2p_spans.buf,
            &w.p2p_sources.buf,
        ),
        None => (
            &b.m2l_spans.buf,
            &b.m2l_sources.buf,
            &b.p2p_spans.buf,
            &b.p2p_sources.buf,
        ),
    };

    let t = Instant::now();
    let cells32 = cells as u32;
    let (m2l, threads) = match plan.order {
        p if (1..=M2L_ROTATED_ORDER).contains(&p) && !k.m2l_direct => {
            (&k.m2l_rotated[p - 1], M2L_ROTATED_THREADS)
        }
        p if p <= M2L_SMALL_ORDER => (&k.m2l_small, M2L_THREADS),
        _ => (&k.m2l, M2L_THREADS),
    };
    let mut launch = stream.launch_builder(m2l);
    launch
        .arg(&b.all.buf)
        .arg(&cells32)
        .arg(m2l_spans)
        .arg(m2l_sources)
        .arg(&b.centre.buf);
    launch.arg(&b.multipoles.buf).arg(&p).arg(&mut b.locals.buf);
    // SAFETY: the arguments match m2l_cells's signature (m2l_cells_p8's and each
    // m2l_rotated_P's are the same) and the buffers' sizes; the order is at most the
    // kernel's largest (m2l_rotated_P's own); one block of the kernel's threads per target.
    let per_target = LaunchConfig {
        grid_dim: (cells32.max(1), 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    };
    unsafe { launch.launch(per_target) }?;
    stream.synchronize()?;
    secs.m2l = t.elapsed().as_secs_f64();

    let t = Instant::now();
    for l in 1..levels {
        let (lo, hi) = (plan.level_start[l], plan.level_start[l + 1]);
        let count = hi - lo;
        let level_cells = b.all.buf.slice(lo as usize..hi as usize);
        let mut launch = stream.launch_builder(&k.l2l);
        launch
            .arg(&level_cells)
            .arg(&count)
            .arg(&b.parent.buf)
            .arg(&b.centre.buf)
            .arg(&p);
        launch.arg(&mut b.locals.buf);
        // SAFETY: as above, for l2l_cells (one block of TRANSLATE_THREADS per cell).
        unsafe { launch.launch(per_cell(count as usize)) }?;
    }
    let n32 = n as u32;
    let mut launch = stream.launch_builder(&k.l2p);
    launch
        .arg(&b.pos.buf)
        .arg(&b.leaf_of.buf)
        .arg(&b.centre.buf)
        .arg(&b.locals.buf)
        .arg(&n32)
        .arg(&p)
        .arg(&g);
    launch.arg(&mut b.acc.buf).arg(&mut b.pot.buf);
    // SAFETY: as above, for l2p_particles.
    unsafe { launch.launch(grid(n)) }?;
    stream.synchronize()?;
    secs.downward = t.elapsed().as_secs_f64();

    let t = Instant::now();
    let kernel: i32 = match softening.kernel {
        SofteningKernel::Plummer => 0,
        SofteningKernel::Spline => 1,
    };
    let eps = softening.epsilon;
    let (eps2, h) = (
        (eps * eps) as f32,
        (SPLINE_SUPPORT_PER_EPSILON * eps) as f32,
    );
    // The central potential in f64, so that each particle's own pair is taken back out
    // exactly as on the CPU.
    let p0 = crate::gravity::pairwise::self_potential(1.0, eps);
    let mut launch = stream.launch_builder(&k.p2p);
    launch
        .arg(&b.pos.buf)
        .arg(&b.mass.buf)
        .arg(&b.begin.buf)
        .arg(&b.end.buf)
        .arg(&b.centre.buf)
        .arg(&b.leaves.buf);
    launch
        .arg(p2p_spans)
        .arg(p2p_sources)
        .arg(&kernel)
        .arg(&eps2)
        .arg(&h)
        .arg(&p0)
        .arg(&g);
    launch.arg(&mut b.acc.buf).arg(&mut b.pot.buf);
    let config = LaunchConfig {
        grid_dim: (n_leaves.max(1), 1, 1),
        block_dim: (P2P_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    if n_leaves > 0 {
        // SAFETY: as above, for p2p_leaves (one block per target leaf).
        unsafe { launch.launch(config) }?;
    }
    stream.synchronize()?;
    secs.p2p = t.elapsed().as_secs_f64();
    Ok(())
}

/// The positions and masses of the particles of `state` into the plan buffers, in the
/// tree order of `b.order_of` (its first `state.n` entries, a permutation of the state's
/// rows).
pub(super) fn gather_tree_order(
    kernels: &Kernels,
    stream: &Arc<CudaStream>,
    state: &DeviceState,
    b: &mut Buffers,
) -> Result<(), GpuError> {
    let n32 = state.n as u32;
    let mut launch = stream.launch_builder(&kernels.gather);
    launch
        .arg(&state.pos)
        .arg(&state.mass)
        .arg(&b.order_of.buf)
        .arg(&n32)
        .arg(&mut b.pos.buf)
        .arg(&mut b.mass.buf);
    // SAFETY: the arguments match gather_tree_order's signature; the state and the order
    // hold n particles, the plan's buffers at least n.
    unsafe { launch.launch(grid(state.n)) }?;
    Ok(())
}

/// The forces of the plan buffers' first `state.n` particles (tree order) back into the
/// rows of `state` that `b.order_of` names.
pub(super) fn scatter_forces(
    kernels: &Kernels,
    stream: &Arc<CudaStream>,
    b: &Buffers,
    state: &mut DeviceState,
) -> Result<(), GpuError> {
    let n32 = state.n as u32;
    let mut launch = stream.launch_builder(&kernels.scatter);
    launch
        .arg(&b.acc.buf)
        .arg(&b.pot.buf)
        .arg(&b.order_of.buf)
        .arg(&n32)
        .arg(&mut state.acc)
        .arg(&mut state.pot);
    // SAFETY: the arguments match scatter_forces's signature; as above.
    unsafe { launch.launch(grid(state.n)) }?;
    Ok(())
}

/// P2M at the leaves and M2M level by level towards the root, on the device.
fn upward_pass(
    k: &Kernels,
    stream: &Arc<CudaStream>,
    b: &mut Buffers,
    plan: &DevicePlan,
    secs: &mut DeviceSeconds,
) -> Result<(), GpuError> {
    let p = plan.order as i32;
    let n_leaves = plan.leaves.len() as u32;
    let t = Instant::now();
    let mut launch = stream.launch_builder(&k.p2m);
    launch
        .arg(&b.pos.buf)
        .arg(&b.mass.buf)
        .arg(&b.leaves.buf)
        .arg(&n_leaves)
        .arg(&b.begin.buf)
        .arg(&b.end.buf);
    launch.arg(&b.centre.buf).arg(&p).arg(&mut b.multipoles.buf);
    // SAFETY: the arguments match p2m_leaves's signature and the buffers' sizes; one block
    // of TRANSLATE_THREADS per leaf.
    unsafe { launch.launch(per_cell(plan.leaves.len())) }?;
    for &(start, count) in b.parent_levels.iter().rev() {
        if count == 0 {
            continue;
        }
        let count32 = count as u32;
        let level_parents = b.parents.buf.slice(start..start + count);
        let mut launch = stream.launch_builder(&k.m2m);
        launch
            .arg(&level_parents)
            .arg(&count32)
            .arg(&b.first_child.buf)
            .arg(&b.child_count.buf);
        launch.arg(&b.centre.buf).arg(&p).arg(&mut b.multipoles.buf);
        // SAFETY: as above, for m2m_cells (one block of TRANSLATE_THREADS per cell).
        unsafe { launch.launch(per_cell(count)) }?;
    }
    stream.synchronize()?;
    secs.upward = t.elapsed().as_secs_f64();
    Ok(())
}

impl DevicePasses for GpuFmm {
    fn run_passes(
        &mut self,
        plan: &DevicePlan,
        caps: &Caps,
        softening: Softening,
        g: f64,
    ) -> Result<DeviceForces, GravityError> {
        self.evaluate(plan, caps, softening, g)
            .map_err(|e| GravityError::Device(e.to_string()))
    }

    fn moves_payload(&self) -> bool {
        true
    }

    fn run_passes_with_payload(
        &mut self,
        plan: &DevicePlan,
        caps: &Caps,
        force: (Softening, f64),
        routes: &PayloadRoutes,
        comm: &dyn Communicator,
    ) -> Result<DeviceForces, GravityError> {
        self.evaluate_moving(plan, caps, force, Some((routes, comm)), None, false)
            .map_err(|e| GravityError::Device(e.to_string()))
    }
}
