"""Measured figures with their provenance.

A notebook records each figure it calls "measured" here (name, value, unit, one-line meaning) and
saves them at its end as one JSON file per notebook per runner:
``data/measurements/<runner>/<notebook>.json``. The file also carries the provenance: the runner
label, the machine's fingerprint (``kestrel_lab.machine``), the software versions and git commit, the
date and the notebook's parameters. The book shows a notebook's figures side by side across runners
(``compare``), so a reader always sees who measured a number and when.

A figure that cannot be measured on this runner (say, it needs the 2 GB model file the runner lacks)
is recorded with ``not_measured`` and shown as such: it is never invented. The articles' RK3588
figures live under ``data/measurements/article-rk3588/`` with ``source: "article"``.

Taught in day01_3 (the recorder, noise, medians) and day28_1 (where the book's numbers come from).
"""
from __future__ import annotations

import datetime as _dt
import html
import json
import math
import os
import re
import statistics
import subprocess
import time
from functools import lru_cache
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from kestrel_lab import machine
from kestrel_lab.atomic import write_json
from kestrel_lab.paths import measurements_dir
from kestrel_lab.procfs import load_average, process_usage

SCHEMA = "kestrel-lab/measurements/1"
NOTEBOOK_ID = re.compile(r"^day(0[1-9]|[12][0-9]|30)_[123]$")
RUNNER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
STATUSES = ("measured", "computed", "not_measured", "article")
# Set by ``kestrel-lab rerun`` for each notebook it executes: ``Recorder.save()`` then writes into this
# folder, and the runner moves the file into data/measurements/<runner>/ only once the whole notebook
# has succeeded (so a notebook that fails after ``save()`` never replaces the runner's good figures).
STAGE_ENV = "KESTREL_MEASUREMENTS_STAGE"


def stage_dir() -> Path | None:
    """The staging folder of a ``kestrel-lab rerun`` in progress, else None. Taught in day28_2."""
    env = os.environ.get(STAGE_ENV)
    return Path(env) if env else None


def utc_now(compact: bool = False, now: _dt.datetime | None = None) -> str:
    """The time in UTC, written the one way the workbook writes it.

    ISO 8601 to the second (``2026-11-30T12:00:00+00:00``: provenance dates, ``run.json``) or, with
    ``compact``, ``20261130T120000Z`` (run folders and archives, which then sort by name in time order
    on any machine). ``now`` defaults to this moment. Taught in day28_2.
    """
    now = now or _dt.datetime.now(_dt.timezone.utc)
    return now.strftime("%Y%m%dT%H%M%SZ") if compact else now.isoformat(timespec="seconds")


class MeasurementError(ValueError):
    """A measurements file or a figure that does not follow the schema."""


def check_notebook_id(notebook: str) -> str:
    if not NOTEBOOK_ID.match(notebook):
        raise MeasurementError(f"notebook id {notebook!r} is not of the form dayDD_P (day01_1 … day30_3)")
    return notebook


def check_runner(runner: str) -> str:
    if not isinstance(runner, str) or not RUNNER_NAME.match(runner):
        raise MeasurementError(
            f"runner label {runner!r}: use letters, digits, '.', '_' or '-' (at most 64), e.g. rk3588-a76")
    return runner


@dataclass
class Figure:
    name: str
    value: Any
    unit: str
    meaning: str
    status: str = "measured"
    reason: str | None = None
    extra: dict = field(default_factory=dict)


@dataclass
class Timing:
    """Wall-clock samples of one operation; report the median, keep the spread visible."""

    samples: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def best(self) -> float:
        return min(self.samples)

    @property
    def spread(self) -> float:
        """(max - min) / median: how noisy the samples were."""
        return (max(self.samples) - min(self.samples)) / self.median if self.median else 0.0

    def __repr__(self) -> str:
        return (f"Timing(median={_fmt_seconds(self.median)}, best={_fmt_seconds(self.best)}, "
                f"spread={self.spread:.0%}, n={len(self.samples)})")


def _fmt_seconds(s: float) -> str:
    for unit, scale in (("s", 1), ("ms", 1e-3), ("µs", 1e-6)):
        if s >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s * 1e9:.3g} ns"


def timeit(fn: Callable[[], Any], *, repeat: int = 5, warmup: int = 1, number: int = 1) -> Timing:
    """Run ``fn`` ``warmup`` times untimed, then ``repeat`` samples of ``number`` calls each.

    Returns seconds per call. Warm-up matters for numba (the first call compiles) and for caches.
    """
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        samples.append((time.perf_counter() - t0) / number)
    return Timing(samples)


BUSY_LOAD_PER_CPU = 0.5      # a 1-minute load average above half the CPUs: other programs share them
BUSY_SPREAD = 0.20           # repeats differing by more than this (of their median): the timing was disturbed


@dataclass
class MachineState:
    """Whether this run's timings were disturbed, computed from the load average and the repeats' spread."""

    load1: float | None
    cpus: int
    spread: float | None

    @property
    def busy(self) -> bool:
        loaded = self.load1 is not None and self.load1 > BUSY_LOAD_PER_CPU * self.cpus
        return loaded or (self.spread is not None and self.spread > BUSY_SPREAD)

    def sentence(self) -> str:
        """The verdict in the book's words, with the numbers it rests on."""
        load = f"1 分钟平均负载 {self.load1:.1f}（{self.cpus} 个 CPU）" if self.load1 is not None else "负载未知"
        spread = f"，重复测量的离散 {self.spread:.0%}" if self.spread is not None else ""
        if self.busy:
            why = []
            if self.load1 is not None and self.load1 > BUSY_LOAD_PER_CPU * self.cpus:
                why.append(f"负载超过 CPU 数的 {BUSY_LOAD_PER_CPU:.0%}")
            if self.spread is not None and self.spread > BUSY_SPREAD:
                why.append(f"离散超过 {BUSY_SPREAD:.0%}")
            return f"{load}{spread}：机器忙（{'、'.join(why)}），别的程序在抢 CPU，计时可能失真"
        return f"{load}{spread}：机器不忙，这里的差别不是别的程序造成的"


_NOW = object()


def machine_state(*timings: "Timing | float", load1: "float | None | object" = _NOW) -> MachineState:
    """The 1-minute load average and the largest spread of ``timings`` (each a ``Timing`` or a spread
    already computed): is the machine busy? ``load1`` defaults to the load now (``procfs.load_average``);
    pass the load a measurement started at (``Recorder.load_at_start``) to judge the machine without the
    notebook's own minute of work in it. Taught in day07_2.
    """
    if load1 is _NOW:
        now = load_average()
        load1 = now[0] if now else None
    spread = max((t.spread if isinstance(t, Timing) else float(t) for t in timings), default=None)
    return MachineState(load1, os.cpu_count() or 1, spread)


def provenance(runner: str, params: dict | None = None, load_avg: "tuple | list | None | object" = _NOW) -> dict:
    """Who measured, when, on what, with which parameters. The machine's fingerprint probes numba's
    threading layer (a cached one-line parallel kernel, when the notebook ran none), so every figure
    says whether it ran on ``omp``; an emulated run (``KESTREL_EMULATED``, set by ``make board-smoke``)
    says so in ``machine.emulated``; ``load_avg`` is the machine's load when the notebook started (a
    figure measured at load 3 on 2 CPUs is not a quiet figure; a ``Recorder`` passes the load it saw when
    it was created, the default is the load now). Taught in day28_1."""
    if load_avg is _NOW:
        load_avg = load_average()
    return {
        "runner": runner,
        "date": utc_now(),
        "machine": machine.fingerprint(probe_threading=True),
        "load_avg": list(load_avg) if load_avg else None,   # 1/5/15 min, at the start
        "parameters": _jsonable(params or {}),
    }


def is_emulated(doc: dict) -> bool:
    """True for a document measured on an emulated machine (qemu): its timings are no board's and are
    never compared with real ones. Taught in day28_3."""
    return bool((doc.get("provenance", {}).get("machine") or {}).get("emulated"))


def _jsonable(obj):
    try:
        json.dumps(obj)
        return obj
    except TypeError:
        if isinstance(obj, dict):
            return {str(k): _jsonable(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [_jsonable(v) for v in obj]
        if hasattr(obj, "item"):
            return obj.item()
        return str(obj)


def _check_value(name: str, value):
    if hasattr(value, "item"):  # numpy scalars
        value = value.item()
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            raise MeasurementError(f"figure {name!r}: value {value} is not finite")
        return value
    if isinstance(value, str):
        return value
    raise MeasurementError(f"figure {name!r}: value of type {type(value).__name__} is not a number or text")


class Recorder:
    """Collects a notebook's figures; ``save()`` writes them at the end, atomically.

    Nothing is written until ``save()``: a notebook that fails half-way leaves the runner's previous
    file untouched.
    """

    def __init__(self, notebook: str, runner: str = "local", params: dict | None = None):
        self.notebook = check_notebook_id(notebook)
        self.runner = check_runner(runner)
        self.params = dict(params or {})
        self.figures: dict[str, Figure] = {}
        # The notebook starts with its Recorder: the load then is other programs' (and what the run
        # before it left), not this notebook's own minute of work, which the load at save() would include.
        self.load_at_start = load_average()

    def record(self, name: str, value, unit: str, meaning: str, **extra):
        """Record a measured figure and return its value (so it can be used inline)."""
        value = _check_value(name, value)
        self.figures[name] = Figure(name, value, unit, meaning, "measured", None, _jsonable(extra))
        return value

    def computed(self, name: str, value, unit: str, meaning: str, **extra):
        """Record a figure computed or planned from inputs (a config, a formula), not measured; return it.

        The comparison table labels it as computed, so nobody mistakes a planned size for a measurement.
        """
        value = _check_value(name, value)
        self.figures[name] = Figure(name, value, unit, meaning, "computed", None, _jsonable(extra))
        return value

    def not_measured(self, name: str, unit: str, meaning: str, reason: str) -> None:
        """A figure this runner cannot measure (e.g. the real model file is absent): say why."""
        self.figures[name] = Figure(name, None, unit, meaning, "not_measured", reason)

    def document(self) -> dict:
        """The measurements file: the figures, and their provenance with this process's peak RSS and age
        (``procfs.process_usage``: a notebook's kernel, for the book build's report)."""
        return {
            "schema": SCHEMA,
            "notebook": self.notebook,
            "source": "run",
            "provenance": {**provenance(self.runner, self.params, self.load_at_start), "process": process_usage()},
            "figures": [asdict(f) for f in self.figures.values()],
        }

    def save(self, root: Path | None = None) -> Path:
        """Write ``<root>/<runner>/<notebook>.json`` atomically (temp file, then rename).

        ``root`` defaults to data/measurements/, or to the staging folder while ``kestrel-lab rerun``
        executes the notebook (the runner publishes the file when the notebook has succeeded).
        """
        if not self.figures:
            raise MeasurementError(f"{self.notebook}: nothing recorded, nothing to save")
        path = (root or stage_dir() or measurements_dir()) / self.runner / f"{self.notebook}.json"
        return write_json(path, self.document())

    def table(self) -> "FigureTable":
        doc = self.document()
        return FigureTable([_row(doc, f) for f in doc["figures"]], title=f"{self.notebook} · {self.runner}")


# --------------------------------------------------------------------------- reading and comparing
def validate(doc: dict, *, where: str = "<document>") -> dict:
    """Check a measurements document against the schema; raise naming the file and the field."""
    def bad(field_: str, why: str):
        raise MeasurementError(f"{where}: field {field_!r} {why}")

    if not isinstance(doc, dict):
        bad("<root>", "is not a JSON object")
    if doc.get("schema") != SCHEMA:
        bad("schema", f"is {doc.get('schema')!r}, expected {SCHEMA!r}")
    try:
        check_notebook_id(doc.get("notebook", ""))
    except MeasurementError as e:
        bad("notebook", str(e))
    if doc.get("source") not in ("run", "article"):
        bad("source", f"is {doc.get('source')!r}, expected 'run' or 'article'")
    prov = doc.get("provenance")
    if not isinstance(prov, dict):
        bad("provenance", "is missing or not an object")
    try:
        check_runner(prov.get("runner", ""))
    except MeasurementError as e:
        bad("provenance.runner", str(e))
    if not isinstance(prov.get("date"), str):
        bad("provenance.date", "is missing")
    figs = doc.get("figures")
    if not isinstance(figs, list) or not figs:
        bad("figures", "is missing or empty")
    for i, f in enumerate(figs):
        if not isinstance(f, dict):
            bad(f"figures[{i}]", "is not an object")
        for key in ("name", "unit", "meaning", "status"):
            if not isinstance(f.get(key), str):
                bad(f"figures[{i}].{key}", "is missing or not text")
        if f["status"] not in STATUSES:
            bad(f"figures[{i}].status", f"is {f['status']!r}, expected one of {STATUSES}")
        if f["status"] == "not_measured":
            if f.get("value") is not None or not f.get("reason"):
                bad(f"figures[{i}]", "is not_measured but has a value or no reason")
        else:
            try:
                _check_value(f["name"], f.get("value"))
            except MeasurementError as e:
                bad(f"figures[{i}].value", str(e))
    return doc


def parse_bytes(data: bytes, where: str) -> dict:
    """Parse and validate one measurements file given as bytes (``where`` names it in errors). Taught in day28_1."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise MeasurementError(f"{where}: not UTF-8 at byte offset {e.start}") from e
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        offset = len(text[:e.pos].encode("utf-8"))
        raise MeasurementError(f"{where}: not valid JSON at line {e.lineno}, column {e.colno} "
                               f"(byte offset {offset}): {e.msg}") from e
    return validate(doc, where=where)


def load_file(path: Path) -> dict:
    return parse_bytes(Path(path).read_bytes(), str(path))


def runners(root: Path | None = None) -> list[str]:
    root = root or measurements_dir()
    return sorted(p.name for p in root.iterdir() if p.is_dir()) if root.exists() else []


def load_notebook(notebook: str, root: Path | None = None) -> list[dict]:
    """Every runner's document for one notebook: the article's first, then by runner name, ``local`` last.

    With ``root`` left out, a file staged by a ``kestrel-lab rerun`` in progress stands in for that
    runner's published one, so the notebook's closing table shows the figures it just measured. Taught in day28_1.
    """
    roots = [root] if root else [measurements_dir()] + ([stage_dir()] if stage_dir() else [])
    by_runner: dict[str, dict] = {}
    for base in roots:
        for r in runners(base):
            path = base / r / f"{notebook}.json"
            if path.exists():
                by_runner[r] = load_file(path)
    return sorted(by_runner.values(), key=runner_sort_key)


def runner_sort_key(doc: dict) -> tuple:
    """The article's figures first, then the re-runs by runner name, then this build's (``local``).
    Taught in day28_3."""
    r = doc["provenance"]["runner"]
    return (doc["source"] != "article", r == "local", r)


def load_all(root: Path | None = None) -> list[dict]:
    """Every measurements document under ``root``, by runner then notebook (for the dashboard).

    Taught in day28_3.
    """
    root = root or measurements_dir()
    docs = []
    for r in runners(root):
        for path in sorted((root / r).glob("day*_*.json")):
            docs.append(load_file(path))
    return docs


# --------------------------------------------------------------------------- the quiet run
QUIET_LOAD_PER_CPU = BUSY_LOAD_PER_CPU   # a run that started at a 1-minute load above this per CPU is not quiet


def start_load(doc: dict) -> tuple[float | None, int | None]:
    """The 1-minute load a run started at and the CPUs that load was shared by, from its provenance.

    Two readings may exist: ``kestrel-lab rerun --quiet-load`` notes the load just before it started the
    notebook (``rerun.quiet.load1``) and the notebook's ``Recorder`` the load when it was created
    (``load_avg``); the higher one counts. (None, …) when neither was recorded. Taught in day23_2.
    """
    prov = doc["provenance"]
    readings = [(prov.get("load_avg") or [None])[0], ((prov.get("rerun") or {}).get("quiet") or {}).get("load1")]
    known = [float(v) for v in readings if isinstance(v, (int, float)) and not isinstance(v, bool)]
    mach = prov.get("machine") or {}
    cpus = mach.get("cores") or len(mach.get("affinity") or []) or None
    return (max(known) if known else None), cpus


@dataclass
class QuietRun:
    """The quietest re-run of a notebook with the current run's parameters (``quiet_series``): the figures
    asked for, and who measured them, where, with which commit, at which load."""

    notebook: str
    runner: str
    figures: dict[str, Any]
    machine: str
    commit: str | None
    date: str
    load1: float
    cpus: int

    def sentence(self) -> str:
        """Who measured these figures, in the book's words."""
        return (f"安静的重跑：runner {self.runner}（{self.machine}，commit {self.commit or '?'}，{self.date[:10]}），"
                f"开始时 1 分钟平均负载 {self.load1:.2f}（{self.cpus} 个 CPU）")


def _machine_words(doc: dict) -> str:
    mach = doc["provenance"].get("machine") or {}
    models = sorted({str(c.get("model")) for c in mach.get("clusters") or [] if c.get("model")})
    what = " + ".join(models) or mach.get("arch") or "?"
    return f"{mach.get('hostname') or '?'}，{what}，{mach.get('cores') or '?'} 个 CPU"


def _why_not_quiet(doc: dict, params: dict, names: tuple[str, ...]) -> str | None:
    """Why a document cannot stand as the quiet run (in the book's words), or None when it can."""
    if doc["source"] != "run":
        return "文章里的数字，不是重跑"
    if is_emulated(doc):
        return "模拟器（qemu）上测的"
    theirs = doc["provenance"].get("parameters") or {}
    if json.dumps(theirs, sort_keys=True) != json.dumps(params, sort_keys=True):
        keys = sorted(k for k in set(theirs) | set(params) if theirs.get(k, "∅") != params.get(k, "∅"))
        return "参数不同（" + "，".join(f"{k}={theirs.get(k, '∅')!r}，本次 {params.get(k, '∅')!r}" for k in keys) + "）"
    load1, cpus = start_load(doc)
    if load1 is None or not cpus:
        return "没有记下开始时的负载"
    if load1 > QUIET_LOAD_PER_CPU * cpus:
        return f"开始时 1 分钟平均负载 {load1:.2f}，超过 {cpus} 个 CPU 的 {QUIET_LOAD_PER_CPU:.0%}"
    have = {f["name"] for f in doc["figures"] if f["status"] in ("measured", "computed") and f.get("value") is not None}
    missing = [n for n in names if n not in have]
    if missing:
        return f"缺少数字 {', '.join(missing[:4])}{' …' if len(missing) > 4 else ''}"
    return None


def quiet_series(notebook: str, params: dict, names: "list[str] | tuple[str, ...]" = (), *,
                 root: Path | None = None) -> tuple[QuietRun | None, str]:
    """The quietest re-run of ``notebook`` whose parameters equal ``params`` (the current run's), with
    its figures ``names``; and a sentence saying whom it chose, or why none could be chosen.

    Quiet means it started at a 1-minute load of at most ``QUIET_LOAD_PER_CPU`` per CPU (``start_load``);
    among the quiet ones the lowest load per CPU wins, then the newest. A run whose parameters differ
    measured another thing; an emulated run, one whose load at start was never recorded, or one that
    lacks any of ``names`` is passed over too — the sentence names each runner and its reason. Reads
    ``data/measurements/*/<notebook>.json`` (``load_notebook``). Taught in day07_3, day23_2 and day23_3.
    """
    params = _jsonable(dict(params))
    names = tuple(names)
    docs = load_notebook(check_notebook_id(notebook), root)
    chosen, rejected = [], []
    for doc in docs:
        why = _why_not_quiet(doc, params, names)
        if why:
            rejected.append(f"{doc['provenance']['runner']}：{why}")
        else:
            load1, cpus = start_load(doc)
            chosen.append((load1 / cpus, doc))
    if not chosen:
        where = "；".join(rejected) if rejected else "还没有任何 runner 的记录"
        return None, f"{notebook} 还没有安静的重跑记录（{where}）"
    chosen.sort(key=lambda c: c[1]["provenance"]["date"], reverse=True)   # newest first: min keeps the first of ties
    _, doc = min(chosen, key=lambda c: c[0])
    load1, cpus = start_load(doc)
    values = {f["name"]: f.get("value") for f in doc["figures"]}
    run = QuietRun(notebook, doc["provenance"]["runner"], {n: values[n] for n in names} if names else values,
                   _machine_words(doc),
                   (doc["provenance"].get("machine") or {}).get("git_commit"), doc["provenance"]["date"], load1, cpus)
    return run, run.sentence()


@dataclass
class Reading:
    """Which figures a lesson's conclusion reads (``reading``): this run's, or — when this run's machine was
    busy (``MachineState.busy``) and a quiet re-run exists — the quiet run's."""

    state: MachineState
    quiet: QuietRun | None
    why: str          # quiet_series' sentence: whom it chose, or why no quiet run exists

    @property
    def reads_quiet(self) -> bool:
        return self.state.busy and self.quiet is not None

    def figures(self, own: dict[str, Any]) -> dict[str, Any]:
        """The figures the conclusion reads: ``own`` (this run's, by record name) or the quiet run's."""
        return dict(self.quiet.figures) if self.reads_quiet else dict(own)

    def sentence(self) -> str:
        """Which figures the conclusion reads, and why, in the book's words."""
        here = f"本次运行：{self.state.sentence()}。"
        if self.reads_quiet:
            return here + f"所以下面的结论读{self.quiet.sentence()}的数字；本次的数字列在旁边。"
        if self.state.busy:
            return here + f"{self.why}，所以结论只能读本次运行的数字——把它当作忙机器上的结果。"
        beside = f"（旁边列出{self.quiet.sentence()}的数字）" if self.quiet else f"（{self.why}）"
        return here + f"结论读本次运行的数字{beside}。"


def reading(rec: "Recorder", names: "list[str] | tuple[str, ...]", *timings: "Timing | float",
            root: Path | None = None) -> Reading:
    """Judge this run (``machine_state`` of ``timings`` at the load ``rec`` started at) and find the quiet
    re-run with ``rec``'s parameters and figures ``names`` (``quiet_series``): what the conclusion reads.
    Taught in day07_3, day23_2 and day23_3."""
    load1 = rec.load_at_start[0] if rec.load_at_start else None
    quiet, why = quiet_series(rec.notebook, rec.params, names, root=root)
    return Reading(machine_state(*timings, load1=load1), quiet, why)


# --------------------------------------------------------------------------- commits and staleness
def _git(*args: str) -> subprocess.CompletedProcess | None:
    from kestrel_lab.paths import REPO_ROOT

    try:
        return subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True,
                              timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None


@lru_cache(maxsize=None)
def notebook_commit(notebook: str) -> str | None:
    """The last commit that changed the notebook's file (short hash), or None when unknown
    (not a git checkout, or the notebook is not committed yet). Taught in day28_1."""
    from kestrel_lab import syllabus
    from kestrel_lab.paths import REPO_ROOT

    try:
        path = syllabus.find_notebooks(REPO_ROOT).get(notebook)
    except ValueError:
        return None
    if path is None:
        return None
    res = _git("log", "-1", "--format=%h", "--abbrev=12", "--", path.as_posix())
    return res.stdout.strip() or None if res and res.returncode == 0 else None


@lru_cache(maxsize=None)
def _contains(commit: str, ancestor: str) -> bool | None:
    res = _git("merge-base", "--is-ancestor", ancestor, commit)
    if res is None or res.returncode not in (0, 1):
        return None  # a commit this checkout does not know (e.g. made on the board, never pushed)
    return res.returncode == 0


def measured_with_older_commit(fig_commit: str | None, notebook: str) -> bool | None:
    """True when the figure's commit predates the notebook's last change (the notebook has changed
    since it was measured), False when it does not, None when it cannot be told (article figures,
    unknown commits, no git). Taught in day28_1."""
    if not fig_commit or fig_commit in ("?", "article"):
        return None
    current = notebook_commit(notebook)
    if current is None:
        return None
    return None if (c := _contains(fig_commit.split("+")[0], current)) is None else not c


def _row(doc: dict, fig: dict) -> dict:
    prov = doc["provenance"]
    mach = prov.get("machine") or {}
    return {
        "figure": fig["name"],
        "runner": prov["runner"],
        "value": fig.get("value"),
        "unit": fig["unit"],
        "status": fig["status"],
        "reason": fig.get("reason"),
        "meaning": fig["meaning"],
        "date": prov["date"][:10],
        "commit": mach.get("git_commit") or ("article" if doc["source"] == "article" else "?"),
        "source": doc["source"],
        "stale": None,
        "kind": machine_kind(doc) if doc["source"] == "run" else None,
        "emulated": is_emulated(doc),
        "params": prov.get("parameters") or {},
        "disagree": False,
    }


def format_value(value, status: str = "measured", reason: str | None = None) -> str:
    if status == "not_measured":
        return f"not measured here ({reason})" if reason else "not measured here"
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if value == 0:
        return "0"
    mag = abs(value)
    if mag >= 1e5 or mag < 1e-3:
        return f"{value:.4g}"
    return f"{value:,.4g}" if mag >= 1000 else f"{value:.4g}"


def machine_kind(doc: dict) -> tuple | None:
    """What "the same kind of machine" means when two runners' figures are compared: the CPU models
    with their CPU counts, and the core count, from the provenance; None when the document carries no
    machine (an article's figures). Taught in day28_3."""
    mach = doc["provenance"].get("machine") or {}
    if not mach.get("clusters") and not mach.get("cores"):
        return None
    models = tuple(sorted((str(c.get("model")), len(c.get("cpus") or [])) for c in mach.get("clusters") or []))
    return models, mach.get("cores")


TIMING_UNITS = ("s", "ms", "µs", "us", "ns", "x", "×")


def is_timing_unit(unit: str) -> bool:
    """A time, a throughput (``…/s``) or a speed-up (``x``): the figures a busy machine disturbs."""
    return unit in TIMING_UNITS or unit.endswith("/s")


def _comparable(row: dict) -> bool:
    v = row["value"]
    return (row["source"] == "run" and row["status"] == "measured" and row.get("kind") is not None
            and not row.get("emulated")
            and is_timing_unit(row["unit"])
            and isinstance(v, (int, float)) and not isinstance(v, bool) and v != 0)


def mark_disagreements(rows: list[dict], factor: float = 2.0) -> int:
    """Set ``row["disagree"]`` on every measured timing (a time, a throughput, a speed-up:
    ``is_timing_unit``) that differs by more than ``factor`` from a sibling runner's value of the same
    figure, measured on the same kind of machine (``machine_kind``) with the same notebook parameters
    and unit. Return how many rows were marked.

    Two runs of the same notebook on the same kind of machine should agree within noise; a factor of
    two means one of them was disturbed (a busy machine, another commit, a governor left on
    powersave): neither figure should be trusted before a re-run. Taught in day28_3.
    """
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        row.setdefault("disagree", False)
        if _comparable(row):
            key = (row["figure"], row["unit"], row["kind"], json.dumps(row.get("params") or {}, sort_keys=True))
            groups.setdefault(key, []).append(row)
    n = 0
    for group in groups.values():
        if len({r["runner"] for r in group}) < 2:
            continue
        if len({r["value"] > 0 for r in group}) > 1:
            continue  # values of both signs (a difference, an offset): a ratio means nothing
        mags = [abs(r["value"]) for r in group]
        lo, hi = min(mags), max(mags)
        if hi <= factor * lo:
            continue
        for r in group:
            if abs(r["value"]) > factor * lo or abs(r["value"]) * factor < hi:
                r["disagree"] = True
                n += 1
    return n


class FigureTable:
    """Rows of figures, grouped by figure (its name once, then one row per runner).

    Renders as HTML in a notebook — inside a collapsed ``<details>`` when it has more than
    ``COLLAPSE_ROWS`` rows, so the end of every notebook stays short — and as Markdown for the command
    line (``kestrel-lab compare``), where every row keeps the figure's name so it can be grepped.
    """

    columns = ("figure", "runner", "value", "unit", "date", "commit")
    STALE_MARK = "⚠"
    DISAGREE_MARK = "≠2×"
    COLLAPSE_ROWS = 12

    def __init__(self, rows: list[dict], title: str = "", notes: list[str] | None = None):
        self.rows = rows
        self.title = title
        self.notes = list(notes or [])

    def _cells(self, row: dict) -> list[str]:
        value = format_value(row["value"], row["status"], row.get("reason"))
        if row["source"] == "article":
            value += " (article)"
        elif row["status"] == "computed":
            value += " (computed)"
        elif row.get("emulated") and row["status"] == "measured" and is_timing_unit(row["unit"]):
            value += " (emulated)"
        if row.get("disagree"):
            value += f" {self.DISAGREE_MARK}"
        commit = row["commit"] + (f" {self.STALE_MARK}" if row.get("stale") else "")
        return [row["figure"], row["runner"], value, row["unit"], row["date"], commit]

    def groups(self) -> list[list[dict]]:
        """The rows grouped by figure, in the order the figures first appear."""
        out: dict[str, list[dict]] = {}
        for r in self.rows:
            out.setdefault(r["figure"], []).append(r)
        return list(out.values())

    def to_markdown(self) -> str:
        head = "| " + " | ".join(self.columns) + " |\n|" + "---|" * len(self.columns) + "\n"
        body = "".join("| " + " | ".join(c.replace("|", "\\|") for c in self._cells(r)) + " |\n"
                       for r in self.rows)
        return head + body + "".join(f"\n{n}\n" for n in self.notes)

    def _repr_markdown_(self) -> str:
        return (f"**{self.title}**\n\n" if self.title else "") + self.to_markdown()

    def collapsed(self) -> bool:
        """True when the HTML view folds the table (more than ``COLLAPSE_ROWS`` rows)."""
        return len(self.rows) > self.COLLAPSE_ROWS

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{c}</th>" for c in self.columns)
        body = []
        for group in self.groups():
            meaning = html.escape(group[0].get("meaning") or "", quote=True)
            for i, r in enumerate(group):
                cells = self._cells(r)
                first = (f'<th scope="rowgroup" rowspan="{len(group)}" title="{meaning}">'
                         f"{html.escape(cells[0])}</th>") if i == 0 else ""
                body.append("<tr>" + first + "".join(f"<td>{html.escape(c)}</td>" for c in cells[1:]) + "</tr>")
        tbody = "".join(f"<tbody>{''.join(body[a:b])}</tbody>" for a, b in self._group_spans())
        cap = f"<caption>{html.escape(self.title)}</caption>" if self.title else ""
        table = f'<table class="kestrel-figures">{cap}<thead><tr>{head}</tr></thead>{tbody}</table>'
        notes = "".join(f'<p class="kestrel-figures-note">{html.escape(n)}</p>' for n in self.notes)
        if self.collapsed():
            n_fig = len(self.groups())
            flags = sum(bool(r.get("disagree")) for r in self.rows)
            extra = f"，其中 {flags} 行标了 {self.DISAGREE_MARK}" if flags else ""
            summary = html.escape(f"{self.title or '对照表'}：{n_fig} 个数字，{len(self.rows)} 行{extra}（点击展开）")
            table = f'<details class="kestrel-figures"><summary>{summary}</summary>{table}</details>'
        return table + notes

    def _group_spans(self) -> list[tuple[int, int]]:
        spans, start = [], 0
        for g in self.groups():
            spans.append((start, start + len(g)))
            start += len(g)
        return spans

    def __repr__(self) -> str:
        return self.to_markdown()

    def __len__(self) -> int:
        return len(self.rows)


def compare(notebook: str, root: Path | None = None) -> FigureTable:
    """A notebook's figures side by side across every runner that measured them, grouped by figure.

    Each row says who measured the figure, when, and with which kestrel_lab commit; ⚠ marks a figure
    measured with a commit older than the notebook's last change (re-run it to refresh); ≠2× marks a
    measured timing more than twice (or less than half) a sibling runner's on the same kind of machine
    with the same parameters (``mark_disagreements``; emulated timings are never compared and are
    marked "(emulated)"); "(computed)" marks a figure computed from a
    config or a formula rather than measured. Taught in day01_3, day28_1 and day28_3.
    """
    docs = load_notebook(check_notebook_id(notebook), root)
    order: list[str] = []
    for d in docs:
        for f in d["figures"]:
            if f["name"] not in order:
                order.append(f["name"])
    rows = [_row(d, f) for name in order for d in docs for f in d["figures"] if f["name"] == name]
    for row in rows:
        if row["source"] == "run":
            row["stale"] = measured_with_older_commit(row["commit"], notebook)
    notes = []
    if any(r["stale"] for r in rows):
        notes.append(f"{FigureTable.STALE_MARK} 测量所用的 kestrel_lab 提交早于这篇笔记本的当前版本"
                     f"（{notebook_commit(notebook)}）：重跑一次即可刷新。")
    if mark_disagreements(rows):
        notes.append(f"{FigureTable.DISAGREE_MARK} 同一种机器（相同的 CPU 型号与核数）、相同参数下，两个 runner "
                     "测得的这个时间/吞吐相差超过 2 倍：至少有一次测量被干扰了（机器忙、commit 不同、调频策略不同），"
                     "两个数字都先别信，在安静的机器上重跑再比。")
    if any(r["source"] == "run" and str(r["commit"]).endswith("+dirty") for r in rows):
        notes.append("+dirty 表示测量时工作区有未提交的改动：这样的数字无法按 commit 复现；"
                     "`kestrel-lab rerun` 默认拒绝发布它们（见 --allow-dirty）。")
    return FigureTable(rows, title=f"{notebook}：各 runner 的数字", notes=notes)
