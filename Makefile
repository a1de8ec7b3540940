# The two commands a newcomer needs are `make demo` and `make test`; each sets itself up.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SUDO := $(shell [ "$$(id -u)" = 0 ] || command -v sudo)
PORT ?= 8080
# The suite's worker processes (pytest-xdist), one per core: more would starve the tests that
# hold the bot to its ack and timing budgets. Tests are handed out one at a time, the long ones
# (marked slow) first, so both workers stay busy to the end; those sharing a module- or
# package-scoped set-up go to one worker together (tests/conftest.py groups and orders them for
# --dist loadgroup).
TEST_WORKERS ?= $(shell nproc)

.PHONY: help demo test check fmt lint typecheck bench imports screenshots system-deps clean

help:
	@echo "make demo    the local Slack workspace at http://127.0.0.1:$(PORT)/ (PORT=... to move it)"
	@echo "make test    set up and run the whole test suite (SQLite and PostgreSQL)"
	@echo "make check   format check, lint, mypy --strict, then the tests"
	@echo "make bench   print the benchmark figures"
	@echo "make imports print the import graph, its cycles and the module sizes"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,reports]'
	touch $(STAMP)

# PostgreSQL runs in the test suite next to SQLite; the suite starts its own throwaway server.
system-deps:
	@if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then \
	  echo "installing PostgreSQL from Debian's packages"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq postgresql >/dev/null; \
	fi
# The browser tests drive Debian's chromium through Playwright (never `playwright install`).
	@if [ ! -x /usr/bin/chromium ]; then \
	  echo "installing Chromium from Debian's packages"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium >/dev/null; \
	fi

# Under coverage (branch coverage of bot, rules and storage); below the floor in pyproject.toml
# ([tool.coverage.report] fail_under) the target fails.
test: $(STAMP) system-deps
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup --cov --cov-report= --durations=25
	@printf 'coverage (branch, of bot, rules and storage), %%: '; $(BIN)/python -m coverage report --format=total

# The bot, the local Slack API and the page, on 127.0.0.1 only; Ctrl-C stops it.
# GPUBOT_STARTED_BY=make: a taken port's hint then says `make demo PORT=…`, not `--port`.
demo: $(STAMP)
	GPUBOT_STARTED_BY=make $(BIN)/gpubot demo --port $(PORT)

# Rewrites the PNGs in docs/ that the README shows, from the browser tests.
screenshots: $(STAMP) system-deps
	GPUBOT_SCREENSHOTS=1 $(BIN)/python -m pytest -q tests/browser

fmt: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

lint: $(STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

typecheck: $(STAMP)
	$(BIN)/mypy bot rules storage tests

check: lint typecheck test

bench: $(STAMP)
	$(BIN)/python -m tests.bench.rules
	$(BIN)/python -m tests.bench.ack
	$(BIN)/python -m tests.bench.sweep
	$(BIN)/python -m tests.bench.fairness
	$(BIN)/python -m tests.bench.reports
	$(BIN)/python -m tests.bench.simulate
	$(BIN)/python -m tests.bench.scale

# The package-level import graph, every cycle and each module's size (tests/imports.py);
# tests/unit/test_architecture.py guards the same graph.
imports: $(STAMP)
	$(BIN)/python -m tests.imports

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .ruff_cache .coverage
