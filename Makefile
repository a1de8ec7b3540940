# The two commands a newcomer needs are `make demo` and `make test`; each sets itself up.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SUDO := $(shell [ "$$(id -u)" = 0 ] || command -v sudo)

.PHONY: help demo test check fmt lint typecheck bench system-deps clean

help:
	@echo "make demo    run gpubot end to end on its embedded defaults"
	@echo "make test    set up and run the whole test suite (SQLite and PostgreSQL)"
	@echo "make check   format check, lint, mypy --strict, then the tests"
	@echo "make bench   print the benchmark figures"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

# PostgreSQL runs in the test suite next to SQLite; the suite starts its own throwaway server.
system-deps:
	@if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then \
	  echo "installing PostgreSQL from Debian's packages"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq postgresql >/dev/null; \
	fi

test: $(STAMP) system-deps
	$(BIN)/python -m pytest

demo: $(STAMP)
	@echo "The local Slack workspace demo is coming soon; for now try:"
	@echo "  $(BIN)/gpubot rules check rules/policies"
	@echo "  $(BIN)/gpubot db upgrade && $(BIN)/gpubot leases"

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

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .ruff_cache .coverage
