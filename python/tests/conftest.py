"""Shared fixtures: particle sets and an independent numpy direct sum."""

import pathlib

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def plummer(n, seed=0):
    """A Plummer sphere of total mass 1 (scale radius 1), cut at 30 scale radii."""
    rng = np.random.default_rng(seed)
    u = rng.uniform(1e-6, 1 - 1e-6, n)
    r = 1.0 / np.sqrt(u ** (-2.0 / 3.0) - 1.0)
    r = np.minimum(r, 30.0)
    v = rng.normal(size=(n, 3))
    pos = v / np.linalg.norm(v, axis=1)[:, None] * r[:, None]
    vel = rng.normal(size=(n, 3)) * 0.3 / np.sqrt(1 + r[:, None] ** 2) ** 0.5
    return pos, vel, np.full(n, 1.0 / n)


def numpy_direct(pos, mass, targets=None, eps=0.0, G=1.0):
    """Plummer-softened (or Newtonian, eps = 0) accelerations and potentials by numpy, a
    particle's own term excluded (targets: at those points, nothing excluded)."""
    at = pos if targets is None else targets
    acc = np.zeros((len(at), 3))
    pot = np.zeros(len(at))
    for s in range(0, len(at), 256):
        d = pos[None, :, :] - at[s : s + 256, None, :]
        r2 = (d ** 2).sum(axis=2) + eps ** 2
        with np.errstate(divide="ignore"):
            inv = 1.0 / np.sqrt(r2)
        if targets is None:
            idx = np.arange(s, min(s + 256, len(at)))
            inv[idx - s, idx] = 0.0
        inv[~np.isfinite(inv)] = 0.0
        acc[s : s + 256] = G * (d * (mass * inv ** 3)[:, :, None]).sum(axis=1)
        pot[s : s + 256] = -G * (mass * inv).sum(axis=1)
    return acc, pot


def relative_errors(acc, ref):
    return np.linalg.norm(acc - ref, axis=1) / np.linalg.norm(ref, axis=1)


@pytest.fixture(scope="session")
def sphere():
    return plummer(4000, seed=1)
