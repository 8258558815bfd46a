"""The book's execution cache re-runs a notebook when the package code or data it depends on changes.

A small fixture book (a two-module package, a data file, two notebooks) with a real jupyter-cache:
a package-only change drops exactly the cached outputs of the notebooks that import the module.
"""
import json
from pathlib import Path

import nbformat
import pytest

from kestrel_lab.book import cache as bookcache

jupyter_cache = pytest.importorskip("jupyter_cache")


def _notebook(path: Path, code: str) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_markdown_cell("# Day 01 · 1｜fixture"), nbformat.v4.new_code_cell(code)]
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


@pytest.fixture
def book(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('"""fixture package"""\n')
    (pkg / "a.py").write_text("from pkg import helpers\nCONFIG = 'tiny.config.json'\n")
    (pkg / "helpers.py").write_text("def f():\n    return 1\n")
    (pkg / "unrelated.py").write_text("X = 1\n")
    (tmp_path / "data" / "configs").mkdir(parents=True)
    (tmp_path / "data" / "configs" / "tiny.config.json").write_text('{"hidden_size": 8}\n')
    (tmp_path / "data" / "configs" / "other.config.json").write_text('{"hidden_size": 9}\n')
    nb_a = _notebook(tmp_path / "notebooks" / "day01" / "day01_1_uses_a.ipynb", "from pkg import a\nprint(a.CONFIG)")
    nb_u = _notebook(tmp_path / "notebooks" / "day01" / "day01_2_uses_unrelated.ipynb", "import pkg.unrelated")
    project = bookcache.Project(tmp_path, package="pkg")
    cache_dir = tmp_path / "_build" / ".jupyter_cache"
    cache = jupyter_cache.get_cache(cache_dir)

    def build():
        """What the book build does: run the sweep, then (re)cache every notebook without a record."""
        dropped = bookcache.sweep(cache_dir, [nb_a, nb_u], project)
        for nb in (nb_a, nb_u):
            try:
                cache.match_cache_notebook(nbformat.read(nb, as_version=4))
            except KeyError:
                cache.cache_notebook_file(nb, check_validity=False)
        return sorted(p.name for p in dropped)

    return tmp_path, build, nb_a, nb_u


def test_inputs_follow_imports_through_the_package(book):
    root, _, nb_a, nb_u = book
    project = bookcache.Project(root, package="pkg")
    names = {p.relative_to(root).as_posix() for p in bookcache.notebook_inputs(nb_a, project)}
    assert {"pkg/__init__.py", "pkg/a.py", "pkg/helpers.py", "data/configs/tiny.config.json"} <= names
    assert "pkg/unrelated.py" not in names and "data/configs/other.config.json" not in names
    assert "pkg/unrelated.py" in {p.relative_to(root).as_posix() for p in bookcache.notebook_inputs(nb_u, project)}


def test_a_package_only_change_reruns_the_notebooks_that_import_it(book):
    root, build, nb_a, nb_u = book
    build()                      # first build: everything executes and is cached
    assert build() == []         # nothing changed: every output comes from the cache
    (root / "pkg" / "helpers.py").write_text("def f():\n    return 2\n")   # imported by a, through pkg.a
    assert build() == [nb_a.name]
    (root / "pkg" / "unrelated.py").write_text("X = 2\n")
    assert build() == [nb_u.name]
    (root / "data" / "configs" / "tiny.config.json").write_text('{"hidden_size": 16}\n')  # data a names
    assert build() == [nb_a.name]
    (root / "data" / "configs" / "other.config.json").write_text('{"hidden_size": 10}\n')  # named by nobody
    assert build() == []


def test_figures_of_other_runners_are_inputs_but_the_builds_own_are_not(book):
    root, build, nb_a, _ = book
    build()
    local = root / "data" / "measurements" / "local" / "day01_1.json"
    local.parent.mkdir(parents=True)
    local.write_text("{}")
    assert build() == []         # the build writes its own figures: that must not re-run it forever
    board = root / "data" / "measurements" / "rk3588" / "day01_1.json"
    board.parent.mkdir(parents=True)
    board.write_text("{}")
    assert build() == [nb_a.name]  # its comparison table now has a board row


def test_a_cache_from_before_the_manifest_counts_as_changed(book):
    root, build, nb_a, nb_u = book
    build()
    (root / "_build" / ".jupyter_cache" / bookcache.MANIFEST).unlink()
    assert build() == sorted([nb_a.name, nb_u.name])
    manifest = json.loads((root / "_build" / ".jupyter_cache" / bookcache.MANIFEST).read_text())
    assert set(manifest) == {"notebooks/day01/day01_1_uses_a.ipynb", "notebooks/day01/day01_2_uses_unrelated.ipynb"}
