# The README's two commands: `make demo` and `make test`. Both create or reuse
# the project virtualenv (.venv) and install what they need.
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint install ui clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/batch-assets demo

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .

ui: $(STAMP)
	$(BIN)/batch-assets ui

clean:
	rm -rf $(VENV) .batch_assets

# The fault campaign (issue 8): real processes on a PostgreSQL server, a Redis and a
# limits stub that the campaign owns. `faults` (>= 50 faults, ~40 min) rewrites
# docs/reliability.md; `faults-quick` (~8 faults, CI) writes its report to a temp file.
FAULTS_ARGS ?=
.PHONY: faults faults-quick
faults: $(STAMP)
	$(BIN)/python -m faults $(FAULTS_ARGS)

faults-quick: $(STAMP)
	$(BIN)/python -m faults --quick $(FAULTS_ARGS)
