"""How the module behaves as a library: the GIL released during evaluations, no memory
growth over many calls, initial conditions, whole runs and the type stubs."""

import gc
import pathlib
import threading
import time

import numpy as np
import pytest

import leapfmm
from conftest import ROOT


# A run of 10 steps of 3 000 particles.
TINY = """name = "{name}"
output_dir = "{out}"
seed = 1
units = "galactic"

[ics]
model = "{model}"
n = 3000

[gravity]
softening = 0.05

[integrator]
t_end = 0.01
dt_max = 0.001
fixed_step = true

[output]
snapshot_interval = 0.005
checkpoint_interval = 0.01
"""


def _rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 1e6


def test_the_gil_is_released_during_an_evaluation_of_a_million():
    rng = np.random.default_rng(5)
    pos = rng.normal(size=(1_000_000, 3))
    mass = np.full(len(pos), 1e-6)
    ticks = []
    done = threading.Event()

    def tick():
        while not done.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.01)

    t = threading.Thread(target=tick)
    t.start()
    start = time.monotonic()
    leapfmm.accelerations(pos, mass, softening=0.001)
    end = time.monotonic()
    done.set()
    t.join()
    during = [x for x in ticks if start < x < end]
    # Ticks every ~10 ms all through the evaluation (a held GIL: none between start and
    # end); a quarter of them leaves room for a busy machine's scheduling.
    assert end - start > 0.2
    assert len(during) >= 0.25 * (end - start) / 0.01, (len(during), end - start)


def test_no_memory_growth_over_a_thousand_calls():
    rng = np.random.default_rng(6)
    pos, mass = rng.normal(size=(2000, 3)), np.full(2000, 5e-4)
    for _ in range(50):
        leapfmm.accelerations(pos, mass, softening=0.01)
    gc.collect()
    before = _rss_mb()
    for _ in range(1000):
        acc, pot = leapfmm.accelerations(pos, mass, softening=0.01)
    gc.collect()
    grown = _rss_mb() - before
    # One call's arrays and solver are ~1 MB; a leak of them would be ~1 GB over 1000 calls.
    assert grown < 20, grown


def test_ics_are_the_command_lines_model(tmp_path):
    d = leapfmm.ics(ROOT / "ics" / "small_disk.toml", n=6000, seed=9)
    assert d["pos"].shape == (6000, 3) and d["vel"].shape == (6000, 3)
    assert set(np.unique(d["component"])) <= {0, 1, 2}
    # Centred in position and velocity (the sampler's own guarantee).
    com = (d["mass"][:, None] * d["pos"]).sum(0) / d["mass"].sum()
    assert np.abs(com).max() < 1e-9
    again = leapfmm.ics(ROOT / "ics" / "small_disk.toml", n=6000, seed=9)
    assert np.array_equal(again["pos"], d["pos"])
    other = leapfmm.ics(ROOT / "ics" / "small_disk.toml", n=6000, seed=10)
    assert not np.array_equal(other["pos"], d["pos"])


def test_run_runs_a_toml_config_and_resumes(tmp_path):
    config = tmp_path / "tiny.toml"
    config.write_text(TINY.format(name="tiny", out=tmp_path, model=ROOT / "ics" / "small_disk.toml"))
    line = leapfmm.run(config, quiet=True)
    assert line.endswith("tiny: finished at t = 0.01 after 10 steps"), line
    snaps = sorted((tmp_path / "tiny" / "snapshots").glob("snap_*.hdf5"))
    assert len(snaps) == 3
    last = leapfmm.load(snaps[-1])
    assert last["time"] == pytest.approx(0.01) and len(last["pos"]) == 3000
    assert "already finished at t = 0.01" in leapfmm.run(config, quiet=True)


def test_run_shows_a_tqdm_bar_off_a_terminal(tmp_path, capsys):
    config = tmp_path / "bar.toml"
    config.write_text(TINY.format(name="bar", out=tmp_path, model=ROOT / "ics" / "small_disk.toml"))
    line = leapfmm.run(config, progress=True)
    assert "finished at t = 0.01" in line
    err = capsys.readouterr().err
    # The bar ends at the run's end time (0.01), full.
    assert "100%" in err and "t = 0.01 of 0.01" in err, err[-300:]


def test_the_package_has_stubs_and_docstrings():
    pkg = pathlib.Path(leapfmm.__file__).parent
    assert (pkg / "py.typed").is_file() and (pkg / "_native.pyi").is_file()
    for f in (leapfmm.accelerations, leapfmm.direct, leapfmm.run, leapfmm.ics, leapfmm.load, leapfmm.Simulation):
        assert f.__doc__ and len(f.__doc__) > 60, f


def test_ctrl_c_stops_a_run_at_a_checkpoint_and_it_resumes(tmp_path):
    import _thread

    config = tmp_path / "long.toml"
    text = TINY.format(name="long", out=tmp_path, model=ROOT / "ics" / "small_disk.toml")
    config.write_text(text.replace("t_end = 0.01", "t_end = 0.5"))
    threading.Timer(1.0, _thread.interrupt_main).start()
    with pytest.raises(KeyboardInterrupt, match="stopped at t = .*checkpoint"):
        leapfmm.run(config, quiet=True)
    checkpoints = list((tmp_path / "long" / "checkpoints").glob("*.ckpt"))
    assert checkpoints, "the stop writes a checkpoint"
    # The interpreter is still here (no handler of the run's ended it), and the run goes on.
    assert "finished at t = 0.5" in leapfmm.run(config, quiet=True)
    last = leapfmm.load(sorted((tmp_path / "long" / "snapshots").glob("snap_*.hdf5"))[-1])
    assert last["time"] == pytest.approx(0.5)


def test_the_extension_needs_no_system_hdf5():
    import shutil
    import subprocess

    from leapfmm import _native

    if shutil.which("ldd") is None:
        pytest.fail("ldd is needed to read the extension's dynamic dependencies")
    libs = subprocess.run(["ldd", _native.__file__], capture_output=True, text=True, check=True).stdout
    # HDF5 is linked in (hdf5-metno's `static` feature): no libhdf5 among the dependencies.
    assert "libhdf5" not in libs and "not found" not in libs, libs
