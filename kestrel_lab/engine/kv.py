"""The KV cache: keys and values of every past token, preallocated once for the whole context.

Decoding token ``n`` needs the keys and values of tokens 0…n−1 in every layer; recomputing them
would make each step cost the whole prefix again, so they are kept. Layout per layer:
``(kv_heads, max_context, head_dim)`` float32, so that one head's keys for all positions are one
contiguous run (the attention loop walks positions).

Allocation: the OS maps fresh anonymous pages lazily, so a 4,096-token cache should only cost memory
for the positions actually written. ``np.zeros`` breaks that for big arrays: numpy asks the kernel
for *transparent huge pages* on them (``madvise(MADV_HUGEPAGE)``), and one token writes one row in
each of the ``layers × kv_heads`` runs — each in its own 2 MiB huge page, so the first token of
Qwen3-0.6B commits ~896 MiB. ``alloc="lazy"`` (the default) maps the arrays itself and asks for
ordinary 4 KiB pages (``MADV_NOHUGEPAGE``): the first token then commits a few MiB.
``alloc="numpy"`` keeps the old ``np.zeros`` allocation, so the difference can be measured.

Memory: ``2 (K and V) × layers × kv_heads × head_dim × 4 bytes`` per token — 224 KiB for
Qwen3-0.6B (28 × 8 × 128), i.e. 896 MiB at 4,096 tokens: GQA (8 KV heads for 16 query heads)
halves it. ``truncate(pos)`` rolls back (multi-turn chat reuses the common prefix); writing past
``max_context`` raises ``ContextFullError`` instead of silently wrapping.
Taught in day11_1 and day11_3.
"""
from __future__ import annotations

import mmap

import numpy as np

ALLOCS = ("lazy", "numpy")


def lazy_zeros(shape: tuple[int, ...], dtype=np.float32) -> np.ndarray:
    """A zero array on its own anonymous mapping with ordinary (not huge) pages: memory is committed
    4 KiB at a time, where it is written. Taught in day11_3."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    if nbytes == 0:
        return np.zeros(shape, dtype)
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        buf.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(buf, dtype=dtype).reshape(shape)


class ContextFullError(ValueError):
    """Raised when tokens would go past the KV cache's ``max_context``. Taught in day11_3."""


class KVCache:
    """Preallocated keys/values for ``layers`` layers. Taught in day11_1."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, max_context: int, alloc: str = "lazy"):
        if max_context < 1:
            raise ValueError(f"max_context={max_context} must be ≥ 1")
        if alloc not in ALLOCS:
            raise ValueError(f"alloc={alloc!r}: expected one of {', '.join(ALLOCS)}")
        self.layers, self.kv_heads, self.head_dim, self.max_context = layers, kv_heads, head_dim, int(max_context)
        self.alloc = alloc
        shape = (layers, kv_heads, self.max_context, head_dim)
        zeros = lazy_zeros if alloc == "lazy" else np.zeros
        self.k = zeros(shape, dtype=np.float32)
        self.v = zeros(shape, dtype=np.float32)
        self.pos = 0

    @staticmethod
    def bytes_per_token_for(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int = 4) -> int:
        """K and V bytes one token adds: 2 × layers × kv_heads × head_dim × dtype. Taught in day11_3."""
        return 2 * layers * kv_heads * head_dim * dtype_bytes

    @property
    def bytes_per_token(self) -> int:
        """K and V bytes one token adds to this cache. Taught in day11_1."""
        return self.bytes_per_token_for(self.layers, self.kv_heads, self.head_dim)

    @property
    def nbytes(self) -> int:
        """Bytes reserved for the whole context (virtual: pages are touched only when written).

        Taught in day11_3.
        """
        return self.k.nbytes + self.v.nbytes

    def check_room(self, n: int) -> None:
        """Raise ``ContextFullError`` unless ``n`` more tokens fit. Taught in day11_3."""
        if self.pos + n > self.max_context:
            raise ContextFullError(
                f"context full: {self.pos} tokens in the KV cache + {n} new > max_context={self.max_context} "
                f"(open the engine with a larger max_context, or reset/truncate the cache)")

    def truncate(self, pos: int) -> None:
        """Forget every entry at position ≥ ``pos`` (they will be overwritten). Taught in day11_1."""
        if not 0 <= pos <= self.pos:
            raise ValueError(f"truncate({pos}): the cache holds {self.pos} tokens; expected 0 ≤ pos ≤ {self.pos}")
        self.pos = int(pos)

    def reset(self) -> None:
        """Empty the cache (the arrays stay allocated). Taught in day11_1."""
        self.pos = 0
