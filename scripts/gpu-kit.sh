#!/usr/bin/env bash
# Prepares what a lent GPU machine needs to run scripts/gpu-check.sh (issue 6): that machine
# has CUDA 13, PyTorch and friends but no Rust, no libhdf5 and nothing to install from, so
# the release binary goes over stripped, with every shared library it links that is not
# the C library itself (HDF5 and its dependencies, as this machine has them), in .gpu-kit/
# (git-ignored). Then, with the `device` tool:
#   run(command="scripts/gpu-check.sh", carry=[".gpu-kit"], timeout_s=...)
# gpu-check.sh picks .gpu-kit/ up when it is there.
# The kit also holds, in .gpu-kit/baseline/, the binary of BASELINE (default 2f9da0b, the last
# commit timed on an H200: the fifth session's figures in docs/benchmarks.md), built in a
# worktree under target/ (minutes the first time, then kept): gpu-check.sh runs its resident
# steps with it too, so that one device call says phase by phase whether the kernels changed
# since are faster. BASELINE=none leaves it out.
set -euo pipefail
cd "$(dirname "$0")/.."
BASELINE=${BASELINE:-2f9da0b}
cargo build --release --bin leapfmm
rm -rf .gpu-kit
mkdir -p .gpu-kit/lib
cp target/release/leapfmm .gpu-kit/leapfmm
strip .gpu-kit/leapfmm
# gpu-check.sh prints it: a kit left from an older build is then plain to see.
git describe --always --dirty > .gpu-kit/commit 2>/dev/null || echo unknown > .gpu-kit/commit
binaries=(target/release/leapfmm)
if [ "$BASELINE" != none ]; then
    src=target/baseline-src
    if [ ! -d "$src" ]; then
        git worktree add --force --detach "$src" "$BASELINE"
    fi
    git -C "$src" checkout --quiet --detach "$BASELINE"
    CARGO_TARGET_DIR="$PWD/target/baseline" cargo build --release --bin leapfmm \
        --manifest-path "$src/Cargo.toml"
    mkdir -p .gpu-kit/baseline
    cp target/baseline/release/leapfmm .gpu-kit/baseline/leapfmm
    strip .gpu-kit/baseline/leapfmm
    git -C "$src" describe --always > .gpu-kit/baseline/commit
    binaries+=(target/baseline/release/leapfmm)
fi
# Every resolved library but glibc's own (libc, libm, libdl, libpthread, librt, libresolv,
# the loader) and libgcc_s, which the other machine has in a compatible (newer) version.
for bin in "${binaries[@]}"; do ldd "$bin"; done | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u | while read -r lib; do
    case "$(basename "$lib")" in
    libc.so.* | libm.so.* | libdl.so.* | libpthread.so.* | librt.so.* | libresolv.so.* | ld-linux* | libgcc_s.so.*) ;;
    *) cp -L "$lib" .gpu-kit/lib/ ;;
    esac
done
du -sh .gpu-kit
echo "carry .gpu-kit (limit 64 MiB with the working tree)"
