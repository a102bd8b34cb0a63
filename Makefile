# One entry point for every developer task. Each target sets up what it needs first
# (scripts/setup.sh is idempotent and takes about a second once everything is there).

VENV := .venv/bin
export TESTCONTAINERS_RYUK_DISABLED := true

.PHONY: setup demo test policy-test lint typecheck unit integration bench clean

setup:
	@bash scripts/setup.sh

demo: setup
	$(VENV)/capgate demo

test: policy-test lint typecheck unit integration
	@echo "make test: every gate passed"

policy-test: setup
	@bash scripts/policy-gate.sh

lint: setup
	$(VENV)/ruff check gateway adapters capgate tests benchmarks
	$(VENV)/ruff format --check gateway adapters capgate tests benchmarks

typecheck: setup
	$(VENV)/mypy

unit: setup
	$(VENV)/python -m pytest -m "not integration" tests

integration: setup
	$(VENV)/python -m pytest -m integration tests

bench: setup
	$(VENV)/python benchmarks/compose_scaling.py --output docs/benchmarks.md

clean:
	rm -rf .tools .venv .mypy_cache .pytest_cache .ruff_cache
