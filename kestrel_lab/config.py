"""A model's architecture, read from a Hugging Face ``config.json``.

Qwen3 (dense), Qwen3-MoE and Qwen3-VL configs differ in shape (VL nests the text model under
``text_config`` and adds ``vision_config``) and in era (transformers ≤ 4 writes ``rope_theta`` and
``rope_scaling``; transformers 5 writes ``rope_parameters``). ``ModelConfig`` flattens all of them into
one record, which the planner, the converter, the VQF header and the engine share.
Taught in day01_2 (parameter counts) and day15_2 (the name map).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

ARCHS = {"qwen3": 1, "qwen3_vl": 2, "qwen3_moe": 3}


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
    arch: str                      # "qwen3" | "qwen3_vl" | "qwen3_moe"
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
        n_moe = len(self.moe_layers)
        ffn = (n_moe * (self.num_experts * 3 * h * self.moe_intermediate_size + self.num_experts * h)
               + (L - n_moe) * 3 * h * self.intermediate_size)
        norms = L * (2 * h + 2 * self.head_dim) + h
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
        """Parse a ``config.json`` (a path, a model folder, or the loaded dict)."""
        where = "config"
        if not isinstance(source, dict):
            path = Path(source)
            if path.is_dir():
                path = path / "config.json"
            where = str(path)
            try:
                source = json.loads(path.read_text(encoding="utf-8"))
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not valid JSON at line {e.lineno}: {e.msg}") from e
        cfg = source
        model_type = cfg.get("model_type")
        if model_type not in ARCHS:
            raise ValueError(f"{where}: field 'model_type' is {model_type!r}; supported: {sorted(ARCHS)}")
        text = cfg.get("text_config", cfg) if model_type == "qwen3_vl" else cfg

        def need(d: dict, key: str, sect: str = ""):
            if key not in d or d[key] is None:
                raise ValueError(f"{where}: field '{sect}{key}' is missing")
            return d[key]

        sect = "text_config." if text is not cfg else ""
        rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
        theta = text.get("rope_theta", rope.get("rope_theta"))
        if theta is None:
            raise ValueError(f"{where}: neither '{sect}rope_theta' nor '{sect}rope_parameters.rope_theta' is set")
        heads = need(text, "num_attention_heads", sect)
        hidden = need(text, "hidden_size", sect)
        tie = cfg.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
        vision = None
        if model_type == "qwen3_vl":
            v = need(cfg, "vision_config")
            vision = VisionConfig(**{k: v[k] for k in VisionConfig.__dataclass_fields__ if k in v})
        return cls(
            arch=model_type,
            vocab_size=need(text, "vocab_size", sect),
            hidden_size=hidden,
            intermediate_size=need(text, "intermediate_size", sect),
            num_hidden_layers=need(text, "num_hidden_layers", sect),
            num_attention_heads=heads,
            num_key_value_heads=text.get("num_key_value_heads", heads),
            head_dim=text.get("head_dim") or hidden // heads,
            rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)),
            rope_theta=float(theta),
            max_position_embeddings=need(text, "max_position_embeddings", sect),
            tie_word_embeddings=bool(tie),
            bos_token_id=text.get("bos_token_id", cfg.get("bos_token_id")),
            eos_token_id=_first(text.get("eos_token_id", cfg.get("eos_token_id"))),
            mrope_section=list(rope["mrope_section"]) if "mrope_section" in rope else None,
            mrope_interleaved=bool(rope.get("mrope_interleaved", False)),
            # transformers 5 names it num_local_experts; the public Qwen3-MoE config.json num_experts
            num_experts=(cfg.get("num_experts") or cfg.get("num_local_experts") or 0)
            if model_type == "qwen3_moe" else 0,
            num_experts_per_tok=cfg.get("num_experts_per_tok", 0) if model_type == "qwen3_moe" else 0,
            moe_intermediate_size=cfg.get("moe_intermediate_size", 0) if model_type == "qwen3_moe" else 0,
            # transformers' Qwen3MoeConfig defaults to False when the field is absent (30B-A3B sets true)
            norm_topk_prob=bool(cfg.get("norm_topk_prob", model_type != "qwen3_moe")),
            mlp_only_layers=_dense_layers(cfg, need(text, "num_hidden_layers", sect), where)
            if model_type == "qwen3_moe" else [],
            vision=vision,
        )


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
