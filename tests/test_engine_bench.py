"""The bench's plumbing on a small config (speed itself is printed by `kestrel-lab bench`, never asserted)."""
from __future__ import annotations

import json

import numpy as np

from kestrel_lab import models
from kestrel_lab.engine import Qwen3Engine
from kestrel_lab.bench import profile, speed
from kestrel_lab.roofline import weights_read_per_token

SMALL = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 64,
         "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 16, "rms_norm_eps": 1e-6, "rope_theta": 1e6, "max_position_embeddings": 256,
         "vocab_size": 1024, "tie_word_embeddings": True}


def test_bench_model_engine_speed_and_table(tmp_path, monkeypatch):
    monkeypatch.setenv("KESTREL_CACHE_DIR", str(tmp_path / "cache"))
    cfg = tmp_path / "small.config.json"
    cfg.write_text(json.dumps(SMALL))
    path = models.vqf(config=cfg, quant="q4_0")
    assert path.name == "small-q4_0-seed0.vqf" and models.vqf(config=cfg, quant="q4_0") == path   # cached
    eng = Qwen3Engine.from_vqf(path, max_context=64)
    # a decode step reads what roofline's formula says (plus one F16 embedding row)
    assert eng.weight_bytes_per_token == weights_read_per_token(SMALL)["total"] + 2 * SMALL["hidden_size"]
    fig = speed.engine_speed(path, 1, prompt_len=8, decode_tokens=3)
    assert fig["prefill_tok_s"] > 0 and fig["decode_tok_s"] > 0 and fig["weight_qtypes"] == ["Q4_0"]
    k = speed.kernel_speeds(1, rows=512, cols=256, repeat=1)
    from kestrel_lab.kernels import variants
    from kestrel_lab.kernels.host import host_features
    grouped = {f"q4_0 {v.name} ({v.rows_per_group} rows, {v.instruction})"       # every row-grouped variant here
               for v in variants.supported(host_features()) if v.planes}
    assert "q4_0 r32 (32 rows, int16 lanes (vpmullw, rows as lanes))" in grouped
    assert set(k) == {"q4_0 naive (block by block)", "q4_0 lanes", "q8_0 lanes", "q4_8x8l"} | grouped
    plain = speed.engine_speed(path, 1, prompt_len=8, decode_tokens=2, interleave=False)
    assert fig["repack_s"] > 0 and plain["repack_s"] == 0     # the row-interleaved copy is made at load
    res = {"vqf": str(path), "quant": "q4_0", "threads": [1], "engine": {1: fig}, "engine_plain": {1: plain},
           "bandwidth": {1: 10.0},
           "ceiling_tok_s": {1: 100.0}, "pct_of_ceiling": {1: 50.0}, "kernels_gbs": {1: k},
           "torch": {"fp32": 2.0}, "weight_bytes_per_token": fig["weight_bytes_per_token"],
           "first_compile": {"to_first_token_s": 30.0, "to_first_decode_s": 31.0},
           "cold_start": {"to_first_token_s": 1.0, "interpreter_s": 0.1, "import_s": 0.3, "load_s": 0.2,
                          "prefill_s": 0.4}, "load_avg": (0.5, 0.5, 0.5)}
    prof = profile.profile_file(path, 1, prompt_len=8, repeat=2, evict_bytes=1 << 20)
    parts = {p["name"]: p for p in prof["parts"]}
    assert set(parts) == set(profile.MATRIX_PARTS) | {"attention", "small operations"}
    matrix_bytes = sum(parts[n]["bytes"] for n in profile.MATRIX_PARTS)
    norms = 4 * SMALL["hidden_size"] * (2 * SMALL["num_hidden_layers"] + 1) + 4 * 2 * 16 * SMALL["num_hidden_layers"]
    assert matrix_bytes + norms + 2 * SMALL["hidden_size"] == eng.weight_bytes_per_token   # every weight byte once
    assert all(p["seconds"] > 0 for p in prof["parts"]) and prof["step_s"] > 0
    res["parts"] = {1: prof}
    table = speed.format_table(res)
    assert "decode step by parts" in table and "the whole step" in table
    assert "decode % of ceiling" in table and "50 %" in table and "PyTorch fp32" in table
    assert "file layout (16-lane kernel)" in table and "at load" in table
    assert np.isfinite(fig["decode_ms_median"])


def test_cold_start_child_reaches_first_token(tmp_path, monkeypatch):
    monkeypatch.setenv("KESTREL_CACHE_DIR", str(tmp_path / "cache"))
    cfg = tmp_path / "small.config.json"
    cfg.write_text(json.dumps(SMALL))
    r = speed.cold_start(models.vqf(config=cfg, quant="q4_8x8l"))
    assert 0 < r["interpreter_s"] < r["to_first_token_s"] < r["to_first_decode_s"]
