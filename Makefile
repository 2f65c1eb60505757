# leapfmm — the two quick-start commands are `make run` and `make test`.
# Both install missing system packages first (as root on Debian/Ubuntu).

CARGO ?= cargo
CONFIG ?= configs/quickstart.toml

.PHONY: deps deps-mpi build run test test-mpi lint bench

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

lint: deps
	$(CARGO) fmt --check
	$(CARGO) clippy --release --all-targets -- -D warnings

bench: build
	$(CARGO) bench
