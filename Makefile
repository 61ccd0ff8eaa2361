# make run: set up .venv and run the demo (the daemon refreshing a local demo web).
# make test: set up .venv and run the whole test suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint typecheck bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,analysis]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/refresher demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check refresher policies tests bench analysis
	$(BIN)/ruff format --check refresher policies

typecheck: $(STAMP)
	$(BIN)/mypy refresher
	$(BIN)/mypy --strict analysis

bench: $(STAMP)
	$(BIN)/python bench/bench_daemon.py

clean:
	rm -rf $(VENV) var build *.egg-info
