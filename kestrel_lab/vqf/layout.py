"""Which tensors a VQF file holds, in which order, and how each is built from an HF checkpoint.

One table per architecture, computed from a ``ModelConfig`` alone (no weights): the VQF name, the
qtype, rows × cols, and the Hugging Face tensors the entry is made of. The order is the converter's
dump order and therefore the physical order of the data area (article 16-3: the big embedding first,
then the small norms, the quantized text trunk, then the vision tower).

**The build rule (one for every entry).** ``TensorSpec.sources`` lists HF tensor names. Each source
tensor, whatever its shape, is reshaped in C order to ``(-1, cols)``; the pieces are concatenated
along rows in the listed order; the result has exactly ``rows`` rows. That covers everything the
Qwen3 family needs, and no entry needs a transpose:

- a vector (a norm weight, a bias) becomes one row;
- per-layer tensors are stacked: layer 0's rows first (``attn_norm`` = L × hidden, ``q4_q`` =
  L·q_dim rows × hidden cols: PyTorch ``Linear`` weights are already (out, in), and in = cols is the
  quantization block dimension, which is what a matvec walks);
- the Conv3d patch embedding (hidden, C, T, P, P) flattens to (hidden, C·T·P·P) — a matmul weight.

Because rows are independent in every qtype (Q4_8X8L interleaves 8 rows, and every per-layer piece
has a multiple of 8 rows), a converter can quantize and write the pieces one at a time
(``VQFWriter.write_tensor_parts``) and never hold a whole stacked tensor.

Names of the text model follow the article's file (``q4_lm`` etc. keep their names whatever the
``--quant``; the entry's qtype field is authoritative). Qwen3-VL checkpoints name the text model
``model.language_model.*`` and the vision tower ``model.visual.*``; dense Qwen3 uses ``model.*``.
Attention's small tensors follow ``config.ATTENTION_TRAITS``: Qwen3 files carry ``q_norm``/``k_norm``;
Qwen2/Qwen2.5 files carry ``q_bias``/``k_bias``/``v_bias`` instead (F32, stacked per layer) and no
q/k norm.
Tied embeddings: ``q4_lm`` is then built from ``embed_tokens`` (the quantized copy of the tied
matrix, as in the article's file).

Taught in day15_2 (the name map), day15_3 (stacking) and day16_3 (the 41-entry map).
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

from kestrel_lab.config import ModelConfig
from kestrel_lab.quant import F16, F32, Q4_8X8L, Q8_0, QType, qtype as _qtype
from kestrel_lab.vqf.format import NAME_BYTES, VQFFormatError

QUANTS = ("f32", "f16", "q8_0", "q4_0", "q4_8x8l")


@dataclass(frozen=True)
class TensorSpec:
    """One directory entry of a planned file and the HF tensors it is built from. Taught in day15_2."""

    name: str
    qtype: int
    rows: int
    cols: int
    sources: tuple[str, ...] = field(default=())
    role: str = ""  # what the entry is, for people ("layer-stacked Q proj", …)

    @property
    def nbytes(self) -> int:
        return _qtype(self.qtype).nbytes(self.rows, self.cols)

    @property
    def qtype_name(self) -> str:
        return _qtype(self.qtype).name


def resolve_quant(quant: "str | QType") -> QType:
    """A conversion's ``--quant`` ("q4_0", "Q8_0", or a ``QType``) as the ``QType`` of its text matrices.

    The one place a quant name is read: everything after it (layout, planner, writer, converter,
    engine) passes the ``QType``. Taught in day17_1.
    """
    if isinstance(quant, QType):
        if quant.name.lower() in QUANTS:
            return quant
    elif isinstance(quant, str) and quant.lower() in QUANTS:
        return _qtype(quant.lower())
    raise ValueError(f"quant {quant!r}: expected one of {', '.join(QUANTS)}")


def _qtypes_for(quant: QType, cfg: ModelConfig) -> dict[str, int]:
    """qtype per role: text matrices take ``quant``; the embedding stays F16 (F32 if quant is f32);
    vision matrices are Q8_0 (the article's choice) unless the file is float (f32/f16)."""
    floaty = quant in (F32, F16)
    return {"embed": F32.id if quant is F32 else F16.id, "text": quant.id,
            "vision": quant.id if floaty else Q8_0.id, "f32": F32.id}


EXPERT_KEYS = ("per_expert", "fused")
_DENSE_FFN = re.compile(r"^q4_(gate|up|down)\.(\d+)$")
_SLICE = re.compile(r"^(.*)\[(\d+):(\d+)\]$")


def dense_ffn_name(kind: str, layer: int) -> str:
    """The VQF name of one dense layer's FFN matrix inside a Qwen3-MoE file: ``q4_gate.3``. Taught in day22_2."""
    return f"q4_{kind}.{layer}"


def split_source(src: str) -> tuple[str, int | None, int | None]:
    """A source name as (HF tensor, first row, end row): ``name[r0:r1]`` takes rows [r0, r1) of the
    tensor reshaped to ``(-1, cols)`` (a fused expert tensor's slice); a plain name takes all rows.
    Taught in day22_2."""
    m = _SLICE.match(src)
    return (m.group(1), int(m.group(2)), int(m.group(3))) if m else (src, None, None)


def _moe_ffn_specs(cfg: ModelConfig, qt: dict[str, int], prefix: str, experts: str) -> list[TensorSpec]:
    """The FFN entries of a Qwen3-MoE file (see ``plan``): router and expert stacks over the MoE layers
    only, then one gate/up/down trio per dense layer, named with its layer index."""
    if experts not in EXPERT_KEYS:
        raise ValueError(f"experts={experts!r}: expected one of {', '.join(EXPERT_KEYS)}")
    E, m, h, inter = cfg.num_experts, cfg.moe_intermediate_size, cfg.hidden_size, cfg.intermediate_size
    moe = cfg.moe_layers
    specs = []
    if moe:
        if experts == "per_expert":   # what transformers' save_pretrained and the hub's files hold
            def exp(tmpl):
                return tuple(f"{prefix}layers.{i}.mlp.experts.{e}.{tmpl}.weight" for i in moe for e in range(E))

            gate, up, down = exp("gate_proj"), exp("up_proj"), exp("down_proj")
        else:                         # transformers 5's in-memory form: gate_up (E, 2m, h), down (E, h, m)
            def gu(i, e, r0):
                return f"{prefix}layers.{i}.mlp.experts.gate_up_proj[{r0}:{r0 + m}]"

            gate = tuple(gu(i, e, e * 2 * m) for i in moe for e in range(E))
            up = tuple(gu(i, e, e * 2 * m + m) for i in moe for e in range(E))
            down = tuple(f"{prefix}layers.{i}.mlp.experts.down_proj[{e * h}:{(e + 1) * h}]"
                         for i in moe for e in range(E))
        n = len(moe)
        specs += [
            TensorSpec("moe_router", qt["f32"], n * E, h, tuple(f"{prefix}layers.{i}.mlp.gate.weight" for i in moe),
                       "expert router of each MoE layer (F32)"),
            TensorSpec("q4_gate_exps", qt["text"], n * E * m, h, gate, "experts' gate: MoE layer, then expert"),
            TensorSpec("q4_up_exps", qt["text"], n * E * m, h, up, "experts' up: MoE layer, then expert"),
            TensorSpec("q4_down_exps", qt["text"], n * E * h, m, down, "experts' down: MoE layer, then expert"),
        ]
    for i in cfg.dense_layers:
        p = f"{prefix}layers.{i}.mlp."
        specs += [
            TensorSpec(dense_ffn_name("gate", i), qt["text"], inter, h, (p + "gate_proj.weight",),
                       f"dense FFN gate, layer {i}"),
            TensorSpec(dense_ffn_name("up", i), qt["text"], inter, h, (p + "up_proj.weight",),
                       f"dense FFN up, layer {i}"),
            TensorSpec(dense_ffn_name("down", i), qt["text"], h, inter, (p + "down_proj.weight",),
                       f"dense FFN down, layer {i}"),
        ]
    return specs


def config_for_directory(config: ModelConfig, names) -> ModelConfig:
    """The configuration a file's directory completes: a Qwen3-MoE file's dense layers are the layers
    that have ``q4_gate.{i}`` entries (no header bytes record them). Other architectures unchanged.
    Taught in day22_2."""
    if config.arch != "qwen3_moe":
        return config
    dense = sorted({int(m.group(2)) for n in names if (m := _DENSE_FFN.match(n)) and m.group(1) == "gate"})
    return dataclasses.replace(config, mlp_only_layers=dense, decoder_sparse_step=1)


def expert_runs(spec: TensorSpec, config: ModelConfig) -> list[tuple[int, int, int, int]]:
    """(MoE layer, expert, first row, end row) of every expert's run inside a stacked expert entry:
    MoE layer major, expert minor, each expert's matrix one contiguous run. Taught in day22_2."""
    per = {"q4_gate_exps": config.moe_intermediate_size, "q4_up_exps": config.moe_intermediate_size,
           "q4_down_exps": config.hidden_size}[spec.name]
    E = config.num_experts
    return [(i, e, (k * E + e) * per, (k * E + e + 1) * per)
            for k, i in enumerate(config.moe_layers) for e in range(E)]


def _text_specs(cfg: ModelConfig, qt: dict[str, int], prefix: str, lm_head: str,
                experts: str = "per_expert") -> list[TensorSpec]:
    L, h, hd = cfg.num_hidden_layers, cfg.hidden_size, cfg.head_dim

    def lay(tmpl):
        return tuple(f"{prefix}layers.{i}.{tmpl}" for i in range(L))

    embed = f"{prefix}embed_tokens.weight"
    specs = [
        TensorSpec("token_embed", qt["embed"], cfg.vocab_size, h, (embed,), "token embedding"),
        TensorSpec("final_norm", qt["f32"], 1, h, (f"{prefix}norm.weight",), "final RMSNorm"),
        TensorSpec("attn_norm", qt["f32"], L, h, lay("input_layernorm.weight"), "RMSNorm before attention, per layer"),
        TensorSpec("ffn_norm", qt["f32"], L, h, lay("post_attention_layernorm.weight"), "RMSNorm before the FFN"),
    ]
    traits = cfg.attention            # config.ATTENTION_TRAITS: which small attention tensors exist
    if traits.qk_norm:
        specs += [
            TensorSpec("q_norm", qt["f32"], L, hd, lay("self_attn.q_norm.weight"), "per-head RMSNorm of q"),
            TensorSpec("k_norm", qt["f32"], L, hd, lay("self_attn.k_norm.weight"), "per-head RMSNorm of k"),
        ]
    if traits.qkv_bias:
        specs += [
            TensorSpec("q_bias", qt["f32"], L, cfg.q_dim, lay("self_attn.q_proj.bias"),
                       "Q projection bias, per layer"),
            TensorSpec("k_bias", qt["f32"], L, cfg.kv_dim, lay("self_attn.k_proj.bias"),
                       "K projection bias, per layer"),
            TensorSpec("v_bias", qt["f32"], L, cfg.kv_dim, lay("self_attn.v_proj.bias"),
                       "V projection bias, per layer"),
        ]
    specs += [
        TensorSpec("q4_q", qt["text"], L * cfg.q_dim, h, lay("self_attn.q_proj.weight"), "Q projection"),
        TensorSpec("q4_k", qt["text"], L * cfg.kv_dim, h, lay("self_attn.k_proj.weight"), "K projection"),
        TensorSpec("q4_v", qt["text"], L * cfg.kv_dim, h, lay("self_attn.v_proj.weight"), "V projection"),
        TensorSpec("q4_o", qt["text"], L * h, cfg.q_dim, lay("self_attn.o_proj.weight"), "output projection"),
    ]
    if cfg.arch == "qwen3_moe":
        specs += _moe_ffn_specs(cfg, qt, prefix, experts)
    else:
        inter = cfg.intermediate_size
        specs += [
            TensorSpec("q4_gate", qt["text"], L * inter, h, lay("mlp.gate_proj.weight"), "FFN gate"),
            TensorSpec("q4_up", qt["text"], L * inter, h, lay("mlp.up_proj.weight"), "FFN up"),
            TensorSpec("q4_down", qt["text"], L * h, inter, lay("mlp.down_proj.weight"), "FFN down"),
        ]
    lm_src = embed if cfg.tie_word_embeddings else lm_head
    specs.append(TensorSpec("q4_lm", qt["text"], cfg.vocab_size, h, (lm_src,),
                            "LM head" + (" (quantized copy of the tied embedding)" if cfg.tie_word_embeddings else "")))
    return specs


def _vision_specs(cfg: ModelConfig, qt: dict[str, int]) -> list[TensorSpec]:
    v = cfg.vision
    D, vh, vi, md, out = v.depth, v.hidden_size, v.intermediate_size, v.merged_dim, v.out_hidden_size
    p = "model.visual."

    def blk(tmpl):
        return tuple(f"{p}blocks.{i}.{tmpl}" for i in range(D))

    ds = [f"{p}deepstack_merger_list.{k}." for k in range(len(v.deepstack_visual_indexes))]
    nds = len(ds)

    def dsl(tmpl):
        return tuple(d + tmpl for d in ds)

    f32, vq = qt["f32"], qt["vision"]
    specs = [
        TensorSpec("v_q8_qkv", vq, D * 3 * vh, vh, blk("attn.qkv.weight"), "vision fused QKV"),
        TensorSpec("v_q8_proj", vq, D * vh, vh, blk("attn.proj.weight"), "vision attention output"),
        TensorSpec("v_q8_fc1", vq, D * vi, vh, blk("mlp.linear_fc1.weight"), "vision MLP up"),
        TensorSpec("v_q8_fc2", vq, D * vh, vi, blk("mlp.linear_fc2.weight"), "vision MLP down"),
        TensorSpec("v_patch", f32, vh, v.patch_dim, (f"{p}patch_embed.proj.weight",),
                   "patch embedding: Conv3d (C,T,P,P) flattened to a matmul"),
        TensorSpec("v_patch_b", f32, 1, vh, (f"{p}patch_embed.proj.bias",), "patch embedding bias"),
        TensorSpec("v_pos", f32, v.num_position_embeddings, vh, (f"{p}pos_embed.weight",),
                   "learned position embedding (interpolated at run time)"),
        TensorSpec("v_qkv_b", f32, D, 3 * vh, blk("attn.qkv.bias"), "QKV bias, per block"),
        TensorSpec("v_proj_b", f32, D, vh, blk("attn.proj.bias"), "attention output bias"),
        TensorSpec("v_fc1_b", f32, D, vi, blk("mlp.linear_fc1.bias"), "MLP up bias"),
        TensorSpec("v_fc2_b", f32, D, vh, blk("mlp.linear_fc2.bias"), "MLP down bias"),
        TensorSpec("v_norm1", f32, D, vh, blk("norm1.weight"), "LayerNorm before attention: weight"),
        TensorSpec("v_norm1_b", f32, D, vh, blk("norm1.bias"), "LayerNorm before attention: bias"),
        TensorSpec("v_norm2", f32, D, vh, blk("norm2.weight"), "LayerNorm before the MLP: weight"),
        TensorSpec("v_norm2_b", f32, D, vh, blk("norm2.bias"), "LayerNorm before the MLP: bias"),
        TensorSpec("v_merger_norm", f32, 1, vh, (f"{p}merger.norm.weight",), "merger LayerNorm weight (per patch)"),
        TensorSpec("v_merger_norm_b", f32, 1, vh, (f"{p}merger.norm.bias",), "merger LayerNorm bias"),
        TensorSpec("v_merger_fc1", f32, md, md, (f"{p}merger.linear_fc1.weight",), "merger fc1 (2×2 patches)"),
        TensorSpec("v_merger_fc1_b", f32, 1, md, (f"{p}merger.linear_fc1.bias",), "merger fc1 bias"),
        TensorSpec("v_merger_fc2", f32, out, md, (f"{p}merger.linear_fc2.weight",), "merger fc2 → text width"),
        TensorSpec("v_merger_fc2_b", f32, 1, out, (f"{p}merger.linear_fc2.bias",), "merger fc2 bias"),
    ]
    if nds:
        specs += [
            TensorSpec("v_ds_norm", f32, nds, md, dsl("norm.weight"),
                       "DeepStack mergers' LayerNorm weight (post-shuffle)"),
            TensorSpec("v_ds_norm_b", f32, nds, md, dsl("norm.bias"), "DeepStack LayerNorm bias"),
            TensorSpec("v_ds_fc1", f32, nds * md, md, dsl("linear_fc1.weight"), "DeepStack fc1, mergers stacked"),
            TensorSpec("v_ds_fc1_b", f32, nds, md, dsl("linear_fc1.bias"), "DeepStack fc1 bias"),
            TensorSpec("v_ds_fc2", f32, nds * out, md, dsl("linear_fc2.weight"), "DeepStack fc2"),
            TensorSpec("v_ds_fc2_b", f32, nds, out, dsl("linear_fc2.bias"), "DeepStack fc2 bias"),
        ]
    return specs


def plan(config: ModelConfig, quant: "str | QType" = "q4_0", experts: str = "per_expert") -> list[TensorSpec]:
    """The tensors of ``config``'s VQF file in dump order (names, qtypes, shapes, HF sources).

    Qwen3-VL: 14 text + 4 vision Q8_0 + 11 vision F32 + 6 merger + 6 DeepStack entries (41 for the
    2B model). Dense Qwen3: the 14 text entries. Qwen2/Qwen2.5: 15 (``q_bias``/``k_bias``/``v_bias``
    instead of ``q_norm``/``k_norm``). Qwen3-MoE: the router and the three expert
    matrices replace gate/up/down: ``moe_router`` (F32, MoE layers × experts rows), ``q4_gate_exps`` /
    ``q4_up_exps`` (MoE layers × experts × moe_intermediate rows of hidden) and ``q4_down_exps`` (MoE
    layers × experts × hidden rows of moe_intermediate), MoE layer major, expert minor, so each
    expert's gate, up and down matrix is one contiguous run (``expert_runs``); a dense layer of an
    MoE model (``mlp_only_layers``, ``decoder_sparse_step``) gets its own ``q4_gate.{i}``,
    ``q4_up.{i}``, ``q4_down.{i}`` instead, and the stacks skip it. ``experts`` says how the
    checkpoint stores experts: "per_expert" (``mlp.experts.{e}.gate_proj.weight``…, what
    ``save_pretrained`` writes) or "fused" (``mlp.experts.gate_up_proj`` / ``down_proj``, sliced by
    rows); the file is the same. Taught in day16_3 and day22_2.
    """
    qt = _qtypes_for(resolve_quant(quant), config)
    if config.arch == "qwen3_vl":
        specs = _text_specs(config, qt, "model.language_model.", "lm_head.weight") + _vision_specs(config, qt)
    else:
        specs = _text_specs(config, qt, "model.", "lm_head.weight", experts)
    for s in specs:
        if len(s.name.encode()) >= NAME_BYTES:
            raise VQFFormatError(f"tensor name {s.name!r} does not fit name[{NAME_BYTES}]")
        if s.rows >= 1 << 32 or s.cols >= 1 << 32:
            raise VQFFormatError(f"{s.name}: {s.rows}×{s.cols} does not fit the directory's u32 rows/cols")
        try:
            s.nbytes  # raises if cols is not a multiple of the block or rows of the interleave
        except ValueError:
            raise VQFFormatError(shape_refusal(s, config)) from None
    return specs


def _dims(config: ModelConfig) -> dict[str, int]:
    """The configuration's widths by the config.json field (or product) that sets them."""
    v = config.vision
    out = {"hidden_size": config.hidden_size, "intermediate_size": config.intermediate_size,
           "num_attention_heads × head_dim": config.q_dim, "num_key_value_heads × head_dim": config.kv_dim,
           "moe_intermediate_size": config.moe_intermediate_size, "vocab_size": config.vocab_size}
    if v is not None:
        out.update({"vision_config.hidden_size": v.hidden_size, "vision_config.intermediate_size": v.intermediate_size,
                    "vision_config.hidden_size × spatial_merge_size²": v.merged_dim})
    return out


def shape_refusal(spec: TensorSpec, config: ModelConfig) -> str:
    """Why ``spec``'s quantization cannot hold its shape: the entry, its shape and sources, the block rule and
    the config.json field behind the width, and what can. Taught in day17_1."""
    q = _qtype(spec.qtype)
    fields = [k for k, n in _dims(config).items() if n in (spec.cols, spec.rows)]
    src = spec.sources[0] + (f" and {len(spec.sources) - 1} more" if len(spec.sources) > 1 else "")
    if spec.cols % q.block_size:
        rule = f"{q.name} stores each row in blocks of {q.block_size} values; cols = {spec.cols:,} is not a multiple"
        dim, what, fix = spec.cols, "the width", "F32 and F16 hold any width: convert with --quant f32 or f16"
    else:
        rule = f"{q.name} interleaves rows {q.row_multiple} at a time; rows = {spec.rows:,} is not a multiple"
        dim, what, fix = spec.rows, "the row count", "q4_0, q8_0, f16 and f32 take any row count"
    by = next((k for k in fields if _dims(config)[k] == dim), None)
    return (f"{q.name} cannot hold entry {spec.name} ({spec.rows:,} × {spec.cols:,}, from {src}): {rule}"
            + (f" ({what} is config.json's {by})" if by else "") + f"; {fix}")


def text_specs(config: ModelConfig, quant: "str | QType" = "f32") -> list[TensorSpec]:
    """The text model's entries of ``config``'s file (what the engine binds; shapes as ``plan``).

    For Qwen3-VL these are the language model's entries without the vision tower. Taught in day12_2.
    """
    prefix = "model.language_model." if config.arch == "qwen3_vl" else "model."
    return _text_specs(config, _qtypes_for(resolve_quant(quant), config), prefix, "lm_head.weight")


def vision_specs(config: ModelConfig, quant: "str | QType" = "q4_0") -> list[TensorSpec]:
    """The vision tower's entries of a Qwen3-VL file (what ``vision.tower`` binds; shapes as ``plan``).

    Empty for a model without a vision tower. Taught in day20_1.
    """
    if config.vision is None:
        return []
    return _vision_specs(config, _qtypes_for(resolve_quant(quant), config))


def has_repacked(specs: list[TensorSpec]) -> bool:
    """True if some entry is stored as Q4_8X8L (the header's REPACKED_8X8 flag). Taught in day16_1."""
    return any(s.qtype == Q4_8X8L.id for s in specs)


def source_rows(spec: TensorSpec, shapes: dict[str, tuple[int, ...]]) -> list[int]:
    """Rows each source contributes under the build rule; checks they add up to ``spec.rows``.

    The one statement of the build rule's arithmetic (the converter checks a checkpoint with it).
    ``shapes`` maps HF names to shapes (from a safetensors header). Raises ``KeyError`` for a missing
    source and ``ValueError`` naming the entry and the tensor whose element count does not divide into
    rows of ``cols`` or whose rows do not add up. Taught in day15_3.
    """
    out = []
    for src in spec.sources:
        name, r0, r1 = split_source(src)
        if name not in shapes:
            raise KeyError(f"{spec.name}: source tensor {name!r} is not in the checkpoint")
        n = 1
        for d in shapes[name]:
            n *= int(d)
        if n % spec.cols:
            raise ValueError(f"tensor {name!r} of shape {list(shapes[name])} does not split into rows of "
                             f"{spec.cols} (entry {spec.name}, {spec.qtype_name} {spec.rows}×{spec.cols})")
        if r0 is not None and not r0 < r1 <= n // spec.cols:
            raise ValueError(f"tensor {name!r} of shape {list(shapes[name])} has {n // spec.cols} rows of "
                             f"{spec.cols}; entry {spec.name} needs rows [{r0}, {r1})")
        out.append(n // spec.cols if r0 is None else r1 - r0)
    if sum(out) != spec.rows:
        raise ValueError(f"entry {spec.name}: its sources give {sum(out)} rows of {spec.cols}, the plan needs "
                         f"{spec.rows} (check config.json against the weights)")
    return out


__all__ = ["TensorSpec", "plan", "shape_refusal",
           "text_specs", "vision_specs", "resolve_quant", "source_rows", "has_repacked",
           "QUANTS", "EXPERT_KEYS", "dense_ffn_name", "split_source", "config_for_directory", "expert_runs"]
