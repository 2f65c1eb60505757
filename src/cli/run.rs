//! `leapfmm run CONFIG [--resume] [--quiet]`.

use anyhow::Result;
use clap::Args;
use leapfmm::config::RunSpec;
use leapfmm::simulation::{self, RunOptions, RunOutcome};
use std::path::PathBuf;
use std::process::ExitCode;

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
}

/// Validates the config, runs, and reports how the run ended.
pub fn execute(args: RunArgs) -> Result<ExitCode> {
    let spec = RunSpec::load(&args.config)?;
    let options = RunOptions {
        resume: args.resume,
        quiet: args.quiet,
    };
    let outcome = simulation::run(&spec, options)?;
    Ok(match outcome {
        RunOutcome::Finished { steps, time } => {
            if !args.quiet {
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
    })
}
