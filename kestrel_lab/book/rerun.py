"""Re-run the book's notebooks with papermill on any runner, and publish their measured figures.

The loop the book depends on: an operator runs ``kestrel-lab rerun --runner rk3588-a76 --days 16-18``
on a board; each notebook is executed by papermill into a run folder ``runs/<runner>/<UTC time>/``
with ``runner`` (and any ``-p KEY VALUE``) injected as parameters; each notebook's figures, which its
``measure.Recorder`` saves at the end, are published into ``data/measurements/<runner>/<id>.json``;
the book then shows them beside the article's and this build's figures.

Why the pieces look the way they do:

* Each notebook runs in its own worker process (``python -m kestrel_lab.book.worker``), in its own
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
* Timings want a quiet machine, and the notebook before leaves its own minute of load behind (the
  1-minute load average decays over about a minute). ``--quiet-load L --quiet-wait S`` (``QuietGate``)
  waits before each notebook until the 1-minute load average is at most ``L``, for at most ``S`` seconds,
  then starts it anyway: the load it started at and whether it was quiet, waited or gave up waiting go
  into ``run.json``, the summary and the published file's provenance (``rerun.quiet``), so a figure
  measured above ``L`` says so (``measure.quiet_series`` passes it over).
* The run folder keeps ``run.json`` (the state of every notebook), the executed notebooks and their
  logs, so that re-running the same command resumes: notebooks already done there are skipped unless
  ``--force``.

The pieces: ``selection`` (what to run), ``runs`` (the run folder and its ``run.json``), ``executor``
(the worker processes and publishing), ``worker`` (papermill inside a worker, and the kernel's peak
memory), ``summary`` (the final table, with each notebook's seconds and peak RSS against its budget) and
``archive`` (moving figures between machines). This module is the loop that ties them.

Taught in day28_2.
"""
from __future__ import annotations

import contextlib
import sys
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from kestrel_lab import machine, measure, procfs
from kestrel_lab.book.executor import Executor, dirty_refusal, interrupt_on_term
from kestrel_lab.book.runs import OK, STATE_FILE, Result, RunFolder
from kestrel_lab.book.selection import RunnerError, declared_parameters
from kestrel_lab.book.summary import figures_cell, gib, summary_table
from kestrel_lab.measure import utc_now
from kestrel_lab.paths import REPO_ROOT

DEFAULT_TIMEOUT_S = 1800
DEFAULT_QUIET_WAIT_S = 900     # --quiet-load without --quiet-wait: at most 15 minutes before each notebook
QUIET_POLL_S = 5.0             # how often the load average is read while waiting
QUIET_REPORT_S = 60.0          # how often a waiting run says it is still waiting


@dataclass
class QuietGate:
    """``--quiet-load`` / ``--quiet-wait``: before a notebook, wait until the 1-minute load average is at
    most ``limit``, reading it every ``poll`` seconds, for at most ``max_wait`` seconds; then start.

    ``wait`` returns what goes into the record — ``outcome`` ``quiet`` (at most ``limit`` at once),
    ``waited`` (after ``waited_s`` seconds), ``gave_up`` (still above it after ``max_wait``: the notebook
    starts anyway, and says so) or ``unknown`` (the OS keeps no load average) — with the load it started at.
    ``read_load``, ``sleep`` and ``clock`` are the machine's by default (tests pass fakes). Taught in day28_2.
    """

    limit: float
    max_wait: float = DEFAULT_QUIET_WAIT_S
    poll: float = QUIET_POLL_S
    read_load: Callable[[], "tuple[float, ...] | None"] = field(default=procfs.load_average, repr=False)
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False)
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)

    def __post_init__(self):
        if not self.limit >= 0:
            raise RunnerError(f"--quiet-load {self.limit}: a load average is at least 0")
        if not self.max_wait >= 0:
            raise RunnerError(f"--quiet-wait {self.max_wait}: seconds to wait are at least 0")
        if not self.poll > 0:
            raise RunnerError(f"QuietGate.poll {self.poll}: must be positive")

    def _load1(self) -> float | None:
        load = self.read_load()
        return float(load[0]) if load else None

    def _record(self, outcome: str, load1: float | None, waited: float) -> dict:
        return {"outcome": outcome, "load1": None if load1 is None else round(load1, 3), "limit": self.limit,
                "waited_s": round(waited, 1), "max_wait_s": self.max_wait}

    def wait(self, notebook: str, out=None) -> dict:
        """Wait (printing what for) until the load allows ``notebook`` to start; the record of it."""
        out = out or sys.stdout
        t0 = self.clock()
        load = self._load1()
        if load is None:
            print(f"  … {notebook}: this OS keeps no load average: --quiet-load {self.limit:g} cannot be "
                  f"checked; starting without waiting", file=out, flush=True)
            return self._record("unknown", None, 0.0)
        if load <= self.limit:
            return self._record("quiet", load, 0.0)
        print(f"  … {notebook} waits for the 1-minute load average to fall to {self.limit:g} (now {load:.2f}; "
              f"at most {self.max_wait:g} s, read every {self.poll:g} s)", file=out, flush=True)
        next_report = QUIET_REPORT_S
        while True:
            waited = self.clock() - t0
            if waited >= self.max_wait:
                print(f"  … {notebook}: gave up waiting after {waited:.0f} s: it starts at load {load:.2f}, above "
                      f"--quiet-load {self.limit:g} (its record says so)", file=out, flush=True)
                return self._record("gave_up", load, waited)
            self.sleep(min(self.poll, self.max_wait - waited))
            now = self._load1()
            load = load if now is None else now
            waited = self.clock() - t0
            if now is not None and now <= self.limit:
                print(f"  … {notebook}: load {now:.2f} ≤ {self.limit:g} after {waited:.0f} s of waiting",
                      file=out, flush=True)
                return self._record("waited", now, waited)
            if waited >= next_report:
                print(f"  … {notebook} still waits: load {load:.2f} > {self.limit:g} after {waited:.0f} s "
                      f"(at most {self.max_wait:g} s)", file=out, flush=True)
                next_report += QUIET_REPORT_S


def rerun(runner: str, notebooks: dict[str, Path], *, params: dict | None = None,
          timeout: float = DEFAULT_TIMEOUT_S, jobs: int = 1, cpus: list[int] | None = None,
          keep_going: bool = False, force: bool = False, runs_root: Path | None = None,
          run_dir: Path | None = None, new_run: bool = False, measurements_root: Path | None = None,
          kernel: str = "python3", allow_dirty: bool = False, repo: Path | None = None,
          quiet: QuietGate | None = None, out=None) -> tuple[list[Result], RunFolder]:
    """Execute ``notebooks`` for ``runner`` and publish their figures; return one Result each.

    Refuses (``RunnerError``, before anything runs) while the checkout has uncommitted changes
    (``dirty_files``) unless ``allow_dirty``, which is then recorded in every published file's
    provenance and in ``run.json``. ``repo`` is the checkout whose state is checked (default: this
    book's, which holds the package and the notebooks). With ``quiet`` each notebook waits for a quiet
    machine first (``QuietGate``); that needs ``jobs`` 1. Taught in day28_2.
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
    if quiet is not None and jobs > 1:
        raise RunnerError(f"--quiet-load with --jobs {jobs}: notebooks running side by side are the load it "
                          f"waits out; use --jobs 1")
    dirty = machine.dirty_files(repo)
    if dirty and not allow_dirty:
        raise RunnerError(dirty_refusal(dirty, repo))
    settings = {"timeout": timeout, "cpus": cpus, "jobs": jobs, "allow_dirty": bool(allow_dirty),
                "quiet_load": quiet.limit if quiet else None, "quiet_wait": quiet.max_wait if quiet else None}
    folder, how = _open_folder(runner, params, settings, run_dir, runs_root, new_run)

    todo = [nb for nb in notebooks if force or not folder.done(nb)]
    skipped = [nb for nb in notebooks if nb not in todo]
    _print_plan(folder, how, runner, todo, skipped, settings, out)
    _print_warnings(dirty, params, notebooks, out)

    results: dict[str, Result] = {nb: folder.result(nb) for nb in skipped}
    ex = Executor(folder, runner, params, timeout=timeout, cpus=cpus,
                   measurements_root=measurements_root, kernel=kernel, allow_dirty=allow_dirty, repo=repo)
    interrupted = _execute(ex, folder, notebooks, todo, results, jobs=jobs, keep_going=keep_going, quiet=quiet,
                           out=out)
    ordered = _finish(folder, notebooks, results, interrupted)
    print(summary_table(ordered, runner, quick=params.get("quick", True) is not False), file=out)
    if interrupted:
        raise KeyboardInterrupt
    return ordered, folder


def _open_folder(runner: str, params: dict, settings: dict, run_dir: Path | None, runs_root: Path | None,
                 new_run: bool) -> tuple[RunFolder, str]:
    """The run folder — ``run_dir``, else the runner's latest unfinished one with the same parameters under
    ``runs_root`` unless ``new_run`` — with ``settings`` and the machine's fingerprint recorded, saved; and
    how it came to be (new, resumed, …)."""
    if run_dir is not None:
        run_dir = Path(run_dir)
        if (run_dir / STATE_FILE).exists():
            folder, how = RunFolder.load(run_dir), "resumed"
            if folder.state.get("runner") != runner:
                raise RunnerError(f"{run_dir / STATE_FILE}: field 'runner' is "
                                  f"{folder.state.get('runner')!r}, not {runner!r}")
            folder.state.update(settings)
        else:
            folder, how = RunFolder.start(run_dir, runner, params, exist_ok=True, **settings), "new"
    else:
        folder, how = RunFolder.resume_or_create(runs_root or REPO_ROOT / "runs", runner, params,
                                                 new=new_run, **settings)
    if "machine" not in folder.state:
        folder.state["machine"] = machine.fingerprint()
    folder.save()
    return folder, how


def _print_plan(folder: RunFolder, how: str, runner: str, todo: list[str], skipped: list[str], settings: dict,
                out) -> None:
    """The run's first line: the folder, the runner, what runs and what is already done, the limits."""
    pin = f", pinned to CPUs {settings['cpus']}" if settings["cpus"] else ""
    calm = (f"; each waits for a 1-minute load ≤ {settings['quiet_load']:g} (at most {settings['quiet_wait']:g} s)"
            if settings["quiet_load"] is not None else "")
    print(f"run folder {folder.path} ({how}); runner {runner}; {len(todo)} to run, {len(skipped)} "
          f"already done there; timeout {settings['timeout']:g} s per notebook; {settings['jobs']} at a time{pin}"
          f"{calm}", file=out)


def _print_warnings(dirty: list[str] | None, params: dict, notebooks: dict[str, Path], out) -> None:
    """Warn of a checkout git cannot name, of ``--allow-dirty``, and of parameters no notebook declares."""
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


def _execute(ex: Executor, folder: RunFolder, notebooks: dict[str, Path], todo: list[str],
             results: dict[str, Result], *, jobs: int, keep_going: bool, quiet: QuietGate | None = None,
             out) -> bool:
    """Run ``todo``, ``jobs`` at a time (none started after a failure unless ``keep_going``; each, with
    ``quiet``, once the machine is quiet or the wait is over), each result recorded in ``results`` and the
    run folder as it comes. True when Ctrl-C (or SIGTERM) stopped the run: the notebooks still running
    are stopped and recorded as interrupted."""
    pending = list(todo)
    running: dict[Future, str] = {}
    failed = False
    n_done = 0
    interrupted = False
    restore = interrupt_on_term()
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        try:
            while pending or running:
                while pending and len(running) < jobs and not (failed and not keep_going):
                    nb = pending.pop(0)
                    calm = quiet.wait(nb, out) if quiet else None
                    load = f" at load {calm['load1']:.2f}" if calm and calm["load1"] is not None else ""
                    print(f"  … {nb} started{load}", file=out, flush=True)
                    running[pool.submit(ex.run, nb, notebooks[nb], calm)] = nb
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
                          + (f", peak {gib(res.peak_rss_bytes)}" if res.peak_rss_bytes is not None else "")
                          + (f", {figures_cell(res)} figures" if res.figures is not None else "")
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
    return interrupted


def _finish(folder: RunFolder, notebooks: dict[str, Path], results: dict[str, Result],
            interrupted: bool) -> list[Result]:
    """Every notebook's result in order (those never started marked "not run"); the run folder records
    whether the whole selection is done and when the run finished."""
    for nb in notebooks:
        results.setdefault(nb, Result(nb, "not run", error="interrupted" if interrupted else
                                      "skipped after a failure (use --keep-going)"))
    ordered = [results[nb] for nb in notebooks]
    folder.state["complete"] = all(folder.done(nb) for nb in folder.state["notebooks"]) and all(
        r.status == OK for r in ordered)
    folder.state["finished"] = utc_now()
    folder.save()
    return ordered
