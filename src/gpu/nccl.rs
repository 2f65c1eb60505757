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
    let able = own_gpu && nccl_present();
    let make_id = || {
        let id = Id::new().ok()?;
        Some(id.internal().map(|c| c as u8))
    };
    let Some(internal) = agree_on_id(comm, able, make_id)? else {
        return Ok(None);
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

/// The ranks' collective decision for `connect`: `None` on every rank unless there are
/// several and every one is `able`; then rank 0's id (`make_id`, called there only) on
/// every rank, or the same error on every rank when rank 0 could not make one.
fn agree_on_id(
    comm: &dyn Communicator,
    able: bool,
    make_id: impl FnOnce() -> Option<[u8; 128]>,
) -> Result<Option<[u8; 128]>, String> {
    let ranks = comm.size();
    let all_able = allreduce_sum(comm, &[u64::from(able)]).map_err(|e| e.to_string())?[0];
    if ranks < 2 || all_able != ranks as u64 {
        return Ok(None);
    }
    // An id that could not be made travels as an empty message, so that every rank gives
    // up together.
    let mine = match comm.rank() {
        0 => make_id().map(|id| id.to_vec()).unwrap_or_default(),
        _ => Vec::new(),
    };
    let ids = allgatherv(comm, &mine).map_err(|e| e.to_string())?;
    match <[u8; 128]>::try_from(ids[0].as_slice()) {
        Ok(id) => Ok(Some(id)),
        Err(_) => Err("rank 0 could not make an NCCL id".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::distributed::comm::{ThreadRank, run_thread_ranks};
    use std::time::Duration;

    /// `agree_on_id` on three thread ranks, rank r able when `able[r]`, rank 0's id
    /// `made`; each rank's outcome.
    fn agree(able: [bool; 3], made: Option<[u8; 128]>) -> Vec<Result<Option<[u8; 128]>, String>> {
        let timeout = Duration::from_secs(60);
        run_thread_ranks(3, 1, timeout, |comm: &ThreadRank| {
            let r = comm.rank();
            let outcome = agree_on_id(comm, able[r], || {
                assert_eq!(r, 0, "only rank 0 makes the id");
                made
            });
            Ok::<_, String>(outcome)
        })
        .unwrap()
    }

    #[test]
    fn every_rank_takes_rank_0s_id_or_none_does() {
        let id = std::array::from_fn(|i| i as u8);
        assert!(
            agree([true; 3], Some(id))
                .iter()
                .all(|o| *o == Ok(Some(id)))
        );
        // One rank without a GPU of its own or the library: no rank makes or joins one.
        let none = agree([true, false, true], Some(id));
        assert!(none.iter().all(|o| *o == Ok(None)));
        // Rank 0 could not make the id: every rank says so.
        let failed = agree([true; 3], None);
        assert!(
            failed
                .iter()
                .all(|o| o.as_ref().is_err_and(|e| e.contains("rank 0")))
        );
    }
}
