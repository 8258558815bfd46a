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
import re
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from kestrel_lab import machine
from kestrel_lab.atomic import write_json
from kestrel_lab.paths import measurements_dir

SCHEMA = "kestrel-lab/measurements/1"
NOTEBOOK_ID = re.compile(r"^day(0[1-9]|[12][0-9]|30)_[123]$")
RUNNER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
STATUSES = ("measured", "not_measured", "article")


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


def provenance(runner: str, params: dict | None = None) -> dict:
    return {
        "runner": runner,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine.fingerprint(),
        "parameters": _jsonable(params or {}),
    }


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

    def record(self, name: str, value, unit: str, meaning: str, **extra):
        """Record a measured figure and return its value (so it can be used inline)."""
        value = _check_value(name, value)
        self.figures[name] = Figure(name, value, unit, meaning, "measured", None, _jsonable(extra))
        return value

    def not_measured(self, name: str, unit: str, meaning: str, reason: str) -> None:
        """A figure this runner cannot measure (e.g. the real model file is absent): say why."""
        self.figures[name] = Figure(name, None, unit, meaning, "not_measured", reason)

    def document(self) -> dict:
        return {
            "schema": SCHEMA,
            "notebook": self.notebook,
            "source": "run",
            "provenance": provenance(self.runner, self.params),
            "figures": [asdict(f) for f in self.figures.values()],
        }

    def save(self, root: Path | None = None) -> Path:
        if not self.figures:
            raise MeasurementError(f"{self.notebook}: nothing recorded, nothing to save")
        path = (root or measurements_dir()) / self.runner / f"{self.notebook}.json"
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


def load_file(path: Path) -> dict:
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise MeasurementError(f"{path}: not valid JSON at line {e.lineno}, column {e.colno}: {e.msg}") from e
    return validate(doc, where=str(path))


def runners(root: Path | None = None) -> list[str]:
    root = root or measurements_dir()
    return sorted(p.name for p in root.iterdir() if p.is_dir()) if root.exists() else []


def load_notebook(notebook: str, root: Path | None = None) -> list[dict]:
    """Every runner's document for one notebook: the article's first, then by runner name."""
    root = root or measurements_dir()
    docs = [load_file(root / r / f"{notebook}.json") for r in runners(root)
            if (root / r / f"{notebook}.json").exists()]
    return sorted(docs, key=lambda d: (d["source"] != "article", d["provenance"]["runner"]))


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


class FigureTable:
    """Rows of figures; renders as HTML in a notebook and as Markdown in text."""

    columns = ("figure", "runner", "value", "unit", "date", "commit")

    def __init__(self, rows: list[dict], title: str = ""):
        self.rows = rows
        self.title = title

    def _cells(self, row: dict) -> list[str]:
        value = format_value(row["value"], row["status"], row.get("reason"))
        if row["source"] == "article":
            value += " (article)"
        return [row["figure"], row["runner"], value, row["unit"], row["date"], row["commit"]]

    def to_markdown(self) -> str:
        head = "| " + " | ".join(self.columns) + " |\n|" + "---|" * len(self.columns) + "\n"
        return head + "".join("| " + " | ".join(c.replace("|", "\\|") for c in self._cells(r)) + " |\n"
                              for r in self.rows)

    def _repr_markdown_(self) -> str:
        return (f"**{self.title}**\n\n" if self.title else "") + self.to_markdown()

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{c}</th>" for c in self.columns)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in self._cells(r)) + "</tr>"
                       for r in self.rows)
        cap = f"<caption>{html.escape(self.title)}</caption>" if self.title else ""
        return f'<table class="kestrel-figures">{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'

    def __repr__(self) -> str:
        return self.to_markdown()

    def __len__(self) -> int:
        return len(self.rows)


def compare(notebook: str, root: Path | None = None) -> FigureTable:
    """A notebook's figures side by side across every runner that measured them."""
    docs = load_notebook(check_notebook_id(notebook), root)
    order: list[str] = []
    for d in docs:
        for f in d["figures"]:
            if f["name"] not in order:
                order.append(f["name"])
    rows = [_row(d, f) for name in order for d in docs for f in d["figures"] if f["name"] == name]
    return FigureTable(rows, title=f"{notebook}: figures by runner")
