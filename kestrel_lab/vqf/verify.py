"""What ``kestrel-lab vqf verify`` checks beyond the checksum: the header's configuration.

The FNV-1a 64 of a plain file covers the directory and the data area, not the header (the board's format,
kept): a flipped bit in the model configuration goes unnoticed by the checksum. The reader already checks
the header against the directory — every entry the configuration implies must be there with the implied
shape — which confirms every field that sets a shape. The fields that change the math without changing a
shape (``UNCONFIRMED``) can only be checked against their source: ``compare_config`` compares the header's
``ModelConfig`` with a config.json field by field and names each difference with its header field and
offset. Taught in day24_3.
"""
from __future__ import annotations

import dataclasses

from kestrel_lab.config import ModelConfig
from kestrel_lab.vqf import format as F

#: Header fields whose value no directory entry confirms (they change the math, not a shape).
UNCONFIRMED = ("rms_norm_eps", "rope_theta", "max_position_embeddings", "bos_token_id", "eos_token_id",
               "model_bits (norm_topk_prob, mrope_interleaved)", "mrope_section", "num_experts_per_tok",
               "vision_hidden_act", "rope_type and the RoPE block")

_BITS = {"tie_word_embeddings": 0, "mrope_interleaved": 1, "norm_topk_prob": 2}


def _header_field(name: str) -> str:
    if name in _BITS:
        return f"model_bits bit {_BITS[name]} ({name}) at offset {F.HEADER_FIELD['model_bits'].offset}"
    if name == "rope_scaling":
        return (f"rope_type at offset {F.HEADER_FIELD['rope_type'].offset} and the RoPE block "
                f"({F.ROPE_OFFSET}..{F.ROPE_END})")
    if name == "vision":
        return f"the vision fields ({F.HEADER_FIELD['vision_depth'].offset}..{F.HEADER_FIELD['dir_offset'].offset})"
    field = F.header_field_of(name)
    return f"{field} at offset {F.HEADER_FIELD[field].offset}"


def compare_config(header: ModelConfig, config_json) -> list[str]:
    """Each field where the header's configuration differs from ``config_json``'s (a path or folder), as
    "header field at offset N: header X, config.json Y" (``kestrel-lab vqf verify --config``)."""
    want = ModelConfig.from_hf(config_json)
    if want.arch == "qwen3_moe":   # a file records the dense layers only as its directory's entries
        want = dataclasses.replace(want, decoder_sparse_step=1)
    out = []
    for f in dataclasses.fields(ModelConfig):
        if not f.compare:
            continue
        a, b = getattr(header, f.name), getattr(want, f.name)
        if a != b:
            out.append(f"{_header_field(f.name)}: header {a!r}, config.json {b!r}")
    return out


__all__ = ["UNCONFIRMED", "compare_config"]
