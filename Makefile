# Kestrel Lab: `make book` builds the book, `make test` runs every test. Both set up .venv first.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
KL     := $(VENV)/bin/kestrel-lab
export PYTHONUNBUFFERED := 1
export MPLBACKEND := Agg

.PHONY: book test system-deps env dev-env clean clean-cache rerun bench

# The runtime environment: requirements.txt + the package (editable, so notebooks see this checkout).
$(VENV)/.runtime-installed: requirements.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps --no-build-isolation -e . || $(PY) -m pip install -q --no-deps -e .
	@touch $@

# Test dependencies: the reference implementations the tests compare against (torch is the CPU wheel).
$(VENV)/.dev-installed: $(VENV)/.runtime-installed requirements-dev.txt
	$(PY) -m pip install -q -r requirements-dev.txt
	@touch $@

env: $(VENV)/.runtime-installed
dev-env: $(VENV)/.dev-installed

# CJK fonts for plots, Chromium for the browser test (Debian packages; needs root, else prints a hint).
system-deps:
	@bash scripts/system-deps.sh

# Execute the notebooks on the embedded defaults (cached: only changed notebooks re-run) and build HTML.
book: $(VENV)/.runtime-installed system-deps
	$(KL) book sources
	$(KL) dashboard
	$(VENV)/bin/jupyter-book build . --builder html -W -n --keep-going
	@echo "book: open _build/html/index.html"

# Everything: unit tests, the reference comparisons, every notebook executed by the book build, and
# the built book checked in headless Chromium.
test: $(VENV)/.dev-installed
	$(KL) book sources --check
	$(MAKE) book
	$(PY) -m pytest tests

# Re-run notebooks with papermill and record figures under data/measurements/$(RUNNER)/.
RUNNER ?= local
rerun: $(VENV)/.runtime-installed
	$(KL) rerun --runner $(RUNNER) $(ARGS)

bench: $(VENV)/.dev-installed
	$(KL) bench $(ARGS)

clean-cache:
	rm -rf _build/.jupyter_cache

clean:
	rm -rf _build
