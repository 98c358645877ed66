# The two commands: `make demo` and `make test`. Both go through `make setup`.
.PHONY: setup demo test test-all test-unit test-integration lint bench soak clean-demo

VENV := .venv
# Jobs and tools started from here find streamlearn and ray on PATH (ray job submit -- streamlearn ...).
export PATH := $(CURDIR)/.venv/bin:$(PATH)
# The venv is shared by every clone on the machine; this clone's code comes first on the path
# (for Ray's workers too, which inherit the environment).
export PYTHONPATH := $(CURDIR)
PY := $(VENV)/bin/python
DURATION ?= 0

setup:
	@scripts/setup.sh
	@$(PY) -m streamlearn.cli kafka fetch-jars

demo: setup
	@$(VENV)/bin/streamlearn demo $(if $(filter-out 0,$(DURATION)),--duration $(DURATION)) $(if $(DEMO_HOME),--home $(DEMO_HOME))

# CI runs `make test`: every guarantee, each fault in at least one ingest mode. `make test-all`
# adds the 10 tests marked `extended` (README's first screen), ~25 more minutes on 2 cores.
SUITE := -m pytest -q -p no:cacheprovider --durations=25
test: setup lint
	@$(PY) $(SUITE) -m "not extended" tests/unit tests/integration

test-all: setup lint
	@$(PY) $(SUITE) tests/unit tests/integration

test-unit: setup
	@$(PY) -m pytest -q -p no:cacheprovider tests/unit

lint: setup
	@$(VENV)/bin/ruff check streamlearn pipelines load tests

bench: setup
	@$(PY) -m load.bench.ingest

# Ten minutes of the whole service under steady load, judged against its gates (not in `make test`).
soak: setup
	@$(PY) -m load.bench.soak
