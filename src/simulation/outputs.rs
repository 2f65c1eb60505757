//! What a run writes while it runs: diagnostics.csv and ranks.csv (`Logs`), snapshots (one
//! file or a multi-file set) and checkpoints, each written so that nothing already there is
//! lost.

use super::error::{RunError, agree, io_err};
use super::folder::{Checkpoint, checkpoint_dir, snapshot_file};
use super::logs::BlockFigures;
use super::setup::component_softening;
use super::state::Simulation;
use crate::config::{StepScheme, flatten};
use crate::distributed::comm::{allgatherv, allreduce_max, allreduce_sum};
use crate::format::short;
use crate::integrate::diagnostics::{PhaseTimes, Row};
use crate::io::checkpoint;
use crate::io::snapshot::{MultiFile, SnapshotInfo, part_type_counts, write_snapshot};
use crate::particles::Particles;
use std::path::PathBuf;
use std::time::Instant;

impl<'a> Simulation<'a> {
    /// A diagnostics row (collective): global sums, the slowest rank's phase times, and
    /// per solver figure the largest over ranks (every rank's in `ranks.csv`).
    pub(super) fn write_diagnostics(&mut self) -> Result<(), RunError> {
        let start = Instant::now();
        let conserved = self.conserved()?;
        self.wall.diagnostics += start.elapsed().as_secs_f64();
        let interactions = allreduce_sum(self.comm, &[self.interactions])?[0];
        let w = &self.wall;
        let wall = allreduce_max(self.comm, &[w.force, w.integrate, w.diagnostics, w.io])?;
        let values: Vec<f64> = self.solver_stats.iter().map(|s| s.value).collect();
        let per_rank = allgatherv(self.comm, &values)?;
        if let Some(logs) = &mut self.logs {
            let mut largest = per_rank[0].clone();
            for other in &per_rank[1..] {
                for (a, b) in largest.iter_mut().zip(other) {
                    *a = a.max(*b);
                }
            }
            let time = self.timeline.time(self.state.ti);
            let integ = &self.spec.config.integrator;
            if integ.scheme == StepScheme::Block {
                let total = self.block.histogram.iter().sum::<u64>();
                largest.extend(self.block.values(total, time, integ.max_rungs as u32));
            }
            if self.spec.external.is_some() {
                largest.push(conserved.external);
            }
            let row = Row {
                step: self.state.step,
                time,
                dt: self.state.last_dt,
                conserved,
                energy0: self.state.energy0,
                interactions,
                wall: PhaseTimes {
                    force: wall[0],
                    integrate: wall[1],
                    diagnostics: wall[2],
                    io: wall[3],
                },
                solver: &largest,
            };
            let path = logs.diagnostics.path().to_path_buf();
            logs.diagnostics
                .append(&row)
                .map_err(io_err(&path, "writing diagnostics"))?;
            if let Some(ranks) = &mut logs.ranks {
                let path = self.spec.run_dir.join("ranks.csv");
                ranks
                    .append(self.state.step, time, &per_rank)
                    .map_err(io_err(&path, "writing the per-rank log"))?;
            }
        }
        self.wall = PhaseTimes::default();
        self.interactions = 0;
        self.block = BlockFigures {
            histogram: std::mem::take(&mut self.block.histogram),
            since: self.timeline.time(self.state.ti),
            ..BlockFigures::default()
        };
        for stat in self.solver_stats.iter_mut().filter(|s| s.summed) {
            stat.value = 0.0;
        }
        Ok(())
    }

    /// Snapshot (collective): one file, or one file per rank in a GADGET multi-file set.
    pub(super) fn write_snapshot(&mut self) -> Result<(), RunError> {
        let start = Instant::now();
        self.sync_host()?;
        // A snapshot never holds a state the solvers would refuse: the run stops first.
        let local = crate::gravity::check_finite(&self.particles)
            .map_err(|e| e.to_string())
            .and_then(|()| finite_velocities(&self.particles));
        agree(self.comm, local).map_err(|reason| {
            RunError::State(format!(
                "{}: no snapshot written at step {}: {reason}",
                self.spec.config.name, self.state.step
            ))
        })?;
        let c = &self.spec.config;
        let (rank, ranks) = (self.comm.rank(), self.comm.size());
        let index = self.state.snapshots_written;
        let path = snapshot_file(&self.spec.run_dir, index, rank, ranks);
        let multi_file = if ranks > 1 {
            let total = allreduce_sum(self.comm, &part_type_counts(&self.particles))?;
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)
                    .map_err(io_err(dir, "creating the snapshot folder"))?;
            }
            let mut t = [0u64; 6];
            t.copy_from_slice(&total);
            Some(MultiFile {
                files: ranks as u32,
                total: t,
            })
        } else {
            None
        };
        let info = SnapshotInfo {
            time: self.timeline.time(self.state.ti),
            units: c.units,
            precision: c.output.snapshot_precision,
            potential: c.output.snapshot_potential,
            acceleration: c.output.snapshot_acceleration,
            parameters: flatten(c),
            settings_text: Some(&self.spec.source.text),
            multi_file,
            softening: Some(component_softening(self.spec).unwrap_or([c.gravity.softening; 4])),
        };
        write_snapshot(&path, &self.particles, &info)?;
        self.state.snapshots_written += 1;
        self.wall.io += start.elapsed().as_secs_f64();
        Ok(())
    }

    /// Checkpoint (collective): one file, or a rank set committed by rank 0 only after every
    /// rank has written its file.
    pub(super) fn write_checkpoint(&mut self) -> Result<PathBuf, RunError> {
        let start = Instant::now();
        self.sync_host()?;
        let (rank, ranks) = (self.comm.rank(), self.comm.size());
        let ckpt = Checkpoint {
            version: env!("CARGO_PKG_VERSION").to_string(),
            config_text: self.spec.source.text.clone(),
            state: self.state.clone(),
            particles: self.particles.clone(),
            caps: self.solver.caps(),
            decomposition_work: if ranks > 1 {
                self.solver.decomposition_work()
            } else {
                Vec::new()
            },
        };
        let keep = self.spec.config.output.keep_checkpoints.max(1) as usize;
        let dir = checkpoint_dir(&self.spec.run_dir);
        let step = self.state.step;
        let path = if ranks == 1 {
            checkpoint::write(&dir, step, &ckpt, keep)?
        } else {
            let time = self.timeline.time(self.state.ti);
            let set_id = checkpoint::set_identity(&self.spec.source.text, step, time, ranks);
            let identity = checkpoint::RankIdentity {
                set_id,
                step,
                rank: rank as u32,
                ranks: ranks as u32,
            };
            let written = checkpoint::write_rank(&dir, identity, &ckpt);
            // Each rank's digest and count (40 bytes; empty where its write failed) reach
            // rank 0 for the manifest.
            let mut mine = Vec::new();
            if let Ok(digest) = &written {
                mine.extend_from_slice(digest);
                mine.extend_from_slice(&(self.particles.len() as u64).to_le_bytes());
            }
            let all = allgatherv(self.comm, &mine)?;
            written?;
            if all.iter().any(|b| b.len() != 40) {
                return Err(RunError::State(format!(
                    "the checkpoint of step {step} failed on another rank; it was not committed"
                )));
            }
            if rank == 0 {
                let files = all
                    .iter()
                    .map(|b| {
                        let mut digest = [0u8; 32];
                        digest.copy_from_slice(&b[..32]);
                        let mut count = [0u8; 8];
                        count.copy_from_slice(&b[32..]);
                        (digest, u64::from_le_bytes(count))
                    })
                    .collect();
                let summary = checkpoint::SetSummary {
                    set_id,
                    step,
                    time,
                    files,
                };
                checkpoint::commit_set(&dir, &summary, keep)?;
            }
            // Committed before any rank goes on (and might be stopped).
            self.comm.barrier()?;
            dir.join(checkpoint::manifest_name(step))
        };
        self.last_checkpoint = Instant::now();
        self.wall.io += start.elapsed().as_secs_f64();
        Ok(path)
    }
}

/// The first particle whose velocity is NaN or infinite, as a message.
fn finite_velocities(p: &Particles) -> Result<(), String> {
    match p.vel.iter().position(|v| !v.iter().all(|x| x.is_finite())) {
        Some(i) => Err(format!(
            "particle {} has a non-finite velocity ({}, {}, {}); the simulation state is corrupt",
            p.id[i],
            short(p.vel[i][0]),
            short(p.vel[i][1]),
            short(p.vel[i][2])
        )),
        None => Ok(()),
    }
}
