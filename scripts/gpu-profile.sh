#!/usr/bin/env bash
# Kernel profiles on a lent GPU machine (issue 6), after scripts/gpu-kit.sh here, with the
# `device` tool: run(command="scripts/gpu-profile.sh", carry=[".gpu-kit"], timeout_s=...).
# Nsight Compute (ncu, when that machine has it) on one launch each of the M2L (the rotated
# kernel of the default order 7), P2P and walk kernels of `leapfmm forces --backend cuda` on
# the Milky Way model at N (default 1e6): occupancy, throughput and the warps' stall
# reasons. Prints what it found; writes nothing to keep.
set -uo pipefail
N=${N:-1000000}
DIR=${DIR:-/tmp/gpu-profile}
mkdir -p "$DIR"
source scripts/gpu-env.sh
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: ${NCU:-none found}"
[ -n "$NCU" ] || exit 1
"$BIN" ics ics/milky_way.toml --n "$N" -o "$DIR/mw.hdf5" 2>&1 | tail -1
# Warm the kernel cache first, so that the profiled run compiles nothing.
"$BIN" forces "$DIR/mw.hdf5" --softening 0.05 --backend cuda --repeat 1 -o "$DIR/f.hdf5" >/dev/null 2>&1
for k in m2l_rotated_7 p2p_leaves walk_level; do
    echo "== $k"
    timeout 150 "$NCU" --kernel-name "$k" --launch-count 1 \
        --section SpeedOfLight --section Occupancy --section LaunchStats \
        --section WarpStateStats --section MemoryWorkloadAnalysis \
        "$BIN" forces "$DIR/mw.hdf5" --softening 0.05 --backend cuda --repeat 1 \
        -o "$DIR/f.hdf5" 2>&1 | grep -v -e '^==PROF==' -e '^GPU ' -e '^evaluation' -e '^wrote'
done
