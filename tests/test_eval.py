"""kestrel_lab.eval against implementations nobody here wrote: transformers' loss (perplexity on the same
windows), torch's KL divergence, transformers' per-layer hidden states, gguf-py's quantizers (SNR)."""
import json

import numpy as np
import pytest

from kestrel_lab import eval as E
from kestrel_lab import models, paths
from kestrel_lab import quant as Q
from kestrel_lab.engine import Qwen3Engine

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def _poem_tokens() -> np.ndarray:
    """The poem model's five greedy.json cases, prompt + continuation, one after the other (~290 ids)."""
    cases = json.loads((paths.tiny_poem_dir() / "greedy.json").read_text(encoding="utf-8"))["cases"]
    return np.asarray([t for c in cases for t in c["prompt_ids"] + c["greedy_ids"]], np.int64)


@pytest.fixture(scope="module")
def hf_poem():
    torch.set_num_threads(2)
    return transformers.Qwen3ForCausalLM.from_pretrained(paths.tiny_poem_dir(), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def f32_poem():
    return Qwen3Engine.from_vqf(models.vqf("qwen3-tiny-poem", quant="f32"), max_context=256)


# ----------------------------------------------------------------------------- windows
def _guide_windows(n, max_length, stride):
    """HF's perplexity guide, literally: (begin, end, trg_len) per window."""
    out, prev_end = [], 0
    for begin in range(0, n, stride):
        end = min(begin + max_length, n)
        out.append((begin, end, end - prev_end))
        prev_end = end
        if end == n:
            break
    return out


@pytest.mark.parametrize("n,window,stride", [(1000, 256, 128), (257, 256, 128), (256, 256, 128), (300, 64, 32),
                                             (10, 256, 128), (2, 256, 128), (777, 100, 99)])
def test_windows_score_every_token_once_as_the_guide_does(n, window, stride):
    wins = E.windows(n, window, stride)
    scored = np.zeros(n, int)
    for w in wins:
        assert w.end - w.begin <= window and w.begin < w.first < w.end
        scored[w.first:w.end] += 1
    assert scored[0] == 0 and (scored[1:] == 1).all()
    guide = _guide_windows(n, window, stride)
    assert [(w.begin, w.end) for w in wins] == [(b, e) for b, e, _ in guide]
    # after the first window, the scored tokens are the guide's trg_len, and the overlap is context
    assert [w.scored for w in wins[1:]] == [t for _, _, t in guide[1:]]
    assert all(w.first - w.begin >= window - stride for w in wins[1:])


@pytest.mark.parametrize("stride", [65, 64, 0])
def test_windows_reject_a_stride_that_leaves_no_context(stride):
    """stride == window would leave the first token of every window unscored (no context to predict it)."""
    with pytest.raises(ValueError, match="stride"):
        E.windows(100, 64, stride)


# ----------------------------------------------------------------------------- perplexity vs transformers
@pytest.mark.parametrize("window,stride", [(256, 128), (64, 32), (48, 16)])
def test_perplexity_equals_transformers_loss_on_the_same_windows(f32_poem, hf_poem, window, stride):
    ids = _poem_tokens()
    ours = E.perplexity(f32_poem, ids, window, stride)
    theirs = E.perplexity_hf(hf_poem, ids, window, stride)
    assert ours.scored == theirs.scored == ids.size - 1 and ours.windows == theirs.windows
    assert ours.mean_nll == pytest.approx(theirs.mean_nll, abs=2e-5, rel=1e-5)
    # and window by window: the mean of our per-token NLLs is transformers' loss of that window
    for w, loss in zip(E.windows(ids.size, window, stride), theirs.nll):
        assert ours.nll[w.first - 1:w.end - 1].mean() == pytest.approx(loss, abs=2e-5, rel=1e-5)


def test_one_window_against_the_model_loss_directly(f32_poem, hf_poem):
    """No loop of ours on the transformers side: one forward with labels, its .loss."""
    ids = _poem_tokens()[:200]
    with torch.no_grad():
        loss = float(hf_poem(input_ids=torch.tensor(ids[None]), labels=torch.tensor(ids[None])).loss)
    ours = E.perplexity(f32_poem, ids)
    assert ours.windows == 1 and ours.mean_nll == pytest.approx(loss, abs=2e-5, rel=1e-5)
    assert ours.ppl == pytest.approx(np.exp(loss), rel=1e-4)


def test_perplexity_on_a_random_checkpoint_saved_by_transformers():
    folder = models.hf_checkpoint("random", saver="transformers", dtype="float32")
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    eng = Qwen3Engine.from_vqf(models.vqf(folder, quant="f32"), max_context=128)
    ids = np.random.default_rng(1).integers(0, hf.config.vocab_size, 300)
    ours, theirs = E.perplexity(eng, ids, 128, 64), E.perplexity_hf(hf, ids, 128, 64)
    assert ours.mean_nll == pytest.approx(theirs.mean_nll, abs=2e-5, rel=1e-5)
    assert ours.ppl > 10  # random weights on random ids: nowhere near 1


def test_perplexity_accepts_a_path_and_every_quant_stays_close_in_domain():
    ids = _poem_tokens()
    ppl = {q: E.perplexity(models.vqf("qwen3-tiny-poem", quant=q), ids).ppl for q in ("f32", "q8_0", "q4_0")}
    assert 1.0 <= ppl["f32"] < 5          # the continuations are memorised; the prompts (titles) are guesses
    assert abs(np.log(ppl["q8_0"]) - np.log(ppl["f32"])) < 0.1


def test_perplexity_rejects_bad_input(f32_poem):
    with pytest.raises(ValueError, match="at least 2"):
        E.perplexity(f32_poem, [5])
    with pytest.raises(ValueError, match="1-D integer"):
        E.perplexity(f32_poem, np.zeros((2, 3), np.int64))
    short = Qwen3Engine.from_vqf(models.vqf("qwen3-tiny-poem", quant="q8_0"), max_context=64)
    with pytest.raises(ValueError, match="max_context 64"):
        E.perplexity(short, _poem_tokens())


# ----------------------------------------------------------------------------- KL, top-1, cosine
def test_kl_top1_matches_torch_kl_div_and_logit_agreement(f32_poem):
    ids = _poem_tokens()[:150]
    q8 = Qwen3Engine.from_vqf(models.vqf("qwen3-tiny-poem", quant="q8_0"), max_context=256)
    r = E.kl_top1(q8, f32_poem, ids)
    zf, zq = f32_poem.forward_all(ids), q8.forward_all(ids)
    f32_poem.reset()
    q8.reset()
    lp = torch.log_softmax(torch.tensor(zf, dtype=torch.float64), -1)
    lq = torch.log_softmax(torch.tensor(zq, dtype=torch.float64), -1)
    want = torch.nn.functional.kl_div(lq, lp, log_target=True, reduction="none").sum(-1).numpy()
    np.testing.assert_allclose(r.kl, want, rtol=1e-3, atol=1e-8)   # float32 logits: last-bit noise on tiny KLs
    assert (r.top1 == (zf.argmax(-1) == zq.argmax(-1))).all()
    agree = E.logit_agreement(zf, zq)
    assert agree["kl_mean"] == pytest.approx(r.kl_mean, rel=1e-9) and agree["top1_agreement"] == r.top1_agreement
    assert 0 < r.kl_mean < 0.1
    same = E.kl_top1(models.vqf("qwen3-tiny-poem", quant="f32"), f32_poem, ids)
    assert same.kl_max < 1e-9 and same.top1.all()
    with pytest.raises(ValueError, match="two engines"):
        E.kl_top1(f32_poem, f32_poem, ids)


def test_trace_hook_sees_what_transformers_layers_output(f32_poem, hf_poem):
    ids = _poem_tokens()[:100]
    got = E.trace_hidden(f32_poem, ids)
    seen = []
    hooks = [layer.register_forward_hook(lambda m, a, out: seen.append((out[0] if isinstance(out, tuple) else out)[0]))
             for layer in hf_poem.model.layers]
    try:
        with torch.no_grad():
            hf_poem(input_ids=torch.tensor(ids[None]))
    finally:
        for h in hooks:
            h.remove()
    want = torch.stack(seen).numpy()
    assert got.shape == want.shape == (hf_poem.config.num_hidden_layers, ids.size, hf_poem.config.hidden_size)
    scale = np.abs(want).max(axis=(1, 2), keepdims=True)
    assert (np.abs(got - want) / scale).max() < 1e-4
    assert f32_poem.trace is None          # the hook is removed afterwards


def test_a_traced_decode_step_equals_the_untraced_one():
    eng = Qwen3Engine.from_vqf(models.vqf("qwen3-tiny-poem", quant="q4_0"), max_context=64)
    ids = _poem_tokens()[:20]
    eng.prefill(ids[:-1])
    plain = eng.decode(int(ids[-1]))      # the whole-step kernel where available
    eng.reset()
    calls = []
    eng.trace = lambda layer, h: calls.append((layer, h.shape))
    eng.prefill(ids[:-1])
    calls.clear()
    traced = eng.decode(int(ids[-1]))     # layer by layer
    assert [c[0] for c in calls] == list(range(eng.config.num_hidden_layers))
    assert np.abs(traced - plain).max() < 0.05 * np.abs(plain).max()
    assert int(traced.argmax()) == int(plain.argmax())


def test_hidden_cosine_is_one_for_the_twin_and_below_one_for_q4(f32_poem):
    ids = _poem_tokens()[:64]
    same = E.hidden_cosine(f32_poem, f32_poem, ids)
    assert same.shape == (f32_poem.config.num_hidden_layers, ids.size) and np.allclose(same, 1, atol=1e-9)
    q4 = E.hidden_cosine(models.vqf("qwen3-tiny-poem", quant="q4_0"), f32_poem, ids)
    assert 0.5 < q4.mean() < 1 - 1e-6


# ----------------------------------------------------------------------------- SNR
def test_tensor_snr_db_matches_gguf_round_trip():
    gguf_quants = pytest.importorskip("gguf.quants")
    from gguf import GGMLQuantizationType as G

    x = np.random.default_rng(0).standard_normal((96, 256)).astype(np.float32)
    for name, gt in (("q8_0", G.Q8_0), ("q4_0", G.Q4_0)):
        xh = gguf_quants.dequantize(gguf_quants.quantize(x, gt), gt).reshape(x.shape).astype(np.float64)
        want = 10 * np.log10((x.astype(np.float64) ** 2).sum() / ((x - xh) ** 2).sum())
        assert Q.tensor_snr_db(x, name) == pytest.approx(want, abs=1e-9)
    assert Q.tensor_snr_db(x, "f32") == float("inf")
    assert 20 < Q.tensor_snr_db(x, "q8_0") - Q.tensor_snr_db(x, "q4_0") < 28   # ~6 dB per bit, 4 bits
    assert Q.tensor_snr_db(np.zeros((1, 32), np.float32), "q4_0") == float("inf")


def test_snr_table_of_the_poem_file():
    rows = E.snr_table(models.vqf("qwen3-tiny-poem", quant="f32"), models.vqf("qwen3-tiny-poem", quant="q4_0"))
    by = {r["tensor"]: r for r in rows}
    assert by["q4_q"]["qtype"] == "Q4_0" and by["attn_norm"]["snr_db"] == float("inf")
    assert by["token_embed"]["qtype"] == "F16" and by["token_embed"]["snr_db"] > by["q4_q"]["snr_db"] + 20
    assert 10 < by["q4_down"]["snr_db"] < 30


def test_snr_table_needs_an_f32_twin():
    with pytest.raises(ValueError, match="F32 .* twin"):
        E.snr_table(models.vqf("qwen3-tiny-poem", quant="q8_0"), models.vqf("qwen3-tiny-poem", quant="q4_0"))


# ----------------------------------------------------------------------------- data
def test_read_fortunes_strips_colour_codes_and_separators(tmp_path):
    p = tmp_path / "poems"
    p.write_text("\x1b[32m《静夜思》\x1b[m\n\x1b[33m作者：李白\x1b[m\n床前明月光，疑是地上霜。\n%\n\n第二首\n%\n",
                 encoding="utf-8")
    assert E.read_fortunes(p) == ["《静夜思》\n作者：李白\n床前明月光，疑是地上霜。\n", "第二首\n"]
    bad = tmp_path / "bad"
    bad.write_bytes("好".encode() + b"\xff\xfe")
    with pytest.raises(ValueError, match=r"bad: not UTF-8 at byte offset 3"):
        E.read_fortunes(bad)


def test_encode_entries_joins_with_the_separator_and_stops_at_max_tokens():
    class Chars:
        def encode(self, text, allow_special=True):
            return [ord(c) for c in text]

    ids = E.encode_entries(["ab\n", "c\n"], Chars(), separator=0)
    assert ids.tolist() == [97, 98, 10, 0, 99, 10]
    assert E.encode_entries(["ab\n", "c\n"], Chars(), 0, max_tokens=4).tolist() == [97, 98, 10, 0]


@pytest.mark.skipif(E.fortunes_path("tang300") is None, reason="Debian's fortunes-zh is not installed")
def test_the_poem_model_memorised_tang300_and_not_modern_prose(f32_poem):
    from kestrel_lab.vocab import Tokenizer

    tok = Tokenizer.default()
    poems = E.encode_entries(E.read_fortunes(E.fortunes_path("tang300")), tok, 151643, 400)
    prose = E.encode_entries(E.read_fortunes(E.fortunes_path("chinese")), tok, 151643, 400)
    assert E.perplexity(f32_poem, poems).ppl < 1.1
    assert E.perplexity(f32_poem, prose).ppl > 100


# ----------------------------------------------------------------------------- the command line
def test_eval_ppl_and_kl_commands(tmp_path, capsys):
    from kestrel_lab import cli
    from kestrel_lab.engine.generate import ENDOFTEXT
    from kestrel_lab.vocab import Tokenizer

    text = tmp_path / "poems.txt"
    text.write_text("《静夜思》\n作者：李白\n床前明月光，疑是地上霜。\n举头望明月，低头思故乡。\n%\n"
                    "《春晓》\n作者：孟浩然\n春眠不觉晓，处处闻啼鸟。\n夜来风雨声，花落知多少。\n", encoding="utf-8")
    q4, f32 = str(models.vqf("qwen3-tiny-poem", quant="q4_0")), str(models.vqf("qwen3-tiny-poem", quant="f32"))
    assert cli.main(["eval", "ppl", q4, "--text", str(text), "--json", "--window", "32", "--stride", "16"]) == 0
    got = json.loads(capsys.readouterr().out)
    ids = E.encode_entries(E.read_fortunes(text), Tokenizer.default(), ENDOFTEXT)
    assert got["tokens"] == ids.size and got["ppl"] == pytest.approx(E.perplexity(q4, ids, 32, 16).ppl, rel=1e-9)
    assert cli.main(["eval", "kl", q4, f32, "--text", str(text), "--json"]) == 0
    kl = json.loads(capsys.readouterr().out)
    assert kl["positions"] == ids.size and 0 <= kl["top1_agreement"] <= 1 and kl["kl_mean"] > 0
    assert cli.main(["eval", "ppl", q4, "--fortunes", "no-such-file"]) == 1
    assert "no-such-file: no such fortunes-zh file" in capsys.readouterr().err
