"""The engine against transformers' Qwen3ForCausalLM (F32 weights) and against the numpy reference
(Q8_0/Q4_0 weights), on small deterministic random Qwen3 checkpoints built here with transformers."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is a test dependency (requirements-dev.txt)")
transformers = pytest.importorskip("transformers", reason="transformers is a test dependency")

from kestrel_lab.convert import convert  # noqa: E402  (after importorskip)
from kestrel_lab.engine import ContextFullError, Qwen3Engine  # noqa: E402  (after importorskip)
from kestrel_lab.engine.reference import reference_logits  # noqa: E402  (after importorskip)
from kestrel_lab.eval import logit_agreement  # noqa: E402  (after importorskip)
from kestrel_lab.vqf.reader import open_vqf  # noqa: E402  (after importorskip)
from helpers.logits import compare_steps  # noqa: E402  (after importorskip)

VOCAB = 1000
PROMPT = [3, 141, 59, 265, 358, 979, 323, 846, 264, 338, 327, 950, 288, 419, 716, 939]


def make_checkpoint(out_dir, *, tie: bool, head_dim: int, seed: int):
    """A random Qwen3 (hidden 64, 2 layers, 4/2 heads) saved in float32; norms perturbed so they count."""
    torch.manual_seed(seed)
    cfg = transformers.Qwen3Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim, rope_theta=1e6,
        max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=tie,
        initializer_range=0.25, bos_token_id=None, eos_token_id=None, pad_token_id=0)
    model = transformers.Qwen3ForCausalLM(cfg).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
    model.save_pretrained(out_dir)
    return model


@pytest.fixture(scope="module", params=[(True, 16), (False, 32)], ids=["tied-hd16", "untied-hd32"])
def checkpoint(request, tmp_path_factory):
    tie, hd = request.param
    d = tmp_path_factory.mktemp(f"qwen3-{'tied' if tie else 'untied'}")
    model = make_checkpoint(d, tie=tie, head_dim=hd, seed=7 if tie else 11)
    vqf = {}
    for q in ("f32", "q8_0", "q4_0"):
        vqf[q] = d / f"model-{q}.vqf"
        convert(d, vqf[q], quant=q, hash_source=False)
    return model, vqf


def hf_logits(model, ids) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def test_f32_prefill_and_every_decode_step_match_transformers(checkpoint):
    model, vqf = checkpoint
    eng = Qwen3Engine.from_vqf(vqf["f32"], max_context=128)
    rng = np.random.default_rng(0)
    cont = [int(t) for t in rng.integers(0, VOCAB, 24)]
    ref = hf_logits(model, PROMPT + cont)
    scale = np.abs(ref).max()
    compare_steps(eng, ref, PROMPT, cont, tol=1e-4, label="F32 engine vs transformers")
    assert eng.pos == len(PROMPT) + len(cont)
    # forward_all from position 0 gives the same logits at every position
    eng.reset()
    allg = eng.forward_all(PROMPT + cont)
    assert np.abs(allg - ref).max() <= 1e-4 * scale


def test_greedy_32_tokens_equal_transformers_generate(checkpoint):
    model, vqf = checkpoint
    with torch.no_grad():
        out = model.generate(torch.tensor([PROMPT]), do_sample=False, max_new_tokens=32, min_new_tokens=32,
                             pad_token_id=0)
    want = out[0, len(PROMPT):].tolist()
    eng = Qwen3Engine.from_vqf(vqf["f32"], max_context=128)
    logits = eng.prefill(PROMPT)
    got = []
    for _ in range(32):
        tok = int(np.argmax(logits))
        got.append(tok)
        logits = eng.decode(tok)
    assert got == want


@pytest.mark.parametrize("quant", ["q8_0", "q4_0"])
def test_quantized_engine_matches_numpy_reference(checkpoint, quant):
    _, vqf = checkpoint
    ids = PROMPT + [5, 77, 912, 4, 600, 31, 250, 18]
    f = open_vqf(vqf[quant])
    ref = reference_logits(f.config, f.tensors, ids)
    scale = np.abs(ref).max()
    # repack: Q4_8X8L copy; default: row-interleaved Q4_0 planes (+ the whole-step decode kernel);
    # interleave=False: the plain layout as stored in the file (16-lane kernels).
    for kw in ({"repack": True}, {}, {"interleave": False}):
        eng = Qwen3Engine.from_vqf(vqf[quant], max_context=64, **kw)
        batched = eng.forward_all(ids)               # the matmul (prefill) kernels
        eng.reset()
        steps = [eng.prefill(ids[:4])]
        steps += [eng.decode(t) for t in ids[4:-1]]
        steps = np.stack(steps)                       # the matvec (decode) kernels
        d_all = np.abs(batched - ref).max()
        d_step = np.abs(steps - ref[3:-1]).max()
        print(f"\n{quant} ({kw or 'default'}) engine vs numpy reference: batched {d_all:.3g}, "
              f"decode {d_step:.3g}, logit scale {scale:.3g}")
        assert d_all <= 2e-5 * scale
        assert d_step <= 2e-5 * scale


@pytest.mark.parametrize("forced", ["r32", "v16"])
def test_whole_step_decode_is_bit_identical_to_the_layer_by_layer_path(checkpoint, monkeypatch, forced):
    """``decode_layers_r32`` (and the V16 step) run the same kernels in the same order as the per-layer
    Python loop."""
    _, vqf = checkpoint
    monkeypatch.setenv("KESTREL_Q4_LAYOUT", forced)
    eng = Qwen3Engine.from_vqf(vqf["q4_0"], max_context=64)
    assert eng._planes is not None, "Q4_0 test shapes are multiples of 32: the fast path must be taken"
    whole_step = eng._step  # the registry's (eng.q4_layout, "layers") kernel
    assert whole_step.name.startswith(f"decode_layers_{forced}")
    runs = []
    for fast in (True, False):
        eng._step = whole_step if fast else None
        eng.reset()
        steps = [eng.prefill(PROMPT[:5])] + [eng.decode(t) for t in PROMPT[5:12]]
        runs.append((np.stack(steps), eng.cache.k[:, :, :eng.pos].copy(), eng.cache.v[:, :, :eng.pos].copy()))
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)


def test_quantization_effect_on_logits_is_reported(checkpoint):
    _, vqf = checkpoint
    rng = np.random.default_rng(1)
    ids = [int(t) for t in rng.integers(0, VOCAB, 48)]
    logits = {}
    for q, path in vqf.items():
        logits[q] = Qwen3Engine.from_vqf(path, max_context=64).forward_all(ids)
    a8 = logit_agreement(logits["f32"], logits["q8_0"])
    a4 = logit_agreement(logits["f32"], logits["q4_0"])
    for name, a in (("Q8_0", a8), ("Q4_0", a4)):
        print(f"\n{name} vs F32 over {a['positions']} positions: KL mean {a['kl_mean']:.3g} nats "
              f"(max {a['kl_max']:.3g}), top-1 agreement {a['top1_agreement']:.1%}, "
              f"max |Δlogit| {a['max_abs_diff']:.3g} of {a['logit_scale']:.3g}")
    assert 0 <= a8["kl_mean"] < a4["kl_mean"], "Q8_0 should disturb the logits less than Q4_0"
    assert a8["top1_agreement"] >= 0.9
    assert a4["kl_mean"] < 0.5


def test_context_limit_and_truncate(checkpoint):
    _, vqf = checkpoint
    eng = Qwen3Engine.from_vqf(vqf["q8_0"], max_context=20)
    eng.prefill(PROMPT)
    with pytest.raises(ContextFullError, match="max_context=20"):
        eng.prefill(PROMPT)
    assert eng.pos == len(PROMPT)
    a = eng.decode(7)
    eng.truncate(len(PROMPT))
    b = eng.decode(7)
    np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="truncate"):
        eng.truncate(99)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        eng.decode(VOCAB)
    assert eng.stats["decode_tokens"] == 2 and eng.stats["prefill_tokens"] == len(PROMPT)


def test_qwen3_vl_text_tower_matches_transformers(tmp_path):
    """Text-only input to Qwen3-VL: MRoPE's three position components are equal, so the dense engine
    (1-D RoPE) must give Qwen3VLForConditionalGeneration's logits."""
    from kestrel_lab import models

    d = models.hf_checkpoint(arch="qwen3_vl", dtype="float32")
    convert(d, tmp_path / "vl.vqf", quant="f32", hash_source=False)
    model = transformers.Qwen3VLForConditionalGeneration.from_pretrained(d, dtype=torch.float32).eval()
    ids = PROMPT[:12]
    with torch.no_grad():
        ref = model(input_ids=torch.tensor([ids])).logits[0].numpy()
    eng = Qwen3Engine.from_vqf(tmp_path / "vl.vqf", max_context=32)
    assert eng.config.arch == "qwen3_vl" and eng.config.mrope_section
    got = np.stack([eng.prefill(ids[:6])] + [eng.decode(t) for t in ids[6:]])
    assert np.abs(got - ref[5:]).max() <= 1e-4 * np.abs(ref).max()
