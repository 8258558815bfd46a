"""Re-run the book's notebooks with papermill on any runner, and publish their measured figures.

The loop the book depends on: an operator runs ``kestrel-lab rerun --runner rk3588-a76 --days 16-18``
on a board; each notebook is executed by papermill into a run folder ``runs/<runner>/<UTC time>/``
with ``runner`` (and any ``-p KEY VALUE``) injected as parameters; each notebook's figures, which its
``measure.Recorder`` saves at the end, are published into ``data/measurements/<runner>/<id>.json``;
the book then shows them beside the article's and this build's figures.

Why the pieces look the way they do:

* Each notebook runs in its own worker process (``python -m kestrel_lab.runner --worker``), in its own
  process session. The worker pins itself (``--cpus``; the kernel inherits the affinity and
  ``NUMBA_NUM_THREADS``), and the parent can stop the whole group — worker and kernel — when the
  notebook overruns or the operator presses Ctrl-C.
* A notebook's ``Recorder.save()`` writes into a staging folder inside the run folder
  (``measure.STAGE_ENV``); the runner validates that file and moves it into data/measurements/ only
  after the *whole* notebook succeeded. A notebook that fails, times out or is interrupted — even after
  its ``save()`` cell — never replaces that runner's previous good figures, nor touches another
  notebook's or another runner's.
* Figures are reproducible only from a committed tree: a figure's provenance names the commit it was
  measured with, and ``<commit>+dirty`` names no code anyone can check out again. So ``rerun``
  refuses to start (and to publish) while the checkout has uncommitted changes (``dirty_files``),
  unless ``--allow-dirty`` says so on purpose — which is then recorded in every published file's
  provenance (``allow_dirty: true``) and in the run folder's ``run.json``.
* The run folder keeps ``run.json`` (the state of every notebook), the executed notebooks and their
  logs, so that re-running the same command resumes: notebooks already done there are skipped unless
  ``--force``.

Taught in day28_2.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import io
import json
import math
import os
import re
import signal
import subprocess
import sys
import tarfile
import threading
import time
import zipfile
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass
from pathlib import Path

from kestrel_lab import measure
from kestrel_lab.atomic import atomic_write, write_json
from kestrel_lab.machine import DIRTY_IGNORED, dirty_files  # noqa: F401 - re-exported for the re-run loop
from kestrel_lab.paths import REPO_ROOT, measurements_dir

STATE_FILE = "run.json"
STAGE = "stage"
KERNEL_GRACE_S = 30  # on top of --timeout, for the kernel to start and stop before the worker is killed
DEFAULT_TIMEOUT_S = 1800
MAX_IMPORT_FILE = 8 * 2**20
ID_ARG = re.compile(r"^(?:day)?(\d{1,2})_([123])$")
OK = "ok"


class RunnerError(ValueError):
    """Bad arguments or state for a re-run (an unknown notebook, a bad --cpus range, …)."""


def dirty_refusal(files: list[str], repo: Path | None = None, limit: int = 10) -> str:
    """The message that refuses a re-run from a dirty tree: which files, and how to proceed."""
    shown = ", ".join(files[:limit]) + (f" … and {len(files) - limit} more" if len(files) > limit else "")
    return (f"refused: the checkout {repo or REPO_ROOT} has uncommitted changes in {len(files)} file"
            f"{'s' if len(files) != 1 else ''} ({shown}). Figures measured from it would carry the commit "
            f"'<commit>+dirty', which nobody can check out to reproduce them. Commit the changes (or "
            f"`git stash` them) and run the same command again; or pass --allow-dirty to publish the "
            f"figures anyway (each file's provenance then says allow_dirty: true).")


# --------------------------------------------------------------------------- argument parsing
def parse_days(spec: str) -> list[int]:
    """``"16-18"`` -> [16, 17, 18]; ``"1,3,5-6"`` -> [1, 3, 5, 6]. Taught in day28_2."""
    days: set[int] = set()
    for part in spec.split(","):
        m = re.fullmatch(r"\s*(\d{1,2})\s*(?:-\s*(\d{1,2})\s*)?", part)
        if not m:
            raise RunnerError(f"--days {spec!r}: {part!r} is not a day or a range like 16-18")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if not 1 <= lo <= hi <= 30:
            raise RunnerError(f"--days {spec!r}: {part!r} is outside days 1-30 or reversed")
        days.update(range(lo, hi + 1))
    return sorted(days)


def parse_cpus(spec: str) -> list[int]:
    """``"4-7"`` -> [4, 5, 6, 7] (the A76 cluster of an RK3588); every CPU must be usable here.

    Taught in day28_2.
    """
    cpus: set[int] = set()
    for part in spec.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not m or int(m.group(2) or m.group(1)) < int(m.group(1)):
            raise RunnerError(f"--cpus {spec!r}: {part!r} is not a CPU number or a range like 4-7")
        cpus.update(range(int(m.group(1)), int(m.group(2) or m.group(1)) + 1))
    usable = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
    missing = sorted(cpus - usable)
    if missing:
        raise RunnerError(f"--cpus {spec!r}: CPU(s) {missing} are not available to this process "
                          f"(usable: {sorted(usable)}; see `kestrel-lab runner-info`)")
    return sorted(cpus)


def parse_value(text: str):
    """A ``-p`` value as papermill would want it: true/false/none, an int, a float, else the text.

    Taught in day28_2.
    """
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for kind in (int, float):
        with contextlib.suppress(ValueError):
            return kind(text)
    return text


def parse_parameters(pairs: list[list[str]] | None) -> dict:
    """``-p KEY VALUE`` pairs -> a dict; refuses names that are not Python names, and ``runner``
    (which ``--runner`` sets). Taught in day28_2."""
    params = {}
    for key, value in pairs or []:
        if not key.isidentifier():
            raise RunnerError(f"-p {key} {value}: {key!r} is not a Python name")
        if key == "runner":
            raise RunnerError("-p runner …: the runner label is set by --runner")
        params[key] = parse_value(value)
    return params


def select_notebooks(root: Path = REPO_ROOT, days: list[int] | None = None,
                     ids: list[str] | None = None) -> dict[str, Path]:
    """The notebooks to run, id -> absolute path, in book order. Nothing selected = all written.

    Taught in day28_2.
    """
    from kestrel_lab import syllabus

    found = {k: (root / v) for k, v in syllabus.find_notebooks(root).items()}
    if ids:
        wanted = []
        for raw in ids:
            m = ID_ARG.match(raw.strip())
            if not m:
                raise RunnerError(f"--notebooks: {raw!r} is not a notebook id like day16_3")
            nb = f"day{int(m.group(1)):02d}_{m.group(2)}"
            if nb not in found:
                raise RunnerError(f"--notebooks: {nb} has no notebook under {root / 'notebooks'} "
                                  f"(written: {', '.join(found) or 'none'})")
            wanted.append(nb)
        chosen = {k: found[k] for k in sorted(set(wanted))}
    else:
        chosen = dict(found)
    if days:
        chosen = {k: v for k, v in chosen.items() if int(k[3:5]) in days}
    if not chosen:
        raise RunnerError(f"no written notebook matches the selection under {root / 'notebooks'}")
    return chosen


def declared_parameters(path: Path) -> set[str]:
    """Names assigned in a notebook's ``parameters`` cell (what ``-p`` can set). Taught in day28_2."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code" and "parameters" in cell.get("metadata", {}).get("tags", []):
            return set(re.findall(r"^([A-Za-z_]\w*)\s*(?::[^=]*)?=", cell.source, re.MULTILINE))
    return set()


# --------------------------------------------------------------------------- run folders
def utc_stamp(now: _dt.datetime | None = None) -> str:
    """``20261130T120000Z``: run folders sort by name in time order, on any machine. Taught in day28_2."""
    return (now or _dt.datetime.now(_dt.timezone.utc)).strftime("%Y%m%dT%H%M%SZ")


@dataclass
class Result:
    """What happened to one notebook in a run. Taught in day28_2."""

    notebook: str
    status: str  # ok, failed, timeout, crashed, interrupted, not run
    seconds: float | None = None
    figures: int | None = None  # measured figures published
    not_measured: int = 0
    error: str | None = None
    output: str | None = None  # the executed notebook, relative to the run folder
    finished: str | None = None
    earlier: bool = False  # done in an earlier invocation on this run folder (skipped now)


class RunFolder:
    """``runs/<runner>/<UTC stamp>/``: executed notebooks, logs, staging, and ``run.json``.

    Taught in day28_2.
    """

    def __init__(self, path: Path, state: dict):
        self.path = Path(path)
        self.state = state
        self._lock = threading.Lock()

    @classmethod
    def load(cls, path: Path) -> "RunFolder":
        file = Path(path) / STATE_FILE
        try:
            state = json.loads(file.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise RunnerError(f"{file}: not valid JSON at line {e.lineno}, column {e.colno} "
                              f"(byte offset {e.pos}): {e.msg}") from e
        if not isinstance(state, dict) or not isinstance(state.get("notebooks"), dict):
            raise RunnerError(f"{file}: field 'notebooks' is missing: not a kestrel-lab run folder")
        return cls(path, state)

    @classmethod
    def create(cls, runs_root: Path, runner: str, params: dict, **settings) -> "RunFolder":
        base = Path(runs_root) / runner
        stamp = utc_stamp()
        path, n = base / stamp, 1
        while path.exists():
            n += 1
            path = base / f"{stamp}-{n}"
        path.mkdir(parents=True)
        state = {"runner": runner, "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                 "parameters": params, "complete": False, **settings, "notebooks": {}}
        folder = cls(path, state)
        folder.save()
        return folder

    @classmethod
    def resume_or_create(cls, runs_root: Path, runner: str, params: dict, *, new: bool = False,
                         **settings) -> tuple["RunFolder", str]:
        """The latest unfinished run folder of ``runner`` with the same parameters, else a new one."""
        base = Path(runs_root) / runner
        if not new and base.is_dir():
            latest = sorted((p for p in base.iterdir() if (p / STATE_FILE).is_file()), key=lambda p: p.name)
            if latest:
                folder = cls.load(latest[-1])
                if not folder.state.get("complete"):
                    if folder.state.get("parameters") == params:
                        folder.state.update(settings)
                        return folder, "resumed"
                    return cls.create(runs_root, runner, params, **settings), (
                        f"new (the unfinished {latest[-1].name} had parameters "
                        f"{folder.state.get('parameters')})")
        return cls.create(runs_root, runner, params, **settings), "new"

    def save(self) -> None:
        with self._lock:
            write_json(self.path / STATE_FILE, self.state)

    def done(self, notebook: str) -> bool:
        return self.state["notebooks"].get(notebook, {}).get("status") == OK

    def record(self, result: Result) -> None:
        entry = asdict(result)
        entry.pop("earlier")
        with self._lock:
            self.state["notebooks"][result.notebook] = entry
        self.save()

    def result(self, notebook: str) -> Result:
        entry = dict(self.state["notebooks"][notebook])
        return Result(**{k: entry.get(k) for k in Result.__dataclass_fields__ if k != "earlier"},
                      earlier=True)


# --------------------------------------------------------------------------- executing one notebook
def _count(doc: dict) -> tuple[int, int]:
    figs = doc["figures"]
    nm = sum(f["status"] == "not_measured" for f in figs)
    return len(figs) - nm, nm


def publish(staged: Path, runner: str, notebook: str, root: Path | None = None,
            rerun_info: dict | None = None, allow_dirty: bool = False) -> Path:
    """Validate a staged measurements file and write it atomically to ``<root>/<runner>/<notebook>.json``.

    Refuses a file that claims another runner or notebook: the runner writes only its own label.
    ``rerun_info`` (seconds, run folder, pinning) is added to the provenance as ``rerun``, so the book
    can say how long each notebook took on each runner. ``allow_dirty`` (``--allow-dirty``) is written
    into the provenance as ``allow_dirty: true``, so a figure published from a dirty tree says it was
    published so on purpose. Taught in day28_2.
    """
    doc = measure.load_file(staged)
    if doc["provenance"]["runner"] != runner:
        raise measure.MeasurementError(f"{staged}: field 'provenance.runner' is "
                                       f"{doc['provenance']['runner']!r}, this run is {runner!r}")
    if doc["notebook"] != notebook:
        raise measure.MeasurementError(f"{staged}: field 'notebook' is {doc['notebook']!r}, expected {notebook!r}")
    target = (root or measurements_dir()) / runner / f"{notebook}.json"
    if rerun_info:
        doc["provenance"]["rerun"] = rerun_info
    if allow_dirty:
        doc["provenance"]["allow_dirty"] = True
    measure.validate(doc, where=str(staged))
    return write_json(target, doc)


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        proc.wait(timeout=10)


class _Executor:
    """Runs notebooks in worker processes; tracks them so that Ctrl-C stops them all."""

    def __init__(self, folder: RunFolder, runner: str, params: dict, *, timeout: float,
                 cpus: list[int] | None, measurements_root: Path | None, kernel: str,
                 allow_dirty: bool = False, repo: Path | None = None):
        self.folder, self.runner, self.params = folder, runner, params
        self.allow_dirty, self.repo = allow_dirty, repo
        self.timeout, self.cpus, self.root, self.kernel = timeout, cpus, measurements_root, kernel
        self.procs: set[subprocess.Popen] = set()
        self.lock = threading.Lock()
        self.stopping = False

    def stop_all(self) -> None:
        self.stopping = True
        with self.lock:
            procs = list(self.procs)
        for p in procs:
            _kill_group(p)

    def run(self, notebook: str, src: Path) -> Result:
        run = self.folder.path
        out = run / f"{notebook}.ipynb"
        log = run / f"{notebook}.log"
        stage = run / STAGE / notebook
        result_file = run / f".{notebook}.result.json"
        for stale in [result_file, *stage.rglob("*.json")] if stage.exists() else [result_file]:
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()
        stage.mkdir(parents=True, exist_ok=True)
        spec = {"input": str(src), "output": str(out), "cwd": str(src.parent), "kernel": self.kernel,
                "parameters": {"runner": self.runner, **self.params}, "timeout": self.timeout,
                "cpus": self.cpus, "result": str(result_file)}
        spec_file = run / f".{notebook}.spec.json"
        write_json(spec_file, spec)
        env = dict(os.environ)
        env[measure.STAGE_ENV] = str(stage)
        env.pop("MPLBACKEND", None)  # the kernel then uses the inline backend: figures land in the output
        env["PYTHONUNBUFFERED"] = "1"
        if self.cpus:
            env["NUMBA_NUM_THREADS"] = str(len(self.cpus))
            env.setdefault("OMP_NUM_THREADS", str(len(self.cpus)))
            env.setdefault("OPENBLAS_NUM_THREADS", str(len(self.cpus)))
        t0 = time.monotonic()
        status = error = None
        if self.stopping:
            return Result(notebook, "interrupted", 0.0, error="stopped by Ctrl-C")
        with open(log, "wb") as logf:
            proc = subprocess.Popen([sys.executable, "-m", "kestrel_lab.runner", "--worker", str(spec_file)],
                                    stdout=logf, stderr=subprocess.STDOUT, env=env, start_new_session=True)
            with self.lock:
                self.procs.add(proc)
                if self.stopping:  # Ctrl-C came between the check above and the start
                    _kill_group(proc)
            try:
                proc.wait(timeout=self.timeout + KERNEL_GRACE_S)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                status = "timeout"
                error = (f"stopped after {self.timeout + KERNEL_GRACE_S:.0f} s "
                         f"(--timeout {self.timeout:g} + kernel start/stop)")
            finally:
                with self.lock:
                    self.procs.discard(proc)
        seconds = time.monotonic() - t0
        if status is None:
            if self.stopping:
                status, error = "interrupted", "stopped by Ctrl-C"
            else:
                try:
                    res = json.loads(result_file.read_text(encoding="utf-8"))
                    status, error = res["status"], res.get("error")
                except (OSError, ValueError, KeyError):
                    status = "crashed"
                    error = f"worker exited with code {proc.returncode} without a result; see {log.name}"
        result = Result(notebook, status, round(seconds, 1), error=error,
                        output=out.name if out.exists() else None,
                        finished=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
        staged = stage / self.runner / f"{notebook}.json"
        extra = sorted(p.relative_to(stage).as_posix() for p in stage.rglob("*.json") if p != staged)
        if status == OK:
            dirty = None if self.allow_dirty else dirty_files(self.repo)
            if staged.exists() and dirty:  # the tree changed while the notebook ran
                result.status, result.error = "failed", ("its figures were not published: "
                                                         + dirty_refusal(dirty, self.repo))
            elif staged.exists():
                try:
                    doc = measure.load_file(staged)
                    info = {"seconds": result.seconds, "run": self.folder.path.name, "timeout": self.timeout,
                            "cpus": self.cpus, "jobs": self.folder.state.get("jobs", 1)}
                    if self.allow_dirty:
                        info["allow_dirty"] = True
                    publish(staged, self.runner, notebook, self.root, rerun_info=info,
                            allow_dirty=self.allow_dirty)
                    result.figures, result.not_measured = _count(doc)
                except (OSError, ValueError) as e:
                    result.status, result.error = "failed", f"its figures were not published: {e}"
            if extra:
                note = (f"ignored figures saved under another runner or notebook id: {', '.join(extra)} "
                        f"(a Recorder that does not use the injected `runner` parameter?)")
                result.error = f"{result.error}; {note}" if result.error else note
        for f in (spec_file, result_file):
            with contextlib.suppress(FileNotFoundError):
                f.unlink()
        return result


def _worker(spec_file: str) -> int:
    """Inside the worker process: pin, execute with papermill, write the result. Never raises."""
    spec = json.loads(Path(spec_file).read_text(encoding="utf-8"))
    result = {"status": "crashed", "error": None}
    import logging

    logging.basicConfig(level=logging.INFO, format="%(message)s")  # papermill logs each cell's output
    try:
        if spec.get("cpus"):
            os.sched_setaffinity(0, spec["cpus"])  # the kernel, our child, inherits it
        import nbclient.exceptions
        import papermill

        deadline = time.monotonic() + spec["timeout"]
        current: dict = {}

        def cell_timeout(cell) -> int:
            # Every cell gets what is left of the notebook's --timeout, so one stuck cell or many slow
            # ones end the same way: nbclient's CellTimeoutError, with the notebook saved up to there.
            current["cell"] = cell
            return max(1, math.ceil(deadline - time.monotonic()))

        try:
            papermill.execute_notebook(spec["input"], spec["output"], parameters=spec["parameters"],
                                       kernel_name=spec["kernel"], cwd=spec["cwd"], progress_bar=False,
                                       log_output=True, timeout_func=cell_timeout)
            result = {"status": OK, "error": None}
        except papermill.PapermillExecutionError as e:
            result = {"status": "failed", "error": f"cell {e.cell_index} (In [{e.exec_count}]): {e.ename}: "
                                                   f"{_first_line(e.evalue)}"}
        except (nbclient.exceptions.CellTimeoutError, TimeoutError) as e:
            where = _cell_where(spec["output"], current.get("cell"))
            result = {"status": "timeout", "error": f"{where}still running after --timeout "
                                                    f"{spec['timeout']:g} s ({_first_line(str(e))})"}
        except nbclient.exceptions.DeadKernelError as e:
            result = {"status": "crashed", "error": f"the kernel died (out of memory?): {_first_line(str(e))}"}
        except Exception as e:  # noqa: BLE001 - any other failure is reported, with its type
            result = {"status": "failed", "error": f"{type(e).__name__}: {_first_line(str(e))}"}
    finally:
        with contextlib.suppress(Exception):
            _hide_injected_cell(Path(spec["output"]))
        write_json(spec["result"], result)
    return 0


def _first_line(text: str) -> str:
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(text)).strip()
    return (text.splitlines() or [""])[0][:300]


def _cell_where(output: str, cell) -> str:
    if cell is None:
        return ""
    with contextlib.suppress(Exception):
        import nbformat

        nb = nbformat.read(output, as_version=4)
        for i, c in enumerate(nb.cells):
            if c.get("id") == cell.get("id"):
                return f"cell {i} ({_first_line(c.source)[:60]!r}) "
    return ""


def _hide_injected_cell(path: Path) -> None:
    """Tag papermill's injected-parameters cell ``remove-cell`` so that a book built from the executed
    notebook hides it (the parameters are in the notebook's metadata and in the figures' provenance)."""
    import nbformat

    if not path.exists():
        return
    nb = nbformat.read(path, as_version=4)
    changed = False
    for cell in nb.cells:
        tags = cell.get("metadata", {}).get("tags", [])
        if "injected-parameters" in tags and "remove-cell" not in tags:
            cell.metadata["tags"] = [*tags, "remove-cell"]
            changed = True
    if changed:
        with atomic_write(path, "w") as fh:
            nbformat.write(nb, fh)


# --------------------------------------------------------------------------- the rerun command
def rerun(runner: str, notebooks: dict[str, Path], *, params: dict | None = None,
          timeout: float = DEFAULT_TIMEOUT_S, jobs: int = 1, cpus: list[int] | None = None,
          keep_going: bool = False, force: bool = False, runs_root: Path | None = None,
          run_dir: Path | None = None, new_run: bool = False, measurements_root: Path | None = None,
          kernel: str = "python3", allow_dirty: bool = False, repo: Path | None = None,
          out=None) -> tuple[list[Result], RunFolder]:
    """Execute ``notebooks`` for ``runner`` and publish their figures; return one Result each.

    Refuses (``RunnerError``, before anything runs) while the checkout has uncommitted changes
    (``dirty_files``) unless ``allow_dirty``, which is then recorded in every published file's
    provenance and in ``run.json``. ``repo`` is the checkout whose state is checked (default: this
    book's, which holds the package and the notebooks). Taught in day28_2.
    """
    out = out or sys.stdout
    measure.check_runner(runner)
    if runner.startswith("article-"):
        raise RunnerError(f"--runner {runner}: article-* labels hold the figures printed in the articles; "
                          f"a re-run needs its own label, e.g. rk3588-a76")
    params = dict(params or {})
    if jobs < 1:
        raise RunnerError("--jobs must be at least 1")
    if timeout <= 0:
        raise RunnerError("--timeout must be positive")
    dirty = dirty_files(repo)
    if dirty and not allow_dirty:
        raise RunnerError(dirty_refusal(dirty, repo))
    settings = {"timeout": timeout, "cpus": cpus, "jobs": jobs, "allow_dirty": bool(allow_dirty)}
    if run_dir is not None:
        run_dir = Path(run_dir)
        if (run_dir / STATE_FILE).exists():
            folder, how = RunFolder.load(run_dir), "resumed"
            if folder.state.get("runner") != runner:
                raise RunnerError(f"{run_dir / STATE_FILE}: field 'runner' is "
                                  f"{folder.state.get('runner')!r}, not {runner!r}")
            folder.state.update(settings)
        else:
            run_dir.mkdir(parents=True, exist_ok=True)
            folder = RunFolder(run_dir, {"runner": runner, "started": _dt.datetime.now(
                _dt.timezone.utc).isoformat(timespec="seconds"), "parameters": params, "complete": False,
                **settings, "notebooks": {}})
            how = "new"
    else:
        folder, how = RunFolder.resume_or_create(runs_root or REPO_ROOT / "runs", runner, params,
                                                 new=new_run, **settings)
    if "machine" not in folder.state:
        from kestrel_lab import machine

        folder.state["machine"] = machine.fingerprint()
    folder.save()

    todo = [nb for nb in notebooks if force or not folder.done(nb)]
    skipped = [nb for nb in notebooks if nb not in todo]
    pin = f", pinned to CPUs {cpus}" if cpus else ""
    print(f"run folder {folder.path} ({how}); runner {runner}; {len(todo)} to run, {len(skipped)} "
          f"already done there; timeout {timeout:g} s per notebook; {jobs} at a time{pin}", file=out)
    if dirty is None:
        print("warning: not a git checkout: the figures' provenance cannot name a commit", file=out)
    elif dirty:
        print(f"warning: --allow-dirty: {len(dirty)} uncommitted file(s) ({', '.join(dirty[:5])}"
              f"{' …' if len(dirty) > 5 else ''}); the published figures say allow_dirty: true", file=out)
    if params:
        print("parameters: " + ", ".join(f"{k}={v!r}" for k, v in params.items()), file=out)
        declared = set().union(*(declared_parameters(p) for p in notebooks.values()))
        unknown = sorted(set(params) - declared)
        if unknown:
            print(f"warning: no selected notebook has a parameter named {', '.join(unknown)} "
                  f"(a typo?); papermill passes it anyway", file=out)

    results: dict[str, Result] = {nb: folder.result(nb) for nb in skipped}
    ex = _Executor(folder, runner, params, timeout=timeout, cpus=cpus,
                   measurements_root=measurements_root, kernel=kernel, allow_dirty=allow_dirty, repo=repo)
    pending = list(todo)
    running: dict[Future, str] = {}
    failed = False
    n_done = 0
    interrupted = False
    restore = _interrupt_on_term()
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        try:
            while pending or running:
                while pending and len(running) < jobs and not (failed and not keep_going):
                    nb = pending.pop(0)
                    print(f"  … {nb} started", file=out, flush=True)
                    running[pool.submit(ex.run, nb, notebooks[nb])] = nb
                if not running:
                    break
                finished, _ = wait(list(running), return_when=FIRST_COMPLETED)
                for fut in finished:
                    nb = running.pop(fut)
                    res = fut.result()
                    results[nb] = res
                    folder.record(res)
                    n_done += 1
                    print(f"  [{n_done}/{len(todo)}] {nb} {res.status} in {res.seconds:.1f} s"
                          + (f", {_figures_cell(res)} figures" if res.figures is not None else "")
                          + (f": {res.error}" if res.error else ""), file=out, flush=True)
                    if res.status != OK:
                        failed = True
        except KeyboardInterrupt:
            interrupted = True
            ex.stop_all()
            for fut, nb in running.items():
                with contextlib.suppress(Exception):
                    res = fut.result(timeout=30)
                    res.status, res.error = "interrupted", "stopped by Ctrl-C"
                    results[nb] = res
                    folder.record(res)
        finally:
            restore()
    for nb in notebooks:
        results.setdefault(nb, Result(nb, "not run", error="interrupted" if interrupted else
                                      "skipped after a failure (use --keep-going)"))
    ordered = [results[nb] for nb in notebooks]
    folder.state["complete"] = all(folder.done(nb) for nb in folder.state["notebooks"]) and all(
        r.status == OK for r in ordered)
    folder.state["finished"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    folder.save()
    print(summary_table(ordered, runner), file=out)
    if interrupted:
        raise KeyboardInterrupt
    return ordered, folder


def _interrupt_on_term():
    """Treat SIGTERM and SIGHUP (a closed SSH session) like Ctrl-C while notebooks run, so that the
    workers — in their own sessions, out of reach of the terminal's signals — are stopped too.
    Returns a function that restores the previous handlers."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def to_interrupt(signum, frame):
        raise KeyboardInterrupt

    saved = {}
    for name in ("SIGTERM", "SIGHUP"):
        sig = getattr(signal, name, None)
        if sig is not None:
            saved[sig] = signal.signal(sig, to_interrupt)
    return lambda: [signal.signal(sig, h) for sig, h in saved.items()]


def _figures_cell(r: Result) -> str:
    if r.figures is None:
        return "—"
    return f"{r.figures}" + (f" + {r.not_measured} not measured" if r.not_measured else "")


def summary_table(results: list[Result], runner: str) -> str:
    """The table printed at the end of a run: notebook, status, seconds, figures recorded.

    Taught in day28_2.
    """
    rows = [("notebook", "status", "seconds", "figures", "note")]
    for r in results:
        status = f"{r.status} (earlier)" if r.earlier and r.status == OK else r.status
        secs = f"{r.seconds:.1f}" if r.seconds is not None else "—"
        note = r.error or (r.output or "")
        rows.append((r.notebook, status, secs, _figures_cell(r), note))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row[:4], widths)) + "  " + row[4] for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths) + "  ----")
    n_ok = sum(r.status == OK for r in results)
    total = sum(r.seconds or 0 for r in results if not r.earlier)
    lines.append(f"{n_ok}/{len(results)} ok for runner {runner}; {total:.0f} s of notebooks this time")
    return "\n".join(lines)


# --------------------------------------------------------------------------- import and export
def _archive_members(archive: Path) -> list[tuple[str, bytes | None, str | None]]:
    """(name, bytes or None, why-not) of every regular file in a directory, tar or zip archive."""
    archive = Path(archive)
    out: list[tuple[str, bytes | None, str | None]] = []
    if archive.is_dir():
        for p in sorted(archive.rglob("*")):
            if p.is_file():
                size = p.stat().st_size
                out.append((p.relative_to(archive).as_posix(),
                            p.read_bytes() if size <= MAX_IMPORT_FILE else None,
                            None if size <= MAX_IMPORT_FILE else f"{size} bytes is too large"))
        return out
    if not archive.exists():
        raise RunnerError(f"{archive}: no such file or folder")
    if tarfile.is_tarfile(archive):
        with tarfile.open(archive) as tar:
            for m in tar.getmembers():
                if m.isdir():
                    continue
                if not m.isfile():
                    out.append((m.name, None, "is a link or special file"))
                elif m.size > MAX_IMPORT_FILE:
                    out.append((m.name, None, f"{m.size} bytes is too large"))
                else:
                    out.append((m.name, tar.extractfile(m).read(), None))
        return out
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():
                if info.is_dir():
                    continue
                if info.file_size > MAX_IMPORT_FILE:
                    out.append((info.filename, None, f"{info.file_size} bytes is too large"))
                else:
                    out.append((info.filename, zf.read(info), None))
        return out
    raise RunnerError(f"{archive}: not a folder, a tar archive (.tar, .tar.gz) or a zip archive")


def import_measurements(archive: Path, runner: str, root: Path | None = None, *,
                        dry_run: bool = False) -> list[Path]:
    """Validate every ``dayDD_P.json`` in ``archive`` and install them under ``<root>/<runner>/``.

    All or nothing: a file that does not parse, fails the schema, claims another runner or another
    notebook, or comes twice refuses the whole archive, and nothing is written. Files that are not
    measurement files (logs, executed notebooks) are ignored. Taught in day28_2.
    """
    measure.check_runner(runner)
    root = root or measurements_dir()
    problems: list[str] = []
    accepted: dict[str, tuple[str, bytes]] = {}
    for name, data, why in _archive_members(archive):
        base = name.rsplit("/", 1)[-1]
        if not re.fullmatch(r"day\d\d_[123]\.json", base):
            continue
        where = f"{archive}:{name}"
        if data is None:
            problems.append(f"{where}: {why}")
            continue
        parts = [p for p in name.split("/") if p not in ("", ".")]
        if ".." in parts or name.startswith("/"):
            problems.append(f"{where}: a path that leaves the archive")
            continue
        try:
            doc = measure.parse_bytes(data, where)
        except measure.MeasurementError as e:
            problems.append(str(e))
            continue
        claimed = doc["provenance"]["runner"]
        if claimed != runner:
            problems.append(f"{where}: field 'provenance.runner' claims {claimed!r}, not {runner!r}")
            continue
        if len(parts) >= 2 and parts[-2] != runner and measure.RUNNER_NAME.match(parts[-2]) and (
                len(parts) >= 3 and parts[-3] == "measurements"):
            problems.append(f"{where}: stored under measurements/{parts[-2]}/, not measurements/{runner}/")
            continue
        if doc["notebook"] != base[:-5]:
            problems.append(f"{where}: field 'notebook' is {doc['notebook']!r} but the file is {base}")
            continue
        if doc["source"] == "article" and not runner.startswith("article-"):
            problems.append(f"{where}: field 'source' is 'article', only article-* runners hold article figures")
            continue
        if doc["notebook"] in accepted:
            problems.append(f"{where}: a second file for {doc['notebook']} "
                            f"(first: {accepted[doc['notebook']][0]})")
            continue
        accepted[doc["notebook"]] = (name, data)
    if problems:
        raise measure.MeasurementError(f"{archive}: refused, nothing imported ({len(problems)} problem"
                                       f"{'s' if len(problems) > 1 else ''}):\n  " + "\n  ".join(problems))
    if not accepted:
        raise measure.MeasurementError(f"{archive}: refused: no measurement file (dayDD_P.json) in it")
    targets = [root / runner / f"{nb}.json" for nb in sorted(accepted)]
    if dry_run:
        return targets
    # Write every file beside its target first, then rename them all: an I/O error while writing
    # leaves the runner's folder exactly as it was.
    tmp_files = []
    try:
        for nb, target in zip(sorted(accepted), targets):
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.parent / f".{target.name}.import.tmp"
            with open(tmp, "wb") as fh:
                fh.write(accepted[nb][1])
                fh.flush()
                os.fsync(fh.fileno())
            tmp_files.append((tmp, target))
    except BaseException:
        for tmp, _ in tmp_files:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        raise
    for tmp, target in tmp_files:
        os.replace(tmp, target)
    return targets


def export_measurements(runner: str, output: Path | None = None, root: Path | None = None) -> Path:
    """Pack ``<root>/<runner>/*.json`` (validated) into a .tar.gz for ``import-measurements``.

    Taught in day28_2.
    """
    measure.check_runner(runner)
    root = root or measurements_dir()
    files = sorted((root / runner).glob("day*_*.json"))
    if not files:
        raise RunnerError(f"{root / runner}: no measurement files for runner {runner!r}")
    for f in files:
        measure.load_file(f)
    output = Path(output or f"kestrel-measurements-{runner}-{utc_stamp()}.tar.gz")
    with atomic_write(output, "wb") as fh:
        with tarfile.open(fileobj=fh, mode="w:gz") as tar:
            for f in files:
                data = f.read_bytes()
                info = tarfile.TarInfo(f"measurements/{runner}/{f.name}")
                info.size, info.mtime, info.mode = len(data), int(f.stat().st_mtime), 0o644
                tar.addfile(info, io.BytesIO(data))
    return output


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="kestrel-lab rerun's worker process (internal)")
    ap.add_argument("--worker", required=True)
    raise SystemExit(_worker(ap.parse_args().worker))
