"""Deterministic random Hugging Face checkpoints with the real Qwen3 / Qwen3-MoE / Qwen3-VL / Qwen2 architectures.

Lessons and tests need checkpoints that look exactly like the real ones — same tensor names, same
layouts ([out, in] linear weights, a Conv3d patch embedding, stacked q/k/v in the vision tower), same
``config.json`` — but small enough to write in a second. ``make_tiny_model`` writes ``config.json`` and
``model.safetensors`` (or shards plus ``model.safetensors.index.json``) with random weights drawn from a
generator seeded by ``(seed, crc32(tensor name))``: the same seed gives the same bytes, and changing one
shape does not change the other tensors.

Default shapes (small but real; everything the engine's kernels need stays a multiple of 32):

- ``qwen3``: vocab 151,936 (the real Qwen vocabulary, so the real tokenizer works with it), hidden 64,
  2 layers, 4 query heads and 2 KV heads of dim 32 (so q_dim 128 ≠ hidden, as in Qwen3-0.6B, which
  catches transposition mistakes), SwiGLU 192, tied embeddings (as 0.6B and the VL-2B), RoPE θ 1e6.
  About 9.8 M parameters, 19.6 MB in bf16 — the embedding is almost all of it.
- ``qwen3_moe``: the same attention, untied LM head, 8 experts of width 32, top-2 with
  ``norm_topk_prob`` (as Qwen3-30B-A3B), every layer sparse unless ``mlp_only_layers`` /
  ``decoder_sparse_step`` say otherwise; experts saved per expert (``mlp.experts.{e}.gate_proj.weight``
  …) and the router as ``mlp.gate.weight``, as ``save_pretrained`` writes them.
- ``qwen2``: Qwen2.5's layer (llmc's model): the same shapes as ``qwen3`` with head_dim = hidden/heads
  (16), q/k/v projection biases and no q/k norm, tied embeddings.
- ``qwen3_vl``: the same text model (θ 5e6, interleaved MRoPE sections [6, 5, 5] = head_dim/2) and a
  vision tower with the real patch geometry (3 channels × 2 frames × 16 × 16 = 1,536 inputs per patch),
  hidden 64, 2 blocks, 2 heads, MLP 128, 2×2 merge, an 8×8 position grid (64 embeddings), DeepStack
  mergers after blocks 0 and 1.

Weights: linear and conv weights N(0, 1/fan_in), the embedding N(0, 0.25²) (tied logits with a useful
spread), norm weights 1 + N(0, 0.1²) and biases N(0, 0.02²) — not the all-ones/zeros of a fresh
PyTorch model, so that a swapped or dropped norm or bias shows up in a comparison.
The cached checkpoints the lessons and tests run on come from ``kestrel_lab.models.hf_checkpoint``.
Taught in day15_2.
"""
from __future__ import annotations

import copy
import json
import math
import os
import zlib
from pathlib import Path

import numpy as np

from kestrel_lab.atomic import write_json
from kestrel_lab.quant import f32_to_bf16
from kestrel_lab.safetensors import INDEX_NAME, SINGLE_NAME, save_safetensors

ARCHS = ("qwen3", "qwen3_vl", "qwen3_moe", "qwen2")
DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}

_TEXT = {
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 32,
    "hidden_act": "silu",
    "hidden_size": 64,
    "initializer_range": 0.02,
    "intermediate_size": 192,
    "max_position_embeddings": 4096,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "use_cache": True,
    "vocab_size": 151936,
}


def default_config(arch: str = "qwen3", dtype: str = "bfloat16") -> dict:
    """The default tiny ``config.json`` (transformers 5 style) of an architecture. Taught in day15_2."""
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; choose one of {ARCHS}")
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {sorted(DTYPES)}")
    if arch == "qwen3_moe":
        return {
            "architectures": ["Qwen3MoeForCausalLM"],
            "model_type": "qwen3_moe",
            "dtype": dtype,
            **_TEXT,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "moe_intermediate_size": 32,
            "norm_topk_prob": True,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "output_router_logits": False,
            "router_aux_loss_coef": 0.001,
            "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
            "sliding_window": None,
            "use_sliding_window": False,
            "tie_word_embeddings": False,
        }
    if arch in ("qwen3", "qwen2"):
        out = {
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            "dtype": dtype,
            **_TEXT,
            "layer_types": ["full_attention"] * _TEXT["num_hidden_layers"],
            "max_window_layers": _TEXT["num_hidden_layers"],
            "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
            "sliding_window": None,
            "use_sliding_window": False,
            "tie_word_embeddings": True,
        }
        if arch == "qwen2":   # Qwen2.5 (llmc's model): q/k/v bias, no q/k norm, head_dim = hidden / heads
            for k in ("attention_bias", "head_dim"):
                del out[k]
            out.update(architectures=["Qwen2ForCausalLM"], model_type="qwen2")
        return out
    return {
        "architectures": ["Qwen3VLForConditionalGeneration"],
        "model_type": "qwen3_vl",
        "dtype": dtype,
        "image_token_id": 151655,
        "video_token_id": 151656,
        "vision_start_token_id": 151652,
        "vision_end_token_id": 151653,
        "tie_word_embeddings": True,
        "text_config": {
            "model_type": "qwen3_vl_text",
            "dtype": dtype,
            **_TEXT,
            "rope_parameters": {"rope_theta": 5000000.0, "rope_type": "default",
                                "mrope_section": [6, 5, 5], "mrope_interleaved": True},
            "tie_word_embeddings": True,
        },
        "vision_config": {
            "model_type": "qwen3_vl_vision",
            "depth": 2,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_heads": 2,
            "in_channels": 3,
            "patch_size": 16,
            "temporal_patch_size": 2,
            "spatial_merge_size": 2,
            "out_hidden_size": 64,
            "num_position_embeddings": 64,
            "deepstack_visual_indexes": [0, 1],
            "hidden_act": "gelu_pytorch_tanh",
            "initializer_range": 0.02,
        },
    }


def _merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def merge_config(base: dict, overrides: dict | None = None) -> dict:
    """``base`` deep-merged with ``overrides`` (nested dicts merge key by key), kept consistent
    (layer_types follows num_hidden_layers). Taught in day15_2."""
    cfg = _merge(base, overrides or {})
    text = cfg.get("text_config", cfg)
    if "layer_types" in text and len(text["layer_types"]) != text["num_hidden_layers"]:
        text["layer_types"] = ["full_attention"] * text["num_hidden_layers"]
    if "max_window_layers" in text and not (overrides or {}).get("max_window_layers"):
        text["max_window_layers"] = text["num_hidden_layers"]
    return cfg


def to_hf4_style(cfg: dict) -> dict:
    """Rewrite a transformers-5 config into the older style: ``rope_theta`` + ``rope_scaling`` and
    ``torch_dtype`` (what Qwen's own releases ship). Both styles must convert. Taught in day15_2."""
    out = copy.deepcopy(cfg)
    for sect in (out, out.get("text_config")):
        if not isinstance(sect, dict):
            continue
        if "dtype" in sect:
            sect["torch_dtype"] = sect.pop("dtype")
        rope = sect.pop("rope_parameters", None)
        if rope is not None:
            rope = dict(rope)
            sect["rope_theta"] = rope.pop("rope_theta")
            scaled = "mrope_section" in rope or rope.get("rope_type", "default") != "default"
            sect["rope_scaling"] = rope if scaled else None
    return out


def build_config(arch: str = "qwen3", overrides: dict | None = None, dtype: str = "bfloat16") -> dict:
    """Default config deep-merged with ``overrides`` (nested dicts merge key by key), kept consistent
    (layer_types follows num_hidden_layers). Taught in day15_2."""
    return merge_config(default_config(arch, dtype), overrides)


# ----------------------------------------------------------------------------- the tensors
def hf_tensor_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor transformers saves for this config, name → shape, sorted by name (as
    ``save_pretrained`` writes them). Taught in day15_2."""
    arch = cfg["model_type"]
    text = cfg.get("text_config", cfg) if arch == "qwen3_vl" else cfg
    h, L = text["hidden_size"], text["num_hidden_layers"]
    nh, nkv = text["num_attention_heads"], text.get("num_key_value_heads", text["num_attention_heads"])
    hd = text.get("head_dim") or h // nh
    ff, V = text["intermediate_size"], text["vocab_size"]
    tie = cfg.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
    lm = "model.language_model" if arch == "qwen3_vl" else "model"
    out: dict[str, tuple[int, ...]] = {f"{lm}.embed_tokens.weight": (V, h), f"{lm}.norm.weight": (h,)}
    if not tie:
        out["lm_head.weight"] = (V, h)
    for i in range(L):
        p = f"{lm}.layers.{i}"
        out.update({
            f"{p}.input_layernorm.weight": (h,),
            f"{p}.post_attention_layernorm.weight": (h,),
            f"{p}.self_attn.q_proj.weight": (nh * hd, h),
            f"{p}.self_attn.k_proj.weight": (nkv * hd, h),
            f"{p}.self_attn.v_proj.weight": (nkv * hd, h),
            f"{p}.self_attn.o_proj.weight": (h, nh * hd),
        })
        if arch == "qwen2":    # Qwen2Attention: q/k/v with bias, o without; no q/k norm
            out.update({f"{p}.self_attn.{x}_proj.bias": (n,) for x, n in
                        (("q", nh * hd), ("k", nkv * hd), ("v", nkv * hd))})
        else:
            out.update({f"{p}.self_attn.q_norm.weight": (hd,), f"{p}.self_attn.k_norm.weight": (hd,)})
        if _is_moe_layer(text, i):
            E, m = _n_experts(text), text["moe_intermediate_size"]
            out[f"{p}.mlp.gate.weight"] = (E, h)
            for e in range(E):
                out.update({f"{p}.mlp.experts.{e}.gate_proj.weight": (m, h),
                            f"{p}.mlp.experts.{e}.up_proj.weight": (m, h),
                            f"{p}.mlp.experts.{e}.down_proj.weight": (h, m)})
        else:
            out.update({f"{p}.mlp.gate_proj.weight": (ff, h), f"{p}.mlp.up_proj.weight": (ff, h),
                        f"{p}.mlp.down_proj.weight": (h, ff)})
        if text.get("attention_bias"):
            out.update({f"{p}.self_attn.{x}_proj.bias": (n,) for x, n in
                        (("q", nh * hd), ("k", nkv * hd), ("v", nkv * hd), ("o", h))})
    if arch == "qwen3_vl":
        v = cfg["vision_config"]
        vh, vi = v["hidden_size"], v["intermediate_size"]
        merged = vh * v["spatial_merge_size"] ** 2
        vo = v["out_hidden_size"]
        out.update({
            "model.visual.patch_embed.proj.weight": (vh, v["in_channels"], v["temporal_patch_size"],
                                                     v["patch_size"], v["patch_size"]),
            "model.visual.patch_embed.proj.bias": (vh,),
            "model.visual.pos_embed.weight": (v["num_position_embeddings"], vh),
        })
        for i in range(v["depth"]):
            p = f"model.visual.blocks.{i}"
            out.update({
                f"{p}.norm1.weight": (vh,), f"{p}.norm1.bias": (vh,),
                f"{p}.norm2.weight": (vh,), f"{p}.norm2.bias": (vh,),
                f"{p}.attn.qkv.weight": (3 * vh, vh), f"{p}.attn.qkv.bias": (3 * vh,),
                f"{p}.attn.proj.weight": (vh, vh), f"{p}.attn.proj.bias": (vh,),
                f"{p}.mlp.linear_fc1.weight": (vi, vh), f"{p}.mlp.linear_fc1.bias": (vi,),
                f"{p}.mlp.linear_fc2.weight": (vh, vi), f"{p}.mlp.linear_fc2.bias": (vh,),
            })
        mergers = [("model.visual.merger", vh)]
        mergers += [(f"model.visual.deepstack_merger_list.{j}", merged)
                    for j in range(len(v.get("deepstack_visual_indexes", [])))]
        for p, norm_dim in mergers:
            out.update({
                f"{p}.norm.weight": (norm_dim,), f"{p}.norm.bias": (norm_dim,),
                f"{p}.linear_fc1.weight": (merged, merged), f"{p}.linear_fc1.bias": (merged,),
                f"{p}.linear_fc2.weight": (vo, merged), f"{p}.linear_fc2.bias": (vo,),
            })
    return dict(sorted(out.items()))


def _n_experts(text: dict) -> int:
    return text.get("num_experts") or text.get("num_local_experts") or 0


def _is_moe_layer(text: dict, i: int) -> bool:
    """transformers' rule (``Qwen3MoeDecoderLayer``): experts unless in mlp_only_layers or off-step."""
    return (text.get("model_type") == "qwen3_moe" and _n_experts(text) > 0
            and i not in (text.get("mlp_only_layers") or []) and (i + 1) % (text.get("decoder_sparse_step") or 1) == 0)


def _init(name: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Deterministic float32 values for one tensor (see the module docstring for the scales)."""
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    if name.endswith(".bias"):
        scale, mean = 0.02, 0.0
    elif "norm" in name.rsplit(".", 2)[-2] or name.endswith("norm.weight"):
        scale, mean = 0.1, 1.0
    elif "embed_tokens" in name or "pos_embed" in name:
        scale, mean = 0.25, 0.0
    else:
        fan_in = math.prod(shape[1:])
        scale, mean = 1.0 / math.sqrt(fan_in), 0.0
    return (mean + scale * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)


def make_weights(cfg: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """All tensors of the config as float32 (before the checkpoint's dtype is applied)."""
    return {name: _init(name, shape, seed) for name, shape in hf_tensor_shapes(cfg).items()}


def _storage(x: np.ndarray, st_dtype: str):
    if st_dtype == "BF16":
        return ("BF16", f32_to_bf16(x))
    return (st_dtype, x.astype("<f2" if st_dtype == "F16" else "<f4"))


def make_tiny_model(out_dir: str | os.PathLike, arch: str = "qwen3", seed: int = 0,
                    overrides: dict | None = None, dtype: str = "bfloat16", style: str = "hf5",
                    max_shard_bytes: int | None = None, config: dict | None = None) -> Path:
    """Write a deterministic random checkpoint: ``config.json`` + safetensors (sharded with an index
    when ``max_shard_bytes`` is given). ``style`` "hf5" writes ``rope_parameters``/``dtype``, "hf4"
    ``rope_theta``/``rope_scaling``/``torch_dtype``. ``config``: a whole transformers-5 style config to
    use instead of ``build_config(arch, overrides, dtype)``. Returns the folder. Taught in day15_2."""
    if style not in ("hf4", "hf5"):
        raise ValueError(f"unknown config style {style!r}; choose 'hf4' or 'hf5'")
    cfg = build_config(arch, overrides, dtype) if config is None else merge_config(config, overrides)
    st_dtype = DTYPES[cfg.get("dtype", dtype)]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for stale in list(out.glob("*.safetensors")) + [out / INDEX_NAME]:
        if stale.exists():
            stale.unlink()
    meta = {"format": "pt", "kestrel_lab.tiny_model": json.dumps({"arch": arch, "seed": seed})}
    shapes = hf_tensor_shapes(cfg)
    itemsize = 4 if st_dtype == "F32" else 2
    if not max_shard_bytes:
        save_safetensors(out / SINGLE_NAME, {n: _storage(_init(n, s, seed), st_dtype) for n, s in shapes.items()}, meta)
    else:
        groups: list[list[str]] = [[]]
        size = 0
        for n, s in shapes.items():
            nb = math.prod(s) * itemsize
            if groups[-1] and size + nb > max_shard_bytes:
                groups.append([])
                size = 0
            groups[-1].append(n)
            size += nb
        weight_map, total = {}, 0
        for k, names in enumerate(groups, 1):
            fname = f"model-{k:05d}-of-{len(groups):05d}.safetensors"
            save_safetensors(out / fname, {n: _storage(_init(n, shapes[n], seed), st_dtype) for n in names}, meta)
            weight_map.update({n: fname for n in names})
            total += sum(math.prod(shapes[n]) * itemsize for n in names)
        write_json(out / INDEX_NAME, {"metadata": {"total_size": total}, "weight_map": weight_map})
    write_json(out / "config.json", to_hf4_style(cfg) if style == "hf4" else cfg)
    return out


def load_overrides(text: str | None) -> dict:
    """``--config``: a JSON object given inline or as a path to a JSON file."""
    if not text:
        return {}
    src = text
    if not text.lstrip().startswith(("{", "[")):
        path = Path(text)
        if not path.is_file():
            raise ValueError(f"--config {text!r}: neither a JSON object nor a file")
        src = path.read_text(encoding="utf-8")
    try:
        doc = json.loads(src)
    except json.JSONDecodeError as e:
        raise ValueError(f"--config: not valid JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
    if not isinstance(doc, dict):
        raise ValueError("--config: must be a JSON object of config.json fields")
    return doc
