"""Deterministic VQF files with random weights: real layouts and sizes, no checkpoint needed.

The lessons and tests need real files — to hash, to inspect, to corrupt — of a chosen size. These are
written with the same writer and quantizers as a conversion, from seeded random weights generated a
slice of rows at a time (so a file of any size is written in bounded memory). ``write_random``'s
weights are for files to inspect (every tensor independent, one scale); ``write_model``'s are scaled
like a trained model's and tie the lm head to the embedding, so the engine runs on them (the bench's
and the speed lessons' models). The cached files come from ``kestrel_lab.models.vqf``.

Taught in day16_1.
"""
from __future__ import annotations

import zlib
from pathlib import Path
from typing import Callable

import numpy as np

from kestrel_lab import quant as Q
from kestrel_lab.config import ModelConfig
from kestrel_lab.vqf.layout import TensorSpec
from kestrel_lab.vqf.planner import plan_file
from kestrel_lab.vqf.writer import VQFWriter

ROWS_PER_PART = 4096  # rows generated and quantized at once (a multiple of 8 for Q4_8X8L)


def small_vl_config(**text) -> ModelConfig:
    """A small Qwen3-VL (2 text layers, 3 vision blocks, 2 DeepStack mergers): every entry kind. Taught in day16_1."""
    cfg = {
        "model_type": "qwen3_vl", "tie_word_embeddings": True,
        "text_config": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 320,
                        "rms_norm_eps": 1e-6, "rope_theta": 5e6, "max_position_embeddings": 4096,
                        "bos_token_id": 151643, "eos_token_id": 151645,
                        "rope_scaling": {"rope_type": "default", "mrope_section": [2, 3, 3],
                                         "mrope_interleaved": True}} | text,
        "vision_config": {"depth": 3, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "in_channels": 3,
                          "patch_size": 16, "temporal_patch_size": 2, "spatial_merge_size": 2,
                          "out_hidden_size": 64, "num_position_embeddings": 16,
                          "deepstack_visual_indexes": [0, 1], "hidden_act": "gelu_pytorch_tanh"},
    }
    return ModelConfig.from_hf(cfg)


def random_rows(spec: TensorSpec, seed: int, lo: int, hi: int) -> np.ndarray:
    """Rows [lo, hi) of the random float32 weights of ``spec`` (same numbers however they are sliced)."""
    rng = np.random.default_rng([seed, sum(spec.name.encode()), lo])
    if "norm" in spec.name and not spec.name.endswith("_b"):
        return (1.0 + 0.1 * rng.standard_normal((hi - lo, spec.cols))).astype(np.float32)
    return (0.05 * rng.standard_normal((hi - lo, spec.cols))).astype(np.float32)


def parts(spec: TensorSpec, seed: int, rows_per_part: int = ROWS_PER_PART):
    """The spec's quantized bytes, ``rows_per_part`` rows at a time."""
    for lo in range(0, spec.rows, rows_per_part):
        hi = min(spec.rows, lo + rows_per_part)
        yield Q.quantize(random_rows(spec, seed, lo, hi), spec.qtype)


def write_random(path: str | Path, config: ModelConfig, quant: str = "q4_0", seed: int = 0,
                 specs: list[TensorSpec] | None = None, progress: Callable | bool | None = None) -> Path:
    """Write ``config``'s planned file with seeded random weights."""
    fp = plan_file(config, quant, specs)
    source = {"model": f"random seed={seed}", "dtype": "f32"}
    with VQFWriter(path, fp, source=source, progress=progress, created=0) as w:
        for s in fp.specs:
            w.write_tensor_parts(s.name, parts(s, seed))
    return Path(path)


def is_norm_weight(name: str) -> bool:
    """Whether a VQF tensor is a norm's scale (RMSNorm or LayerNorm weight), not its bias."""
    return not name.endswith("_b") and (name.endswith("_norm") or name in ("v_norm1", "v_norm2"))


def model_rows(name: str, seed: int, rows: int, cols: int, rows_per_part: int = ROWS_PER_PART):
    """float32 rows of one tensor of a *runnable* random model, ``rows_per_part`` at a time (one
    generator stream per tensor, seeded by ``(seed, crc32(name))``): norm weights 1 + N(0, 0.1²) (the
    RMSNorms and the vision tower's LayerNorms ``v_norm1``/``v_norm2``/``v_merger_norm``/``v_ds_norm``;
    their biases ``…_b`` stay near 0 like every bias), the embedding N(0, 0.25²), matrices N(0, 1/cols)
    — activations keep a trained model's scale. Taught in day16_1."""
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    norm = is_norm_weight(name)
    scale = 0.25 if name == "token_embed" else 1.0 / np.sqrt(cols)
    for r0 in range(0, rows, rows_per_part):
        n = min(rows_per_part, rows - r0)
        x = rng.standard_normal((n, cols), dtype=np.float32)
        yield (1.0 + 0.1 * x) if norm else x * np.float32(scale)


def write_model(path: str | Path, config: ModelConfig, quant: str = "q4_0", seed: int = 0,
                specs: list[TensorSpec] | None = None, progress: Callable | bool | None = None) -> Path:
    """Write ``config``'s planned file with the runnable random weights of ``model_rows``; a tied lm
    head gets the embedding's values, as a converter would write it. What ``kestrel_lab.models.vqf``
    writes for ``model="random"``. Taught in day16_1."""
    fp = plan_file(config, quant, specs)
    source = {"model": f"random seed={seed}", "dtype": "f32"}
    with VQFWriter(path, fp, source=source, progress=progress or None, created=0) as w:
        for s in fp.specs:
            src = "token_embed" if (s.name == "q4_lm" and config.tie_word_embeddings) else s.name
            w.write_tensor_parts(s.name, (Q.quantize(x, s.qtype) for x in model_rows(src, seed, s.rows, s.cols)))
    return Path(path)
