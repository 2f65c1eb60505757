#!/usr/bin/env bash
# Kernel profiles on a lent GPU machine (issue 6), after scripts/gpu-kit.sh here, with the
# `device` tool: run(command="scripts/gpu-profile.sh", carry=[".gpu-kit"], timeout_s=...).
# Nsight Compute (ncu, when that machine has it) on one launch each of the M2L, P2P and walk
# kernels of `leapfmm forces --backend cuda` on the Milky Way model at N (default 1e6):
# occupancy, throughput and the warps' stall reasons. Prints what it found; writes nothing
# to keep.
set -uo pipefail
if [ -x .gpu-kit/leapfmm ]; then
    BIN=${BIN:-.gpu-kit/leapfmm}
    export LD_LIBRARY_PATH="$PWD/.gpu-kit/lib:${LD_LIBRARY_PATH:-}"
fi
BIN=${BIN:-target/release/leapfmm}
N=${N:-1000000}
DIR=${DIR:-/tmp/gpu-profile}
mkdir -p "$DIR"
for d in /usr/local/cuda/lib64 /usr/local/cuda-*/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
# As in gpu-check.sh: cudarc looks for libnvrtc.so by its plain name.
nvrtc=$(ls /usr/local/cuda*/lib64/libnvrtc.so* /usr/local/cuda*/targets/x86_64-linux/lib/libnvrtc.so* \
    /usr/lib/x86_64-linux-gnu/libnvrtc.so* /opt/*/.venv/lib/python3*/site-packages/nvidia/*/lib/libnvrtc.so* \
    /usr/local/lib/python3*/dist-packages/nvidia/*/lib/libnvrtc.so* 2>/dev/null | grep -v -e builtins -e '\.alt\.' | head -1)
if [ -n "$nvrtc" ]; then
    mkdir -p /tmp/nvrtc-link
    ln -sf "$nvrtc" /tmp/nvrtc-link/libnvrtc.so
    export LD_LIBRARY_PATH="/tmp/nvrtc-link:$(dirname "$nvrtc"):${LD_LIBRARY_PATH:-}"
fi
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: ${NCU:-none found}"
[ -n "$NCU" ] || exit 1
"$BIN" ics ics/milky_way.toml --n "$N" -o "$DIR/mw.hdf5" 2>&1 | tail -1
# Warm the kernel cache first, so that the profiled run compiles nothing.
"$BIN" forces "$DIR/mw.hdf5" --softening 0.05 --backend cuda --repeat 1 -o "$DIR/f.hdf5" >/dev/null 2>&1
for k in m2l_cells p2p_leaves walk_level; do
    echo "== $k"
    timeout 150 "$NCU" --kernel-name "$k" --launch-count 1 \
        --section SpeedOfLight --section Occupancy --section LaunchStats \
        --section WarpStateStats --section MemoryWorkloadAnalysis \
        "$BIN" forces "$DIR/mw.hdf5" --softening 0.05 --backend cuda --repeat 1 \
        -o "$DIR/f.hdf5" 2>&1 | grep -v -e '^==PROF==' -e '^GPU ' -e '^evaluation' -e '^wrote'
done
