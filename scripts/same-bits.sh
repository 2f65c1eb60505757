#!/usr/bin/env bash
# Outputs whose bits a refactor must not change, with their SHA-256 sums in OUT/SUMS:
# `leapfmm forces` on a 2e4 Milky Way (CPU, 2 thread ranks, and the GPU backend on the
# emulated driver), and the snapshots and diagnostics.csv / ranks.csv (without wall-time
# columns) of 50-step runs of a 4 000-particle disk: CPU global and block steps, 2 thread
# ranks, and on the emulated GPU global, block and 2 GPUs. Compare two trees with
# `diff BEFORE/SUMS AFTER/SUMS`.
#
# Usage: scripts/same-bits.sh OUT   (after `cargo build --release` and one run of
# `cargo nextest run --release --test gpu_emulated`, which builds the emulated driver)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=$(mkdir -p "$1" && cd "$1" && pwd)
BIN=$ROOT/target/release/leapfmm
DRV=$(ls -d "$ROOT"/target/tmp/emulated-driver-* 2>/dev/null | grep -v '\.[0-9]*$' | tail -1)
[ -n "$DRV" ] || { echo "no emulated driver: run cargo nextest run --release --test gpu_emulated first" >&2; exit 2; }
rm -rf "${OUT:?}"/*
cd "$OUT"
gpu() { LD_LIBRARY_PATH=$DRV HOME=$OUT TMPDIR=$OUT "$@"; }
"$BIN" ics "$ROOT/ics/milky_way.toml" --n 20000 -o mw.hdf5 >/dev/null
"$BIN" forces mw.hdf5 -o f_cpu.hdf5 --softening 0.05 >/dev/null
"$BIN" forces mw.hdf5 -o f_r2.hdf5 --softening 0.05 --ranks 2 >/dev/null
gpu "$BIN" forces mw.hdf5 -o f_gpu.hdf5 --softening 0.05 --backend cuda >/dev/null 2>&1
conf() {
    cat >"$1.toml" <<EOT
name = "$1"
output_dir = "runs"
seed = 7
units = "galactic"
[ics]
model = "$ROOT/ics/small_disk.toml"
n = 4000
[gravity]
solver = "fmm"
softening = 0.05
[integrator]
t_end = 0.05
dt_max = 0.001
scheme = "$2"
[output]
snapshot_interval = 0.025
EOT
}
conf g_cpu global && "$BIN" run g_cpu.toml --quiet --backend cpu
conf b_cpu block && "$BIN" run b_cpu.toml --quiet --backend cpu
conf g_r2 global && "$BIN" run g_r2.toml --quiet --backend cpu --ranks 2
conf g_gpu global && gpu "$BIN" run g_gpu.toml --quiet --backend cuda
conf b_gpu block && gpu "$BIN" run b_gpu.toml --quiet --backend cuda
conf g_gpu2 global && LEAPFMM_EMULATED_GPUS=2 gpu "$BIN" run g_gpu2.toml --quiet --backend cuda --ranks 2
for d in runs/*/; do
    for name in diagnostics.csv ranks.csv; do
        [ -f "$d$name" ] || continue
        # Wall-time columns (wall_*, *_s) differ from run to run; the rest must not.
        python3 - "$d$name" <<'PY'
import csv, sys
path = sys.argv[1]
rows = list(csv.reader(open(path)))
keep = [i for i, h in enumerate(rows[0]) if not (h.startswith("wall") or h.endswith("_s"))]
open(path + ".nowall", "w").write("\n".join(",".join(r[i] for i in keep) for r in rows))
PY
    done
done
find . \( -name "*.nowall" -o -name "snap_*.hdf5" -o -name "f_*.hdf5" \) | sort | xargs sha256sum >SUMS
echo "$(wc -l <SUMS) files summed in $OUT/SUMS"
