"""A model's architecture, read from a Hugging Face ``config.json``.

Qwen3 (dense), Qwen3-MoE and Qwen3-VL configs differ in shape (VL nests the text model under
``text_config`` and adds ``vision_config``) and in era (transformers ≤ 4 writes ``rope_theta`` and
``rope_scaling``; transformers 5 writes ``rope_parameters``). ``ModelConfig`` flattens all of them into
one record, which the planner, the converter, the VQF header and the engine share.
Taught in day01_2 (parameter counts) and day15_2 (the name map).
"""
from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kestrel_lab.limits import BOUND, LimitError, check_config

# The architectures this package reads, with the id each has in the VQF header's ``arch`` field.
ARCHS = {"qwen3": 1, "qwen3_vl": 2, "qwen3_moe": 3, "qwen2": 4}


@dataclass(frozen=True)
class AttentionTraits:
    """What one architecture's attention block has beyond the shared Qwen recipe. Taught in day29_3.

    ``qkv_bias``: the q/k/v projections carry a bias (Qwen2/Qwen2.5, ``bias=True`` in
    ``Qwen2Attention``); ``qk_norm``: q and k get a per-head RMSNorm before RoPE (Qwen3's addition).
    """
    qkv_bias: bool
    qk_norm: bool


# The one table of attention differences: the VQF layout, the converter and the engine all read it.
ATTENTION_TRAITS = {
    "qwen3": AttentionTraits(qkv_bias=False, qk_norm=True),
    "qwen3_vl": AttentionTraits(qkv_bias=False, qk_norm=True),
    "qwen3_moe": AttentionTraits(qkv_bias=False, qk_norm=True),
    "qwen2": AttentionTraits(qkv_bias=True, qk_norm=False),
}
assert set(ATTENTION_TRAITS) == set(ARCHS)


@dataclass
class VisionConfig:
    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    in_channels: int
    patch_size: int
    temporal_patch_size: int
    spatial_merge_size: int
    out_hidden_size: int
    num_position_embeddings: int
    deepstack_visual_indexes: list[int] = field(default_factory=list)
    hidden_act: str = "gelu_pytorch_tanh"

    @property
    def patch_dim(self) -> int:
        """Inputs of one patch: channels × temporal × patch × patch (the Conv3d as a matmul)."""
        return self.in_channels * self.temporal_patch_size * self.patch_size ** 2

    @property
    def merged_dim(self) -> int:
        """Features of one merged token: hidden × merge² (2×2 neighbouring patches concatenated)."""
        return self.hidden_size * self.spatial_merge_size ** 2


@dataclass
class ModelConfig:
    arch: str                      # "qwen3" | "qwen3_vl" | "qwen3_moe" | "qwen2"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    mrope_section: list[int] | None = None
    mrope_interleaved: bool = False
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True
    # Qwen3-MoE layers that keep a dense SwiGLU FFN (``intermediate_size``) instead of experts: a layer
    # is MoE iff it is not in ``mlp_only_layers``, ``num_experts > 0`` and ``(i + 1) % decoder_sparse_step
    # == 0`` (transformers' ``Qwen3MoeDecoderLayer``). A VQF file keeps no header bytes for them: its
    # directory names the dense layers' FFN entries (``vqf.layout``), and the reader rebuilds the config
    # with every dense layer listed in ``mlp_only_layers`` and ``decoder_sparse_step = 1``.
    mlp_only_layers: list[int] = field(default_factory=list)
    decoder_sparse_step: int = 1
    vision: VisionConfig | None = None

    # ------------------------------------------------------------------ derived sizes
    @property
    def attention(self) -> AttentionTraits:
        """This architecture's attention traits (``ATTENTION_TRAITS``). Taught in day29_3."""
        return ATTENTION_TRAITS[self.arch]

    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_key_value_heads * self.head_dim

    def is_moe_layer(self, layer: int) -> bool:
        """True if ``layer`` routes its FFN through experts (always False outside qwen3_moe)."""
        return (self.arch == "qwen3_moe" and self.num_experts > 0 and layer not in self.mlp_only_layers
                and (layer + 1) % max(1, self.decoder_sparse_step) == 0)

    @property
    def moe_layers(self) -> list[int]:
        """Indices of the expert (sparse) layers, in order. Taught in day22_2."""
        return [i for i in range(self.num_hidden_layers) if self.is_moe_layer(i)]

    @property
    def dense_layers(self) -> list[int]:
        """Indices of the layers with a dense SwiGLU FFN (every layer of a dense model). Taught in day22_2."""
        return [i for i in range(self.num_hidden_layers) if not self.is_moe_layer(i)]

    def param_counts(self) -> dict[str, int]:
        """Parameters by group (embedding, attention, FFN/experts, norms, lm head, vision)."""
        h, L = self.hidden_size, self.num_hidden_layers
        attn = L * (h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h)
        if self.attention.qkv_bias:
            attn += L * (self.q_dim + 2 * self.kv_dim)
        n_moe = len(self.moe_layers)
        ffn = (n_moe * (self.num_experts * 3 * h * self.moe_intermediate_size + self.num_experts * h)
               + (L - n_moe) * 3 * h * self.intermediate_size)
        norms = L * (2 * h + (2 * self.head_dim if self.attention.qk_norm else 0)) + h
        out = {"embedding": self.vocab_size * h, "attention": attn, "ffn": ffn, "norms": norms,
               "lm_head": 0 if self.tie_word_embeddings else self.vocab_size * h}
        if self.vision:
            v = self.vision
            per_block = 4 * v.hidden_size * v.hidden_size + 2 * v.hidden_size * v.intermediate_size
            per_block += 3 * v.hidden_size + v.hidden_size + v.intermediate_size + v.hidden_size + 4 * v.hidden_size
            merger = lambda norm_dim: (2 * norm_dim + v.merged_dim * v.merged_dim + v.merged_dim  # noqa: E731
                                       + v.merged_dim * v.out_hidden_size + v.out_hidden_size)
            out["vision"] = (v.patch_dim * v.hidden_size + v.hidden_size
                             + v.num_position_embeddings * v.hidden_size + v.depth * per_block
                             + merger(v.hidden_size) + len(v.deepstack_visual_indexes) * merger(v.merged_dim))
        return out

    def to_dict(self) -> dict:
        return asdict(self)

    # ------------------------------------------------------------------ parsing
    @classmethod
    def from_hf(cls, source: str | Path | dict) -> "ModelConfig":
        """Parse a ``config.json`` (a path, a model folder, or the loaded dict) and check it against
        the bounds of ``kestrel_lab.limits`` before anything is computed from it.

        Raises ``ConfigError`` naming the file, the JSON key (``text_config.rope_theta``), its line and
        byte offset when the source is a file, and what was expected. Taught in day27_1.
        """
        where, text_src = "config", None
        if not isinstance(source, dict):
            path = Path(source)
            if path.is_dir():
                path = path / "config.json"
            where = str(path)
            try:
                text_src = path.read_bytes().decode("utf-8")
            except UnicodeDecodeError as e:
                raise ConfigError(f"{where}: not UTF-8 at byte {e.start}: {e.reason}") from None
            try:
                source = json.loads(text_src)
            except json.JSONDecodeError as e:
                raise ConfigError(f"{where}: not valid JSON at line {e.lineno} (byte "
                                  f"{len(text_src[:e.pos].encode())}): {e.msg}") from None
            except RecursionError:
                raise ConfigError(f"{where}: JSON nested deeper than the parser follows") from None
            except ValueError as e:   # e.g. an integer of more than 4,300 digits
                raise ConfigError(f"{where}: not usable JSON: {e}") from None
        try:
            return _parse(source, where, text_src)
        except LimitError as e:
            raise ConfigError(e.args[0]) from None


class ConfigError(ValueError):
    """A config.json this package cannot use; names the file, the key, where it is and what was expected.

    Taught in day27_1."""


def _parse(cfg, where: str, text_src: str | None) -> ModelConfig:
    """The checked ModelConfig of a loaded config.json (``text_src``: its text, to locate keys)."""
    origin: dict[str, str] = {}

    def fail(key_path: str, why: str):
        at = _locate(text_src, key_path.split(".")) if text_src is not None else None
        loc = f" at line {at[0]} (byte {at[1]})" if at else ""
        raise ConfigError(f"{where}: field '{key_path}'{loc}: {why}")

    def obj(d, key_path):
        if not isinstance(d, dict):
            fail(key_path, f"expected a JSON object, got {_kind(d)}")
        return d

    if not isinstance(cfg, dict):
        raise ConfigError(f"{where}: the top level is {_kind(cfg)}, expected a JSON object")
    model_type = cfg.get("model_type")
    if not isinstance(model_type, str) or model_type not in ARCHS:
        fail("model_type", f"is {model_type!r}; supported: {sorted(ARCHS)}")
    vl = model_type == "qwen3_vl"
    sect = "text_config." if vl and "text_config" in cfg else ""
    text = obj(cfg.get("text_config"), "text_config") if sect else cfg
    # Sliding-window attention (Qwen2's ``use_sliding_window``): the engine attends to the whole
    # cache, so a model whose layers look at a window only would be run wrongly. Refused, never guessed.
    if text.get("use_sliding_window") is True:
        fail(sect + "use_sliding_window", "is true: sliding-window attention is not supported (every layer "
                                          "here attends to the whole context)")
    layer_types = text.get("layer_types")
    if isinstance(layer_types, list) and "sliding_attention" in layer_types:
        fail(sect + "layer_types", f"layer {layer_types.index('sliding_attention')} is 'sliding_attention': "
                                   "sliding-window attention is not supported")

    def get(d, key, prefix, field=None, default=_MISSING):
        if key not in d or d[key] is None:
            if default is _MISSING:
                fail(prefix + key, "is missing")
            return default
        origin[field or key] = prefix + key
        return d[key]

    def num(d, key, prefix, field, default=_MISSING):
        v = get(d, key, prefix, field, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            fail(origin.get(field, prefix + key), f"expected a number, got {_kind(v)}")
        return float(v)

    rope, rope_key = {}, None
    for k in ("rope_parameters", "rope_scaling"):
        if text.get(k) is not None:
            rope, rope_key = obj(text[k], sect + k), sect + k
            break
    if text.get("rope_theta") is not None:
        theta = num(text, "rope_theta", sect, "rope_theta")
    elif rope.get("rope_theta") is not None:
        theta = num(rope, "rope_theta", rope_key + ".", "rope_theta")
    else:
        fail(sect + "rope_theta", f"is missing (nor is '{sect}rope_parameters.rope_theta' set)")
    heads = get(text, "num_attention_heads", sect)
    hidden = get(text, "hidden_size", sect)
    for field, v in (("num_attention_heads", heads), ("hidden_size", hidden)):
        _bounded(field, v, origin, fail)
    head_dim = get(text, "head_dim", sect, default=None)
    if head_dim is None:
        head_dim, origin["head_dim"] = hidden // heads, sect + "hidden_size"
    tie = cfg.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
    if not isinstance(tie, bool):
        fail("tie_word_embeddings", f"expected true or false, got {_kind(tie)}")
    mrope = None
    if "mrope_section" in rope:
        mrope = get(rope, "mrope_section", rope_key + ".")
        if not isinstance(mrope, list):
            fail(rope_key + ".mrope_section", f"expected a list of integers, got {_kind(mrope)}")
    vision = None
    if vl:
        v = obj(get(cfg, "vision_config", ""), "vision_config")
        kw = {}
        for k in VisionConfig.__dataclass_fields__:
            if k in v:
                kw[k] = v[k]
                origin["vision." + k] = "vision_config." + k
        missing = [k for k, f in VisionConfig.__dataclass_fields__.items()
                   if k not in kw and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        if missing:
            fail("vision_config." + missing[0], "is missing")
        if not isinstance(kw.get("hidden_act", ""), str):
            fail("vision_config.hidden_act", f"expected a string, got {_kind(kw['hidden_act'])}")
        vision = VisionConfig(**kw)
    moe = model_type == "qwen3_moe"
    experts_key = "num_experts" if cfg.get("num_experts") else "num_local_experts"
    eos = _first(get(text, "eos_token_id", sect, default=cfg.get("eos_token_id")))
    bos = get(text, "bos_token_id", sect, default=cfg.get("bos_token_id"))
    for f in ("eos_token_id", "bos_token_id"):
        origin.setdefault(f, f)
    out = ModelConfig(
        arch=model_type,
        vocab_size=get(text, "vocab_size", sect),
        hidden_size=hidden,
        intermediate_size=get(text, "intermediate_size", sect),
        num_hidden_layers=get(text, "num_hidden_layers", sect),
        num_attention_heads=heads,
        num_key_value_heads=get(text, "num_key_value_heads", sect, default=heads),
        head_dim=head_dim,
        rms_norm_eps=num(text, "rms_norm_eps", sect, "rms_norm_eps", default=1e-6),
        rope_theta=theta,
        max_position_embeddings=get(text, "max_position_embeddings", sect),
        tie_word_embeddings=tie,
        bos_token_id=bos,
        eos_token_id=eos,
        mrope_section=list(mrope) if mrope is not None else None,
        mrope_interleaved=bool(rope.get("mrope_interleaved", False)),
        # transformers 5 names it num_local_experts; the public Qwen3-MoE config.json num_experts
        num_experts=get(cfg, experts_key, "", "num_experts", default=0) if moe else 0,
        num_experts_per_tok=get(cfg, "num_experts_per_tok", "", default=0) if moe else 0,
        moe_intermediate_size=get(cfg, "moe_intermediate_size", "", default=0) if moe else 0,
        # transformers' Qwen3MoeConfig defaults to False when the field is absent (30B-A3B sets true)
        norm_topk_prob=bool(cfg.get("norm_topk_prob", model_type != "qwen3_moe")),
        mlp_only_layers=_dense_layers(cfg, get(text, "num_hidden_layers", sect), where) if moe else [],
        vision=vision,
    )
    if mrope is not None:
        origin["mrope_section"] = rope_key + ".mrope_section"
    origin.setdefault("num_key_value_heads", sect + "num_attention_heads")
    try:
        check_config(out)
    except LimitError as e:
        fail(origin.get(e.field, e.field), e.detail)
    return out


_MISSING = object()


def _bounded(field, value, origin, fail):
    try:
        BOUND[field].check(value, field)
    except LimitError as e:
        fail(origin.get(field, field), e.detail)


def _kind(v) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(v), f"{type(v).__name__} {v!r}")


def _locate(text: str, path: list[str]) -> tuple[int, int] | None:
    """(line, byte offset) of the value at ``path`` (object keys) in JSON ``text``; None if absent."""
    dec = json.JSONDecoder()
    ws = re.compile(r"[ \t\n\r]*")
    pos = ws.match(text, 0).end()
    try:
        for key in path:
            if text[pos:pos + 1] != "{":
                return None
            pos = ws.match(text, pos + 1).end()
            while text[pos:pos + 1] == '"':
                k, pos = json.decoder.scanstring(text, pos + 1)
                pos = ws.match(text, pos).end() + 1           # the ':'
                pos = ws.match(text, pos).end()
                if k == key:
                    break
                _, pos = dec.raw_decode(text, pos)
                pos = ws.match(text, pos).end()
                if text[pos:pos + 1] == ",":
                    pos = ws.match(text, pos + 1).end()
            else:
                return None
    except (ValueError, RecursionError):
        return None
    return text.count("\n", 0, pos) + 1, len(text[:pos].encode("utf-8"))


def _dense_layers(cfg: dict, n_layers: int, where: str) -> list[int]:
    """Every dense layer of a Qwen3-MoE config, by transformers' rule, as one sorted list (so a config
    read back from a VQF file, which records only that list, equals the one read from config.json)."""
    only = cfg.get("mlp_only_layers") or []
    if not isinstance(only, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in only):
        raise ValueError(f"{where}: field 'mlp_only_layers' must be a list of layer indices, got {only!r}")
    step = cfg.get("decoder_sparse_step", 1)
    step = 1 if step is None else step
    if not isinstance(step, int) or isinstance(step, bool) or step < 1:
        raise ValueError(f"{where}: field 'decoder_sparse_step' must be an integer >= 1, got {step!r}")
    n_exp = cfg.get("num_experts") or cfg.get("num_local_experts") or 0
    return [i for i in range(n_layers) if i in only or n_exp <= 0 or (i + 1) % step]


def _first(x):
    return x[0] if isinstance(x, list) and x else x
