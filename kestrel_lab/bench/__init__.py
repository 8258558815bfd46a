"""The measuring floor: benchmarks that print figures and ratios side by side, never timed assertions.

- ``speed``     — ``kestrel-lab bench``: decode/prefill tok/s against the bandwidth ceiling, the kernels'
  GB/s, PyTorch, first compile and cold start (``coldstart`` is its child process).
- ``moe``       — Qwen3-MoE: bytes per token, paging, a file larger than memory in a cgroup, a dense twin.
- ``vision``    — ``bench --vision``: the vision tower against PyTorch.
- ``peer``      — ``bench --peer llama.cpp``: the engine beside llama.cpp's ``llama-bench``.

Submodules are imported by name; this package imports none of them (``coldstart`` must start fast).
"""
