# The everyday commands (CONTRIBUTING.md). Each is one line of what .ci/run or the README runs; `make help` lists them.
.DEFAULT_GOAL := help
.PHONY: help setup demo test fast lint format typecheck bench ci

PY := .venv/bin/python
SHELL_FILES = $(shell grep -v '^\#' .ci/shell-files)

help:  ## list the commands
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

setup:  ## the .venv with the test extras (scripts/setup --test)
	scripts/setup --test

demo:  ## the demo pipeline, locally and offline (the README's first command)
	scripts/setup && .venv/bin/bcp-pipeline run demo

test:  ## the whole suite, as CI runs it (the README's second command)
	$(PY) -m pytest

fast:  ## the fast loop: no clusters, no end-to-end runs (docs/testing.md)
	$(PY) -m pytest -m "not cluster and not e2e"

lint:  ## ruff, ruff format --check and shellcheck, as .ci/run runs them
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	shellcheck --shell=bash $(SHELL_FILES)

format:  ## sort the imports and format the code (ruff)
	.venv/bin/ruff check --fix --select I .
	.venv/bin/ruff format .

typecheck:  ## mypy on bcp_pipeline/ ([tool.mypy] in pyproject.toml)
	.venv/bin/mypy

bench:  ## the stage benchmark (scripts/README.md lists the others)
	$(PY) benchmarks/bench_stages.py

ci:  ## all of CI on this machine: set-up, lint, types, the whole suite (.ci/run)
	.ci/run
