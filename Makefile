# Every target bootstraps what it needs: a pinned uv in .tools/, then the locked .venv.
SHELL := /bin/bash
PYTHON ?= python3
UV_VERSION := 0.13.8
UV := .tools/bin/uv
VENV := .venv
SYNCED := $(VENV)/.synced
export UV_PYTHON_DOWNLOADS := never
# Compile every module to bytecode at install: this machine's environment sets
# PYTHONDONTWRITEBYTECODE=1, so without it each Python process (Ray workers, Dagster runs,
# trainers, the CLI) compiles everything it imports from source, at every start.
export UV_COMPILE_BYTECODE := 1
export UV_PROJECT_ENVIRONMENT := $(VENV)
export DAGSTER_HOME ?= $(CURDIR)/.dagster_home

.PHONY: demo test test-fast lint fmt dev bench env ray-up ray-down clean system-deps test-system-deps \
	cluster-up cluster-down demo-cluster demo-mlflow mlflow-down

# System packages (scripts/system-deps installs the missing ones with apt-get): Java for
# Spark; for the tests also Debian's chromium (the UI test) and npm (Azurite).
system-deps:
	@scripts/system-deps java

test-system-deps:
	@scripts/system-deps java chromium npm postgres

$(UV):
	$(PYTHON) -m venv .tools
	.tools/bin/pip install --quiet uv==$(UV_VERSION)

$(SYNCED): pyproject.toml uv.lock | $(UV)
	$(UV) sync --frozen --quiet --python $(PYTHON)
	@touch $@

# Azurite (Azure Blob emulator, for the abfss:// tests) from npm, locked like the rest.
AZURITE := .tools/node/node_modules/.bin/azurite-blob
$(AZURITE): tests/services/package.json tests/services/package-lock.json
	@mkdir -p .tools/node
	cp tests/services/package.json tests/services/package-lock.json .tools/node/
	cd .tools/node && npm ci --no-audit --no-fund --loglevel=error
	@touch $@

# The MLflow tracking server (tests, `make demo-mlflow`) in its own locked environment:
# its mlflow pins pyarrow<26, which the platform's environment (pyarrow 26) cannot hold.
MLFLOW_SERVER := .tools/mlflow/bin/mlflow
$(MLFLOW_SERVER): tests/services/mlflow/pyproject.toml tests/services/mlflow/uv.lock | $(UV)
	UV_PROJECT_ENVIRONMENT=$(CURDIR)/.tools/mlflow $(UV) sync --frozen --quiet \
		--project tests/services/mlflow --python $(PYTHON)
	@touch $@

env: $(SYNCED)

# The project's own modules compiled too (uv compiles only what it installs; the project is
# an editable install): every process of a test run or the demo (the CLI, Dagster's runs
# and code servers, Ray jobs' drivers) imports the code location, whose modules would be
# compiled from source each time. Up-to-date files are skipped;
# a module edited afterwards is compiled from source again until the next make.
BYTECODE := $(VENV)/bin/python -m compileall -q -j 0 zipline_dagster runtime scripts tests

$(DAGSTER_HOME)/dagster.yaml:
	@mkdir -p $(DAGSTER_HOME)
	@printf 'telemetry:\n  enabled: false\n' > $@

demo: system-deps $(SYNCED) $(DAGSTER_HOME)/dagster.yaml
	@$(BYTECODE)
	$(VENV)/bin/python scripts/demo.py

# The demo with MLflow on: a local tracking server (left running, `make mlflow-down` stops
# it), every model partition an MLflow run, the champion the registry's @champion alias.
demo-mlflow: system-deps $(SYNCED) $(MLFLOW_SERVER) $(DAGSTER_HOME)/dagster.yaml
	$(VENV)/bin/python scripts/mlflow_server.py up
	MLFLOW_TRACKING_URI=$$($(VENV)/bin/python scripts/mlflow_server.py url) \
		ZIPLINE_MLFLOW_COPY_ARTIFACTS=$${ZIPLINE_MLFLOW_COPY_ARTIFACTS:-true} \
		ZIPLINE_DAGSTER_URL=$${ZIPLINE_DAGSTER_URL:-http://127.0.0.1:3000} \
		$(VENV)/bin/python scripts/demo.py

mlflow-down: $(SYNCED)
	$(VENV)/bin/python scripts/mlflow_server.py down

# The production topology on this machine (scripts/cluster.py): PostgreSQL, a Dagster
# daemon and webserver, a Ray head and two workers, a Spark master and worker, an S3 server.
cluster-up: $(SYNCED)
	@scripts/system-deps java postgres
	$(VENV)/bin/python scripts/cluster.py up

cluster-down: $(SYNCED)
	$(VENV)/bin/python scripts/cluster.py down

demo-cluster: $(SYNCED)
	$(VENV)/bin/python scripts/cluster.py demo

# Two workers (pytest-xdist): a test mostly waits on a service, so the second one fills
# the cores the first leaves idle; each worker starts its own session services and runs
# whole modules (tests/conftest.py: pytest_xdist_make_scheduler).
TEST_WORKERS ?= 2
test: test-system-deps $(SYNCED) $(AZURITE) $(MLFLOW_SERVER)
	@$(BYTECODE)
	$(VENV)/bin/pytest -n $(TEST_WORKERS) $(PYTEST_ARGS)

# The edit loop: lint, then the tests that start no service (no Ray, Spark, storage
# emulator, MLflow or browser; tests/conftest.py marks the others `service`) and are not
# marked `slow` (a whole training or Dagster run in a test's own processes).
test-fast: lint
	@$(BYTECODE)
	$(VENV)/bin/pytest -n $(TEST_WORKERS) -m "not service and not slow and not bench" $(PYTEST_ARGS)

lint: $(SYNCED)
	$(VENV)/bin/ruff check zipline_dagster runtime tests trainers scripts
	$(VENV)/bin/ruff format --check zipline_dagster runtime tests trainers scripts
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(VENV)/bin/python scripts/check_size.py zipline_dagster runtime
	@# a changed trainer, or a changed runtime/, that is not pinned again is caught here
	$(VENV)/bin/pytest -q -p no:cacheprovider tests/defs/test_code_location.py -k "builds_to_its_pin"

fmt: $(SYNCED)
	$(VENV)/bin/ruff format zipline_dagster runtime tests trainers
	$(VENV)/bin/ruff check --fix zipline_dagster runtime tests trainers

# dagster dev in its own session; Ctrl-C or SIGTERM stops all of it (scripts/dev.py)
DEV_PORT ?= 3000
dev: system-deps $(SYNCED) $(DAGSTER_HOME)/dagster.yaml
	DEV_PORT=$(DEV_PORT) $(VENV)/bin/python scripts/dev.py

bench: system-deps $(SYNCED)
	$(VENV)/bin/pytest tests/bench -m bench -s -p no:cacheprovider $(PYTEST_ARGS)
	$(VENV)/bin/python -m tests.bench.report

ray-up: $(SYNCED)
	$(VENV)/bin/zipline-dagster ray up

ray-down: $(SYNCED)
	$(VENV)/bin/zipline-dagster ray down

clean:
	rm -rf $(VENV) .tools .pytest_cache .mypy_cache .ruff_cache
