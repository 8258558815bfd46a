#!/usr/bin/env python3
"""Write a notebook from a percent-format script (an authoring aid; the .ipynb is what is committed).

    # %% [markdown]
    # # 标题 …            (markdown cells: each line starts with "# ")
    # %% tags=["parameters"]
    runner = "local"
    # %%
    code …

Usage: python scripts/make_notebook.py SRC.py notebooks/dayDD/dayDD_P_slug.ipynb
The result has no outputs, the python3 kernelspec and the workbook's metadata.
"""
import json
import re
import sys

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HEADER = re.compile(r"^# %%(?:\s+\[(markdown)\])?(?:\s+tags=(\[.*\]))?\s*$")


def convert(text: str) -> nbformat.NotebookNode:
    cells, kind, tags, buf = [], None, [], []

    def flush():
        if kind is None:
            return
        body = "\n".join(buf).strip("\n")
        if kind == "markdown":
            body = "\n".join(line[2:] if line.startswith("# ") else line.lstrip("#") for line in body.splitlines())
            cell = new_markdown_cell(body)
        else:
            cell = new_code_cell(body)
        if tags:
            cell.metadata["tags"] = tags
        cells.append(cell)

    for line in text.splitlines():
        m = HEADER.match(line)
        if m:
            flush()
            kind = "markdown" if m.group(1) else "code"
            tags = json.loads(m.group(2)) if m.group(2) else []
            buf = []
        elif kind is not None:
            buf.append(line)
    flush()
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"c{i:03d}"
    return nb


if __name__ == "__main__":
    src, out = sys.argv[1], sys.argv[2]
    nb = convert(open(src, encoding="utf-8").read())
    nbformat.validate(nb)
    with open(out, "w", encoding="utf-8") as fh:
        nbformat.write(nb, fh)
    print(f"wrote {out}: {len(nb.cells)} cells")
