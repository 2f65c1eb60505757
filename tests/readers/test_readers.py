"""pynbody, yt and h5py read leapfmm's snapshots with the right physics.

For a galactic-units run (one file and a 2-rank multi-file snapshot), an N-body-units run
and an IC file from `leapfmm ics`, each reader's max |x|, total mass and time, converted to
physical units by the reader, agree within 1 % with h5py's raw values times the file's
unit attributes; pynbody's `v_circ` and a midplane circular velocity computed from yt's
positions and masses agree within 2 % with `leapfmm analyze`'s profile at 8 kpc.

Run from this folder (pynbody reads ./config.ini, which maps the particle types to the
families halo, disk and bulge): `make test-readers` at the repository's root.
"""

import csv
import pathlib
import subprocess
import warnings

import h5py
import numpy as np
import pytest

warnings.filterwarnings("ignore")

import pynbody  # noqa: E402  (after the warning filter: it warns at import)
import yt  # noqa: E402

yt.set_log_level(50)

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = ROOT / "target" / "release" / "leapfmm"
KPC_CM = 3.0856775814913673e21
MSUN_G = 1.98841e33
MYR_S = 3.15576e13
G_KPC_KMS2_PER_MSUN = 4.30091727e-6


def leapfmm(*args, cwd):
    out = subprocess.run([str(BIN), *map(str, args)], cwd=cwd, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out


def galaxy_config(name, n, t_end):
    return f"""name = "{name}"
output_dir = "runs"
seed = 5
units = "galactic"
[ics]
model = "{ROOT / 'ics' / 'small_disk.toml'}"
n = {n}
[gravity]
solver = "fmm"
softening = 0.05
[integrator]
t_end = {t_end}
dt_max = 0.001
fixed_step = true
[output]
snapshot_interval = {t_end}
snapshot_precision = "double"
"""


def raw(files):
    """h5py's raw values times the file's own unit attributes (cgs)."""
    pos, mass = [], []
    for path in files:
        with h5py.File(path, "r") as f:
            u = f["Units"].attrs
            length, m_unit, t_unit = (
                u["Unit length in cgs (U_L)"],
                u["Unit mass in cgs (U_M)"],
                u["Unit time in cgs (U_t)"],
            )
            time = f["Header"].attrs["Time"] * t_unit
            for g in f:
                if g.startswith("PartType"):
                    pos.append(f[g]["Coordinates"][:] * length)
                    mass.append(f[g]["Masses"][:] * m_unit)
    pos, mass = np.concatenate(pos), np.concatenate(mass)
    return {"max_x_cm": np.abs(pos).max(), "mass_g": mass.sum(), "time_s": time}


def close(a, b, tol, what):
    assert abs(a / b - 1) < tol, f"{what}: {a} vs {b} ({abs(a / b - 1):.2%})"


def analyze_v_circ_at(folder, snapshot, radius):
    out = folder / "analysis"
    leapfmm("analyze", snapshot, "-o", out, "--r-max", 16, "--bins", 32, cwd=folder)
    (profile,) = sorted(out.glob("profile_*.csv"))
    rows = list(csv.DictReader(open(profile)))
    r = np.array([float(x["radius"]) for x in rows])
    v = np.array([float(x["vc_total"]) for x in rows])
    return float(np.interp(radius, r, v))


def midplane_v_circ(pos_kpc, mass_msun, radius, eps=0.05, points=16):
    """sqrt(-R <a_R>) on a ring in z = 0, by direct summation (Plummer softening)."""
    phi = 2 * np.pi * np.arange(points) / points
    ring = np.stack([radius * np.cos(phi), radius * np.sin(phi), np.zeros(points)], 1)
    d = pos_kpc[None, :, :] - ring[:, None, :]
    r2 = (d**2).sum(2) + eps**2
    acc = G_KPC_KMS2_PER_MSUN * (mass_msun[None, :, None] * d / r2[:, :, None] ** 1.5).sum(1)
    return float(np.sqrt(-(ring[:, 0] * acc[:, 0] + ring[:, 1] * acc[:, 1]).mean()))


@pytest.fixture(scope="module")
def galaxy(tmp_path_factory):
    folder = tmp_path_factory.mktemp("galaxy")
    (folder / "g.toml").write_text(galaxy_config("g", 4000, 0.01))
    leapfmm("run", "g.toml", "--quiet", cwd=folder)
    return folder, folder / "runs" / "g" / "snapshots" / "snap_001.hdf5"


def check_pynbody(s, expected, length, mass, time):
    close(float(np.abs(s["pos"].in_units(length)).max()), expected["max_x"], 0.01, "pynbody max |x|")
    close(float(s["mass"].sum().in_units(mass)), expected["mass"], 0.01, "pynbody mass")
    if expected["time"] > 0:
        close(float(s.properties["time"].in_units(time)), expected["time"], 0.01, "pynbody time")


def check_yt(ds, expected, length, mass, time):
    ad = ds.all_data()
    close(float(np.abs(ad["all", "Coordinates"].to(length)).max()), expected["max_x"], 0.01, "yt max |x|")
    close(float(ad["all", "Masses"].sum().to(mass)), expected["mass"], 0.01, "yt mass")
    if expected["time"] > 0:
        close(float(ds.current_time.to(time)), expected["time"], 0.01, "yt time")


def galactic(r):
    return {"max_x": r["max_x_cm"] / KPC_CM, "mass": r["mass_g"] / MSUN_G, "time": r["time_s"] / MYR_S}


def test_galactic_snapshot_values_and_circular_velocity(galaxy):
    folder, snap = galaxy
    expected = galactic(raw([snap]))
    assert 9 < expected["time"] < 11  # 10 steps of 1 Myr (0.978 Myr each)
    s = pynbody.load(str(snap))
    check_pynbody(s, expected, "kpc", "Msol", "Myr")
    # Halo and disk are separate families (config.ini), each with its softening.
    assert {f.name for f in s.families()} == {"halo", "disk"}
    assert len(s.halo) == 3000 and len(s.disk) == 1000
    close(float(s.disk["eps"][0]), 0.05, 1e-6, "disk eps in kpc")
    ds = yt.load(str(snap))
    check_yt(ds, expected, "kpc", "Msun", "Myr")

    v_analyze = analyze_v_circ_at(folder, snap, 8.0)
    prof = pynbody.analysis.profile.Profile(s, rmin=0.01, rmax=16, nbins=32, type="lin")
    v_pynbody = float(np.interp(8.0, prof["rbins"].in_units("kpc"), prof["v_circ"].in_units("km s**-1")))
    close(v_pynbody, v_analyze, 0.02, "pynbody v_circ(8 kpc) vs analyze")
    ad = ds.all_data()
    v_yt = midplane_v_circ(ad["all", "Coordinates"].to("kpc").v, ad["all", "Masses"].to("Msun").v, 8.0)
    close(v_yt, v_analyze, 0.02, "yt midplane v_circ(8 kpc) vs analyze")


def test_multi_file_snapshot(tmp_path):
    (tmp_path / "m.toml").write_text(galaxy_config("m", 2000, 0.004))
    leapfmm("run", "m.toml", "--quiet", "--ranks", "2", cwd=tmp_path)
    folder = tmp_path / "runs" / "m" / "snapshots" / "snapdir_001"
    files = sorted(folder.glob("snap_001.*.hdf5"))
    assert len(files) == 2
    expected = galactic(raw(files))
    s = pynbody.load(str(folder / "snap_001"))
    assert len(s) == 2000
    check_pynbody(s, expected, "kpc", "Msol", "Myr")
    check_yt(yt.load(str(files[0])), expected, "kpc", "Msun", "Myr")


def test_ic_file(tmp_path):
    leapfmm("ics", ROOT / "ics" / "small_disk.toml", "--n", 2000, "-o", "ic.hdf5", cwd=tmp_path)
    path = tmp_path / "ic.hdf5"
    expected = galactic(raw([path]))
    check_pynbody(pynbody.load(str(path)), expected, "kpc", "Msol", "Myr")
    check_yt(yt.load(str(path)), expected, "kpc", "Msun", "Myr")


def test_nbody_snapshot_in_its_stated_units(tmp_path):
    """N-body files state unit factors of 1 (cm, g, cm/s): each reader reports those."""
    config = galaxy_config("p", 1000, 0.25).replace('units = "galactic"', 'units = "nbody"')
    config = config.replace(str(ROOT / "ics" / "small_disk.toml"), str(ROOT / "ics" / "plummer.toml"))
    config = config.replace("dt_max = 0.001", "dt_max = 0.05")
    (tmp_path / "p.toml").write_text(config)
    leapfmm("run", "p.toml", "--quiet", cwd=tmp_path)
    path = tmp_path / "runs" / "p" / "snapshots" / "snap_001.hdf5"
    r = raw([path])
    expected = {"max_x": r["max_x_cm"], "mass": r["mass_g"], "time": r["time_s"]}
    check_pynbody(pynbody.load(str(path)), expected, "cm", "g", "s")
    with h5py.File(path, "r") as f:
        u = f["Units"].attrs
        base = {k: float(u[k]) for k in ("UnitLength_in_cm", "UnitMass_in_g", "UnitVelocity_in_cm_per_s")}
    # yt's GADGET reader takes units only as an argument (its default is GADGET's kpc,
    # 1e10 Msun, km/s, which are leapfmm's galactic units).
    check_yt(yt.load(str(path), unit_base=base), expected, "cm", "g", "s")
