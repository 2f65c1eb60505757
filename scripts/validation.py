#!/usr/bin/env python3
"""Figures and drift table of a galaxy validation run (docs/validation.md).

Not part of the test suite. Needs numpy, h5py and matplotlib:

    python3 -m venv /tmp/val && /tmp/val/bin/pip install numpy h5py matplotlib
    leapfmm ics ics/milky_way.toml --n 1000 -o /tmp/unused.hdf5 --curves /tmp/mw_curves.csv
    leapfmm run configs/validation/milky_way.toml
    /tmp/val/bin/python scripts/validation.py runs/milky_way_validation /tmp/mw_curves.csv docs/validation

Writes face-on surface-density images of the disk at the first and last snapshot, the
rotation curve (model by component, and measured from the particles' accelerations), and
Toomre Q(R) (requested vs measured), and prints the drift table in Markdown.
"""

import glob
import os
import sys

import h5py
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

G = 43009.17
MYR_PER_UNIT = 977.8


def load(fn):
    f = h5py.File(fn, "r")
    out = {"time": float(f["Header"].attrs["Time"])}
    for pt, name in [(1, "halo"), (2, "disk"), (3, "bulge")]:
        g = f.get(f"PartType{pt}")
        if g is None:
            continue
        d = {k: g[k][()].astype(np.float64) for k in ["Coordinates", "Velocities", "Masses"]}
        if "Acceleration" in g:
            d["Acceleration"] = g["Acceleration"][()].astype(np.float64)
        out[name] = d
    return out


def lagrangian(d, fr=(0.1, 0.5, 0.9)):
    r = np.linalg.norm(d["Coordinates"], axis=1)
    i = np.argsort(r)
    c = np.cumsum(d["Masses"][i])
    c /= c[-1]
    return [r[i][np.searchsorted(c, f)] for f in fr]


def cyl(d):
    x, v = d["Coordinates"], d["Velocities"]
    R = np.hypot(x[:, 0], x[:, 1])
    vr = (x[:, 0] * v[:, 0] + x[:, 1] * v[:, 1]) / R
    return x, v, R, vr


def annulus(d, r0, r1):
    x, v, R, vr = cyl(d)
    s = (R >= r0) & (R < r1)
    return s, x, vr


def scale_height(d, r0, r1):
    s, x, _ = annulus(d, r0, r1)
    return np.median(np.abs(x[s, 2])) / np.arctanh(0.5)


def sigma_r(d, r0, r1):
    s, _, vr = annulus(d, r0, r1)
    return vr[s].std()


def a2(d, rmax):
    x, m = d["Coordinates"], d["Masses"]
    R2 = x[:, 0] ** 2 + x[:, 1] ** 2
    s = R2 < rmax * rmax
    return abs(np.sum(m[s] * (x[s, 0] + 1j * x[s, 1]) ** 2 / R2[s])) / m[s].sum()


def main():
    run, curves_csv, outdir = sys.argv[1:4]
    os.makedirs(outdir, exist_ok=True)
    snaps = sorted(glob.glob(os.path.join(run, "snapshots", "snap_*.hdf5")))
    rows = [load(fn) for fn in snaps]
    first, last = rows[0], rows[-1]
    curves = np.genfromtxt(curves_csv, delimiter=",", names=True)
    rd = 3.0
    t1 = last["time"] * MYR_PER_UNIT

    print(f"| quantity | t = 0 | t = {t1:.0f} Myr | change |")
    print("|---|---|---|---|")
    for comp in ["halo", "disk", "bulge"]:
        if comp not in first:
            continue
        a, b = lagrangian(first[comp]), lagrangian(last[comp])
        for k, f in enumerate([10, 50, 90]):
            print(f"| {comp} r{f} (kpc) | {a[k]:.3f} | {b[k]:.3f} | {100 * (b[k] / a[k] - 1):+.1f}% |")
    h0, h1 = scale_height(first["disk"], rd, 3 * rd), scale_height(last["disk"], rd, 3 * rd)
    print(f"| disk scale height, 1–3 R_d (kpc) | {h0:.3f} | {h1:.3f} | {100 * (h1 / h0 - 1):+.1f}% |")
    s0, s1 = sigma_r(first["disk"], 1.8 * rd, 2.2 * rd), sigma_r(last["disk"], 1.8 * rd, 2.2 * rd)
    print(f"| σ_R at 2 R_d (km/s) | {s0:.2f} | {s1:.2f} | {100 * (s1 / s0 - 1):+.1f}% |")
    print(f"| A2 (R < 3 R_d) | {a2(first['disk'], 3 * rd):.4f} | {a2(last['disk'], 3 * rd):.4f} | |")
    diag = np.genfromtxt(os.path.join(run, "diagnostics.csv"), delimiter=",", names=True)
    de = np.max(np.abs(diag["rel_energy_error"]))
    dlz = np.max(np.abs(diag["lz"] / diag["lz"][0] - 1))
    print(f"| max abs(ΔE/E) | | {de:.2e} | |")
    print(f"| max abs(ΔLz/Lz) | | {dlz:.2e} | |")

    # Bar amplitude and thickness per snapshot.
    print()
    print("| t (Myr) | " + " | ".join(f"{r['time'] * MYR_PER_UNIT:.0f}" for r in rows) + " |")
    print("|---|" + "---|" * len(rows))
    print("| A2 | " + " | ".join(f"{a2(r['disk'], 3 * rd):.3f}" for r in rows) + " |")
    zs = []
    for r in rows:
        s, x, _ = annulus(r["disk"], rd, 3 * rd)
        zs.append(np.median(np.abs(x[s, 2])))
    print("| median abs(z) (kpc) | " + " | ".join(f"{z:.3f}" for z in zs) + " |")

    # Face-on surface density of the disk.
    fig, axes = plt.subplots(1, 2, figsize=(11, 5), constrained_layout=True)
    for ax, snap in zip(axes, [first, last]):
        x, m = snap["disk"]["Coordinates"], snap["disk"]["Masses"]
        h, xe, ye = np.histogram2d(x[:, 0], x[:, 1], bins=200, range=[[-20, 20], [-20, 20]], weights=m * 1e10)
        area = (xe[1] - xe[0]) * (ye[1] - ye[0]) * 1e6  # pc^2
        im = ax.imshow(np.log10(h.T / area + 1e-3), origin="lower", extent=[-20, 20, -20, 20], vmin=0, vmax=3.5, cmap="magma")
        ax.set_title(f"disk, face-on, t = {snap['time'] * MYR_PER_UNIT:.0f} Myr")
        ax.set_xlabel("x (kpc)")
        ax.set_ylabel("y (kpc)")
    fig.colorbar(im, ax=axes, label="log10 Σ (Msun / pc²)")
    fig.savefig(os.path.join(outdir, "face_on.png"), dpi=100)

    # Rotation curve: model by component, and measured from the disk particles' forces.
    fig, ax = plt.subplots(figsize=(7, 5), constrained_layout=True)
    for col, label, style in [("vc_total", "model total", "k-"), ("vc_halo", "halo", "C0--"), ("vc_disk", "disk", "C1--"), ("vc_bulge", "bulge", "C2--")]:
        ax.plot(curves["R"], curves[col], style, label=label)
    bins = np.linspace(0.5, 25, 40)
    for snap, mk, lab in [(first, "o", "particles, t = 0"), (last, "s", f"particles, t = {t1:.0f} Myr")]:
        d = snap["disk"]
        if "Acceleration" not in d:
            continue
        x, _, R, _ = cyl(d)
        a = d["Acceleration"]
        ar = (x[:, 0] * a[:, 0] + x[:, 1] * a[:, 1]) / R
        k = np.digitize(R, bins)
        rc = [(0.5 * (bins[i - 1] + bins[i]), np.sqrt(np.mean(-ar[k == i] * R[k == i]))) for i in range(1, len(bins)) if np.sum(k == i) > 50]
        rc = np.array(rc)
        ax.plot(rc[:, 0], rc[:, 1], mk, ms=4, mfc="none", label=lab)
    ax.set_xlabel("R (kpc)")
    ax.set_ylabel("v_c (km/s)")
    ax.set_title("Rotation curve (midplane)")
    ax.set_xlim(0, 25)
    ax.legend()
    fig.savefig(os.path.join(outdir, "rotation_curve.png"), dpi=100)

    # Toomre Q: requested (model) vs measured (σ_R and Σ from particles, κ from the model).
    R, vc = curves["R"], curves["vc_total"]
    kappa = np.sqrt(np.maximum(2 * vc**2 / R**2 + np.gradient(vc**2, R) / R, 0))
    fig, ax = plt.subplots(figsize=(7, 5), constrained_layout=True)
    ax.plot(R, curves["toomre_q"], "k-", label="requested (model)")
    edges = np.linspace(1.0, 25.0, 33)
    for snap, mk, lab in [(first, "o", "particles, t = 0"), (last, "s", f"particles, t = {t1:.0f} Myr")]:
        d = snap["disk"]
        pts = []
        for r0, r1 in zip(edges[:-1], edges[1:]):
            s, _, vr = annulus(d, r0, r1)
            if s.sum() < 100:
                continue
            sig = d["Masses"][s].sum() / (np.pi * (r1 * r1 - r0 * r0))
            rc = 0.5 * (r0 + r1)
            pts.append((rc, vr[s].std() * np.interp(rc, R, kappa) / (3.36 * G * sig)))
        pts = np.array(pts)
        ax.plot(pts[:, 0], pts[:, 1], mk, ms=4, mfc="none", label=lab)
    ax.set_ylim(0, 5)
    ax.set_xlabel("R (kpc)")
    ax.set_ylabel("Toomre Q")
    ax.set_title("Toomre Q(R) of the disk")
    ax.legend()
    fig.savefig(os.path.join(outdir, "toomre_q.png"), dpi=100)


if __name__ == "__main__":
    main()
