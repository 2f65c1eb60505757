//! Direct-summation throughput (pair interactions per second) at N = 2e4, for both kernels.
//!
//! `cargo bench --bench direct`; figures go to docs/benchmarks.md.

use criterion::{Criterion, criterion_group, criterion_main};
use leapfmm::gravity::direct::DirectSummation;
use leapfmm::gravity::{GravitySolver, Softening, SofteningKernel};
use leapfmm::ics::{self, ModelFile};
use std::hint::black_box;
use std::path::Path;
use std::time::Duration;

const N: usize = 20_000;

fn bench(c: &mut Criterion) {
    let model = ModelFile::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("ics/plummer.toml"))
        .expect("the shipped Plummer model loads");
    let (mut particles, _) = ics::generate(&model, N, 1);
    let mut group = c.benchmark_group("direct");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(8));
    for kernel in [SofteningKernel::Plummer, SofteningKernel::Spline] {
        let mut solver = DirectSummation::new(
            1.0,
            Softening {
                kernel,
                epsilon: 0.01,
            },
        );
        let mut pairs_per_second = 0.0;
        group.bench_function(
            format!("N={N} {} ({})", kernel.name(), solver.instruction_set()),
            |b| {
                b.iter(|| {
                    let r = solver
                        .compute(black_box(&mut particles))
                        .expect("finite particles");
                    pairs_per_second = r.pair_interactions as f64 / r.seconds;
                })
            },
        );
        eprintln!(
            "direct {} N={N}: {:.3e} pair interactions/s (last iteration, {} threads)",
            kernel.name(),
            pairs_per_second,
            rayon::current_num_threads()
        );
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
