# Two commands: `make run` (the binding study) and `make test`. Both bootstrap .venv when it is
# missing or stale; `make run-all` runs every study.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.repdiag-installed
# The torch pair that installs from this machine's local wheels; any recent pair works elsewhere.
TORCH_PINS ?= torch==2.14.1 torchvision==0.29.1
CORES ?= all
# `make run` builds the main study; STUDY=all (or `make run-all`) every study, one target per
# study otherwise (identifiability, alignment; cifar, sugarcrepe where enabled).
STUDY ?= binding
SNAKEMAKE_ARGS ?=
# pytest-xdist workers for `make test` (auto: one per core); tests that share an expensive
# fixture stay on one worker (--dist loadgroup), shared workflow runs are built once
# (tests/shared_runs.py). TEST_WORKERS=0 runs the suite in one process.
TEST_WORKERS ?= auto

export MPLBACKEND := Agg
export PYTHONHASHSEED := 0

.PHONY: run run-all test test-slurm setup lint format docs clean-results

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip uv
	# Everything through uv, which unpacks and byte-compiles in parallel: the torch pair first,
	# with pip's configured extra indexes (uv reads no pip configuration; on this kind of machine
	# they are local folders holding the pair and its CUDA libraries: 33 s against pip's 62 s),
	# then the package and the rest from the default index, keeping that torch. Byte-compiled at
	# install: where PYTHONDONTWRITEBYTECODE is set (this machine's CI), a package installed
	# without it is compiled again by every process that imports it.
	UV_EXTRA_INDEX_URL="$$($(BIN)/python -m pip config get global.extra-index-url 2>/dev/null || true)" \
		$(BIN)/uv pip install -q --python $(BIN)/python --compile-bytecode $(TORCH_PINS)
	$(BIN)/uv pip install -q --python $(BIN)/python --compile-bytecode -e '.[dev]'
	@touch $(STAMP)

# The config is validated before Snakemake reads it: Snakemake evaluates template (YTE) configs
# while reading them, repdiag validate refuses them without running anything (README, Security).
run: setup
	$(BIN)/repdiag validate config/config.yaml
	$(BIN)/repdiag run --cores $(CORES) $(STUDY) $(SNAKEMAKE_ARGS)

run-all: setup
	$(BIN)/repdiag validate config/config.yaml
	$(BIN)/repdiag run --cores $(CORES) all $(SNAKEMAKE_ARGS)

lint: setup
	$(BIN)/ruff check repdiag workflow_scripts tests benchmarks tools
	$(BIN)/ruff format --check repdiag workflow_scripts tests benchmarks tools
	$(BIN)/snakefmt --check Snakefile rules
	$(BIN)/snakemake --lint --cores 1

# Each run records its per-test and per-fixture times in logs/test-times (tests/timing.py);
# `.venv/bin/python benchmarks/tests.py --from logs/test-times` prints where the time went.
test: setup lint
	rm -rf logs/test-times
	REPDIAG_TEST_TIMES=$(CURDIR)/logs/test-times $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup

# The SLURM profile against a real single-node SLURM (installs slurm-wlm with apt-get; root).
test-slurm: setup
	$(BIN)/python -m pytest -q -m slurm tests/slurm

format: setup
	$(BIN)/ruff check --fix repdiag workflow_scripts tests benchmarks tools
	$(BIN)/ruff format repdiag workflow_scripts tests benchmarks tools
	$(BIN)/snakefmt Snakefile rules

# docs/configuration.md from the schemas' descriptions, docs/contracts.md's store tables from the
# contracts the readers check (a test fails when either is stale).
docs: setup
	$(BIN)/python tools/schema_docs.py
	$(BIN)/python -m repdiag.contracts

clean-results:
	rm -rf results .snakemake/incomplete
