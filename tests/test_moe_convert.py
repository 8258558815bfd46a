"""Qwen3-MoE conversion: per-expert and fused checkpoints give the same file; each expert's gate, up and
down matrix is one contiguous run in the documented order; dense layers inside an MoE model get their
own entries, and a reader rebuilds which layer is which from the directory alone."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from kestrel_lab import quant as Q, tiny_model
from kestrel_lab.config import ModelConfig
from kestrel_lab.convert import ConversionError, convert, expert_keys
from kestrel_lab.safetensors import open_checkpoint, save_safetensors
from kestrel_lab.vqf import layout
from kestrel_lab.vqf.reader import open_vqf

OVER = {"vocab_size": 320, "num_hidden_layers": 4, "num_experts": 8, "num_experts_per_tok": 2,
        "mlp_only_layers": [2], "decoder_sparse_step": 1, "dtype": "float32"}


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return tiny_model.make_tiny_model(tmp_path_factory.mktemp("hf-moe"), "qwen3_moe", seed=3, overrides=OVER,
                                      dtype="float32")


def _fuse(src, dst):
    """Rewrite a per-expert checkpoint in transformers 5's fused form: gate_up (E, 2m, h), down (E, h, m)."""
    dst.mkdir()
    shutil.copy(src / "config.json", dst / "config.json")
    cfg = ModelConfig.from_hf(src)
    with open_checkpoint(src) as ck:
        out = {n: np.array(ck.raw(n)) for n in ck.tensors if ".mlp.experts." not in n}
        for i in cfg.moe_layers:
            p = f"model.layers.{i}.mlp.experts"
            E = range(cfg.num_experts)
            out[f"{p}.gate_up_proj"] = np.stack([np.concatenate([np.array(ck.raw(f"{p}.{e}.gate_proj.weight")),
                                                                 np.array(ck.raw(f"{p}.{e}.up_proj.weight"))])
                                                 for e in E])
            out[f"{p}.down_proj"] = np.stack([np.array(ck.raw(f"{p}.{e}.down_proj.weight")) for e in E])
    save_safetensors(dst / "model.safetensors", out)
    return dst


def test_layer_map_of_the_plan(hf_dir):
    cfg = ModelConfig.from_hf(hf_dir)
    assert cfg.moe_layers == [0, 1, 3] and cfg.dense_layers == [2]
    names = [s.name for s in layout.plan(cfg)]
    assert names[10:] == ["moe_router", "q4_gate_exps", "q4_up_exps", "q4_down_exps",
                          "q4_gate.2", "q4_up.2", "q4_down.2", "q4_lm"]
    specs = {s.name: s for s in layout.plan(cfg)}
    E, m, h = cfg.num_experts, cfg.moe_intermediate_size, cfg.hidden_size
    assert specs["q4_gate_exps"].rows == 3 * E * m and specs["q4_down_exps"].rows == 3 * E * h
    assert specs["moe_router"].rows == 3 * E and specs["moe_router"].qtype == Q.F32.id
    assert specs["q4_gate.2"].sources == ("model.layers.2.mlp.gate_proj.weight",)
    # transformers' rule: decoder_sparse_step = 2 makes layers 0 and 2 dense
    c2 = ModelConfig.from_hf(json.loads((hf_dir / "config.json").read_text()) | {"decoder_sparse_step": 2,
                                                                                   "mlp_only_layers": []})
    assert c2.moe_layers == [1, 3] and c2.dense_layers == [0, 2]


def test_expert_runs_are_contiguous_and_in_order(hf_dir, tmp_path):
    out = tmp_path / "m.vqf"
    convert(hf_dir, out, quant="q4_0", hash_source=False)
    cfg = ModelConfig.from_hf(hf_dir)
    with open_vqf(out) as f, open_checkpoint(hf_dir) as ck:
        assert f.config == cfg and not f.unknown and not f.missing
        for name, kind in (("q4_gate_exps", "gate_proj"), ("q4_up_exps", "up_proj"), ("q4_down_exps", "down_proj")):
            t = f[name]
            spec = next(s for s in layout.plan(cfg) if s.name == name)
            runs = layout.expert_runs(spec, cfg)
            assert [(i, e) for i, e, _, _ in runs] == [(i, e) for i in cfg.moe_layers for e in range(cfg.num_experts)]
            assert all(r1 == runs[k + 1][2] for k, (_, _, _, r1) in enumerate(runs[:-1])) and runs[-1][3] == t.rows
            rows = t.array()
            for i, e, r0, r1 in runs:      # the run's bytes are exactly that expert's matrix quantized
                want = Q.quantize(np.array(ck.raw(f"model.layers.{i}.mlp.experts.{e}.{kind}.weight"),
                                           np.float32), Q.Q4_0)
                np.testing.assert_array_equal(rows[r0:r1].reshape(-1), want.reshape(-1), err_msg=f"{name} {i}/{e}")
        router = f["moe_router"].array()
        for k, i in enumerate(cfg.moe_layers):
            np.testing.assert_array_equal(router[k * 8:(k + 1) * 8],
                                          np.array(ck.raw(f"model.layers.{i}.mlp.gate.weight")))
        dense = f["q4_gate.2"].array()
        want = Q.quantize(np.array(ck.raw("model.layers.2.mlp.gate_proj.weight")), Q.Q4_0)
        np.testing.assert_array_equal(dense.reshape(-1), want.reshape(-1))


def test_fused_experts_convert_to_the_same_file(hf_dir, tmp_path):
    fused = _fuse(hf_dir, tmp_path / "fused")
    with open_checkpoint(fused) as ck:
        assert expert_keys(ck, ModelConfig.from_hf(fused)) == "fused"
    a, b = tmp_path / "a.vqf", tmp_path / "b.vqf"
    convert(hf_dir, a, quant="q4_0", hash_source=False, model_name="m")
    convert(fused, b, quant="q4_0", hash_source=False, model_name="m")
    with open_vqf(a) as fa, open_vqf(b) as fb:
        assert [e.name for e in fa.entries] == [e.name for e in fb.entries]
        for e in fa.entries:
            np.testing.assert_array_equal(fa[e.name].data, fb[e.name].data, err_msg=e.name)


def test_a_missing_expert_is_named(hf_dir, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    shutil.copy(hf_dir / "config.json", bad / "config.json")
    with open_checkpoint(hf_dir) as ck:
        out = {n: np.array(ck.raw(n)) for n in ck.tensors if n != "model.layers.1.mlp.experts.5.up_proj.weight"}
    save_safetensors(bad / "model.safetensors", out)
    with pytest.raises(ConversionError, match=r"model\.layers\.1\.mlp\.experts\.5\.up_proj\.weight \(for q4_up_exps\)"):
        convert(bad, tmp_path / "x.vqf", hash_source=False)


def test_a_wrong_dense_map_is_refused(hf_dir, tmp_path):
    """config.json saying every layer is MoE while layer 2 holds a dense FFN: refused, naming tensors."""
    bad = tmp_path / "bad"
    shutil.copytree(hf_dir, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["mlp_only_layers"] = []
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConversionError, match=r"model\.layers\.2\.mlp\.experts\.0\.gate_proj\.weight"):
        convert(bad, tmp_path / "x.vqf", hash_source=False)


def test_a_directory_that_contradicts_the_layer_map_is_refused(tmp_path):
    """A file whose expert stacks cover layers 0 and 1 but which also names a dense layer 1 (or lacks
    it) cannot be mapped: the reader names the entry, the field and its byte offset."""
    from kestrel_lab.vqf import synth
    from kestrel_lab.vqf.format import VQFFormatError

    cfg = ModelConfig.from_hf(tiny_model.build_config("qwen3_moe", {"vocab_size": 320, "num_hidden_layers": 2,
                                                                    "mlp_only_layers": [1]}))
    all_moe = ModelConfig.from_hf(tiny_model.build_config("qwen3_moe", {"vocab_size": 320, "num_hidden_layers": 2}))
    specs = [s for s in layout.plan(all_moe)] + [s for s in layout.plan(cfg) if s.name.startswith("q4_gate.")]
    bad = synth.write_random(tmp_path / "bad.vqf", cfg, specs=specs)
    with pytest.raises(VQFFormatError, match=r"bad\.vqf: field entry\[10\] \(moe_router\)\.rows/cols at offset 1124: "
                                             r"16×64, but the header's configuration implies 8×64"):
        open_vqf(bad)
    ok = synth.write_random(tmp_path / "ok.vqf", cfg)
    with open_vqf(ok) as f:
        assert f.config.dense_layers == [1] and not f.missing and not f.unknown
