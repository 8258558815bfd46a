"""The MoE bench on a small Qwen3-MoE config: it runs, and the bytes the engine counts per decoded
token equal the bytes computed from the file's plan (figures are printed, never asserted on time)."""
from __future__ import annotations

import json

import pytest

from kestrel_lab import tiny_model
from kestrel_lab.bench import moe as moe_bench


@pytest.fixture
def small_config(tmp_path, monkeypatch):
    monkeypatch.setenv("KESTREL_CACHE_DIR", str(tmp_path / "cache"))
    cfg = tiny_model.build_config("qwen3_moe", {"vocab_size": 512, "num_hidden_layers": 3, "num_experts": 16,
                                                "num_experts_per_tok": 4, "mlp_only_layers": [1]})
    p = tmp_path / "moe.config.json"
    p.write_text(json.dumps(cfg))
    return p


def test_moe_bench_counts_the_planned_bytes(small_config):
    res = moe_bench.moe_run(small_config, layers=2, threads=[1], decode_tokens=3, log=lambda *a: None)
    e = res["engine"][1]
    assert res["layers"] == 2 and res["layers_full"] == 3
    assert e["counted_bytes_per_token"] == pytest.approx(res["computed_bytes_per_token"], abs=0.5)
    assert len(e["distinct_experts_prompt"]) == 1          # layer 1 is dense: one MoE layer in the first two
    assert res["experts_in_place_bytes"] > 0 and e["memory"]["copied_at_load_bytes"] >= 0
    table = moe_bench.format_moe_table(res)
    print("\n" + table)
    assert "counted by the engine" in table and "2 of 3 layers" in table


def test_moe_bench_refuses_a_dense_config(tmp_path):
    p = tmp_path / "dense.json"
    p.write_text(json.dumps(tiny_model.build_config("qwen3")))
    with pytest.raises(ValueError, match="qwen3_moe"):
        moe_bench.moe_run(p, layers=1, threads=[1], decode_tokens=1, log=lambda *a: None)


# ------------------------------------------------------------------------------ active parameters, dense twin
def test_active_params_equal_a_hand_count():
    from kestrel_lab.config import ModelConfig
    from kestrel_lab.engine.moe import active_params

    cfg = ModelConfig.from_hf(tiny_model.build_config("qwen3_moe", {
        "vocab_size": 100, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "num_hidden_layers": 3, "mlp_only_layers": [1], "num_experts": 8, "num_experts_per_tok": 2,
        "moe_intermediate_size": 32, "intermediate_size": 96, "tie_word_embeddings": False}))
    # by hand: embedding 100·64; attention per layer q 64·64 + k 64·32 + v 64·32 + o 64·64, 3 layers;
    # norms 2·64 + 2·16 per layer + the final 64; 2 MoE layers: router 8·64 and 2 experts × 3 × 64·32;
    # layer 1 dense: 3 × 64·96; an untied head 100·64
    want = {"embedding": 6400, "attention": 3 * 12288, "norms": 3 * 160 + 64, "router": 2 * 512,
            "experts": 2 * 2 * 3 * 64 * 32, "dense_ffn": 3 * 64 * 96, "lm_head": 6400}
    got = active_params(cfg)
    assert {k: got[k] for k in want} == want
    assert got["total"] == sum(want.values()) == 94240


def test_active_params_of_the_real_configs_match_transformers():
    """30B-A3B's active parameters = transformers' parameter count minus the experts a token does not
    use; Qwen3-4B (dense, tied) = all of transformers' parameters."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from kestrel_lab.config import ModelConfig
    from kestrel_lab.engine.moe import active_params
    from kestrel_lab.paths import configs_dir

    for name, cls, conf in (("qwen3-4b", transformers.Qwen3ForCausalLM, transformers.Qwen3Config),
                            ("qwen3-30b-a3b", transformers.Qwen3MoeForCausalLM, transformers.Qwen3MoeConfig)):
        d = json.loads((configs_dir() / f"{name}.config.json").read_text())
        d = {k: v for k, v in d.items() if k not in ("architectures", "model_type", "torch_dtype")}
        with torch.device("meta"):
            model = cls(conf(**d))
        total = sum(p.numel() for p in model.parameters())          # a tied head is one parameter
        cfg = ModelConfig.from_hf(configs_dir() / f"{name}.config.json")
        idle_experts = cfg.num_experts - cfg.num_experts_per_tok
        unused = len(cfg.moe_layers) * idle_experts * 3 * cfg.hidden_size * cfg.moe_intermediate_size
        assert active_params(cfg)["total"] == total - unused, name
    def billions(name):
        return round(active_params(ModelConfig.from_hf(configs_dir() / f"{name}.config.json"))["total"] / 1e9, 2)

    assert billions("qwen3-30b-a3b") == 3.35
    assert billions("qwen3-4b") == 4.02


def test_dense_twin_runs_beside_the_moe(small_config, tmp_path):
    dense = tmp_path / "dense.config.json"
    dense.write_text(json.dumps(tiny_model.build_config("qwen3", {"vocab_size": 512, "num_hidden_layers": 3})))
    res = moe_bench.moe_run(small_config, layers=2, threads=[1], decode_tokens=2, log=lambda *a: None,
                        dense_twin_config=dense, rounds=2)
    tw = res["dense_twin"]
    assert tw["moe"]["layers"] == tw["dense"]["layers"] == 2
    v = tw["by_threads"][1]
    assert len(v["moe_tok_s"]) == len(v["dense_tok_s"]) == 2
    # the engines' byte counts are the planned bytes of each file, so the prediction is their ratio
    assert v["moe_bytes_per_token"] == pytest.approx(tw["moe"]["computed_bytes_per_token"], rel=1e-6)
    assert v["dense_bytes_per_token"] == pytest.approx(tw["dense"]["computed_bytes_per_token"], rel=1e-6)
    assert v["predicted_ratio"] == pytest.approx(v["dense_bytes_per_token"] / v["moe_bytes_per_token"])
    assert moe_bench.agreement(v["measured_ratio"], v["predicted_ratio"]) in ("agrees", "lower", "higher")
    print("\n" + moe_bench.format_moe_table(res))
    assert "bytes predict" in moe_bench.format_moe_table(res)


def test_dense_twin_refuses_too_few_layers_and_an_moe_config(small_config, tmp_path):
    dense = tmp_path / "dense.config.json"
    dense.write_text(json.dumps(tiny_model.build_config("qwen3", {"num_hidden_layers": 1})))
    with pytest.raises(ValueError, match="fewer than"):
        moe_bench.moe_run(small_config, layers=2, threads=[1], decode_tokens=1, log=lambda *a: None,
                          dense_twin_config=dense)
    with pytest.raises(ValueError, match="needs a qwen3 config"):
        moe_bench.moe_run(small_config, layers=2, threads=[1], decode_tokens=1, log=lambda *a: None,
                      dense_twin_config=small_config)


def test_agreement():
    assert moe_bench.agreement(1.4, 1.5) == "agrees"
    assert moe_bench.agreement(0.9, 1.5) == "lower"
    assert moe_bench.agreement(2.5, 1.5) == "higher"


# ------------------------------------------------------------------------------ under a memory limit
def test_paging_decode_counts_bytes_in_process(small_config):
    from kestrel_lab import models

    path = models.vqf(config=small_config, layers=2)
    r = moe_bench.paging_decode(path, threads=1, expert_paging="exact", decode_tokens=3, warmup=1)
    assert r["decode_tok_s"] > 0 and r["expert_paging"] == "exact"
    # the engine's own count: dense bytes + router + the distinct experts each step touched (≤ k per layer)
    ab = __import__("kestrel_lab.engine.moe", fromlist=["active_bytes"]).active_bytes
    from kestrel_lab.vqf.reader import open_vqf
    with open_vqf(path) as f:
        planned = ab(f.config)["total"]
    assert r["engine_bytes_per_token"] == pytest.approx(planned, abs=0.5)
    assert r["read_bytes_per_token"] is None or r["read_bytes_per_token"] >= 0


def test_memory_limit_run_on_a_fake_tree_or_without_cgroups(small_config, monkeypatch):
    """Without a usable cgroup the run says why and measures only the unlimited case (the limited
    cases are left out, not faked)."""
    from kestrel_lab import cgroup, models

    path = models.vqf(config=small_config, layers=2)
    monkeypatch.setattr(cgroup, "unavailable_reason", lambda *a, **k: "test: no cgroups")
    res = moe_bench.memory_limit_run(path, "1G", decode_tokens=2, warmup=1, log=lambda *a: None)
    assert res["unavailable"] == "test: no cgroups"
    assert len(res["runs"]["unlimited"]) == 1 and res["runs"]["limited_os"] == res["runs"]["limited_exact"] == []
    table = moe_bench.format_memory_limit(res)
    assert "no memory cgroup here: test: no cgroups" in table and "limit, OS" not in table


@pytest.mark.skipif(__import__("kestrel_lab.cgroup", fromlist=["x"]).unavailable_reason() is not None,
                    reason="no memory cgroup here: "
                           + str(__import__("kestrel_lab.cgroup", fromlist=["x"]).unavailable_reason()))
def test_memory_limit_run_for_real(small_config):
    from kestrel_lab import cgroup, models

    path = models.vqf(config=small_config, layers=2)
    h = cgroup.detect()
    before = set(__import__("os").listdir(h.parent))
    res = moe_bench.memory_limit_run(path, "2G", decode_tokens=2, warmup=1, log=lambda *a: None)
    s = res["summary"]
    assert set(s) == {"unlimited", "limited_os", "limited_exact"}
    assert all(r["cgroup_version"] in (1, 2) for runs in res["runs"].values() for r in runs)
    assert s["limited_os"]["speed_vs_unlimited"] > 0
    assert set(__import__("os").listdir(h.parent)) == before
    print("\n" + moe_bench.format_memory_limit(res))
