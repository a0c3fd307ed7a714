# `make repro`: set-up + the pipeline on the offline default profile. `make test`: set-up + the tests.
PYTHON ?= python3
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
STAMP := $(VENV)/.installed
export PATH := $(BIN):$(PATH)
export DVC_NO_ANALYTICS := 1
# pip (not uv/poetry: torch==2.13.0 comes from the local wheel on CPU machines), without byte-compiling
# (100 s of the set-up, mostly on files nothing imports); make's commands compile a module on its first
# import, once, into one folder of the venv, never beside the sources, also where the shell sets
# PYTHONDONTWRITEBYTECODE (which would recompile on every import)
INSTALL := $(BIN)/python -m pip install --quiet --no-compile -e
export PYTHONPYCACHEPREFIX := $(CURDIR)/$(VENV)/pycache
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup test-setup repro test lint bench ui clean-venv

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(INSTALL) '.[dev]'
	touch $(STAMP)

# PROFILE=real-cpu CORPUS=<text folder> GLUE=<GLUE folder>: a profile of flows/profiles as one DVC
# experiment (dvc exp run --temp); the workspace keeps the offline default
repro: setup
ifdef PROFILE
	$(BIN)/python -m flows.profile $(PROFILE) $(if $(CORPUS),--corpus "$(CORPUS)") $(if $(GLUE),--glue "$(GLUE)")
else
	$(BIN)/dvc repro
	@echo
	@echo "GLUE report: reports/glue.md (every seed: reports/glue.csv; chart: reports/glue.png)"
	@awk '/^> \*\*Synthetic/; /^\| Model/ {t = 1} t && /^$$/ {exit} t' reports/glue.md  # the first table
	@echo "Pretrained models: checkpoints/*/final (transformers: checkpoints/*/hf). Every run: make ui"
endif

# the MLflow UI on the project's store, on 127.0.0.1; prints the page of this project's runs
UI_PORT ?= 5000
ui: setup
	@$(BIN)/python -c "from lmpipe.tracking import tracking_experiment, ui_link; \
	print('MLflow:', ui_link(tracking_experiment(), $(UI_PORT)))"
	$(BIN)/mlflow ui --backend-store-uri sqlite:///mlflow.db --host 127.0.0.1 --port $(UI_PORT)

# the tests' environment: setup's and the bench extra
# (the references of bench/, whose scripts the suite runs at a toy size), in one install
TEST_STAMP := $(VENV)/.installed-test
test-setup: $(TEST_STAMP)

$(TEST_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(INSTALL) '.[dev,bench]'
	touch $(STAMP) $@

# PYTEST_ARGS='-m "not slow"' leaves out the slow tier (real-text learning, resume, DDP, compile, fan-out)
test: $(TEST_STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check .

bench: setup
	$(INSTALL) '.[dev,bench]'
	$(BIN)/python bench/data_throughput.py
	$(BIN)/python bench/data_scale.py --sizes-mb 100 1000 --cluster
	$(BIN)/python bench/data_incremental.py
	$(BIN)/python bench/clean_reference.py
	$(BIN)/python bench/clean_reference.py --generated-mb 100
	$(BIN)/python bench/train_throughput.py
	$(BIN)/python bench/threads.py
	$(BIN)/python bench/pipeline_flow.py

clean-venv:
	rm -rf $(VENV)
