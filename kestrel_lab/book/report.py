"""After ``make book``: each notebook's seconds and peak memory, against its budget.

The book build executes the notebooks through myst-nb's cache (jupyter-cache), one kernel at a time
(jupyter-book runs Sphinx with one process). The cache records each notebook's execution seconds; each
notebook's ``Recorder`` saved its kernel's peak resident memory and age (``procfs.process_usage``) into
``data/measurements/local/<id>.json``. ``kestrel-lab book report`` joins the two and flags what ran over
``summary.over_budget`` (60 s, 2 GiB), so a lesson that would not build on a student's 8 GB laptop is
seen at once. A notebook taken from the cache shows the figures of the run that filled it.
"""
from __future__ import annotations

import json
from pathlib import Path

from kestrel_lab.book.summary import PEAK_RSS_BUDGET, SECONDS_BUDGET, gib, over_budget


def cache_seconds(cache_dir: Path, notebooks: dict[str, Path]) -> dict[str, float]:
    """Notebook id -> execution seconds of its latest record in the jupyter-cache at ``cache_dir``
    (``notebooks``: id -> absolute path); empty when there is no cache."""
    if not (Path(cache_dir) / "global.db").exists():
        return {}
    from jupyter_cache import get_cache

    by_path = {str(Path(p).resolve()): nb for nb, p in notebooks.items()}
    latest: dict[str, tuple] = {}
    for rec in get_cache(cache_dir).list_cache_records():
        nb = by_path.get(str(Path(rec.uri).resolve()))
        secs = (rec.data or {}).get("execution_seconds")
        if nb and secs is not None and (nb not in latest or rec.created > latest[nb][0]):
            latest[nb] = (rec.created, float(secs))
    return {nb: secs for nb, (_, secs) in latest.items()}


def local_usage(measurements: Path) -> dict[str, dict]:
    """Notebook id -> ``{"peak_rss_bytes", "seconds"}`` its kernel saved with the build's figures
    (``<measurements>/local/<id>.json``, provenance ``process``); files without it are left out."""
    out = {}
    for f in sorted((Path(measurements) / "local").glob("*.json")):
        try:
            proc = json.loads(f.read_text(encoding="utf-8"))["provenance"].get("process") or {}
        except (OSError, ValueError, KeyError, AttributeError):
            continue
        if proc.get("peak_rss_bytes") is not None:
            out[f.stem] = proc
    return out


def report_table(ids: list[str], seconds: dict[str, float], usage: dict[str, dict]) -> str:
    """One line per notebook: seconds (the cache's, else the kernel's age), peak RSS, what ran over
    budget; then the largest of each and how many were over."""
    rows = [("notebook", "seconds", "peak RSS", "over budget")]
    n_over, secs_all, peaks = 0, [], []
    for nb in ids:
        secs = seconds.get(nb, (usage.get(nb) or {}).get("seconds"))
        peak = (usage.get(nb) or {}).get("peak_rss_bytes")
        over = over_budget(secs, peak)
        n_over += bool(over)
        secs_all += [secs] if secs is not None else []
        peaks += [peak] if peak is not None else []
        rows.append((nb, "—" if secs is None else f"{secs:.1f}", gib(peak), ", ".join(over)))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r[:3], widths)) + "  " + r[3] for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths) + "  -----------")
    lines.append(f"{len(ids)} notebooks; slowest {max(secs_all, default=0):.1f} s, largest peak "
                 f"{gib(max(peaks)) if peaks else '—'}; {n_over} over budget ({SECONDS_BUDGET} s, "
                 f"{gib(PEAK_RSS_BUDGET)} per notebook)")
    return "\n".join(lines)


def build_report(root: Path, cache_dir: Path) -> str:
    """The report of the book at ``root`` (its notebooks, ``data/measurements``) with the cache at
    ``cache_dir``."""
    from kestrel_lab import syllabus
    from kestrel_lab.paths import measurements_dir

    notebooks = {nb: Path(root) / p for nb, p in syllabus.find_notebooks(root).items()}
    return report_table(list(notebooks), cache_seconds(cache_dir, notebooks), local_usage(measurements_dir()))
