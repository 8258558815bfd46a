import json

import pytest

from kestrel_lab.config import ModelConfig
from kestrel_lab.paths import configs_dir, tiny_poem_dir


def test_public_configs_parse_with_known_sizes():
    dense = ModelConfig.from_hf(configs_dir() / "qwen3-0.6b.config.json")
    assert (dense.hidden_size, dense.num_hidden_layers, dense.q_dim, dense.kv_dim) == (1024, 28, 2048, 1024)
    assert sum(dense.param_counts().values()) == 596_049_920
    vl = ModelConfig.from_hf(configs_dir() / "qwen3-vl-2b-instruct.config.json")
    assert vl.arch == "qwen3_vl" and vl.rope_theta == 5e6 and vl.mrope_section == [24, 20, 20]
    assert vl.vision.patch_dim == 1536 and vl.vision.merged_dim == 4096
    # the article's vision bytes: F32 4,252,672 + merger 25,174,016 + DeepStack 75,540,480 floats
    # plus the Q8_0 matrices' 301,989,888 weights
    assert vl.param_counts()["vision"] == 4_252_672 + 25_174_016 + 75_540_480 + 301_989_888
    moe = ModelConfig.from_hf(configs_dir() / "qwen3-30b-a3b.config.json")
    assert moe.num_experts == 128 and round(sum(moe.param_counts().values()) / 1e9, 1) == 30.5


def test_rope_styles_agree(tmp_path):
    new = ModelConfig.from_hf(tiny_poem_dir())
    assert new.rope_theta == 1e6 and new.tie_word_embeddings
    old = json.loads((tiny_poem_dir() / "config.json").read_text())
    old["rope_theta"] = old.pop("rope_parameters")["rope_theta"]
    old["rope_scaling"] = None
    assert ModelConfig.from_hf(old) == new


def test_errors_name_file_and_field(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"model_type": "qwen3", "hidden_size": 8}))
    with pytest.raises(ValueError, match=r"config\.json: field 'vocab_size': is missing"):
        ModelConfig.from_hf(tmp_path)
    cfg = json.loads((configs_dir() / "qwen3-0.6b.config.json").read_text())
    del cfg["rope_theta"]
    p.write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"config\.json: field 'rope_parameters\.rope_theta': is missing "
                                         r"\(nor is 'rope_theta' set\)"):
        ModelConfig.from_hf(tmp_path)
    p.write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError, match="model_type"):
        ModelConfig.from_hf(p)


def test_moe_expert_count_in_both_spellings():
    cfg = json.loads((configs_dir() / "qwen3-30b-a3b.config.json").read_text())
    cfg["num_local_experts"] = cfg.pop("num_experts")  # transformers 5's spelling
    assert ModelConfig.from_hf(cfg).num_experts == 128
