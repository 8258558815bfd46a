"""Qwen3-VL's eyes: image preprocessing, the image tokens of a prompt, their 3-D positions, the tower.

- ``preprocess`` — a picture → ``pixel_values`` (patches of 1,536 values) and ``grid_thw``, exactly as
  transformers' Qwen2-VL image processor with Qwen3-VL's settings (Pillow bicubic, smart resize).
- ``prompt``     — Qwen3-VL-Instruct's chat template, the image pads and their expansion,
  ``mm_token_type_ids``, the content key that keeps KV reuse honest.
- ``positions``  — MRoPE positions (t, h, w) for text and images, the rope delta, interleaved cos/sin.
- ``tower``      — the vision tower on a VQF file's weights: patch embedding, blocks, mergers, DeepStack;
  ``kernels`` — its numba kernels beyond the text engine's (LayerNorm, the two GELUs, bias, softmax).
- ``synthetic``  — the drawn pictures the tiny Qwen3-VL was trained on.

Submodules are imported by name (``from kestrel_lab.vision import positions``); this package imports
none of them, so the engine can use ``positions`` without pulling in Pillow.
Taught in day20_3, day21_1 and day21_2.
"""
