"""The table a re-run prints at the end: notebook, status, seconds, peak memory, figures published.

Each notebook has a budget on its defaults, so the book builds where students work: at most
``SECONDS_BUDGET`` seconds and ``PEAK_RSS_BUDGET`` bytes resident (kernel and children together) — a
student's 8 GB laptop runs the build (``make book``) and a browser beside it. ``over_budget`` names what
a run exceeded; this table and the dashboard flag it. Taught in day28_2.
"""
from __future__ import annotations

from kestrel_lab.book.runs import OK, Result

SECONDS_BUDGET = 60              # a notebook on its defaults (quick), on a 2-core machine
PEAK_RSS_BUDGET = 2 * 2**30      # bytes resident at the peak, kernel and its children


def gib(nbytes: int | None) -> str:
    """``1.23 GiB``, or ``—`` when unknown."""
    return "—" if nbytes is None else f"{nbytes / 2**30:.2f} GiB"


def over_budget(seconds: float | None, peak_rss_bytes: int | None, quick: bool = True) -> list[str]:
    """What a notebook's run exceeded: ``> 60 s`` (only on its defaults, ``quick``) and ``> 2 GiB``; empty
    when within budget or unknown. Taught in day28_2."""
    out = []
    if quick and seconds is not None and seconds > SECONDS_BUDGET:
        out.append(f"> {SECONDS_BUDGET} s")
    if peak_rss_bytes is not None and peak_rss_bytes > PEAK_RSS_BUDGET:
        out.append(f"> {gib(PEAK_RSS_BUDGET)}")
    return out


def figures_cell(r: Result) -> str:
    """The figures column of one notebook: ``12``, ``12 + 3 not measured`` or ``—``. Taught in day28_2."""
    if r.figures is None:
        return "—"
    return f"{r.figures}" + (f" + {r.not_measured} not measured" if r.not_measured else "")


def quiet_note(quiet: dict | None) -> str:
    """The summary's words for a notebook's start: empty when it started quiet (or nobody asked)."""
    if not quiet or quiet.get("outcome") == "quiet":
        return ""
    if quiet["outcome"] == "waited":
        return f"waited {quiet['waited_s']:g} s for load ≤ {quiet['limit']:g}"
    if quiet["outcome"] == "gave_up":
        return (f"started at load {quiet['load1']:.2f} > {quiet['limit']:g} "
                f"(gave up waiting after {quiet['waited_s']:g} s)")
    return "load average unknown: started without waiting"


def summary_table(results: list[Result], runner: str, quick: bool = True) -> str:
    """The table printed at the end of a run: notebook, status, seconds, peak RSS, figures recorded; the
    note says what ran over budget (``over_budget``; seconds only on the defaults, ``quick``).

    Taught in day28_2.
    """
    rows = [("notebook", "status", "seconds", "peak RSS", "figures", "note")]
    for r in results:
        status = f"{r.status} (earlier)" if r.earlier and r.status == OK else r.status
        secs = f"{r.seconds:.1f}" if r.seconds is not None else "—"
        over = over_budget(r.seconds, r.peak_rss_bytes, quick)
        calm = quiet_note(r.quiet)
        note = "; ".join([*(["over budget: " + ", ".join(over)] if over else []), *([calm] if calm else []),
                          r.error or (r.output or "")])
        rows.append((r.notebook, status, secs, gib(r.peak_rss_bytes), figures_cell(r), note.strip("; ")))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row[:5], widths)) + "  " + row[5] for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths) + "  ----")
    n_ok = sum(r.status == OK for r in results)
    total = sum(r.seconds or 0 for r in results if not r.earlier)
    peaks = [r.peak_rss_bytes for r in results if r.peak_rss_bytes is not None and not r.earlier]
    n_over = sum(bool(over_budget(r.seconds, r.peak_rss_bytes, quick)) for r in results)
    n_loud = sum(bool(r.quiet and r.quiet.get("outcome") == "gave_up") for r in results if not r.earlier)
    lines.append(f"{n_ok}/{len(results)} ok for runner {runner}; {total:.0f} s of notebooks this time"
                 + (f"; largest peak RSS {gib(max(peaks))}" if peaks else "")
                 + (f"; {n_over} over budget ({SECONDS_BUDGET} s on the defaults, {gib(PEAK_RSS_BUDGET)})"
                    if n_over else "")
                 + (f"; {n_loud} started above --quiet-load (see the note)" if n_loud else ""))
    return "\n".join(lines)
