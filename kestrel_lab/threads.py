"""How many numba threads a computation uses: resolved and checked in one place, set in one place.

The engine, the benchmarks and the lessons all run numba's parallel kernels. ``resolve_threads``
turns a request (``None`` = numba's default, ``NUMBA_NUM_THREADS``) into a checked count, and
``numba_threads`` runs a block with that count and restores the previous one afterwards — the only
place in the package that calls ``numba.set_num_threads``, so a kernel can never leave the process
on a thread count nobody asked for. Taught in day10_1. The bandwidth and numba lessons reach the same functions through ``roofline``.
"""
from __future__ import annotations

from contextlib import contextmanager

import numba
import numpy as np


def resolve_threads(threads: int | None) -> int:
    """``None`` -> numba's default thread count (``NUMBA_NUM_THREADS``); otherwise check the range.

    Taught in day10_1.
    """
    limit = numba.config.NUMBA_NUM_THREADS
    if threads is None:
        return limit
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)):
        raise TypeError(f"threads must be an int or None, not {type(threads).__name__}")
    if not 1 <= threads <= limit:
        raise ValueError(f"threads={threads}: numba can use 1 to {limit} threads here "
                         f"(NUMBA_NUM_THREADS={limit})")
    return int(threads)


@contextmanager
def numba_threads(threads: int | None):
    """Run the block with ``threads`` numba threads (None: numba's default), then restore the count.

    Yields the count in use. Taught in day10_1.
    """
    n = resolve_threads(threads)
    previous = numba.get_num_threads()
    numba.set_num_threads(n)
    try:
        yield n
    finally:
        numba.set_num_threads(previous)
