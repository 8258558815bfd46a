"""Run folders: ``runs/<runner>/<UTC time>/`` with the executed notebooks, their logs, the staging
folder and ``run.json`` (the state of every notebook), so that the same command resumes a run.

Taught in day28_2.
"""
from __future__ import annotations

import json
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

from kestrel_lab.atomic import write_json
from kestrel_lab.book.selection import RunnerError
from kestrel_lab.measure import utc_now

STATE_FILE = "run.json"
STAGE = "stage"
OK = "ok"


@dataclass
class Result:
    """What happened to one notebook in a run. Taught in day28_2."""

    notebook: str
    status: str  # ok, failed, timeout, crashed, interrupted, not run
    seconds: float | None = None
    peak_rss_bytes: int | None = None  # the kernel's and its children's peak resident memory (procfs.TreePeak)
    figures: int | None = None  # measured figures published
    not_measured: int = 0
    error: str | None = None
    output: str | None = None  # the executed notebook, relative to the run folder
    finished: str | None = None
    quiet: dict | None = None  # --quiet-load: the load it started at, and whether it waited (rerun.QuietGate)
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
    def start(cls, path: Path, runner: str, params: dict, *, exist_ok: bool = False,
              **settings) -> "RunFolder":
        """A new run folder at ``path``, its ``run.json`` written: the one place a run's state is built.

        Taught in day28_2.
        """
        path = Path(path)
        path.mkdir(parents=True, exist_ok=exist_ok)
        state = {"runner": runner, "started": utc_now(), "parameters": params, "complete": False,
                 **settings, "notebooks": {}}
        folder = cls(path, state)
        folder.save()
        return folder

    @classmethod
    def create(cls, runs_root: Path, runner: str, params: dict, **settings) -> "RunFolder":
        """A new folder ``<runs_root>/<runner>/<UTC stamp>/`` (``-2``, ``-3``, … when that one exists)."""
        base = Path(runs_root) / runner
        stamp = utc_now(compact=True)
        path, n = base / stamp, 1
        while path.exists():
            n += 1
            path = base / f"{stamp}-{n}"
        return cls.start(path, runner, params, **settings)

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
