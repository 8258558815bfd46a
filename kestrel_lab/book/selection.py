"""What a re-run runs: the ``--days``, ``--notebooks``, ``--cpus`` and ``-p`` arguments, and the notebooks they select.

Every check here happens before anything runs, so a typo costs nothing; a bad value raises
``RunnerError`` (a ``ValueError``) saying which argument and why. Taught in day28_2.
"""
from __future__ import annotations

import contextlib
import re
from pathlib import Path

from kestrel_lab.paths import REPO_ROOT

ID_ARG = re.compile(r"^(?:day)?(\d{1,2})_([123])$")


class RunnerError(ValueError):
    """Bad arguments or state for a re-run (an unknown notebook, a bad --cpus range, …)."""


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
    """``"4-7"`` -> [4, 5, 6, 7] (the A76 cluster of an RK3588), or a cluster name: ``big`` (the
    fastest cores), ``little``, ``all`` (``machine.resolve_cpus``); every CPU must be usable here.
    """
    from kestrel_lab import machine

    try:
        return list(machine.resolve_cpus(spec).cpus)
    except ValueError as e:
        raise RunnerError(str(e)) from None


def parse_value(text: str):
    """A ``-p`` value as papermill would want it: true/false/none, an int, a float, else the text."""
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
    (which ``--runner`` sets)."""
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
