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

.PHONY: install demo test test-floors lint format data clean

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

# The declared dependency floors, checked (docs/development.md): a separate venv with every runtime dependency of
# pyproject.toml pinned to its lower bound (.ci/floors.py), then a fixed subset of tests that reach each floor-setting
# API. Not part of `test` or CI: it downloads old releases and takes minutes. A floor that pip cannot co-install
# stops the build with pip's message. Built from scratch whenever pyproject.toml changes, so nothing newer lingers.
FLOORS_VENV  ?= .venv-floors
FLOORS_BIN   := $(FLOORS_VENV)/bin
FLOORS_STAMP := $(FLOORS_VENV)/.installed
# The test tools, at the dev extra's floors too (diffusers, triton and peft: none of FLOORS_TESTS needs them).
FLOORS_DEV   := pytest pytest-xdist pytest-timeout parameterized
# With numpy 1.x, datasets' unbounded pyarrow resolves to a release that refuses numpy < 2 on import (pyarrow does
# not declare it); 17.0.0 imports with the numpy floor (docs/development.md).
FLOORS_PINS  ?= pyarrow==17.0.0
# The README's quick model subset (with test_modeling_imixer.py's Trainer run: accelerate), then one or two tests
# per floor-setting API: kornia's CutMix, torchmetrics' FID with a float extractor and SSIM of 8×8 images, an image
# `energyformers train` (AutoImageProcessor) and a text one (tokenizers), loading from a Hub cache offline.
FLOORS_TESTS ?= tests/test_configuration.py tests/test_modeling_hyperset.py tests/test_modeling_imixer.py \
	tests/test_modeling_hyperbf.py tests/test_layout.py \
	tests/test_augmentation.py::test_cutmix_target_weights_equal_the_pasted_areas \
	tests/test_augmentation.py::test_recipe_augmentation_changes_cli_training_batches_but_not_the_saved_processor \
	tests/test_mim_metrics.py::test_fid_matches_the_frechet_distance_of_the_detector_features \
	tests/test_remote_resave.py::test_pipeline_rebuilt_from_each_saved_folder_reconstructs_as_the_export \
	tests/test_train_cli.py::test_pipeline_reloads_in_process[hyperset-image] \
	tests/test_train_cli.py::test_pipeline_reloads_in_process[imixer-text] \
	tests/test_hub.py::test_offline_loading_from_hand_made_hub_cache

$(FLOORS_STAMP): pyproject.toml .ci/floors.py
	rm -rf $(FLOORS_VENV)
	$(PY) -m venv $(FLOORS_VENV)
	$(FLOORS_BIN)/pip install -q --upgrade pip 'tomli>=1.1; python_version < "3.11"'  # .ci/floors.py reads pyproject.toml
	$(FLOORS_BIN)/python .ci/floors.py $(addprefix --with ,$(FLOORS_DEV)) > $(FLOORS_VENV)/floors.txt
	$(FLOORS_BIN)/pip install -q "$$($(FLOORS_BIN)/python .ci/floors.py --only torch)" $(if $(TORCH_INDEX),--index-url "$(TORCH_INDEX)")
	$(FLOORS_BIN)/pip install -q -r $(FLOORS_VENV)/floors.txt $(FLOORS_PINS)
	$(FLOORS_BIN)/pip install -q --no-deps -e .
	touch $(FLOORS_STAMP)

test-floors: $(FLOORS_STAMP)
	$(FLOORS_BIN)/pip list --format=freeze | grep -iE "^($$(cut -d= -f1 $(FLOORS_VENV)/floors.txt | sed 's/[-_]/[-_]/g' | paste -sd'|'))=="
	HF_HUB_OFFLINE=1 $(FLOORS_BIN)/python -m pytest -q -n $(TEST_WORKERS) -p no:randomly -rs $(foreach t,$(FLOORS_TESTS),'$(t)') $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) $(FLOORS_VENV) build *.egg-info
