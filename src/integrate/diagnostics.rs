//! Conserved quantities and the per-step diagnostics log (`diagnostics.csv`).

use crate::format::csv_number;
use crate::particles::Particles;
use crate::sum::sum_indexed;
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

/// Number of additive sums behind `Conserved`.
pub const CONSERVED_SUMS: usize = 12;

/// Energies, momenta and centre of mass of a synchronised state.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Conserved {
    /// Kinetic energy.
    pub kinetic: f64,
    /// Potential energy, ½ Σ m φ.
    pub potential: f64,
    /// Potential energy in the external potential, Σ m Φ_ext (0 without one).
    pub external: f64,
    /// Linear momentum.
    pub momentum: [f64; 3],
    /// Angular momentum about the origin.
    pub angular_momentum: [f64; 3],
    /// Centre of mass.
    pub com: [f64; 3],
}

impl Conserved {
    /// Measures a state whose potentials are current. Deterministic for any thread count.
    pub fn measure(p: &Particles) -> Self {
        Self::from_sums(&Self::sums(p))
    }

    /// The additive sums behind `measure`, so that ranks can add theirs up (in rank order)
    /// before `from_sums`.
    pub fn sums(p: &Particles) -> [f64; CONSERVED_SUMS] {
        sum_indexed(p.len(), |i| {
            let (m, x, v) = (p.mass[i], p.pos[i], p.vel[i]);
            let v2 = v[0] * v[0] + v[1] * v[1] + v[2] * v[2];
            [
                0.5 * m * v2,
                0.5 * m * p.pot[i],
                m * v[0],
                m * v[1],
                m * v[2],
                m * (x[1] * v[2] - x[2] * v[1]),
                m * (x[2] * v[0] - x[0] * v[2]),
                m * (x[0] * v[1] - x[1] * v[0]),
                m * x[0],
                m * x[1],
                m * x[2],
                m,
            ]
        })
    }

    /// The quantities from (possibly rank-summed) `sums`.
    pub fn from_sums(s: &[f64; CONSERVED_SUMS]) -> Self {
        let mass = if s[11] > 0.0 { s[11] } else { 1.0 };
        Conserved {
            kinetic: s[0],
            potential: s[1],
            external: 0.0,
            momentum: [s[2], s[3], s[4]],
            angular_momentum: [s[5], s[6], s[7]],
            com: [s[8] / mass, s[9] / mass, s[10] / mass],
        }
    }

    /// Kinetic plus potential energy, the external potential's included.
    pub fn total(&self) -> f64 {
        self.kinetic + self.potential + self.external
    }

    /// Virial ratio 2K/|W|.
    pub fn virial_ratio(&self) -> f64 {
        2.0 * self.kinetic / self.potential.abs()
    }
}

/// Wall-clock seconds spent per phase since the previous diagnostics row.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PhaseTimes {
    /// Force evaluation.
    pub force: f64,
    /// Kicks and drifts.
    pub integrate: f64,
    /// Measuring diagnostics.
    pub diagnostics: f64,
    /// Snapshots and checkpoints.
    pub io: f64,
}

impl PhaseTimes {
    /// Sum of all phases.
    pub fn total(&self) -> f64 {
        self.force + self.integrate + self.diagnostics + self.io
    }
}

/// One row of `diagnostics.csv`.
#[derive(Debug, Clone, Copy)]
pub struct Row<'a> {
    /// Steps taken so far.
    pub step: u64,
    /// Simulation time.
    pub time: f64,
    /// Last step's length.
    pub dt: f64,
    /// Conserved quantities now.
    pub conserved: Conserved,
    /// Total energy at the start of the run.
    pub energy0: f64,
    /// Pair interactions since the previous row.
    pub interactions: u64,
    /// Wall time per phase since the previous row.
    pub wall: PhaseTimes,
    /// Solver-specific figures, one per extra column.
    pub solver: &'a [f64],
}

const COLUMNS: &str = "step,time,dt,kinetic,potential,total,rel_energy_error,px,py,pz,lx,ly,lz,com_x,com_y,com_z,virial_ratio,interactions,wall_force,wall_integrate,wall_diagnostics,wall_io,wall_total";

/// Appends rows to `diagnostics.csv`.
#[derive(Debug)]
pub struct DiagnosticsLog {
    path: PathBuf,
    out: BufWriter<File>,
}

impl DiagnosticsLog {
    /// Starts a new log, replacing any old one; `extra` names the solver's columns.
    pub fn create(path: &Path, extra: &[&str]) -> std::io::Result<Self> {
        let mut out = BufWriter::new(File::create(path)?);
        let mut header = COLUMNS.to_string();
        for name in extra {
            header.push(',');
            header.push_str(name);
        }
        writeln!(out, "{header}")?;
        out.flush()?;
        Ok(DiagnosticsLog {
            path: path.to_path_buf(),
            out,
        })
    }

    /// Reopens a log for a resumed run, dropping rows written after `step` (they belong to
    /// steps that will be recomputed). A missing log is started afresh.
    pub fn resume(path: &Path, step: u64, extra: &[&str]) -> std::io::Result<Self> {
        if !path.is_file() {
            return Self::create(path, extra);
        }
        keep_rows_up_to(path, step)?;
        let out = BufWriter::new(std::fs::OpenOptions::new().append(true).open(path)?);
        Ok(DiagnosticsLog {
            path: path.to_path_buf(),
            out,
        })
    }

    /// The log's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends and flushes one row.
    pub fn append(&mut self, r: &Row<'_>) -> std::io::Result<()> {
        let c = &r.conserved;
        let e = c.total();
        let rel = if r.energy0 != 0.0 {
            (e - r.energy0) / r.energy0.abs()
        } else {
            0.0
        };
        let numbers = [
            r.time,
            r.dt,
            c.kinetic,
            c.potential,
            e,
            rel,
            c.momentum[0],
            c.momentum[1],
            c.momentum[2],
            c.angular_momentum[0],
            c.angular_momentum[1],
            c.angular_momentum[2],
            c.com[0],
            c.com[1],
            c.com[2],
            c.virial_ratio(),
        ];
        write!(self.out, "{}", r.step)?;
        for x in numbers {
            write!(self.out, ",{}", csv_number(x))?;
        }
        write!(
            self.out,
            ",{},{:.6},{:.6},{:.6},{:.6},{:.6}",
            r.interactions,
            r.wall.force,
            r.wall.integrate,
            r.wall.diagnostics,
            r.wall.io,
            r.wall.total()
        )?;
        for &v in r.solver {
            write!(self.out, ",{}", csv_number(v))?;
        }
        writeln!(self.out)?;
        self.out.flush()
    }
}

/// Rewrites a CSV log keeping its header and the rows of steps up to `step` (the first
/// column); the rest belong to steps that a resumed run recomputes.
fn keep_rows_up_to(path: &Path, step: u64) -> std::io::Result<()> {
    let mut kept = Vec::new();
    for (n, line) in BufReader::new(File::open(path)?).lines().enumerate() {
        let line = line?;
        let row_step = line.split(',').next().and_then(|s| s.parse::<u64>().ok());
        if n == 0 || row_step.is_some_and(|s| s <= step) {
            kept.push(line);
        }
    }
    let tmp = path.with_extension("csv.tmp");
    {
        let mut f = BufWriter::new(File::create(&tmp)?);
        for line in &kept {
            writeln!(f, "{line}")?;
        }
        f.flush()?;
    }
    std::fs::rename(&tmp, path)
}

/// Appends every rank's solver figures to `ranks.csv` (runs on more than one rank): one row
/// per rank per diagnostics row, so load balance and communication can be read per rank.
#[derive(Debug)]
pub struct RankLog {
    out: BufWriter<File>,
}

impl RankLog {
    /// Starts (or, for a resumed run, continues after `resume_step`) the log at `path`;
    /// `names` are the solver's columns.
    pub fn open(path: &Path, names: &[&str], resume_step: Option<u64>) -> std::io::Result<Self> {
        if let Some(step) = resume_step.filter(|_| path.is_file()) {
            keep_rows_up_to(path, step)?;
            let out = BufWriter::new(std::fs::OpenOptions::new().append(true).open(path)?);
            return Ok(RankLog { out });
        }
        let mut out = BufWriter::new(File::create(path)?);
        writeln!(out, "step,time,rank,{}", names.join(","))?;
        out.flush()?;
        Ok(RankLog { out })
    }

    /// Appends one row per rank (`values[r]` are rank r's figures) and flushes.
    pub fn append(&mut self, step: u64, time: f64, values: &[Vec<f64>]) -> std::io::Result<()> {
        for (rank, row) in values.iter().enumerate() {
            write!(self.out, "{step},{},{rank}", csv_number(time))?;
            for &v in row {
                write!(self.out, ",{}", csv_number(v))?;
            }
            writeln!(self.out)?;
        }
        self.out.flush()
    }
}
