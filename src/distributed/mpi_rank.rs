//! MPI ranks (cargo feature `mpi`, rsmpi): `mpirun -n K leapfmm run CONFIG` runs one rank per
//! process. Collectives move bytes with `MPI_Allgatherv` / `MPI_Alltoallv` after exchanging
//! the counts. A rank that fails prints its error and calls `MPI_Abort`, which stops every
//! process of the job: no rank is left waiting.

use super::comm::{CommError, Communicator};
use mpi::Count;
use mpi::datatype::{Partition, PartitionMut};
use mpi::environment::Universe;
use mpi::topology::SimpleCommunicator;
use mpi::traits::Communicator as _;
use mpi::traits::*;

/// True when this process was started by an MPI launcher (mpirun / mpiexec / srun): only
/// then is MPI initialised, so that a plain `leapfmm` never touches the MPI library.
pub fn launched_by_mpi() -> bool {
    [
        "OMPI_COMM_WORLD_SIZE",
        "PMI_SIZE",
        "PMIX_RANK",
        "MPI_LOCALNRANKS",
    ]
    .iter()
    .any(|v| std::env::var_os(v).is_some())
}

/// The MPI environment of this process; MPI is finalised when it is dropped.
pub struct MpiEnvironment {
    universe: Universe,
}

impl MpiEnvironment {
    /// Initialises MPI (collectives are only ever called from one thread at a time).
    pub fn initialize() -> Result<Self, CommError> {
        let (universe, _) = mpi::initialize_with_threading(mpi::Threading::Serialized).ok_or(
            CommError::Unavailable("MPI was already initialised, or could not be".into()),
        )?;
        Ok(MpiEnvironment { universe })
    }

    /// This process's rank in `MPI_COMM_WORLD`.
    pub fn world(&self) -> MpiRank {
        MpiRank {
            world: self.universe.world(),
        }
    }
}

/// One MPI rank of `MPI_COMM_WORLD`.
pub struct MpiRank {
    world: SimpleCommunicator,
}

impl Clone for MpiRank {
    fn clone(&self) -> Self {
        MpiRank {
            world: self.world.duplicate(),
        }
    }
}

// SAFETY: MPI is initialised with `Threading::Serialized`, and every collective of a rank is
// called from the rank's driver thread, one at a time (the rayon workers never touch the
// communicator), which is what that threading level allows.
unsafe impl Send for MpiRank {}
// SAFETY: as above.
unsafe impl Sync for MpiRank {}

fn counts_and_displacements(lengths: &[usize]) -> Result<(Vec<Count>, Vec<Count>), CommError> {
    let too_big = || CommError::Unavailable("an MPI message beyond 2 GiB per rank".into());
    let counts: Vec<Count> = lengths
        .iter()
        .map(|&l| Count::try_from(l).map_err(|_| too_big()))
        .collect::<Result<_, _>>()?;
    let mut displs = Vec::with_capacity(counts.len());
    let mut at: Count = 0;
    for &c in &counts {
        displs.push(at);
        at = at.checked_add(c).ok_or_else(too_big)?;
    }
    Ok((counts, displs))
}

fn split(buf: &[u8], counts: &[Count], displs: &[Count]) -> Vec<Vec<u8>> {
    counts
        .iter()
        .zip(displs)
        .map(|(&c, &d)| buf[d as usize..(d + c) as usize].to_vec())
        .collect()
}

impl Communicator for MpiRank {
    fn rank(&self) -> usize {
        self.world.rank() as usize
    }

    fn size(&self) -> usize {
        self.world.size() as usize
    }

    fn allgather_bytes(&self, send: &[u8]) -> Result<Vec<Vec<u8>>, CommError> {
        let mut lengths = vec![0u64; self.size()];
        self.world
            .all_gather_into(&(send.len() as u64), &mut lengths[..]);
        let lengths: Vec<usize> = lengths.iter().map(|&l| l as usize).collect();
        let (counts, displs) = counts_and_displacements(&lengths)?;
        // Never empty: two empty Vecs share one dangling address, and MPI refuses a send
        // buffer that equals the receive buffer.
        let mut buf = vec![0u8; lengths.iter().sum::<usize>().max(1)];
        {
            let mut partition = PartitionMut::new(&mut buf[..], &counts[..], &displs[..]);
            self.world.all_gather_varcount_into(send, &mut partition);
        }
        Ok(split(&buf, &counts, &displs))
    }

    fn alltoall_bytes(&self, send: Vec<Vec<u8>>) -> Result<Vec<Vec<u8>>, CommError> {
        let out_lengths: Vec<u64> = send.iter().map(|v| v.len() as u64).collect();
        let mut in_lengths = vec![0u64; self.size()];
        self.world
            .all_to_all_into(&out_lengths[..], &mut in_lengths[..]);
        let out_lengths: Vec<usize> = out_lengths.iter().map(|&l| l as usize).collect();
        let in_lengths: Vec<usize> = in_lengths.iter().map(|&l| l as usize).collect();
        let (out_counts, out_displs) = counts_and_displacements(&out_lengths)?;
        let (in_counts, in_displs) = counts_and_displacements(&in_lengths)?;
        let mut flat: Vec<u8> = send.concat();
        flat.push(0);
        let mut buf = vec![0u8; in_lengths.iter().sum::<usize>() + 1];
        {
            let outgoing = Partition::new(&flat[..], &out_counts[..], &out_displs[..]);
            let mut incoming = PartitionMut::new(&mut buf[..], &in_counts[..], &in_displs[..]);
            self.world
                .all_to_all_varcount_into(&outgoing, &mut incoming);
        }
        Ok(split(&buf, &in_counts, &in_displs))
    }

    fn abort(&self, reason: &str) {
        crate::tell!(
            "error: rank {} of {} failed: {reason}",
            self.rank(),
            self.size()
        );
        self.world.abort(1)
    }
}
