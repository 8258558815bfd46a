"""Kestrel Lab: the Python workbook package of the Qwen inference-engine course.

Each capability lives in one module (see book/contributing.md for the map). Importing the
package sets ``NUMBA_CACHE_DIR`` to a user-writable folder unless the caller chose one, so that
``cache=True`` kernels work from a read-only install too (taught in day03_2).
"""
from __future__ import annotations

import os as _os

from kestrel_lab.paths import cache_dir as _cache_dir

__version__ = "0.1.0"

_os.environ.setdefault("NUMBA_CACHE_DIR", str(_cache_dir() / "numba"))
