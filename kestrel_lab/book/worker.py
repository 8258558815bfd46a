"""Inside a re-run's worker process: pin, execute one notebook with papermill, write the result.

``python -m kestrel_lab.book.worker --worker SPEC.json`` is started by ``executor.Executor`` for each
notebook; it never raises: whatever happens ends as a result file (``ok``, ``failed``, ``timeout``,
``crashed``) that the executor reads, with the peak resident memory of the kernel and what it started
(``procfs.TreePeak``: a lesson must fit a student's 8 GB laptop). Taught in day28_2.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import time
from pathlib import Path

from kestrel_lab.atomic import atomic_write, write_json
from kestrel_lab.book.runs import OK
from kestrel_lab.procfs import TreePeak


def run_worker(spec_file: str) -> int:
    """Inside the worker process: pin, execute with papermill, write the result. Never raises.

    Taught in day28_2.
    """
    spec = json.loads(Path(spec_file).read_text(encoding="utf-8"))
    result = {"status": "crashed", "error": None}
    tree = TreePeak()   # the kernel is this worker's child: its peak, and its children's, while it runs
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
            with tree:
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
        except Exception as e:  # any other failure is reported, with its type
            result = {"status": "failed", "error": f"{type(e).__name__}: {_first_line(str(e))}"}
    finally:
        with contextlib.suppress(Exception):
            _hide_injected_cell(Path(spec["output"]))
        result["peak_rss_bytes"] = tree.peak or None
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


def main(argv: list[str] | None = None) -> int:
    """The ``python -m kestrel_lab.book.worker`` entry point."""
    ap = argparse.ArgumentParser(description="kestrel-lab rerun's worker process (internal)")
    ap.add_argument("--worker", required=True)
    return run_worker(ap.parse_args(argv).worker)


if __name__ == "__main__":
    raise SystemExit(main())
