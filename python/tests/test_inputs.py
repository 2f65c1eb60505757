"""Every bad input raises ValueError or TypeError with one sentence naming the argument;
no Rust panic crosses into Python."""

import numpy as np
import pytest

import leapfmm

POS = np.random.default_rng(0).normal(size=(50, 3))
MASS = np.full(50, 0.02)


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        (dict(pos=np.zeros((50, 2))), ValueError, "pos must have shape (n, 3)"),
        (dict(pos=np.zeros(150)), ValueError, "pos must have shape (n, 3)"),
        (dict(pos=np.array([["a", "b", "c"]] * 50)), TypeError, "pos must hold real numbers"),
        (dict(pos=np.zeros((0, 3)), mass=np.zeros(0)), ValueError, "pos holds no particles"),
        (dict(mass=np.full(49, 0.02)), ValueError, "mass must be a scalar or have shape (50,)"),
        (dict(mass=-MASS), ValueError, "mass[0] = -0.02 must be finite and >= 0"),
        (dict(mass=np.where(np.arange(50) == 7, np.nan, MASS)), ValueError, "mass[7] = nan"),
        (dict(softening=-1.0), ValueError, "softening = -1.0 must be in"),
        (dict(softening=np.full(49, 0.1)), ValueError, "softening must be a scalar or have shape (50,)"),
        (dict(softening="0.1"), TypeError, "softening must be a number"),
        (dict(kernel="gauss"), ValueError, "kernel must be 'spline' or 'plummer'"),
        (dict(G=0.0), ValueError, "G = 0.0 must be in"),
        (dict(accuracy=1.5), ValueError, "accuracy = 1.5 must be in"),
        (dict(theta=1.0), ValueError, "theta = 1.0 must be in"),
        (dict(order=0), ValueError, "order = 0 must be between 1 and 12"),
        (dict(order=2.5), TypeError, "order must be an integer"),
        (dict(leaf_size=0), ValueError, "leaf_size = 0 must be between"),
        (dict(threads=0), ValueError, "threads = 0 must be between"),
        (dict(backend="tpu"), ValueError, "backend must be 'auto' or 'cpu'"),
        (dict(targets=np.zeros((4, 4))), ValueError, "targets must have shape (n, 3)"),
        (dict(colour="red"), TypeError, "colour"),
    ],
)
def test_bad_force_inputs_are_named(kwargs, error, words):
    args = dict(pos=POS, mass=MASS)
    args.update(kwargs)
    pos, mass = args.pop("pos"), args.pop("mass")
    with pytest.raises(error) as e:
        leapfmm.accelerations(pos, mass, **args)
    assert words in str(e.value)


@pytest.mark.parametrize("value, index", [(np.nan, 3), (np.inf, 9), (-np.inf, 0)])
def test_non_finite_positions_are_named(value, index):
    pos = POS.copy()
    pos[index, 1] = value
    for f in (leapfmm.accelerations, leapfmm.direct):
        with pytest.raises(ValueError, match=rf"pos\[{index}\] is not finite"):
            f(pos, MASS)


def test_positions_beyond_the_expansions_range_are_a_value_error():
    pos = POS.copy()
    pos[4] = [1e16, 0, 0]
    with pytest.raises(ValueError, match="beyond"):
        leapfmm.accelerations(pos, MASS)


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        (dict(vel=np.zeros((49, 3))), ValueError, "vel has 49 rows but pos has 50"),
        (dict(mass=np.zeros(50)), ValueError, "mass[0] = 0.0 must be finite and > 0"),
        (dict(units="cgs"), ValueError, "units must be 'galactic' or 'nbody'"),
        (dict(scheme="leapfrog"), ValueError, "scheme must be 'global' or 'block'"),
        (dict(scheme="block"), ValueError, "scheme='block' needs eta"),
        (dict(scheme="block", dt=None, eta=0.2, dt_max=0.1, max_rungs=41), ValueError, "max_rungs = 41"),
        (dict(dt=None, eta=None), ValueError, "give exactly one of dt"),
        (dict(dt=0.1, eta=0.1), ValueError, "give exactly one of dt"),
        (dict(dt=-0.1), ValueError, "dt = -0.1 must be in"),
        (dict(dt=None, eta=0.2, softening=0.0), ValueError, "eta needs a softening length"),
        (dict(timestep=0.1), TypeError, "timestep"),
    ],
)
def test_bad_simulation_inputs_are_named(kwargs, error, words):
    args = dict(pos=POS, vel=np.zeros((50, 3)), mass=MASS, softening=0.01, units="nbody", dt=0.01)
    args.update(kwargs)
    with pytest.raises(error) as e:
        leapfmm.Simulation(**args)
    assert words in str(e.value)


def test_bad_files_are_value_errors(tmp_path):
    with pytest.raises(ValueError, match="nothing.hdf5"):
        leapfmm.load(tmp_path / "nothing.hdf5")
    (tmp_path / "bad.toml").write_text("[disk]\nmass = -1\n")
    with pytest.raises(ValueError, match="bad.toml"):
        leapfmm.ics(tmp_path / "bad.toml", n=100)
    (tmp_path / "bad.ckpt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="not a leapfmm checkpoint"):
        leapfmm.Simulation.from_checkpoint(tmp_path / "bad.ckpt")
    with pytest.raises(ValueError, match="run.toml"):
        leapfmm.run(tmp_path / "run.toml")


def test_a_rust_panic_is_a_runtime_error():
    with pytest.raises(RuntimeError, match="internal error"):
        leapfmm._native._panic_for_tests()
