"""The numba int4 Qwen3 engine: kernels, RoPE, attention, KV cache, the model, and what runs on it.

- ``kernels``   — matvec/matmul on F32, F16, Q8_0, Q4_0 and Q4_8X8L weights; RMSNorm, SwiGLU, softmax.
- ``rope``      — Qwen's rotate-half RoPE and the MRoPE helper of Qwen3-VL.
- ``attention`` — GQA attention over the cache (causal prefill, decode).
- ``kv``        — the preallocated KV cache, its memory per token and the context limit.
- ``model``     — ``Qwen3Engine``: ``from_vqf``, ``prefill``, ``decode``, ``forward_all``, ``truncate``.
- ``moe``       — Qwen3-MoE's router, grouped expert FFN (experts read in place) and its byte counts.
- ``reference`` — a plain numpy forward of the same math (dequantize the same blocks), for checks.
- ``bench``     — ``kestrel-lab bench``: tok/s against the bandwidth ceiling and PyTorch.
- ``sample``, ``chat``, ``stream``, ``generate`` — sampling, the chat template, UTF-8 streaming, the loop.

Taught in day12_2 (the engine as a whole) and the days named in each module.
"""
from __future__ import annotations

import os as _os

# numba's parallel kernels run on libgomp (the "omp" threading layer). Between two parallel regions
# libgomp's workers spin 300,000 iterations before sleeping; decode runs ~200 short regions per token,
# and on a machine shared with other work a spinning worker steals the core that the thread it waits
# for needs, so a 2-thread decode collapsed 10–20× on a loaded 2-core machine. A short spin keeps the
# hand-off fast on an idle machine and yields quickly on a busy one. Must be set before the first
# parallel region of the process; an explicit GOMP_SPINCOUNT in the environment wins. Taught in day07_2.
_os.environ.setdefault("GOMP_SPINCOUNT", "10000")

from kestrel_lab.engine.kv import ContextFullError, KVCache
from kestrel_lab.engine.model import Qwen3Engine, RawTensor

__all__ = ["Qwen3Engine", "RawTensor", "KVCache", "ContextFullError"]
