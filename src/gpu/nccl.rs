//! NCCL between the ranks' GPUs (design §6–7): the link that moves a distributed
//! evaluation's LET payload from device to device (`GpuFmm::run_passes_with_payload`). The
//! ranks, threads of one process or MPI processes alike, agree on it through their host
//! communicator: rank 0 makes the NCCL id, the communicator gives it to every rank, and
//! each joins with `Comm::from_rank` on its own GPU. NCCL needs a GPU per rank, so ranks
//! that share GPUs keep the host's communicator for the payload.

use crate::distributed::comm::{Communicator, allgatherv, allreduce_sum};
use cudarc::driver::CudaStream;
use cudarc::nccl::safe::{Comm, Id};
use std::sync::Arc;

/// One rank's NCCL communicator.
pub struct NcclLink {
    comm: Comm,
}

// SAFETY: an NCCL communicator may be used from any thread as long as two threads never
// use it at once; a link belongs to its rank's `GpuFmm`, which one thread drives at a time
// (`&mut self` for every call that reaches the link).
unsafe impl Send for NcclLink {}

impl std::fmt::Debug for NcclLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclLink")
            .field("rank", &self.comm.rank())
            .field("ranks", &self.comm.world_size())
            .finish()
    }
}

impl NcclLink {
    /// The communicator, whose ranks are the host communicator's.
    pub fn comm(&self) -> &Comm {
        &self.comm
    }
}

/// Whether this process can load the NCCL library (without loading it for good: cudarc
/// would panic on a call into a library it cannot find).
pub fn nccl_present() -> bool {
    // SAFETY: only tries to open the library by its usual names.
    unsafe { cudarc::nccl::sys::is_culib_present() }
}

/// Joins every rank of `comm` (which must all call this together) in one NCCL
/// communicator on their GPUs, `stream` being this rank's; `own_gpu` says whether this
/// rank has a GPU no other rank uses. `Ok(None)`, the same on every rank, when one rank
/// has no NCCL library or no GPU of its own, or for a single rank; else the link, or why
/// NCCL failed.
pub fn connect(
    comm: &dyn Communicator,
    stream: &Arc<CudaStream>,
    own_gpu: bool,
) -> Result<Option<NcclLink>, String> {
    let (rank, ranks) = (comm.rank(), comm.size());
    let able = u64::from(own_gpu && nccl_present());
    let all_able = allreduce_sum(comm, &[able]).map_err(|e| e.to_string())?[0];
    if ranks < 2 || all_able != ranks as u64 {
        return Ok(None);
    }
    // Rank 0's id, as bytes, to everyone. An id that could not be made travels as an
    // empty message, so that every rank gives up together.
    let mine: Vec<u8> = if rank == 0 {
        match Id::new() {
            Ok(id) => id.internal().iter().map(|&c| c as u8).collect(),
            Err(_) => Vec::new(),
        }
    } else {
        Vec::new()
    };
    let ids = allgatherv(comm, &mine).map_err(|e| e.to_string())?;
    let Ok(internal) = <[u8; 128]>::try_from(ids[0].as_slice()) else {
        return Err("rank 0 could not make an NCCL id".into());
    };
    let id = Id::uninit(internal.map(|b| b as core::ffi::c_char));
    stream
        .context()
        .bind_to_thread()
        .map_err(|e| format!("{e:?}"))?;
    let comm = Comm::from_rank(stream.clone(), rank, ranks, id)
        .map_err(|e| format!("NCCL could not join rank {rank} of {ranks}: {e:?}"))?;
    Ok(Some(NcclLink { comm }))
}
