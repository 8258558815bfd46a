"""Memory a model configuration needs against what the machine has, checked before allocating it.

The bounds of ``kestrel_lab.limits`` keep each field sane, but sane fields multiply: 1,024 layers ×
1,024 KV heads × a 1,024-wide head × a 16M-token context is a KV cache of exabytes. numpy's
``np.zeros`` would even "succeed" (Linux hands out address space lazily) and the process would be
killed later, mid-generation, by the kernel's OOM killer, with no message at all. So the engine adds
up what it will allocate — the KV cache for the whole context, the weights it copies at load (plain
Q4_0 is row-interleaved into anonymous memory), the RoPE tables and its activation buffers — and
compares the sum with the memory available *now*: ``MemAvailable`` from ``/proc/meminfo``, lowered
by a cgroup limit when the process runs in a container. Weights used in place from the file's mapping
are page cache, which the kernel can drop and re-read, so they are not counted.

Tests and lessons inject the machine's memory (``available=``, or the ``KESTREL_MEMORY_AVAILABLE``
environment variable, in bytes) to see the refusal without owning a small machine.

Taught in day27_1.
"""
from __future__ import annotations

import os
from pathlib import Path

ENV_AVAILABLE = "KESTREL_MEMORY_AVAILABLE"
F32 = 4


class MemoryBudgetError(ValueError):
    """The configuration needs more memory than the machine has; says how much of what. Taught in day27_1."""


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def _cgroup_room() -> int | None:
    """Bytes left under this process's cgroup v2 limit (None: no limit, or not Linux)."""
    rel = None
    for line in (_read("/proc/self/cgroup") or "").splitlines():
        if line.startswith("0::"):
            rel = line[3:].strip()
    if rel is None:
        return None
    base = Path("/sys/fs/cgroup") / rel.lstrip("/")
    limit, used = _read(str(base / "memory.max")), _read(str(base / "memory.current"))
    if not limit or limit.strip() == "max" or not used:
        return None
    return max(0, int(limit) - int(used))


def available_memory() -> tuple[int | None, str]:
    """(bytes available now, where the figure comes from). None when the machine does not say.

    Order: ``KESTREL_MEMORY_AVAILABLE`` (an override, bytes), ``MemAvailable``, lowered by the cgroup's
    ``memory.max − memory.current``. Taught in day27_1.
    """
    env = os.environ.get(ENV_AVAILABLE, "").strip()
    if env:
        try:
            return int(float(env)), f"${ENV_AVAILABLE}"
        except ValueError:
            raise MemoryBudgetError(f"${ENV_AVAILABLE}={env!r}: expected a number of bytes") from None
    avail, src = None, None
    for line in (_read("/proc/meminfo") or "").splitlines():
        if line.startswith("MemAvailable:"):
            avail, src = int(line.split()[1]) * 1024, "MemAvailable (/proc/meminfo)"
    room = _cgroup_room()
    if room is not None and (avail is None or room < avail):
        avail, src = room, "cgroup memory.max − memory.current"
    return avail, src or "unknown"


def engine_needs(config, max_context: int, copied_bytes: int = 0, chunk: int = 64) -> dict[str, int]:
    """Bytes an engine allocates for ``config`` at ``max_context`` tokens, by part.

    ``kv_cache``: K and V of every layer for the whole context (float32); ``weights_copied``: what
    the load copies out of the mapping (given by the caller, which knows its layouts); ``rope_tables``:
    cos and sin for every position (with their float64 intermediates); ``buffers``: one prefill chunk
    of activations, attention scores and the logits row. Taught in day27_1.
    """
    c = config
    L, kvh, hd, H = c.num_hidden_layers, c.num_key_value_heads, c.head_dim, c.num_attention_heads
    h, inter = c.hidden_size, max(c.intermediate_size, c.moe_intermediate_size)
    T = min(chunk, max_context)
    acts = T * (4 * h + 2 * H * hd + 2 * kvh * hd + 3 * inter) * F32 * 2   # float32 + their Q8_0 forms
    scores = T * H * max_context * F32
    logits = T * c.vocab_size * F32
    return {"kv_cache": 2 * L * kvh * hd * max_context * F32,
            "weights_copied": int(copied_bytes),
            "rope_tables": max_context * (hd // 2) * (8 + 8 + F32 + F32),
            "buffers": acts + scores + logits}


def _gib(n: int) -> str:
    return f"{n / 2**30:,.2f} GiB" if n >= 2**27 else f"{n / 2**20:,.1f} MiB"


def check_memory(needs: dict[str, int], where: str, available: int | None = None, *,
                 hint: str = "") -> int:
    """Raise ``MemoryBudgetError`` when the parts of ``needs`` add up to more than is available.

    ``available``: bytes (None: ``available_memory()``; if the machine does not say, nothing is
    refused). Returns the total needed. Taught in day27_1.
    """
    total = sum(needs.values())
    src = "given"
    if available is None:
        available, src = available_memory()
        if available is None:
            return total
    if total > available:
        parts = ", ".join(f"{k} {_gib(v)}" for k, v in needs.items() if v)
        raise MemoryBudgetError(f"{where}: needs {_gib(total)} ({parts}) but {_gib(available)} is available "
                                f"({src})" + (f"; {hint}" if hint else ""))
    return total


__all__ = ["MemoryBudgetError", "available_memory", "engine_needs", "check_memory", "ENV_AVAILABLE"]
