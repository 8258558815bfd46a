"""The Python Qwen3 chat template against transformers' apply_chat_template running the Jinja text.

tests/fixtures/qwen3_chat_template.jinja is Qwen3's chat template (the ``chat_template`` field of
Qwen3's tokenizer_config.json: tools, thinking switch, reasoning dropped from history), written out
here because nothing may be downloaded. transformers renders it with its own Jinja environment and
tokenizes with the generated Qwen3 tokenizer.json; our ``render`` + ``Tokenizer.encode`` must give the
same text and the same ids.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from kestrel_lab.engine import chat
from kestrel_lab.engine.chat import render, split_reasoning

FIXTURE = Path(__file__).parent / "fixtures" / "qwen3_chat_template.jinja"


@lru_cache(maxsize=1)
def _hf():
    pytest.importorskip("transformers")
    from transformers import PreTrainedTokenizerFast

    from kestrel_lab.vocab import default_tokenizer_json

    return PreTrainedTokenizerFast(tokenizer_file=str(default_tokenizer_json()),
                                   chat_template=FIXTURE.read_text(encoding="utf-8"))


@lru_cache(maxsize=1)
def _ours():
    from kestrel_lab.vocab import Tokenizer

    return Tokenizer.default(encoder="bpe")


def _hf_render(messages, gen=True, thinking=None, ids=False, tools=None):
    kwargs = {} if thinking is None else {"enable_thinking": thinking}
    out = _hf().apply_chat_template(messages, tools=tools, tokenize=ids, add_generation_prompt=gen, **kwargs)
    if ids and not isinstance(out, list):
        out = out["input_ids"]
    return out


def _check(messages, gen=True, thinking=None, tools=None):
    text = render(messages, add_generation_prompt=gen,
                  enable_thinking=True if thinking is None else thinking, tools=tools)
    assert text == _hf_render(messages, gen, thinking, tools=tools)
    ours = _ours().encode(text, allow_special=True)
    assert ours == _hf_render(messages, gen, thinking, ids=True, tools=tools)
    return text, ours


SYS = {"role": "system", "content": "你是一个乐于助人的助手。"}
CASES = {
    "user only": [{"role": "user", "content": "你好"}],
    "system + user": [SYS, {"role": "user", "content": "写一首关于月亮的诗"}],
    "english": [{"role": "system", "content": "You are Qwen."}, {"role": "user", "content": "Hi, who are you?"}],
    "emoji and newlines": [{"role": "user", "content": "🙂👍🏽 第一行\n第二行\n\n  缩进  "}],
    "multi-turn plain": [SYS, {"role": "user", "content": "1+1=?"}, {"role": "assistant", "content": "2"},
                         {"role": "user", "content": "再加一呢？"}],
    "reasoning in history dropped": [
        {"role": "user", "content": "为什么天是蓝的？"},
        {"role": "assistant", "content": "<think>\n瑞利散射……\n</think>\n\n因为瑞利散射。"},
        {"role": "user", "content": "那晚霞呢？"}],
    "reasoning_content field": [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1", "reasoning_content": "r1"},
        {"role": "user", "content": "q2"}],
    "last assistant keeps reasoning": [
        {"role": "user", "content": "算 12×12"},
        {"role": "assistant", "content": "<think>\n12×12=144\n</think>\n\n144"}],
    "last assistant without reasoning gets empty think": [
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}],
    "system in the middle": [SYS, {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                             {"role": "system", "content": "换成英文回答"}, {"role": "user", "content": "c"}],
    "think without opening tag": [{"role": "user", "content": "x"},
                                  {"role": "assistant", "content": "推理\n</think>\n答案"},
                                  {"role": "user", "content": "y"}],
    "tool response turns": [
        {"role": "user", "content": "北京天气？"},
        {"role": "assistant", "content": "<think>\n查一下\n</think>\n\n",
         "tool_calls": [{"function": {"name": "weather", "arguments": {"city": "北京"}}}]},
        {"role": "tool", "content": "晴，25℃"}, {"role": "tool", "content": "湿度 40%"},
        {"role": "assistant", "content": "<think>\n整理\n</think>\n\n北京晴，25℃。"}],
    "empty content": [{"role": "user", "content": ""}, {"role": "assistant", "content": ""},
                      {"role": "user", "content": "?"}],
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("thinking", [None, True, False])
@pytest.mark.parametrize("gen", [True, False])
def test_same_text_and_ids_as_transformers(name, thinking, gen):
    _check(CASES[name], gen=gen, thinking=thinking)


def test_tools_system_block():
    params = {"type": "object", "properties": {"city": {"type": "string"}}}
    tools = [{"type": "function", "function": {"name": "weather", "description": "查天气", "parameters": params}}]
    _check([SYS, {"role": "user", "content": "天气"}], tools=tools)
    _check([{"role": "user", "content": "天气"}], tools=tools, thinking=False)


def test_thinking_switch_adds_exactly_the_empty_think_block():
    msgs = CASES["system + user"]
    on, ids_on = _check(msgs, thinking=True)
    off, ids_off = _check(msgs, thinking=False)
    assert off == on + "<think>\n\n</think>\n\n"
    tail = ids_off[len(ids_on):]
    assert tail[0] == chat.THINK and chat.END_THINK in tail
    assert ids_on[-3:] == [chat.IM_START, 77091, 198]  # <|im_start|> "assistant" "\n"


_text = st.lists(st.sampled_from(list("床前明月光，疑是地上霜。ab c\n🙂é") + ["<think>", "</think>", "\n\n"]),
                 max_size=12).map("".join)


@st.composite
def conversations(draw):
    msgs = []
    if draw(st.booleans()):
        msgs.append({"role": "system", "content": draw(_text)})
    for _ in range(draw(st.integers(1, 4))):
        msgs.append({"role": "user", "content": draw(_text)})
        if draw(st.booleans()):
            m = {"role": "assistant", "content": draw(_text)}
            if draw(st.integers(0, 3)) == 0:
                m["reasoning_content"] = draw(_text)
            msgs.append(m)
    return msgs


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversations(), st.sampled_from([None, True, False]), st.booleans())
def test_random_conversations(messages, thinking, gen):
    _check(messages, gen=gen, thinking=thinking)


def test_split_reasoning():
    assert split_reasoning("<think>\nA\n</think>\n\nB") == ("A", "B")
    assert split_reasoning("no think") == ("", "no think")
    assert split_reasoning("x</think>y</think>\nz") == ("x", "z")


@pytest.mark.parametrize("bad, why", [
    ([], "empty"), ([{"content": "x"}], "role"), ([{"role": "bot", "content": "x"}], "bot"),
    ([{"role": "user", "content": 3}], "content"), ([{"role": "system", "content": None}], "system"),
])
def test_bad_messages(bad, why):
    with pytest.raises(ValueError, match=why):
        render(bad)
