"""A model's architecture, read from a Hugging Face ``config.json``.

Qwen3 (dense), Qwen3-MoE and Qwen3-VL configs differ in shape (VL nests the text model under
``text_config`` and adds ``vision_config``) and in era (transformers ≤ 4 writes ``rope_theta`` and
``rope_scaling``; transformers 5 writes ``rope_parameters``). ``ModelConfig`` flattens all of them into
one record, which the planner, the converter, the VQF header and the engine share.
Taught in day01_2 (parameter counts) and day15_2 (the name map).
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kestrel_lab import config_fields as CF
from kestrel_lab import rope_scaling
from kestrel_lab.limits import BOUND, LimitError, check_config
from kestrel_lab.rope_scaling import RopeScaling

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
    # linear or yarn RoPE scaling, resolved to the float32 values the math uses (None: plain RoPE);
    # a VQF header stores it in ``rope_type`` and the RoPE block (``vqf.format.ROPE_FIELDS``)
    rope_scaling: RopeScaling | None = None
    # config.json keys no field of ``config_fields`` reads (JSON paths): reported once, never guessed at
    ignored: tuple[str, ...] = field(default=(), compare=False, repr=False)

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
        out = asdict(self)
        out.pop("ignored")
        return out

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
    """The checked ModelConfig of a loaded config.json (``text_src``: its text, to locate keys): the walk
    of ``config_fields.FIELDS`` — type, bound and implemented values of every key, in table order."""
    w = _Walk(cfg, where, text_src)
    for f in CF.FIELDS:
        if f.section != "any" and f.applies(w.arch, w.values.get("rope.rope_type")):
            w.read(f)
    out = _build(w)
    try:
        check_config(out)
    except LimitError as e:
        w.fail(w.origin.get(e.field, e.field), e.detail)
    out.ignored = w.unread()
    return out


class _Walk:
    """One config.json being read: its sections, the values read so far, where each came from."""

    def __init__(self, cfg, where: str, text_src: str | None):
        self.where, self.text_src = where, text_src
        self.values: dict[str, object] = {}
        self.origin: dict[str, str] = {}          # ModelConfig path -> JSON path, for error messages
        self.read_keys: set[tuple[int, str]] = set()     # (id of the section's dict, key)
        if not isinstance(cfg, dict):
            raise ConfigError(f"{where}: the top level is {_kind(cfg)}, expected a JSON object")
        self.sections, self.prefix, self.arch = {"top": cfg}, {"top": ""}, ""
        self.read(CF.FIELD["top.model_type"])
        self.arch = self.values["top.model_type"]
        self._sections(cfg)

    def _sections(self, cfg: dict) -> None:
        vl = self.arch == "qwen3_vl"
        text, tp = (self.obj(cfg, "text_config", ""), "text_config.") if vl and "text_config" in cfg else (cfg, "")
        self.sections["text"], self.prefix["text"] = text, tp
        given = [k for k in ("rope_parameters", "rope_scaling") if text.get(k) is not None]
        if len(given) == 2:
            self.fail(tp + "rope_scaling", "is set beside rope_parameters: transformers 5 then takes "
                      "rope_scaling alone and drops rope_parameters (its rope_theta included); merge them into one")
        if given:
            self.sections["rope"], self.prefix["rope"] = self.obj(text, given[0], tp), f"{tp}{given[0]}."
            self.mark("rope", "type")        # transformers 5 keeps both spellings; rope_type wins
        self.mark("text", "rope_parameters", "rope_scaling")
        if vl:
            v = self.obj(cfg, "vision_config", "", required=True)
            self.sections["vision"], self.prefix["vision"] = v, "vision_config."
            self.mark("top", "text_config", "vision_config")
            self.mark("vision", "rope_parameters")
            if v.get("rope_parameters") is not None:
                self.sections["vision_rope"] = self.obj(v, "rope_parameters", "vision_config.")
                self.prefix["vision_rope"] = "vision_config.rope_parameters."

    def mark(self, section: str, *keys: str) -> None:
        """Count ``keys`` of ``section`` as read (the same dict may be two sections: top and text)."""
        d = self.sections.get(section)
        if d is not None:
            self.read_keys |= {(id(d), k) for k in keys}

    def obj(self, d: dict, key: str, prefix: str, required: bool = False) -> dict:
        v = d.get(key)
        if v is None and required:
            self.fail(prefix + key, "is missing")
        if not isinstance(v, dict):
            self.fail(prefix + key, f"expected a JSON object, got {_kind(v)}")
        return v

    def fail(self, key_path: str, why: str):
        at = _locate(self.text_src, key_path.split(".")) if self.text_src is not None else None
        loc = f" at line {at[0]} (byte {at[1]})" if at else ""
        raise ConfigError(f"{self.where}: field '{key_path}'{loc}: {why}")

    def path(self, section: str, key: str) -> str:
        """The JSON path of ``key`` in ``section`` (an absent rope dict is named ``rope_parameters``)."""
        if section in self.prefix:
            return self.prefix[section] + key
        absent = {"rope": self.prefix.get("text", "") + "rope_parameters.",
                  "vision_rope": "vision_config.rope_parameters.", "vision": "vision_config."}
        return absent.get(section, "") + key

    def read(self, f: CF.ConfigField) -> None:
        """Read one field: its first present spelling, else its default; check kind, bound, value."""
        for sect, key in ((f.section, f.key), *f.places):
            d = self.sections.get(sect)
            if d is not None and key in d:
                self.mark(sect, key)
                if d[key] is None and not f.nullable:
                    self.fail(self.path(sect, key), "is null: transformers refuses a null here; write a value "
                                                    "(or leave the key out where a default is documented)")
            if d is not None and d.get(key) is not None:
                value, path = d[key], self.path(sect, key)
                break
        else:
            path = self.path(f.section, f.key)
            default = f.default_for(self.arch)
            if default is CF.REQUIRED:
                also = "".join(f" (nor is '{self.path(s, k)}' set)" for s, k in f.places)
                self.fail(path, "is missing" + also + (f"; {f.meaning}" if "absent" in f.meaning else ""))
            value = default(self.values) if callable(default) else default
        if not CF.type_ok(f.kind, value) and value is not None:
            self.fail(path, f"expected {CF.KIND_TEXT[f.kind]}, got {_kind(value)}"
                      + (f" ({f.refuse})" if f.allowed else ""))
        if f.target:
            self.origin[f.target] = path
            for item in (value if isinstance(value, list) else [value]):
                if f.target in BOUND and item is not None:
                    try:
                        BOUND[f.target].check(item, f.target)
                    except LimitError as e:
                        self.fail(path, e.detail)
        if not CF.allowed_ok(f, value):
            self.fail(path, CF.refusal(f, value))
        self.values[f.id] = value

    def unread(self) -> tuple[str, ...]:
        """JSON paths of the keys no field read (transformers does not read them for inference either)."""
        out, seen = [], set()
        for sect, d in self.sections.items():
            if id(d) not in seen:
                seen.add(id(d))
                out += [self.path(sect, k) for k in d if (id(d), k) not in self.read_keys and k not in CF.ANY_KEYS]
        return tuple(sorted(out))


def _build(w: _Walk) -> ModelConfig:
    """The ModelConfig of the values a walk read (derived: the first eos id, the MoE dense layers, the
    resolved rope scaling, the vision tower)."""
    v, arch = w.values, w.arch
    text = {k[5:]: x for k, x in v.items() if k.startswith("text.")}
    moe = arch == "qwen3_moe"
    out = ModelConfig(
        arch=arch, vocab_size=text["vocab_size"], hidden_size=text["hidden_size"],
        intermediate_size=text["intermediate_size"], num_hidden_layers=text["num_hidden_layers"],
        num_attention_heads=text["num_attention_heads"], num_key_value_heads=text["num_key_value_heads"],
        head_dim=text["head_dim"], rms_norm_eps=float(text["rms_norm_eps"]), rope_theta=float(v["rope.rope_theta"]),
        max_position_embeddings=text["max_position_embeddings"], tie_word_embeddings=v["top.tie_word_embeddings"],
        bos_token_id=_first(text["bos_token_id"]), eos_token_id=_first(text["eos_token_id"]),
        mrope_section=v.get("rope.mrope_section"), mrope_interleaved=v.get("rope.mrope_interleaved", False),
        num_experts=text.get("num_experts", 0), num_experts_per_tok=text.get("num_experts_per_tok", 0),
        moe_intermediate_size=text.get("moe_intermediate_size", 0),
        # transformers' Qwen3MoeConfig defaults to False when the field is absent (30B-A3B sets true)
        norm_topk_prob=text.get("norm_topk_prob", True) if moe else True,
        mlp_only_layers=_dense_layers(text, v["text.num_hidden_layers"]) if moe else [],
        decoder_sparse_step=1, rope_scaling=_rope_scaling(w), vision=_vision(v) if arch == "qwen3_vl" else None)
    w.origin.setdefault("vision", "vision_config")
    for f in ("rope_scaling.ramp_low", "rope_scaling.ramp_width"):
        w.origin[f] = w.path("rope", "beta_fast")
    w.origin.setdefault("rope_scaling.attention_factor", w.path("rope", "factor"))
    return out


def _rope_scaling(w: _Walk) -> RopeScaling | None:
    v = w.values
    kind = v.get("rope.rope_type", "default")
    if kind == "linear":
        return rope_scaling.linear(v["rope.factor"])
    if kind != "yarn":
        return None
    kw = {k: v[f"rope.{k}"] for k in ("beta_fast", "beta_slow", "attention_factor", "mscale", "mscale_all_dim")}
    return rope_scaling.yarn(v["rope.factor"], v["text.head_dim"], v["rope.rope_theta"],
                             v["text.original_max_position_embeddings"], truncate=v["rope.truncate"], **kw)


def _vision(v: dict) -> VisionConfig:
    kw = {k[7:]: x for k, x in v.items() if k.startswith("vision.")}
    kw["deepstack_visual_indexes"] = list(kw.get("deepstack_visual_indexes") or [])
    return VisionConfig(**kw)


def _kind(v) -> str:
    if isinstance(v, str):
        return f"a string ({v[:40]!r})"
    return {dict: "an object", list: "a list", bool: "a boolean", type(None): "null"}.get(
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


def _dense_layers(text: dict, n_layers: int) -> list[int]:
    """Every dense layer of a Qwen3-MoE config, by transformers' rule, as one sorted list (so a config
    read back from a VQF file, which records only that list, equals the one read from config.json).
    The walk has checked the fields' kinds and bounds (n_layers ≤ 1,024) before this loop runs."""
    only = set(text.get("mlp_only_layers") or [])
    step = text.get("decoder_sparse_step", 1)
    return [i for i in range(n_layers) if i in only or text["num_experts"] <= 0 or (i + 1) % step]


def _first(x):
    return x[0] if isinstance(x, list) and x else x
