//! Argument parsing and dispatch; one file per subcommand.

mod bench;
mod forces;
mod ics;
mod info;
mod run;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// leapfmm: galaxy N-body simulations with a fast multipole method.
#[derive(Debug, Parser)]
#[command(name = "leapfmm", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run (or resume) a simulation described by a TOML config.
    Run(run::RunArgs),
    /// Sample initial conditions from a model file into a GADGET-4 HDF5 file.
    Ics(ics::IcsArgs),
    /// Summarise a snapshot, IC or checkpoint file.
    Info(info::InfoArgs),
    /// FMM accelerations and potentials of a snapshot, optionally checked against direct summation.
    Forces(forces::ForcesArgs),
    /// Force-solver benchmarks: cost and accuracy by size, and an accuracy–cost scan.
    Bench(bench::BenchArgs),
}

/// Parses the arguments, runs the subcommand, and turns its result into an exit code:
/// 0 success, 1 error (one line on stderr), 2 bad usage, 128+N stopped by signal N.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => run::execute(args),
        Command::Ics(args) => ics::execute(args).map(|()| ExitCode::SUCCESS),
        Command::Info(args) => info::execute(args).map(|()| ExitCode::SUCCESS),
        Command::Forces(args) => forces::execute(args).map(|()| ExitCode::SUCCESS),
        Command::Bench(args) => bench::execute(args).map(|()| ExitCode::SUCCESS),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
