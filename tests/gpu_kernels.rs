//! The CUDA kernels (kernels/*.cu) run under the CPU emulation harness
//! (kernels/emulation/cuda_shim.h: each block's threads as fibers, `__syncthreads` as a
//! barrier among them) and must match the Rust CPU backend: P2P within f32 tolerance, including a
//! partial tile, an empty leaf and leaves larger than a block; kick and drift exactly.
//! Needs a C++20 compiler (`c++`; scripts/install-deps.sh installs g++).

mod common;

use common::emulation::harness;
use leapfmm::fmm::traversal::{pack, unpack};
use leapfmm::gravity::softening::{Softening, SofteningKernel};
use rand::{RngExt, SeedableRng};
use std::path::Path;
use std::process::Command;

fn run_harness(mode: &str, input: &[u8]) -> Vec<u8> {
    run(&harness(), mode, input)
}

/// Runs harness `exe` in `mode` on `input`; its output. It runs three times, its blocks and
/// threads in order, reversed and shuffled (`LEAPFMM_EMULATED_SCHEDULE`), and must give the
/// same bytes each time: a GPU runs them in no fixed order, so a kernel whose results
/// depend on it (a missing barrier, integer atomics ordering a list) is a fault here.
fn run(exe: &Path, mode: &str, input: &[u8]) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let i = dir.path().join("in.bin");
    std::fs::write(&i, input).unwrap();
    let outputs: Vec<Vec<u8>> = ["in-order", "reversed", "shuffled"]
        .iter()
        .map(|schedule| {
            let o = dir.path().join(format!("out-{schedule}.bin"));
            let out = Command::new(exe)
                .arg(mode)
                .arg(&i)
                .arg(&o)
                .env("LEAPFMM_EMULATED_SCHEDULE", schedule)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{schedule}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            std::fs::read(&o).unwrap()
        })
        .collect();
    for (schedule, other) in ["reversed", "shuffled"].iter().zip(&outputs[1..]) {
        assert!(
            *other == outputs[0],
            "harness {mode}: its output with the blocks and threads {schedule} differs from in order"
        );
    }
    outputs.into_iter().next().unwrap()
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

/// The source leaves of target leaf t in `p2p_input`: itself and three in four of the
/// leaves before it, so that a list's leaves are not one run of particles.
fn p2p_sources_of(t: u32) -> impl Iterator<Item = u32> {
    (0..=t).filter(move |&k| k == t || !(7 * k + t).is_multiple_of(4))
}

/// The P2P launch's input for every leaf as a target, leaf t with the sources
/// `p2p_sources_of(t)`; the targets' pieces of the source list lie in reverse order, as a
/// walk's threads may leave them.
fn p2p_input(l: &Leaves, softening: Softening, block: u32, g: f64) -> Vec<u8> {
    let nl = l.begin.len() as u32;
    let (mut list, mut spans) = (Vec::new(), vec![0u64; nl as usize]);
    for t in (0..nl).rev() {
        let start = list.len() as u32;
        list.extend(p2p_sources_of(t));
        spans[t as usize] = pack(start, list.len() as u32 - start);
    }
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
    b.extend(leapfmm::gravity::pairwise::self_potential(1.0, eps).to_le_bytes());
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
    spans.iter().for_each(|x| b.extend(x.to_le_bytes()));
    u32s(&mut b, &list);
    b
}

#[test]
fn p2p_kernel_matches_the_cpu_pair_sums() {
    // Leaves of 0 (empty), 1, 37, 64, 65, 200 and 128 particles, then 60 small ones (0 to
    // 12 particles, empty ones among them) and 17, 40, 100 and 3: every target shape of
    // `p2p_shape` on blocks of 32 and 64 (one to 64 groups; 200 and 100 in several rounds),
    // tiles packed from many leaves, and lists of up to 71 leaves, longer than a block
    // scans at once (`p2p_sources_of`).
    let sizes: Vec<usize> = [0, 1, 37, 64, 65, 200, 128]
        .into_iter()
        .chain((0..60).map(|k| (k * 5) % 13))
        .chain([17, 40, 100, 3])
        .collect();
    let mut l = leaves(&sizes, 11);
    // Two particles at the same place in one leaf, and two in different leaves: each feels
    // the other's central potential and no force, as on the CPU, and not itself.
    let at = |leaf: usize, k: usize| l.begin[leaf] as usize + k;
    let (a, b, c, d) = (at(2, 0), at(2, 1), at(3, 2), at(5, 7));
    (l.pos[b], l.pos[d]) = (l.pos[a], l.pos[c]);
    let g = 4.3;
    // The two kernel families, and Newtonian forces (zero softening: the particle itself
    // must not turn into an infinity).
    for (kernel, epsilon, block) in [
        (SofteningKernel::Spline, 0.05, 64),
        (
            SofteningKernel::Spline,
            0.05,
            leapfmm::gpu::memory::P2P_THREADS,
        ),
        (SofteningKernel::Plummer, 0.05, 64),
        (
            SofteningKernel::Plummer,
            0.05,
            leapfmm::gpu::memory::P2P_THREADS,
        ),
        (SofteningKernel::Plummer, 0.0, 64),
    ] {
        let softening = Softening { kernel, epsilon };
        let out = f64s(&run_harness("p2p", &p2p_input(&l, softening, block, g)));
        let n = l.pos.len();
        let (acc, pot) = out.split_at(3 * n);
        let mut worst: f64 = 0.0;
        // Pairs inside the spline's inner half, its outer half and beyond its support: the
        // kernel branches on the last, so each must be exercised.
        let h = 2.8 * softening.epsilon;
        let mut regions = [0usize; 3];
        for i in 0..n {
            // The CPU backend's pair function in f64 over every other particle of the leaves
            // of i's leaf's list.
            let leaf = (0..sizes.len())
                .find(|&t| (l.begin[t] as usize..l.end[t] as usize).contains(&i))
                .unwrap();
            let (mut a, mut p) = ([0.0f64; 3], 0.0);
            let sources = p2p_sources_of(leaf as u32)
                .flat_map(|s| l.begin[s as usize] as usize..l.end[s as usize] as usize);
            // The kernel sums each particle's own pair in f32 and takes it back out in f64:
            // its rounding is measured against the size of that term too.
            let own = g * leapfmm::gravity::pairwise::self_potential(l.mass[i], epsilon);
            for j in sources {
                let d: [f64; 3] = std::array::from_fn(|k| l.pos[j][k] - l.pos[i][k]);
                let r2 = d[0] * d[0] + d[1] * d[1] + d[2] * d[2];
                if r2 == 0.0 && j != i && epsilon > 0.0 {
                    p -= g * leapfmm::gravity::pairwise::self_potential(l.mass[j], epsilon);
                } else if r2 > 0.0 {
                    regions[(r2.sqrt() / (0.5 * h)).min(2.0) as usize] += 1;
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
            let perr = ((pot[i] - p) / (p.abs() + own)).abs();
            worst = worst.max(err).max(perr);
        }
        if epsilon > 0.0 {
            assert!(
                regions.iter().all(|&c| c > 100),
                "pairs per region {regions:?}"
            );
        }
        eprintln!(
            "{kernel:?}, ε = {epsilon}, blocks of {block}: worst relative difference {worst:.2e} over {n} particles (pairs by region {regions:?})"
        );
        assert!(
            worst < 2e-5,
            "{kernel:?}, ε = {epsilon}: P2P kernel off by {worst:.2e}"
        );
    }
}

#[test]
fn kick_drift_and_kick_each_kernels_match_the_integrator_exactly() {
    let n = 1000usize;
    let mut rng = rand_pcg::Pcg64::seed_from_u64(5);
    let mut v3 = || -> Vec<f64> { (0..3 * n).map(|_| rng.random_range(-1.0..1.0)).collect() };
    let (pos, vel, acc) = (v3(), v3(), v3());
    // The block scheme's own steps: everybody's, then those of a sub-step's active
    // particles, listed out of order (as `Rungs::ending_rows` lists them).
    let h: Vec<f64> = (0..n).map(|_| rng.random_range(0.0..0.01)).collect();
    let mut rows: Vec<u32> = (0..n as u32).filter(|i| i % 3 != 0).collect();
    for i in (1..rows.len()).rev() {
        rows.swap(i, rng.random_range(0..=i));
    }
    let steps: Vec<f64> = rows.iter().map(|_| rng.random_range(0.0..0.01)).collect();
    let dt = 0.0078125f64;
    let mut b = Vec::new();
    b.extend((n as u32).to_le_bytes());
    b.extend(96u32.to_le_bytes());
    b.extend(dt.to_le_bytes());
    for v in [&pos, &vel, &acc, &h] {
        f64_bytes(&mut b, v.iter().copied());
    }
    u32_bytes(&mut b, &[rows.len() as u32]);
    u32_bytes(&mut b, &rows);
    f64_bytes(&mut b, steps.iter().copied());
    let out = f64s(&run_harness("integrate", &b));
    let (v_out, rest) = out.split_at(3 * n);
    let (x_out, rest) = rest.split_at(3 * n);
    let (v_all, v_rows) = rest.split_at(3 * n);
    for k in 0..3 * n {
        let v = vel[k] + acc[k] * dt;
        assert_eq!(v_out[k].to_bits(), v.to_bits());
        assert_eq!(x_out[k].to_bits(), (pos[k] + v * dt).to_bits());
    }
    // kick_each against the host's, from the kicked velocities.
    let mut p = leapfmm::particles::Particles {
        vel: v_out.chunks_exact(3).map(|v| [v[0], v[1], v[2]]).collect(),
        acc: acc.chunks_exact(3).map(|a| [a[0], a[1], a[2]]).collect(),
        ..Default::default()
    };
    let bits = |p: &leapfmm::particles::Particles| -> Vec<u64> {
        p.vel.iter().flatten().map(|x| x.to_bits()).collect()
    };
    let device_bits = |v: &[f64]| -> Vec<u64> { v.iter().map(|x| x.to_bits()).collect() };
    leapfmm::integrate::leapfrog::kick_each(&mut p, None, &h);
    assert_eq!(device_bits(v_all), bits(&p));
    leapfmm::integrate::leapfrog::kick_each(&mut p, Some(&rows), &steps);
    assert_eq!(device_bits(v_rows), bits(&p));
    // Every third particle was not listed: the listed kick left it alone.
    assert!(
        (0..n)
            .step_by(3)
            .all(|i| v_rows[3 * i..3 * i + 3] == v_all[3 * i..3 * i + 3])
    );
}

#[test]
fn device_flags_the_cells_holding_active_particles_as_the_host_does() {
    // A clustered cloud (deep and shallow leaves, empty octants), leaves of at most 8 and
    // 64 particles in blocks of 32 and 128 threads, active sets from none to all:
    // the flags of mark_rows and flag_cells_holding are `Tree::cells_holding`'s.
    use leapfmm::fmm::tree::Tree;
    let n = 5000usize;
    let mut rng = rand_pcg::Pcg64::seed_from_u64(23);
    let pos = clump(&mut rng, n, 5, 10.0, 0.1);
    let mass = vec![1.0; n];
    let id: Vec<u64> = (0..n as u64).collect();
    for (leaf_size, block) in [(8usize, 32u32), (64, 128)] {
        let mut tree = Tree::default();
        tree.build(&pos, &mass, &id, None, leaf_size, usize::MAX)
            .unwrap();
        for fraction in [0.0, 0.001, 0.05, 0.5, 1.0] {
            let rows: Vec<u32> = (0..n as u32)
                .filter(|_| rng.random_range(0.0..1.0) < fraction)
                .collect();
            let cells = tree.cells.len();
            let mut b = Vec::new();
            u32_bytes(
                &mut b,
                &[
                    n as u32,
                    cells as u32,
                    tree.leaves.len() as u32,
                    block,
                    rows.len() as u32,
                ],
            );
            let column = |f: fn(&leapfmm::fmm::tree::Cell) -> u32| -> Vec<u32> {
                tree.cells.iter().map(f).collect()
            };
            u32_bytes(&mut b, &column(|c| c.begin));
            u32_bytes(&mut b, &column(|c| c.end));
            u32_bytes(&mut b, &column(|c| c.parent));
            u32_bytes(&mut b, &tree.leaves);
            u32_bytes(&mut b, &tree.order);
            u32_bytes(&mut b, &rows);
            let device: Vec<bool> = run_harness("flags", &b).iter().map(|&f| f != 0).collect();
            let host = tree.cells_holding(&leapfmm::gravity::active_flags(&rows, n));
            assert_eq!(device, host, "leaves of {leaf_size}, {} active", rows.len());
            let flagged = host.iter().filter(|&&f| f).count();
            if rows.is_empty() {
                assert_eq!(flagged, 0);
            } else if fraction < 0.01 {
                assert!(
                    flagged < cells / 2,
                    "{flagged} of {cells} cells for {} particles",
                    rows.len()
                );
            }
        }
    }
}

#[test]
fn tree_order_gather_force_scatter_and_acceleration_maxima_match_the_host() {
    // 1000 particles (a partial last block of 128) in a random tree order, components 0, 1
    // and 3 only (component 2 has no particle: its maximum must be 0).
    use leapfmm::particles::{Component, Particles};
    let (n, block) = (1000usize, 128usize);
    let mut rng = rand_pcg::Pcg64::seed_from_u64(17);
    let mut order_of: Vec<u32> = (0..n as u32).collect();
    for i in (1..n).rev() {
        order_of.swap(i, rng.random_range(0..=i));
    }
    let mut v =
        |count: usize| -> Vec<f64> { (0..count).map(|_| rng.random_range(-2.0..2.0)).collect() };
    let (pos, mass, acc_sorted, pot_sorted) = (v(3 * n), v(n), v(3 * n), v(n));
    let component: Vec<u8> = (0..n).map(|i| [0u8, 1, 3][i % 3]).collect();
    let mut b = Vec::new();
    u32_bytes(&mut b, &[n as u32, block as u32]);
    u32_bytes(&mut b, &order_of);
    for x in [&pos, &mass, &acc_sorted, &pot_sorted] {
        f64_bytes(&mut b, x.iter().copied());
    }
    b.extend(&component);
    let out = f64s(&run_harness("state", &b));
    let (pos_sorted, rest) = out.split_at(3 * n);
    let (mass_sorted, rest) = rest.split_at(n);
    let (acc, rest) = rest.split_at(3 * n);
    let (pot, block_max) = rest.split_at(n);
    for (s, &i) in order_of.iter().enumerate() {
        let i = i as usize;
        for k in 0..3 {
            assert_eq!(pos_sorted[3 * s + k].to_bits(), pos[3 * i + k].to_bits());
            assert_eq!(acc[3 * i + k].to_bits(), acc_sorted[3 * s + k].to_bits());
        }
        assert_eq!(mass_sorted[s].to_bits(), mass[i].to_bits());
        assert_eq!(pot[i].to_bits(), pot_sorted[s].to_bits());
    }
    // The host's criterion input, from the scattered accelerations.
    let mut p = Particles::with_capacity(n);
    for (i, &c) in component.iter().enumerate() {
        p.push(
            [0.0; 3],
            [0.0; 3],
            1.0,
            i as u64,
            Component::ALL[c as usize],
        );
    }
    p.acc = acc.chunks_exact(3).map(|a| [a[0], a[1], a[2]]).collect();
    let host = leapfmm::integrate::leapfrog::max_acceleration_by_component(&p);
    assert_eq!(block_max.len(), 4 * n.div_ceil(block));
    for c in 0..4 {
        let device = block_max
            .chunks_exact(4)
            .map(|m| m[c])
            .fold(0.0, f64::max)
            .sqrt();
        assert_eq!(device.to_bits(), host[c].to_bits(), "component {c}");
    }
    assert_eq!(host[2], 0.0);
}

#[test]
fn conserved_sums_on_the_device_have_the_hosts_bits() {
    // 10 000 particles: two whole chunks of 4096 and a partial one; two threads per block,
    // so the last block has a thread without a chunk.
    use leapfmm::integrate::diagnostics::Conserved;
    use leapfmm::particles::{Component, Particles};
    let n = 10_000usize;
    let mut rng = rand_pcg::Pcg64::seed_from_u64(29);
    let mut p = Particles::with_capacity(n);
    for i in 0..n {
        let mut r = || rng.random_range(-10.0..10.0);
        p.push(
            [r(), r(), r()],
            [r(), r(), r()],
            1e-4 * (1.0 + r().abs()),
            i as u64,
            Component::Halo,
        );
    }
    p.pot = (0..n).map(|_| rng.random_range(-5.0..-1.0)).collect();
    let mut b = Vec::new();
    u32_bytes(&mut b, &[n as u32, 2]);
    f64_bytes(&mut b, p.pos.iter().flatten().copied());
    f64_bytes(&mut b, p.vel.iter().flatten().copied());
    f64_bytes(&mut b, p.mass.iter().copied());
    f64_bytes(&mut b, p.pot.iter().copied());
    let partial = f64s(&run_harness("conserved", &b));
    assert_eq!(partial.len(), 12 * n.div_ceil(leapfmm::sum::CHUNK));
    let mut device = [0.0f64; 12];
    for chunk in partial.chunks_exact(12) {
        for k in 0..12 {
            device[k] += chunk[k];
        }
    }
    let host = Conserved::sums(&p);
    for k in 0..12 {
        assert_eq!(device[k].to_bits(), host[k].to_bits(), "sum {k}");
    }
}

#[test]
fn external_potentials_on_the_device_are_the_hosts() {
    // One term of each form, moving centres, at t = 0.3; 9 000 particles (two whole energy
    // chunks and a partial one), some near the centres (the NFW series).
    use leapfmm::gravity::external::{EXTERNAL_TERM, ExternalEntry, ExternalPotential};
    use leapfmm::source::SourceText;
    let text = "[[external]]\nprofile = \"nfw\"\nmass = 3.0\nscale_radius = 1.3\ncentre_velocity = [0.5, 0.0, 0.0]\n\
                [[external]]\nprofile = \"hernquist\"\nmass = 2.0\nscale_radius = 0.7\ncentre = [1.0, 0.0, 0.0]\n\
                [[external]]\nprofile = \"plummer\"\nmass = 1.0\nscale_radius = 0.3\n\
                [[external]]\nprofile = \"miyamoto_nagai\"\nmass = 5.0\nscale_radius = 3.0\nscale_height = 0.3\n\
                [[external]]\nprofile = \"logarithmic\"\ncircular_velocity = 1.5\ncore_radius = 0.4\nflattening = 0.8";
    #[derive(serde::Deserialize)]
    struct Entries {
        external: Vec<ExternalEntry>,
    }
    let source = SourceText {
        path: "test".into(),
        text: text.into(),
    };
    let entries: Entries = source.parse().unwrap();
    let potential = ExternalPotential::new(&source, &entries.external, 2.0, 1.0).unwrap();
    let t = 0.3;
    let n = 9000usize;
    let mut rng = rand_pcg::Pcg64::seed_from_u64(31);
    let pos: Vec<[f64; 3]> = (0..n)
        .map(|i| {
            let scale = if i % 10 == 0 { 1e-5 } else { 5.0 };
            let c = if i % 10 == 0 {
                [0.15, 0.0, 0.0]
            } else {
                [0.0; 3]
            };
            [0, 1, 2].map(|k| c[k] + scale * rng.random_range(-1.0..1.0))
        })
        .collect();
    let mass: Vec<f64> = (0..n).map(|_| rng.random_range(0.5..1.5)).collect();
    let acc0: Vec<[f64; 3]> = (0..n).map(|_| [1.0, -2.0, 0.5]).collect();
    let terms = potential.device_terms(t);
    let mut b = Vec::new();
    u32_bytes(
        &mut b,
        &[n as u32, 64, (terms.len() / EXTERNAL_TERM) as u32],
    );
    f64_bytes(&mut b, pos.iter().flatten().copied());
    f64_bytes(&mut b, mass.iter().copied());
    f64_bytes(&mut b, acc0.iter().flatten().copied());
    f64_bytes(&mut b, terms.iter().copied());
    let out = f64s(&run_harness("external", &b));
    let (acc, partial) = out.split_at(3 * n);
    assert_eq!(partial.len(), n.div_ceil(leapfmm::sum::CHUNK));
    let mut host = acc0.clone();
    potential.add_accelerations(&pos, &mut host, t, None);
    // The same operations but for log1p and log, which the device's and the host's maths
    // libraries may round differently (by an ulp or so).
    for (i, (d, h)) in acc.chunks_exact(3).zip(&host).enumerate() {
        for k in 0..3 {
            assert!(
                (d[k] - h[k]).abs() <= 1e-14 * h[k].abs().max(1.0),
                "particle {i}, axis {k}: {} on the device, {} on the host",
                d[k],
                h[k]
            );
        }
    }
    let device: f64 = partial.iter().sum();
    let host = potential.energy(&pos, &mass, t);
    assert!(
        (device / host - 1.0).abs() < 1e-14,
        "{device} against {host}"
    );
}

#[test]
fn device_keys_and_radix_sort_give_the_hosts_tree_and_plan() {
    // 9000 particles: two whole sort tiles of 4096 and a partial one. A clump of ten at one
    // point and pairs closer than a key's grid cell give runs of equal keys, and the ids are
    // shuffled, so that the host's ordering of those runs by id is needed.
    use leapfmm::fmm::tree::{SortedParticles, Tree};
    use leapfmm::gpu::sort::{BOUNDS_FIELDS, cube_of_bounds};
    let n = 9000usize;
    let mut rng = rand_pcg::Pcg64::seed_from_u64(41);
    let mut pos: Vec<[f64; 3]> = (0..n)
        .map(|_| {
            let r: f64 = rng.random_range(0.0f64..1.0).powi(3) * 30.0;
            [
                r * rng.random_range(-1.0..1.0),
                r * rng.random_range(-1.0..1.0),
                rng.random_range(-0.5..0.5),
            ]
        })
        .collect();
    for i in 0..10 {
        pos[100 + 37 * i] = [1.25, -0.5, 0.125];
    }
    for i in (2000..2400).step_by(2) {
        pos[i + 1] = [pos[i][0] + 1e-9, pos[i][1], pos[i][2] - 1e-9];
    }
    let mass: Vec<f64> = (0..n).map(|_| rng.random_range(0.5..1.5)).collect();
    let mut id: Vec<u64> = (0..n as u64).map(|i| i * 7 + 3).collect();
    for i in (1..n).rev() {
        id.swap(i, rng.random_range(0..=i));
    }
    // Extremes: 5 blocks of 64 threads, each thread striding over many particles.
    // Extremes: 5 blocks of 64 threads, each thread striding over many particles; then
    // 200 blocks, the last ones without a particle (as on a device with fewer particles
    // than its launch's threads).
    let bounds_of = |blocks: u32, mass: &[f64]| {
        let mut b = Vec::new();
        u32_bytes(&mut b, &[n as u32, blocks, 64]);
        f64_bytes(&mut b, pos.iter().flatten().copied());
        f64_bytes(&mut b, mass.iter().copied());
        let bounds = f64s(&run_harness("bounds", &b));
        assert_eq!(bounds.len(), BOUNDS_FIELDS * blocks as usize);
        cube_of_bounds(&bounds)
    };
    let cube = bounds_of(5, &mass).expect("finite particles");
    assert_eq!(cube, Tree::bounding_cube(&pos));
    assert_eq!(bounds_of(200, &mass), Some(cube));
    // Keys, then the radix sort's eight passes.
    let mut b = Vec::new();
    u32_bytes(&mut b, &[n as u32, 128]);
    f64_bytes(&mut b, cube.lo.iter().copied().chain([cube.scale()]));
    f64_bytes(&mut b, pos.iter().flatten().copied());
    let out = run_harness("sort", &b);
    let u64s = |bytes: &[u8]| -> Vec<u64> {
        bytes
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    };
    let keys = u64s(&out[..8 * n]);
    let sorted_keys = u64s(&out[8 * n..16 * n]);
    let index: Vec<u32> = out[16 * n..]
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    for (i, &k) in keys.iter().enumerate() {
        assert_eq!(k, cube.key(pos[i]), "key of particle {i}");
    }
    let mut expected: Vec<u32> = (0..n as u32).collect();
    expected.sort_by_key(|&i| keys[i as usize]);
    assert_eq!(index, expected, "a stable sort by key");
    assert!(
        sorted_keys
            .iter()
            .zip(&index)
            .all(|(&k, &i)| k == keys[i as usize])
    );
    let runs = sorted_keys.windows(2).filter(|w| w[0] == w[1]).count();
    assert!(runs >= 200, "{runs} equal neighbouring keys");
    // The host's tree from the device's order is the tree it builds itself.
    // What the device hands the host: its sorted keys and order, the positions and masses
    // gathered in that order.
    let device_sorted = || SortedParticles {
        cube: Some(cube),
        keys: sorted_keys.clone(),
        order: index.clone(),
        pos: index.iter().map(|&i| pos[i as usize]).collect(),
        mass: index.iter().map(|&i| mass[i as usize]).collect(),
    };
    let mut sorted = device_sorted();
    let (mut from_device, mut on_host) = (Tree::default(), Tree::default());
    assert!(from_device.adopt_sorted(&mut sorted, &id).unwrap());
    from_device.build_cells(16, 10_000).unwrap();
    on_host.build(&pos, &mass, &id, None, 16, 10_000).unwrap();
    assert_ne!(
        from_device.order, index,
        "the runs of equal keys were reordered"
    );
    assert_eq!(from_device.order, on_host.order);
    assert_eq!(from_device.keys, on_host.keys);
    assert_eq!(from_device.cells, on_host.cells);
    assert_eq!(from_device.pos, on_host.pos);
    assert_eq!(from_device.mass, on_host.mass);
    // The device's split of its sort (kernels/split.cu) makes the same cells, and its sums
    // are the sort's.
    let (summary, columns) = emulated_split(&sorted_keys, &index, 16, 32, 5);
    assert_eq!(columns, from_device.cell_columns());
    assert_eq!(summary.equal_neighbours, runs as u64);
    assert_eq!(summary.out_of_order, 0);
    summary.check(n).unwrap();
    // The device orders those runs by id itself (kernels/split.cu: order_equal_runs): the
    // host's order, with nothing left for it to reorder.
    let (long_runs, ordered) = emulated_runs(&sorted_keys, &id, &index, 64);
    assert_eq!(long_runs, 0);
    assert_eq!(ordered, from_device.order);
    // And the solver's plan from them is the plan it makes from the positions, a retry for
    // more cells included (the sorted particles are taken once).
    use leapfmm::gravity::GravitySolver;
    let (mut a, mut b) = two_solvers_with_small_caps();
    let mut sorted = device_sorted();
    let stats = a.plan_sorted(&mut sorted, &id, None, None).unwrap();
    assert!(stats.retries >= 2, "{} retries", stats.retries);
    b.plan_with(&pos, &mass, &id, Default::default()).unwrap();
    let (pa, pb) = (a.device_plan().unwrap(), b.device_plan().unwrap());
    assert_eq!(pa.order_of, pb.order_of);
    assert_eq!(pa.pos, pb.pos);
    assert_eq!(pa.mass, pb.mass);
    assert_eq!(pa.centre, pb.centre);
    assert_eq!((&pa.begin, &pa.end), (&pb.begin, &pb.end));
    assert_same_lists(&pa, &pb);
    // A sort that is not one (an index twice) is refused with its own error, and the same
    // solver then plans from the positions as before (the GPU solver's fallback).
    let mut broken = device_sorted();
    broken.order[7] = broken.order[8];
    assert!(matches!(
        a.plan_sorted(&mut broken, &id, None, None),
        Err(leapfmm::gravity::GravityError::NotSorted(_))
    ));
    a.plan_with(&pos, &mass, &id, Default::default()).unwrap();
    let (pa, pb) = (a.device_plan().unwrap(), b.device_plan().unwrap());
    assert_eq!(pa.order_of, pb.order_of);
    assert_eq!(pa.m2l_sources, pb.m2l_sources);
    assert_eq!(pa.p2p_sources, pb.p2p_sources);
    // Without positions (they stay on the device), the moments come from the device's
    // kernels: the same plan, the device re-gathering the particles in the host's order
    // because equal keys were reordered.
    let mut keys_only = device_sorted();
    (keys_only.pos, keys_only.mass) = (Vec::new(), Vec::new());
    assert!(matches!(
        a.plan_sorted(&mut keys_only.clone(), &id, None, None),
        Err(leapfmm::gravity::GravityError::NotSorted(_))
    ));
    let mut device = EmulatedDevice {
        pos: &pos,
        mass: &mass,
        sorter_order: index.clone(),
        sorted_keys: Vec::new(),
        cube: None,
        reordered: Vec::new(),
        walk: false,
        walked: None,
        moments: Vec::new(),
        downloads: 0,
    };
    let stats = a
        .plan_sorted(&mut keys_only, &id, Some(&mut device), None)
        .unwrap();
    assert_eq!(device.reordered, [true], "one call, told of the reordering");
    // The host walked, so it took the device's moments.
    assert_eq!(device.downloads, 1);
    let (pa, pb) = (a.device_plan().unwrap(), b.device_plan().unwrap());
    assert!(pa.pos.is_empty() && pa.mass.is_empty() && pa.leaf_of.is_empty());
    assert_eq!(pa.particles(), n);
    assert_eq!(pa.order_of, pb.order_of);
    assert!(!pa.moments_on_device);
    assert_eq!(pa.centre, pb.centre);
    assert_same_lists(&pa, &pb);
    assert_eq!(stats.caps, b.caps().unwrap());
    // And with the walk on the device too: no lists in the plan, the device's are the
    // host's, and so are the sizes the caps learn from and the pair count.
    let mut keys_only = device_sorted();
    (keys_only.pos, keys_only.mass) = (Vec::new(), Vec::new());
    device.walk = true;
    let stats = a
        .plan_sorted(&mut keys_only, &id, Some(&mut device), None)
        .unwrap();
    let walked = device.walked.take().expect("the device walked");
    let (pa, pb) = (a.device_plan().unwrap(), b.device_plan().unwrap());
    let lists = pa.device_lists.expect("lists on the device");
    assert!(pa.m2l_sources.is_empty() && pa.p2p_spans.is_empty());
    assert_eq!(
        (lists.m2l, lists.p2p),
        (pb.m2l_sources.len(), pb.p2p_sources.len())
    );
    assert_eq!(
        (stats.used.m2l_pairs, stats.used.p2p_pairs),
        (lists.m2l, lists.p2p)
    );
    assert_eq!(pa.p2p_interactions(), pb.p2p_interactions());
    // The device walked, so its moments stayed there: the host's are its own.
    assert_eq!(device.downloads, 1);
    assert!(pa.moments_on_device);
    assert_eq!(centres(&device.moments), pb.centre);
    assert_walked_lists_are_the_plans(&walked, &pb);
    // A mass that is not finite shows in the extremes' flag.
    let mut bad = mass.clone();
    bad[8999] = f64::NAN;
    assert_eq!(bounds_of(5, &bad), None);
}

/// The centres among cells' moments (mass, centre, r_max each).
fn centres(moments: &[[f64; 5]]) -> Vec<[f64; 3]> {
    moments.iter().map(|m| [m[1], m[2], m[3]]).collect()
}

/// A device that holds the particles, under the emulation: the cells' moments from
/// kernels/moments.cu, from the particles in the sorter's order (or the tree's when told it
/// was reordered), and when asked the lists from kernels/walk.cu.
struct EmulatedDevice<'a> {
    pos: &'a [[f64; 3]],
    mass: &'a [f64],
    sorter_order: Vec<u32>,
    /// The sorter's keys and their cube, for kernels/split.cu (empty: it does not split).
    sorted_keys: Vec<u64>,
    cube: Option<leapfmm::fmm::morton::BoundingCube>,
    /// `reordered` of each call.
    reordered: Vec<bool>,
    /// Whether to walk too (kernels/walk.cu under the emulation), and the lists it made.
    walk: bool,
    walked: Option<EmulatedWalk>,
    /// The last moments computed, and how many times the host asked for them.
    moments: Vec<[f64; 5]>,
    downloads: usize,
}

impl leapfmm::fmm::backend::DeviceTree for EmulatedDevice<'_> {
    fn cell_moments(
        &mut self,
        tree: &leapfmm::fmm::tree::Tree,
        reordered: bool,
    ) -> Result<(), leapfmm::gravity::GravityError> {
        self.reordered.push(reordered);
        let order = if reordered {
            &tree.order
        } else {
            &self.sorter_order
        };
        let pos: Vec<[f64; 3]> = order.iter().map(|&i| self.pos[i as usize]).collect();
        let mass: Vec<f64> = order.iter().map(|&i| self.mass[i as usize]).collect();
        self.moments = emulated_moments(tree, &pos, &mass, 64).1;
        Ok(())
    }

    fn download_moments(
        &mut self,
        out: &mut Vec<[f64; 5]>,
    ) -> Result<(), leapfmm::gravity::GravityError> {
        self.downloads += 1;
        out.clone_from(&self.moments);
        Ok(())
    }

    fn walk(
        &mut self,
        tree: &leapfmm::fmm::tree::Tree,
        mac: leapfmm::fmm::traversal::Mac,
        _caps: &leapfmm::fmm::caps::Caps,
        targets: Option<&[bool]>,
    ) -> Result<Option<leapfmm::fmm::backend::DeviceLists>, leapfmm::gravity::GravityError> {
        if !self.walk || targets.is_some() {
            return Ok(None);
        }
        // The device's own moments: the host's tree holds none once the device walks.
        let w = emulated_walk_with(tree, &self.moments, mac, 4096, GPU_RINGS, GPU_CACHE);
        assert_eq!(w.problems, 0);
        let lists = leapfmm::fmm::backend::DeviceLists {
            m2l: w.m2l_sources.len(),
            p2p: w.p2p_sources.len(),
            p2p_interactions: w.pairs.iter().sum(),
        };
        self.walked = Some(w);
        Ok(Some(lists))
    }

    fn split_cells(
        &mut self,
        tree: &mut leapfmm::fmm::tree::Tree,
        leaf_size: usize,
        cap: usize,
    ) -> Result<Result<(), leapfmm::fmm::tree::CellsOverflow>, leapfmm::gravity::GravityError> {
        let (summary, columns) =
            emulated_split(&self.sorted_keys, &self.sorter_order, leaf_size, 64, 3);
        summary.check(self.pos.len())?;
        // The device stops at the first level past the cap; its cells are the same.
        if columns.begin.len() > cap {
            return Ok(Err(leapfmm::fmm::tree::CellsOverflow { needed: cap + 1 }));
        }
        let cube = self.cube.expect("a cube with the keys");
        tree.adopt_cells(cube, self.pos.len(), &columns, leaf_size)?;
        Ok(Ok(()))
    }
}

/// Two solvers with leaves of up to 16 particles and caps far too small (3 cells, 10 list
/// entries), so that their first plans retry.
fn two_solvers_with_small_caps() -> (
    leapfmm::fmm::solver::FmmSolver,
    leapfmm::fmm::solver::FmmSolver,
) {
    use leapfmm::fmm::caps::Caps;
    use leapfmm::fmm::solver::{FmmSettings, FmmSolver};
    use leapfmm::gravity::GravitySolver;
    let settings = FmmSettings {
        leaf_size: 16,
        ..FmmSettings::geometric(
            Softening {
                kernel: SofteningKernel::Spline,
                epsilon: 0.05,
            },
            1.0,
        )
    };
    let small = Caps {
        cells: 3,
        m2l_pairs: 10,
        p2p_pairs: 10,
        ..Caps::default()
    };
    let (mut a, mut b) = (
        FmmSolver::new(settings.clone(), None),
        FmmSolver::new(settings, None),
    );
    a.set_caps(small);
    b.set_caps(small);
    (a, b)
}

/// kernels/split.cu's order_equal_runs under the emulation over the sorted `keys` and
/// their particle indices `order` (`id` by particle), in blocks of `block`: the runs too
/// long to order, and the indices.
fn emulated_runs(keys: &[u64], id: &[u64], order: &[u32], block: u32) -> (u32, Vec<u32>) {
    let n = keys.len();
    let mut b = Vec::new();
    u32_bytes(&mut b, &[n as u32, block]);
    keys.iter()
        .chain(id)
        .for_each(|k| b.extend(k.to_le_bytes()));
    u32_bytes(&mut b, order);
    let out = run_harness("runs", &b);
    let words: Vec<u32> = out
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    (words[0], words[1..].to_vec())
}

#[test]
fn runs_of_equal_keys_longer_than_the_limit_are_left_to_the_host() {
    // Records 0..5 alone, then a run of 1025 equal keys (one past RUN_LIMIT) and one of
    // 1024, then more alone; ids shuffled.
    let mut keys: Vec<u64> = (0..5).collect();
    keys.extend(std::iter::repeat_n(10, 1025));
    keys.extend(std::iter::repeat_n(20, 1024));
    keys.extend(30..40);
    let n = keys.len();
    let mut rng = rand_pcg::Pcg64::seed_from_u64(5);
    let mut id: Vec<u64> = (0..n as u64).map(|i| 3 * i + 1).collect();
    for i in (1..n).rev() {
        id.swap(i, rng.random_range(0..=i));
    }
    let order: Vec<u32> = (0..n as u32).collect();
    let (long_runs, ordered) = emulated_runs(&keys, &id, &order, 128);
    assert_eq!(long_runs, 1);
    assert_eq!(ordered[..1030], order[..1030], "the long run as it was");
    let mut expected = order[1030..2054].to_vec();
    expected.sort_by_key(|&i| id[i as usize]);
    assert_eq!(ordered[1030..2054], expected[..], "the other run by id");
    assert_eq!(ordered[2054..], order[2054..]);
}

/// kernels/split.cu's launches under the emulation over `keys` sorted with their particle
/// indices `order`: sort_scan in `scan_blocks` blocks, then the split into cells of at most
/// `leaf_size` particles, per-cell kernels in blocks of `block`.
fn emulated_split(
    keys: &[u64],
    order: &[u32],
    leaf_size: usize,
    block: u32,
    scan_blocks: u32,
) -> (
    leapfmm::fmm::tree::SortSummary,
    leapfmm::fmm::tree::CellColumns,
) {
    let n = keys.len();
    let mut b = Vec::new();
    u32_bytes(&mut b, &[n as u32, leaf_size as u32, block, scan_blocks]);
    keys.iter().for_each(|k| b.extend(k.to_le_bytes()));
    u32_bytes(&mut b, order);
    let out = run_harness("split", &b);
    let u64_at = |i: usize| u64::from_le_bytes(out[8 * i..8 * i + 8].try_into().unwrap());
    let summary = leapfmm::fmm::tree::SortSummary {
        out_of_order: u64_at(0),
        equal_neighbours: u64_at(1),
        largest: u64_at(2),
        sum: u64_at(3),
        squares: u64_at(4),
    };
    let words: Vec<u32> = out[40..]
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let (levels, cells) = (words[0] as usize, words[1] as usize);
    let level_start = words[2..levels + 3].iter().map(|&l| l as usize).collect();
    let column = |k: usize| words[levels + 3 + k * cells..levels + 3 + (k + 1) * cells].to_vec();
    assert_eq!(words.len(), levels + 3 + 5 * cells);
    let columns = leapfmm::fmm::tree::CellColumns {
        begin: column(0),
        end: column(1),
        first_child: column(2),
        child_count: column(3),
        level_start,
    };
    // The parents split_write wrote are those the columns imply.
    let parent = column(4);
    for (c, (&first, &count)) in columns
        .first_child
        .iter()
        .zip(&columns.child_count)
        .enumerate()
    {
        for child in first..first + count {
            assert_eq!(parent[child as usize], c as u32, "parent of cell {child}");
        }
    }
    assert_eq!(parent[0], 0);
    (summary, columns)
}

/// kernels/moments.cu's launches under the emulation for the cells of `tree` over `pos`
/// and `mass` (tree order), per-item kernels in blocks of `block`: each particle's leaf,
/// and each cell's mass, centre and r_max.
fn emulated_moments(
    tree: &leapfmm::fmm::tree::Tree,
    pos: &[[f64; 3]],
    mass: &[f64],
    block: u32,
) -> (Vec<u32>, Vec<[f64; 5]>) {
    let (n, cells) = (pos.len(), tree.cells.len());
    let mut b = Vec::new();
    let levels = tree.level_start.len() - 1;
    u32_bytes(
        &mut b,
        &[
            n as u32,
            cells as u32,
            levels as u32,
            tree.leaves.len() as u32,
            block,
        ],
    );
    f64_bytes(&mut b, pos.iter().flatten().copied());
    f64_bytes(&mut b, mass.iter().copied());
    tree_bytes(&mut b, tree);
    u32_bytes(&mut b, &tree.leaves);
    let out = run_harness("moments", &b);
    let leaf_of = out[..4 * n]
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let moments = f64s(&out[4 * n..])
        .chunks_exact(5)
        .map(|m| [m[0], m[1], m[2], m[3], m[4]])
        .collect();
    (leaf_of, moments)
}

#[test]
fn device_moments_are_the_hosts_to_the_bit() {
    // A clustered cloud in a deep tree (at most 4 particles a leaf): the top levels' cells
    // span whole blocks of ancestor_r2, the low ones share blocks; coincident particles make
    // leaves of one radius 0 and leaves at the deepest level; a lone far particle makes a
    // shallow leaf among deep ones.
    use leapfmm::fmm::tree::Tree;
    let n = 6000usize;
    let mut rng = rand_pcg::Pcg64::seed_from_u64(7);
    let mut pos = clump(&mut rng, n, 4, 10.0, 0.1);
    pos.iter_mut().for_each(|x| x[0] += 0.3);
    for i in 0..6 {
        pos[500 + i] = [0.7, 0.7, 0.01];
    }
    pos[n - 1] = [40.0, -35.0, 3.0];
    let mass: Vec<f64> = (0..n).map(|_| rng.random_range(0.1..2.0)).collect();
    let id: Vec<u64> = (0..n as u64).collect();
    let mut tree = Tree::default();
    tree.build(&pos, &mass, &id, None, 4, usize::MAX).unwrap();
    tree.compute_moments();
    assert!(tree.depth() >= 10, "{} levels", tree.depth());
    for block in [32, 128] {
        let (leaf_of, moments) = emulated_moments(&tree, &tree.pos, &tree.mass, block);
        for &leaf in &tree.leaves {
            let c = &tree.cells[leaf as usize];
            assert!(
                leaf_of[c.begin as usize..c.end as usize]
                    .iter()
                    .all(|&l| l == leaf)
            );
        }
        let host = tree.moments();
        assert_eq!(moments.len(), host.len());
        for (c, (d, h)) in moments.iter().zip(&host).enumerate() {
            assert_eq!(
                d.map(f64::to_bits),
                h.map(f64::to_bits),
                "cell {c} (level {}, {} particles): device {d:?}, host {h:?}",
                tree.cells[c].level,
                tree.cells[c].count()
            );
        }
    }
}

#[test]
fn device_walk_gives_the_hosts_lists() {
    // kernels/walk.cu level by level (count, prefix sums, write) under the emulation, in
    // launches of a few targets and of whole levels, against traversal.rs's walk of the same
    // tree: every cell's M2L and P2P sources in the same order, and the P2P particle pairs.
    use leapfmm::fmm::caps::CappedBuffer;
    use leapfmm::fmm::traversal::{Mac, walk};
    use leapfmm::fmm::tree::Tree;
    let n = 5000usize;
    let mut rng = rand_pcg::Pcg64::seed_from_u64(13);
    let mut pos = clump(&mut rng, n, 3, 8.0, 0.2);
    pos.iter_mut().step_by(3).for_each(|x| x[0] += 6.0);
    let mass: Vec<f64> = (0..n).map(|_| rng.random_range(0.5..1.5)).collect();
    let id: Vec<u64> = (0..n as u64).collect();
    let mut tree = Tree::default();
    tree.build(&pos, &mass, &id, None, 8, usize::MAX).unwrap();
    tree.compute_moments();
    let cells = tree.cells.len();
    for (mac, chunk) in [
        (
            Mac {
                theta: 0.5,
                support: 0.05,
                order: 7,
                tolerance: 0.0,
                total_mass: 1.0,
                g_total: 1.0,
                bias: 0.0,
            },
            7u32,
        ),
        (
            Mac {
                theta: 0.7,
                support: 0.0,
                order: 7,
                tolerance: 0.0,
                total_mass: 1.0,
                g_total: 1.0,
                bias: 0.0,
            },
            100_000,
        ),
    ] {
        let (mut m2l, mut p2p) = (CappedBuffer::default(), CappedBuffer::default());
        m2l.reset(10_000_000);
        p2p.reset(10_000_000);
        let walked = walk(&tree, None, mac, &[], &m2l, &p2p);
        let (far, near) = (m2l.take(), p2p.take());
        let w = emulated_walk(&tree, mac, chunk, GPU_RINGS, GPU_CACHE);
        assert_eq!((w.problems, w.retried), (0, 0));
        assert!(w.kept > 0, "no target's entries were kept");
        let (m2l_spans, p2p_spans, pairs) = (&w.m2l_spans, &w.p2p_spans, &w.pairs);
        let (device_m2l, device_p2p) = (&w.m2l_sources, &w.p2p_sources);
        let (m2l_total, p2p_total) = (device_m2l.len(), device_p2p.len());
        assert_eq!((m2l_total, p2p_total), (far.len(), near.len()));
        let of = |spans: &[u64], list: &[u32], c: usize| -> Vec<u32> {
            let (start, len) = unpack(spans[c]);
            list[start as usize..(start + len) as usize].to_vec()
        };
        for c in 0..cells {
            assert_eq!(
                of(m2l_spans, device_m2l, c),
                of(&walked.m2l, &far, c),
                "M2L of {c}"
            );
            assert_eq!(
                of(p2p_spans, device_p2p, c),
                of(&walked.p2p, &near, c),
                "P2P of {c}"
            );
        }
        let host_pairs: u64 = (0..cells)
            .map(|c| {
                let count = tree.cells[c].count() as u64;
                of(&walked.p2p, &near, c)
                    .iter()
                    .map(|&s| count * tree.cells[s as usize].count() as u64)
                    .sum::<u64>()
            })
            .sum();
        assert_eq!(pairs.iter().sum::<u64>(), host_pairs);
        assert!(
            far.len() > 10_000 && near.len() > 1_000,
            "{} {}",
            far.len(),
            near.len()
        );
        // With short rings of 8 opened sources, targets fill them: they are launched again
        // with long rings, and the lists are the same.
        // Keeping no entries (every target walks again to write) or 40 (some do), the
        // lists are the same.
        for cache in [0, 40] {
            let again = emulated_walk(&tree, mac, chunk, GPU_RINGS, cache);
            assert_eq!(again.problems, 0);
            let kept = again.kept as usize;
            assert!(
                if cache == 0 {
                    kept == 0
                } else {
                    kept > 0 && kept < cells
                },
                "{kept} of {cells} kept {cache} entries"
            );
            assert_same_walk(&again, &w);
        }
        let retried = emulated_walk(&tree, mac, chunk, (8, 16384), GPU_CACHE);
        assert_eq!(retried.problems, 0);
        assert!(retried.retried > 0, "no short ring filled up");
        assert_same_walk(&retried, &w);
        // With long rings of 8 too, the walk says so (the host then walks) instead of
        // writing past a ring or dropping sources silently.
        let small = emulated_walk(&tree, mac, chunk, (8, 8), GPU_CACHE);
        assert!(small.problems > 0, "no long ring filled up");
    }
}

/// Two emulated walks gave the same spans, pairs and lists.
fn assert_same_walk(a: &EmulatedWalk, b: &EmulatedWalk) {
    assert_eq!(
        (&a.m2l_spans, &a.p2p_spans, &a.pairs),
        (&b.m2l_spans, &b.p2p_spans, &b.pairs)
    );
    assert_eq!(
        (&a.m2l_sources, &a.p2p_sources),
        (&b.m2l_sources, &b.p2p_sources)
    );
}

/// Every cell's M2L and P2P lists of an emulated device walk are those of `plan`.
fn assert_walked_lists_are_the_plans(
    walked: &EmulatedWalk,
    plan: &leapfmm::fmm::backend::DevicePlan,
) {
    let of = |spans: &[u64], list: &[u32], c: usize| -> Vec<u32> {
        let (start, len) = unpack(spans[c]);
        list[start as usize..(start + len) as usize].to_vec()
    };
    for c in 0..plan.centre.len() {
        assert_eq!(
            of(&walked.m2l_spans, &walked.m2l_sources, c),
            plan.m2l_of(c)
        );
        assert_eq!(
            of(&walked.p2p_spans, &walked.p2p_sources, c),
            plan.p2p_of(c)
        );
    }
}

/// Entries the GPU's counting pass keeps per target (src/gpu/sort.rs).
const GPU_CACHE: u32 = leapfmm::gpu::sort::WALK_CACHE as u32;

/// The GPU's rings of opened sources: short, and long for the targets launched again
/// (src/gpu/sort.rs).
const GPU_RINGS: (u32, u32) = (
    leapfmm::gpu::sort::WALK_SHORT_QUEUE as u32,
    leapfmm::gpu::sort::WALK_QUEUE as u32,
);

/// kernels/walk.cu's lists under the emulation (harness mode `walk`).
struct EmulatedWalk {
    problems: u32,
    /// Targets launched again with long rings.
    retried: u32,
    /// Targets whose entries the counting pass kept (their writing pass copied them).
    kept: u32,
    m2l_spans: Vec<u64>,
    p2p_spans: Vec<u64>,
    pairs: Vec<u64>,
    m2l_sources: Vec<u32>,
    p2p_sources: Vec<u32>,
}

/// The device walk of `tree` (moments set) with `mac`, in launches of `chunk` targets with
/// `rings` (short, long) entries of opened sources (the targets launched again in launches
/// of `chunk` too), keeping `cache` entries per target for the writing pass.
fn emulated_walk(
    tree: &leapfmm::fmm::tree::Tree,
    mac: leapfmm::fmm::traversal::Mac,
    chunk: u32,
    rings: (u32, u32),
    cache: u32,
) -> EmulatedWalk {
    emulated_walk_with(tree, &tree.moments(), mac, chunk, rings, cache)
}

/// `emulated_walk` with the cells' `moments` (mass, centre, r_max each) given apart from
/// the tree's cells, as a device that computed them holds them.
fn emulated_walk_with(
    tree: &leapfmm::fmm::tree::Tree,
    moments: &[[f64; 5]],
    mac: leapfmm::fmm::traversal::Mac,
    chunk: u32,
    rings: (u32, u32),
    cache: u32,
) -> EmulatedWalk {
    let cells = tree.cells.len();
    let mut b = Vec::new();
    let levels = tree.depth();
    u32_bytes(
        &mut b,
        &[
            cells as u32,
            levels as u32,
            chunk,
            chunk,
            rings.0,
            rings.1,
            32,
            cache,
        ],
    );
    f64_bytes(&mut b, [mac.theta, mac.support]);
    assert_eq!(moments.len(), cells);
    f64_bytes(&mut b, moments.iter().flatten().copied());
    tree_bytes(&mut b, tree);
    let out = run(&harness(), "walk", &b);
    let word = |i: usize| u32::from_le_bytes(out[4 * i..4 * i + 4].try_into().unwrap());
    let (problems, retried) = (word(0), word(1));
    let (m2l_total, p2p_total) = (word(2) as usize, word(3) as usize);
    let u64_at = |at: usize| u64::from_le_bytes(out[at..at + 8].try_into().unwrap());
    let spans = |which: usize| -> Vec<u64> {
        (0..cells)
            .map(|c| u64_at(20 + 8 * (which * cells + c)))
            .collect()
    };
    let lists = 20 + 24 * cells;
    let u32_at =
        |i: usize| u32::from_le_bytes(out[lists + 4 * i..lists + 4 * i + 4].try_into().unwrap());
    EmulatedWalk {
        problems,
        retried,
        kept: word(4),
        m2l_spans: spans(0),
        p2p_spans: spans(1),
        pairs: spans(2),
        m2l_sources: (0..m2l_total).map(u32_at).collect(),
        p2p_sources: (m2l_total..m2l_total + p2p_total).map(u32_at).collect(),
    }
}

/// `n` positions in a flattened clump around the origin, dense at its centre: each at a
/// radius `size` u^`power` (u uniform), each coordinate a uniform share of it, z squeezed by
/// `flat`.
fn clump(rng: &mut rand_pcg::Pcg64, n: usize, power: i32, size: f64, flat: f64) -> Vec<[f64; 3]> {
    (0..n)
        .map(|_| {
            let r: f64 = rng.random_range(0.0f64..1.0).powi(power) * size;
            [
                r * rng.random_range(-1.0..1.0),
                r * rng.random_range(-1.0..1.0),
                flat * r * rng.random_range(-1.0..1.0),
            ]
        })
        .collect()
}

/// The cells of `tree` as the harness reads them: begin, end, first child, child count and
/// parent of every cell, then the levels' first cells.
fn tree_bytes(b: &mut Vec<u8>, tree: &leapfmm::fmm::tree::Tree) {
    let column = |f: fn(&leapfmm::fmm::tree::Cell) -> u32| -> Vec<u32> {
        tree.cells.iter().map(f).collect()
    };
    u32_bytes(b, &column(|c| c.begin));
    u32_bytes(b, &column(|c| c.end));
    u32_bytes(b, &column(|c| c.first_child));
    u32_bytes(b, &column(|c| u32::from(c.child_count)));
    u32_bytes(b, &column(|c| c.parent));
    let level_start: Vec<u32> = tree.level_start.iter().map(|&l| l as u32).collect();
    u32_bytes(b, &level_start);
}

/// The two plans have the same M2L and P2P lists, laid out alike.
fn assert_same_lists(a: &leapfmm::fmm::backend::DevicePlan, b: &leapfmm::fmm::backend::DevicePlan) {
    assert_eq!((a.m2l_spans, a.m2l_sources), (b.m2l_spans, b.m2l_sources));
    assert_eq!((a.p2p_spans, a.p2p_sources), (b.p2p_spans, b.p2p_sources));
}

fn u32_bytes(b: &mut Vec<u8>, v: &[u32]) {
    v.iter().for_each(|x| b.extend(x.to_le_bytes()));
}

fn f64_bytes(b: &mut Vec<u8>, v: impl IntoIterator<Item = f64>) {
    v.into_iter().for_each(|x| b.extend(x.to_le_bytes()));
}

#[test]
fn p2m_kernel_matches_the_cpu_multipoles() {
    // One warp a leaf, the particles in batches of 8 (9: one and a partial one); at p = 12
    // a thread owns up to three of the 91 coefficients.
    for p in [1usize, 7, 12] {
        p2m_kernel_matches_at_order(p);
    }
}

fn p2m_kernel_matches_at_order(p: usize) {
    use leapfmm::fmm::expansion::{real_len, regular};
    let l = leaves(&[0, 1, 9, 70, 33], 21);
    let len = real_len(p);
    let nl = l.begin.len();
    let mut b = Vec::new();
    u32_bytes(&mut b, &[l.pos.len() as u32, nl as u32, p as u32]);
    f64_bytes(&mut b, l.pos.iter().flatten().copied());
    f64_bytes(&mut b, l.mass.iter().copied());
    u32_bytes(&mut b, &l.begin);
    u32_bytes(&mut b, &l.end);
    f64_bytes(&mut b, l.centre.iter().flatten().copied());
    let out = f64s(&run_harness("p2m", &b));
    assert_eq!(out.len(), nl * len);
    let mut r = vec![0.0; len];
    for leaf in 0..nl {
        let mut m = vec![0.0; len];
        for i in l.begin[leaf] as usize..l.end[leaf] as usize {
            let y: [f64; 3] = std::array::from_fn(|k| l.pos[i][k] - l.centre[leaf][k]);
            regular(p, y, &mut r);
            for c in 0..len / 2 {
                m[2 * c] += l.mass[i] * r[2 * c];
                m[2 * c + 1] -= l.mass[i] * r[2 * c + 1];
            }
        }
        let scale = m.iter().fold(0.0f64, |a, v| a.max(v.abs())).max(1e-300);
        for c in 0..len {
            let got = out[leaf * len + c];
            assert!(
                (got - m[c]).abs() <= 1e-13 * scale,
                "p = {p}, leaf {leaf} coefficient {c}: {got} vs {}",
                m[c]
            );
        }
    }
}

#[test]
fn l2p_kernel_matches_the_cpu_local_evaluation() {
    for p in [1usize, 2, 7, 12] {
        l2p_kernel_matches_at_order(p);
    }
}

fn l2p_kernel_matches_at_order(p: usize) {
    use leapfmm::fmm::expansion::{M2L_LANES, Operators, real_len};
    let l = leaves(&[5, 17, 1, 40], 31);
    let g = 2.5;
    let len = real_len(p);
    let nl = l.begin.len();
    let locals = random_expansions(nl, p, 8);
    let leaf_of: Vec<u32> = (0..nl)
        .flat_map(|leaf| (l.begin[leaf]..l.end[leaf]).map(move |_| leaf as u32))
        .collect();
    let mut b = Vec::new();
    u32_bytes(&mut b, &[l.pos.len() as u32, nl as u32, p as u32, 16]);
    f64_bytes(&mut b, [g]);
    f64_bytes(&mut b, l.pos.iter().flatten().copied());
    u32_bytes(&mut b, &leaf_of);
    f64_bytes(&mut b, l.centre.iter().flatten().copied());
    f64_bytes(&mut b, locals.iter().copied());
    let out = f64s(&run_harness("l2p", &b));
    let n = l.pos.len();
    let (acc, pot) = out.split_at(3 * n);
    let ops = Operators::new(p);
    for (i, &leaf) in leaf_of.iter().enumerate() {
        let leaf = leaf as usize;
        let y: [f64; 3] = std::array::from_fn(|k| l.pos[i][k] - l.centre[leaf][k]);
        let mut lanes = [[0.0; 3]; M2L_LANES];
        lanes[0] = y;
        let cpu = ops.l2p_batch(&lanes, &locals[leaf * len..(leaf + 1) * len])[0];
        let want = [g * cpu[1], g * cpu[2], g * cpu[3], -g * cpu[0]];
        let got = [acc[3 * i], acc[3 * i + 1], acc[3 * i + 2], pot[i]];
        for k in 0..4 {
            assert!(
                (got[k] - want[k]).abs() <= 1e-12 * want[k].abs().max(1.0),
                "p = {p}, particle {i} component {k}: {} vs {}",
                got[k],
                want[k]
            );
        }
    }
}

/// Random expansion coefficients with the real-source symmetry (Im of m = 0 is zero).
fn random_expansions(count: usize, p: usize, seed: u64) -> Vec<f64> {
    let len = (p + 1) * (p + 2);
    let mut rng = rand_pcg::Pcg64::seed_from_u64(seed);
    (0..count * len)
        .map(|k| {
            let c = (k % len) / 2;
            let m0 = (0..=p).any(|n| n * (n + 1) / 2 == c);
            if k % 2 == 1 && m0 {
                0.0
            } else {
                rng.random_range(-1.0..1.0)
            }
        })
        .collect()
}

/// A parent (cell 0) and three children (cells 1-3) around it.
const FAMILY: [[f64; 3]; 4] = [
    [1.0, -2.0, 0.5],
    [1.3, -1.8, 0.4],
    [0.7, -2.1, 0.9],
    [1.1, -2.3, 0.2],
];

#[test]
fn m2m_and_l2l_kernels_match_the_cpu_translations() {
    // One warp a cell: at p = 12 a thread owns up to three of the 91 outputs.
    for p in [1usize, 7, 12] {
        m2m_and_l2l_match_at_order(p);
    }
}

fn m2m_and_l2l_match_at_order(p: usize) {
    use leapfmm::fmm::expansion::{l2l, m2m, real_len};
    let len = real_len(p);
    let centres: Vec<f64> = FAMILY.iter().flatten().copied().collect();
    let offset =
        |a: usize, b: usize| -> [f64; 3] { std::array::from_fn(|k| FAMILY[a][k] - FAMILY[b][k]) };
    let mut scratch = vec![0.0; len];
    let close = |got: &[f64], want: &[f64], what: &str| {
        let scale = want.iter().fold(0.0f64, |a, v| a.max(v.abs()));
        for (c, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-13 * scale,
                "{what} at p = {p}, coefficient {c}: {g} vs {w}"
            );
        }
    };

    // M2M: the parent's multipole from its three children's.
    let mut m = random_expansions(4, p, 3);
    m[..len].fill(7.0); // overwritten by the kernel
    let mut b = Vec::new();
    u32_bytes(&mut b, &[4, 1, p as u32]);
    f64_bytes(&mut b, centres.iter().copied());
    u32_bytes(&mut b, &[1, 0, 0, 0]); // first child
    u32_bytes(&mut b, &[3, 0, 0, 0]); // child count
    u32_bytes(&mut b, &[0]); // the parents of this level
    f64_bytes(&mut b, m.iter().copied());
    let out = f64s(&run_harness("m2m", &b));
    let mut want = vec![0.0; len];
    for ch in 1..4 {
        m2m(
            p,
            offset(ch, 0),
            &m[ch * len..(ch + 1) * len],
            &mut want,
            &mut scratch,
        );
    }
    close(&out[..len], &want, "M2M");
    assert_eq!(&out[len..], &m[len..], "children untouched");

    // L2L: each child adds its parent's local translated to its centre.
    let l = random_expansions(4, p, 4);
    let mut b = Vec::new();
    u32_bytes(&mut b, &[4, 3, p as u32]);
    f64_bytes(&mut b, centres.iter().copied());
    u32_bytes(&mut b, &[0, 0, 0, 0]); // parent of each cell
    u32_bytes(&mut b, &[1, 2, 3]); // the cells of this level
    f64_bytes(&mut b, l.iter().copied());
    let out = f64s(&run_harness("l2l", &b));
    for ch in 1..4 {
        let mut want = l[ch * len..(ch + 1) * len].to_vec();
        l2l(p, offset(ch, 0), &l[..len], &mut want, &mut scratch);
        close(&out[ch * len..(ch + 1) * len], &want, "L2L");
    }
    assert_eq!(&out[..len], &l[..len], "the parent untouched");
}

#[test]
fn m2l_kernel_matches_the_cpu_translation() {
    // The direct form at orders 1 to 12 (a warp's share of the (k, l, n) pieces from one
    // each to fifteen), the rotated one at every order it takes. 41 sources: the rotated
    // kernel takes a warp's width of them, then 9.
    for p in [1usize, 2, 4, 7, 12] {
        m2l_kernel_matches_at_order(p, true);
    }
    for p in 1..=leapfmm::gpu::memory::M2L_ROTATED_ORDER {
        m2l_kernel_matches_at_order(p, false);
    }
}

#[test]
fn rotations_header_is_the_cpu_swap_matrices() {
    use leapfmm::fmm::expansion::Operators;
    let want = Operators::new(leapfmm::gpu::memory::M2L_ROTATED_ORDER).rotation_source();
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels/rotations.cuh");
    if std::env::var_os("LEAPFMM_BLESS").is_some() {
        std::fs::write(&path, &want).unwrap();
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "kernels/rotations.cuh is not the CPU's swap matrices; regenerate it with \
         LEAPFMM_BLESS=1 cargo test --release --test gpu_kernels rotations"
    );
}

/// The M2L kernel (`direct`: the direct form; otherwise the one the device takes at order
/// `p`) against the CPU's rotated translation: cell 0 is the target, cells 1 to 41 sources 3
/// to 6 units away in all directions, two of them straight above and below.
fn m2l_kernel_matches_at_order(p: usize, direct: bool) {
    use leapfmm::fmm::expansion::{M2L_LANES, Operators, real_len};
    let len = real_len(p);
    let sources = 41;
    let mut rng = rand_pcg::Pcg64::seed_from_u64(17);
    let target = [0.5, -0.2, 0.1];
    let mut centres = vec![target];
    for s in 0..sources {
        let offset: [f64; 3] = match s {
            3 => [0.0, 0.0, 4.0],
            8 => [0.0, 0.0, -5.0],
            _ => loop {
                let d: [f64; 3] = std::array::from_fn(|_| rng.random_range(-1.0..1.0));
                let r = d.iter().map(|v| v * v).sum::<f64>().sqrt();
                if r > 0.1 && r <= 1.0 {
                    let at = rng.random_range(3.0..6.0) / r;
                    break d.map(|v| v * at);
                }
            },
        };
        centres.push(std::array::from_fn(|k| target[k] + offset[k]));
    }
    let cells = centres.len();
    let m = random_expansions(cells, p, 9);
    let mut b = Vec::new();
    // The target's span starts past two entries of other cells' lists.
    u32_bytes(
        &mut b,
        &[cells as u32, 1, sources as u32 + 2, p as u32, direct as u32],
    );
    f64_bytes(&mut b, centres.iter().flatten().copied());
    u32_bytes(&mut b, &[0]);
    let mut spans = vec![0u64; cells];
    (spans[0], spans[1]) = (pack(2, sources as u32), pack(0, 2));
    spans.iter().for_each(|x| b.extend(x.to_le_bytes()));
    let list: Vec<u32> = [4, 5].into_iter().chain(1..=sources as u32).collect();
    u32_bytes(&mut b, &list);
    f64_bytes(&mut b, m.iter().copied());
    let out = f64s(&run_harness("m2l", &b));
    let ops = Operators::new(p);
    let zero = vec![0.0; len];
    let mut want = vec![0.0; len];
    let ids: Vec<usize> = (1..=sources).collect();
    for batch in ids.chunks(M2L_LANES) {
        let mut r = [[0.0, 0.0, 1.0]; M2L_LANES];
        let mut lanes: [&[f64]; M2L_LANES] = [&zero; M2L_LANES];
        for (w, &s) in batch.iter().enumerate() {
            r[w] = std::array::from_fn(|k| centres[0][k] - centres[s][k]);
            lanes[w] = &m[s * len..(s + 1) * len];
        }
        ops.m2l_batch(&r, &lanes, &mut want);
    }
    // Per degree: the two forms, and the sums' orders, differ by rounding only.
    for k in 0..=p {
        let range = k * (k + 1)..(k + 1) * (k + 2);
        let scale = want[range.clone()]
            .iter()
            .fold(0.0f64, |a, v| a.max(v.abs()));
        for c in range {
            assert!(
                (out[c] - want[c]).abs() <= 1e-11 * scale,
                "p = {p} (direct: {direct}), degree {k} value {c}: {} vs {}",
                out[c],
                want[c]
            );
        }
    }
    assert!(
        out[len..].iter().all(|&v| v == 0.0),
        "only the target changes"
    );
}

/// The harness input of a whole FMM evaluation from a device plan.
fn fmm_input(plan: &leapfmm::fmm::backend::DevicePlan, softening: Softening, g: f64) -> Vec<u8> {
    let mut b = Vec::new();
    let n = plan.pos.len() as u32;
    u32_bytes(
        &mut b,
        &[
            n,
            plan.centre.len() as u32,
            plan.level_start.len() as u32,
            plan.leaves.len() as u32,
            plan.m2l_sources.len() as u32,
            plan.p2p_sources.len() as u32,
            plan.order as u32,
            plan.own_particles as u32,
            plan.own_cells as u32,
            u32::from(plan.multipoles.is_some()),
            u32::from(plan.upward_on_device),
        ],
    );
    let kernel = match softening.kernel {
        SofteningKernel::Plummer => 0i32,
        SofteningKernel::Spline => 1,
    };
    b.extend(kernel.to_le_bytes());
    b.extend(64u32.to_le_bytes());
    let eps = softening.epsilon;
    b.extend(((eps * eps) as f32).to_le_bytes());
    b.extend(((2.8 * eps) as f32).to_le_bytes());
    b.extend(leapfmm::gravity::pairwise::self_potential(1.0, eps).to_le_bytes());
    f64_bytes(&mut b, [g]);
    f64_bytes(&mut b, plan.pos.as_flattened().iter().copied());
    f64_bytes(&mut b, plan.mass.iter().copied());
    f64_bytes(&mut b, plan.centre.iter().flatten().copied());
    for v in [
        &plan.begin,
        &plan.end,
        &plan.first_child,
        &plan.child_count,
        &plan.parent,
        &plan.level_start,
        plan.leaves,
        &plan.leaf_of,
    ] {
        u32_bytes(&mut b, v);
    }
    for (spans, sources) in [
        (plan.m2l_spans, plan.m2l_sources),
        (plan.p2p_spans, plan.p2p_sources),
    ] {
        spans.iter().for_each(|x| b.extend(x.to_le_bytes()));
        u32_bytes(&mut b, sources);
    }
    if let Some(m) = plan.multipoles {
        f64_bytes(&mut b, m.iter().copied());
    }
    b
}

/// A clumpy cloud of 4000 particles (a dense core and a diffuse envelope, so the tree has
/// several levels, leaves at different depths and real M2L work), the FMM settings of the
/// device tests, and the CPU FMM's forces on it.
struct Cloud {
    pos: Vec<[f64; 3]>,
    mass: Vec<f64>,
    id: Vec<u64>,
    settings: leapfmm::fmm::solver::FmmSettings,
    acc: Vec<[f64; 3]>,
    pot: Vec<f64>,
}

fn clumpy_cloud() -> Cloud {
    use leapfmm::fmm::caps::CapsPolicy;
    use leapfmm::fmm::p2p::NearFieldPrecision;
    use leapfmm::fmm::solver::{FmmSettings, FmmSolver};
    let n = 4000;
    let mut rng = rand_pcg::Pcg64::seed_from_u64(17);
    let pos: Vec<[f64; 3]> = (0..n)
        .map(|i| {
            let s = if i % 4 == 0 { 3.0 } else { 0.5 };
            std::array::from_fn(|_| s * rng.random_range(-1.0f64..1.0).powi(3))
        })
        .collect();
    let mass: Vec<f64> = (0..n)
        .map(|_| rng.random_range(0.5..1.5) / n as f64)
        .collect();
    let id: Vec<u64> = (0..n as u64).collect();
    let settings = FmmSettings {
        order: 5,
        theta: 0.6,
        accuracy: 0.0,
        leaf_size: 48,
        softening: Softening {
            kernel: SofteningKernel::Spline,
            epsilon: 0.01,
        },
        g: 1.7,
        near_field: NearFieldPrecision::Mixed,
        caps_policy: CapsPolicy::default(),
    };
    let (mut acc, mut pot) = (vec![[0.0; 3]; n], vec![0.0; n]);
    FmmSolver::new(settings.clone(), None)
        .evaluate(&pos, &mass, &id, &mut acc, &mut pot)
        .unwrap();
    Cloud {
        pos,
        mass,
        id,
        settings,
        acc,
        pot,
    }
}

/// The largest relative difference of the device's forces `out` (harness output, tree order
/// of `plan`) from the CPU's, over the particles `counted` flags (caller's order).
fn worst_difference(
    plan: &leapfmm::fmm::backend::DevicePlan,
    out: &[f64],
    cloud: &Cloud,
    counted: impl Fn(usize) -> bool,
) -> f64 {
    let n = plan.own_particles;
    let (dev_acc, dev_pot) = out.split_at(3 * n);
    let mut worst: f64 = 0.0;
    for (sorted, &orig) in plan.order_of.iter().enumerate() {
        let i = orig as usize;
        if !counted(i) {
            continue;
        }
        let a = cloud.acc[i];
        let norm = (a[0] * a[0] + a[1] * a[1] + a[2] * a[2]).sqrt();
        let d = (0..3)
            .map(|k| (dev_acc[3 * sorted + k] - a[k]).powi(2))
            .sum::<f64>()
            .sqrt();
        worst = worst
            .max(d / norm)
            .max(((dev_pot[sorted] - cloud.pot[i]) / cloud.pot[i]).abs());
    }
    worst
}

#[test]
fn active_particles_lists_cut_the_device_work_and_keep_their_forces() {
    // The block scheme's sub-steps on the GPU: a plan with lists only for the cells holding
    // active particles (a corner of the cloud) gives those particles the full evaluation's
    // forces with a fraction of the pair work.
    use leapfmm::fmm::solver::{Evaluation, FmmSolver};
    let cloud = clumpy_cloud();
    let active: Vec<bool> = cloud.pos.iter().map(|x| x[0] > 0.2 && x[1] > 0.2).collect();
    let count = active.iter().filter(|&&a| a).count();
    let mut full_solver = FmmSolver::new(cloud.settings.clone(), None);
    let (full, _) = full_solver
        .plan(&cloud.pos, &cloud.mass, &cloud.id)
        .unwrap();
    let with = Evaluation {
        active: Some(&active),
        ..Evaluation::default()
    };
    let mut solver = FmmSolver::new(cloud.settings.clone(), None);
    solver
        .plan_with(&cloud.pos, &cloud.mass, &cloud.id, with)
        .unwrap();
    let plan = solver.device_plan().unwrap();
    let s = &cloud.settings;
    let out = f64s(&run_harness("fmm", &fmm_input(&plan, s.softening, s.g)));
    let worst = worst_difference(&plan, &out, &cloud, |i| active[i]);
    let (pairs, all_pairs) = (plan.p2p_interactions(), full.p2p_interactions());
    eprintln!(
        "{count} of {} active: {pairs} of {all_pairs} pair interactions, {} of {} M2L; worst relative difference {worst:.2e}",
        cloud.pos.len(),
        plan.m2l_sources.len(),
        full.m2l_sources.len()
    );
    assert!(count > 100 && count < cloud.pos.len() / 4, "{count} active");
    assert!(worst < 1e-5, "{worst:.2e}");
    assert!(2 * pairs < all_pairs, "{pairs} of {all_pairs}");
    assert!(2 * plan.m2l_sources.len() < full.m2l_sources.len());
}

/// Every own cell's M2L sources and every leaf's P2P sources, in cell order (the plans'
/// spans lie wherever the walk's threads put them).
fn lists(plan: &leapfmm::fmm::backend::DevicePlan) -> (Vec<Vec<u32>>, Vec<Vec<u32>>) {
    let m2l = (0..plan.own_cells)
        .map(|c| plan.m2l_of(c).to_vec())
        .collect();
    let p2p = plan
        .leaves
        .iter()
        .map(|&c| plan.p2p_of(c as usize).to_vec())
        .collect();
    (m2l, p2p)
}

#[test]
fn the_kernels_in_sequence_give_the_cpu_fmm_forces() {
    use leapfmm::fmm::solver::FmmSolver;
    let cloud = clumpy_cloud();
    let Cloud {
        pos,
        mass,
        id,
        settings,
        ..
    } = &cloud;
    let (softening, g, n) = (settings.softening, settings.g, pos.len());
    let mut solver = FmmSolver::new(settings.clone(), None);
    let (mut acc, mut pot) = (vec![[0.0; 3]; n], vec![0.0; n]);
    let stats = solver.evaluate(pos, mass, id, &mut acc, &mut pot).unwrap();
    // The GPU solver's plan (tree and lists without the host passes) is the evaluation's.
    let mut planner = FmmSolver::new(settings.clone(), None);
    let (plan, _) = planner.plan(pos, mass, id).unwrap();
    let evaluated = solver.device_plan().expect("a single-rank plan");
    assert_eq!(plan.pos, evaluated.pos);
    assert_eq!(plan.centre, evaluated.centre);
    assert_eq!(lists(&plan), lists(&evaluated));
    assert_eq!(plan.p2p_interactions(), stats.p2p_interactions);
    assert!(
        plan.m2l_sources.len() > 1000,
        "too little far field: {}",
        plan.m2l_sources.len()
    );
    assert!(plan.level_start.len() > 4);
    let out = f64s(&run_harness("fmm", &fmm_input(&plan, softening, g)));
    let worst = worst_difference(&plan, &out, &cloud, |_| true);
    eprintln!("device passes vs CPU FMM: worst relative difference {worst:.2e} over {n} particles");
    assert!(
        worst < 1e-5,
        "the kernels in sequence differ from the CPU FMM by {worst:.2e}"
    );
}

/// Issue target "≥ 1e8 particles fit on one H200 (≤ 1 KB of device memory per particle)":
/// the device buffers a force evaluation of the galaxy model needs at the default settings,
/// sized by the caps after a few evaluations (as a run holds them), and the particle state
/// resident on the device, computed without a GPU from the same element counts `GpuFmm`
/// allocates.
#[test]
fn a_galaxy_evaluation_needs_under_a_kilobyte_of_device_memory_per_particle() {
    use leapfmm::fmm::solver::{FmmSettings, FmmSolver};
    use leapfmm::gpu::memory::DeviceLengths;
    use leapfmm::gravity::GravitySolver;
    let model = leapfmm::ics::ModelFile::load(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("ics/milky_way.toml"),
    )
    .unwrap();
    let (p, _) = leapfmm::ics::generate(&model, 200_000, 1);
    let settings = FmmSettings::geometric(
        Softening {
            kernel: SofteningKernel::Spline,
            epsilon: 0.05,
        },
        model.units.gravitational_constant(),
    );
    let mut solver = FmmSolver::new(settings, None);
    let mut worst: f64 = 0.0;
    for _ in 0..3 {
        solver
            .plan_with(&p.pos, &p.mass, &p.id, Default::default())
            .unwrap();
        let plan = solver.device_plan().unwrap();
        let caps = solver.caps().unwrap();
        let lengths = DeviceLengths::of(&plan, &caps);
        worst = worst.max(lengths.bytes_per_particle());
    }
    eprintln!("device memory per particle: {worst:.0} bytes");
    assert!(worst <= 1024.0, "{worst} bytes per particle");
}

/// A device for a distributed evaluation's passes: the whole pass sequence under the
/// emulation (harness "fmm"). With `payload`, it moves the LET payload itself as a GPU does
/// (`GpuFmm`): its sends gathered by the kernels (harness "payload"), the messages through
/// the host's communicator, landed in the plan's places for them.
struct Emulated {
    payload: bool,
}

impl leapfmm::fmm::backend::DevicePasses for Emulated {
    fn run_passes(
        &mut self,
        plan: &leapfmm::fmm::backend::DevicePlan,
        _caps: &leapfmm::fmm::caps::Caps,
        softening: Softening,
        g: f64,
    ) -> Result<leapfmm::fmm::backend::DeviceForces, leapfmm::gravity::GravityError> {
        let out = f64s(&run_harness("fmm", &fmm_input(plan, softening, g)));
        let (acc, pot) = out.split_at(3 * plan.own_particles);
        Ok(leapfmm::fmm::backend::DeviceForces {
            acc: acc.chunks_exact(3).map(|a| [a[0], a[1], a[2]]).collect(),
            pot: pot.to_vec(),
            seconds: Default::default(),
        })
    }

    fn moves_payload(&self) -> bool {
        self.payload
    }

    fn run_passes_with_payload(
        &mut self,
        plan: &leapfmm::fmm::backend::DevicePlan,
        caps: &leapfmm::fmm::caps::Caps,
        force: (Softening, f64),
        routes: &leapfmm::distributed::payload::PayloadRoutes,
        comm: &dyn leapfmm::distributed::comm::Communicator,
    ) -> Result<leapfmm::fmm::backend::DeviceForces, leapfmm::gravity::GravityError> {
        use leapfmm::gravity::GravityError;
        // The own multipoles first (the plan's are placeholders when the host left them).
        let mut multipoles = match plan.upward_on_device {
            true => f64s(&run_harness("upward", &fmm_input(plan, force.0, force.1))),
            false => plan.multipoles.expect("a distributed plan").to_vec(),
        };
        let mut pos = plan.pos.as_flattened().to_vec();
        let mut mass = plan.mass.to_vec();
        // Every rank's part gathered at once, as GpuFmm does, then cut into the messages.
        let (rows, particles) = (routes.send_cells.concat(), routes.send_particles.concat());
        let mut b = Vec::new();
        let n = plan.pos.len();
        let sizes = [
            rows.len(),
            plan.centre.len(),
            routes.len,
            particles.len(),
            n,
            64,
        ];
        u32_bytes(&mut b, &sizes.map(|v| v as u32));
        u32_bytes(&mut b, &rows);
        u32_bytes(&mut b, &particles);
        f64_bytes(&mut b, multipoles.iter().copied());
        f64_bytes(&mut b, pos.iter().copied());
        f64_bytes(&mut b, mass.iter().copied());
        let gathered = f64s(&run_harness("payload", &b));
        let (m, rest) = gathered.split_at(rows.len() * routes.len);
        let (x, q) = rest.split_at(3 * particles.len());
        let sends = (0..comm.size())
            .map(|j| {
                let values = routes.message(j, m, x, q);
                values.iter().flat_map(|v| v.to_le_bytes()).collect()
            })
            .collect();
        let received = comm
            .alltoall_bytes(sends)
            .map_err(|e| GravityError::Communication(e.to_string()))?;
        for (j, bytes) in received.iter().enumerate() {
            routes
                .land(j, &f64s(bytes), &mut multipoles, &mut pos, &mut mass)
                .map_err(GravityError::Communication)?;
        }
        let pos: Vec<[f64; 3]> = pos.chunks_exact(3).map(|x| [x[0], x[1], x[2]]).collect();
        let landed = leapfmm::fmm::backend::DevicePlan {
            pos: &pos,
            mass: &mass,
            multipoles: Some(&multipoles),
            upward_on_device: false,
            ..plan.clone()
        };
        self.run_passes(&landed, caps, force.0, force.1)
    }
}

/// The larger of the relative differences of `b`'s acceleration and potential from `a`'s.
fn relative_difference(a: ([f64; 3], f64), b: ([f64; 3], f64)) -> f64 {
    let ((x, p), (y, q)) = (a, b);
    let norm = (x[0] * x[0] + x[1] * x[1] + x[2] * x[2]).sqrt();
    let d = (0..3).map(|c| (x[c] - y[c]).powi(2)).sum::<f64>().sqrt();
    (d / norm).max(((q - p) / p).abs())
}

/// Forces of `particles` from `settings` on three thread ranks with their passes on
/// `device` (each rank starts from its third in the input order), and each rank's figures.
fn on_three_emulated_ranks(
    particles: &leapfmm::particles::Particles,
    settings: &leapfmm::fmm::solver::FmmSettings,
    payload: bool,
) -> Vec<(
    leapfmm::particles::Particles,
    leapfmm::distributed::stats::RankStats,
)> {
    use leapfmm::distributed::comm::{Communicator, ThreadRank, run_thread_ranks};
    use leapfmm::distributed::driver::DistributedFmm;
    use leapfmm::fmm::solver::FmmSolver;
    let n = particles.len();
    let timeout = std::time::Duration::from_secs(600);
    run_thread_ranks(3, 1, timeout, |comm: &ThreadRank| {
        let (r, k) = (comm.rank(), comm.size());
        let mut mine = particles.slice(n * r / k..n * (r + 1) / k);
        let mut solver =
            DistributedFmm::new(comm.clone(), FmmSolver::new(settings.clone(), None), None)
                .with_device(Box::new(Emulated { payload }));
        let stats = solver.evaluate(&mut mine, None)?;
        Ok::<_, leapfmm::gravity::GravityError>((mine, stats))
    })
    .unwrap()
}

/// 6000 particles in a dense core and a diffuse envelope, and the FMM settings of the
/// distributed device tests with `near_field`.
fn distributed_cloud(
    near_field: leapfmm::fmm::p2p::NearFieldPrecision,
) -> (
    leapfmm::particles::Particles,
    leapfmm::fmm::solver::FmmSettings,
) {
    use leapfmm::fmm::caps::CapsPolicy;
    use leapfmm::fmm::solver::FmmSettings;
    use leapfmm::particles::{Component, Particles};
    let n = 6000;
    let mut rng = rand_pcg::Pcg64::seed_from_u64(23);
    let mut particles = Particles::with_capacity(n);
    for i in 0..n {
        let s = if i % 4 == 0 { 3.0 } else { 0.5 };
        let x = std::array::from_fn(|_| s * rng.random_range(-1.0f64..1.0).powi(3));
        let m = rng.random_range(0.5..1.5) / n as f64;
        particles.push(x, [0.0; 3], m, i as u64, Component::Generic);
    }
    let settings = FmmSettings {
        order: 5,
        theta: 0.6,
        accuracy: 0.0,
        leaf_size: 48,
        softening: Softening {
            kernel: SofteningKernel::Spline,
            epsilon: 0.01,
        },
        g: 1.0,
        near_field,
        caps_policy: CapsPolicy::default(),
    };
    (particles, settings)
}

#[test]
fn device_passes_on_three_ranks_give_the_cpu_distributed_forces() {
    // Each rank's plan carries the cells and particles the other ranks sent and every
    // multipole (the host computed them for the exchange): the device runs M2L, L2L, L2P and
    // P2P for its own particles over own and received sources. Same decomposition as the
    // CPU run (the first evaluation splits by count), so the forces must agree to the
    // near field's f32 rounding, whether the payload came through the host's exchange or
    // the devices moved it. The devices move exact positions, while the CPU ranks of a
    // mixed-precision run put their particles at the positions their compressed wire
    // carries (up to 2.4e-3 apart in the forces of close pairs here): that run compares
    // with the CPU ranks on the exact wire.
    use leapfmm::distributed::driver::evaluate_on_thread_ranks;
    use leapfmm::fmm::p2p::NearFieldPrecision;
    use leapfmm::fmm::solver::FmmSettings;
    let (particles, settings) = distributed_cloud(NearFieldPrecision::Mixed);
    let n = particles.len();
    let cpu = evaluate_on_thread_ranks(&particles, &settings, 3, 1, None, None).unwrap();
    let exact = FmmSettings {
        near_field: NearFieldPrecision::Double,
        ..settings.clone()
    };
    let cpu_exact = evaluate_on_thread_ranks(&particles, &exact, 3, 1, None, None).unwrap();
    for payload in [false, true] {
        let cpu = if payload { &cpu_exact } else { &cpu };
        let mut worst: f64 = 0.0;
        let mut seen = 0;
        for (mine, stats) in &on_three_emulated_ranks(&particles, &settings, payload) {
            assert!(
                stats.let_cells > 0 && stats.let_particles > 0,
                "rank received nothing"
            );
            for i in 0..mine.len() {
                let k = mine.id[i] as usize;
                let d = relative_difference((cpu.acc[k], cpu.pot[k]), (mine.acc[i], mine.pot[i]));
                worst = worst.max(d);
                seen += 1;
            }
        }
        assert_eq!(seen, n);
        eprintln!(
            "device passes on 3 ranks (payload moved by the devices: {payload}) vs the CPU's: worst relative difference {worst:.2e}"
        );
        assert!(worst < 1e-5, "{worst:.2e}");
    }
}

#[test]
fn a_payload_the_devices_move_gives_the_host_exchanges_forces() {
    // With f64 on the host's wire the plans differ only in their multipoles: the host's
    // upward pass made them there, each rank's device's P2M and M2M (the kernels under the
    // emulation) here, on both sides of every exchange, which agree to rounding. The
    // positions and masses are the same bits.
    use leapfmm::fmm::p2p::NearFieldPrecision;
    let (particles, settings) = distributed_cloud(NearFieldPrecision::Double);
    let host = on_three_emulated_ranks(&particles, &settings, false);
    let device = on_three_emulated_ranks(&particles, &settings, true);
    let mut worst: f64 = 0.0;
    for ((a, sa), (b, sb)) in host.iter().zip(&device) {
        assert_eq!(a.id, b.id);
        for i in 0..a.len() {
            let d = relative_difference((a.acc[i], a.pot[i]), (b.acc[i], b.pot[i]));
            worst = worst.max(d);
        }
        assert_eq!(
            (sa.let_cells, sa.let_particles),
            (sb.let_cells, sb.let_particles)
        );
        assert!(sa.let_cells > 0 && sa.let_particles > 0);
        eprintln!(
            "LET bytes received: {} through the host's exchange; {} through the host and {} from the devices when they move the payload",
            sa.let_bytes_received, sb.let_bytes_received, sb.payload_bytes_received
        );
        assert_eq!(sa.payload_bytes_received, 0);
        assert!(sb.let_bytes_received < sa.let_bytes_received / 5);
    }
    eprintln!("devices' payload vs the host's exchange: worst relative difference {worst:.2e}");
    assert!(worst < 1e-12, "{worst:.2e}");
}

#[test]
fn a_rank_without_particles_takes_part_when_the_devices_move_the_payload() {
    // Two particles on three ranks: one rank has none, sends nothing and receives nothing,
    // but joins every exchange; the two particles get the CPU ranks' forces.
    use leapfmm::distributed::comm::{Communicator, ThreadRank, run_thread_ranks};
    use leapfmm::distributed::driver::{DistributedFmm, evaluate_on_thread_ranks};
    use leapfmm::fmm::p2p::NearFieldPrecision;
    use leapfmm::fmm::solver::FmmSolver;
    let (particles, settings) = distributed_cloud(NearFieldPrecision::Mixed);
    let two = particles.slice(0..2);
    let cpu = evaluate_on_thread_ranks(&two, &settings, 3, 1, None, None).unwrap();
    let timeout = std::time::Duration::from_secs(60);
    let per_rank = run_thread_ranks(3, 1, timeout, |comm: &ThreadRank| {
        let (r, k) = (comm.rank(), comm.size());
        let mut mine = two.slice(2 * r / k..2 * (r + 1) / k);
        let mut solver =
            DistributedFmm::new(comm.clone(), FmmSolver::new(settings.clone(), None), None)
                .with_device(Box::new(Emulated { payload: true }));
        solver.evaluate(&mut mine, None)?;
        Ok::<_, leapfmm::gravity::GravityError>(mine)
    })
    .unwrap();
    assert_eq!(per_rank.iter().filter(|p| p.is_empty()).count(), 1);
    for mine in &per_rank {
        for i in 0..mine.len() {
            let k = mine.id[i] as usize;
            let (a, b) = (cpu.acc[k], mine.acc[i]);
            for c in 0..3 {
                assert!((a[c] - b[c]).abs() <= 1e-5 * a[c].abs(), "{a:?} vs {b:?}");
            }
        }
    }
}

#[test]
fn device_split_is_the_hosts_and_its_sums_catch_a_bad_sort() {
    // A clustered cloud with coincident particles (runs of equal keys, leaves at the deepest
    // level) and a lone far particle, split with several leaf sizes and block shapes.
    use leapfmm::fmm::tree::{SortedParticles, Tree};
    let n = 5000usize;
    let mut rng = rand_pcg::Pcg64::seed_from_u64(11);
    let mut pos = clump(&mut rng, n, 4, 10.0, 0.1);
    for i in 0..40 {
        pos[100 + i] = pos[99];
    }
    pos[n - 1] = [300.0, -200.0, 50.0];
    let cube = Tree::bounding_cube(&pos);
    let mut order: Vec<u32> = (0..n as u32).collect();
    order.sort_by_key(|&i| cube.key(pos[i as usize]));
    let keys: Vec<u64> = order.iter().map(|&i| cube.key(pos[i as usize])).collect();
    let equal = keys.windows(2).filter(|w| w[0] == w[1]).count() as u64;
    assert!(equal >= 39);
    let id: Vec<u64> = (0..n as u64).collect();
    for (leaf_size, block, scan_blocks) in [(1, 32, 1), (4, 128, 3), (64, 32, 40)] {
        let mut tree = Tree::default();
        let mut sorted = SortedParticles {
            cube: Some(cube),
            keys: keys.clone(),
            order: order.clone(),
            ..SortedParticles::default()
        };
        tree.adopt_sorted(&mut sorted, &id).unwrap();
        tree.build_cells(leaf_size, usize::MAX).unwrap();
        let (summary, columns) = emulated_split(&keys, &order, leaf_size, block, scan_blocks);
        assert_eq!(columns, tree.cell_columns(), "leaf size {leaf_size}");
        let (m, last) = (n as u128, n as u128 - 1);
        assert_eq!(
            summary,
            leapfmm::fmm::tree::SortSummary {
                out_of_order: 0,
                equal_neighbours: equal,
                largest: n as u64 - 1,
                sum: (m * last / 2) as u64,
                squares: (last * m * (2 * last + 1) / 6) as u64,
            }
        );
        let mut adopted = Tree::default();
        adopted
            .adopt_cells(cube, n, &columns, leaf_size)
            .expect("the device's cells pass the host's checks");
        assert_eq!(adopted.cells, tree.cells);
        assert_eq!(adopted.leaves, tree.leaves);
    }
    // A sort that wrote one index twice, or swapped two keys, shows in the sums.
    let mut twice = order.clone();
    twice[17] = twice[18];
    let (summary, _) = emulated_split(&keys, &twice, 8, 64, 3);
    assert!(summary.check(n).is_err());
    let mut swapped = keys.clone();
    swapped.swap(10, 4000);
    let (summary, _) = emulated_split(&swapped, &order, 8, 64, 3);
    assert_eq!(summary.out_of_order, 2);
    let equal = swapped.windows(2).filter(|w| w[0] == w[1]).count() as u64;
    assert_eq!(summary.equal_neighbours, equal);
    assert!(summary.check(n).is_err());
}

#[test]
fn a_plan_from_the_devices_split_is_the_hosts_plan() {
    // Particles sorted, split, measured and walked by the device (kernels/keys.cu's order,
    // split.cu, moments.cu and walk.cu under the emulation): the host gets only the cells,
    // and its plan (retries for more cells included) is the one it makes from the positions.
    use leapfmm::fmm::tree::Tree;
    let n = 3000usize;
    let mut rng = rand_pcg::Pcg64::seed_from_u64(23);
    let pos = clump(&mut rng, n, 2, 10.0, 0.3);
    let mass: Vec<f64> = (0..n).map(|_| rng.random_range(0.5..1.5)).collect();
    let id: Vec<u64> = (0..n as u64).map(|i| 7 * i + 3).collect();
    let cube = Tree::bounding_cube(&pos);
    let mut index: Vec<u32> = (0..n as u32).collect();
    index.sort_by_key(|&i| cube.key(pos[i as usize]));
    let sorted_keys: Vec<u64> = index.iter().map(|&i| cube.key(pos[i as usize])).collect();
    assert!(
        sorted_keys.windows(2).all(|w| w[0] < w[1]),
        "no equal keys (this emulated device leaves their runs as sorted)"
    );
    let (mut a, mut b) = two_solvers_with_small_caps();
    let mut device = EmulatedDevice {
        pos: &pos,
        mass: &mass,
        sorter_order: index.clone(),
        sorted_keys,
        cube: Some(cube),
        reordered: Vec::new(),
        walk: true,
        walked: None,
        moments: Vec::new(),
        downloads: 0,
    };
    let stats = a.plan_split(&id, &mut device, false).unwrap();
    assert!(stats.retries >= 2, "{} retries", stats.retries);
    assert_eq!(device.reordered, [false]);
    b.plan_with(&pos, &mass, &id, Default::default()).unwrap();
    let (pa, pb) = (a.device_plan().unwrap(), b.device_plan().unwrap());
    assert!(pa.order_of.is_empty() && pa.pos.is_empty() && pa.leaf_of.is_empty());
    assert_eq!(pb.order_of, index.as_slice());
    assert_eq!(pa.particles(), n);
    // The device walked: its moments stayed there, and are the host's.
    assert_eq!(device.downloads, 0);
    assert!(pa.moments_on_device);
    assert_eq!(centres(&device.moments), pb.centre);
    assert_eq!((&pa.begin, &pa.end), (&pb.begin, &pb.end));
    assert_eq!((&pa.first_child, &pa.parent), (&pb.first_child, &pb.parent));
    assert_eq!(pa.leaves, pb.leaves);
    assert_eq!(pa.level_start, pb.level_start);
    assert_eq!(pa.p2p_interactions(), pb.p2p_interactions());
    let walked = device.walked.take().expect("the device walked");
    assert_walked_lists_are_the_plans(&walked, &pb);
    assert_eq!(
        (stats.used.cells, stats.used.m2l_pairs, stats.used.p2p_pairs),
        (pb.centre.len(), pb.m2l_sources.len(), pb.p2p_sources.len())
    );
    // A sort that is not one is refused as such (the GPU solver then sorts on the host).
    device.sorter_order[5] = device.sorter_order[6];
    assert!(matches!(
        a.plan_split(&id, &mut device, false),
        Err(leapfmm::gravity::GravityError::NotSorted(_))
    ));
}
