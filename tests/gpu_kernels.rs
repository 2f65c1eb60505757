//! The CUDA kernels (kernels/*.cu) run under the CPU emulation harness
//! (kernels/emulation/cuda_shim.h: each block's threads as real threads, `__syncthreads` as
//! a barrier) and must match the Rust CPU backend: P2P within f32 tolerance, including a
//! partial tile, an empty leaf and leaves larger than a block; kick and drift exactly.
//! Needs a C++20 compiler (`c++`; scripts/install-deps.sh installs g++).

use leapfmm::gravity::softening::{Softening, SofteningKernel};
use rand::{RngExt, SeedableRng};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Builds the harness once per test binary.
fn harness() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let root = Path::new(env!("CARGO_MANIFEST_DIR"));
            let exe = std::env::temp_dir().join(format!("leapfmm-harness-{}", std::process::id()));
            let out = Command::new("c++")
                .args(["-std=c++20", "-O2", "-pthread", "-Wall", "-Werror", "-I"])
                .arg(root.join("kernels"))
                .arg(root.join("kernels/emulation/harness.cpp"))
                .arg("-o")
                .arg(&exe)
                .output()
                .expect("a C++ compiler `c++` (install g++: scripts/install-deps.sh)");
            assert!(
                out.status.success(),
                "the kernels do not build under the emulation:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            exe
        })
        .clone()
}

fn run_harness(mode: &str, input: &[u8]) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let (i, o) = (dir.path().join("in.bin"), dir.path().join("out.bin"));
    std::fs::write(&i, input).unwrap();
    let out = Command::new(harness())
        .arg(mode)
        .arg(&i)
        .arg(&o)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read(&o).unwrap()
}

fn f64s(bytes: &[u8]) -> Vec<f64> {
    bytes
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Particles in leaves of the given sizes (each a small cluster), the leaves' centres.
struct Leaves {
    pos: Vec<[f64; 3]>,
    mass: Vec<f64>,
    begin: Vec<u32>,
    end: Vec<u32>,
    centre: Vec<[f64; 3]>,
}

fn leaves(sizes: &[usize], seed: u64) -> Leaves {
    let mut rng = rand_pcg::Pcg64::seed_from_u64(seed);
    let mut l = Leaves {
        pos: Vec::new(),
        mass: Vec::new(),
        begin: Vec::new(),
        end: Vec::new(),
        centre: Vec::new(),
    };
    for (k, &n) in sizes.iter().enumerate() {
        let c = [k as f64 * 0.7, (k % 3) as f64 * 0.4, 0.1 * k as f64 + 10.0];
        l.begin.push(l.pos.len() as u32);
        for _ in 0..n {
            l.pos
                .push(std::array::from_fn(|d| c[d] + rng.random_range(-0.3..0.3)));
            l.mass.push(rng.random_range(0.5..1.5) / 1000.0);
        }
        l.end.push(l.pos.len() as u32);
        l.centre.push(c);
    }
    l
}

/// The P2P launch's input for every leaf as a target with every leaf as a source.
fn p2p_input(l: &Leaves, softening: Softening, block: u32, g: f64) -> Vec<u8> {
    let nl = l.begin.len() as u32;
    let list: Vec<u32> = (0..nl).flat_map(|_| 0..nl).collect();
    let offsets: Vec<u32> = (0..=nl).map(|t| t * nl).collect();
    let mut b = Vec::new();
    let u32s = |b: &mut Vec<u8>, v: &[u32]| v.iter().for_each(|x| b.extend(x.to_le_bytes()));
    u32s(&mut b, &[l.pos.len() as u32, nl, nl, list.len() as u32]);
    let kernel = match softening.kernel {
        SofteningKernel::Plummer => 0i32,
        SofteningKernel::Spline => 1,
    };
    b.extend(kernel.to_le_bytes());
    b.extend(block.to_le_bytes());
    let eps = softening.epsilon;
    b.extend(((eps * eps) as f32).to_le_bytes());
    b.extend(((2.8 * eps) as f32).to_le_bytes());
    b.extend(g.to_le_bytes());
    l.pos
        .iter()
        .flatten()
        .for_each(|x| b.extend(x.to_le_bytes()));
    l.mass.iter().for_each(|x| b.extend(x.to_le_bytes()));
    u32s(&mut b, &l.begin);
    u32s(&mut b, &l.end);
    l.centre
        .iter()
        .flatten()
        .for_each(|x| b.extend(x.to_le_bytes()));
    u32s(&mut b, &(0..nl).collect::<Vec<_>>());
    u32s(&mut b, &offsets);
    u32s(&mut b, &list);
    b
}

#[test]
fn p2p_kernel_matches_the_cpu_pair_sums() {
    // Block 64: a leaf of 0 (empty), 1, 37 (partial tile), 64 (exactly one tile), 65, 200
    // (larger than a block, targets in several rounds) and 128 particles.
    let sizes = [0, 1, 37, 64, 65, 200, 128];
    let l = leaves(&sizes, 11);
    let g = 4.3;
    for kernel in [SofteningKernel::Spline, SofteningKernel::Plummer] {
        let softening = Softening {
            kernel,
            epsilon: 0.05,
        };
        let out = f64s(&run_harness("p2p", &p2p_input(&l, softening, 64, g)));
        let n = l.pos.len();
        let (acc, pot) = out.split_at(3 * n);
        let mut worst: f64 = 0.0;
        for i in 0..n {
            // The CPU backend's pair function in f64 over every other particle.
            let (mut a, mut p) = ([0.0f64; 3], 0.0);
            for j in 0..n {
                let d: [f64; 3] = std::array::from_fn(|k| l.pos[j][k] - l.pos[i][k]);
                let r2 = d[0] * d[0] + d[1] * d[1] + d[2] * d[2];
                if r2 > 0.0 {
                    let (f, q) = softening.factors(r2);
                    for k in 0..3 {
                        a[k] += g * l.mass[j] * f * d[k];
                    }
                    p -= g * l.mass[j] * q;
                }
            }
            let norm = (a[0] * a[0] + a[1] * a[1] + a[2] * a[2]).sqrt();
            let err = (0..3)
                .map(|k| (acc[3 * i + k] - a[k]).powi(2))
                .sum::<f64>()
                .sqrt()
                / norm;
            let perr = ((pot[i] - p) / p).abs();
            worst = worst.max(err).max(perr);
        }
        eprintln!("{kernel:?}: worst relative difference {worst:.2e} over {n} particles");
        assert!(worst < 2e-5, "{kernel:?}: P2P kernel off by {worst:.2e}");
    }
}

#[test]
fn kick_and_drift_kernels_match_the_integrator_exactly() {
    let n = 1000usize;
    let mut rng = rand_pcg::Pcg64::seed_from_u64(5);
    let mut v3 = || -> Vec<f64> { (0..3 * n).map(|_| rng.random_range(-1.0..1.0)).collect() };
    let (pos, vel, acc) = (v3(), v3(), v3());
    let dt = 0.0078125f64;
    let mut b = Vec::new();
    b.extend((n as u32).to_le_bytes());
    b.extend(96u32.to_le_bytes());
    b.extend(dt.to_le_bytes());
    for v in [&pos, &vel, &acc] {
        v.iter().for_each(|x| b.extend(x.to_le_bytes()));
    }
    let out = f64s(&run_harness("integrate", &b));
    let (v_out, x_out) = out.split_at(3 * n);
    for k in 0..3 * n {
        let v = vel[k] + acc[k] * dt;
        assert_eq!(v_out[k].to_bits(), v.to_bits());
        assert_eq!(x_out[k].to_bits(), (pos[k] + v * dt).to_bits());
    }
}
