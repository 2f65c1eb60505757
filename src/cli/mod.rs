//! Argument parsing and dispatch; one file per subcommand.

mod analyze;
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
    /// PNG plots and CSV tables of a run folder or a snapshot: conservation, surface-density
    /// maps, radial profiles, bar strength and pattern speed, heating, Lagrangian radii.
    Analyze(analyze::AnalyzeArgs),
}

/// Parses the arguments, runs the subcommand, and turns its result into an exit code:
/// 0 success, 1 error (one line on stderr), 2 bad usage, 75 stopped cleanly by a signal
/// (checkpoint written), 130 a second SIGINT (docs/formats.md, "Exit status").
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    #[cfg(feature = "mpi")]
    {
        use leapfmm::distributed::comm::Communicator;
        use leapfmm::distributed::mpi_rank::{MpiEnvironment, launched_by_mpi};
        if launched_by_mpi() {
            let env = match MpiEnvironment::initialize() {
                Ok(env) => env,
                Err(e) => return report(Err(e.into())),
            };
            let comm = env.world();
            let result = match cli.command {
                Command::Run(args) => run::execute(args, Some(&comm)),
                Command::Forces(args) => {
                    forces::execute(args, Some(&comm)).map(|()| ExitCode::SUCCESS)
                }
                // The other subcommands are serial: rank 0 does them.
                other if comm.rank() == 0 => dispatch(other),
                _ => Ok(ExitCode::SUCCESS),
            };
            if let Err(e) = &result
                && comm.size() > 1
            {
                // Stops every rank of the job (none is left waiting in a collective).
                comm.abort(&format!("{e:#}"));
            }
            return report(result);
        }
    }
    report(dispatch(cli.command))
}

/// Runs one subcommand in this process alone.
fn dispatch(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        #[cfg(feature = "mpi")]
        Command::Run(args) => run::execute(args, None),
        #[cfg(not(feature = "mpi"))]
        Command::Run(args) => run::execute(args),
        Command::Ics(args) => ics::execute(args).map(|()| ExitCode::SUCCESS),
        Command::Info(args) => info::execute(args).map(|()| ExitCode::SUCCESS),
        #[cfg(feature = "mpi")]
        Command::Forces(args) => forces::execute(args, None).map(|()| ExitCode::SUCCESS),
        #[cfg(not(feature = "mpi"))]
        Command::Forces(args) => forces::execute(args).map(|()| ExitCode::SUCCESS),
        Command::Bench(args) => bench::execute(args).map(|()| ExitCode::SUCCESS),
        Command::Analyze(args) => analyze::execute(args).map(|()| ExitCode::SUCCESS),
    }
}

/// The exit code of a result: 0 success, 1 error (one line on stderr), or the code a
/// subcommand chose.
fn report(result: anyhow::Result<ExitCode>) -> ExitCode {
    match result {
        Ok(code) => code,
        Err(e) => {
            leapfmm::tell!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// A particle count on the command line: a whole number from 1 to 2^40 (negative numbers
/// reach it as values, so that `--n -5` is told the count must be positive).
pub fn particle_count(s: &str) -> Result<u64, String> {
    match s.trim().parse::<i128>() {
        Ok(n) if (1..=1i128 << 40).contains(&n) => Ok(n as u64),
        Ok(n) if n < 1 => Err(format!("{n}: a particle count must be positive")),
        Ok(n) => Err(format!("{n}: a particle count must be at most 2^40")),
        Err(_) => Err(format!("{s:?} is not a whole number")),
    }
}
