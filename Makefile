# leapfmm — the two quick-start commands are `make run` and `make test`.
# Both install missing system packages first (as root on Debian/Ubuntu).

CARGO ?= cargo
CONFIG ?= configs/quickstart.toml

.PHONY: deps deps-mpi build run test test-readers test-python test-mpi kernels-check lint bench

deps:
	@scripts/install-deps.sh

deps-mpi:
	@scripts/install-deps.sh mpi

build: deps
	$(CARGO) build --release

# Runs (or resumes, or reports as finished) the quick-start simulation, then draws its
# plots and tables into RUN_DIR/analysis/ (RUN_DIR: the config's output_dir/name).
RUN_DIR ?= runs/quickstart
run: build
	./target/release/leapfmm run $(CONFIG) --resume
	./target/release/leapfmm analyze $(RUN_DIR)

# The whole test suite, optimised (the numerical tests are too slow unoptimised), then the
# snapshots read by the real pynbody, yt and h5py.
test: deps
	@if command -v cargo-nextest >/dev/null 2>&1; then \
		$(CARGO) nextest run --release --no-fail-fast; \
	else \
		$(CARGO) test --release --no-fail-fast; \
	fi
	@$(MAKE) --no-print-directory test-readers

# pynbody, yt and h5py (from PyPI, in a local virtual environment) read a galactic run's
# snapshot, a multi-file one, an IC file and an N-body run's snapshot with the right
# physics (tests/readers/test_readers.py; pynbody reads tests/readers/config.ini).
test-readers: build
	@python3 -m venv .readers-venv 2>/dev/null || { scripts/install-deps.sh venv && python3 -m venv .readers-venv; }
	@.readers-venv/bin/pip install -q --disable-pip-version-check -r tests/readers/requirements.txt
	@cd tests/readers && ../../.readers-venv/bin/python -m pytest -q -p no:cacheprovider -W ignore::UserWarning test_readers.py

# The Python library (python/): `pip install ./python` into a fresh virtual environment
# (maturin builds the extension from this crate, HDF5 linked in), then its tests and the
# worked example (python/tests, python/examples; matplotlib draws without a display).
# The extension's build keeps its own target folder so that reruns are incremental. Run
# from the root, where no source `leapfmm/` folder shadows the installed package.
test-python: build
	@rm -rf .python-venv
	@python3 -m venv .python-venv 2>/dev/null || { scripts/install-deps.sh venv && python3 -m venv .python-venv; }
	@.python-venv/bin/pip install -q --disable-pip-version-check pytest h5py matplotlib tqdm 'cmake>=3.26'
	$(CARGO) fmt --check --manifest-path python/Cargo.toml
	PATH="$(CURDIR)/.python-venv/bin:$$PATH" CARGO_TARGET_DIR=$(CURDIR)/target/python \
		$(CARGO) clippy --release --manifest-path python/Cargo.toml -- -D warnings
	@CARGO_TARGET_DIR=$(CURDIR)/target/python .python-venv/bin/pip install -q --disable-pip-version-check ./python
	@.python-venv/bin/python -m pytest -q -p no:cacheprovider python/tests
	@MPLBACKEND=Agg .python-venv/bin/python python/examples/small_disk.py --out target/python/example

# The MPI tests: `mpirun -n 2` and `-n 3` against thread ranks (feature `mpi`).
test-mpi: deps-mpi
	@if command -v cargo-nextest >/dev/null 2>&1; then \
		$(CARGO) nextest run --release --features mpi --test mpi --no-fail-fast; \
	else \
		$(CARGO) test --release --features mpi --test mpi --no-fail-fast; \
	fi

# Every kernels/*.cu compiles with NVRTC for sm_80 and sm_90 (no GPU needed), with NVRTC 12
# (the nvidia-cuda-nvrtc-cu12 wheel, CI's long-standing check) and NVRTC 13.0 (the
# nvidia-cuda-nvrtc wheel: a lent H200 has driver 580, CUDA 13.0, and its NVRTC is 13), in a
# local virtual environment; then the binary's own NVRTC path (cudarc, with the PTX cache)
# compiles the embedded kernels with each, NVRTC 13 under the plain name libnvrtc.so as
# scripts/gpu-env.sh links it on the GPU machine.
NVRTC_SITE = $(CURDIR)/.nvrtc-venv/lib/python3*/site-packages/nvidia
kernels-check:
	@python3 -m venv .nvrtc-venv 2>/dev/null || { scripts/install-deps.sh venv && python3 -m venv .nvrtc-venv; }
	@.nvrtc-venv/bin/pip install -q --disable-pip-version-check nvidia-cuda-nvrtc-cu12 'nvidia-cuda-nvrtc==13.0.*'
	@.nvrtc-venv/bin/python scripts/nvrtc-check.py
	@.nvrtc-venv/bin/python scripts/nvrtc-check.py --cuda 13
	@LD_LIBRARY_PATH="$$(echo $(NVRTC_SITE)/cuda_nvrtc/lib):$$LD_LIBRARY_PATH" \
		LEAPFMM_REQUIRE_NVRTC=1 $(CARGO) test --release --test gpu_nvrtc
	@mkdir -p .nvrtc-venv/nvrtc13 && ln -sf "$$(echo $(NVRTC_SITE)/cu13/lib/libnvrtc.so.13)" .nvrtc-venv/nvrtc13/libnvrtc.so
	@LD_LIBRARY_PATH="$(CURDIR)/.nvrtc-venv/nvrtc13:$$(echo $(NVRTC_SITE)/cu13/lib):$$LD_LIBRARY_PATH" \
		LEAPFMM_REQUIRE_NVRTC=1 LEAPFMM_REQUIRE_NVRTC_MAJOR=13 $(CARGO) test --release --test gpu_nvrtc

lint: deps
	$(CARGO) fmt --check
	$(CARGO) clippy --release --all-targets -- -D warnings

bench: build
	$(CARGO) bench
