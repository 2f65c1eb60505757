//! `leapfmm info FILE`: a summary of a snapshot, IC or checkpoint file (or checkpoint set
//! manifest).

use anyhow::{Context, Result, bail};
use clap::Args;
use leapfmm::io::checkpoint;
use leapfmm::io::snapshot::read_snapshot;
use leapfmm::particles::{Component, Particles};
use leapfmm::simulation::{Checkpoint, verify_checkpoint};
use std::io::Read;
use std::path::{Path, PathBuf};

/// Arguments of `leapfmm info`.
#[derive(Debug, Args)]
pub struct InfoArgs {
    /// A GADGET-format HDF5 file, a leapfmm checkpoint, or a checkpoint set's `.manifest`.
    file: PathBuf,
}

/// Prints the summary on stdout.
pub fn execute(args: InfoArgs) -> Result<()> {
    let path = &args.file;
    if path.is_dir() {
        bail!(
            "{}: a folder, not a file (a checkpoint set is read through its .manifest, a multi-file snapshot through its .0.hdf5)",
            path.display()
        );
    }
    if !path.is_file() {
        bail!("{}: no such file", path.display());
    }
    let mut magic = [0u8; 16];
    let is_checkpoint = std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok()
        && &magic == checkpoint::MAGIC;
    if is_checkpoint {
        checkpoint_info(path)
    } else if path.extension().is_some_and(|e| e == "manifest") {
        checkpoint_set_info(path)
    } else {
        snapshot_info(path)
    }
}

/// A rank set (multi-rank checkpoint): verifies every rank file and sums them up.
fn checkpoint_set_info(path: &Path) -> Result<()> {
    let folder = path.with_extension("ranks");
    let entry = checkpoint::Entry::Set {
        manifest: path.to_path_buf(),
        folder,
    };
    let loaded = checkpoint::read_entry::<Checkpoint>(&entry)?;
    verify_checkpoint(&loaded).map_err(|reason| {
        anyhow::anyhow!("{} is not a usable checkpoint: {reason}", path.display())
    })?;
    let ranks = loaded.payloads;
    let first = ranks
        .first()
        .with_context(|| format!("{}: the set has no rank files", path.display()))?;
    println!(
        "{}: leapfmm checkpoint set of {} ranks (manifest, every file's SHA-256, identity, counts and IDs verified)",
        path.display(),
        ranks.len()
    );
    println!("  written by leapfmm {}", first.version);
    println!(
        "  step {}, last dt {:e}, snapshots written {}",
        first.state.step, first.state.last_dt, first.state.snapshots_written
    );
    let mut all = Particles::default();
    for (r, ckpt) in ranks.into_iter().enumerate() {
        println!("  rank {r}: {} particles", ckpt.particles.len());
        all.extend(ckpt.particles);
    }
    print_particles(&all);
    Ok(())
}

fn checkpoint_info(path: &Path) -> Result<()> {
    let loaded = checkpoint::read_entry::<Checkpoint>(&checkpoint::Entry::File(path.into()))?;
    verify_checkpoint(&loaded).map_err(|reason| {
        anyhow::anyhow!("{} is not a usable checkpoint: {reason}", path.display())
    })?;
    let ckpt = loaded
        .payloads
        .into_iter()
        .next()
        .with_context(|| format!("{}: empty checkpoint", path.display()))?;
    println!(
        "{}: leapfmm checkpoint (checksum verified; particle count and IDs checked)",
        path.display()
    );
    println!("  written by leapfmm {}", ckpt.version);
    println!(
        "  step {}, last dt {:e}, snapshots written {}",
        ckpt.state.step, ckpt.state.last_dt, ckpt.state.snapshots_written
    );
    println!("  initial total energy {:e}", ckpt.state.energy0);
    print_particles(&ckpt.particles);
    println!("  config:");
    for line in ckpt.config_text.lines() {
        println!("    {line}");
    }
    Ok(())
}

fn snapshot_info(path: &Path) -> Result<()> {
    let file = hdf5::File::open(path).with_context(|| {
        format!(
            "{}: not an HDF5 file or a leapfmm checkpoint",
            path.display()
        )
    })?;
    println!("{}: HDF5", path.display());
    if let Ok(header) = file.group("Header") {
        println!("  Header:");
        let mut names = header.attr_names().unwrap_or_default();
        names.sort();
        for name in names {
            let value = header
                .attr(&name)
                .and_then(|a| a.read_raw::<f64>())
                .map(|v| format_values(&v))
                .unwrap_or_else(|_| "(non-numeric)".into());
            println!("    {name} = {value}");
        }
    }
    let mut groups = file.member_names().unwrap_or_default();
    groups.sort();
    for g in groups.iter().filter(|g| g.starts_with("PartType")) {
        // A damaged group is named by the read below, with the reason.
        let Ok(group) = file.group(g) else {
            println!("  {g}: (unreadable)");
            continue;
        };
        println!("  {g}:");
        let mut names = group.member_names().unwrap_or_default();
        names.sort();
        for name in names {
            if let Ok(ds) = group.dataset(&name) {
                let dtype = ds
                    .dtype()
                    .and_then(|t| t.to_descriptor())
                    .map(|d| d.to_string())
                    .unwrap_or_else(|_| "?".into());
                println!("    {name}: {dtype} {:?}", ds.shape());
            }
        }
    }
    for g in ["Units", "Parameters"] {
        if let Ok(group) = file.group(g) {
            println!(
                "  /{g}: {} attributes",
                group.attr_names().map(|a| a.len()).unwrap_or(0)
            );
        }
    }
    match read_snapshot(path) {
        Ok(data) => {
            println!("  time {}", data.time);
            if data.files.len() > 1 {
                println!("  spread over {} files", data.files.len());
            }
            match data.units {
                Some(u) => println!(
                    "  units: length {:.6e} cm, mass {:.6e} g, velocity {:.6e} cm/s",
                    u.length_cm, u.mass_g, u.velocity_cm_per_s
                ),
                None => println!("  units: not recorded (or N-body)"),
            }
            print_particles(&data.particles);
        }
        // The layout above helps find the fault; the status says the file is unusable.
        Err(e) => bail!("cannot be used as initial conditions: {e}"),
    }
    Ok(())
}

fn format_values(v: &[f64]) -> String {
    let items: Vec<String> = v.iter().map(|x| format!("{x}")).collect();
    if items.len() == 1 {
        items[0].clone()
    } else {
        format!("[{}]", items.join(", "))
    }
}

/// Count, mass, centre and extent per component, then totals.
fn print_particles(p: &Particles) {
    for c in Component::ALL {
        let idx = p.indices_of(c);
        if idx.is_empty() {
            continue;
        }
        let mass: f64 = idx.iter().map(|&i| p.mass[i]).sum();
        let mut radii: Vec<f64> = idx
            .iter()
            .map(|&i| p.pos[i].iter().map(|x| x * x).sum::<f64>().sqrt())
            .collect();
        radii.sort_by(f64::total_cmp);
        let sigma = (idx
            .iter()
            .map(|&i| p.vel[i].iter().map(|v| v * v).sum::<f64>())
            .sum::<f64>()
            / (3.0 * idx.len() as f64))
            .sqrt();
        println!(
            "  {} (PartType{}): {} particles, mass {:.6e}, median radius {:.4e}, max radius {:.4e}, 1-D velocity rms {:.4e}",
            c.name(),
            c.part_type(),
            idx.len(),
            mass,
            radii[radii.len() / 2],
            radii[radii.len() - 1],
            sigma
        );
    }
    let total: f64 = p.mass.iter().sum();
    println!("  total: {} particles, mass {:.6e}", p.len(), total);
}
