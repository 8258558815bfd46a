"""The generation loop and the multi-turn conversation, on a stand-in engine (no weights)."""
from __future__ import annotations

import numpy as np
import pytest

from kestrel_lab.engine.chat import IM_END, Conversation, render
from kestrel_lab.engine.generate import generate, run_turn
from kestrel_lab.engine.sample import Sampler, SamplingParams
from helpers.fake_engine import ENDOFTEXT, FakeEngine, tokenizer


def _manual_greedy(engine, prompt, n):
    engine.reset()
    logits = engine.prefill(prompt)
    out = []
    for _ in range(n):
        t = int(np.argmax(logits))
        if t in (ENDOFTEXT, IM_END):
            break
        out.append(t)
        logits = engine.decode(t)
    return out


def test_greedy_equals_a_hand_written_loop_and_cache_holds_prompt_plus_fed_ids():
    tok = tokenizer()
    prompt = tok.encode("《夜思》\n作者：李白\n")
    e = FakeEngine()
    ref = _manual_greedy(e, prompt, 12)
    e2 = FakeEngine()
    pieces = []
    out = generate(e2, tok, prompt, max_new=12, on_text=pieces.append)
    assert out.ids == ref[:12]
    assert e2.ids == prompt + out.fed_ids
    assert out.fed_ids == out.ids[:-1] and out.stats.stop_reason == "length"
    assert "".join(pieces) == out.text == tok.decode(out.ids)
    s = out.stats
    assert (s.prompt_tokens, s.prefilled_tokens, s.reused_tokens, s.new_tokens, s.decoded_tokens) == \
        (len(prompt), len(prompt), 0, 12, 11)
    assert 0 < s.ttft_s <= s.total_s and s.decode_s > 0 and s.prefill_s > 0
    assert "prefill" in s.line() and "tok/s" in s.line()


def test_text_prompt_and_id_prompt_agree():
    tok = tokenizer()
    a = generate(FakeEngine(), tok, "床前明月光", max_new=5)
    b = generate(FakeEngine(), tok, tok.encode("床前明月光"), max_new=5)
    assert a.ids == b.ids


def test_stops_on_stop_token_which_is_not_fed_back():
    tok = tokenizer()
    reply = tok.encode("低头思故乡。")
    e = FakeEngine(reply=reply)
    prompt = tok.encode(render([{"role": "user", "content": "下一句？"}]), allow_special=True)
    out = generate(e, tok, prompt, max_new=100)
    assert out.ids == reply and out.stop_id == IM_END and out.stats.stop_reason == "stop"
    assert out.text == "低头思故乡。"
    assert e.ids == prompt + reply  # every generated id decoded, the stop token never
    assert out.fed_ids == reply


def test_context_limit_stops_cleanly_and_long_prompt_is_refused():
    tok = tokenizer()
    prompt = tok.encode("床前明月光")
    e = FakeEngine(max_context=len(prompt) + 3)
    out = generate(e, tok, prompt, max_new=50)
    assert out.stats.stop_reason == "context" and e.pos == e.max_context
    with pytest.raises(ValueError, match="context limit"):
        generate(FakeEngine(max_context=2), tok, prompt)


def test_seeded_sampling_is_reproducible():
    tok = tokenizer()
    p = SamplingParams(temperature=1.5, top_k=50, seed=42)
    a = generate(FakeEngine(), tok, "春眠不觉晓", p, max_new=20, stop_ids=())
    b = generate(FakeEngine(), tok, "春眠不觉晓", p, max_new=20, stop_ids=())
    c = generate(FakeEngine(), tok, "春眠不觉晓", p.with_(seed=43), max_new=20, stop_ids=())
    assert a.ids == b.ids and a.ids != c.ids


def test_max_new_zero_and_bad_arguments():
    tok = tokenizer()
    out = generate(FakeEngine(), tok, "a", max_new=0)
    assert out.ids == [] and out.stats.new_tokens == 0
    with pytest.raises(ValueError, match="empty"):
        generate(FakeEngine(), tok, "")
    with pytest.raises(TypeError):
        generate(FakeEngine(), tok, "a", SamplingParams(), sampler=Sampler())
    with pytest.raises(ValueError):
        run_turn(FakeEngine(), tok, np.zeros(10), Sampler(), max_new=-1)


# ----------------------------------------------------------------------------- conversations
def _conv(thinking: bool, reply_text="好的。"):
    tok = tokenizer()
    e = FakeEngine(reply=tok.encode(reply_text))
    return Conversation(e, tok, system="你是诗人。", enable_thinking=thinking), e, tok


@pytest.mark.parametrize("thinking", [True, False])
def test_each_turn_prefills_only_what_the_cache_lacks(thinking):
    conv, e, tok = _conv(thinking)
    questions = ["你好", "背一首李白的诗", "再来一首"]
    for k, q in enumerate(questions):
        before = len(e.prefills)
        res = conv.ask(q)
        assert res.text == "好的。" and res.stats.stop_reason == "stop"
        full = tok.encode(render(conv.messages[:-1], enable_thinking=thinking), allow_special=True)
        assert res.stats.prompt_tokens == len(full)
        # the cache holds exactly the prompt and the reply (what a full re-prefill would hold)
        assert e.ids == conv.cached_ids == full + res.ids
        assert len(e.prefills) == before + 1
        prefilled = e.prefills[-1]
        assert res.stats.reused_tokens + res.stats.prefilled_tokens == len(full)
        assert prefilled == full[res.stats.reused_tokens:]
        if k:
            assert res.stats.reused_tokens > 0 and len(prefilled) < len(full) // 2 + 20
    # thinking off: the empty think block of the generation prompt vanishes from the history, so the
    # cache is cut back to just after "<|im_start|>assistant\n" of the previous answer
    if thinking:
        assert e.truncations == []
    else:
        assert len(e.truncations) == 2


def test_reasoning_in_the_reply_is_dropped_from_the_next_prompt():
    conv, e, tok = _conv(True, reply_text="<think>\n想想\n</think>\n\n好的。")
    r1 = conv.ask("问题一")
    assert r1.reasoning == "想想" and r1.answer == "好的。"
    r2 = conv.ask("问题二")
    prompt = tok.decode(e.ids[:r2.stats.prompt_tokens])
    assert "想想" not in prompt and prompt.count("好的。") == 1
    assert e.truncations  # the reasoning was in the cache and had to go


def test_same_logits_as_a_fresh_full_prefill():
    tok = tokenizer()
    conv = Conversation(FakeEngine(), tok, params=SamplingParams(temperature=0.0), max_new=6)
    conv.ask("第一问")
    res = conv.ask("第二问")
    fresh = FakeEngine()
    ref = generate(fresh, tok, tok.encode(render(conv.messages[:-1]), allow_special=True), max_new=6)
    assert res.ids == ref.ids


def test_context_overflow_is_a_clear_error_and_leaves_a_usable_conversation():
    conv, e, tok = _conv(False)
    e.max_context = 40
    with pytest.raises(ValueError, match="context"):
        conv.ask("很长的问题" * 20)
    assert conv.messages == [{"role": "system", "content": "你是诗人。"}] and conv.cached_ids == []
    conv.reset()
    assert conv.ask("短").text == "好的。"
