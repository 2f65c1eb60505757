//! `leapfmm run CONFIG [--resume] [--ranks K] [--backend auto|cpu|cuda] [--quiet]`.

use anyhow::Result;
use clap::Args;
use leapfmm::campaign::{Campaign, CampaignOptions, RunStatus, is_campaign, run_campaign};
use leapfmm::config::{Backend, RunSpec};
use leapfmm::simulation::{self, EXIT_STOPPED, RunOptions, RunOutcome};
use std::path::PathBuf;
use std::process::ExitCode;
#[cfg(feature = "mpi")]
use {leapfmm::distributed::comm::Communicator, leapfmm::distributed::mpi_rank::MpiRank};

/// Arguments of `leapfmm run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Run config (TOML), or a campaign file (a `[base]` run with `[sweep]` or `[[runs]]`).
    config: PathBuf,
    /// Continue from the newest valid checkpoint (starts afresh if there is none). A
    /// campaign always continues its runs.
    #[arg(long)]
    resume: bool,
    /// No progress bar or log lines (warnings and errors still print).
    #[arg(long)]
    quiet: bool,
    /// Split the particles over K ranks (threads of this process, sharing its cores); the
    /// run writes K-file snapshots and per-rank checkpoints. Resuming with another K
    /// redistributes the particles.
    #[arg(long, default_value_t = 1, allow_negative_numbers = true, value_parser = clap::value_parser!(u32).range(1..=1024))]
    ranks: u32,
    /// Where the FMM's passes run, overriding `gravity.backend`: `auto` takes GPU 0 when
    /// there is one and the run can use it, and says which it chose.
    #[arg(long, value_enum)]
    backend: Option<Backend>,
}

/// Validates the config, runs, and reports how the run ended.
pub fn execute(args: RunArgs, #[cfg(feature = "mpi")] mpi: Option<&MpiRank>) -> Result<ExitCode> {
    // Unreadable here (missing, not a regular file): the config loader says why.
    let text = leapfmm::files::read_regular_text(&args.config).unwrap_or_default();
    if is_campaign(&text) {
        #[cfg(feature = "mpi")]
        if mpi.is_some() {
            anyhow::bail!(
                "{}: a campaign runs in one process; start it without mpirun (use --ranks K)",
                args.config.display()
            );
        }
        return campaign(&args);
    }
    let mut spec = RunSpec::load(&args.config)?;
    if let Some(backend) = args.backend {
        spec.config.gravity.backend = backend;
    }
    let options = RunOptions {
        resume: args.resume,
        quiet: args.quiet,
        ranks: args.ranks as usize,
        group: None,
        stop: None,
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

/// Runs a campaign and reports on every run: exit 0 when all are complete, 1 when one
/// failed or was rejected, `EXIT_STOPPED` (75) when a signal stopped it cleanly.
fn campaign(args: &RunArgs) -> Result<ExitCode> {
    let mut campaign = Campaign::load(&args.config)?;
    if let Some(backend) = args.backend {
        for spec in campaign
            .runs
            .iter_mut()
            .filter_map(|r| r.spec.as_mut().ok())
        {
            spec.config.gravity.backend = backend;
        }
    }
    let rejected: Vec<_> = campaign
        .runs
        .iter()
        .filter_map(|r| r.spec.as_ref().err().map(|e| (&r.name, e)))
        .collect();
    if !args.quiet {
        leapfmm::tell!(
            "campaign {}: {} runs in {}",
            campaign.name,
            campaign.runs.len(),
            campaign.dir.display()
        );
    }
    for (name, reason) in &rejected {
        leapfmm::tell!("campaign {}: run {name} rejected: {reason}", campaign.name);
    }
    let options = CampaignOptions {
        quiet: args.quiet,
        ranks: args.ranks as usize,
        stop: None,
    };
    let (statuses, signal) = run_campaign(&campaign, &options)?;
    let count = |w: &str| statuses.iter().filter(|s| s.word() == w).count();
    let words = [
        "finished",
        "resumed",
        "skipped",
        "failed",
        "invalid",
        "interrupted",
        "not run",
    ];
    let tally: Vec<String> = words
        .iter()
        .filter(|w| count(w) > 0)
        .map(|w| format!("{} {w}", count(w)))
        .collect();
    if !args.quiet {
        leapfmm::tell!(
            "campaign {}: {}; summary in {}",
            campaign.name,
            tally.join(", "),
            campaign.dir.join("summary.md").display()
        );
    }
    for (run, status) in campaign.runs.iter().zip(&statuses) {
        if let RunStatus::Failed(reason) = status {
            leapfmm::tell!("  {} failed: {reason}", run.name);
        }
    }
    Ok(match signal {
        Some(_) => ExitCode::from(EXIT_STOPPED),
        None if statuses.iter().all(RunStatus::complete) => ExitCode::SUCCESS,
        None => ExitCode::FAILURE,
    })
}

/// Reports how the run ended and picks the exit code.
fn exit_code(spec: &RunSpec, outcome: RunOutcome, quiet: bool) -> ExitCode {
    match outcome {
        RunOutcome::Finished { steps, time } => {
            if !quiet {
                let dir = spec.run_dir.display();
                let when = match spec.config.units.cgs() {
                    Some(u) => format!(
                        "{time} ({:.1} Myr)",
                        time * u.time_s() / leapfmm::units::MYR_S
                    ),
                    None => time.to_string(),
                };
                leapfmm::tell!(
                    "{}: finished at t = {when} after {steps} steps; output in {dir}",
                    spec.config.name
                );
                if let Some(s) = RunFigures::read(&spec.run_dir.join("diagnostics.csv"), steps) {
                    leapfmm::tell!(
                        "  wall time {:.1} s, {}, max |ΔE/E| {:.2e} (diagnostics.csv)",
                        s.wall_s,
                        s.evaluations,
                        s.max_energy_error
                    );
                }
                leapfmm::tell!(
                    "  to see it: leapfmm analyze {dir}  (maps, rotation curves and profiles in {dir}/analysis/)"
                );
            }
            ExitCode::SUCCESS
        }
        RunOutcome::AlreadyFinished { .. } => ExitCode::SUCCESS,
        RunOutcome::Interrupted { .. } => ExitCode::from(EXIT_STOPPED),
    }
}

/// The figures a user checks first, from a finished run's `diagnostics.csv`.
struct RunFigures {
    /// Wall seconds over every row (a resumed run's earlier part included).
    wall_s: f64,
    /// Force evaluations, said in words.
    evaluations: String,
    /// Largest |ΔE/E| over the rows.
    max_energy_error: f64,
}

impl RunFigures {
    fn read(path: &std::path::Path, steps: u64) -> Option<Self> {
        let text = leapfmm::files::read_regular_text(path).ok()?;
        let mut lines = text.lines();
        let names: Vec<&str> = lines.next()?.split(',').collect();
        let col = |name: &str| names.iter().position(|n| *n == name);
        let rows: Vec<Vec<f64>> = lines
            .map(|l| {
                l.split(',')
                    .map(|v| v.parse().unwrap_or(f64::NAN))
                    .collect()
            })
            .collect();
        let sum = |k: usize| rows.iter().filter_map(|r| r.get(k)).sum::<f64>();
        let (wall, energy) = (col("wall_total")?, col("rel_energy_error")?);
        let evaluations = match col("force_evaluations") {
            Some(k) => format!("{:.3e} particle force evaluations (block steps)", sum(k)),
            // One evaluation of every particle per step, and one at the start.
            None => format!("{} force evaluations", steps + 1),
        };
        Some(RunFigures {
            wall_s: sum(wall),
            evaluations,
            max_energy_error: rows
                .iter()
                .filter_map(|r| r.get(energy))
                .fold(0.0, |m: f64, e| m.max(e.abs())),
        })
    }
}
