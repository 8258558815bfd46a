"""The table a re-run prints at the end: notebook, status, seconds, figures published.

Taught in day28_2.
"""
from __future__ import annotations

from kestrel_lab.book.runs import OK, Result


def figures_cell(r: Result) -> str:
    """The figures column of one notebook: ``12``, ``12 + 3 not measured`` or ``—``. Taught in day28_2."""
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
        rows.append((r.notebook, status, secs, figures_cell(r), note))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row[:4], widths)) + "  " + row[4] for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths) + "  ----")
    n_ok = sum(r.status == OK for r in results)
    total = sum(r.seconds or 0 for r in results if not r.earlier)
    lines.append(f"{n_ok}/{len(results)} ok for runner {runner}; {total:.0f} s of notebooks this time")
    return "\n".join(lines)
