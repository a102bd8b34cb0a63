# One entry point for every developer task. Each target sets up what it needs first
# (scripts/setup.sh is idempotent and takes about a second once everything is there).
# The demo sets up OPA and .venv only, and most targets `setup`: any user can run them.
# The integration tests' `setup-test` installs Debian packages (as root) and the MCP
# peers (with npm); `make images` installs and starts the Docker engine (as root).
# `make help` lists the targets: the text after "##" on each target's line.

VENV := .venv/bin
export TESTCONTAINERS_RYUK_DISABLED := true

.PHONY: setup setup-test help demo test policy-test policy-watch lint typecheck unit integration images fuzz bench clean

# The first target is the default: a bare `make` sets up and stops.
setup: ## build the pinned OPA and Regal, create .venv with the dev and mcp extras (idempotent)
	@bash scripts/setup.sh

setup-test: ## setup, plus the integration tests' PostgreSQL, Docker, debootstrap, Chromium, Prometheus (as root), MCP peers (npm)
	@bash scripts/setup.sh test

help: ## list the targets with what each does
	@echo "make targets (setup is the default):"
	@awk -F ':.*## ' '/^[a-z][a-z-]*:.*## / { printf "  %-12s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)

demo: ## build the pinned OPA, create .venv with the mcp extra, run both worked examples
	@bash scripts/setup.sh demo
	$(VENV)/capgate demo

# setup-test first: on a machine it cannot set up (a package missing and no root to
# install it, or no npm), `make test` stops there, before the gates run.
test: setup-test policy-test lint typecheck unit integration ## run every gate (what CI runs)
	@echo "make test: every gate passed"

policy-test: setup ## Rego gate: opa fmt, check --strict, input schemas (from the models), capabilities (no network), regal, opa test + coverage
	@bash scripts/policy-gate.sh

policy-watch: setup ## re-run the policy gate on every save under policies/ (Ctrl-C stops)
	@bash scripts/policy-watch.sh

lint: setup ## ruff check and ruff format --check over the Python code and tests
	$(VENV)/ruff check gateway adapters capgate tests benchmarks
	$(VENV)/ruff format --check gateway adapters capgate tests benchmarks

typecheck: setup ## strict mypy over gateway, adapters and capgate
	$(VENV)/mypy

unit: setup ## fast tests of the Python logic (no OPA)
	$(VENV)/python -m pytest -m "not integration" tests

# The Docker engine is started for the run when none answers (as root; installed from
# Debian's packages when missing) and stopped again afterwards if this run started it;
# the images are built locally first (nothing is pulled). Without an engine it can
# use, the run fails saying why: container-backed tests are never skipped.
integration: setup-test ## tests against real OPA (local processes and containers), set-up scripts, a short fuzz run
	@bash scripts/docker-engine.sh run bash -c \
		'bash scripts/docker-images.sh && $(VENV)/python -m pytest -m integration tests'

images: setup ## start the Docker engine if none answers; build the OPA, Python-base and gateway images
	@bash scripts/docker-engine.sh start
	@bash scripts/docker-images.sh

# The long fuzz run (tests/fuzz/runs.py): hypothesis properties with FUZZ_EXAMPLES
# examples each, every atheris target for FUZZ_SECONDS; the same fixed seeds as the
# short run in `make integration`. Override either: make fuzz FUZZ_SECONDS=600
FUZZ_EXAMPLES ?= 5000
FUZZ_SECONDS ?= 120
fuzz: setup ## the long fuzz run: 5,000 examples per property, 2 minutes per atheris target
	CAPGATE_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) CAPGATE_ATHERIS_SECONDS=$(FUZZ_SECONDS) \
		$(VENV)/python -m pytest -m integration tests/fuzz

bench: setup ## measure every goal of issue 9, the whole-catalogue questions, the answer reader and the worker's latency, into docs/benchmarks.md and .svg
	$(VENV)/python benchmarks/compose_scaling.py --output docs/benchmarks.md
	$(VENV)/python benchmarks/whole_catalogue.py --append docs/benchmarks.md
	$(VENV)/python benchmarks/answer_readers.py --append docs/benchmarks.md
	$(VENV)/python benchmarks/worker_latency.py --append docs/benchmarks.md

clean: ## stop the Docker engine set-up started; remove .tools (binaries, images, logs), .venv, caches
	@bash scripts/docker-engine.sh stop
	rm -rf .tools .venv .mypy_cache .pytest_cache .ruff_cache .hypothesis
