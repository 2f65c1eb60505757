//! `leapfmm ics MODEL --n N [--seed S] -o FILE`.

use anyhow::{Result, bail};
use clap::Args;
use leapfmm::config::{Precision, flatten};
use leapfmm::ics::galaxy::Galaxy;
use leapfmm::ics::{self, ModelFile};
use leapfmm::io::snapshot::{SnapshotInfo, write_snapshot};
use std::path::PathBuf;
use std::time::Instant;

/// Arguments of `leapfmm ics`.
#[derive(Debug, Args)]
pub struct IcsArgs {
    /// Model file (TOML, see ics/).
    model: PathBuf,
    /// Number of particles.
    #[arg(long, allow_negative_numbers = true, value_parser = super::particle_count)]
    n: u64,
    /// Random seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Output file (GADGET-4 HDF5).
    #[arg(short, long)]
    output: PathBuf,
    /// Precision of Coordinates and Velocities (double keeps the f64 state exactly).
    #[arg(long, value_enum, default_value_t = PrecisionArg::Double)]
    precision: PrecisionArg,
    /// Also write the model's radial profiles (rotation curve by component, Toomre Q, σ_R,
    /// σ_z, mean v_φ) to this CSV file (galaxy models only).
    #[arg(long)]
    curves: Option<PathBuf>,
}

/// `--precision` values.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum PrecisionArg {
    Single,
    Double,
}

/// Samples the model and writes the file.
pub fn execute(args: IcsArgs) -> Result<()> {
    if args.output.is_dir() {
        bail!(
            "-o {}: this is a folder; give a file name",
            args.output.display()
        );
    }
    if let Some(parent) = args.output.parent()
        && !parent.as_os_str().is_empty()
        && !parent.is_dir()
    {
        // Name a file in the way (`-o notes.txt/x.hdf5`) rather than a missing folder.
        if let Some(file) = parent.ancestors().find(|a| a.is_file()) {
            bail!(
                "-o {}: {} is a file, not a folder",
                args.output.display(),
                file.display()
            );
        }
        bail!(
            "-o {}: the folder {} does not exist",
            args.output.display(),
            parent.display()
        );
    }
    let model = ModelFile::load(&args.model)?;
    let text = std::fs::read_to_string(&args.model).unwrap_or_default();
    let start = Instant::now();
    let (particles, warnings) = ics::generate(&model, args.n as usize, args.seed);
    for w in warnings {
        eprintln!("warning: {w}");
    }
    let mut parameters = flatten(&model);
    parameters.push(("ics.n".into(), toml::Value::Integer(args.n as i64)));
    parameters.push((
        "ics.seed".into(),
        toml::Value::String(args.seed.to_string()),
    ));
    let precision = match args.precision {
        PrecisionArg::Single => Precision::Single,
        PrecisionArg::Double => Precision::Double,
    };
    let info = SnapshotInfo {
        parameters,
        settings_text: Some(&text),
        // Known only where the model gives every component its own length (the run's
        // gravity.softening is not the model's).
        softening: model.own_softening(),
        ..SnapshotInfo::new(0.0, model.units, precision)
    };
    write_snapshot(&args.output, &particles, &info)?;
    if let Some(path) = &args.curves {
        if model.sphere.is_some() {
            bail!(
                "--curves needs a galaxy model ([halo], [disk], [bulge]); {} is a sphere",
                args.model.display()
            );
        }
        let galaxy = Galaxy::new(&model);
        let r_max = model.disk.as_ref().map_or(30.0, |d| {
            d.truncation_radius.unwrap_or(8.0 * d.scale_length)
        });
        std::fs::write(path, galaxy.curves_csv(r_max, r_max / 200.0))
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
    }
    eprintln!(
        "wrote {} particles to {} in {:.2} s",
        particles.len(),
        args.output.display(),
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
