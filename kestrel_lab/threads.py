"""How many numba threads a computation uses, and on which CPUs: resolved and checked in one place.

The engine, the benchmarks and the lessons all run numba's parallel kernels. ``resolve_threads``
turns a request (``None`` = the default) into a checked count, and ``numba_threads`` runs a block
with that count and restores the previous one afterwards — the only place in the package that calls
``numba.set_num_threads``, so a kernel can never leave the process on a thread count nobody asked for.

On a big.LITTLE board (an RK3588: 4×A76 + 4×A55) an even split over all eight cores makes the A76
threads wait for the A55 ones, so the default is the fastest cluster among the CPUs this process may
use (``machine.resolve_cpus``): ``use_cpus`` pins the whole process there (every thread, numba's pool
included) and the default count becomes that cluster's size. ``--cpus big|little|all|4-7`` and
``--threads N`` on the engine commands change both. Taught in day10_1.
The bandwidth and numba lessons reach the same functions through ``roofline``.
"""
from __future__ import annotations

import os
from contextlib import contextmanager

import numba
import numpy as np

from kestrel_lab import machine

_CHOICE: machine.CpuChoice | None = None   # what use_cpus pinned the process to


def use_cpus(spec: str | None = None) -> machine.CpuChoice:
    """Pin this process — every thread it has, numba's workers too — to ``spec`` (``None``: the
    fastest cluster it may use; ``big``, ``little``, ``all`` or a CPU list), and make that set the
    default of ``resolve_threads``. Returns the choice (``choice.note()`` says what and why).
    Raises ValueError for a CPU set this process may not use. Taught in day10_1.
    """
    global _CHOICE
    choice = machine.resolve_cpus(spec)
    if hasattr(os, "sched_setaffinity") and set(choice.cpus) != set(os.sched_getaffinity(0)):
        _pin_all_threads(set(choice.cpus))
    _CHOICE = choice
    return choice


def _pin_all_threads(cpus: set[int]) -> None:
    """``sched_setaffinity`` is per thread: set it on every thread of the process (/proc/self/task),
    so worker threads started before the call (numba's pool) move too."""
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cpus)
        except ProcessLookupError:  # a thread that ended meanwhile
            pass


CPUS_ENV = "KESTREL_CPUS"   # a --cpus value for every engine in this process (``rerun --cpus`` sets it)
_RESOLVED: dict[tuple, machine.CpuChoice] = {}


def default_cpus() -> machine.CpuChoice:
    """The CPUs a computation uses when nobody said: what ``use_cpus`` pinned, else ``KESTREL_CPUS``,
    else the fastest cluster among the CPUs this process may use. On a machine with more than one
    core type the process is pinned there on first use, so that no thread lands on a slower core.
    Taught in day10_1."""
    if _CHOICE is not None:
        return _CHOICE
    spec = os.environ.get(CPUS_ENV) or None
    key = (spec, frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None)
    if key not in _RESOLVED:
        choice = machine.resolve_cpus(spec)
        if choice.multi:
            return use_cpus(spec)
        _RESOLVED[key] = choice
    return _RESOLVED[key]


def default_threads() -> int:
    """The default thread count: one per CPU of ``default_cpus``, at most numba's pool size
    (``NUMBA_NUM_THREADS``). Taught in day10_1."""
    return max(1, min(numba.config.NUMBA_NUM_THREADS, len(default_cpus().cpus)))


def resolve_threads(threads: int | None) -> int:
    """``None`` -> ``default_threads()`` (the fastest cluster's size); otherwise check the range.

    Taught in day10_1.
    """
    limit = numba.config.NUMBA_NUM_THREADS
    if threads is None:
        return default_threads()
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)):
        raise TypeError(f"threads must be an int or None, not {type(threads).__name__}")
    if not 1 <= threads <= limit:
        raise ValueError(f"threads={threads}: numba can use 1 to {limit} threads here "
                         f"(NUMBA_NUM_THREADS={limit})")
    return int(threads)


@contextmanager
def numba_threads(threads: int | None):
    """Run the block with ``threads`` numba threads (None: the default), then restore the count.

    Yields the count in use. Taught in day10_1.
    """
    n = resolve_threads(threads)
    previous = numba.get_num_threads()
    numba.set_num_threads(n)
    try:
        yield n
    finally:
        numba.set_num_threads(previous)


def threading_layer() -> str | None:
    """numba's threading layer once a parallel kernel has run (``omp``, ``tbb``, ``workqueue``), else
    None."""
    try:
        return numba.threading_layer()
    except ValueError:
        return None
