"""Linear and YaRN RoPE scaling against transformers: the frequencies and attention factor of
``kestrel_lab.rope_scaling`` against ``ROPE_INIT_FUNCTIONS`` over a grid of configurations, and the engine's
F32 logits on checkpoints written by transformers' ``save_pretrained`` with ``rope_parameters`` (transformers 5)
or ``rope_scaling`` (older) set — a tiny original window of 64 tokens, logits compared at every position
of a 160-token prompt and 8 decode steps, most of them past the window. The same file run with plain RoPE
differs there (so the comparison can see the scaling), the scaling travels in the VQF header, and rope
types the engine does not implement are refused by name."""
from __future__ import annotations

import dataclasses
import json
import struct

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is a reference dependency (requirements-ref.txt)")
transformers = pytest.importorskip("transformers", reason="transformers is a reference dependency")

from kestrel_lab import rope_scaling as R  # noqa: E402  (after importorskip)
from kestrel_lab.config import ConfigError, ModelConfig  # noqa: E402  (after importorskip)
from kestrel_lab.convert import convert  # noqa: E402  (after importorskip)
from kestrel_lab.engine import Qwen3Engine  # noqa: E402  (after importorskip)
from kestrel_lab.kernels.rope import mrope_cos_sin  # noqa: E402  (after importorskip)
from kestrel_lab.vqf import format as F  # noqa: E402  (after importorskip)
from kestrel_lab.vqf.reader import open_vqf  # noqa: E402  (after importorskip)
from helpers.logits import compare_steps  # noqa: E402  (after importorskip)

WINDOW = 64
ROPES = {
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": WINDOW, "rope_theta": 10000.0},
    "linear": {"rope_type": "linear", "factor": 8.0, "rope_theta": 10000.0},
}
GRID = [
    {"rope_type": "linear", "factor": 8.0},
    {"rope_type": "linear", "factor": 2.5},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},      # Qwen3's model card
    {"rope_type": "yarn", "factor": 2.5, "original_max_position_embeddings": 1000, "beta_fast": 16,
     "beta_slow": 2, "truncate": False},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096, "mscale": 0.707,
     "mscale_all_dim": 1.0},
    {"rope_type": "yarn", "factor": 3.0, "original_max_position_embeddings": 512, "attention_factor": 1.25},
]


def _hf_rope(params: dict, head_dim: int):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = transformers.Qwen3Config(head_dim=head_dim, hidden_size=64, num_attention_heads=4,
                                   max_position_embeddings=1 << 17, rope_parameters=dict(params))
    inv, att = ROPE_INIT_FUNCTIONS[params["rope_type"]](cfg)
    return inv.numpy(), att


@pytest.mark.parametrize("head_dim", [32, 128])
@pytest.mark.parametrize("theta", [1e4, 1e6, 5e6])
@pytest.mark.parametrize("params", GRID, ids=[f"{p['rope_type']}{i}" for i, p in enumerate(GRID)])
def test_frequencies_and_attention_factor_equal_transformers(params, theta, head_dim):
    p = dict(params, rope_theta=theta)
    inv, att = _hf_rope(p, head_dim)
    cfg = ModelConfig.from_hf({"model_type": "qwen3", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 64,
                               "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
                               "head_dim": head_dim,
                               "max_position_embeddings": 1 << 17, "rope_parameters": p})
    ours = R.inv_freq(head_dim, theta, cfg.rope_scaling)
    # bit-exact but for torch's float32 pow, which can be one ulp off the correctly rounded power
    assert (ours != inv).sum() <= 1 and np.allclose(ours, inv, rtol=5e-7, atol=0)
    assert np.float32(cfg.rope_scaling.attention_factor) == np.float32(att)


def _checkpoint(out, rope: dict, style: str, seed: int = 0):
    """A random Qwen3 (vocab 512, hidden 64, 2 layers, heads of 32) saved by transformers; ``style`` "hf4"
    rewrites its config.json the way older configs and Qwen's model cards spell it (rope_theta beside a
    rope_scaling dict with "type")."""
    torch.manual_seed(seed)
    cfg = transformers.Qwen3Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=32, rope_parameters=rope,
                                   max_position_embeddings=256, tie_word_embeddings=True, initializer_range=0.25,
                                   bos_token_id=None, eos_token_id=None, pad_token_id=0)
    transformers.Qwen3ForCausalLM(cfg).float().eval().save_pretrained(out)
    if style == "hf4":
        doc = json.loads((out / "config.json").read_text())
        r = doc.pop("rope_parameters")
        doc["rope_theta"] = r.pop("rope_theta")
        r["type"] = r.pop("rope_type")
        doc["rope_scaling"] = r
        (out / "config.json").write_text(json.dumps(doc, indent=2))
    return transformers.Qwen3ForCausalLM.from_pretrained(out, dtype=torch.float32).eval()


@pytest.fixture(scope="module", params=[(k, s) for k in ROPES for s in ("hf5", "hf4")],
                ids=[f"{k}-{s}" for k in ROPES for s in ("hf5", "hf4")])
def scaled(request, tmp_path_factory):
    kind, style = request.param
    d = tmp_path_factory.mktemp(f"{kind}-{style}")
    model = _checkpoint(d, ROPES[kind], style)
    assert model.model.rotary_emb.rope_type == kind          # transformers itself runs the scaled RoPE
    convert(d, d / "f32.vqf", quant="f32", hash_source=False)
    ids = [int(x) for x in np.random.default_rng(1).integers(0, 512, 168)]
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0].numpy()
    return kind, d, ids, ref


def test_engine_equals_transformers_past_the_original_window(scaled):
    kind, d, ids, ref = scaled
    eng = Qwen3Engine.from_vqf(d / "f32.vqf", max_context=256)
    assert eng.config.rope_scaling.rope_type == kind
    compare_steps(eng, ref, ids[:160], ids[160:], tol=1e-4, label=f"F32 {kind} engine vs transformers")
    eng.reset()
    full = eng.forward_all(ids)
    assert np.abs(full - ref).max() <= 1e-4 * np.abs(ref).max()


def test_plain_rope_on_the_same_weights_differs_past_the_window(scaled):
    """The comparison above can see the scaling: the same file run with plain RoPE is far off past the
    window (and, for yarn, off inside it too: the attention factor scales every score)."""
    kind, d, ids, ref = scaled
    with open_vqf(d / "f32.vqf") as vf:
        plain = dataclasses.replace(vf.config, rope_scaling=None)
        eng = Qwen3Engine(plain, vf.tensors, max_context=256, source=str(d), keepalive=vf)
        diff = np.abs(eng.forward_all(ids) - ref).max(axis=1)
    assert diff[WINDOW:].max() > 1e-2 * np.abs(ref).max()


def test_the_scaling_travels_in_the_header(scaled):
    kind, d, ids, ref = scaled
    want = ModelConfig.from_hf(d)
    raw = (d / "f32.vqf").read_bytes()
    h = F.unpack_header_raw(raw[:F.DIR_OFFSET])
    assert h["rope_type"] == R.ROPE_TYPES[kind]
    assert struct.unpack_from("<4f", raw, F.ROPE_OFFSET) == dataclasses.astuple(want.rope_scaling)[1:]
    with open_vqf(d / "f32.vqf") as vf:
        assert vf.config == want and vf.config.rope_scaling == want.rope_scaling
    # an older reader: rope_type sits where reserved0 was, which it required to be 0 (refused, never misread)
    assert F.HEADER_FIELD["rope_type"].offset == 180


def test_yarn_defaults_and_spellings():
    base = {"model_type": "qwen3", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 64,
            "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
            "max_position_embeddings": 4096}
    hf5 = ModelConfig.from_hf({**base, "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6}})
    # original_max_position_embeddings absent: transformers takes max_position_embeddings
    assert hf5.rope_scaling == R.yarn(4.0, 32, 1e6, 4096)
    hf4 = ModelConfig.from_hf({**base, "rope_theta": 1e6, "rope_scaling": {"type": "yarn", "factor": 4.0}})
    assert hf4 == hf5
    # a top-level original_max_position_embeddings wins over the dict's (transformers' Phi-3 rule)
    top = ModelConfig.from_hf({**base, "original_max_position_embeddings": 1024, "rope_parameters": {
        "rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6, "original_max_position_embeddings": 64}})
    assert top.rope_scaling == R.yarn(4.0, 32, 1e6, 1024)


@pytest.mark.parametrize("kind", ["dynamic", "longrope", "llama3", "proportional", "su"])
def test_other_rope_types_are_refused_by_name(kind, tmp_path):
    doc = json.loads((_base_config(tmp_path)).read_text())
    doc["rope_parameters"] = {"rope_type": kind, "factor": 2.0, "rope_theta": 1e6}
    (tmp_path / "config.json").write_text(json.dumps(doc, indent=1))
    with pytest.raises(ConfigError, match=rf"config\.json: field 'rope_parameters\.rope_type' at line \d+ "
                                          rf"\(byte \d+\): is '{kind}'.*"
                                          r"implemented: '?default'?, '?linear'?, '?yarn'?"):
        ModelConfig.from_hf(tmp_path)


def _base_config(tmp_path):
    from kestrel_lab import tiny_model

    p = tmp_path / "config.json"
    p.write_text(json.dumps(tiny_model.default_config("qwen3"), indent=1))
    return p


def test_mrope_with_yarn_equals_transformers_qwen3_vl_rotary():
    """Qwen3-VL's text RoPE with a yarn scaling: the interleaved MRoPE tables times the attention factor."""
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding

    rope = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128, "rope_theta": 5e6,
            "mrope_section": [6, 5, 5], "mrope_interleaved": True}
    cfg = transformers.Qwen3VLTextConfig(hidden_size=64, num_attention_heads=4, head_dim=32,
                                         max_position_embeddings=1024, rope_parameters=rope)
    emb = Qwen3VLTextRotaryEmbedding(cfg)
    pos = np.stack([np.arange(300), np.arange(300) // 7, np.arange(300) % 11]).astype(np.int64)
    with torch.no_grad():
        cos, sin = emb(torch.zeros(1, 300, 32), torch.tensor(pos)[:, None, :])
    scaling = R.yarn(4.0, 32, 5e6, 128)
    c, s = mrope_cos_sin(pos, 32, 5e6, [6, 5, 5], True, scaling)
    assert np.allclose(np.concatenate([c, c], 1), cos[0].numpy(), atol=3e-6)
    assert np.allclose(np.concatenate([s, s], 1), sin[0].numpy(), atol=3e-6)
