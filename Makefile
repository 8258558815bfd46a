# Kestrel Lab: `make book` builds the book, `make test` runs every test. Both set up .venv first.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
KL     := $(VENV)/bin/kestrel-lab
export PYTHONUNBUFFERED := 1
# No MPLBACKEND here: ipykernel installs its inline backend only when MPLBACKEND is unset, and the
# inline backend is what puts a notebook's figures into the book (kestrel_lab.plotting.setup ensures it).
unexport MPLBACKEND

.PHONY: book test system-deps env ref-env dev-env test-env student clean clean-cache rerun bench board-test board-smoke tiny-vl tiny-vl-wide peers

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

# Test dependencies: pytest, hypothesis and ruff on top of the references.
$(VENV)/.dev-installed: $(VENV)/.ref-installed requirements-dev.txt requirements-test.txt
	$(PY) -m pip install -q -r requirements-dev.txt
	@touch $@

# pytest and hypothesis alone on top of the runtime: what a board needs for `make board-test` (no torch).
$(VENV)/.test-installed: $(VENV)/.runtime-installed requirements-test.txt
	$(PY) -m pip install -q -r requirements-test.txt
	@touch $@

# JupyterLab on top of the runtime, for the student notebooks (`make student`); the book build does not need it.
$(VENV)/.student-installed: $(VENV)/.runtime-installed requirements-student.txt
	$(PY) -m pip install -q -r requirements-student.txt
	@touch $@

env: $(VENV)/.runtime-installed
ref-env: $(VENV)/.ref-installed
dev-env: $(VENV)/.dev-installed
test-env: $(VENV)/.test-installed

# CJK fonts for plots, Chromium for the browser test (Debian packages; needs root, else prints a hint).
system-deps:
	@bash scripts/system-deps.sh

# Execute the notebooks on the embedded defaults (cached: only changed notebooks re-run; one kernel at a
# time) and build HTML; then report each notebook's seconds and peak RSS against its budget (60 s, 2 GiB).
# KESTREL_STUDENT=off: the book's exercise checks never use a student's workspace (book/student.md).
book: $(VENV)/.ref-installed system-deps
	$(KL) book sources
	$(KL) book sweep-cache
	$(KL) dashboard
	KESTREL_STUDENT=off $(VENV)/bin/jupyter-book build . --builder html -W -n --keep-going
	$(KL) book report
	@echo "book: open _build/html/index.html"

# Everything: the lint (ruff, configured in pyproject.toml), unit tests, the reference comparisons, every
# notebook executed by the book build, and the built book checked in headless Chromium. The two generated
# pages (module map, dashboard) must be committed up to date first: the build rewrites them, and a
# rewritten page makes the tree dirty, so every figure of that book would read <commit>+dirty.
test: $(VENV)/.dev-installed
	$(VENV)/bin/ruff check
	$(KL) book sources --check
	$(KL) dashboard --check
	$(MAKE) book
	$(PY) -m pytest tests

# The student's side (book/student.md): the workspace (`student init` at STUDENT_DIR, only when none is
# configured yet) and the lessons without their answers in <workspace>/notebooks, to open in JupyterLab.
STUDENT_DIR ?= $(HOME)/kestrel-student
student: $(VENV)/.student-installed
	@$(PY) -c 'from kestrel_lab import seam; raise SystemExit(0 if seam.configured() else 1)' \
		|| $(KL) student init $(STUDENT_DIR)
	$(KL) student notebooks $(ARGS)
	@echo "student: open them with $(VENV)/bin/jupyter lab; check your pieces with $(KL) student check"

# Re-run notebooks with papermill and record figures under data/measurements/$(RUNNER)/.
RUNNER ?= local
rerun: $(VENV)/.runtime-installed
	$(KL) rerun --runner $(RUNNER) $(ARGS)

# The engine's figures; PyTorch's beside them when the references are installed (`make ref-env`),
# else the bench says it skipped them. A board needs only `make env`.
bench: $(VENV)/.runtime-installed
	$(KL) bench $(ARGS)

# llama.cpp's llama-bench and llama-quantize from the pinned llama-cpp-python sdist, for
# `kestrel-lab bench --peer llama.cpp` (day29_1, day29_2). Optional, minutes on 2 cores; never part of
# `make test` or CI. See scripts/build-peers.sh and the README.
peers: $(VENV)/.ref-installed
	PY=$(abspath $(PY)) JOBS=$(or $(JOBS),2) bash scripts/build-peers.sh

# Re-train the tiny Qwen3-VL in data/models/qwen3-tiny-vl (torch on CPU, 2 threads; see its README):
# stage 1 (1,200 steps from the poem model) into the cache, then stage 2 (700 steps on the seeds after
# stage 1's) from it into the model folder, with the held-out evaluation. Rewrites the committed
# checkpoint, logs and held-out results; never part of `make test`. Afterwards:
# scripts/tiny_vl_agreement.py and `kestrel-lab golden update --model qwen3-tiny-vl`.
TINY_VL_STAGE1 ?= $(shell $(PYTHON) -c 'import os, pathlib; print(pathlib.Path(os.environ.get("KESTREL_CACHE_DIR") or pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache") / "kestrel_lab") / "tiny-vl-stage1")')
tiny-vl: $(VENV)/.ref-installed
	nice -n 10 $(PY) scripts/train_tiny_vl.py --out $(TINY_VL_STAGE1) --no-eval
	nice -n 10 $(PY) scripts/train_tiny_vl.py --init-from $(TINY_VL_STAGE1) $(ARGS)

# Issue 27's stage 3: from the committed model, train on the wide drawer (synthetic.sample_wide: the sizes,
# picture sizes, colours and edges a student draws), then both held-out sets are evaluated by transformers.
# One torch thread: on the shared 2-core machine a --quick wide run took 1.3 s per step of 4 with one thread
# and 54 s with two (load 6-12; two threads spin against other jobs). With a GPU pass ARGS="--device cuda". Afterwards
# scripts/eval_tiny_vl.py (engine columns), scripts/tiny_vl_agreement.py and the golden update as above.
# Every 5th seed comes from the default drawer, so today's held-out set stays learned. On a quiet machine
# pass ARGS="--threads 2" (3.1 s per step of 16 against 5.1 s with one thread, measured on a quiet 2-vCPU EPYC).
# ARGS="--small-share 0.5" draws half the wide shapes from 24 to 70 px (the sizes the model misses most);
# each stage's exact command is in the model's README and training.json.
TINY_VL_WIDE_STEPS ?= 1200
tiny-vl-wide: $(VENV)/.ref-installed
	nice -n 10 $(PY) scripts/train_tiny_vl.py --init-from data/models/qwen3-tiny-vl --drawer wide --default-every 5 --steps $(TINY_VL_WIDE_STEPS) --threads 1 $(ARGS)

# The package's unit and reference-free tests (the `board` marker: tests/board_subset.txt) under a
# time limit: what a board (or the emulated one of `make board-smoke`) runs. No torch, no book build.
BOARD_TEST_LIMIT_S ?= 1800
board-test: $(VENV)/.test-installed
	timeout $(BOARD_TEST_LIMIT_S) $(PY) -m pytest -m board -q -p no:cacheprovider

# The board path checked without a board, in an emulated arm64 Debian 12 (qemu-user-static). Needs
# root; never part of `make test` or CI. See scripts/board-smoke.sh and book/rerun.md.
board-smoke:
	bash scripts/board-smoke.sh

clean-cache:
	rm -rf _build/.jupyter_cache

clean:
	rm -rf _build
