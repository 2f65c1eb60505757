# leapfmm — the two quick-start commands are `make run` and `make test`.
# Both install missing system packages first (as root on Debian/Ubuntu).

CARGO ?= cargo
CONFIG ?= configs/quickstart.toml

.PHONY: deps deps-mpi build run test test-mpi kernels-check lint bench

deps:
	@scripts/install-deps.sh

deps-mpi:
	@scripts/install-deps.sh mpi

build: deps
	$(CARGO) build --release

# Runs (or resumes, or reports as finished) the quick-start simulation.
run: build
	./target/release/leapfmm run $(CONFIG) --resume

# The whole test suite, optimised (the numerical tests are too slow unoptimised).
test: deps
	@if command -v cargo-nextest >/dev/null 2>&1; then \
		$(CARGO) nextest run --release --no-fail-fast; \
	else \
		$(CARGO) test --release --no-fail-fast; \
	fi

# The MPI tests: `mpirun -n 2` and `-n 3` against thread ranks (feature `mpi`).
test-mpi: deps-mpi
	@if command -v cargo-nextest >/dev/null 2>&1; then \
		$(CARGO) nextest run --release --features mpi --test mpi --no-fail-fast; \
	else \
		$(CARGO) test --release --features mpi --test mpi --no-fail-fast; \
	fi

# Every kernels/*.cu compiles with NVRTC for sm_80 and sm_90 (no GPU needed): libnvrtc from
# the nvidia-cuda-nvrtc-cu12 wheel in a local virtual environment; then the binary's own
# NVRTC path (cudarc, with the PTX cache) compiles the embedded kernels.
kernels-check:
	@python3 -m venv .nvrtc-venv 2>/dev/null || { scripts/install-deps.sh venv && python3 -m venv .nvrtc-venv; }
	@.nvrtc-venv/bin/pip install -q --disable-pip-version-check nvidia-cuda-nvrtc-cu12
	@.nvrtc-venv/bin/python scripts/nvrtc-check.py
	@LD_LIBRARY_PATH="$$(echo $(CURDIR)/.nvrtc-venv/lib/python3*/site-packages/nvidia/cuda_nvrtc/lib):$$LD_LIBRARY_PATH" \
		LEAPFMM_REQUIRE_NVRTC=1 $(CARGO) test --release --test gpu_nvrtc

lint: deps
	$(CARGO) fmt --check
	$(CARGO) clippy --release --all-targets -- -D warnings

bench: build
	$(CARGO) bench
