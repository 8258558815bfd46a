"""Tiny random checkpoints: deterministic, and exactly what transformers itself saves and loads."""
import json

import numpy as np
import pytest

from kestrel_lab.cli import main as cli_main
from kestrel_lab.config import ModelConfig
from kestrel_lab.safetensors import open_checkpoint
from kestrel_lab.tiny_model import build_config, hf_tensor_shapes, make_tiny_model, to_hf4_style

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SMALL_VOCAB = {"vocab_size": 1024}


def _hf_class(arch):
    return transformers.Qwen3ForCausalLM if arch == "qwen3" else transformers.Qwen3VLForConditionalGeneration


def _small(arch, **text):
    over = dict(SMALL_VOCAB, **text)
    return over if arch == "qwen3" else {"text_config": over}


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path):
    a = make_tiny_model(tmp_path / "a", "qwen3_vl", 11, _small("qwen3_vl"))
    b = make_tiny_model(tmp_path / "b", "qwen3_vl", 11, _small("qwen3_vl"))
    c = make_tiny_model(tmp_path / "c", "qwen3_vl", 12, _small("qwen3_vl"))
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    assert (a / "config.json").read_text() == (b / "config.json").read_text()
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()
    # a tensor does not depend on the others' shapes: change the vision tower, the text stays
    d = make_tiny_model(tmp_path / "d", "qwen3_vl", 11, {**_small("qwen3_vl"), "vision_config": {"depth": 3}})
    with open_checkpoint(a) as ca, open_checkpoint(d) as cd:
        name = "model.language_model.layers.1.mlp.down_proj.weight"
        assert np.array_equal(ca.raw(name), cd.raw(name))


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_vl"])
def test_default_model_loads_in_transformers_with_our_values(tmp_path, arch):
    folder = make_tiny_model(tmp_path / arch, arch, seed=3)       # default shapes: the real vocabulary
    model, info = _hf_class(arch).from_pretrained(folder, dtype=torch.float32, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    sd = model.state_dict()
    with open_checkpoint(folder) as ck:
        assert set(sd) - set(ck.keys()) == {"lm_head.weight"}    # tied: transformers does not save it either
        for name in ck.keys():
            np.testing.assert_array_equal(sd[name].numpy(), ck.f32(name), err_msg=name)
    cfg = model.config.text_config if arch == "qwen3_vl" else model.config
    assert cfg.vocab_size == 151936 and cfg.hidden_size == 64 and cfg.num_hidden_layers == 2
    assert cfg.num_attention_heads == 4 and cfg.num_key_value_heads == 2 and cfg.head_dim == 32
    assert model.config.tie_word_embeddings
    with torch.no_grad():
        logits = (model(input_ids=torch.tensor([[151643, 9707, 11, 1879]])).logits)
    assert logits.shape == (1, 4, 151936) and torch.isfinite(logits).all()
    assert float(logits.std()) > 0.5    # the embedding scale gives logits a usable spread


@pytest.mark.parametrize("arch, over", [
    ("qwen3", {"tie_word_embeddings": False}),
    ("qwen3", {"attention_bias": True}),
    ("qwen3_vl", {"tie_word_embeddings": False, "vision_config": {"deepstack_visual_indexes": [0]}}),
    ("qwen3_vl", {"vision_config": {"depth": 3, "deepstack_visual_indexes": [0, 1, 2], "hidden_size": 96,
                                    "num_heads": 3}}),
])
def test_tensor_list_equals_what_transformers_saves(tmp_path, arch, over):
    """hf_tensor_shapes against the state dict of the transformers model built from the same config,
    and against the file transformers' own save_pretrained writes."""
    over = {**over, **({"vocab_size": 256} if arch == "qwen3" else {})}
    if arch == "qwen3_vl":
        over = {**over, "text_config": {"vocab_size": 256, **over.get("text_config", {})}}
    cfg = build_config(arch, over)
    if "tie_word_embeddings" in over and arch == "qwen3_vl":
        cfg["text_config"]["tie_word_embeddings"] = over["tie_word_embeddings"]
    ours = hf_tensor_shapes(cfg)
    hf_cfg = transformers.AutoConfig.for_model(**cfg)
    torch.manual_seed(0)
    model = _hf_class(arch)(hf_cfg)
    model.save_pretrained(tmp_path / "hf")
    with open_checkpoint(tmp_path / "hf") as ck:
        saved = {n: t.shape for n, t in ck.tensors.items()}
    assert saved == ours


def test_hf4_style_config_is_the_same_model(tmp_path):
    a = make_tiny_model(tmp_path / "v5", "qwen3_vl", 1, _small("qwen3_vl"), style="hf5")
    b = make_tiny_model(tmp_path / "v4", "qwen3_vl", 1, _small("qwen3_vl"), style="hf4")
    c4 = json.loads((b / "config.json").read_text())
    assert "rope_parameters" not in c4["text_config"] and c4["text_config"]["rope_theta"] == 5e6
    assert c4["text_config"]["rope_scaling"]["mrope_section"] == [6, 5, 5]
    assert ModelConfig.from_hf(a) == ModelConfig.from_hf(b)
    m4 = transformers.Qwen3VLForConditionalGeneration.from_pretrained(b, dtype=torch.float32)
    assert m4.config.text_config.rope_parameters["rope_theta"] == 5e6
    assert m4.config.text_config.rope_parameters["mrope_section"] == [6, 5, 5]
    q3 = to_hf4_style(build_config("qwen3"))
    assert q3["rope_theta"] == 1e6 and q3["rope_scaling"] is None and q3["torch_dtype"] == "bfloat16"


def test_sharded_model_loads_in_transformers(tmp_path):
    folder = make_tiny_model(tmp_path / "sh", "qwen3", 2, _small("qwen3"), dtype="float32", max_shard_bytes=100_000)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) >= 3
    model, info = transformers.Qwen3ForCausalLM.from_pretrained(folder, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    with open_checkpoint(folder) as ck:
        np.testing.assert_array_equal(model.state_dict()["model.layers.1.mlp.up_proj.weight"].numpy(),
                                      ck.raw("model.layers.1.mlp.up_proj.weight"))


@pytest.mark.parametrize("dtype, st", [("float16", "F16"), ("float32", "F32"), ("bfloat16", "BF16")])
def test_dtypes(tmp_path, dtype, st):
    folder = make_tiny_model(tmp_path / dtype, "qwen3", 0, _small("qwen3"), dtype=dtype)
    with open_checkpoint(folder) as ck:
        assert {t.dtype for t in ck.tensors.values()} == {st}
    assert json.loads((folder / "config.json").read_text())["dtype"] == dtype


def test_cli_tiny_model(tmp_path, capsys):
    out = tmp_path / "cli"
    assert cli_main(["tiny-model", str(out), "--arch", "qwen3", "--seed", "4",
                     "--config", '{"vocab_size": 512, "num_hidden_layers": 3}']) == 0
    msg = capsys.readouterr().out
    assert "qwen3" in msg and "parameters" in msg
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 3 and len(cfg["layer_types"]) == 3 and cfg["vocab_size"] == 512
    # the merger's output enters the text model: out_hidden_size follows hidden_size (kestrel_lab.limits.RULES)
    (tmp_path / "over.json").write_text('{"text_config": {"hidden_size": 96}, '
                                        '"vision_config": {"out_hidden_size": 96}}')
    assert cli_main(["tiny-model", str(tmp_path / "vl"), "--arch", "qwen3_vl", "--config",
                     str(tmp_path / "over.json"), "--style", "hf4"]) == 0
    assert ModelConfig.from_hf(tmp_path / "vl").hidden_size == 96
    assert cli_main(["tiny-model", str(tmp_path / "bad"), "--config", "[1]"]) == 1
    assert "must be a JSON object" in capsys.readouterr().err
