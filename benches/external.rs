//! What a rigid external potential costs: the time to add each kind's acceleration to
//! 1e6 particles (the disk-in-halo benchmark's positions), and one FMM evaluation of the
//! same particles in the same run, for the fraction of a step (issue 40: < 5 %).
//!
//! `cargo bench --bench external`; figures go to docs/benchmarks.md ("External potentials").

use leapfmm::fmm::FmmSolver;
use leapfmm::gravity::external::{ExternalEntry, ExternalPotential};
use leapfmm::source::SourceText;
use leapfmm::workloads::Workload;
use std::time::Instant;

const N: usize = 1_000_000;
/// Repetitions; the best is reported.
const REPEAT: usize = 5;

fn potential(text: &str, g: f64) -> ExternalPotential {
    #[derive(serde::Deserialize)]
    struct Entries {
        external: Vec<ExternalEntry>,
    }
    let source = SourceText {
        path: "bench".into(),
        text: text.into(),
    };
    let entries: Entries = source.parse().expect("a valid entry");
    ExternalPotential::new(&source, &entries.external, g, 1.0).expect("a valid potential")
}

fn best(mut f: impl FnMut()) -> f64 {
    (0..REPEAT)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    let w = Workload::DiskInHalo;
    let p = w.particles(N, 1);
    let g = w.g();
    let mut solver = FmmSolver::new(w.fmm_settings(N), None);
    let (mut acc, mut pot) = (vec![[0.0; 3]; N], vec![0.0; N]);
    let mut evaluate = || {
        solver
            .evaluate(&p.pos, &p.mass, &p.id, &mut acc, &mut pot)
            .expect("an FMM evaluation");
    };
    evaluate();
    let fmm = best(&mut evaluate);
    println!("threads: {}", rayon::current_num_threads());
    println!(
        "FMM evaluation at N = {N}: {fmm:.3} s (order {})",
        w.fmm_settings(N).order
    );
    println!(
        "| potential | s per evaluation at 1e6 | particles/s | fraction of the FMM evaluation |"
    );
    println!("|---|---|---|---|");
    let kinds = [
        ("NFW", "profile = \"nfw\"\nmass = 20.0\nscale_radius = 20.0"),
        (
            "Hernquist",
            "profile = \"hernquist\"\nmass = 100.0\nscale_radius = 30.0",
        ),
        (
            "Plummer",
            "profile = \"plummer\"\nmass = 1.0\nscale_radius = 0.5",
        ),
        (
            "Miyamoto–Nagai",
            "profile = \"miyamoto_nagai\"\nmass = 5.0\nscale_radius = 3.0\nscale_height = 0.3",
        ),
        (
            "logarithmic",
            "profile = \"logarithmic\"\ncircular_velocity = 200.0\ncore_radius = 1.0\nflattening = 0.9",
        ),
    ];
    for (name, text) in kinds {
        let ext = potential(&format!("[[external]]\n{text}"), g);
        let mut acc = vec![[0.0; 3]; N];
        let t = best(|| ext.add_accelerations(&p.pos, &mut acc, 0.0, None));
        println!(
            "| {name} | {t:.4} | {:.3e} | {:.2} % |",
            N as f64 / t,
            100.0 * t / fmm
        );
    }
    let all: String = kinds
        .iter()
        .map(|(_, t)| format!("[[external]]\n{t}\n"))
        .collect();
    let ext = potential(&all, g);
    let mut acc = vec![[0.0; 3]; N];
    let t = best(|| ext.add_accelerations(&p.pos, &mut acc, 0.0, None));
    println!(
        "| all five summed | {t:.4} | {:.3e} | {:.2} % |",
        N as f64 / t,
        100.0 * t / fmm
    );
    let t = best(|| {
        std::hint::black_box(ext.energy(&p.pos, &p.mass, 0.0));
    });
    println!("energy Σ m Φ_ext of all five (once per diagnostics row): {t:.4} s");
}
