# Kestrel Lab: `make book` builds the book, `make test` runs every test. Both set up .venv first.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
KL     := $(VENV)/bin/kestrel-lab
export PYTHONUNBUFFERED := 1
# No MPLBACKEND here: ipykernel installs its inline backend only when MPLBACKEND is unset, and the
# inline backend is what puts a notebook's figures into the book (kestrel_lab.plotting.setup ensures it).
unexport MPLBACKEND

.PHONY: book test system-deps env ref-env dev-env clean clean-cache rerun bench tiny-vl

# The runtime environment: requirements.txt + the package (editable, so notebooks see this checkout).
$(VENV)/.runtime-installed: requirements.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps --no-build-isolation -e . || $(PY) -m pip install -q --no-deps -e .
	@touch $@

# The reference implementations (transformers on torch CPU, tokenizers, tiktoken, safetensors, gguf):
# the book's comparison lessons run against them, so `make book` installs them. `make env` does not.
$(VENV)/.ref-installed: $(VENV)/.runtime-installed requirements-ref.txt
	$(PY) -m pip install -q -r requirements-ref.txt
	@touch $@

# Test dependencies: pytest and hypothesis on top of the references.
$(VENV)/.dev-installed: $(VENV)/.ref-installed requirements-dev.txt
	$(PY) -m pip install -q -r requirements-dev.txt
	@touch $@

env: $(VENV)/.runtime-installed
ref-env: $(VENV)/.ref-installed
dev-env: $(VENV)/.dev-installed

# CJK fonts for plots, Chromium for the browser test (Debian packages; needs root, else prints a hint).
system-deps:
	@bash scripts/system-deps.sh

# Execute the notebooks on the embedded defaults (cached: only changed notebooks re-run) and build HTML.
book: $(VENV)/.ref-installed system-deps
	$(KL) book sources
	$(KL) book sweep-cache
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

# Re-train the tiny Qwen3-VL in data/models/qwen3-tiny-vl (torch on CPU, 2 threads; see its README).
# Rewrites the committed checkpoint, logs and held-out results; never part of `make test`.
tiny-vl: $(VENV)/.ref-installed
	nice -n 10 $(PY) scripts/train_tiny_vl.py $(ARGS)

clean-cache:
	rm -rf _build/.jupyter_cache

clean:
	rm -rf _build
