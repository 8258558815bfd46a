#!/usr/bin/env python3
"""Execute notebooks as the book build does and report, per notebook: seconds, peak RSS, errors, pictures.

usage: .venv/bin/python scripts/exec_notebook.py notebooks/day10/day10_2_gqa.ipynb [...]
The executed copy lands in /tmp/nbexec/<name>.ipynb (open it to read the outputs). Exit 1 on an error.
Peak RSS is the kernel's and its children's (procfs.TreePeak), not this script's own.
KESTREL_STUDENT is off unless set (the exercise checks then never use a student's workspace).
"""
import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from kestrel_lab.procfs import TreePeak

os.environ.pop("MPLBACKEND", None)
os.environ.setdefault("KESTREL_STUDENT", "off")  # as the book build: no student workspace unless asked for
out_dir = Path(os.environ.get("NBEXEC_DIR", "/tmp/nbexec"))
out_dir.mkdir(parents=True, exist_ok=True)
bad = 0
for arg in sys.argv[1:]:
    path = Path(arg).resolve()
    nb = nbformat.read(path, as_version=4)
    t0 = time.perf_counter()
    err = None
    tree = TreePeak()
    try:
        resources = {"metadata": {"path": str(path.parent)}}
        with TreePeak() as tree:  # after each cell: the kernel's high-water mark, read while it lives
            NotebookClient(nb, timeout=600, kernel_name="python3", resources=resources,
                           on_cell_executed=lambda **_: tree.sample()).execute()
    except Exception as e:  # report and go on
        err = f"{type(e).__name__}: {str(e)[-1500:]}"
    secs = time.perf_counter() - t0
    pngs = sum(1 for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
               if "image/png" in o.get("data", {}))
    nbformat.write(nb, out_dir / path.name)
    print(f"{path.name}: {secs:.1f} s, peak {tree.peak / 2**30:.2f} GiB, {pngs} pictures, "
          f"{'ERROR ' + err if err else 'ok'}")
    bad += err is not None
sys.exit(1 if bad else 0)
