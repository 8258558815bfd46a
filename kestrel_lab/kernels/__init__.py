"""The kernels floor: everything that multiplies, normalizes or rotates numbers, and the table that picks it.

The text engine (dense, MoE, the text tower of Qwen3-VL) and the vision tower both stand on this floor;
nothing here imports from above it (``tests/test_architecture.py`` checks the floors).

- ``ops``       — the text engine's numba kernels: activation quantization, matvec/matmul on F32, F16,
  Q8_0, Q4_0 and the row-grouped Q4_0 layouts, RMSNorm, SwiGLU, softmax, embedding rows.
- ``v16``       — the 16-row ``Q4_0_V16`` layout's kernels (portable, AVX-512 VNNI, AVX2).
- ``vision``    — the vision tower's kernels beyond those (LayerNorm, the two GELUs, bias, attention).
- ``variants``  — the one table of Q4_0 layout variants (R32, V16-VNNI, V16-AVX2, V16 portable, plain, sdot).
- ``registry``  — which kernel runs a product of a layout and a call on this host.
- ``host``      — the CPU features the registry selects by.
- ``linear``    — ``Linear`` (a weight matrix in its layout), ``Activation``, ``RawTensor``.
- ``step``      — a whole decode step in one numba call on a row-grouped layout.
- ``rope``      — RoPE and Qwen3-VL's MRoPE tables, and ``apply_rope``.
- ``attention`` — GQA attention over a KV cache (causal prefill, decode).
- ``asm``       — what LLVM made of a kernel (tooling for lessons and tests; the engine never imports it).

Submodules are imported by name (``from kestrel_lab.kernels import ops``).
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
