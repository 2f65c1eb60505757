//! `leapfmm info FILE`: a summary of a snapshot, IC or checkpoint file (or checkpoint set
//! manifest).

use anyhow::{Context, Result, bail};
use clap::Args;
use leapfmm::io::checkpoint;
use leapfmm::io::snapshot::read_snapshot;
use leapfmm::particles::{Component, Particles};
use leapfmm::simulation::{Checkpoint, verify_checkpoint};
use leapfmm::units::{CgsUnits, KPC_CM, MSUN_G, MYR_S};
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
    let first_config = first.config_text.clone();
    let mut all = Particles::default();
    for (r, ckpt) in ranks.into_iter().enumerate() {
        println!("  rank {r}: {} particles", ckpt.particles.len());
        all.extend(ckpt.particles);
    }
    print_particles(&all, shown_of(&first_config));
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
    print_particles(&ckpt.particles, shown_of(&ckpt.config_text));
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
            let shown = Shown(data.units);
            println!("  time {}", shown.time(data.time));
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
            print_particles(&data.particles, shown);
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
/// The units of a checkpoint's run, from the config it stores.
fn shown_of(config_text: &str) -> Shown {
    Shown(
        leapfmm::simulation::parse_stored_config(config_text)
            .ok()
            .and_then(|c| c.units.cgs()),
    )
}

/// How quantities are shown: in kpc, Msun, km/s and Myr when the file records physical
/// units, else as N-body numbers.
#[derive(Debug, Clone, Copy)]
struct Shown(Option<CgsUnits>);

impl Shown {
    fn scaled(&self, x: f64, factor: impl Fn(&CgsUnits) -> f64, unit: &str) -> String {
        match &self.0 {
            Some(u) => format!("{} {unit}", short_figures(x * factor(u))),
            None => short_figures(x),
        }
    }
    fn length(&self, x: f64) -> String {
        self.scaled(x, |u| u.length_cm / KPC_CM, "kpc")
    }
    fn mass(&self, x: f64) -> String {
        self.scaled(x, |u| u.mass_g / MSUN_G, "Msun")
    }
    fn velocity(&self, x: f64) -> String {
        self.scaled(x, |u| u.velocity_cm_per_s / 1e5, "km/s")
    }
    fn time(&self, t: f64) -> String {
        match &self.0 {
            Some(u) => format!(
                "{} ({} Myr)",
                short_figures(t),
                short_figures(t * u.time_s() / MYR_S)
            ),
            None => format!("{} (N-body units)", short_figures(t)),
        }
    }
}

/// `x` to 5 significant figures, without an exponent where it reads well.
fn short_figures(x: f64) -> String {
    if x == 0.0 || (1e-3..1e6).contains(&x.abs()) {
        let digits = (4 - x.abs().log10().floor() as i32).clamp(0, 8) as usize;
        let text = format!("{x:.digits$}");
        if text.contains('.') {
            text.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            text
        }
    } else {
        format!("{x:.4e}")
    }
}

fn print_particles(p: &Particles, shown: Shown) {
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
            "  {} (PartType{}): {} particles, mass {}, median radius {}, max radius {}, 1-D velocity rms {}",
            c.name(),
            c.part_type(),
            idx.len(),
            shown.mass(mass),
            shown.length(radii[radii.len() / 2]),
            shown.length(radii[radii.len() - 1]),
            shown.velocity(sigma)
        );
    }
    let total: f64 = p.mass.iter().sum();
    println!("  total: {} particles, mass {}", p.len(), shown.mass(total));
}
