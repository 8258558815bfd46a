"""The MoE engine against transformers' Qwen3MoeForCausalLM, on random Qwen3-MoE checkpoints that
transformers itself wrote (``save_pretrained``): F32 logits for prefill and every decode step, greedy
generation, the router's chosen experts per token; Q4_0's effect reported; experts used in place."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is a reference dependency (requirements-ref.txt)")
transformers = pytest.importorskip("transformers", reason="transformers is a reference dependency")

from kestrel_lab.convert import convert  # noqa: E402  (after importorskip)
from kestrel_lab.engine import Qwen3Engine  # noqa: E402  (after importorskip)
from kestrel_lab.engine import moe  # noqa: E402  (after importorskip)
from kestrel_lab.eval import logit_agreement  # noqa: E402  (after importorskip)
from helpers.logits import compare_steps  # noqa: E402  (after importorskip)

VOCAB = 512
PROMPT = [3, 141, 59, 265, 358, 479, 323, 46, 264, 338, 327, 450, 288, 419, 216, 39, 77, 500, 12, 91]

# (experts, top-k, norm_topk_prob, mlp_only_layers, decoder_sparse_step)
CASES = {"e8-top2-norm-dense1": (8, 2, True, [1], 1),
         "e16-top4-nonorm": (16, 4, False, [], 1),
         "e8-top2-step2": (8, 2, True, [], 2)}


def make_checkpoint(out_dir, *, experts, top_k, norm, mlp_only, step, seed):
    """A random Qwen3-MoE (hidden 64, 3 layers, 4/2 heads) written by ``save_pretrained`` in float32."""
    torch.manual_seed(seed)
    cfg = transformers.Qwen3MoeConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        num_experts=experts, num_experts_per_tok=top_k, norm_topk_prob=norm, mlp_only_layers=mlp_only,
        decoder_sparse_step=step, rope_parameters={"rope_theta": 1e6, "rope_type": "default"},
        max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False,
        initializer_range=0.25, bos_token_id=None, eos_token_id=None, pad_token_id=0)
    model = transformers.Qwen3MoeForCausalLM(cfg).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
    model.save_pretrained(out_dir)
    return model


@pytest.fixture(scope="module", params=list(CASES), ids=list(CASES))
def checkpoint(request, tmp_path_factory):
    experts, top_k, norm, mlp_only, step = CASES[request.param]
    d = tmp_path_factory.mktemp(request.param)
    model = make_checkpoint(d, experts=experts, top_k=top_k, norm=norm, mlp_only=mlp_only, step=step,
                            seed=len(request.param))
    vqf = {}
    for q in ("f32", "q4_0"):
        vqf[q] = d / f"model-{q}.vqf"
        convert(d, vqf[q], quant=q, hash_source=False)
    return model, vqf


def hf_logits(model, ids) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def hf_routing(model, ids) -> dict[int, np.ndarray]:
    """Per MoE layer, the experts transformers' router chose for each token (a forward hook)."""
    chosen, hooks = {}, []
    for i, layer in enumerate(model.model.layers):
        if hasattr(layer.mlp, "gate"):
            hooks.append(layer.mlp.gate.register_forward_hook(
                lambda mod, inp, out, i=i: chosen.__setitem__(i, out[2].numpy().copy())))
    try:
        hf_logits(model, ids)
    finally:
        for h in hooks:
            h.remove()
    return chosen


def test_the_layer_map_follows_transformers(checkpoint):
    model, vqf = checkpoint
    eng = Qwen3Engine.from_vqf(vqf["f32"], max_context=64)
    sparse = [i for i, layer in enumerate(model.model.layers) if hasattr(layer.mlp, "gate")]
    assert sorted(eng.moe_layers) == sparse == eng.config.moe_layers
    assert eng.config.dense_layers == [i for i in range(3) if i not in sparse]


def test_f32_prefill_and_every_decode_step_match_transformers(checkpoint):
    model, vqf = checkpoint
    eng = Qwen3Engine.from_vqf(vqf["f32"], max_context=128)
    rng = np.random.default_rng(0)
    cont = [int(t) for t in rng.integers(0, VOCAB, 16)]
    ref = hf_logits(model, PROMPT + cont)
    scale = np.abs(ref).max()
    compare_steps(eng, ref, PROMPT, cont, tol=1e-4, label="F32 MoE engine vs transformers")
    eng.reset()
    assert np.abs(eng.forward_all(PROMPT + cont) - ref).max() <= 1e-4 * scale


def test_router_chooses_the_same_experts_as_transformers(checkpoint):
    model, vqf = checkpoint
    eng = Qwen3Engine.from_vqf(vqf["f32"], max_context=64)
    want = hf_routing(model, PROMPT)
    eng.forward_all(PROMPT)          # one chunk: each layer's last call saw every token
    assert set(want) == set(eng.moe_layers)
    for i, ml in eng.moe_layers.items():
        got, _ = ml.last
        np.testing.assert_array_equal(got, want[i], err_msg=f"layer {i}: experts per token")


def test_greedy_generation_equals_transformers(checkpoint):
    model, vqf = checkpoint
    n = 16
    with torch.no_grad():
        out = model.generate(torch.tensor([PROMPT]), max_new_tokens=n, do_sample=False,
                             attention_mask=torch.ones(1, len(PROMPT), dtype=torch.long))
    want = out[0, len(PROMPT):].tolist()
    eng = Qwen3Engine.from_vqf(vqf["f32"], max_context=64)
    tok, got = int(np.argmax(eng.prefill(PROMPT))), []
    for _ in range(n):
        got.append(tok)
        tok = int(np.argmax(eng.decode(tok)))
    assert got == want


def _dequantized_engine(path):
    """An F32 engine on the Q4_0 file's own weights, dequantized: the same numbers, float kernels."""
    from kestrel_lab.engine import RawTensor
    from kestrel_lab.vqf.reader import open_vqf

    f = open_vqf(path)
    tensors = {}
    for name, t in f.tensors.items():
        x = np.ascontiguousarray(t.dequantize(), dtype=np.float32)
        tensors[name] = RawTensor(1, t.rows, t.cols, x.view(np.uint8).reshape(-1))
    return Qwen3Engine.from_tensors(f.config, tensors, max_context=64)


def test_q4_0_effect_is_reported_and_the_experts_stay_in_place(checkpoint):
    model, vqf = checkpoint
    ref = hf_logits(model, PROMPT)
    eng = Qwen3Engine.from_vqf(vqf["q4_0"], max_context=64)
    got = eng.forward_all(PROMPT)
    a = logit_agreement(ref, got)
    print(f"\nQ4_0 MoE engine vs transformers F32 over {a['positions']} positions: KL mean {a['kl_mean']:.3g} "
          f"nats (max {a['kl_max']:.3g}), top-1 agreement {a['top1_agreement']:.0%}")
    # the same Q4_0 weights dequantized and run in F32: only the Q8_0 activations differ
    same = logit_agreement(_dequantized_engine(vqf["q4_0"]).forward_all(PROMPT), got)
    print(f"Q4_0 kernels vs the same weights in F32: KL mean {same['kl_mean']:.3g}, "
          f"top-1 {same['top1_agreement']:.0%}, max abs diff {same['max_abs_diff']:.3g}")
    assert same["top1_agreement"] >= 0.9 and same["kl_mean"] < 0.05
    assert a["kl_mean"] < 1.0
    mem = eng.memory_report()
    assert {"q4_gate_exps", "q4_up_exps", "q4_down_exps", "moe_router"} <= set(mem["in_place_tensors"])
    assert not {"q4_gate_exps", "q4_up_exps", "q4_down_exps"} & set(mem["copied_tensors"])
    assert mem["experts_in_place_bytes"] > 0
    paths = eng.kernel_paths()
    assert paths["experts"]["Q4_0"]["experts"] == "experts_q4_0"


def test_q4_0_grouped_kernel_equals_expert_by_expert(checkpoint):
    """The grouped in-place Q4_0 kernel computes what the per-expert ``many`` kernels compute."""
    _, vqf = checkpoint
    eng = Qwen3Engine.from_vqf(vqf["q4_0"], max_context=64)
    ml = next(iter(eng.moe_layers.values()))
    x = np.random.default_rng(3).standard_normal((7, 64)).astype(np.float32)
    a = ml.experts.activation(x)
    sel, _ = moe.route(ml.router(a), ml.top_k, ml.norm)
    g = moe.group(sel)
    out_grouped = np.empty((g.n_pairs, 64), np.float32)
    ml.kernel(ml.experts, a, g, out_grouped)
    out_each = np.empty_like(out_grouped)
    from kestrel_lab.kernels.registry import _experts_by_expert
    _experts_by_expert(ml.experts, a, g, out_each)
    np.testing.assert_allclose(out_grouped, out_each, rtol=1e-4, atol=1e-4 * np.abs(out_each).max())


def test_engine_counts_the_expert_bytes_a_token_touches(checkpoint):
    _, vqf = checkpoint
    eng = Qwen3Engine.from_vqf(vqf["q4_0"], max_context=64)
    eng.prefill(PROMPT[:4])
    eng.reset_moe_counters()
    eng.decode(5)
    rep = eng.moe_report()
    c = eng.config
    per_expert = next(iter(eng.moe_layers.values())).experts.expert_bytes
    assert per_expert == 3 * c.moe_intermediate_size * c.hidden_size // 32 * 18
    router = c.num_experts * c.hidden_size * 4
    assert rep["bytes_touched"] == len(c.moe_layers) * (router + c.num_experts_per_tok * per_expert)
    assert rep["distinct_experts"] == [c.num_experts_per_tok] * len(c.moe_layers)


def test_route_matches_torch_topk_and_normalisation():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((50, 16)).astype(np.float32) * 3
    for norm in (True, False):
        idx, w = moe.route(logits, 4, norm)
        p = torch.softmax(torch.tensor(logits), dim=-1, dtype=torch.float)
        tv, ti = torch.topk(p, 4, dim=-1)
        if norm:
            tv = tv / tv.sum(-1, keepdim=True)
        np.testing.assert_array_equal(idx, ti.numpy())
        np.testing.assert_allclose(w, tv.numpy(), rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="top_k"):
        moe.route(logits, 17, True)


def test_exact_expert_paging_changes_no_number(checkpoint):
    """expert_paging="exact" only advises the kernel (MADV_RANDOM / MADV_WILLNEED): same logits."""
    _, vqf = checkpoint
    a = Qwen3Engine.from_vqf(vqf["q4_0"], max_context=64).forward_all(PROMPT)
    eng = Qwen3Engine.from_vqf(vqf["q4_0"], max_context=64, expert_paging="exact")
    np.testing.assert_array_equal(eng.forward_all(PROMPT), a)
    with pytest.raises(ValueError, match="expert paging"):
        Qwen3Engine.from_vqf(vqf["q4_0"], max_context=64, expert_paging="lazy")


def test_a_prompt_longer_than_one_prefill_chunk(checkpoint):
    """Grouping by expert happens per chunk of 64 tokens: two chunks give transformers' logits too."""
    model, vqf = checkpoint
    ids = [int(t) for t in np.random.default_rng(5).integers(0, VOCAB, 100)]
    ref = hf_logits(model, ids)
    eng = Qwen3Engine.from_vqf(vqf["f32"], max_context=128)
    got = eng.forward_all(ids)
    assert np.abs(got - ref).max() <= 1e-4 * np.abs(ref).max()
    eng.reset()
    assert np.abs(eng.prefill(ids) - ref[-1]).max() <= 1e-4 * np.abs(ref).max()
