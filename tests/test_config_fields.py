"""The config corpus: config.json files edited the way people edit them, each read through the one table
(``kestrel_lab.config_fields``). Every case ends in a clear ``ConfigError`` naming the file, the key (with its
line) and what is expected or implemented — or in a config that runs as transformers runs it (the rope
cases are compared with transformers in test_rope_scaling). Types, bounds, every field that changes the
math, unknown keys; and the table itself: each row's bound is the limits table's, the spec page shows it."""
from __future__ import annotations

import json
import re
import time

import pytest

from kestrel_lab import config_fields as CF
from kestrel_lab import limits, tiny_model
from kestrel_lab.config import ConfigError, ModelConfig


def _doc(arch: str) -> dict:
    return tiny_model.default_config(arch)


def _set(doc: dict, path: str, value):
    node, keys = doc, path.split(".")
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    if value is _DEL:
        node.pop(keys[-1], None)
    else:
        node[keys[-1]] = value
    return doc


_DEL = object()

# (arch, JSON path, value, the error's field, what the message says)
REFUSED = [
    # ---- types: strings for numbers, numbers for booleans (transformers 5 refuses these too)
    ("qwen3_moe", "num_experts", "7", "num_experts", r"expected an integer, got a string \('7'\)"),
    ("qwen3", "num_hidden_layers", "3", "num_hidden_layers", r"expected an integer, got a string"),
    ("qwen3", "hidden_size", 64.0, "hidden_size", r"expected an integer, got float 64\.0"),
    ("qwen3_moe", "norm_topk_prob", "false", "norm_topk_prob", r"expected true or false, got a string \('false'\)"),
    ("qwen3_moe", "norm_topk_prob", 0, "norm_topk_prob", r"expected true or false"),
    ("qwen3", "rms_norm_eps", "1e-6", "rms_norm_eps", r"expected a number, got a string"),
    ("qwen3", "tie_word_embeddings", "yes", "tie_word_embeddings", r"expected true or false"),
    ("qwen3_vl", "text_config.rope_parameters.mrope_section", "24,20,20", "text_config.rope_parameters.mrope_section",
     r"expected a list of integers"),
    ("qwen3_moe", "mlp_only_layers", [0, "1"], "mlp_only_layers", r"expected a list of integers"),
    ("qwen3", "eos_token_id", "151645", "eos_token_id", r"expected a token id"),
    # ---- bounds (the limits table), checked before anything loops over them
    ("qwen3_moe", "num_hidden_layers", 10 ** 10, "num_hidden_layers",
     r"10,000,000,000: expected an integer in \[1, 1,024\]"),
    ("qwen3", "num_hidden_layers", 0, "num_hidden_layers", r"expected an integer in \[1, 1,024\]"),
    ("qwen3", "rope_parameters.rope_theta", 0.5, "rope_parameters.rope_theta",
     r"expected a finite number in \[10, 1e\+12\]"),
    ("qwen3_moe", "mlp_only_layers", [2 ** 40], "mlp_only_layers", r"expected an integer in \[0, 1,023\]"),
    ("qwen3", "rope_parameters", {"rope_type": "yarn", "factor": 0.5, "rope_theta": 1e6}, "rope_parameters.factor",
     r"0\.5: expected a finite number in \[1, 1024\]"),
    ("qwen3", "rope_parameters", {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6, "beta_fast": -3},
     "rope_parameters.beta_fast", r"-3: expected a finite number"),
    # ---- fields that change the math: implemented values only
    ("qwen3", "hidden_act", "gelu", "hidden_act", r"is 'gelu': not implemented .*SiLU.*implemented: 'silu', 'swish'"),
    ("qwen3", "attention_bias", True, "attention_bias", r"is True: not implemented .*q, k, v and o"),
    ("qwen3", "use_sliding_window", True, "use_sliding_window", r"sliding-window attention is not supported"),
    ("qwen3", "layer_types", ["full_attention", "sliding_attention"], "layer_types",
     r"is 'sliding_attention' \(item 1\): not implemented"),
    ("qwen3", "rope_parameters.partial_rotary_factor", 0.5, "rope_parameters.partial_rotary_factor",
     r"is 0\.5: not implemented .*whole head"),
    ("qwen3", "rope_parameters.rope_type", "dynamic", "rope_parameters.rope_type", r"is 'dynamic' \(dynamic NTK"),
    ("qwen3", "rope_parameters", {"rope_type": "linear", "rope_theta": 1e6}, "rope_parameters.factor", r"is missing"),
    ("qwen3", "rope_scaling", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
     "rope_scaling", r"is set beside rope_parameters: transformers 5 then takes rope_scaling alone"),
    ("qwen3_vl", "text_config.rope_parameters.mrope_section", [8, 8], "text_config.rope_parameters.mrope_section",
     r"\[8, 8\]: expected exactly 3 sections \(t, h, w\) for qwen3_vl"),
    ("qwen3_vl", "vision_config.hidden_act", "relu", "vision_config.hidden_act",
     r"is 'relu': not implemented .*tanh GELU"),
    ("qwen3_vl", "vision_config.rope_parameters.rope_theta", 1e5, "vision_config.rope_parameters.rope_theta",
     r"not implemented .*10,000"),
    ("qwen3_vl", "image_token_id", 5, "image_token_id", r"is 5: not implemented .*<\|image_pad\|>"),
    ("qwen3_vl", "vision_config.depth", _DEL, "vision_config.depth", r"is missing"),
    ("qwen3", "model_type", "llama", "model_type", r"is 'llama': not implemented — supported: Qwen3"),
    # ---- absent keys whose transformers default is a number copied from another model: never guessed
    ("qwen3", "num_key_value_heads", _DEL, "num_key_value_heads", r"is missing; .*class default, 32 or 4"),
    ("qwen3", "head_dim", _DEL, "head_dim", r"is missing; .*transformers would take 128"),
    ("qwen3_vl", "vision_config.deepstack_visual_indexes", _DEL, "vision_config.deepstack_visual_indexes",
     r"is missing; .*\[8, 16, 24\]"),
    ("qwen3_vl", "text_config.rope_parameters.mrope_section", _DEL, "text_config.rope_parameters.mrope_section",
     r"is missing; .*\[24, 20, 20\]"),
    # ---- explicit nulls where transformers refuses one (or, for truncate, would read it as false)
    ("qwen3", "tie_word_embeddings", None, "tie_word_embeddings", r"is null: transformers refuses a null here"),
    ("qwen3_moe", "norm_topk_prob", None, "norm_topk_prob", r"is null"),
    ("qwen3", "rope_parameters", {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6, "truncate": None},
     "rope_parameters.truncate", r"is null"),
]


@pytest.mark.parametrize("arch, path, value, field, why", REFUSED,
                         ids=[f"{c[0]}:{c[1]}={str(c[2])[:20]}" for c in REFUSED])
def test_every_case_is_refused_naming_file_key_and_line(arch, path, value, field, why, tmp_path):
    doc = _set(_doc(arch), path, value)
    p = tmp_path / "config.json"
    p.write_text(json.dumps(doc, indent=2))
    t0 = time.perf_counter()
    with pytest.raises(ConfigError) as err:
        ModelConfig.from_hf(tmp_path)
    assert time.perf_counter() - t0 < 1.0                    # 10^10 layers: refused before any loop
    msg = str(err.value)
    located = r" at line \d+ \(byte \d+\)" if "missing" not in why else ""   # an absent key has no line
    assert re.match(rf"{re.escape(str(p))}: field '{re.escape(field)}'{located}: .*{why}", msg), msg


def test_the_same_refusals_from_a_dict_name_the_key():
    doc = _set(_doc("qwen3_moe"), "num_experts", "7")
    with pytest.raises(ConfigError, match=r"^config: field 'num_experts': expected an integer"):
        ModelConfig.from_hf(doc)


# (arch, JSON path, value, ModelConfig check) — accepted, and what they mean
ACCEPTED = [
    ("qwen3", "rope_parameters", {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
     lambda c: c.rope_scaling.rope_type == "linear" and c.rope_scaling.factor == 8.0),
    ("qwen3", "rope_parameters", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768,
                                  "rope_theta": 1e6},
     lambda c: c.rope_scaling.rope_type == "yarn" and round(c.rope_scaling.attention_factor, 6) == 1.138629),
    ("qwen3", "rope_parameters", {"type": "default", "rope_theta": 1e6}, lambda c: c.rope_scaling is None),
    ("qwen3", "hidden_act", "swish", lambda c: True),                   # transformers' ACT2FN: nn.SiLU
    ("qwen3_moe", "norm_topk_prob", False, lambda c: c.norm_topk_prob is False),
    ("qwen3_moe", "norm_topk_prob", _DEL, lambda c: c.norm_topk_prob is False),     # transformers' default
    ("qwen3_moe", "decoder_sparse_step", 2, lambda c: c.moe_layers == [1] and c.mlp_only_layers == [0]),
    ("qwen3", "eos_token_id", [151645, 151643], lambda c: c.eos_token_id == 151645),
    # Qwen2Config has no attention_bias (its q/k/v always have a bias, o never): not read, and listed as such
    ("qwen2", "attention_bias", True, lambda c: c.ignored == ("attention_bias",)),
    ("qwen2", "head_dim", _DEL, lambda c: c.head_dim == 64 // 4),        # Qwen2 derives it, as transformers does
    ("qwen3", "bos_token_id", None, lambda c: c.bos_token_id is None),
    ("qwen3", "rope_parameters", {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6, "beta_fast": None},
     lambda c: c.rope_scaling is not None),                             # transformers: `beta_fast or 32`
]


@pytest.mark.parametrize("arch, path, value, check", ACCEPTED,
                         ids=[f"{c[0]}:{c[1]}={str(c[2])[:24]}" for c in ACCEPTED])
def test_accepted_values_mean_what_transformers_means(arch, path, value, check):
    cfg = ModelConfig.from_hf(_set(_doc(arch), path, value))
    assert check(cfg)
    assert cfg.ignored == () or arch == "qwen2"


def test_unknown_keys_are_listed_never_guessed_at(tmp_path):
    doc = _doc("qwen3_vl")
    doc["my_note"] = "converted by hand"
    doc["text_config"]["rope_parameters"]["factor"] = 8.0        # the default rope type reads no factor
    doc["text_config"]["use_flash"] = True
    doc["vision_config"]["window_size"] = 112
    cfg = ModelConfig.from_hf(doc)
    assert cfg.ignored == ("my_note", "text_config.rope_parameters.factor", "text_config.use_flash",
                           "vision_config.window_size")
    assert cfg.rope_scaling is None and cfg == ModelConfig.from_hf(_doc("qwen3_vl"))
    assert "ignored" not in cfg.to_dict()
    for arch in ("qwen3", "qwen3_moe", "qwen2"):               # what transformers itself writes: nothing left over
        assert ModelConfig.from_hf(_doc(arch)).ignored == ()


def test_convert_reports_the_unread_keys_once(tmp_path, capsys):
    from kestrel_lab import models
    from kestrel_lab.cli import main

    d = models.hf_checkpoint(arch="qwen3", overrides={"vocab_size": 256, "bos_token_id": 1, "eos_token_id": 2,
                                                      "my_note": 1, "flash": True})
    assert main(["convert", str(d), "-o", str(tmp_path / "m.vqf"), "--quant", "f32", "--no-hash"]) == 0
    err = capsys.readouterr().err
    assert err.count("config.json: keys not read") == 1 and "flash, my_note" in err


def test_the_table_and_the_bounds_agree():
    """Every row that sets a ModelConfig field and has a bound uses the limits table's; every row names a
    section, a JSON kind and a use; every refused value has a reason; the spec page shows every row."""
    from kestrel_lab.paths import REPO_ROOT

    page = (REPO_ROOT / "book" / "formats" / "vqf.md").read_text(encoding="utf-8")
    for f in CF.FIELDS:
        assert f.section in ("top", "text", "rope", "vision", "vision_rope", "any"), f
        assert f.kind in CF.KIND_TEXT and f.use in ("shape", "math", "run", "none"), f
        assert not f.allowed or f.refuse, f"{f.id}: refused values need a reason"
        assert f"`{f.key}`" in page, f"{f.key} is not on the spec page"
        if f.use in ("shape",) and f.kind == "int":
            assert f.target in limits.BOUND, f"{f.id}: a shape field needs a bound"
    from kestrel_lab.vision import prompt as VP

    assert (CF.IMAGE_PAD, CF.VIDEO_PAD, CF.VISION_START, CF.VISION_END) == (
        VP.IMAGE_PAD, VP.VIDEO_PAD, VP.VISION_START, VP.VISION_END)
