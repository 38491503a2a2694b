# Two commands do everything on a fresh machine:
#   make run    set up .venv and run the embedded default (results/table1.csv + learning curve)
#   make test   set up .venv and run the tests (unit, integration on a tiny model, workflow smoke run)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CORES ?= all

.PHONY: setup run test lint clean-results

setup: $(VENV)/.installed

# torch is pinned to the CPU build's version (2.13.0): an open range would pull the CUDA wheels.
$(VENV)/.installed: pyproject.toml envs/constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c envs/constraints.txt -e '.[dev]'
	touch $@

run: setup
	PATH="$(abspath $(BIN)):$$PATH" snakemake --cores $(CORES) results/table1.csv

test: setup
	$(BIN)/python -m pytest

lint: setup
	$(BIN)/ruff check src tests
	PATH="$(abspath $(BIN)):$$PATH" snakemake --lint

clean-results:
	rm -rf results/*
