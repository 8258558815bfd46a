"""The numba cache folder is keyed by the kernels' sources (``kestrel_lab._kernel_sources_digest``).

numba checks a cached function against its own file only, so after an edit of ``kernels/v16.py`` the cached
whole-step kernel of ``kernels/step.py`` (which inlined v16's code) would run the old code without a word.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import kestrel_lab

PRINT_DIR = "import os, kestrel_lab; print(os.environ['NUMBA_CACHE_DIR'])"


def _cache_dir_of(pkg_parent: Path, cache: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env.update(PYTHONPATH=str(pkg_parent), KESTREL_CACHE_DIR=str(cache))
    out = subprocess.run([sys.executable, "-c", PRINT_DIR], env=env, cwd=pkg_parent, capture_output=True,
                         text=True, check=True)
    return out.stdout.strip()


def test_editing_a_kernel_source_moves_the_numba_cache_and_other_edits_do_not(tmp_path):
    pkg = tmp_path / "src" / "kestrel_lab"
    shutil.copytree(Path(kestrel_lab.__file__).parent, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    cache = tmp_path / "cache"
    first = _cache_dir_of(pkg.parent, cache)
    assert Path(first).parent == cache / "numba" or Path(first).parent == cache / "numba-slp"
    assert first == _cache_dir_of(pkg.parent, cache)                     # stable while nothing changes
    with open(pkg / "cli.py", "a", encoding="utf-8") as fh:              # no cache=True kernel in it
        fh.write("\n# an edit that compiles nothing\n")
    assert _cache_dir_of(pkg.parent, cache) == first
    with open(pkg / "kernels" / "v16.py", "a", encoding="utf-8") as fh:  # inlined by kernels/step.py
        fh.write("\n# an edit of a kernel source\n")
    assert _cache_dir_of(pkg.parent, cache) != first


def test_an_explicit_numba_cache_dir_wins(tmp_path):
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "mine"))
    out = subprocess.run([sys.executable, "-c", PRINT_DIR], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(tmp_path / "mine")
