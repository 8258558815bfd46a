"""Kestrel Lab: the Python workbook package of the Qwen inference-engine course.

Each capability lives in one module (see book/contributing.md for the map). Importing the
package points numba's on-disk cache at a user-writable folder unless the caller chose one
(``NUMBA_CACHE_DIR``), so that ``cache=True`` kernels work from a read-only install too and never
write into the source tree (taught in day03_2).
"""
from __future__ import annotations

import os as _os
import sys as _sys

from kestrel_lab.paths import cache_dir as _cache_dir

__version__ = "0.1.0"

if "NUMBA_CACHE_DIR" not in _os.environ:
    _os.environ["NUMBA_CACHE_DIR"] = str(_cache_dir() / "numba")
    if "numba" in _sys.modules:  # numba read its config at import: tell it directly
        _sys.modules["numba"].config.CACHE_DIR = _os.environ["NUMBA_CACHE_DIR"]

# transformers imports tqdm.auto, which in a Jupyter kernel without ipywidgets warns "IProgress not
# found" on every page that compares with transformers; the book builds without widgets on purpose
# (plain-text progress is fine), so that one message is not shown.
import warnings as _warnings

_warnings.filterwarnings("ignore", message="IProgress not found")
