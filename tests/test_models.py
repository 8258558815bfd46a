"""`kestrel_lab.models`: one cache policy keyed by content, for random and trained models."""
from __future__ import annotations

import json

import numpy as np
import pytest

from kestrel_lab import models
from kestrel_lab.convert import convert
from kestrel_lab.paths import tiny_poem_dir
from kestrel_lab.tiny_model import build_config
from kestrel_lab.vqf import synth
from kestrel_lab.vqf.reader import open_vqf

SMALL = {"vocab_size": 256, "num_hidden_layers": 3}


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KESTREL_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "models"


def test_same_key_same_file_no_rewrite(cache):
    a = models.vqf(overrides=SMALL, seed=1)
    t = a.stat().st_mtime_ns
    b = models.vqf(overrides=SMALL, seed=1)
    assert a == b and b.stat().st_mtime_ns == t and a.parent == cache
    key = json.loads(models.cache_key_path(a).read_text(encoding="utf-8"))
    assert key["seed"] == 1 and key["quant"] == "q4_0" and key["config"]["vocab_size"] == 256
    assert len(key["sources"]) == 64


def test_changed_sources_rebuild(cache, monkeypatch):
    a = models.vqf(overrides=SMALL)
    old = models.cache_key_path(a).read_text(encoding="utf-8")
    monkeypatch.setattr(models, "sources_hash", lambda kinds: "0" * 64)
    b = models.vqf(overrides=SMALL)
    assert b == a and models.cache_key_path(b).read_text(encoding="utf-8") != old
    assert json.loads(models.cache_key_path(b).read_text(encoding="utf-8"))["sources"] == "0" * 64


def test_changed_config_file_rebuilds(cache, tmp_path):
    cfg = tmp_path / "m.config.json"
    base = build_config("qwen3")
    cfg.write_text(json.dumps(base | {"vocab_size": 256}))
    a = models.vqf(config=cfg)
    assert a.name == "m-q4_0-seed0.vqf"
    cfg.write_text(json.dumps(base | {"vocab_size": 320}))
    assert models.vqf(config=cfg) == a
    with open_vqf(a) as f:
        assert f.config.vocab_size == 320


def test_seed_quant_layers_give_other_files(cache):
    a = models.vqf(overrides=SMALL)
    others = [models.vqf(overrides=SMALL, seed=1), models.vqf(overrides=SMALL, quant="q8_0"),
              models.vqf(overrides=SMALL, layers=2)]
    assert len({a, *others}) == 4
    with open_vqf(others[2]) as f:
        assert f.config.num_hidden_layers == 2
    with open_vqf(a) as f, open_vqf(others[0]) as g:
        assert not np.array_equal(f["q4_q"].data, g["q4_q"].data)


def test_model_config_objects_and_vl(cache):
    p = models.vqf(config=synth.small_vl_config(), arch="qwen3_vl")
    with open_vqf(p) as f:
        assert f.config == synth.small_vl_config() and not f.missing
    with pytest.raises(ValueError, match="arch"):
        models.vqf(config=synth.small_vl_config(), arch="qwen3")
    with pytest.raises(ValueError, match="no default tiny qwen3_vl_moe config"):
        models.vqf(arch="qwen3_vl_moe")


def test_poem_vqf_equals_a_direct_convert(cache, tmp_path):
    p = models.vqf("qwen3-tiny-poem", quant="q8_0")
    assert p.name == "qwen3-tiny-poem.q8_0.vqf"
    direct = tmp_path / "direct.vqf"
    convert(tiny_poem_dir(), direct, quant="q8_0")
    with open_vqf(p) as a, open_vqf(direct) as b:
        def drop(src):  # all but "created" (a timestamp)
            return {k: v for k, v in src.items() if k != "created"}

        assert a.config == b.config and drop(a.source) == drop(b.source)
        assert [e.name for e in a.entries] == [e.name for e in b.entries]
        for e in a.entries:
            assert np.array_equal(e.data, b[e.name].data), e.name


def test_hf_checkpoint_cached_and_converted(cache):
    d = models.hf_checkpoint(overrides={"vocab_size": 256})
    t = (d / "model.safetensors").stat().st_mtime_ns
    assert models.hf_checkpoint(overrides={"vocab_size": 256}) == d
    assert (d / "model.safetensors").stat().st_mtime_ns == t
    assert models.hf_checkpoint(overrides={"vocab_size": 256}, seed=1) != d
    assert models.hf_checkpoint("qwen3-tiny-poem") == tiny_poem_dir()
    v = models.vqf(d, quant="f32")
    with open_vqf(v) as f:
        assert f.config.vocab_size == 256


def test_evict(cache):
    p = models.vqf(overrides=SMALL)
    assert models.evict(p) in (True, False)
    with open_vqf(p) as f:                       # still readable: only the page cache was dropped
        assert not f.missing


def test_a_checkpoint_saved_by_transformers_holds_the_same_weights(tmp_path, monkeypatch):
    """saver='transformers': the package's seeded weights, written by save_pretrained itself."""
    pytest.importorskip("transformers")
    monkeypatch.setenv("KESTREL_CACHE_DIR", str(tmp_path))
    from kestrel_lab.convert import convert
    from kestrel_lab.vqf.reader import open_vqf

    ours = models.hf_checkpoint(dtype="float32")
    theirs = models.hf_checkpoint(dtype="float32", saver="transformers")
    assert ours != theirs and (theirs / "model.safetensors").exists()
    a, b = convert(ours, tmp_path / "a.vqf", "f32", hash_source=False), \
        convert(theirs, tmp_path / "b.vqf", "f32", hash_source=False)
    with open_vqf(a.output) as fa, open_vqf(b.output) as fb:
        assert fa.config == fb.config
        for name, t in fa.tensors.items():
            assert bytes(t.data) == bytes(fb.tensors[name].data), name
    with pytest.raises(ValueError, match="saver"):
        models.hf_checkpoint(saver="pytorch")


def test_random_vl_model_has_layernorm_scales_near_one_and_biases_near_zero():
    """write_model's runnable weights: every norm scale (text RMSNorms and the vision LayerNorms) is
    about 1 and every bias about 0, so a random vision tower keeps its activations' scale."""
    from kestrel_lab.vqf.planner import plan_file

    for s in plan_file(synth.small_vl_config(), "f32").specs:
        x = np.concatenate(list(synth.model_rows(s.name, 0, s.rows, s.cols)))
        if synth.is_norm_weight(s.name):
            assert abs(float(x.mean()) - 1.0) < 0.05, s.name
        elif s.name.endswith("_b"):
            assert abs(float(x.mean())) < 0.05 and float(x.std()) < 0.3, s.name
    assert synth.is_norm_weight("v_norm1") and synth.is_norm_weight("v_ds_norm")
    assert not synth.is_norm_weight("v_norm1_b") and not synth.is_norm_weight("v_merger_norm_b")


def test_cache_keys_follow_the_writers_imports():
    """The key of a generated file covers every source its writer reaches (no hand-kept list): the VQF
    writer's closure holds the checksum it appends, the synthesizer's the writer's."""
    from kestrel_lab import imports
    from kestrel_lab.paths import REPO_ROOT

    mods = imports.package_modules(REPO_ROOT)
    vqf = imports.closure({models.WRITERS["vqf"]}, mods)
    assert {"kestrel_lab.vqf.checksum", "kestrel_lab.vqf.format", "kestrel_lab.quant"} <= vqf
    assert vqf <= imports.closure({models.WRITERS["random"]}, mods)
    assert "kestrel_lab.engine.model" not in vqf          # reading code does not key written files
