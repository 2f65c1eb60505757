//! The FMM passes on a CUDA device (design §7), first form: the host builds the tree and the
//! lists (`FmmSolver::device_plan`), one upload brings them over, and the kernels of
//! kernels/ run P2M, M2M per level, M2L, L2L per level, L2P and P2P; one download brings the
//! accelerations and potentials back. The same sequence runs under the CPU emulation in
//! tests/gpu_kernels.rs, where it matches the CPU FMM. Not yet verified on a GPU: no device
//! was lent while it was written (scripts/gpu-check.sh is the check).

use super::nvrtc::{KernelError, compile_all};
use crate::fmm::solver::DevicePlan;
use crate::gravity::softening::{SPLINE_SUPPORT_PER_EPSILON, Softening, SofteningKernel};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DeviceRepr, DriverError, LaunchConfig,
    PushKernelArg,
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
        })
    }

    fn upload<T: DeviceRepr>(&self, v: &[T]) -> Result<CudaSlice<T>, GpuError> {
        Ok(self.stream.clone_htod(v)?)
    }

    /// The forces of `plan` on the device.
    pub fn evaluate(
        &self,
        plan: &DevicePlan,
        softening: Softening,
        g: f64,
    ) -> Result<GpuForces, GpuError> {
        let mut secs = GpuSeconds::default();
        let (n, cells, len) = (
            plan.pos.len(),
            plan.centre.len(),
            (plan.order + 1) * (plan.order + 2),
        );
        let p = plan.order as i32;
        let t = Instant::now();
        let pos = self.upload(&flat(&plan.pos))?;
        let mass = self.upload(&plan.mass)?;
        let centre = self.upload(&flat(&plan.centre))?;
        let begin = self.upload(&plan.begin)?;
        let end = self.upload(&plan.end)?;
        let first_child = self.upload(&plan.first_child)?;
        let child_count = self.upload(&plan.child_count)?;
        let parent = self.upload(&plan.parent)?;
        let leaves = self.upload(&plan.leaves)?;
        let leaf_of = self.upload(&plan.leaf_of)?;
        let m2l_offsets = self.upload(&plan.m2l_offsets)?;
        let m2l_list = self.upload(&plan.m2l_list)?;
        let p2p_offsets = self.upload(&plan.p2p_offsets)?;
        let p2p_list = self.upload(&plan.p2p_list)?;
        let all: Vec<u32> = (0..cells as u32).collect();
        let all = self.upload(&all)?;
        let levels = plan.level_start.len().saturating_sub(1);
        let mut parents_by_level = Vec::with_capacity(levels);
        for l in 0..levels {
            let (lo, hi) = (plan.level_start[l], plan.level_start[l + 1]);
            let parents: Vec<u32> = (lo..hi)
                .filter(|&c| plan.child_count[c as usize] > 0)
                .collect();
            let count = parents.len();
            // A device copy needs at least one element; `count` says how many are real.
            let padded = if parents.is_empty() { vec![0] } else { parents };
            parents_by_level.push((count, self.upload(&padded)?));
        }
        let mut multipoles = self.stream.alloc_zeros::<f64>(cells * len)?;
        let mut locals = self.stream.alloc_zeros::<f64>(cells * len)?;
        let mut acc = self.stream.alloc_zeros::<f64>(3 * n)?;
        let mut pot = self.stream.alloc_zeros::<f64>(n)?;
        self.stream.synchronize()?;
        secs.upload = t.elapsed().as_secs_f64();

        let t = Instant::now();
        let n_leaves = plan.leaves.len() as u32;
        let mut launch = self.stream.launch_builder(&self.p2m);
        launch
            .arg(&pos)
            .arg(&mass)
            .arg(&leaves)
            .arg(&n_leaves)
            .arg(&begin)
            .arg(&end);
        launch.arg(&centre).arg(&p).arg(&mut multipoles);
        // SAFETY: the arguments match p2m_leaves's signature and the buffers' sizes.
        unsafe { launch.launch(grid(plan.leaves.len())) }?;
        for (count, parents) in parents_by_level.iter().rev() {
            if *count == 0 {
                continue;
            }
            let count32 = *count as u32;
            let mut launch = self.stream.launch_builder(&self.m2m);
            launch
                .arg(parents)
                .arg(&count32)
                .arg(&first_child)
                .arg(&child_count);
            launch.arg(&centre).arg(&p).arg(&mut multipoles);
            // SAFETY: as above, for m2m_cells.
            unsafe { launch.launch(grid(*count)) }?;
        }
        self.stream.synchronize()?;
        secs.upward = t.elapsed().as_secs_f64();

        let t = Instant::now();
        let cells32 = cells as u32;
        let mut launch = self.stream.launch_builder(&self.m2l);
        launch
            .arg(&all)
            .arg(&cells32)
            .arg(&m2l_offsets)
            .arg(&m2l_list)
            .arg(&centre);
        launch.arg(&multipoles).arg(&p).arg(&mut locals);
        // SAFETY: as above, for m2l_cells.
        unsafe { launch.launch(grid(cells)) }?;
        self.stream.synchronize()?;
        secs.m2l = t.elapsed().as_secs_f64();

        let t = Instant::now();
        for l in 1..levels {
            let (lo, hi) = (plan.level_start[l], plan.level_start[l + 1]);
            let count = hi - lo;
            let level_cells = all.slice(lo as usize..hi as usize);
            let mut launch = self.stream.launch_builder(&self.l2l);
            launch
                .arg(&level_cells)
                .arg(&count)
                .arg(&parent)
                .arg(&centre)
                .arg(&p);
            launch.arg(&mut locals);
            // SAFETY: as above, for l2l_cells.
            unsafe { launch.launch(grid(count as usize)) }?;
        }
        let n32 = n as u32;
        let mut launch = self.stream.launch_builder(&self.l2p);
        launch
            .arg(&pos)
            .arg(&leaf_of)
            .arg(&centre)
            .arg(&locals)
            .arg(&n32)
            .arg(&p)
            .arg(&g);
        launch.arg(&mut acc).arg(&mut pot);
        // SAFETY: as above, for l2p_particles.
        unsafe { launch.launch(grid(n)) }?;
        self.stream.synchronize()?;
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
        let mut launch = self.stream.launch_builder(&self.p2p);
        launch
            .arg(&pos)
            .arg(&mass)
            .arg(&begin)
            .arg(&end)
            .arg(&centre)
            .arg(&leaves);
        launch
            .arg(&p2p_offsets)
            .arg(&p2p_list)
            .arg(&kernel)
            .arg(&eps2)
            .arg(&h)
            .arg(&g);
        launch.arg(&mut acc).arg(&mut pot);
        let config = LaunchConfig {
            grid_dim: (n_leaves.max(1), 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        if n_leaves > 0 {
            // SAFETY: as above, for p2p_leaves (one block per target leaf).
            unsafe { launch.launch(config) }?;
        }
        self.stream.synchronize()?;
        secs.p2p = t.elapsed().as_secs_f64();

        let t = Instant::now();
        let acc = self.stream.clone_dtoh(&acc)?;
        let pot = self.stream.clone_dtoh(&pot)?;
        secs.download = t.elapsed().as_secs_f64();
        Ok(GpuForces {
            acc: acc.chunks_exact(3).map(|a| [a[0], a[1], a[2]]).collect(),
            pot,
            seconds: secs,
        })
    }
}
