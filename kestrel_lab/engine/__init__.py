"""The Qwen3 engine on the kernels floor (``kestrel_lab.kernels``): KV cache, the model, and what runs on it.

- ``kv``        — the preallocated KV cache, its memory per token and the context limit.
- ``model``     — ``Qwen3Engine``: ``from_vqf``, ``prefill``, ``decode``, ``forward_all``, ``truncate``.
- ``moe``       — Qwen3-MoE's router, grouped expert FFN (experts read in place) and its byte counts.
- ``reference`` — a plain numpy forward of the same math (dequantize the same blocks), for checks.
- ``bench``     — ``kestrel-lab bench``: tok/s against the bandwidth ceiling and PyTorch.
- ``sample``, ``chat``, ``stream``, ``generate`` — sampling, the chat template, UTF-8 streaming, the loop.

Taught in day12_2 (the engine as a whole) and the days named in each module.
"""
from __future__ import annotations

from kestrel_lab.engine.kv import ContextFullError, KVCache
from kestrel_lab.engine.model import Qwen3Engine
from kestrel_lab.kernels.linear import RawTensor

__all__ = ["Qwen3Engine", "RawTensor", "KVCache", "ContextFullError"]
