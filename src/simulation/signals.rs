//! SIGINT and SIGTERM during a run: a handler that lets the current step finish, a
//! checkpoint, and the exit statuses of a stopped or aborted run.

use super::error::RunError;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Exit status of a run that a signal stopped cleanly, after finishing its step and writing
/// its checkpoint (sysexits' EX_TEMPFAIL: resume it later with `--resume`).
pub const EXIT_STOPPED: u8 = 75;

/// Exit status when a second SIGINT ends the run at once, without a checkpoint of the stop.
pub const EXIT_ABORTED: i32 = 130;

/// SIGINT/SIGTERM handling for the duration of a run: the first signal is recorded and the
/// run stops after its current step with a checkpoint. Only a second SIGINT (a person
/// pressing Ctrl-C again) exits at once; SIGTERM never does, because `timeout` and batch
/// schedulers often send it twice (to the process and to its group) and both must still
/// end in a checkpoint.
pub(super) struct SignalGuard {
    pub(super) received: Arc<AtomicUsize>,
    /// True until the step loop starts: a signal then ends the process at once.
    pub(super) preparing: Arc<AtomicBool>,
    pub(super) ids: Vec<signal_hook::SigId>,
}

/// A stop a library caller requests instead of a signal (`RunOptions::stop`): the run
/// installs no signal handlers of its own and stops after its current step with a
/// checkpoint once `request` is called, as after a first SIGINT.
#[derive(Debug, Clone, Default)]
pub struct StopRequest(Arc<AtomicUsize>);

impl StopRequest {
    /// A request not made yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks the run to stop after its current step (reported as signal 2, SIGINT).
    pub fn request(&self) {
        self.0
            .store(signal_hook::consts::SIGINT as usize, Ordering::SeqCst);
    }
}

impl SignalGuard {
    /// The run's stop mechanism: the caller's `stop` request when given, else handlers
    /// for SIGINT and SIGTERM.
    pub(super) fn for_run(stop: Option<&StopRequest>) -> Result<Self, RunError> {
        match stop {
            Some(stop) => Ok(SignalGuard {
                received: Arc::clone(&stop.0),
                preparing: Arc::new(AtomicBool::new(true)),
                ids: Vec::new(),
            }),
            None => Self::install(),
        }
    }

    pub(super) fn install() -> Result<Self, RunError> {
        use signal_hook::consts::{SIGINT, SIGTERM};
        let received = Arc::new(AtomicUsize::new(0));
        let preparing = Arc::new(AtomicBool::new(true));
        let interrupted = Arc::new(AtomicBool::new(false));
        let mut ids = Vec::new();
        let fail =
            |e: std::io::Error| RunError::State(format!("cannot install signal handlers: {e}"));
        // Before the first step (reading checkpoints, sampling ICs) nothing is left half
        // done by stopping (every file is written atomically): end at once, as without a
        // handler, so that a stuck read can always be stopped.
        for sig in [SIGINT, SIGTERM] {
            ids.push(
                signal_hook::flag::register_conditional_shutdown(
                    sig,
                    128 + sig,
                    Arc::clone(&preparing),
                )
                .map_err(fail)?,
            );
        }
        // Registered before the flag it tests, so the first SIGINT only sets the flag.
        ids.push(
            signal_hook::flag::register_conditional_shutdown(
                SIGINT,
                EXIT_ABORTED,
                Arc::clone(&interrupted),
            )
            .map_err(fail)?,
        );
        ids.push(signal_hook::flag::register(SIGINT, Arc::clone(&interrupted)).map_err(fail)?);
        for sig in [SIGINT, SIGTERM] {
            ids.push(
                signal_hook::flag::register_usize(sig, Arc::clone(&received), sig as usize)
                    .map_err(fail)?,
            );
        }
        Ok(SignalGuard {
            received,
            preparing,
            ids,
        })
    }

    /// The step loop starts: from now on a signal stops the run after its step.
    pub(super) fn stepping(&self) {
        self.preparing.store(false, Ordering::SeqCst);
    }

    pub(super) fn received(&self) -> Option<i32> {
        match self.received.load(Ordering::SeqCst) {
            0 => None,
            s => Some(s as i32),
        }
    }
}

impl Drop for SignalGuard {
    fn drop(&mut self) {
        for id in self.ids.drain(..) {
            signal_hook::low_level::unregister(id);
        }
    }
}
