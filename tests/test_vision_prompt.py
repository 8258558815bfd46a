"""The VL prompt against transformers: the real Qwen3-VL chat template, the processor's pad expansion.

tests/fixtures/qwen3_vl_chat_template.jinja is Qwen3-VL-Instruct's ``chat_template``, written out here
because nothing may be downloaded: 5,292 bytes whose sha256 (checked below) is the one a third party
pinned for the template shipped in Qwen/Qwen3-VL-8B-Instruct-GGUF (TensorSharp's
QwenImageIntentScorerTests). transformers renders it with its own Jinja environment.

The processor (``Qwen3VLProcessor``) cannot be built here (its video processor needs torchvision), so
its pad expansion — ``text.replace(image_token, image_token * (t·h·w // merge²))`` per image, in order,
then tokenize — is replayed on the text, and transformers' tokenizer gives the reference ids.
"""
from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

from kestrel_lab import tiny_model
from kestrel_lab.vision import prompt
from kestrel_lab.vision.prompt import (IMAGE_PAD, VISION_END, VISION_START, expand_image_pads, image_key,
                                       mm_token_type_ids, render_vl_chat, reuse_keys)

FIXTURE = Path(__file__).parent / "fixtures" / "qwen3_vl_chat_template.jinja"
SHA256 = "3636d0f0bd6bef02654cdffdc447b79cb2cef8ab02cc75267345946291a489e4"


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


def img(n=1):
    return [{"type": "image"}] * n


def text(s):
    return [{"type": "text", "text": s}]


CASES = {
    "one image": [{"role": "user", "content": img() + text("这张图里有什么？")}],
    "two images": [{"role": "user", "content": img(2) + text("Compare them.")}],
    "plain string": [{"role": "user", "content": "你好"}],
    "system + image": [{"role": "system", "content": "你是一个看图说话的助手。"},
                       {"role": "user", "content": img() + text("描述一下。")}],
    "system as list": [{"role": "system", "content": text("Be brief.")},
                       {"role": "user", "content": img() + text("What is it?")}],
    "image in second turn": [{"role": "user", "content": text("我先问个问题：1+1=?")},
                             {"role": "assistant", "content": "2"},
                             {"role": "user", "content": img() + text("那这张图呢？")}],
    "image_url item, text between": [{"role": "user", "content": text("A: ") + [{"image_url": "x.png"}]
                                      + text(" B: ") + [{"type": "image", "image": "y.png"}]}],
    "assistant as list": [{"role": "user", "content": img() + text("?")},
                          {"role": "assistant", "content": text("一只猫。")},
                          {"role": "user", "content": text("颜色呢？")}],
    "tool with image": [{"role": "user", "content": text("look")},
                        {"role": "assistant", "content": "",
                         "tool_calls": [{"function": {"name": "camera", "arguments": {"zoom": 2}}}]},
                        {"role": "tool", "content": img() + text("snapshot")}],
}


def test_fixture_is_the_shipped_template():
    data = FIXTURE.read_bytes()
    assert len(data) == 5292 and hashlib.sha256(data).hexdigest() == SHA256


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("gen", [True, False])
def test_render_equals_the_jinja_template(name, gen):
    messages = CASES[name]
    ours = render_vl_chat(messages, add_generation_prompt=gen)
    assert ours == _hf().apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
    assert "<think>" not in ours
    if messages[0]["role"] != "system":
        assert ours.startswith("<|im_start|>user\n")       # no default system message


def test_render_with_vision_ids_and_tools():
    messages = CASES["two images"]
    tools = [{"type": "function", "function": {"name": "zoom", "parameters": {"type": "object"}}}]
    for kw in ({"add_vision_id": True}, {"tools": tools}):
        assert render_vl_chat(messages, **kw) == _hf().apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **kw)


def _processor_ids(messages, grids):
    """What Qwen3VLProcessor does: expand the pad in the text, image by image, then tokenize."""
    s = _hf().apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    parts = s.split("<|image_pad|>")
    assert len(parts) == len(grids) + 1
    out = parts[0]
    for g, rest in zip(grids, parts[1:]):
        out += "<|image_pad|>" * (int(np.prod(g)) // 4) + rest
    return _hf()(out, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("name, grids", [("one image", [(1, 16, 16)]), ("two images", [(1, 30, 40), (1, 20, 14)]),
                                         ("image in second turn", [(1, 6, 10)]), ("plain string", [])])
def test_ids_equal_the_processor_path(name, grids):
    messages = CASES[name]
    ids = prompt.encode_vl_chat(_ours(), messages, grids)
    assert ids == _processor_ids(messages, grids)
    assert ids.count(IMAGE_PAD) == sum(int(np.prod(g)) // 4 for g in grids)
    assert ids.count(VISION_START) == ids.count(VISION_END) == len(grids)


def test_token_ids_agree_with_the_vocabulary_and_config():
    hf = _hf()
    for tid, tok in ((IMAGE_PAD, "<|image_pad|>"), (VISION_START, "<|vision_start|>"),
                     (VISION_END, "<|vision_end|>")):
        assert hf.convert_tokens_to_ids(tok) == tid
    cfg = tiny_model.default_config("qwen3_vl")
    assert prompt.vision_tokens(cfg) == prompt.VisionTokens(IMAGE_PAD, VISION_START, VISION_END)
    assert prompt.vision_tokens(None).image_pad == cfg["image_token_id"]
    with pytest.raises(ValueError, match="image_token_id"):
        prompt.vision_tokens({"model_type": "qwen3"})


def test_expand_image_pads_counts():
    ids = [1, VISION_START, IMAGE_PAD, VISION_END, 2, VISION_START, IMAGE_PAD, VISION_END]
    out = expand_image_pads(ids, [(1, 4, 6), (1, 2, 2)])
    assert out == [1, VISION_START] + [IMAGE_PAD] * 6 + [VISION_END, 2, VISION_START, IMAGE_PAD, VISION_END]
    with pytest.raises(ValueError, match="2 image pads .* but 1 images"):
        expand_image_pads(ids, [(1, 4, 6)])
    with pytest.raises(ValueError, match="7 image pads"):
        expand_image_pads(out, [(1, 4, 6), (1, 2, 2)])     # already expanded
    with pytest.raises(ValueError, match="encode_vl_chat: the messages hold 2 images"):
        prompt.encode_vl_chat(_ours(), CASES["two images"], [(1, 4, 4)])


def test_mm_token_type_ids_like_transformers():
    pytest.importorskip("transformers")
    from transformers.processing_utils import ProcessorMixin

    ids = prompt.encode_vl_chat(_ours(), CASES["two images"], [(1, 4, 6), (1, 2, 4)])
    ours = mm_token_type_ids(ids)
    fake = type("P", (), {"image_token_ids": [IMAGE_PAD], "video_token_ids": [prompt.VIDEO_PAD],
                          "audio_token_ids": []})()
    ref = ProcessorMixin.create_mm_token_type_ids(fake, [ids])[0]
    assert ours.dtype == np.int64 and ours.tolist() == ref
    assert ours.sum() == 6 + 2
    assert mm_token_type_ids([prompt.VIDEO_PAD, 5], video_pad_id=prompt.VIDEO_PAD).tolist() == [2, 0]


def test_video_and_misplaced_system_are_refused():
    with pytest.raises(ValueError, match="video"):
        render_vl_chat([{"role": "user", "content": [{"type": "video"}]}])
    with pytest.raises(ValueError, match="system message only as the first"):
        render_vl_chat([{"role": "user", "content": "a"}, {"role": "system", "content": "b"}])
    with pytest.raises(ValueError, match="empty"):
        render_vl_chat([])


def test_same_grid_different_pictures_same_ids_different_keys():
    """The KV-reuse trap: the ids cannot tell two pictures of one size apart; the keys can."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, 1536)).astype(np.float32)
    b = a.copy()
    b[17, 3] += 1e-3
    grid = (1, 8, 8)
    msgs = CASES["one image"]
    ids = prompt.encode_vl_chat(_ours(), msgs, [grid])
    assert ids == prompt.encode_vl_chat(_ours(), msgs, [grid])
    ka, kb = image_key(a, grid), image_key(b, grid)
    assert ka != kb and ka == image_key(a.copy(), grid) and len(ka) == 64
    assert image_key(a, (1, 8, 8)) != image_key(a, (1, 4, 16))    # same pixels, other grid
    ra, rb = reuse_keys(ids, [ka]), reuse_keys(ids, [kb])
    first_pad = ids.index(IMAGE_PAD)
    from kestrel_lab.engine.chat import common_prefix_len

    assert common_prefix_len(ids, ids) == len(ids)
    assert common_prefix_len(ra, rb) == first_pad             # reuse stops at the picture
    assert common_prefix_len(ra, reuse_keys(ids, [ka])) == len(ids)
    with pytest.raises(ValueError, match="image keys"):
        reuse_keys(ids, [])
