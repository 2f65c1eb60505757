//! Snapshot write and read time at N = 1e6 (double and single precision, with potential
//! and acceleration, as a run writes them): the cost of the per-chunk Fletcher32 checksums
//! is this bench run before and after the change that added them.
//!
//! `cargo bench --bench snapshot_io`; figures go to docs/benchmarks.md.

use leapfmm::config::Precision;
use leapfmm::ics::{self, ModelFile};
use leapfmm::io::snapshot::{SnapshotInfo, read_snapshot, write_snapshot};
use leapfmm::units::UnitSystem;
use std::path::Path;
use std::time::Instant;

const N: usize = 1_000_000;
const REPEATS: usize = 5;

/// Fastest of `REPEATS` runs of `f`, in seconds.
fn best(mut f: impl FnMut()) -> f64 {
    (0..REPEATS)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    let model = ModelFile::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("ics/plummer.toml"))
        .expect("the shipped Plummer model loads");
    let (particles, _) = ics::generate(&model, N, 1);
    let dir = tempfile::tempdir().expect("a temporary folder");
    let path = dir.path().join("snap.hdf5");
    for precision in [Precision::Double, Precision::Single] {
        let mut info = SnapshotInfo::new(0.0, UnitSystem::Nbody, precision);
        info.potential = true;
        info.acceleration = true;
        let write = best(|| write_snapshot(&path, &particles, &info).expect("written"));
        let bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        let read = best(|| {
            read_snapshot(&path).expect("read back");
        });
        println!(
            "snapshot_io N={N} {precision:?}: write {write:.3} s ({:.0} MB/s), read {read:.3} s ({:.0} MB/s), {:.1} MB",
            bytes as f64 / 1e6 / write,
            bytes as f64 / 1e6 / read,
            bytes as f64 / 1e6
        );
    }
}
