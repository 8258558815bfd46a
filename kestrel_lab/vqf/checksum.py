"""FNV-1a 64: the checksum in a plain VQF file's last 8 bytes.

FNV-1a is one XOR and one multiply per byte, ``h = (h ^ b) * 0x100000001b3 mod 2^64`` from
``h = 0xcbf29ce484222325``. It covers the directory bytes (448 .. 448 + 64·n) and then the data area
[data_offset, file_len) — not the header, not the padding between directory and data. Every step
depends on the previous one, so it cannot be vectorised or split over threads: its speed is one
multiply latency per byte, far below what memory could deliver. That is why the loader only runs it
when asked (article 16-3: 7.21 s for 2.33 GB on the board) and checks truncation by size instead.
Checking a whole file (``verify_file``) is the reader's job: it lives in ``vqf.reader``, which uses
this module, never the other way round.

Taught in day16_3.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
from numba import njit

FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
CHUNK = 64 << 20  # bytes per kernel call when streaming a file: progress and interrupts stay responsive


@njit(cache=True)
def _fnv1a64_kernel(data, h):
    prime = np.uint64(0x100000001B3)
    for i in range(data.shape[0]):
        h = (h ^ np.uint64(data[i])) * prime
    return h


def fnv1a64_py(data: bytes, h: int = FNV_OFFSET) -> int:
    """The definition, in plain Python (a few MB/s): the reference the numba kernel is tested against.
    Taught in day16_3."""
    for b in data:
        h = ((h ^ b) * FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return h


def _as_u8(data) -> np.ndarray:
    if isinstance(data, np.ndarray):
        if data.dtype != np.uint8:
            data = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        return data.reshape(-1)
    return np.frombuffer(data, dtype=np.uint8)


def fnv1a64(data, h: int = FNV_OFFSET, progress: Callable[[int, int], None] | None = None) -> int:
    """FNV-1a 64 of ``data`` (uint8 array, bytes, memoryview, an mmap) continuing from ``h``.

    Streams in 64 MiB chunks so that a multi-GB mmap is hashed without copying; pass the previous
    result as ``h`` to hash several ranges as one stream. Taught in day16_3.
    """
    arr = _as_u8(data)
    hv = np.uint64(h)
    n = arr.shape[0]
    for lo in range(0, n, CHUNK):
        hv = np.uint64(_fnv1a64_kernel(arr[lo:lo + CHUNK], hv))  # numba hands back a Python int
        if progress:
            progress(min(n, lo + CHUNK), n)
    return int(hv)


def hash_ranges(buf, n_tensors: int, data_offset: int, file_len: int, dir_offset: int = 448) -> int:
    """The article's range over a file's bytes: directory, then [data_offset, file_len). Taught in day16_3."""
    arr = _as_u8(buf)
    h = fnv1a64(arr[dir_offset:dir_offset + 64 * n_tensors])
    return fnv1a64(arr[data_offset:file_len], h)


def warm_up() -> None:
    """Compile (or load from numba's cache) the kernel so timings measure hashing, not compiling. Taught in day16_3."""
    fnv1a64(np.zeros(16, dtype=np.uint8))


__all__ = ["FNV_OFFSET", "FNV_PRIME", "fnv1a64", "fnv1a64_py", "hash_ranges", "warm_up"]
