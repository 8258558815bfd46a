"""Kestrel Lab: the Python workbook package of the Qwen inference-engine course.

Each capability lives in one module (see book/contributing.md for the map). Importing the
package points numba's on-disk cache at a user-writable folder unless the caller chose one
(``NUMBA_CACHE_DIR``), so that ``cache=True`` kernels work from a read-only install too and never
write into the source tree (taught in day03_2).
"""
from __future__ import annotations

import os as _os
import sys as _sys
import warnings as _warnings

from kestrel_lab.paths import cache_dir as _cache_dir

__version__ = "0.1.0"

# On aarch64, LLVM's SLP vectorizer is what turns the int8 dot of the A76 kernels into ``sdot``: the
# 16-step inner loop is fully unrolled before the loop vectorizer sees it, and numba leaves SLP off
# by default, so without this the "sdot" kernels compile to scalar ``madd`` on the board (found by
# `make board-smoke`'s emulated A76; the x86 cross-compile of ``kernels.asm.cross_asm`` runs SLP and
# hid it). x86 code generation is left as numba's default. An explicit NUMBA_SLP_VECTORIZE wins.
# Taught in day07_1.
_SLP = _os.environ.get("NUMBA_SLP_VECTORIZE")
if _SLP is None and _os.uname().machine.lower() in ("aarch64", "arm64"):
    _SLP = _os.environ["NUMBA_SLP_VECTORIZE"] = "1"
    if "numba" in _sys.modules:  # numba read its config at import; it reads this one at each compile
        _sys.modules["numba"].config.SLP_VECTORIZE = 1


def _kernel_sources_digest() -> str:
    """A digest of every package module that holds ``cache=True`` kernels. numba checks a cached function
    against its own file only: after an edit of ``kernels/v16.py`` the cached whole-step kernel of
    ``kernels/step.py`` (which inlined v16's code) would still run the old code, silently. Keying the
    cache folder by these sources makes any kernel edit compile afresh."""
    import hashlib
    from pathlib import Path

    h = hashlib.sha256()
    root = Path(__file__).resolve().parent
    for path in sorted(root.rglob("*.py")):
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if b"cache=True" in data:
            h.update(path.relative_to(root).as_posix().encode() + b"\0" + data)
    return h.hexdigest()[:12]


if "NUMBA_CACHE_DIR" not in _os.environ:
    # kernels cached under other code-generation settings, or compiled from other kernel sources, are not
    # reused: their folder differs
    _os.environ["NUMBA_CACHE_DIR"] = str(_cache_dir() / ("numba-slp" if _SLP == "1" else "numba")
                                         / _kernel_sources_digest())
    if "numba" in _sys.modules:  # numba read its config at import: tell it directly
        _sys.modules["numba"].config.CACHE_DIR = _os.environ["NUMBA_CACHE_DIR"]

# transformers imports tqdm.auto, which in a Jupyter kernel without ipywidgets warns "IProgress not
# found" on every page that compares with transformers; the book builds without widgets on purpose
# (plain-text progress is fine), so that one message is not shown.
_warnings.filterwarnings("ignore", message="IProgress not found")
