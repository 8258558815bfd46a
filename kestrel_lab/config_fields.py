"""The one table of config.json fields: every key the engine reads, its type, bound, meaning and use.

``ModelConfig.from_hf`` walks ``FIELDS`` and nothing else: each row names a key, the section it lives in,
its JSON type, the ``ModelConfig`` attribute it sets (whose bound is ``kestrel_lab.limits``'s), its default
when absent, and — for a field that changes the math — the values the engine implements. A value outside
them is refused with the file, the key, its line and what is implemented; never run with different math
than transformers. Keys the table does not list are not read (transformers does not read them either,
or only for training); they are collected in ``ModelConfig.ignored`` and reported once, quietly.

Sections: ``top`` (the top level), ``text`` (the text model: the top level, or ``text_config`` of a
Qwen3-VL config), ``rope`` (the text model's ``rope_parameters`` — transformers 5 — or ``rope_scaling``),
``vision`` (``vision_config``), ``vision_rope`` (``vision_config.rope_parameters``); ``any`` rows are
accepted in every section. Uses: ``shape`` (tensor shapes), ``math`` (the computation), ``run`` (the
generation loop: context, stop and image token ids), ``none`` (no effect on inference: dropout,
initialisation, dtype, bookkeeping).

The VQF header stores every ``shape``/``math`` field that a file needs (``vqf.format``); its reader checks
the same bounds and the same implemented values (``check_implemented``). book/formats/vqf.md shows the
table (``spec_table``). Taught in day24_3.
"""
from __future__ import annotations

from dataclasses import dataclass

from kestrel_lab.rope_scaling import REFUSED as REFUSED_ROPE
from kestrel_lab.rope_scaling import ROPE_TYPES

REQUIRED = object()
ARCHS = ("qwen3", "qwen3_vl", "qwen3_moe", "qwen2")
QWEN3_ATTENTION = ("qwen3", "qwen3_vl", "qwen3_moe")
VL, MOE = ("qwen3_vl",), ("qwen3_moe",)
SCALED = ("linear", "yarn")
# The Qwen tokenizer's vision ids (tests check them against kestrel_lab.vision.prompt).
IMAGE_PAD, VIDEO_PAD, VISION_START, VISION_END = 151655, 151656, 151652, 151653


@dataclass(frozen=True)
class ConfigField:
    """One config.json key: where it is, its type, what it sets and which values are implemented.

    ``kind``: int | float | bool | str | ints (list of integers) | strs | token (an id, a list of ids
    or null) | object | any. ``allowed``: the values the engine implements (empty: any value within the
    bound); another value is refused with ``refuse`` as the reason. ``places``: other (section, key)
    spellings read when this one is absent, in transformers' priority order. Taught in day24_3.
    """

    section: str
    key: str
    kind: str
    use: str
    meaning: str
    target: str = ""              # ModelConfig attribute (its bound: limits.BOUND[target]); "" = checked only
    default: object = REQUIRED    # a value, a callable of the values read so far, REQUIRED, or {arch: one of these}
    nullable: bool = False        # an explicit null means "absent" (else it is refused: transformers refuses it)
    allowed: tuple = ()
    refuse: str = ""
    archs: tuple = ()             # () = every architecture
    rope_types: tuple = ()        # rope fields: the rope types that read it (() = every type)
    places: tuple = ()            # ((section, key), ...) read before this one, in priority order

    @property
    def id(self) -> str:
        return f"{self.section}.{self.key}"

    def default_for(self, arch: str):
        """The default when the key is absent: the same as transformers' config class gives, or REQUIRED
        where that is a fixed number copied from some other model (Qwen3Config's head_dim 128)."""
        return self.default.get(arch, REQUIRED) if isinstance(self.default, dict) else self.default

    def applies(self, arch: str, rope_type: str | None) -> bool:
        return ((not self.archs or arch in self.archs)
                and (not self.rope_types or rope_type in self.rope_types))

    def status(self) -> str:
        """implemented / checked / refused-unless / no effect, for the spec table."""
        if self.use == "none":
            return "不影响推理（读入即忽略）"
        if self.allowed:
            return "实现：" + "、".join(f"`{_show(a)}`" for a in self.allowed) + "；其他值拒绝"
        return "实现"


def _show(v) -> str:
    return "true" if v is True else "false" if v is False else str(v)


def _f(*a, **k) -> ConfigField:
    return ConfigField(*a, **k)


def _no_effect(section: str, keys: str, why: str) -> list[ConfigField]:
    return [ConfigField(section, k, "any", "none", why, default=None, nullable=True) for k in keys.split()]


ROPE_WHY = {k: f"{v}: not implemented" for k, v in REFUSED_ROPE.items()}

FIELDS: tuple[ConfigField, ...] = (
    # ---- identity
    _f("top", "model_type", "str", "shape", "architecture", allowed=ARCHS,
       refuse="supported: Qwen3, Qwen3-VL, Qwen3-MoE and Qwen2/Qwen2.5"),
    # ---- the text model's shapes
    _f("text", "vocab_size", "int", "shape", "token embedding rows", "vocab_size"),
    _f("text", "hidden_size", "int", "shape", "model width", "hidden_size"),
    _f("text", "num_attention_heads", "int", "shape", "query heads", "num_attention_heads"),
    # Absent, transformers' classes take fixed numbers (num_key_value_heads 32, or 4 for Qwen3-MoE; Qwen3's
    # head_dim 128): refused as missing rather than guessed.
    _f("text", "num_key_value_heads", "int", "shape", "key/value heads (GQA); absent: refused (transformers "
       "would take its class default, 32 or 4)", "num_key_value_heads"),
    _f("text", "head_dim", "int", "shape", "width of one head; absent (Qwen2, Qwen3-MoE): hidden_size / "
       "num_attention_heads; absent in Qwen3 / Qwen3-VL: refused (transformers would take 128)", "head_dim",
       default={a: (lambda v: v["text.hidden_size"] // v["text.num_attention_heads"]) for a in ("qwen2", "qwen3_moe")}),
    _f("text", "intermediate_size", "int", "shape", "dense SwiGLU width", "intermediate_size"),
    _f("text", "num_hidden_layers", "int", "shape", "decoder layers", "num_hidden_layers"),
    _f("top", "tie_word_embeddings", "bool", "shape", "the LM head is the embedding matrix",
       "tie_word_embeddings", default=False, places=(("text", "tie_word_embeddings"),)),
    # ---- the text model's math
    _f("text", "rms_norm_eps", "float", "math", "RMSNorm epsilon", "rms_norm_eps", default=1e-6),
    _f("text", "hidden_act", "str", "math", "the FFN's gate activation", default="silu", allowed=("silu", "swish"),
       refuse="the engine's SwiGLU uses SiLU (transformers' 'silu' and 'swish')"),
    _f("text", "attention_bias", "bool", "math", "biases on q/k/v/o (Qwen3's attention)", default=False,
       allowed=(False,), archs=QWEN3_ATTENTION,
       refuse="Qwen3's attention would add biases to q, k, v and o; the Qwen3 layout has none"),
    _f("text", "use_sliding_window", "bool", "math", "sliding-window attention", default=False, allowed=(False,),
       refuse="sliding-window attention is not supported (every layer attends to the whole context)"),
    _f("text", "layer_types", "strs", "math", "attention kind per layer", default=None, nullable=True,
       allowed=("full_attention",), refuse="sliding-window attention is not supported"),
    _f("rope", "rope_theta", "float", "math", "RoPE base θ (transformers: the rope dict's first, then the "
       "model's)", "rope_theta", places=(("text", "rope_theta"),)),
    _f("rope", "partial_rotary_factor", "float", "math", "fraction of each head that RoPE rotates", default=1.0,
       allowed=(1.0,), places=(("text", "partial_rotary_factor"),),
       refuse="the engine rotates the whole head (Qwen3 and Qwen2 do)"),
    _f("text", "max_position_embeddings", "int", "run", "context the model was made for (the KV cache's "
       "upper limit; yarn's original window when that is absent)", "max_position_embeddings"),
    _f("text", "bos_token_id", "token", "run", "begin-of-text id", "bos_token_id",
       default=lambda v: None, nullable=True, places=(("top", "bos_token_id"),)),
    _f("text", "eos_token_id", "token", "run", "end-of-text id (the first of a list stops generation)",
       "eos_token_id", default=lambda v: None, nullable=True, places=(("top", "eos_token_id"),)),
    # ---- RoPE scaling (rope_parameters / rope_scaling)
    _f("rope", "rope_type", "str", "math", "RoPE variant ('type' in older configs)", default="default",
       allowed=tuple(ROPE_TYPES), places=(("rope", "type"),),
       refuse="the engine implements plain, linear and YaRN RoPE"),
    _f("rope", "factor", "float", "math", "context stretch: frequencies divided by it (yarn: the slow ones)",
       "rope_scaling.factor", rope_types=SCALED),
    _f("text", "original_max_position_embeddings", "int", "math", "yarn's original window (transformers reads "
       "this top-level key first)", "rope_scaling.original_max_position_embeddings",
       default=lambda v: v["text.max_position_embeddings"], rope_types=("yarn",),
       places=(("rope", "original_max_position_embeddings"),)),
    _f("rope", "attention_factor", "float", "math", "yarn: cos/sin multiplier (absent: 0.1·ln(factor) + 1)",
       "rope_scaling.attention_factor", default=None, nullable=True, rope_types=("yarn",)),
    _f("rope", "beta_fast", "float", "math", "yarn: turns in the original window above which a pair keeps its "
       "frequency (absent: 32)", "rope_scaling.beta_fast", default=None, nullable=True, rope_types=("yarn",)),
    _f("rope", "beta_slow", "float", "math", "yarn: turns below which a pair is fully interpolated (absent: 1)",
       "rope_scaling.beta_slow", default=None, nullable=True, rope_types=("yarn",)),
    _f("rope", "mscale", "float", "math", "yarn: DeepSeek's attention-factor numerator scale",
       "rope_scaling.mscale", default=None, nullable=True, rope_types=("yarn",)),
    _f("rope", "mscale_all_dim", "float", "math", "yarn: DeepSeek's attention-factor denominator scale",
       "rope_scaling.mscale_all_dim", default=None, nullable=True, rope_types=("yarn",)),
    _f("rope", "truncate", "bool", "math", "yarn: round the ramp's ends to whole pairs", default=True,
       rope_types=("yarn",)),
    _f("rope", "mrope_section", "ints", "math", "MRoPE split of the pairs between t, h, w (absent: refused; "
       "transformers would take [24, 20, 20])", "mrope_section", archs=VL),
    _f("rope", "mrope_interleaved", "bool", "math", "MRoPE pairs interleaved t,h,w (Qwen3-VL always is)",
       "mrope_interleaved", default=False, archs=VL),
    # ---- Qwen3-MoE
    _f("text", "num_experts", "int", "shape", "experts per MoE layer ('num_local_experts' in transformers 5)",
       "num_experts", archs=MOE, places=(("text", "num_local_experts"),)),
    _f("text", "num_experts_per_tok", "int", "math", "experts routed per token", "num_experts_per_tok", archs=MOE),
    _f("text", "moe_intermediate_size", "int", "shape", "FFN width of one expert", "moe_intermediate_size",
       archs=MOE),
    _f("text", "norm_topk_prob", "bool", "math", "renormalise the chosen experts' weights (absent: false)",
       "norm_topk_prob", default=False, archs=MOE),
    _f("text", "mlp_only_layers", "ints", "shape", "layers whose FFN is dense", "mlp_only_layers", default=None,
       nullable=True,
       archs=MOE),
    _f("text", "decoder_sparse_step", "int", "shape", "every step-th layer is sparse", "decoder_sparse_step",
       default=1, archs=MOE),
    # ---- Qwen3-VL: the prompt's vision ids and the vision tower
    _f("top", "image_token_id", "int", "run", "<|image_pad|>", default=IMAGE_PAD, allowed=(IMAGE_PAD,), archs=VL,
       refuse="the engine writes the Qwen tokenizer's <|image_pad|>"),
    _f("top", "video_token_id", "int", "run", "<|video_pad|>", default=VIDEO_PAD, allowed=(VIDEO_PAD,), archs=VL,
       refuse="the Qwen tokenizer's <|video_pad|>"),
    _f("top", "vision_start_token_id", "int", "run", "<|vision_start|>", default=VISION_START,
       allowed=(VISION_START,), archs=VL, refuse="the Qwen tokenizer's <|vision_start|>"),
    _f("top", "vision_end_token_id", "int", "run", "<|vision_end|>", default=VISION_END, allowed=(VISION_END,),
       archs=VL, refuse="the Qwen tokenizer's <|vision_end|>"),
    *(_f("vision", k, "int", "shape", m, "vision." + k, archs=VL) for k, m in (
        ("depth", "vision blocks"), ("hidden_size", "vision width"), ("intermediate_size", "vision MLP width"),
        ("num_heads", "vision attention heads"), ("in_channels", "image channels"),
        ("patch_size", "patch side in pixels"), ("temporal_patch_size", "frames per patch"),
        ("spatial_merge_size", "patches merged per side into one token"),
        ("out_hidden_size", "merger output width"), ("num_position_embeddings", "learned position rows"))),
    _f("vision", "deepstack_visual_indexes", "ints", "shape", "blocks feeding the DeepStack mergers (absent: "
       "refused; transformers would take [8, 16, 24])", "vision.deepstack_visual_indexes", archs=VL),
    _f("vision", "hidden_act", "str", "math", "the vision MLP's activation", "vision.hidden_act",
       default="gelu_pytorch_tanh", allowed=("gelu_pytorch_tanh",), archs=VL,
       refuse="the vision tower implements the tanh GELU only"),
    _f("vision_rope", "rope_type", "str", "math", "the vision tower's 2-D RoPE", default="axial",
       allowed=("axial", "default"), archs=VL, refuse="transformers' Qwen3-VL vision tower takes axial only"),
    _f("vision_rope", "rope_theta", "float", "math", "the vision RoPE base", default=10000.0, allowed=(10000.0,),
       archs=VL, refuse="the vision tower's RoPE base is 10,000"),
    # ---- read by transformers, no effect on what a forward pass computes
    *_no_effect("any", "architectures model_type dtype torch_dtype transformers_version _name_or_path "
                "initializer_range attention_dropout use_cache pad_token_id id2label label2id return_dict "
                "output_attentions output_hidden_states problem_type chunk_size_feed_forward "
                "is_encoder_decoder tie_word_embeddings", "bookkeeping, training or dtype (a second "
                "tie_word_embeddings: the top level's is read)"),
    *_no_effect("text", "sliding_window max_window_layers", "read only with use_sliding_window"),
    *_no_effect("text", "router_aux_loss_coef output_router_logits", "MoE training only"),
)
FIELD = {f.id: f for f in FIELDS if f.section != "any"}
assert len(FIELD) == len([f for f in FIELDS if f.section != "any"]), "a (section, key) is listed twice"
ANY_KEYS = frozenset(f.key for f in FIELDS if f.section == "any")

KIND_TEXT = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string",
             "ints": "a list of integers", "strs": "a list of strings", "token": "a token id, a list of ids or null",
             "object": "a JSON object", "any": "any value"}


def type_ok(kind: str, v) -> bool:
    """``v`` is of JSON kind ``kind`` (booleans are never numbers). Taught in day24_3."""
    def is_int(x):
        return isinstance(x, int) and not isinstance(x, bool)

    if kind == "int":
        return is_int(v)
    if kind == "float":
        return is_int(v) or isinstance(v, float)
    if kind == "bool":
        return isinstance(v, bool)
    if kind == "str":
        return isinstance(v, str)
    if kind == "ints":
        return isinstance(v, list) and all(is_int(x) for x in v)
    if kind == "strs":
        return isinstance(v, list) and all(isinstance(x, str) for x in v)
    if kind == "token":
        return is_int(v) or (isinstance(v, list) and all(is_int(x) for x in v))
    if kind == "object":
        return isinstance(v, dict)
    return True


def allowed_ok(f: ConfigField, v) -> bool:
    """``v`` (of the right kind) is a value the engine implements. Taught in day24_3."""
    if not f.allowed or v is None:
        return True
    items = v if f.kind == "strs" else [v]
    return all(any(type(x) is type(a) and x == a or (f.kind == "float" and x == a) for a in f.allowed)
               for x in items)


def refusal(f: ConfigField, v) -> str:
    """Why the value ``v`` of field ``f`` is refused."""
    if f.key == "rope_type" and f.section == "rope" and v in ROPE_WHY:
        return f"is {v!r} ({ROPE_WHY[v]}); implemented: {', '.join(ROPE_TYPES)}"
    items = v if f.kind == "strs" else [v]
    bad = next(x for x in items if not allowed_ok(f, [x] if f.kind == "strs" else x))
    at = f" (item {items.index(bad)})" if f.kind == "strs" else ""
    return (f"is {bad!r}{at}: not implemented — {f.refuse}; implemented: "
            + ", ".join(repr(a) for a in f.allowed))


def check_implemented(cfg) -> tuple[str, str] | None:
    """(ModelConfig path, why) of the first value of ``cfg`` outside the implemented ones, or None.

    The VQF reader's half of the table: a header can name a vision activation or a rope type that the
    engine does not implement. Taught in day24_3."""
    if cfg.vision is not None:
        f = FIELD["vision.hidden_act"]
        if not allowed_ok(f, cfg.vision.hidden_act):
            return "vision.hidden_act", refusal(f, cfg.vision.hidden_act)
    rs = getattr(cfg, "rope_scaling", None)
    if rs is not None and rs.rope_type not in SCALED:
        return "rope_scaling", f"rope type {rs.rope_type!r} is not implemented (known: {', '.join(SCALED)})"
    return None


def spec_table() -> str:
    """Markdown: every field with section, type, use, bound or implemented values, meaning (the book's
    config.json page, written by ``kestrel-lab book sources``)."""
    from kestrel_lab.limits import BOUND

    where = {"top": "顶层", "text": "文本模型", "rope": "rope_parameters", "vision": "vision_config",
             "vision_rope": "vision_config.rope_parameters", "any": "任何一节"}
    rows = ["| 字段 | 位置 | 类型 | 作用 | 界限 | 处理 | 含义 |", "|---|---|---|---|---|---|---|"]
    groups: dict[tuple[str, str], list[str]] = {}
    for f in FIELDS:
        if f.use == "none":
            groups.setdefault((f.section, f.meaning), []).append(f"`{f.key}`")
            continue
        b = BOUND.get(f.target)
        bound = "—" if b is None else (f"[{b.lo:g}, {b.hi:g}]" if b.kind == "float" else f"[{b.lo:,}, {b.hi:,}]")
        arch = f"（{'、'.join(f.archs)}）" if f.archs else ""
        rt = f"（rope_type {'/'.join(f.rope_types)}）" if f.rope_types else ""
        rows.append(f"| `{f.key}` | {where[f.section]}{arch}{rt} | {f.kind} | {f.use} | {bound} | {f.status()} | "
                    f"{f.meaning} |")
    for (section, meaning), keys in groups.items():
        rows.append(f"| {'、'.join(keys)} | {where[section]} | any | none | — | 不影响推理（读入即忽略） | {meaning} |")
    return "\n".join(rows)


__all__ = ["ConfigField", "FIELDS", "FIELD", "ANY_KEYS", "REQUIRED", "KIND_TEXT", "type_ok", "allowed_ok",
           "refusal", "check_implemented", "spec_table"]
