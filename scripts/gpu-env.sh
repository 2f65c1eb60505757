# Sourced by scripts/gpu-check.sh and scripts/gpu-profile.sh on a lent GPU machine: sets BIN
# (scripts/gpu-kit.sh's bundle when carried: the binary and the shared libraries that
# machine lacks) and LD_LIBRARY_PATH (the bundle, CUDA's libraries and an NVRTC cudarc can
# load), and prints which NVRTC it found.
if [ -x .gpu-kit/leapfmm ]; then
    BIN=${BIN:-.gpu-kit/leapfmm}
    export LD_LIBRARY_PATH="$PWD/.gpu-kit/lib:${LD_LIBRARY_PATH:-}"
fi
BIN=${BIN:-target/release/leapfmm}
for d in /usr/local/cuda/lib64 /usr/local/cuda-*/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
# cudarc (built for CUDA 12.9) looks for libnvrtc.so, libnvrtc.so.12, ...: on a CUDA 13
# machine only libnvrtc.so.13 may exist, so link the first NVRTC found under the plain name
# (its directory stays on the path for libnvrtc-builtins).
nvrtc=$(ls /usr/local/cuda*/lib64/libnvrtc.so* /usr/local/cuda*/targets/x86_64-linux/lib/libnvrtc.so* \
    /usr/lib/x86_64-linux-gnu/libnvrtc.so* /opt/*/.venv/lib/python3*/site-packages/nvidia/*/lib/libnvrtc.so* \
    /usr/local/lib/python3*/dist-packages/nvidia/*/lib/libnvrtc.so* 2>/dev/null | grep -v -e builtins -e '\.alt\.' | head -1)
echo "NVRTC: ${nvrtc:-none found}"
if [ -n "$nvrtc" ]; then
    mkdir -p /tmp/nvrtc-link
    ln -sf "$nvrtc" /tmp/nvrtc-link/libnvrtc.so
    export LD_LIBRARY_PATH="/tmp/nvrtc-link:$(dirname "$nvrtc"):${LD_LIBRARY_PATH:-}"
fi
