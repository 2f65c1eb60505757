//! The FMM passes on a CUDA device (design §7), first form: the host builds the tree and the
//! lists (`FmmSolver::device_plan`), one upload brings them over into device buffers kept
//! from one evaluation to the next (sized by the caps, `memory::DeviceLengths`, and grown
//! when a plan needs more), and the kernels of
//! kernels/ run P2M, M2M per level, M2L, L2L per level, L2P and P2P; one download brings the
//! accelerations and potentials back. The same sequence runs under the CPU emulation in
//! tests/gpu_kernels.rs, where it matches the CPU FMM. Not yet verified on a GPU: no device
//! was lent while it was written (scripts/gpu-check.sh is the check).

use super::memory::DeviceLengths;
use super::nvrtc::{KernelError, compile_all};
use crate::fmm::caps::Caps;
use crate::fmm::solver::DevicePlan;
use crate::gravity::softening::{SPLINE_SUPPORT_PER_EPSILON, Softening, SofteningKernel};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DeviceRepr, DriverError, LaunchConfig,
    PushKernelArg, ValidAsZeroBits,
};
use cudarc::nvrtc::Ptx;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// Why the device backend cannot run.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// No CUDA driver library on this machine.
    #[error("no CUDA driver (libcuda.so.1) on this machine")]
    NoDriver,
    /// The driver reports no device.
    #[error("the CUDA driver reports no GPU")]
    NoDevice,
    /// A driver call failed.
    #[error("CUDA: {0}")]
    Driver(String),
    /// The kernels could not be compiled.
    #[error(transparent)]
    Kernels(#[from] KernelError),
    /// The evaluation cannot run on the device (e.g. per-particle softening).
    #[error("{0}")]
    Unsupported(String),
}

impl From<DriverError> for GpuError {
    fn from(e: DriverError) -> Self {
        GpuError::Driver(format!("{e:?}"))
    }
}

/// Threads per block of the per-item kernels and of P2P (≤ P2P_MAX_BLOCK in p2p.cu).
const BLOCK: u32 = 128;

/// An opened device with the kernels loaded.
pub struct GpuFmm {
    stream: Arc<CudaStream>,
    /// "NVIDIA H200 (sm_90)".
    pub device: String,
    p2m: CudaFunction,
    m2m: CudaFunction,
    m2l: CudaFunction,
    l2l: CudaFunction,
    l2p: CudaFunction,
    p2p: CudaFunction,
    /// Kept between evaluations (`DeviceLengths`).
    buffers: Option<Buffers>,
}

/// Growth of a device buffer that is too small: like the caps', so that a run reallocates
/// a few times at most.
const BUFFER_GROWTH: f64 = 2.0;

/// One device array kept between evaluations, reallocated only when an evaluation needs
/// more than it holds.
struct Reused<T> {
    buf: CudaSlice<T>,
}

impl<T: DeviceRepr + ValidAsZeroBits> Reused<T> {
    fn new(stream: &Arc<CudaStream>, count: usize) -> Result<Self, GpuError> {
        Ok(Reused {
            buf: stream.alloc_zeros::<T>(count.max(1))?,
        })
    }

    /// Room for `count` values: a new allocation `BUFFER_GROWTH` times larger when the
    /// current one is too small (the old one freed first).
    fn room(&mut self, stream: &Arc<CudaStream>, count: usize) -> Result<(), GpuError> {
        if self.buf.len() < count {
            self.buf = stream.alloc_zeros::<T>(1)?;
            let grown = (count as f64 * BUFFER_GROWTH).ceil() as usize;
            self.buf = stream.alloc_zeros::<T>(grown)?;
        }
        Ok(())
    }

    /// Copies `data` to the front of the buffer (which `room` has made large enough).
    fn upload(&mut self, stream: &Arc<CudaStream>, data: &[T]) -> Result<(), GpuError> {
        if !data.is_empty() {
            stream.memcpy_htod(data, &mut self.buf)?;
        }
        Ok(())
    }

    /// Zeroes the first `count` values.
    fn zero(&mut self, stream: &Arc<CudaStream>, count: usize) -> Result<(), GpuError> {
        if count > 0 {
            stream.memset_zeros(&mut self.buf.slice_mut(0..count))?;
        }
        Ok(())
    }
}

/// The device buffers of the force evaluations, in `DeviceLengths`' order.
struct Buffers {
    pos: Reused<f64>,
    mass: Reused<f64>,
    acc: Reused<f64>,
    pot: Reused<f64>,
    centre: Reused<f64>,
    multipoles: Reused<f64>,
    locals: Reused<f64>,
    leaf_of: Reused<u32>,
    begin: Reused<u32>,
    end: Reused<u32>,
    first_child: Reused<u32>,
    child_count: Reused<u32>,
    parent: Reused<u32>,
    all: Reused<u32>,
    parents: Reused<u32>,
    m2l_offsets: Reused<u32>,
    m2l_list: Reused<u32>,
    leaves: Reused<u32>,
    p2p_offsets: Reused<u32>,
    p2p_list: Reused<u32>,
}

impl Buffers {
    fn new(stream: &Arc<CudaStream>, lengths: &DeviceLengths) -> Result<Self, GpuError> {
        let [pos, mass, acc, pot, centre, multipoles, locals] = lengths.f64_counts();
        let [
            leaf_of,
            begin,
            end,
            first_child,
            child_count,
            parent,
            all,
            parents,
            m2l_offsets,
            m2l_list,
            leaves,
            p2p_offsets,
            p2p_list,
        ] = lengths.u32_counts();
        Ok(Buffers {
            pos: Reused::new(stream, pos)?,
            mass: Reused::new(stream, mass)?,
            acc: Reused::new(stream, acc)?,
            pot: Reused::new(stream, pot)?,
            centre: Reused::new(stream, centre)?,
            multipoles: Reused::new(stream, multipoles)?,
            locals: Reused::new(stream, locals)?,
            leaf_of: Reused::new(stream, leaf_of)?,
            begin: Reused::new(stream, begin)?,
            end: Reused::new(stream, end)?,
            first_child: Reused::new(stream, first_child)?,
            child_count: Reused::new(stream, child_count)?,
            parent: Reused::new(stream, parent)?,
            all: Reused::new(stream, all)?,
            parents: Reused::new(stream, parents)?,
            m2l_offsets: Reused::new(stream, m2l_offsets)?,
            m2l_list: Reused::new(stream, m2l_list)?,
            leaves: Reused::new(stream, leaves)?,
            p2p_offsets: Reused::new(stream, p2p_offsets)?,
            p2p_list: Reused::new(stream, p2p_list)?,
        })
    }

    /// Grows what is too small for `lengths`.
    fn fit(&mut self, stream: &Arc<CudaStream>, lengths: &DeviceLengths) -> Result<(), GpuError> {
        let f64s = [
            &mut self.pos,
            &mut self.mass,
            &mut self.acc,
            &mut self.pot,
            &mut self.centre,
            &mut self.multipoles,
            &mut self.locals,
        ];
        for (b, count) in f64s.into_iter().zip(lengths.f64_counts()) {
            b.room(stream, count)?;
        }
        let u32s = [
            &mut self.leaf_of,
            &mut self.begin,
            &mut self.end,
            &mut self.first_child,
            &mut self.child_count,
            &mut self.parent,
            &mut self.all,
            &mut self.parents,
            &mut self.m2l_offsets,
            &mut self.m2l_list,
            &mut self.leaves,
            &mut self.p2p_offsets,
            &mut self.p2p_list,
        ];
        for (b, count) in u32s.into_iter().zip(lengths.u32_counts()) {
            b.room(stream, count)?;
        }
        Ok(())
    }
}

/// One device evaluation: accelerations and potentials (tree order, G applied) and the
/// seconds of each phase.
#[derive(Debug, Clone, Default)]
pub struct GpuForces {
    /// Accelerations.
    pub acc: Vec<[f64; 3]>,
    /// Potentials.
    pub pot: Vec<f64>,
    /// Seconds by phase.
    pub seconds: GpuSeconds,
}

/// Seconds of one device evaluation by phase.
#[derive(Debug, Clone, Copy, Default)]
pub struct GpuSeconds {
    /// Host → device copies.
    pub upload: f64,
    /// P2M and M2M.
    pub upward: f64,
    /// M2L.
    pub m2l: f64,
    /// L2L and L2P.
    pub downward: f64,
    /// P2P.
    pub p2p: f64,
    /// Device → host copies.
    pub download: f64,
}

fn grid(count: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: ((count as u32).div_ceil(BLOCK).max(1), 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Flattens `[f64; 3]` rows.
fn flat(v: &[[f64; 3]]) -> Vec<f64> {
    v.iter().flatten().copied().collect()
}

/// GPU `ordinal` of this machine: `NoDriver` or `NoDevice` when there is none (without
/// touching CUDA when its driver library is absent).
pub fn probe(ordinal: usize) -> Result<super::backend::DeviceInfo, GpuError> {
    // SAFETY: only tries to open the shared library.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(GpuError::NoDriver);
    }
    if CudaContext::device_count()? <= ordinal as i32 {
        return Err(GpuError::NoDevice);
    }
    let ctx = CudaContext::new(ordinal)?;
    let (major, minor) = ctx.compute_capability()?;
    Ok(super::backend::DeviceInfo {
        ordinal,
        name: ctx.name()?,
        arch: format!("sm_{major}{minor}"),
        memory_bytes: ctx.total_mem()?,
    })
}

impl GpuFmm {
    /// Opens device `ordinal`, compiles (or loads from `cache`) the kernels for its
    /// architecture. A machine without the CUDA driver gets `GpuError::NoDriver`, never a
    /// panic.
    pub fn open(ordinal: usize, cache: Option<&Path>) -> Result<Self, GpuError> {
        let info = probe(ordinal)?;
        let ctx = CudaContext::new(ordinal)?;
        let arch = info.arch;
        let device = format!("{} ({arch})", info.name);
        let mut functions = Vec::new();
        for kernel in compile_all(&arch, cache)? {
            let module = ctx.load_module(Ptx::from_src(kernel.ptx))?;
            functions.push((kernel.name, module));
        }
        let function = |file: &str, name: &str| -> Result<CudaFunction, GpuError> {
            let (_, module) = functions
                .iter()
                .find(|(f, _)| *f == file)
                .ok_or_else(|| GpuError::Unsupported(format!("kernel file {file} missing")))?;
            Ok(module.load_function(name)?)
        };
        Ok(GpuFmm {
            stream: ctx.default_stream(),
            device,
            p2m: function("expansions.cu", "p2m_leaves")?,
            m2m: function("expansions.cu", "m2m_cells")?,
            m2l: function("expansions.cu", "m2l_cells")?,
            l2l: function("expansions.cu", "l2l_cells")?,
            l2p: function("expansions.cu", "l2p_particles")?,
            p2p: function("p2p.cu", "p2p_leaves")?,
            buffers: None,
        })
    }

    /// The forces of `plan` on the device, in buffers kept from the previous evaluation
    /// (sized by `caps` and the plan, grown when the plan needs more).
    pub fn evaluate(
        &mut self,
        plan: &DevicePlan,
        caps: &Caps,
        softening: Softening,
        g: f64,
    ) -> Result<GpuForces, GpuError> {
        let mut secs = GpuSeconds::default();
        let lengths = DeviceLengths::of(plan, caps);
        let (n, cells, len) = (plan.pos.len(), plan.centre.len(), lengths.expansion);
        let p = plan.order as i32;
        let t = Instant::now();
        let stream = self.stream.clone();
        let b = match &mut self.buffers {
            Some(b) => {
                b.fit(&stream, &lengths)?;
                b
            }
            none => none.insert(Buffers::new(&stream, &lengths)?),
        };
        b.pos.upload(&stream, &flat(&plan.pos))?;
        b.mass.upload(&stream, &plan.mass)?;
        b.centre.upload(&stream, &flat(&plan.centre))?;
        b.begin.upload(&stream, &plan.begin)?;
        b.end.upload(&stream, &plan.end)?;
        b.first_child.upload(&stream, &plan.first_child)?;
        b.child_count.upload(&stream, &plan.child_count)?;
        b.parent.upload(&stream, &plan.parent)?;
        b.leaves.upload(&stream, &plan.leaves)?;
        b.leaf_of.upload(&stream, &plan.leaf_of)?;
        b.m2l_offsets.upload(&stream, &plan.m2l_offsets)?;
        b.m2l_list.upload(&stream, &plan.m2l_list)?;
        b.p2p_offsets.upload(&stream, &plan.p2p_offsets)?;
        b.p2p_list.upload(&stream, &plan.p2p_list)?;
        let all: Vec<u32> = (0..cells as u32).collect();
        b.all.upload(&stream, &all)?;
        // The parents of every level, one level after the other: (offset, count) each.
        let levels = plan.level_start.len().saturating_sub(1);
        let mut parents = Vec::new();
        let mut parents_by_level = Vec::with_capacity(levels);
        for l in 0..levels {
            let (lo, hi) = (plan.level_start[l], plan.level_start[l + 1]);
            let start = parents.len();
            parents.extend((lo..hi).filter(|&c| plan.child_count[c as usize] > 0));
            parents_by_level.push((start, parents.len() - start));
        }
        b.parents.upload(&stream, &parents)?;
        b.multipoles.zero(&stream, cells * len)?;
        b.locals.zero(&stream, cells * len)?;
        b.acc.zero(&stream, 3 * n)?;
        b.pot.zero(&stream, n)?;
        stream.synchronize()?;
        secs.upload = t.elapsed().as_secs_f64();

        let t = Instant::now();
        let n_leaves = plan.leaves.len() as u32;
        let mut launch = stream.launch_builder(&self.p2m);
        launch
            .arg(&b.pos.buf)
            .arg(&b.mass.buf)
            .arg(&b.leaves.buf)
            .arg(&n_leaves)
            .arg(&b.begin.buf)
            .arg(&b.end.buf);
        launch.arg(&b.centre.buf).arg(&p).arg(&mut b.multipoles.buf);
        // SAFETY: the arguments match p2m_leaves's signature and the buffers' sizes.
        unsafe { launch.launch(grid(plan.leaves.len())) }?;
        for &(start, count) in parents_by_level.iter().rev() {
            if count == 0 {
                continue;
            }
            let count32 = count as u32;
            let level_parents = b.parents.buf.slice(start..start + count);
            let mut launch = stream.launch_builder(&self.m2m);
            launch
                .arg(&level_parents)
                .arg(&count32)
                .arg(&b.first_child.buf)
                .arg(&b.child_count.buf);
            launch.arg(&b.centre.buf).arg(&p).arg(&mut b.multipoles.buf);
            // SAFETY: as above, for m2m_cells.
            unsafe { launch.launch(grid(count)) }?;
        }
        stream.synchronize()?;
        secs.upward = t.elapsed().as_secs_f64();

        let t = Instant::now();
        let cells32 = cells as u32;
        let mut launch = stream.launch_builder(&self.m2l);
        launch
            .arg(&b.all.buf)
            .arg(&cells32)
            .arg(&b.m2l_offsets.buf)
            .arg(&b.m2l_list.buf)
            .arg(&b.centre.buf);
        launch.arg(&b.multipoles.buf).arg(&p).arg(&mut b.locals.buf);
        // SAFETY: as above, for m2l_cells.
        unsafe { launch.launch(grid(cells)) }?;
        stream.synchronize()?;
        secs.m2l = t.elapsed().as_secs_f64();

        let t = Instant::now();
        for l in 1..levels {
            let (lo, hi) = (plan.level_start[l], plan.level_start[l + 1]);
            let count = hi - lo;
            let level_cells = b.all.buf.slice(lo as usize..hi as usize);
            let mut launch = stream.launch_builder(&self.l2l);
            launch
                .arg(&level_cells)
                .arg(&count)
                .arg(&b.parent.buf)
                .arg(&b.centre.buf)
                .arg(&p);
            launch.arg(&mut b.locals.buf);
            // SAFETY: as above, for l2l_cells.
            unsafe { launch.launch(grid(count as usize)) }?;
        }
        let n32 = n as u32;
        let mut launch = stream.launch_builder(&self.l2p);
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
        let mut launch = stream.launch_builder(&self.p2p);
        launch
            .arg(&b.pos.buf)
            .arg(&b.mass.buf)
            .arg(&b.begin.buf)
            .arg(&b.end.buf)
            .arg(&b.centre.buf)
            .arg(&b.leaves.buf);
        launch
            .arg(&b.p2p_offsets.buf)
            .arg(&b.p2p_list.buf)
            .arg(&kernel)
            .arg(&eps2)
            .arg(&h)
            .arg(&g);
        launch.arg(&mut b.acc.buf).arg(&mut b.pot.buf);
        let config = LaunchConfig {
            grid_dim: (n_leaves.max(1), 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        if n_leaves > 0 {
            // SAFETY: as above, for p2p_leaves (one block per target leaf).
            unsafe { launch.launch(config) }?;
        }
        stream.synchronize()?;
        secs.p2p = t.elapsed().as_secs_f64();

        let t = Instant::now();
        let acc = stream.clone_dtoh(&b.acc.buf.slice(0..3 * n))?;
        let pot = stream.clone_dtoh(&b.pot.buf.slice(0..n))?;
        secs.download = t.elapsed().as_secs_f64();
        Ok(GpuForces {
            acc: acc.chunks_exact(3).map(|a| [a[0], a[1], a[2]]).collect(),
            pot,
            seconds: secs,
        })
    }
}
