"""accelerations() and direct() against an independent numpy direct sum, input forms,
targets, per-particle softening, and the command line's bits."""

import os
import pathlib
import subprocess

import h5py
import numpy as np
import pytest

import leapfmm
from conftest import ROOT, numpy_direct, plummer, relative_errors


def test_fmm_matches_a_numpy_direct_sum(sphere):
    pos, _, mass = sphere
    ref, ref_pot = numpy_direct(pos, mass)
    acc, pot = leapfmm.accelerations(pos, mass, accuracy=1e-4)
    err = relative_errors(acc, ref)
    # The accuracy target holds in the tail: p99 within it, the largest within 10x.
    assert np.percentile(err, 99) <= 1e-4, np.percentile(err, 99)
    assert err.max() <= 1e-3, err.max()
    assert np.abs(pot / ref_pot - 1).max() <= 1e-4


def test_direct_is_the_numpy_sum_to_rounding(sphere):
    pos, _, mass = sphere
    ref, ref_pot = numpy_direct(pos, mass, eps=0.05)
    acc, pot = leapfmm.direct(pos, mass, softening=0.05, kernel="plummer")
    assert relative_errors(acc, ref).max() < 1e-12
    assert np.abs(pot / ref_pot - 1).max() < 1e-12


def test_float32_and_fortran_inputs_give_the_float64_c_bits(sphere):
    pos, _, mass = sphere
    pos32 = pos.astype(np.float32)
    a, p = leapfmm.accelerations(pos32.astype(np.float64), mass, softening=0.01)
    b, q = leapfmm.accelerations(np.asfortranarray(pos32), list(mass), softening=0.01)
    c = leapfmm.accelerations(pos32, mass, softening=0.01, return_potential=False)
    assert a.dtype == np.float64 and a.shape == (len(pos), 3) and p.shape == (len(pos),)
    assert np.array_equal(a, b) and np.array_equal(p, q) and np.array_equal(a, c)


def test_any_thread_count_gives_the_same_bits(sphere):
    pos, _, mass = sphere
    one = leapfmm.accelerations(pos, mass, softening=0.01, threads=1)
    two = leapfmm.accelerations(pos, mass, softening=0.01, threads=2)
    assert np.array_equal(one[0], two[0]) and np.array_equal(one[1], two[1])


def test_targets_are_the_field_at_other_points(sphere):
    pos, _, mass = sphere
    rng = np.random.default_rng(7)
    points = rng.normal(size=(300, 3)) * 3.0
    points[:5] = pos[:5]  # a point on a particle feels every particle but that one's force
    ref, ref_pot = numpy_direct(pos, mass, targets=points, eps=0.0)
    acc, pot = leapfmm.accelerations(pos, mass, targets=points, accuracy=1e-5)
    assert acc.shape == (300, 3) and pot.shape == (300,)
    assert relative_errors(acc, ref).max() < 1e-4
    # The potential of a point on a particle: the FMM skips the zero-separation pair.
    assert np.abs(pot[5:] / ref_pot[5:] - 1).max() < 1e-5
    d_acc, _ = leapfmm.direct(pos, mass, targets=points)
    assert relative_errors(d_acc, ref).max() < 1e-12


def test_per_particle_softening(sphere):
    pos, _, mass = sphere
    eps = np.where(np.arange(len(pos)) % 2 == 0, 0.02, 0.2)
    # The spline: Newtonian beyond 2.8 ε, where the expansions take over.
    ref, _ = leapfmm.direct(pos, mass, softening=eps)
    acc, _ = leapfmm.accelerations(pos, mass, softening=eps, accuracy=1e-4)
    assert relative_errors(acc, ref).max() < 1e-3
    one, _ = leapfmm.direct(pos, mass, softening=0.2)
    # The softening lengths matter: the mixed set is not the all-0.2 one.
    assert relative_errors(one, ref).max() > 1e-2


def _binary():
    path = os.environ.get("LEAPFMM_BIN", str(ROOT / "target" / "release" / "leapfmm"))
    if not pathlib.Path(path).is_file():
        pytest.fail(f"the leapfmm binary is not at {path}: build it (cargo build --release) or set LEAPFMM_BIN")
    return path


def test_same_bits_as_the_command_line(tmp_path):
    pos, vel, mass = plummer(20000, seed=4)
    sim = leapfmm.Simulation(pos, vel, mass, softening=0.01, units="galactic", dt=1e-3)
    sim.save(tmp_path / "s.hdf5")
    for accuracy in (0.0, 1e-3):
        out = tmp_path / f"f{accuracy}.hdf5"
        subprocess.run(
            [_binary(), "forces", str(tmp_path / "s.hdf5"), "-o", str(out), "--accuracy", str(accuracy)],
            check=True, capture_output=True,
        )
        with h5py.File(out) as f:
            g = f["PartType4"]
            order = np.argsort(g["ParticleIDs"][:])
            cli_acc = g["Acceleration"][:][order]
            cli_pot = g["Potential"][:][order]
            assert g["Acceleration"].dtype == np.float64
        acc, pot = leapfmm.accelerations(pos, mass, softening=0.01, G=leapfmm.GALACTIC_G, accuracy=accuracy)
        assert np.array_equal(acc, cli_acc), accuracy
        assert np.array_equal(pot, cli_pot), accuracy
