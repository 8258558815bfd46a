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
