"""The supervising side of a re-run: one worker process per notebook, in its own process session.

The worker (``python -m kestrel_lab.book.worker``) pins itself (``--cpus``; the kernel inherits the
affinity and ``NUMBA_NUM_THREADS``), and this side can stop the whole group — worker and kernel — when
the notebook overruns or the operator presses Ctrl-C. A notebook's ``Recorder.save()`` writes into a
staging folder inside the run folder (``measure.STAGE_ENV``); ``publish`` validates that file and
moves it into data/measurements/ only after the *whole* notebook succeeded, and only while the
checkout is still clean (or ``--allow-dirty`` says so). Taught in day28_2.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from kestrel_lab import machine, measure, seam
from kestrel_lab.atomic import write_json
from kestrel_lab.book.runs import OK, STAGE, Result, RunFolder
from kestrel_lab.measure import utc_now
from kestrel_lab.paths import REPO_ROOT, measurements_dir

KERNEL_GRACE_S = 30  # on top of --timeout, for the kernel to start and stop before the worker is killed
WORKER = "kestrel_lab.book.worker"  # the module the executor runs with ``python -m`` for each notebook


def dirty_refusal(files: list[str], repo: Path | None = None, limit: int = 10) -> str:
    """The message that refuses a re-run from a dirty tree: which files, and how to proceed."""
    shown = ", ".join(files[:limit]) + (f" … and {len(files) - limit} more" if len(files) > limit else "")
    return (f"refused: the checkout {repo or REPO_ROOT} has uncommitted changes in {len(files)} file"
            f"{'s' if len(files) != 1 else ''} ({shown}). Figures measured from it would carry the commit "
            f"'<commit>+dirty', which nobody can check out to reproduce them. Commit the changes (or "
            f"`git stash` them) and run the same command again; or pass --allow-dirty to publish the "
            f"figures anyway (each file's provenance then says allow_dirty: true).")


def _count(doc: dict) -> tuple[int, int]:
    figs = doc["figures"]
    nm = sum(f["status"] == "not_measured" for f in figs)
    return len(figs) - nm, nm


def publish(staged: Path, runner: str, notebook: str, root: Path | None = None,
            rerun_info: dict | None = None, allow_dirty: bool = False) -> Path:
    """Validate a staged measurements file and write it atomically to ``<root>/<runner>/<notebook>.json``.

    Refuses a file that claims another runner or notebook: the runner writes only its own label.
    ``rerun_info`` (seconds, peak RSS, run folder, pinning) is added to the provenance as ``rerun``, so
    the book can say how long each notebook took on each runner and how much memory it needed.
    ``allow_dirty`` (``--allow-dirty``) is written into the provenance as ``allow_dirty: true``, so a
    figure published from a dirty tree says it was published so on purpose. Taught in day28_2.
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


class Executor:
    """Runs notebooks in worker processes; tracks them so that Ctrl-C stops them all. Taught in day28_2."""

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

    def run(self, notebook: str, src: Path, quiet: dict | None = None) -> Result:
        """Execute one notebook in a worker and publish its figures when it succeeded. ``quiet`` is how its
        start waited for a quiet machine (``rerun.QuietGate.wait``): kept in the result and published in
        the provenance as ``rerun.quiet``."""
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
        env = self._worker_env(stage)
        t0 = time.monotonic()
        if self.stopping:
            return Result(notebook, "interrupted", 0.0, error="stopped by Ctrl-C", quiet=quiet)
        proc, status, error = self._wait_for_worker(spec_file, log, env)
        seconds = time.monotonic() - t0
        peak = None
        if status is None:
            status, error, peak = self._outcome(proc, result_file, log)
        result = Result(notebook, status, round(seconds, 1), peak_rss_bytes=peak, error=error,
                        output=out.name if out.exists() else None,
                        finished=utc_now(), quiet=quiet)
        if status == OK:
            self._publish_figures(result, notebook, stage)
        for f in (spec_file, result_file):
            with contextlib.suppress(FileNotFoundError):
                f.unlink()
        return result

    def _worker_env(self, stage: Path) -> dict[str, str]:
        """The worker's environment: the staging folder for the Recorder, the inline plot backend, no student
        workspace unless the caller named one (``KESTREL_STUDENT``), and with ``cpus`` the CPUs and thread
        counts the notebook's engine and BLAS use."""
        env = dict(os.environ)
        env.setdefault(seam.ENV, "off")  # the book's figures come from the package's code, not a workspace
        env[measure.STAGE_ENV] = str(stage)
        env.pop("MPLBACKEND", None)  # the kernel then uses the inline backend: figures land in the output
        env["PYTHONUNBUFFERED"] = "1"
        if self.cpus:
            from kestrel_lab.machine import ranges
            from kestrel_lab.threads import CPUS_ENV

            env[CPUS_ENV] = ranges(self.cpus)  # an engine in the notebook runs on them all, as asked
            env["NUMBA_NUM_THREADS"] = str(len(self.cpus))
            env.setdefault("OMP_NUM_THREADS", str(len(self.cpus)))
            env.setdefault("OPENBLAS_NUM_THREADS", str(len(self.cpus)))
        return env

    def _wait_for_worker(self, spec_file: Path, log: Path,
                         env: dict[str, str]) -> tuple[subprocess.Popen, str | None, str | None]:
        """Start the worker in its own session, its output into ``log``, and wait for it: (the process,
        "timeout" and why when it overran and was stopped, else None and None)."""
        status = error = None
        with open(log, "wb") as logf:
            proc = subprocess.Popen([sys.executable, "-m", WORKER, "--worker", str(spec_file)],
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
        return proc, status, error

    def _outcome(self, proc: subprocess.Popen, result_file: Path,
                 log: Path) -> tuple[str, str | None, int | None]:
        """The status, error and kernel's peak RSS of a worker that ended in time: interrupted by Ctrl-C,
        what it wrote into ``result_file``, or crashed when it wrote nothing readable."""
        if self.stopping:
            return "interrupted", "stopped by Ctrl-C", None
        try:
            res = json.loads(result_file.read_text(encoding="utf-8"))
            return res["status"], res.get("error"), res.get("peak_rss_bytes")
        except (OSError, ValueError, KeyError):
            return "crashed", f"worker exited with code {proc.returncode} without a result; see {log.name}", None

    def _publish_figures(self, result: Result, notebook: str, stage: Path) -> None:
        """After a notebook ran through: publish the figures it staged (unless the tree became dirty), and
        note any it saved under another runner or notebook id. Failures go into ``result``."""
        staged = stage / self.runner / f"{notebook}.json"
        extra = sorted(p.relative_to(stage).as_posix() for p in stage.rglob("*.json") if p != staged)
        dirty = None if self.allow_dirty else machine.dirty_files(self.repo)
        if staged.exists() and dirty:  # the tree changed while the notebook ran
            result.status, result.error = "failed", ("its figures were not published: "
                                                     + dirty_refusal(dirty, self.repo))
        elif staged.exists():
            try:
                doc = measure.load_file(staged)
                info = {"seconds": result.seconds, "peak_rss_bytes": result.peak_rss_bytes,
                        "run": self.folder.path.name, "timeout": self.timeout,
                        "cpus": self.cpus, "jobs": self.folder.state.get("jobs", 1)}
                if result.quiet is not None:
                    info["quiet"] = result.quiet
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


def interrupt_on_term():
    """Treat SIGTERM and SIGHUP (a closed SSH session) like Ctrl-C while notebooks run, so that the
    workers — in their own sessions, out of reach of the terminal's signals — are stopped too.
    Returns a function that restores the previous handlers. Taught in day28_2."""
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
