//! Memory a run needs, estimated before it allocates anything, against what the machine
//! (and, with the GPU backend, each device) has: a run that cannot fit is refused at once
//! with both figures instead of growing until the kernel kills it.
//!
//! The host model (fitted to peak RSS measured with `/usr/bin/time -f %M` on galaxy and
//! Plummer runs from 3e4 to 1e6 particles, orders 7 and 12, leaf sizes 1 to 128, 1 and 2
//! ranks; docs/formats.md gives the table) is
//!
//! ```text
//! bytes = 32 MiB + 8 MiB × ranks + 700 B × n + (FMM only) n / leaf_size × cell(p)
//! cell(p) = 3 000 B + 4 500 B × (p + 1)(p + 2) / 72
//! ```
//!
//! 700 B per particle covers the particle arrays (97 B), the tree's sorted copies, the
//! snapshot and checkpoint buffers and the distributed exchange; the cell term covers each
//! cell's multipole and local expansions and its interaction lists. It bounds every measured
//! peak from above, by 1.3–1.9× at 1e5–1e6 particles (more for small runs, where the fixed
//! part dominates).
//!
//! Owns the estimates and the refusal, and the process's peak-memory readings for
//! benchmarks. Must not allocate.

use crate::config::{GravityConfig, SolverKind};
use crate::gpu::backend::Chosen;

const MIB: u64 = 1 << 20;
const GIB: f64 = (1u64 << 30) as f64;

/// Fixed part of a process (binary, thread pools, HDF5).
const BASE_BYTES: u64 = 32 * MIB;
/// Fixed part of each rank (its logs, buffers and thread).
const RANK_BYTES: u64 = 8 * MIB;
/// Host bytes per particle, every solver.
const PARTICLE_BYTES: u64 = 700;
/// Device bytes per particle with the GPU backend (docs/benchmarks.md: 474 B measured
/// by `gpu::memory`, up to ~500 B once pass buffers have grown), with a margin.
const DEVICE_PARTICLE_BYTES: u64 = 600;
/// Fixed device bytes per rank: the device walk's rings (512 MiB) and the kernels.
const DEVICE_RANK_BYTES: u64 = 1 << 30;

/// Host bytes of one FMM cell of expansion order `order`.
fn cell_bytes(order: usize) -> u64 {
    let p = order as u64;
    3000 + 4500 * (p + 1) * (p + 2) / 72
}

/// Estimated peak host memory of a run of `n` particles over `ranks` ranks, all in one
/// process.
pub fn host_bytes(g: &GravityConfig, n: u64, ranks: usize) -> u64 {
    let cells = match g.solver {
        SolverKind::Fmm => n.div_ceil(g.leaf_size.max(1) as u64) * cell_bytes(g.order()),
        SolverKind::Direct => 0,
    };
    BASE_BYTES
        .saturating_add(RANK_BYTES * ranks as u64)
        .saturating_add(n.saturating_mul(PARTICLE_BYTES))
        .saturating_add(cells)
}

/// Estimated device memory one GPU needs when `ranks` ranks share `devices` GPUs.
pub fn device_bytes(n: u64, ranks: usize, devices: usize) -> u64 {
    let ranks = ranks.max(1) as u64;
    let per_device = ranks.div_ceil(devices.max(1) as u64);
    let per_rank = (n / ranks)
        .saturating_mul(DEVICE_PARTICLE_BYTES)
        .saturating_add(DEVICE_RANK_BYTES);
    per_rank.saturating_mul(per_device)
}

fn gb(bytes: u64) -> String {
    format!("{:.1} GB", bytes as f64 / GIB)
}

/// Refuses a run whose estimate exceeds `available` host bytes (shared by the
/// `local_ranks` ranks on this machine) or, with the GPU backend, a device's memory.
/// `ranks` is the run's rank count; the message gives the estimate, the figure per rank
/// and what the machine has.
pub fn check(
    gravity: &GravityConfig,
    n: u64,
    ranks: usize,
    local_ranks: usize,
    backend: &Chosen,
    available: Option<u64>,
) -> Result<(), String> {
    let total = host_bytes(gravity, n, ranks);
    let here = (total / ranks.max(1) as u64).saturating_mul(local_ranks.max(1) as u64);
    if let Some(available) = available
        && here > available
    {
        let per_rank = if ranks > 1 {
            format!(
                " ({} per rank over {ranks} ranks, {local_ranks} of them on this machine)",
                gb(total / ranks as u64)
            )
        } else {
            String::new()
        };
        return Err(format!(
            "{n} particles need about {}{per_rank} of memory, but this machine has {} available (estimate: docs/formats.md, \"Memory\"); lower ics.n or spread the run over more machines",
            gb(total),
            gb(available)
        ));
    }
    if let Chosen::Cuda(device) = backend {
        let need = device_bytes(n, ranks, device.devices);
        if need > device.memory_bytes as u64 {
            return Err(format!(
                "{n} particles need about {} on each GPU ({ranks} ranks over {} GPUs), but {} has {}; use more GPUs (--ranks) or --backend cpu",
                gb(need),
                device.devices,
                device.name,
                gb(device.memory_bytes as u64)
            ));
        }
    }
    Ok(())
}

/// Peak resident memory of this process in bytes (Linux `VmHWM`), if known.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Resets the peak-memory counter (Linux ≥ 4.0), so the next reading covers what follows.
pub fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::backend::DeviceInfo;

    fn config(solver: &str) -> GravityConfig {
        toml::from_str(&format!("solver = \"{solver}\"\nsoftening = 0.05\n")).unwrap()
    }

    #[test]
    fn a_run_too_big_for_the_machine_is_refused_with_both_figures() {
        let c = config("fmm");
        let cpu = Chosen::Cpu("requested".into());
        let err = check(&c, 500_000_000, 1, 1, &cpu, Some(24 << 30)).unwrap_err();
        assert!(
            err.contains("need about 3") && err.contains("24.0 GB available"),
            "{err}"
        );
        let err = check(&c, 500_000_000, 4, 4, &cpu, Some(24 << 30)).unwrap_err();
        assert!(err.contains("per rank over 4 ranks"), "{err}");
        assert!(check(&c, 1_000_000_000_000, 1, 1, &cpu, Some(24 << 30)).is_err());
        check(&c, 1_000_000, 1, 1, &cpu, Some(24 << 30)).unwrap();
        check(&c, 500_000_000, 1, 1, &cpu, None).unwrap();
        // MPI: 64 ranks over machines of 8, each machine holding 1/8 of the run.
        check(&c, 100_000_000, 64, 8, &cpu, Some(24 << 30)).unwrap();
    }

    #[test]
    fn a_gpu_run_is_checked_per_device() {
        let c = config("fmm");
        let h100 = Chosen::Cuda(DeviceInfo {
            ordinal: 0,
            name: "NVIDIA H100".into(),
            arch: "sm_90".into(),
            memory_bytes: 80 << 30,
            devices: 1,
        });
        check(&c, 100_000_000, 1, 1, &h100, None).unwrap();
        let err = check(&c, 200_000_000, 1, 1, &h100, None).unwrap_err();
        assert!(
            err.contains("on each GPU") && err.contains("NVIDIA H100"),
            "{err}"
        );
        assert_eq!(
            device_bytes(200_000_000, 4, 2),
            2 * (50_000_000 * 600 + (1 << 30))
        );
    }

    #[test]
    fn more_cells_and_higher_orders_need_more() {
        let mut c = config("fmm");
        let base = host_bytes(&c, 1_000_000, 1);
        c.leaf_size = 8;
        assert!(host_bytes(&c, 1_000_000, 1) > base);
        c.order = Some(12);
        assert!(cell_bytes(12) > cell_bytes(7));
        assert!(host_bytes(&config("direct"), 1_000_000, 1) < base);
    }
}
