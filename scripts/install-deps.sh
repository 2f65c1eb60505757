#!/usr/bin/env bash
# Installs the system packages leapfmm needs to build, only those that are missing.
# As root on Debian/Ubuntu it uses apt-get; otherwise it prints what to install.
# `install-deps.sh mpi` adds what the `mpi` feature needs (an MPI library, mpirun, and
# libclang for rsmpi's bindings); `install-deps.sh venv` Python's venv module (for the
# NVRTC kernel check). g++ (C++20) builds the CPU emulation of the CUDA kernels in the tests.
set -euo pipefail

packages=(libhdf5-dev pkg-config g++)
if [ "${1:-}" = "mpi" ]; then
    packages+=(libopenmpi-dev openmpi-bin libclang-dev)
elif [ "${1:-}" = "venv" ]; then
    packages=(python3-venv)
fi
missing=()
for p in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$p")
    fi
done

if ! command -v cargo >/dev/null 2>&1; then
    echo "cargo not found: install Rust from https://rustup.rs (no root needed)" >&2
    exit 1
fi

if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi

if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing: ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
elif command -v dpkg-query >/dev/null 2>&1; then
    echo "missing system packages: ${missing[*]}" >&2
    echo "install them with: sudo apt-get install ${missing[*]}" >&2
    echo "(without root: conda install -c conda-forge hdf5 pkg-config, then export HDF5_DIR=\$CONDA_PREFIX)" >&2
    exit 1
fi
