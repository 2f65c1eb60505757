//! A run folder met again: its lock, the verdict on what is in it (fresh, resumable, refused),
//! and the newest valid checkpoint read back and checked against the config and inputs.

use super::error::{RunError, agree};
use super::folder::{Checkpoint, RunState, checkpoint_dir, snapshot_dir};
use super::options::RunOptions;
use crate::config::{ConfigError, INPUT_PATH_KEYS, RunConfig, RunSpec, resume_conflicts};
use crate::distributed::comm::Communicator;
use crate::fmm::caps::Caps;
use crate::integrate::timestep::Timeline;
use crate::io::checkpoint;
use crate::io::inputs::{INPUTS_FILE, RunInputs};
use crate::io::lock::RunLock;
use crate::particles::Particles;
use crate::progress::Progress;
use std::path::{Path, PathBuf};

/// Where a resumed rank's state comes from.
pub(super) struct Resumed {
    pub(super) state: RunState,
    pub(super) particles: Particles,
    pub(super) caps: Option<Caps>,
    pub(super) work: Vec<f64>,
}

/// Takes the run folder's lock on rank 0 (collective): every rank fails alike, with the
/// holder's PID, when another process writes the folder.
pub(super) fn lock_run_folder(
    run_dir: &Path,
    comm: &dyn Communicator,
) -> Result<Option<RunLock>, RunError> {
    let (lock, local) = if comm.rank() == 0 {
        match RunLock::acquire(run_dir) {
            Ok(lock) => (Some(lock), Ok(())),
            Err(e) => (None, Err(e.to_string())),
        }
    } else {
        (None, Ok(()))
    };
    agree(comm, local).map_err(RunError::State)?;
    Ok(lock)
}

/// Reads the newest valid checkpoint (collective) and takes this rank's part: its own file
/// when the rank count is unchanged (bit-exact), otherwise an equal share of all particles
/// (redistribution; the next force evaluation rebalances).
pub(super) fn load_checkpoint(
    spec: &RunSpec,
    comm: &dyn Communicator,
    progress: &Progress,
    timeline: &Timeline,
    inputs_recorded: bool,
) -> Result<Resumed, RunError> {
    let c = &spec.config;
    let ckpt_dir = checkpoint_dir(&spec.run_dir);
    let (rank, ranks) = (comm.rank(), comm.size());
    // The step comes from the content: a copy named as another step is corrupt.
    let check = |step: u64, loaded: &checkpoint::Loaded<Checkpoint>| {
        verify_checkpoint(loaded)?;
        match loaded.payloads.first().map(|c| c.state.step) {
            Some(inside) if inside != step => {
                Err(format!("named as step {step} but holds step {inside}"))
            }
            _ => Ok(()),
        }
    };
    let found = checkpoint::newest_valid::<Checkpoint>(&ckpt_dir, check)?
        .ok_or_else(|| RunError::State(format!("no checkpoint in {}", ckpt_dir.display())))?;
    let path = found.entry.path().to_path_buf();
    let first = found
        .payloads
        .first()
        .ok_or_else(|| RunError::State(format!("{}: the checkpoint is empty", path.display())))?;
    check_resumable(spec, first, &path, inputs_recorded)?;
    // Every rank has read before rank 0 renames anything.
    comm.barrier()?;
    if rank == 0 {
        for (bad, reason) in &found.rejected {
            let aside = checkpoint::set_aside(bad)?;
            progress.warn(&format!(
                "{reason}; set aside as {} and resuming from the previous checkpoint",
                aside.display()
            ));
        }
    }
    let state = first.state.clone();
    progress.note(&format!(
        "{}: resuming from {} (step {}, t = {})",
        c.name,
        path.display(),
        state.step,
        timeline.time(state.ti)
    ));
    let saved = found.payloads.len();
    if saved == ranks {
        let mut mine = found.payloads.into_iter().nth(rank).ok_or_else(|| {
            RunError::State(format!("{}: no file for rank {rank}", path.display()))
        })?;
        if mine.decomposition_work.len() != mine.particles.len() {
            mine.decomposition_work.clear();
        }
        return Ok(Resumed {
            state,
            particles: mine.particles,
            caps: mine.caps,
            work: mine.decomposition_work,
        });
    }
    progress.note(&format!(
        "{}: the checkpoint was written by {saved} rank(s); redistributing its particles over {ranks}",
        c.name
    ));
    let mut all = Particles::default();
    for ckpt in found.payloads {
        all.extend(ckpt.particles);
    }
    let n = all.len();
    Ok(Resumed {
        state,
        particles: all.slice(n * rank / ranks..n * (rank + 1) / ranks),
        caps: None,
        work: Vec::new(),
    })
}

/// Checks a verified checkpoint's contents as a whole: every rank file at the same step
/// and time, each holding the particles its manifest says, the total the particle count of
/// the run that wrote it (`ics.n` of its own config, for a model), and every particle ID
/// once. A checkpoint that fails is treated as corrupt.
pub fn verify_checkpoint(loaded: &checkpoint::Loaded<Checkpoint>) -> Result<(), String> {
    let first = loaded
        .payloads
        .first()
        .ok_or_else(|| "the checkpoint holds no rank files".to_string())?;
    for (r, p) in loaded.payloads.iter().enumerate() {
        if p.state != first.state {
            return Err(format!(
                "rank {r} is at step {}, rank 0 at step {}: the files come from different checkpoints",
                p.state.step, first.state.step
            ));
        }
    }
    if let Some(m) = &loaded.manifest {
        if m.step != first.state.step {
            return Err(format!(
                "the manifest is of step {}, its files of step {}",
                m.step, first.state.step
            ));
        }
        for (r, (p, listed)) in loaded.payloads.iter().zip(&m.files).enumerate() {
            if p.particles.len() as u64 != listed.particles {
                return Err(format!(
                    "rank {r}'s file holds {} particles, the manifest says {}",
                    p.particles.len(),
                    listed.particles
                ));
            }
        }
    }
    let total: usize = loaded.payloads.iter().map(|p| p.particles.len()).sum();
    let model_n = parse_stored_config(&first.config_text).ok().and_then(|c| {
        if c.ics.galaxies.is_empty() {
            c.ics.n.filter(|_| c.ics.model.is_some())
        } else {
            Some(c.ics.galaxies.iter().map(|g| g.n).sum())
        }
    });
    if let Some(n) = model_n
        && total as i64 != n
    {
        return Err(format!("it holds {total} particles, its run has n = {n}"));
    }
    let mut ids: Vec<u64> = loaded
        .payloads
        .iter()
        .flat_map(|p| p.particles.id.iter().copied())
        .collect();
    ids.sort_unstable();
    if let Some(w) = ids.windows(2).find(|w| w[0] == w[1]) {
        return Err(format!("particle ID {} appears more than once", w[0]));
    }
    Ok(())
}

/// A config text stored in a checkpoint, parsed as `RunSpec::load` parses a file.
pub fn parse_stored_config(text: &str) -> Result<RunConfig, ConfigError> {
    crate::config::parse_run_config(&crate::config::SourceText {
        path: PathBuf::from("(the checkpoint's config)"),
        text: text.to_string(),
    })
}

/// Whether the run may start or go on in its folder (rank 0): a folder with outputs needs
/// `--resume`; without a checkpoint only the same config and inputs may start it again; with
/// one, the inputs must match the folder's record. Returns the inputs to record.
pub(super) fn folder_verdict(
    spec: &RunSpec,
    options: &RunOptions,
    has_outputs: bool,
    no_checkpoint: bool,
) -> Result<RunInputs, String> {
    let run_dir = &spec.run_dir;
    if has_outputs && !options.resume {
        return Err(format!(
            "run folder {} already holds a run (snapshots, checkpoints or diagnostics); pass --resume to continue it, or change 'name' in {} to start another",
            run_dir.display(),
            spec.source.path.display()
        ));
    }
    let now = RunInputs::of(&spec.ics, &spec.config.gravity.external).map_err(|e| e.to_string())?;
    if !has_outputs {
        return Ok(now);
    }
    let recorded = RunInputs::read(run_dir).map_err(|e| e.to_string())?;
    let changed = recorded.as_ref().and_then(|r| r.difference(&now));
    if no_checkpoint {
        // A run stopped before its first checkpoint starts again when its config and inputs
        // are the ones it was started with (a run is deterministic: the same snapshots come
        // again); otherwise a fresh start would overwrite its snapshots with another run.
        let same_config = crate::files::read_regular_text(&run_dir.join("config.toml"))
            .is_ok_and(|t| t == spec.source.text);
        let why = if !same_config {
            format!(
                "its config.toml differs from {}",
                spec.source.path.display()
            )
        } else if let Some(change) = &changed {
            format!("its inputs differ ({change})")
        } else if recorded.is_none() {
            format!("it has no {INPUTS_FILE} recording its inputs")
        } else {
            return Ok(now);
        };
        let snapshots = snapshot_dir(run_dir)
            .read_dir()
            .map_or(0, |d| d.flatten().count());
        return Err(format!(
            "run folder {} holds {snapshots} snapshot(s){} but no checkpoint, and {why}, so --resume cannot continue it; to start afresh, remove the folder (or change 'name')",
            run_dir.display(),
            if run_dir.join("diagnostics.csv").exists() {
                " and diagnostics.csv"
            } else {
                ""
            },
        ));
    }
    match changed {
        Some(change) => Err(change),
        None => Ok(now),
    }
}

/// Refuses to resume when the config changed in a way that breaks the run's continuity.
/// The input paths may change when the folder's record vouches for the inputs' content.
fn check_resumable(
    spec: &RunSpec,
    ckpt: &Checkpoint,
    path: &Path,
    inputs_recorded: bool,
) -> Result<(), RunError> {
    let saved = parse_stored_config(&ckpt.config_text).map_err(|e| {
        RunError::State(format!(
            "{}: the config stored in this checkpoint no longer parses ({e}); resume with the leapfmm version that wrote it ({})",
            path.display(),
            ckpt.version
        ))
    })?;
    let also_allowed: &[&str] = if inputs_recorded {
        &INPUT_PATH_KEYS
    } else {
        &[]
    };
    if let Some((key, was, now)) = resume_conflicts(&saved, &spec.config, also_allowed)
        .into_iter()
        .next()
    {
        return Err(RunError::State(format!(
            "{}: key '{key}' changed since the checkpoint (was {was}, now {now}); restore it to resume, or start a new run under another name",
            spec.source.path.display()
        )));
    }
    Ok(())
}
