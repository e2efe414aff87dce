# The README's two commands: `make demo` and `make test`. Both create or reuse
# the project virtualenv (.venv) and install what they need.
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint install ui clean

# The dev extra takes every other extra (brokers, redis, celery, embedded, bench, ui); constraints.txt pins the
# versions the suite runs against (the package itself declares ranges).
$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]' -c constraints.txt
	@touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/batch-assets demo

# The suite runs in TEST_PROCESSES processes (pytest-xdist); --dist loadfile keeps each test file in one process,
# so the tests of a file that share a broker database or a host namespace never overlap. Most of the suite waits on
# the processes it starts (CLI runs, Dagster's daemon and webserver, leases expiring), so two processes on two cores
# nearly halve it. The tests marked `alone` (they measure a rate over 1 s windows) run after the others, in one
# process, so the other process cannot starve them (tests/conftest.py, BATCH_ASSETS_TEST_PHASE). pytest's exit 5
# (no test selected) is not a failure: a phase that selects nothing is skipped with a line, and when neither phase
# selects a test the target says so and exits 0 (make itself would turn any exit into 2, so 5 could not reach
# the caller). TEST_PROCESSES=0 runs the whole suite in this process, in one phase.
TEST_PROCESSES ?= 2
test: $(STAMP)
ifeq ($(TEST_PROCESSES),0)
	@$(BIN)/python -m pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest selected no tests (exit 5)"; exit 0; fi; exit $$rc
else
	@BATCH_ASSETS_TEST_PHASE=parallel $(BIN)/python -m pytest -n $(TEST_PROCESSES) --dist loadfile $(PYTEST_ARGS); \
	first=$$?; \
	echo "== the tests marked alone, in one process"; \
	BATCH_ASSETS_TEST_PHASE=alone $(BIN)/python -m pytest $(PYTEST_ARGS); \
	second=$$?; \
	if [ $$first -eq 5 ] && [ $$second -eq 5 ]; then echo "pytest selected no tests (exit 5)"; exit 0; fi; \
	for rc in $$first $$second; do if [ $$rc -ne 0 ] && [ $$rc -ne 5 ]; then exit $$rc; fi; done
endif

lint: $(STAMP)
	$(BIN)/ruff check .

# Dagster's UI (`dg dev`) on the CLI's instance; `make ui UI_ARGS="--port 3001"`. SIGTERM or Ctrl-C stops it
# and every process it started (batch-assets ui passes the signal on to dg dev's process group).
UI_ARGS ?=
ui: $(STAMP)
	$(BIN)/batch-assets ui $(UI_ARGS)

# The README's UI screenshots (docs/screenshots), retaken by the UI test in headless Chromium (tests/ui).
.PHONY: screenshots
screenshots: $(STAMP)
	BATCH_ASSETS_SCREENSHOTS=docs/screenshots $(BIN)/python -m pytest -q -p no:cacheprovider tests/ui -k screenshots

clean:
	rm -rf $(VENV) .batch_assets

# The fault campaign: real processes on a PostgreSQL server, a Redis and a
# limits stub that the campaign owns, plus writers of its own beside the jobs (a concurrent
# encrypted_dob editor, hostile rows, the outbox relay to RabbitMQ and NATS) and hostile declarations. `faults`
# (99 faults with both brokers, 18 of them hostile declarations, ~60 min) rewrites docs/reliability.md;
# `faults-quick` (15 faults, one of each kind, ~7 min, CI) writes its report to a temp file.
# `FAULTS_ARGS="--only hostile"` runs only the faults whose label contains the text (`--only 'hostile declaration'`:
# the declarations' catalogue alone, ~3 min).
FAULTS_ARGS ?=
.PHONY: faults faults-quick
faults: $(STAMP)
	$(BIN)/python -m faults $(FAULTS_ARGS)

faults-quick: $(STAMP)
	$(BIN)/python -m faults --quick $(FAULTS_ARGS)

# Several hosts: three test hosts on this machine (ip netns + veth, unshare --pid --uts), a celery
# sweep of 2M rows in 6 ranges and then queue workers, one host killed -9 mid-work; writes docs/hosts.md
# (~15 min; needs root, iproute2 and RabbitMQ). `HOSTS_ARGS="--only sweep --rows 300000"` for a shorter run.
HOSTS_ARGS ?=
.PHONY: hosts
hosts: $(STAMP)
	$(BIN)/python -m faults.hosts $(HOSTS_ARGS)
