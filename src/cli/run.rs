//! `leapfmm run CONFIG [--resume] [--ranks K] [--quiet]`.

use anyhow::Result;
use clap::Args;
use leapfmm::config::RunSpec;
use leapfmm::simulation::{self, RunOptions, RunOutcome};
use std::path::PathBuf;
use std::process::ExitCode;
#[cfg(feature = "mpi")]
use {leapfmm::distributed::comm::Communicator, leapfmm::distributed::mpi_rank::MpiRank};

/// Arguments of `leapfmm run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Run config (TOML).
    config: PathBuf,
    /// Continue from the newest valid checkpoint (starts afresh if there is none).
    #[arg(long)]
    resume: bool,
    /// No progress bar or log lines (warnings and errors still print).
    #[arg(long)]
    quiet: bool,
    /// Split the particles over K ranks (threads of this process, sharing its cores); the
    /// run writes K-file snapshots and per-rank checkpoints. Resuming with another K
    /// redistributes the particles.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    ranks: u32,
}

/// Validates the config, runs, and reports how the run ended.
pub fn execute(args: RunArgs, #[cfg(feature = "mpi")] mpi: Option<&MpiRank>) -> Result<ExitCode> {
    let spec = RunSpec::load(&args.config)?;
    let options = RunOptions {
        resume: args.resume,
        quiet: args.quiet,
        ranks: args.ranks as usize,
    };
    #[cfg(feature = "mpi")]
    if let Some(comm) = mpi {
        if args.ranks > 1 {
            anyhow::bail!(
                "--ranks starts thread ranks; under mpirun, the MPI ranks are the ranks: drop --ranks"
            );
        }
        let quiet = args.quiet || comm.rank() != 0;
        let outcome = simulation::run_with(&spec, RunOptions { quiet, ..options }, comm.clone())?;
        return Ok(exit_code(&spec, outcome, quiet));
    }
    let outcome = simulation::run(&spec, options)?;
    Ok(exit_code(&spec, outcome, args.quiet))
}

/// Reports how the run ended and picks the exit code.
fn exit_code(spec: &RunSpec, outcome: RunOutcome, quiet: bool) -> ExitCode {
    match outcome {
        RunOutcome::Finished { steps, time } => {
            if !quiet {
                eprintln!(
                    "{}: finished at t = {time} after {steps} steps; output in {}",
                    spec.config.name,
                    spec.run_dir.display()
                );
            }
            ExitCode::SUCCESS
        }
        RunOutcome::AlreadyFinished { .. } => ExitCode::SUCCESS,
        RunOutcome::Interrupted { signal, .. } => {
            ExitCode::from((128 + signal).clamp(0, 255) as u8)
        }
    }
}
