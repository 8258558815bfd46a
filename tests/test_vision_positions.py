"""MRoPE positions and tables against transformers 5.24's Qwen3-VL code, run on the same ids.

The reference is ``Qwen3VLModel.get_rope_index`` (built on the meta device from the tiny qwen3_vl
config: no weights are needed to compute positions) and ``Qwen3VLTextRotaryEmbedding`` for cos/sin.
Token ids are built the way the engine builds them: the VL chat template rendered by
``kestrel_lab.vision.prompt``, tokenized with the package's tokenizer, pads expanded.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest

from kestrel_lab.kernels import rope
from kestrel_lab.kernels.rope import axis_of_frequency, mrope_cos_sin
from kestrel_lab.vision import positions, prompt
from kestrel_lab.vision.positions import mrope_positions

PAD = prompt.IMAGE_PAD


@lru_cache(maxsize=1)
def _tokenizer():
    from kestrel_lab.vocab import Tokenizer

    return Tokenizer.default(encoder="bpe")


def _ids(messages, grids):
    return prompt.encode_vl_chat(_tokenizer(), messages, grids)


def _user(text, n_images=0):
    return {"role": "user", "content": [{"type": "image"}] * n_images + [{"type": "text", "text": text}]}


@lru_cache(maxsize=1)
def _hf_model():
    torch = pytest.importorskip("torch")
    tr = pytest.importorskip("transformers")
    from kestrel_lab import tiny_model

    cfg = tr.Qwen3VLConfig(**tiny_model.default_config("qwen3_vl"))
    with torch.device("meta"):
        return tr.Qwen3VLModel(cfg)


def _hf_positions(ids, grids):
    import torch

    model = _hf_model()
    model.rope_deltas = None
    ids_t = torch.tensor([ids], dtype=torch.long)
    types = torch.tensor(prompt.mm_token_type_ids(ids, PAD)[None, :], dtype=torch.int32)
    grid_t = torch.tensor(grids, dtype=torch.long) if grids else None
    pos, delta = model.get_rope_index(ids_t, types, image_grid_thw=grid_t)
    return pos[:, 0, :].numpy(), int(delta[0, 0])


ONE = ([_user("这张图里有什么？", 1)], [(1, 6, 8)])
TWO = ([_user("比较这两张图。", 2)], [(1, 4, 10), (1, 12, 6)])
TEXT = ([{"role": "user", "content": "你好，介绍一下你自己。"}], [])
VIDEO_LIKE = ([_user("two frames", 1)], [(2, 4, 6)])   # t = 2: transformers' rule for t > 1 as well


@pytest.mark.parametrize("case", [ONE, TWO, TEXT, VIDEO_LIKE], ids=["one image", "two images", "text only",
                                                                    "t=2 grid"])
def test_positions_equal_get_rope_index(case):
    messages, grids = case
    ids = _ids(messages, grids)
    ours, delta = mrope_positions(ids, grids, image_pad_id=PAD, merge_size=2)
    ref, ref_delta = _hf_positions(ids, grids)
    assert ours.dtype == np.int64 and ours.shape == (3, len(ids))
    np.testing.assert_array_equal(ours, ref)
    assert delta == ref_delta
    if not grids:
        assert delta == 0 and (ours == np.arange(len(ids))).all()


def test_text_after_an_image_continues_from_max_side():
    ids = _ids(*ONE)
    pos, delta = mrope_positions(ids, ONE[1], image_pad_id=PAD)
    a = ids.index(PAD)
    b = a + 12                                         # (6/2)·(8/2) pads
    assert (pos[:, a - 1] == a - 1).all()              # <|vision_start|> is text
    assert set(pos[0, a:b]) == {a} and sorted(set(pos[1, a:b])) == [a, a + 1, a + 2]
    assert sorted(set(pos[2, a:b])) == [a, a + 1, a + 2, a + 3]
    assert (pos[:, b] == a + 4).all()                  # <|vision_end|>: s + max(3, 4)
    assert delta == 4 - 12


def test_second_turn_continues_from_the_rope_position():
    """A conversation positioned in one go (transformers) equals two segments positioned turn by turn,
    the second starting where the first left the rope position; the deltas add up."""
    turn1 = [_user("第一张图。", 1), {"role": "assistant", "content": "好的。"}]
    turn2 = turn1 + [_user("那第二张呢？", 1)]
    g1, g2 = (1, 6, 8), (1, 10, 4)
    ids1 = _ids(turn1, [g1])
    # transformers' processor renders the whole history; the first turn's ids are a prefix of it
    # up to its <|im_end|>\n — the cached part.
    ids_all = _ids(turn2, [g1, g2])
    assert ids_all[:len(ids1) - 3] == ids1[:-3]        # ids1 ends with the generation prompt
    cut = len(ids1) - 3
    head, tail = ids_all[:cut], ids_all[cut:]
    p1, d1 = mrope_positions(head, [g1], image_pad_id=PAD)
    p2, d2 = mrope_positions(tail, [g2], image_pad_id=PAD, start=len(head) + d1)
    ref, ref_delta = _hf_positions(ids_all, [g1, g2])
    np.testing.assert_array_equal(np.concatenate([p1, p2], axis=1), ref)
    assert d1 + d2 == ref_delta


def test_decode_positions_with_the_delta():
    """transformers' decode step: position = cache length + rope delta on all three axes."""
    ids = _ids(*TWO)
    pos, delta = mrope_positions(ids, TWO[1], image_pad_id=PAD)
    nxt = len(ids) + delta
    assert nxt == pos.max() + 1
    more, d2 = mrope_positions(ids + [11, 12], TWO[1], image_pad_id=PAD)
    np.testing.assert_array_equal(more[:, -2:], np.array([[nxt, nxt + 1]] * 3))
    assert d2 == delta


@pytest.mark.parametrize("bad, msg", [
    (lambda ids: ids[:ids.index(PAD)] + [PAD] + ids[ids.index(PAD):], "needs"),
    (lambda ids: [t for t in ids if t != PAD], "runs of image pads"),
])
def test_bad_pad_runs_are_refused(bad, msg):
    ids = _ids(*ONE)
    with pytest.raises(ValueError, match=msg):
        mrope_positions(bad(ids), ONE[1], image_pad_id=PAD)


def test_odd_grid_is_refused():
    with pytest.raises(ValueError, match="multiples of merge_size"):
        positions.image_token_count((1, 5, 8))


# ------------------------------------------------------------------------------------------ cos / sin
def _hf_cos_sin(pos3, head_dim, theta, section):
    torch = pytest.importorskip("torch")
    tr = pytest.importorskip("transformers")
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding

    cfg = tr.Qwen3VLTextConfig(hidden_size=head_dim * 2, num_attention_heads=2, head_dim=head_dim,
                               rope_parameters={"rope_type": "default", "rope_theta": theta,
                                                "mrope_section": section, "mrope_interleaved": True})
    emb = Qwen3VLTextRotaryEmbedding(cfg)
    x = torch.zeros(1, dtype=torch.float32)
    cos, sin = emb(x, torch.tensor(pos3[:, None, :], dtype=torch.long))
    return cos[0].numpy(), sin[0].numpy()


@pytest.mark.parametrize("head_dim, theta, section", [(128, 5e6, [24, 20, 20]), (32, 5e6, [6, 5, 5])])
def test_cos_sin_equal_transformers(head_dim, theta, section):
    """atol 1e-6: both sides take float32 angles from inverse frequencies that agree within one ulp
    (``inv_freq``); at the positions used here (< 400) that ulp moves cos/sin by less than 1e-6."""
    ids = _ids(*TWO)
    pos, _ = mrope_positions(ids + list(range(300)), TWO[1], image_pad_id=PAD)
    cos, sin = mrope_cos_sin(pos, head_dim, theta, section)
    ref_cos, ref_sin = _hf_cos_sin(pos, head_dim, theta, section)
    half = head_dim // 2
    assert cos.dtype == np.float32 and cos.shape == (pos.shape[1], half)
    # transformers repeats the half (cat(f, f)) for rotate-half RoPE; the engine keeps the half
    np.testing.assert_array_equal(ref_cos[:, :half], ref_cos[:, half:])
    np.testing.assert_allclose(cos, ref_cos[:, :half], rtol=0, atol=1e-6)
    np.testing.assert_allclose(sin, ref_sin[:, :half], rtol=0, atol=1e-6)


def test_text_only_equals_plain_rope():
    """t = h = w: every axis gives the same angle, so the table is 1-D RoPE's, bit for bit."""
    n = np.arange(500)
    cos, sin = mrope_cos_sin(np.stack([n, n, n]), 128, 5e6, [24, 20, 20])
    ang = n.astype(np.float32)[:, None] * rope.inv_freq(128, 5e6)[None, :]
    np.testing.assert_array_equal(cos, np.cos(ang))
    np.testing.assert_array_equal(sin, np.sin(ang))
    c1, s1 = rope.rope_cos_sin(n, 128, 5e6)
    np.testing.assert_array_equal(cos, c1)
    np.testing.assert_array_equal(sin, s1)


def test_inv_freq_within_an_ulp_of_transformers():
    torch = pytest.importorskip("torch")
    for dim, theta in ((128, 5e6), (32, 5e6), (64, 1e4), (128, 1e6), (64, 1e6)):
        ref = (1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))).numpy()
        ours = rope.inv_freq(dim, theta)
        ulps = np.abs(ours.view(np.int32) - ref.view(np.int32))
        assert ulps.max() <= 1, (dim, theta, ulps)


def test_interleaved_axis_layout():
    axis = axis_of_frequency(128, [24, 20, 20])
    assert list(axis[:6]) == [0, 1, 2, 0, 1, 2] and (axis[60:] == 0).all()
    assert [int((axis == a).sum()) for a in range(3)] == [24, 20, 20]
    chunked = axis_of_frequency(128, [24, 20, 20], interleaved=False)
    assert list(chunked) == [0] * 24 + [1] * 20 + [2] * 20
    with pytest.raises(ValueError):
        axis_of_frequency(128, [24, 20, 21])
