//! `leapfmm analyze RUN_DIR|SNAPSHOT [-o DIR]`: plots and tables of a run or a snapshot.

use anyhow::{Context, Result};
use clap::Args;
use clap::builder::TypedValueParser;
use leapfmm::analysis::report::{Options, analyze};
use std::path::PathBuf;

/// Arguments of `leapfmm analyze`.
#[derive(Debug, Args)]
pub struct AnalyzeArgs {
    /// A run folder (its snapshots/ and diagnostics.csv) or one GADGET-format HDF5 snapshot
    /// (for a multi-file snapshot, its `.0.hdf5` file).
    input: PathBuf,
    /// Folder for the PNG plots and CSV tables (default: RUN_DIR/analysis, or
    /// SNAPSHOT_analysis next to a snapshot).
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// Outer radius of the profiles and half width of the maps, in the snapshot's length
    /// unit (default: 1.5x the disk's 90% Lagrangian radius in the first snapshot).
    #[arg(long, value_parser = positive)]
    r_max: Option<f64>,
    /// Radial bins of the profiles (default: ~400 disk particles per bin, 10 to 40 bins).
    #[arg(long, value_parser = clap::value_parser!(u32).range(2..=10_000).map(|v| v as usize))]
    bins: Option<usize>,
    /// Cells across the surface-density maps (face-on: square; edge-on: half as many rows).
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(8..=2000).map(|v| v as usize))]
    pixels: usize,
}

fn positive(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("{s} is not a positive length")),
    }
}

/// Writes the analysis and lists what it wrote.
pub fn execute(args: AnalyzeArgs) -> Result<()> {
    let output = args.output.clone().unwrap_or_else(|| {
        if args.input.is_dir() {
            args.input.join("analysis")
        } else {
            let stem = args.input.file_stem().unwrap_or_default().to_string_lossy();
            args.input.with_file_name(format!("{stem}_analysis"))
        }
    });
    let options = Options {
        r_max: args.r_max,
        bins: args.bins,
        pixels: args.pixels,
    };
    let report = analyze(&args.input, &output, options)
        .with_context(|| format!("analyzing {}", args.input.display()))?;
    println!(
        "analyzed {} snapshot(s); wrote {} files to {}",
        report.snapshots.len(),
        report.files.len(),
        output.display()
    );
    Ok(())
}
