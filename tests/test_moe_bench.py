"""The MoE bench on a small Qwen3-MoE config: it runs, and the bytes the engine counts per decoded
token equal the bytes computed from the file's plan (figures are printed, never asserted on time)."""
from __future__ import annotations

import json

import pytest

from kestrel_lab import tiny_model
from kestrel_lab.engine import bench


@pytest.fixture
def small_config(tmp_path, monkeypatch):
    monkeypatch.setenv("KESTREL_CACHE_DIR", str(tmp_path / "cache"))
    cfg = tiny_model.build_config("qwen3_moe", {"vocab_size": 512, "num_hidden_layers": 3, "num_experts": 16,
                                                "num_experts_per_tok": 4, "mlp_only_layers": [1]})
    p = tmp_path / "moe.config.json"
    p.write_text(json.dumps(cfg))
    return p


def test_moe_bench_counts_the_planned_bytes(small_config):
    res = bench.moe_run(small_config, layers=2, threads=[1], decode_tokens=3, log=lambda *a: None)
    e = res["engine"][1]
    assert res["layers"] == 2 and res["layers_full"] == 3
    assert e["counted_bytes_per_token"] == pytest.approx(res["computed_bytes_per_token"], abs=0.5)
    assert len(e["distinct_experts_prompt"]) == 1          # layer 1 is dense: one MoE layer in the first two
    assert res["experts_in_place_bytes"] > 0 and e["memory"]["copied_at_load_bytes"] >= 0
    table = bench.format_moe_table(res)
    print("\n" + table)
    assert "counted by the engine" in table and "2 of 3 layers" in table


def test_moe_bench_refuses_a_dense_config(tmp_path):
    p = tmp_path / "dense.json"
    p.write_text(json.dumps(tiny_model.build_config("qwen3")))
    with pytest.raises(ValueError, match="qwen3_moe"):
        bench.moe_run(p, layers=1, threads=[1], decode_tokens=1, log=lambda *a: None)
