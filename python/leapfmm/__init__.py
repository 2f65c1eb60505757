"""leapfmm from Python: FMM forces of numpy arrays, simulations kept in Rust, initial
conditions, snapshots, and whole TOML runs.

The numbers come from the same Rust crate as the ``leapfmm`` command line (the extension
module ``leapfmm._native``); this module checks the arguments and converts them: positions
may be float32 or float64, C- or Fortran-ordered (copied only when they are not C-ordered
float64 already).

Units: ``units="galactic"`` is kpc, km/s and 1e10 Msun (G = 43009.17, one time unit
= 0.9778 Gyr); ``units="nbody"`` is G = 1. ``accelerations`` and ``direct`` take ``G``
directly (default 1).

Example::

    import numpy as np, leapfmm
    rng = np.random.default_rng(1)
    pos, mass = rng.normal(size=(100_000, 3)), np.full(100_000, 1e-5)
    acc, pot = leapfmm.accelerations(pos, mass, softening=0.01)
    ref, _ = leapfmm.direct(pos[:100], mass, softening=0.01, targets=pos[:100])
"""

from __future__ import annotations

import csv
import math
import numbers
import os
import sys
import threading
from typing import Optional, Tuple, Union

import numpy as np

from . import _native

__all__ = [
    "accelerations",
    "direct",
    "Simulation",
    "run",
    "ics",
    "load",
    "GALACTIC_G",
    "MYR_PER_TIME_UNIT",
]

__version__ = _native.__version__

#: G in galactic units (kpc, km/s, 1e10 Msun), as the command line uses it.
GALACTIC_G = 43009.17
#: One galactic time unit (kpc / (km/s)) in Myr.
MYR_PER_TIME_UNIT = 977.79222

# Defaults of the command line (`leapfmm forces`): the accuracy target 1e-3 (p = 9, θ at
# most 0.75; accuracy 0: the geometric MAC at θ = 0.75, p = 7), leaves of 128 particles.
_ACCURACY = 1e-3
_THETA = 0.75
_LEAF_SIZE = 128
# Positions beyond this (in any unit) overflow an expansion (leapfmm::gravity::MAX_COORDINATE).
_MAX_COORDINATE = 1e15


def _vectors(name: str, a, n: Optional[int] = None, *, place: bool = False) -> np.ndarray:
    """An (n, 3) C-ordered float64 array of finite values, copied only where needed (a
    ``place`` within the expansions' range, |x| <= 1e15)."""
    try:
        arr = np.asarray(a)
    except Exception as e:  # an object numpy cannot read
        raise TypeError(f"{name} must be an array of shape (n, 3), not {type(a).__name__}") from e
    if arr.dtype.kind not in "fiu":
        raise TypeError(f"{name} must hold real numbers, not {arr.dtype}")
    if arr.ndim != 2 or arr.shape[1] != 3:
        raise ValueError(f"{name} must have shape (n, 3), not {arr.shape}")
    if n is not None and arr.shape[0] != n:
        raise ValueError(f"{name} has {arr.shape[0]} rows but pos has {n}")
    arr = np.ascontiguousarray(arr, dtype=np.float64)
    if not np.isfinite(arr).all():
        bad = int(np.argwhere(~np.isfinite(arr))[0][0])
        raise ValueError(f"{name}[{bad}] is not finite ({arr[bad].tolist()})")
    if place and arr.size and np.abs(arr).max() > _MAX_COORDINATE:
        bad = int(np.argwhere(np.abs(arr) > _MAX_COORDINATE)[0][0])
        raise ValueError(
            f"{name}[{bad}] = {arr[bad].tolist()} is beyond |x| = 1e15, where the expansions overflow"
        )
    return arr


def _scalars(name: str, a, n: int, *, positive: bool = False) -> np.ndarray:
    """A length-n float64 array (a scalar is broadcast) of finite values >= 0 (> 0)."""
    arr = np.asarray(a)
    if arr.dtype.kind not in "fiu":
        raise TypeError(f"{name} must hold real numbers, not {arr.dtype}")
    if arr.ndim == 0:
        arr = np.full(n, float(arr))
    if arr.ndim != 1 or arr.shape[0] != n:
        raise ValueError(f"{name} must be a scalar or have shape ({n},), not {arr.shape}")
    arr = np.ascontiguousarray(arr, dtype=np.float64)
    bad = ~np.isfinite(arr) | (arr <= 0 if positive else arr < 0)
    if bad.any():
        i = int(np.argmax(bad))
        need = "finite and > 0" if positive else "finite and >= 0"
        raise ValueError(f"{name}[{i}] = {arr[i]} must be {need}")
    return arr


def _number(name: str, v, *, low: float = 0.0, high: float = math.inf, open_low=False, open_high=False) -> float:
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise TypeError(f"{name} must be a number, not {type(v).__name__}")
    v = float(v)
    below = v <= low if open_low else v < low
    above = v >= high if open_high else v > high
    if not math.isfinite(v) or below or above:
        lo = "(" if open_low else "["
        hi = ")" if open_high else "]"
        raise ValueError(f"{name} = {v} must be in {lo}{low}, {high}{hi}")
    return v


def _count(name: str, v, *, low: int = 1, high: int = 1 << 30) -> Optional[int]:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise TypeError(f"{name} must be an integer, not {type(v).__name__}")
    if not low <= int(v) <= high:
        raise ValueError(f"{name} = {v} must be between {low} and {high}")
    return int(v)


def _kernel(kernel) -> str:
    if kernel not in ("spline", "plummer"):
        raise ValueError(f"kernel must be 'spline' or 'plummer', not {kernel!r}")
    return kernel


def _softening(softening, n: int) -> Tuple[float, Optional[np.ndarray]]:
    """(the one length, None) or (the largest, every particle's)."""
    if np.ndim(softening) == 0:
        return _number("softening", softening), None
    each = _scalars("softening", softening, n)
    return float(each.max(initial=0.0)), each


def accelerations(
    pos,
    mass,
    *,
    softening=0.0,
    kernel: str = "spline",
    G: float = 1.0,
    accuracy: float = _ACCURACY,
    theta: Optional[float] = None,
    order: Optional[int] = None,
    leaf_size: Optional[int] = None,
    threads: Optional[int] = None,
    backend: str = "auto",
    targets=None,
    return_potential: bool = True,
):
    """FMM accelerations (and potentials) of every particle from all the others.

    Parameters
    ----------
    pos : (n, 3) array, float32 or float64, C or Fortran order
        Positions.
    mass : (n,) array or scalar
        Masses (>= 0).
    softening : float or (n,) array
        Softening length ε (0: Newtonian); an array gives each particle its own, a pair
        using the larger of its two.
    kernel : "spline" or "plummer"
        Softening kernel: the cubic spline of support 2.8 ε (GADGET's convention: Newtonian
        beyond it) or Plummer's 1/sqrt(r² + ε²).
    G : float
        Gravitational constant (``leapfmm.GALACTIC_G`` for kpc, km/s, 1e10 Msun).
    accuracy : float
        Relative force error to aim for in every particle's force, the tail included
        (default 1e-3, as the command line's; 0: the geometric criterion of ``theta`` alone,
        faster where the tail does not matter).
    theta, order, leaf_size : expert overrides
        Opening angle (default 0.75), expansion order (9 with an accuracy target, 7 without), most
        particles per leaf (128).
    threads : int, optional
        Threads to use (default: all cores). The result has the same bits for any count.
    backend : "auto" or "cpu"
        Where the FMM runs; from Python the CPU today ("auto" means the CPU).
    targets : (m, 3) array, optional
        Compute the field at these points instead (from the particles; the points feel
        every particle, one at the same place included).
    return_potential : bool
        Return ``(acc, pot)`` (default) or ``acc`` alone.

    Returns
    -------
    acc : (n, 3) float64 array (or (m, 3) with ``targets``)
    pot : (n,) float64 array, G-scaled, a particle's own term excluded

    The same bits as ``leapfmm forces`` on the same particles and settings.
    """
    pos_c, mass_c, eps, each, at = _force_inputs(pos, mass, softening, targets)
    if backend not in ("auto", "cpu"):
        raise ValueError(f"backend must be 'auto' or 'cpu' from Python, not {backend!r}")
    accuracy = _number("accuracy", accuracy, high=1.0, open_high=True)
    theta = _THETA if theta is None else _number("theta", theta, open_low=True, high=1.0, open_high=True)
    order = _count("order", order, high=12)
    leaf = _count("leaf_size", leaf_size, high=65536) or _LEAF_SIZE
    threads = _count("threads", threads, high=4096)
    acc, pot = _native.fmm(
        pos_c, mass_c, eps, each, _kernel(kernel), _number("G", G, open_low=True),
        accuracy, theta, order, leaf, threads, at,
    )
    return (acc, pot) if return_potential else acc


def direct(
    pos,
    mass,
    *,
    softening=0.0,
    kernel: str = "spline",
    G: float = 1.0,
    threads: Optional[int] = None,
    targets=None,
    return_potential: bool = True,
):
    """Direct-summation accelerations (and potentials) in float64: the reference the FMM is
    measured against. Same arguments and results as ``accelerations``; O(n²) (or O(n m)
    with ``targets``)."""
    pos_c, mass_c, eps, each, at = _force_inputs(pos, mass, softening, targets)
    threads = _count("threads", threads, high=4096)
    acc, pot = _native.direct(
        pos_c, mass_c, eps, each, _kernel(kernel), _number("G", G, open_low=True), threads, at
    )
    return (acc, pot) if return_potential else acc


def _force_inputs(pos, mass, softening, targets):
    pos_c = _vectors("pos", pos, place=True)
    n = pos_c.shape[0]
    if n == 0:
        raise ValueError("pos holds no particles")
    mass_c = _scalars("mass", mass, n)
    eps, each = _softening(softening, n)
    at = None if targets is None else _vectors("targets", targets, place=True)
    return pos_c, mass_c, eps, each, at


class Simulation:
    """Particles advanced by leapfmm's kick-drift-kick leapfrog with FMM forces, their state
    kept in Rust between calls.

    Parameters
    ----------
    pos, vel : (n, 3) arrays
        Positions and velocities.
    mass : (n,) array or scalar
        Masses (> 0).
    softening : float
        Softening length ε (> 0 with ``eta``).
    units : "galactic" or "nbody"
        kpc, km/s, 1e10 Msun (G = 43009.17; times in units of 0.9778 Gyr) or G = 1.
    dt : float, optional
        Fixed step. Or:
    eta : float, optional
        Each step ``eta * sqrt(softening / max|a|)`` (at most ``dt_max``); with block steps
        each particle's own ``eta * sqrt(softening / |a|)``.
    scheme : "global" or "block"
        Every particle on the same step, or each on its own power-of-two fraction of
        ``dt_max`` (the command line's block scheme, down to ``dt_max / 2**max_rungs``;
        needs ``eta`` and ``dt_max``). A block "step" is one cycle: from one
        synchronisation point to the next (at most ``dt_max``), so ``evolve(t)`` stops at
        the first one at or after ``t``.
    accuracy, theta, order, leaf_size, kernel, threads
        As for ``accelerations``.
    caps_presets : path, optional
        A caps presets file (JSON) the FMM's buffer capacities start from and are recorded
        in, as a run's ``gravity.caps_presets``.

    The forces are evaluated once here; ``evolve(t)`` and ``step(n)`` advance, stopping
    between steps at Ctrl-C (``KeyboardInterrupt``, with the state intact). The FMM's
    buffer capacities carry over from step to step as in a run (``evaluations`` says how
    many retries were needed after the first evaluation: none, normally).
    """

    def __init__(
        self,
        pos,
        vel,
        mass,
        *,
        softening: float,
        units: str = "galactic",
        dt: Optional[float] = None,
        eta: Optional[float] = None,
        dt_max: Optional[float] = None,
        scheme: str = "global",
        accuracy: float = _ACCURACY,
        theta: Optional[float] = None,
        order: Optional[int] = None,
        leaf_size: Optional[int] = None,
        kernel: str = "spline",
        threads: Optional[int] = None,
        max_rungs: int = 16,
        caps_presets: Optional[Union[str, os.PathLike]] = None,
    ):
        pos_c = _vectors("pos", pos, place=True)
        n = pos_c.shape[0]
        if n == 0:
            raise ValueError("pos holds no particles")
        vel_c = _vectors("vel", vel, n)
        mass_c = _scalars("mass", mass, n, positive=True)
        if units not in ("galactic", "nbody"):
            raise ValueError(f"units must be 'galactic' or 'nbody', not {units!r}")
        if scheme not in ("global", "block"):
            raise ValueError(f"scheme must be 'global' or 'block', not {scheme!r}")
        eps = _number("softening", softening)
        if (dt is None) == (eta is None):
            raise ValueError("give exactly one of dt (a fixed step) and eta (steps from the accelerations)")
        dt = None if dt is None else _number("dt", dt, open_low=True)
        eta = None if eta is None else _number("eta", eta, open_low=True)
        if eta is not None and eps == 0:
            raise ValueError("eta needs a softening length > 0 (the step is eta sqrt(softening / |a|))")
        if scheme == "block" and (eta is None or dt_max is None):
            raise ValueError("scheme='block' needs eta (each particle's step) and dt_max (the longest step)")
        dt_max = math.inf if dt_max is None else _number("dt_max", dt_max, open_low=True)
        max_rungs = _count("max_rungs", max_rungs, high=40)
        g = GALACTIC_G if units == "galactic" else 1.0
        theta = _THETA if theta is None else _number("theta", theta, open_low=True, high=1.0, open_high=True)
        self._sim = _native.Simulation(
            pos_c, vel_c, mass_c, eps, _kernel(kernel), units, g, dt, eta, dt_max,
            _number("accuracy", accuracy, high=1.0, open_high=True), theta,
            _count("order", order, high=12), _count("leaf_size", leaf_size, high=65536) or _LEAF_SIZE,
            _count("threads", threads, high=4096), scheme, max_rungs,
            None if caps_presets is None else os.fspath(caps_presets),
        )

    @classmethod
    def from_checkpoint(cls, path: Union[str, os.PathLike], *, threads: Optional[int] = None) -> "Simulation":
        """A simulation continued from ``checkpoint(path)``: the next steps give the same
        bits as the original's would have."""
        self = cls.__new__(cls)
        self._sim = _native.Simulation.from_checkpoint(os.fspath(path), _count("threads", threads, high=4096))
        return self

    def evolve(self, t: float) -> "Simulation":
        """Advance to time ``t`` (the last step shortened to land on it)."""
        self._sim.evolve(_number("t", t, low=-math.inf))
        return self

    def step(self, n: int = 1) -> "Simulation":
        """Take ``n`` steps."""
        self._sim.step(_count("n", n, low=0, high=1 << 62))
        return self

    @property
    def time(self) -> float:
        """Current time (code units)."""
        return self._sim.time

    @property
    def steps(self) -> int:
        """Steps taken."""
        return self._sim.steps

    @property
    def positions(self) -> np.ndarray:
        """(n, 3) positions (a read-only copy)."""
        return _read_only(self._sim.positions)

    @property
    def velocities(self) -> np.ndarray:
        """(n, 3) velocities (a read-only copy)."""
        return _read_only(self._sim.velocities)

    @property
    def accelerations(self) -> np.ndarray:
        """(n, 3) accelerations at the current positions (a read-only copy)."""
        return _read_only(self._sim.forces_now[0])

    @property
    def potentials(self) -> np.ndarray:
        """(n,) potentials at the current positions (a read-only copy)."""
        return _read_only(self._sim.forces_now[1])

    @property
    def masses(self) -> np.ndarray:
        """(n,) masses (a read-only copy)."""
        return _read_only(self._sim.masses)

    @property
    def evaluations(self) -> Tuple[int, int]:
        """(force evaluations made, buffer-capacity retries after the first)."""
        return self._sim.evaluations

    @property
    def settings(self) -> dict:
        """The settings it steps with (units, G, softening, kernel, dt, eta, dt_max,
        accuracy, theta, order, leaf_size), as text."""
        return dict(self._sim.settings())

    def energy(self) -> dict:
        """Kinetic, potential and total energy, the relative error of the total since the
        start, momentum and angular momentum (about the origin)."""
        k, w, e, rel, p, l = self._sim.diagnostics()
        return {
            "kinetic": k,
            "potential": w,
            "total": e,
            "relative_error": rel,
            "momentum": np.array(p),
            "angular_momentum": np.array(l),
        }

    def save(self, path: Union[str, os.PathLike]) -> None:
        """Write a GADGET-format HDF5 snapshot (float64, with accelerations and potentials)
        that pynbody, yt and h5py read with the right units."""
        self._sim.save(os.fspath(path))

    def checkpoint(self, path: Union[str, os.PathLike]) -> None:
        """Write the whole state, bit for bit, for ``Simulation.from_checkpoint``."""
        self._sim.checkpoint(os.fspath(path))

    def __len__(self) -> int:
        return len(self._sim)

    def __repr__(self) -> str:
        return repr(self._sim)


def _read_only(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


def run(
    config: Union[str, os.PathLike],
    *,
    resume: bool = True,
    quiet: bool = False,
    ranks: int = 1,
    progress: Optional[bool] = None,
) -> str:
    """Run (or continue, with ``resume``) the run or campaign of a TOML file, exactly as
    ``leapfmm run CONFIG --resume`` does; returns a one-line summary. Ctrl-C (or any
    KeyboardInterrupt) stops it after its current step with a checkpoint and then raises
    ``KeyboardInterrupt``; call again to continue.

    Progress: on a terminal, the command line's bars; elsewhere (a notebook) a tqdm bar of
    the simulated time (of the runs done, for a campaign) when tqdm is installed. ``progress``
    True or False forces the tqdm bar on or off."""
    path = os.fspath(config)
    ranks = _count("ranks", ranks, high=1024)
    want_bar = progress if progress is not None else not quiet and not _on_terminal()
    bar = _progress_bar(path) if want_bar else None
    quiet = bool(quiet) or bar is not None
    return _run_on_worker(path, bool(resume), quiet, ranks, bar)


def _on_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def _progress_bar(path):
    """(tqdm bar, a function giving the progress so far) for the run of ``path``, or None
    without tqdm."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    kind, folder, total = _native.run_plan(path)
    if kind == "campaign":
        bar = tqdm(total=int(total), desc=os.path.basename(folder), unit="run")

        def done():
            # summary.csv is rewritten after every run: the runs with a status so far.
            try:
                with open(os.path.join(folder, "summary.csv"), newline="") as f:
                    return sum(1 for row in csv.DictReader(f) if row.get("status") != "not run")
            except (OSError, csv.Error):
                return 0

        return bar, done
    bar = tqdm(total=total, desc=os.path.basename(folder), unit="time unit",
               bar_format="{l_bar}{bar}| t = {n:.4g} of {total:.4g} [{elapsed}<{remaining}]")

    def time_reached():
        try:
            with open(os.path.join(folder, "diagnostics.csv"), "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 4096))
                last = f.read().splitlines()[-1].decode()
            return float(last.split(",")[1])
        except (OSError, IndexError, ValueError):
            return 0.0

    return bar, time_reached


def _run_on_worker(path, resume, quiet, ranks, bar):
    """``_native.run`` on a worker thread (it releases the GIL) while this one waits, moves
    the bar (``(tqdm bar, progress so far)`` or None) and turns a KeyboardInterrupt into a
    stop request: the run ends its step and writes a checkpoint before this returns."""
    outcome = {}
    stop = _native.RunStop()
    # An Event, not Thread.join: a join that a KeyboardInterrupt breaks can leave the
    # thread looking finished while it runs.
    done = threading.Event()

    def work():
        try:
            outcome["line"] = _native.run(path, resume, quiet, ranks, stop)
        except BaseException as e:  # handed to the caller's thread below
            outcome["error"] = e
        finally:
            done.set()

    worker = threading.Thread(target=work, name="leapfmm.run", daemon=True)
    worker.start()
    try:
        while not done.is_set():
            try:
                done.wait(0.25)
                if bar is not None:
                    bar[0].n = bar[1]()
                    bar[0].refresh()
            except KeyboardInterrupt:
                stop.request()
    finally:
        if bar is not None:
            bar[0].n = bar[1]()
            bar[0].close()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["line"]


def ics(model: Union[str, os.PathLike], *, n: int, seed: int = 0) -> dict:
    """Sample ``n`` particles of a model file (e.g. ``ics/milky_way.toml``) as ``leapfmm ics``
    does: a dict of numpy arrays ``pos`` (kpc), ``vel`` (km/s), ``mass`` (1e10 Msun), ``id``
    and ``component`` (0 halo, 1 disk, 2 bulge, 3 other), plus ``warnings``."""
    arrays, warnings = _native.ics(os.fspath(model), _count("n", n), _count("seed", seed, low=0, high=(1 << 64) - 1))
    arrays["warnings"] = warnings
    return arrays


def load(path: Union[str, os.PathLike]) -> dict:
    """Read a GADGET-format HDF5 snapshot (leapfmm's or another code's, single- or
    multi-file): a dict of numpy arrays ``pos``, ``vel``, ``mass``, ``id``, ``component``,
    the ``time``, and ``units`` (cgs factors ``length_cm``, ``mass_g``,
    ``velocity_cm_per_s``, or "nbody", or None when the file records none)."""
    return _native.load(os.fspath(path))
