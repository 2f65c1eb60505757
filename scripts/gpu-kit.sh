#!/usr/bin/env bash
# Prepares what a lent GPU machine needs to run scripts/gpu-check.sh (issue 6): that machine
# has CUDA 13, PyTorch and friends but no Rust, no libhdf5 and nothing to install from, so
# the release binary goes over stripped, with every shared library it links that is not
# the C library itself (HDF5 and its dependencies, as this machine has them), in .gpu-kit/
# (git-ignored). Then, with the `device` tool:
#   run(command="scripts/gpu-check.sh", carry=[".gpu-kit"], timeout_s=...)
# gpu-check.sh picks .gpu-kit/ up when it is there.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --bin leapfmm
rm -rf .gpu-kit
mkdir -p .gpu-kit/lib
cp target/release/leapfmm .gpu-kit/leapfmm
strip .gpu-kit/leapfmm
# gpu-check.sh prints it: a kit left from an older build is then plain to see.
git describe --always --dirty > .gpu-kit/commit 2>/dev/null || echo unknown > .gpu-kit/commit
# Every resolved library but glibc's own (libc, libm, libdl, libpthread, librt, libresolv,
# the loader) and libgcc_s, which the other machine has in a compatible (newer) version.
ldd target/release/leapfmm | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
    libc.so.* | libm.so.* | libdl.so.* | libpthread.so.* | librt.so.* | libresolv.so.* | ld-linux* | libgcc_s.so.*) ;;
    *) cp -L "$lib" .gpu-kit/lib/ ;;
    esac
done
du -sh .gpu-kit
echo "carry .gpu-kit (limit 64 MiB with the working tree)"
