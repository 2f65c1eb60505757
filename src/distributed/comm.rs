//! The communicator interface (design §6) and its in-process implementations: a single rank,
//! and K thread ranks sharing memory (`--ranks K`, tests, one GPU per rank later).
//!
//! Collectives move plain bytes; typed helpers on top of them cast plain-old-data slices with
//! bytemuck. Reductions gather every rank's contribution and combine them in rank order, so
//! every rank gets the same bits. A rank that fails calls `abort`; every other rank's next
//! (or current) collective then returns an error instead of waiting forever, and every wait
//! is bounded by a timeout as a last resort.

use bytemuck::Pod;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use thiserror::Error;

/// Why a collective operation failed.
#[derive(Debug, Clone, Error, PartialEq)]
pub enum CommError {
    /// Another rank failed and aborted the run.
    #[error("rank {rank} failed: {reason}")]
    Aborted {
        /// The failing rank.
        rank: usize,
        /// Its error message.
        reason: String,
    },
    /// The communication layer cannot do what was asked (MPI missing, a message too big).
    #[error("{0}")]
    Unavailable(String),
    /// A collective waited longer than the timeout for the other ranks.
    #[error(
        "rank {rank} waited more than {seconds} s for the other ranks in a collective operation"
    )]
    Timeout {
        /// The waiting rank.
        rank: usize,
        /// The timeout.
        seconds: u64,
    },
}

/// Collective communication among the ranks of one run.
pub trait Communicator: Send + Sync {
    /// This rank, 0-based.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn size(&self) -> usize;
    /// Every rank's `send`, in rank order.
    fn allgather_bytes(&self, send: &[u8]) -> Result<Vec<Vec<u8>>, CommError>;
    /// `send[j]` goes to rank j; returns what every rank sent to this one, in rank order.
    fn alltoall_bytes(&self, send: Vec<Vec<u8>>) -> Result<Vec<Vec<u8>>, CommError>;
    /// Marks the run as failed on this rank: other ranks' collectives return `Aborted`.
    fn abort(&self, reason: &str);

    /// Waits for every rank.
    fn barrier(&self) -> Result<(), CommError> {
        self.allgather_bytes(&[]).map(|_| ())
    }
}

/// Every rank's slice, in rank order.
pub fn allgatherv<T: Pod>(comm: &dyn Communicator, send: &[T]) -> Result<Vec<Vec<T>>, CommError> {
    Ok(comm
        .allgather_bytes(bytemuck::cast_slice(send))?
        .into_iter()
        .map(|b| bytemuck::pod_collect_to_vec(&b))
        .collect())
}

/// `send[j]` to rank j; what every rank sent here, in rank order.
pub fn alltoallv<T: Pod>(
    comm: &dyn Communicator,
    send: &[Vec<T>],
) -> Result<Vec<Vec<T>>, CommError> {
    let bytes = send
        .iter()
        .map(|v| bytemuck::cast_slice(v).to_vec())
        .collect();
    Ok(comm
        .alltoall_bytes(bytes)?
        .into_iter()
        .map(|b| bytemuck::pod_collect_to_vec(&b))
        .collect())
}

/// Element-wise sum over ranks, added in rank order (the same bits on every rank).
pub fn allreduce_sum<T: Pod + std::ops::AddAssign>(
    comm: &dyn Communicator,
    send: &[T],
) -> Result<Vec<T>, CommError> {
    let all = allgatherv(comm, send)?;
    let mut out = all[0].clone();
    for other in &all[1..] {
        for (a, b) in out.iter_mut().zip(other) {
            *a += *b;
        }
    }
    Ok(out)
}

/// Element-wise maximum over ranks.
pub fn allreduce_max(comm: &dyn Communicator, send: &[f64]) -> Result<Vec<f64>, CommError> {
    let all = allgatherv(comm, send)?;
    let mut out = all[0].clone();
    for other in &all[1..] {
        for (a, b) in out.iter_mut().zip(other) {
            *a = a.max(*b);
        }
    }
    Ok(out)
}

/// The only rank of a serial run.
#[derive(Debug, Default, Clone, Copy)]
pub struct SingleRank;

impl Communicator for SingleRank {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn allgather_bytes(&self, send: &[u8]) -> Result<Vec<Vec<u8>>, CommError> {
        Ok(vec![send.to_vec()])
    }
    fn alltoall_bytes(&self, send: Vec<Vec<u8>>) -> Result<Vec<Vec<u8>>, CommError> {
        Ok(send)
    }
    fn abort(&self, _reason: &str) {}
}

/// State shared by the thread ranks of one run.
#[derive(Debug)]
struct Shared {
    size: usize,
    timeout: Duration,
    state: Mutex<State>,
    wake: Condvar,
}

#[derive(Debug)]
struct State {
    /// Completed rendezvous so far.
    generation: u64,
    /// Ranks waiting in the current rendezvous.
    arrived: usize,
    /// `mail[from][to]` for the current collective.
    mail: Vec<Vec<Option<Vec<u8>>>>,
    /// The first failure, if any.
    failed: Option<(usize, String)>,
}

/// One of K ranks that run as threads of this process.
#[derive(Debug, Clone)]
pub struct ThreadRank {
    rank: usize,
    shared: Arc<Shared>,
}

impl ThreadRank {
    /// The `size` ranks of a new thread group; collectives give up after `timeout`.
    pub fn group(size: usize, timeout: Duration) -> Vec<ThreadRank> {
        let shared = Arc::new(Shared {
            size,
            timeout,
            state: Mutex::new(State {
                generation: 0,
                arrived: 0,
                mail: vec![vec![None; size]; size],
                failed: None,
            }),
            wake: Condvar::new(),
        });
        (0..size)
            .map(|rank| ThreadRank {
                rank,
                shared: Arc::clone(&shared),
            })
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn failure(state: &State) -> Option<CommError> {
        state
            .failed
            .as_ref()
            .map(|(rank, reason)| CommError::Aborted {
                rank: *rank,
                reason: reason.clone(),
            })
    }

    /// Waits until every rank has arrived at this rendezvous.
    fn rendezvous<'a>(
        &'a self,
        mut state: std::sync::MutexGuard<'a, State>,
    ) -> Result<std::sync::MutexGuard<'a, State>, CommError> {
        if let Some(e) = Self::failure(&state) {
            return Err(e);
        }
        let generation = state.generation;
        state.arrived += 1;
        if state.arrived == self.shared.size {
            state.arrived = 0;
            state.generation += 1;
            self.shared.wake.notify_all();
            return Ok(state);
        }
        loop {
            let (next, timeout) = self
                .shared
                .wake
                .wait_timeout(state, self.shared.timeout)
                .unwrap_or_else(|e| e.into_inner());
            state = next;
            if let Some(e) = Self::failure(&state) {
                return Err(e);
            }
            if state.generation != generation {
                return Ok(state);
            }
            if timeout.timed_out() {
                return Err(CommError::Timeout {
                    rank: self.rank,
                    seconds: self.shared.timeout.as_secs(),
                });
            }
        }
    }

    /// Posts `send[to]`, waits, collects what was posted to this rank, and waits again so
    /// that the mailboxes can be reused.
    fn exchange(&self, send: Vec<Option<Vec<u8>>>) -> Result<Vec<Vec<u8>>, CommError> {
        let mut state = self.lock();
        state.mail[self.rank] = send;
        let mut state = self.rendezvous(state)?;
        let received: Vec<Vec<u8>> = (0..self.shared.size)
            .map(|from| state.mail[from][self.rank].take().unwrap_or_default())
            .collect();
        drop(self.rendezvous(state)?);
        Ok(received)
    }
}

impl Communicator for ThreadRank {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.shared.size
    }

    fn allgather_bytes(&self, send: &[u8]) -> Result<Vec<Vec<u8>>, CommError> {
        self.exchange(vec![Some(send.to_vec()); self.shared.size])
    }

    fn alltoall_bytes(&self, send: Vec<Vec<u8>>) -> Result<Vec<Vec<u8>>, CommError> {
        self.exchange(send.into_iter().map(Some).collect())
    }

    fn abort(&self, reason: &str) {
        let mut state = self.lock();
        if state.failed.is_none() {
            state.failed = Some((self.rank, reason.to_string()));
        }
        self.shared.wake.notify_all();
    }
}

/// Runs `work` on `ranks` thread ranks, each inside its own rayon pool of `threads` threads,
/// and returns every rank's result in rank order. A rank whose `work` fails aborts the
/// group; the error reported is the failing rank's own (not the others' "aborted").
pub fn run_thread_ranks<T: Send, E: std::fmt::Display + Send>(
    ranks: usize,
    threads: usize,
    timeout: Duration,
    work: impl Fn(&ThreadRank) -> Result<T, E> + Sync,
) -> Result<Vec<T>, (usize, String)> {
    let group = ThreadRank::group(ranks, timeout);
    let results: Vec<Result<T, String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = group
            .iter()
            .map(|comm| {
                let work = &work;
                scope.spawn(move || {
                    let pool = rayon::ThreadPoolBuilder::new()
                        .num_threads(threads.max(1))
                        .build()
                        .map_err(|e| e.to_string())?;
                    // A panic (a bug) on one rank must stop the others too, not leave them
                    // waiting in a collective.
                    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        pool.install(|| work(comm))
                    }));
                    let msg = match outcome {
                        Ok(Ok(v)) => return Ok(v),
                        Ok(Err(e)) => e.to_string(),
                        Err(panic) => format!(
                            "rank {} stopped on an internal error: {}",
                            comm.rank(),
                            panic
                                .downcast_ref::<String>()
                                .map(String::as_str)
                                .or_else(|| panic.downcast_ref::<&str>().copied())
                                .unwrap_or("panic")
                        ),
                    };
                    comm.abort(&msg);
                    Err(msg)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a rank panicked".to_string()))
            })
            .collect()
    });
    // Prefer the failure that started it over the ranks that were merely aborted.
    let first_failure = group.first().and_then(|c| c.lock().failed.clone());
    let mut out = Vec::with_capacity(ranks);
    for r in results {
        match r {
            Ok(v) => out.push(v),
            Err(msg) => return Err(first_failure.unwrap_or((0, msg))),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rank_that_panics_stops_the_others_at_once() {
        let start = std::time::Instant::now();
        let out = run_thread_ranks(
            2,
            1,
            Duration::from_secs(60),
            |c: &ThreadRank| -> Result<u64, CommError> {
                if c.rank() == 1 {
                    panic!("bug on rank 1");
                }
                Ok(allreduce_sum(c, &[1])?[0])
            },
        );
        let (_, msg) = out.unwrap_err();
        assert!(msg.contains("bug on rank 1"), "{msg}");
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the other rank waited"
        );
    }

    #[test]
    fn collectives_on_thread_ranks() {
        let out = run_thread_ranks(
            3,
            1,
            Duration::from_secs(10),
            |c: &ThreadRank| -> Result<_, CommError> {
                let r = c.rank() as u64;
                let sums = allreduce_sum(c, &[r, 10 * r])?;
                let gathered = allgatherv(c, &vec![r as u32; c.rank() + 1])?;
                let send: Vec<Vec<u64>> =
                    (0..c.size()).map(|to| vec![100 * r + to as u64]).collect();
                let got = alltoallv(c, &send)?;
                Ok((sums, gathered, got))
            },
        )
        .unwrap();
        for (rank, (sums, gathered, got)) in out.iter().enumerate() {
            assert_eq!(sums, &vec![3, 30]);
            assert_eq!(
                gathered.iter().map(|v| v.len()).collect::<Vec<_>>(),
                vec![1, 2, 3]
            );
            let want: Vec<Vec<u64>> = (0..3).map(|from| vec![100 * from + rank as u64]).collect();
            assert_eq!(got, &want);
        }
    }

    #[test]
    fn a_failing_rank_stops_the_others_without_a_hang() {
        let start = std::time::Instant::now();
        let err = run_thread_ranks(
            4,
            1,
            Duration::from_secs(60),
            |c: &ThreadRank| -> Result<(), String> {
                if c.rank() == 2 {
                    return Err("bad input on rank 2".into());
                }
                for _ in 0..3 {
                    c.barrier().map_err(|e| e.to_string())?;
                }
                Ok(())
            },
        )
        .unwrap_err();
        assert_eq!(err, (2, "bad input on rank 2".to_string()));
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the other ranks must not wait for the timeout"
        );
    }
}
