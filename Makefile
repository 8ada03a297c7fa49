# Two entry points (README): `make demo` runs the main job, `make test` runs the checks.
# Both build .venv from scratch when it is missing. torch is installed first and pinned (TORCH): an unpinned
# torch resolves to the newest multi-GB CUDA build. On Linux x86_64, PyPI's torch wheels are CUDA builds even
# when pinned; TORCH_INDEX=https://download.pytorch.org/whl/cpu takes the CPU build from PyTorch's own index.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
TORCH   ?= torch==2.13.0
TORCH_INDEX ?=
STAMP   := $(VENV)/.installed

.PHONY: install demo test lint format data clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)" $(if $(TORCH_INDEX),--index-url "$(TORCH_INDEX)")
	$(BIN)/pip install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

# OMP_WAIT_POLICY=PASSIVE: idle OpenMP threads sleep instead of spinning; on a small shared CPU the spinning
# made the demo 10x slower (must be set before torch is imported, hence here).
export OMP_WAIT_POLICY ?= PASSIVE

demo: $(STAMP)
	$(BIN)/python -m energyformers train --model $${MODEL:-hyperset} --dataset digits \
		--output_dir $${OUT:-runs/demo-$${MODEL:-hyperset}} --overwrite_output_dir

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Rewrites the tree so that `lint` passes where ruff can fix it: the fixes first (import order, ...), then the
# formatting, then a check that reports what is left to fix by hand.
format: $(STAMP)
	$(BIN)/ruff check --fix --exit-zero --quiet .
	$(BIN)/ruff format .
	$(BIN)/ruff check .

# Every download the tests need (datasets, transformers' common test files), so that pytest runs offline.
data: $(STAMP)
	bash .ci/install-data.sh

# Test processes (pytest-xdist): most tests are one busy thread each (a fresh interpreter, a tiny model), so two
# processes keep a 2-core machine busy; TEST_WORKERS=0 runs the suite in this one process (to replay a test order
# exactly: with several processes the seed fixes the order, not which process runs which test).
TEST_WORKERS ?= 2

# One file, without the data and lint steps: .venv/bin/python -m pytest tests/test_x.py (docs/development.md).
test: $(STAMP) data lint
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -n $(TEST_WORKERS) $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
