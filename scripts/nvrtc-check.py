#!/usr/bin/env python3
"""Compiles every kernels/*.cu with NVRTC for sm_80 and sm_90 (CI's check that the GPU
kernels build, on a machine without a GPU). Needs libnvrtc, e.g. from the PyPI wheel:

    python3 -m venv .nvrtc && .nvrtc/bin/pip install nvidia-cuda-nvrtc-cu12
    .nvrtc/bin/python scripts/nvrtc-check.py

The library is looked up in the wheel's folder of the running Python, then by name
(LD_LIBRARY_PATH). Exits 1, with NVRTC's log, if any kernel does not compile.

With --resources it also prints ptxas's registers, spills and shared memory of each
kernel (the figures that set how many blocks fit on an SM), for sm_90 only.

With --cuda 13 it takes NVRTC 13 instead, from the `nvidia-cuda-nvrtc` wheel (13.x; pip
install 'nvidia-cuda-nvrtc==13.0.*'), the NVRTC of a GPU machine with CUDA 13.
"""

import ctypes
import glob
import os
import sys
import sysconfig

ARCHS = ["sm_80", "sm_90"]


def load_nvrtc(cuda):
    site = sysconfig.get_paths()["purelib"]
    folder, wheel = {
        "12": ("cuda_nvrtc", "nvidia-cuda-nvrtc-cu12"),
        "13": ("cu13", "'nvidia-cuda-nvrtc==13.0.*'"),
    }[cuda]
    lib = os.path.join(site, "nvidia", folder, "lib")
    # NVRTC opens its builtins library by name when it compiles; 13's is not found next to
    # it without LD_LIBRARY_PATH, so load it first (the name then matches the loaded one).
    for builtins in glob.glob(os.path.join(lib, "libnvrtc-builtins.so.*")):
        if ".alt." not in builtins:
            ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
    candidates = glob.glob(os.path.join(lib, "libnvrtc.so.*"))
    candidates = [c for c in candidates if "builtins" not in c and ".alt." not in c]
    for name in candidates + [f"libnvrtc.so.{cuda}"]:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    sys.exit(f"nvrtc-check: libnvrtc {cuda} not found (pip install {wheel})")


def check(lib, call, what):
    if call != 0:
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        raise RuntimeError(f"{what}: {lib.nvrtcGetErrorString(call).decode()}")


def compile_one(lib, path, arch, include, resources=False):
    with open(path, "rb") as f:
        source = f.read()
    prog = ctypes.c_void_p()
    status = lib.nvrtcCreateProgram(ctypes.byref(prog), source,
                                    os.path.basename(path).encode(), 0, None, None)
    check(lib, status, "nvrtcCreateProgram")
    # The binary's options (src/gpu/nvrtc.rs: OPTIONS), plus the include path it does not
    # need (it splices the headers in).
    opts = [f"--gpu-architecture={arch}", f"--include-path={include}", "--std=c++17",
            "-ftz=true", "-default-device"] + (["--ptxas-options=-v"] if resources else [])
    arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    status = lib.nvrtcCompileProgram(prog, len(opts), arr)
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    code = ctypes.c_size_t()
    if status == 0:
        lib.nvrtcGetCUBINSize(prog, ctypes.byref(code))
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return status, log.value.decode(errors="replace").strip(), code.value


def main():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "kernels")
    args = sys.argv[1:]
    cuda = args[args.index("--cuda") + 1] if "--cuda" in args else "12"
    if cuda not in ("12", "13"):
        sys.exit(f"nvrtc-check: --cuda takes 12 or 13, not {cuda}")
    lib = load_nvrtc(cuda)
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    print(f"NVRTC {major.value}.{minor.value}")
    if str(major.value) != cuda:
        sys.exit(f"nvrtc-check: asked for NVRTC {cuda}, loaded {major.value}.{minor.value}")
    resources = "--resources" in args
    sources = sorted(glob.glob(os.path.join(root, "*.cu")))
    if not sources:
        sys.exit("nvrtc-check: no kernels/*.cu")
    failed = 0
    for path in sources:
        for arch in (["sm_90"] if resources else ARCHS):
            status, log, cubin = compile_one(lib, path, arch, root, resources)
            name = os.path.basename(path)
            if status != 0:
                failed += 1
                print(f"FAIL {name} for {arch}:\n{log}")
            else:
                print(f"ok   {name} for {arch} ({cubin} bytes of cubin)" + (f"\n{log}" if log else ""))
    if failed:
        sys.exit(f"nvrtc-check: {failed} kernel compilations failed")


if __name__ == "__main__":
    main()
