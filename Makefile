# The two commands: `make demo` and `make test`. Both go through `make setup`.
.PHONY: setup demo test test-all test-unit lint bench soak

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
# Two pytest-xdist workers, each with a broker and a Ray head of its own, a whole module at a time:
# one test's waits (an outage, an idle stop, a node being added) are the other's working time.
# Tests marked `solo` count what callers see in real time; they run after, alone (DECISIONS §18).
SUITE := -m pytest -q -p no:cacheprovider --durations=25
PARALLEL := -n 2 --dist loadscope

test: setup lint
	@$(PY) $(SUITE) $(PARALLEL) -m "not extended and not solo" tests/unit tests/integration
	@$(PY) $(SUITE) -m "not extended and solo" tests/unit tests/integration

test-all: setup lint
	@$(PY) $(SUITE) $(PARALLEL) -m "not solo" tests/unit tests/integration
	@$(PY) $(SUITE) -m solo tests/unit tests/integration

test-unit: setup
	@$(PY) -m pytest -q -p no:cacheprovider tests/unit

lint: setup
	@$(VENV)/bin/ruff check streamlearn pipelines load tests

bench: setup
	@$(PY) -m load.bench.ingest

# Ten minutes of the whole service under steady load, judged against its gates (not in `make test`).
soak: setup
	@$(PY) -m load.bench.soak
