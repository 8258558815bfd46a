"""The one table of bounds: every count, width and float a loader accepts, each with why.

A file that passes its format's checks can still describe an absurd model: four billion layers (the
planner would build a four-billion-entry name list before anything else could complain), an
epsilon of NaN (``rmsnorm`` divides by zero), a context of zero tokens, ``rope_theta = 0`` (every
angle becomes ``inf · 0 = NaN``). The loaders therefore check the configuration against this table
*before* they plan, allocate or compute anything from it: the VQF reader (header fields),
``ModelConfig.from_hf`` (config.json), the vocab.bin loader (its entry count), the safetensors
reader (its header length), the engine's constructor (everything again, then memory: see
``kestrel_lab.memory_check``) and, for images, ``check_image_size``.

``BOUNDS`` gives a closed range ``[lo, hi]`` per field; ``RULES`` the relations between fields
(heads divisible by KV heads, the MRoPE split adds up to half a head, …). ``check_config`` raises a
``LimitError`` naming the field and what was expected; each loader re-raises it as its own error
class with the file and the byte offset (or JSON key) of the field. book/formats/vqf.md shows both
tables, generated from this module (``spec_table``), beside the values of the shipped configs.

Taught in day27_1.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Callable

NONE_ID = 0xFFFFFFFF   # "no token id" in a VQF header (``vqf.format.NONE_U32``)


class LimitError(ValueError):
    """A value outside the table (``field``: the ModelConfig path, e.g. ``vision.depth``).

    Loaders catch it and raise their own error class with the file and the offset. Taught in day27_1.
    """

    def __init__(self, field: str, value, expected: str, why: str = "", where: str = ""):
        self.field, self.value, self.expected, self.why = field, value, expected, why
        super().__init__((f"{where}: " if where else "") + f"field {field}: {self.detail}")

    @property
    def detail(self) -> str:
        """The message without the field name (for loaders that put the name in their own prefix)."""
        return f"{_show(self.value)}: expected {self.expected}" + (f" ({self.why})" if self.why else "")


@dataclass(frozen=True)
class Bound:
    """One field's closed range and the reason for it. Taught in day27_1."""

    name: str            # ModelConfig path ('num_hidden_layers', 'vision.depth') or 'format.field'
    lo: float
    hi: float
    kind: str            # "int" | "float"
    why: str

    def expected(self) -> str:
        if self.kind == "float":
            return f"a finite number in [{self.lo:g}, {self.hi:g}]"
        return f"an integer in [{self.lo:,}, {self.hi:,}]"

    def check(self, value, field: str | None = None) -> None:
        """Raise ``LimitError`` unless ``value`` is of the right kind and inside ``[lo, hi]``. Taught in day27_1."""
        name = field or self.name
        if self.kind == "int":
            ok = isinstance(value, int) and not isinstance(value, bool) and self.lo <= value <= self.hi
        else:
            ok = (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                  and self.lo <= value <= self.hi)
        if not ok:
            raise LimitError(name, value, self.expected(), self.why)


def _i(name, lo, hi, why):
    return Bound(name, lo, hi, "int", why)


def _f(name, lo, hi, why):
    return Bound(name, lo, hi, "float", why)


MAX_VOCAB = 1 << 20
BOUNDS: tuple[Bound, ...] = (
    # ---- text model
    _i("vocab_size", 1, MAX_VOCAB, "embedding rows; the largest public vocabularies have ~262k entries"),
    _i("hidden_size", 1, 65_536, "model width; the largest public dense models use 16,384"),
    _i("intermediate_size", 1, 262_144, "dense FFN width; the largest public dense models use 53,248"),
    _i("num_hidden_layers", 1, 1_024, "the layer loop and every stacked tensor scale with it; the largest "
                                      "public models have 126"),
    _i("num_attention_heads", 1, 1_024, "query heads; the largest public models use 128"),
    _i("num_key_value_heads", 1, 1_024, "KV heads (GQA); never more than the query heads"),
    _i("head_dim", 2, 1_024, "width of one head; RoPE rotates pairs, so it is even; models use 64..256"),
    _f("rms_norm_eps", 1e-12, 1e-2, "0 divides by zero on a zero row and NaN poisons every norm; above 1e-2 it "
                                    "swamps the mean square; models use 1e-6..1e-5"),
    _f("rope_theta", 10.0, 1e12, "the RoPE base: 0 makes every angle inf·0 = NaN, ≤ 1 leaves no slow "
                                 "frequency; models use 1e4 (original) to 5e6 (Qwen3-VL)"),
    _i("max_position_embeddings", 1, 1 << 24, "the context limit: 0 leaves no room for one token; the "
                                              "engine's KV cache is min(max_context, this)"),
    _i("bos_token_id", 0, MAX_VOCAB - 1, "a token id (or none)"),
    _i("eos_token_id", 0, MAX_VOCAB - 1, "a token id (or none)"),
    _i("mrope_section", 1, 512, "each MRoPE section (t, h, w) is a positive count of frequency pairs"),
    _f("rope_scaling.factor", 1.0, 1024.0, "the context stretch of linear/yarn RoPE; transformers warns below 1; "
                                           "Qwen's model cards use 4 (32K → 128K)"),
    _i("rope_scaling.original_max_position_embeddings", 1, 1 << 24, "yarn's original (trained) window"),
    _f("rope_scaling.attention_factor", 0.01, 100.0, "yarn's cos/sin multiplier; 0.1·ln(4) + 1 = 1.139 for "
                                                    "factor 4; transformers requires > 0"),
    _f("rope_scaling.beta_fast", 1e-3, 1e6, "yarn: turns per original window; a logarithm's argument, so > 0"),
    _f("rope_scaling.beta_slow", 1e-3, 1e6, "yarn: turns per original window; a logarithm's argument, so > 0"),
    _f("rope_scaling.mscale", 0.0, 100.0, "yarn's attention-factor scales (DeepSeek); 1 or less in models"),
    _f("rope_scaling.mscale_all_dim", 0.0, 100.0, "yarn's attention-factor scales (DeepSeek)"),
    _f("rope_scaling.ramp_low", 0.0, 1023.0, "yarn: first pair of the blend, in [0, head_dim − 1]"),
    _f("rope_scaling.ramp_width", 1e-3, 1024.0, "yarn: pairs the blend spans (transformers adds 0.001 when it "
                                                "would be 0)"),
    _i("num_experts", 0, 1_024, "MoE experts per layer (0 = dense); public MoE models use up to 256"),
    _i("num_experts_per_tok", 0, 64, "experts routed per token"),
    _i("moe_intermediate_size", 0, 65_536, "FFN width of one expert"),
    _i("mlp_only_layers", 0, 1_023, "layer indexes of an MoE model whose FFN is dense"),
    _i("decoder_sparse_step", 1, 1_024, "every step-th layer of an MoE model is sparse (transformers' rule)"),
    # ---- vision tower
    _i("vision.depth", 1, 256, "vision blocks; Qwen3-VL-2B has 24"),
    _i("vision.hidden_size", 1, 16_384, "vision width"),
    _i("vision.intermediate_size", 1, 65_536, "vision MLP width"),
    _i("vision.num_heads", 1, 256, "vision attention heads"),
    _i("vision.in_channels", 1, 4, "image channels: RGB is 3"),
    _i("vision.patch_size", 1, 64, "patch side in pixels; Qwen3-VL uses 16"),
    _i("vision.temporal_patch_size", 1, 16, "frames per patch; Qwen3-VL uses 2"),
    _i("vision.spatial_merge_size", 1, 8, "patches merged per side into one token; Qwen3-VL uses 2"),
    _i("vision.out_hidden_size", 1, 65_536, "merger output width"),
    _i("vision.num_position_embeddings", 1, 1 << 20, "learned position rows, a square grid"),
    _i("vision.deepstack_visual_indexes", 0, 255, "vision block indexes"),
    # ---- file formats
    _i("vqf.n_tensors", 0, 1 << 16, "directory entries; a model has tens (41 for Qwen3-VL-2B)"),
    _i("vqf.created", 0, 253_402_300_799, "Unix seconds up to 9999-12-31T23:59:59Z, the last date Python "
                                          "can show; 0 = not recorded"),
    _i("vocab_bin.N", 0, MAX_VOCAB, "records of vocab.bin; as many as the largest vocabulary"),
    _i("safetensors.header_len", 2, 100 * 1024 * 1024, "the JSON header; the safetensors package's own "
                                                       "limit is 100 MiB"),
    # ---- images (what an image loader may decode)
    _i("image.width", 1, 65_535, "pixels per side; JPEG cannot store more"),
    _i("image.height", 1, 65_535, "pixels per side; JPEG cannot store more"),
    _i("image.pixels", 1, 67_108_864, "width × height, 8192²: the image loader's decompression-bomb guard, "
                                      "checked on the header before a pixel is decoded (Pillow's own "
                                      "threshold is 89,478,485); vision.preprocess.load_image(max_source_pixels=) "
                                      "raises it for one call"),
    _i("engine.max_context", 1, 1 << 24, "tokens the KV cache holds; at most max_position_embeddings"),
)
BOUND = {b.name: b for b in BOUNDS}
assert len(BOUND) == len(BOUNDS)


@dataclass(frozen=True)
class Rule:
    """A relation between fields, checked after each field is in range. Taught in day27_1."""

    field: str           # the field named in the error
    text: str            # what must hold, for people
    holds: Callable      # cfg -> bool
    why: str


def _mrope_ok(c) -> bool:
    return not c.mrope_section or sum(c.mrope_section) == c.head_dim // 2


def _vision(pred):
    return lambda c: c.vision is None or pred(c.vision, c)


RULES: tuple[Rule, ...] = (
    Rule("num_key_value_heads", "num_attention_heads % num_key_value_heads == 0",
         lambda c: c.num_attention_heads % c.num_key_value_heads == 0,
         "each KV head serves the same number of query heads (GQA)"),
    Rule("head_dim", "head_dim is even", lambda c: c.head_dim % 2 == 0, "RoPE rotates pairs of values"),
    Rule("mrope_section", "sum(mrope_section) == head_dim / 2", _mrope_ok,
         "the sections split the head's frequency pairs between time, height and width"),
    Rule("mrope_section", "at most 4 sections", lambda c: len(c.mrope_section or ()) <= 4,
         "the VQF header stores 4"),
    Rule("mrope_section", "exactly 3 sections (t, h, w) for qwen3_vl",
         lambda c: c.arch != "qwen3_vl" or c.mrope_section is None or len(c.mrope_section) == 3,
         "Qwen3-VL gives every frequency pair one of three position components"),
    Rule("num_experts", "num_experts > 0 exactly when arch is qwen3_moe",
         lambda c: (c.num_experts > 0) == (c.arch == "qwen3_moe"), "a dense model has no experts"),
    Rule("num_experts_per_tok", "1 <= num_experts_per_tok <= num_experts for MoE",
         lambda c: c.arch != "qwen3_moe" or 1 <= c.num_experts_per_tok <= c.num_experts,
         "the router picks that many of the experts"),
    Rule("moe_intermediate_size", "moe_intermediate_size >= 1 for MoE",
         lambda c: c.arch != "qwen3_moe" or c.moe_intermediate_size >= 1, "an expert has an FFN"),
    Rule("mlp_only_layers", "each < num_hidden_layers, and only for MoE",
         lambda c: all(i < c.num_hidden_layers for i in c.mlp_only_layers)
         and (c.arch == "qwen3_moe" or not c.mlp_only_layers), "each names a layer whose FFN is dense"),
    Rule("vision", "a vision tower exactly when arch is qwen3_vl",
         lambda c: (c.vision is not None) == (c.arch == "qwen3_vl"), "only Qwen3-VL has one"),
    Rule("vision.num_heads", "vision.hidden_size % vision.num_heads == 0 and the head width is even",
         _vision(lambda v, c: v.hidden_size % v.num_heads == 0 and (v.hidden_size // v.num_heads) % 2 == 0),
         "heads split the width; the vision RoPE rotates pairs"),
    Rule("vision.out_hidden_size", "vision.out_hidden_size == hidden_size",
         _vision(lambda v, c: v.out_hidden_size == c.hidden_size), "merged image tokens enter the text model"),
    Rule("vision.num_position_embeddings", "vision.num_position_embeddings is a perfect square",
         _vision(lambda v, c: math.isqrt(v.num_position_embeddings) ** 2 == v.num_position_embeddings),
         "transformers views the table as an int(sqrt(n)) × int(sqrt(n)) grid"),
    Rule("vision.deepstack_visual_indexes", "at most 4 indexes, each < vision.depth",
         _vision(lambda v, c: len(v.deepstack_visual_indexes) <= 4
                 and all(i < v.depth for i in v.deepstack_visual_indexes)),
         "each names a vision block whose output feeds a DeepStack merger; the VQF header stores 4"),
)


def _show(v) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return repr(v)
    return f"{v:,}" if isinstance(v, int) else f"{v:g}"


def _values(cfg):
    """(field path, value) for every bounded field of a ModelConfig (lists give one item each)."""
    skip = {"arch", "tie_word_embeddings", "mrope_interleaved", "norm_topk_prob", "vision", "ignored"}
    for f in fields(cfg):
        if f.name in skip:
            continue
        v = getattr(cfg, f.name)
        if f.name == "rope_scaling":
            if v is not None:
                yield "rope_scaling.factor", v.factor
                yield "rope_scaling.attention_factor", v.attention_factor
                if v.rope_type == "yarn":
                    yield "rope_scaling.ramp_low", v.ramp_low
                    yield "rope_scaling.ramp_width", v.ramp_width
            continue
        if f.name in ("bos_token_id", "eos_token_id") and v is None:
            continue
        if f.name in ("mrope_section", "mlp_only_layers"):
            for x in (v or ()):
                yield f.name, x
            continue
        yield f.name, v
    if cfg.vision is not None:
        for f in fields(cfg.vision):
            if f.name == "hidden_act":
                continue
            v = getattr(cfg.vision, f.name)
            if f.name == "deepstack_visual_indexes":
                if not isinstance(v, (list, tuple)):
                    raise LimitError("vision.deepstack_visual_indexes", v, "a list of block indexes")
                for x in v:
                    yield "vision." + f.name, x
                continue
            yield "vision." + f.name, v


def check_config(cfg) -> None:
    """Every bounded field of a ``ModelConfig`` in range, then every rule; raise the first ``LimitError``.

    Dense models may leave the MoE fields at 0; a model without experts must. Taught in day27_1.
    """
    if cfg.mrope_section is not None and not isinstance(cfg.mrope_section, (list, tuple)):
        raise LimitError("mrope_section", cfg.mrope_section, "a list of section sizes")
    for name, value in _values(cfg):
        BOUND[name].check(value, name)
    for r in RULES:
        if not r.holds(cfg):
            raise LimitError(r.field, _rule_value(cfg, r.field), r.text, r.why)


def _rule_value(cfg, field: str):
    obj, name = (cfg.vision, field[7:]) if field.startswith("vision.") else (cfg, field)
    return getattr(obj, name, None) if obj is not None else None


def check_value(name: str, value, field: str | None = None) -> None:
    """One value against its bound (``name`` a key of ``BOUND``). Taught in day27_1."""
    BOUND[name].check(value, field)


def check_image_size(width: int, height: int) -> None:
    """An image's size before its pixels are decoded: each side and the pixel count in the table."""
    BOUND["image.width"].check(width)
    BOUND["image.height"].check(height)
    BOUND["image.pixels"].check(width * height)


def check_context(max_context: int, max_position_embeddings: int) -> int:
    """The KV cache length an engine will use: ``min(max_context, max_position_embeddings)``, checked.

    Taught in day27_1.
    """
    BOUND["engine.max_context"].check(max_context, "max_context")
    return int(min(max_context, max_position_embeddings))


# ------------------------------------------------------------------------------------- the spec
def spec_table(configs: dict) -> str:
    """Markdown: the bounds with why, the given configs' values beside them, then the rules.

    ``configs``: column title → ModelConfig (the spec page passes the configs under ``data/configs``).
    """
    titles = list(configs)
    seen = {t: _value_map(c) for t, c in configs.items()}
    rows = ["| 字段 | 下限 | 上限 | " + " | ".join(titles) + " | 为什么 |",
            "|---|---:|---:|" + "---:|" * len(titles) + "---|"]
    for b in BOUNDS:
        lo = f"{b.lo:g}" if b.kind == "float" else f"{b.lo:,}"
        hi = f"{b.hi:g}" if b.kind == "float" else f"{b.hi:,}"
        vals = " | ".join(seen[t].get(b.name, "—") for t in titles)
        rows.append(f"| `{b.name}` | {lo} | {hi} | {vals} | {b.why} |")
    rows += ["", "| 字段 | 必须成立 | 为什么 |", "|---|---|---|"]
    rows += [f"| `{r.field}` | `{r.text}` | {r.why} |" for r in RULES]
    return "\n".join(rows)


def _value_map(cfg) -> dict[str, str]:
    out: dict[str, list[str]] = {}
    for name, v in _values(cfg):
        out.setdefault(name, []).append(_show(v))
    return {k: ", ".join(v) for k, v in out.items()}


__all__ = ["BOUNDS", "BOUND", "RULES", "Bound", "Rule", "LimitError", "check_config", "check_value",
           "check_image_size", "check_context", "spec_table", "MAX_VOCAB"]
