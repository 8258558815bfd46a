"""The engine that sees (kestrel_lab.engine.vl) against transformers' Qwen3VLForConditionalGeneration.

Deterministic random Qwen3-VL checkpoints saved by transformers itself (bf16 on disk), loaded by
transformers in float32 and converted to an F32 VQF: logits of the prefill and of every decode step
must agree to 1e-4 of the logit scale, with two non-square images in one prompt, a chunked prefill
whose chunks cut through an image, an image in the second turn of a conversation (KV reuse), and two
pictures with the same grid (the reuse key must tell them apart). HF's ``input_ids`` and
``mm_token_type_ids`` are built by hand (transformers 5.24 needs them; its processor needs torchvision).
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is a test dependency (requirements-ref.txt)")
transformers = pytest.importorskip("transformers", reason="transformers is a test dependency")

from kestrel_lab import models  # noqa: E402  (after importorskip)
from kestrel_lab.engine import model as M  # noqa: E402  (after importorskip)
from kestrel_lab.engine.chat import common_prefix_len  # noqa: E402  (after importorskip)
from kestrel_lab.eval import logit_agreement  # noqa: E402  (after importorskip)
from kestrel_lab.engine.vl import Qwen3VLEngine, VLConversation, open_engine  # noqa: E402  (after importorskip)
from kestrel_lab.vision import prompt as VP  # noqa: E402  (after importorskip)
from kestrel_lab.vocab import Tokenizer  # noqa: E402  (after importorskip)

OVERRIDES = {"vision_config": {"depth": 3, "deepstack_visual_indexes": [0, 2]}}
TOL = 1e-4          # max |diff| relative to the logit scale (F32 weights)
STEPS = 6           # decode steps compared


@pytest.fixture(scope="module")
def setup():
    d = models.hf_checkpoint(arch="qwen3_vl", overrides=OVERRIDES, saver="transformers")
    hf = transformers.Qwen3VLForConditionalGeneration.from_pretrained(d, dtype=torch.float32).eval()
    return SimpleNamespace(dir=d, hf=hf, tok=Tokenizer.default(),
                           eng=Qwen3VLEngine.from_vqf(models.vqf(d, quant="f32"), max_context=512))


def image(grid, seed):
    n = grid[0] * grid[1] * grid[2]
    px = np.random.default_rng(seed).uniform(-1, 1, (n, 1536)).astype(np.float32)
    return SimpleNamespace(pixel_values=px, grid_thw=tuple(grid), key=VP.image_key(px, grid))


def user(text, n_images):
    return {"role": "user", "content": [{"type": "image"}] * n_images + [{"type": "text", "text": text}]}


def hf_inputs(ids, ims):
    kw = dict(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
              mm_token_type_ids=torch.from_numpy(VP.mm_token_type_ids(ids))[None])
    if ims:
        kw.update(pixel_values=torch.from_numpy(np.concatenate([im.pixel_values for im in ims])),
                  image_grid_thw=torch.tensor([im.grid_thw for im in ims]))
    return kw


def hf_logits(hf, ids, ims):
    with torch.no_grad():
        return hf(**hf_inputs(ids, ims)).logits[0].numpy()


def hf_generate(hf, ids, ims, n):
    with torch.no_grad():
        g = hf.generate(**hf_inputs(ids, ims), max_new_tokens=n, do_sample=False, output_logits=True,
                        return_dict_in_generate=True, min_new_tokens=n)
    return g.sequences[0, len(ids):].tolist(), [s[0].numpy() for s in g.logits]


def close(a, b):
    return np.abs(a - b).max() <= TOL * np.abs(b).max()


IMS = [image((1, 6, 10), 1), image((1, 4, 4), 2)]


def test_positions_equal_get_rope_index(setup):
    ids = VP.encode_vl_chat(setup.tok, [user("这两张图里有什么？", 2)], [im.grid_thw for im in IMS])
    pos = setup.eng.positions_for(ids, IMS)
    kw = hf_inputs(ids, IMS)
    ref, delta = setup.hf.model.get_rope_index(kw["input_ids"], kw["mm_token_type_ids"], kw["image_grid_thw"])
    assert np.array_equal(pos, ref[:, 0].numpy())
    setup.eng.reset()
    setup.eng.prefill_vl(ids, IMS)
    assert setup.eng.rope_delta == int(delta[0, 0]) < 0
    assert setup.eng.rope_pos == int(ref.max()) + 1


def test_every_position_of_a_two_image_prompt_chunked_through_an_image(setup, monkeypatch):
    ids = VP.encode_vl_chat(setup.tok, [user("描述这两张图。", 2)], [im.grid_thw for im in IMS])
    ref = hf_logits(setup.hf, ids, IMS)
    eng = setup.eng
    monkeypatch.setattr(M, "PREFILL_CHUNK", 7)    # chunks end inside the 15-pad image: each adds its slice
    eng.reset()
    runs = [(a, b) for a, b in zip(*np.flatnonzero(np.diff(np.r_[0, np.equal(ids, VP.IMAGE_PAD), 0])).reshape(-1, 2).T)]
    assert any(a % 7 and (a // 7) != ((b - 1) // 7) for a, b in runs)
    outs = {}
    for im in IMS:
        outs[im.key] = eng.encode(im)[0]
    mask = np.equal(ids, VP.IMAGE_PAD)
    feats = M.ImageEmbeds(mask, np.concatenate([outs[im.key].embeds for im in IMS]),
                          [np.concatenate([outs[im.key].deepstack[i] for im in IMS]) for i in range(2)])
    got = eng.forward_all(ids, positions=eng.positions_for(ids, IMS), images=feats)
    assert close(got, ref), np.abs(got - ref).max()
    # without DeepStack, or with the pads left as text, the logits are visibly different
    eng.reset()
    plain = eng.forward_all(ids, positions=eng.positions_for(ids, IMS), images=M.ImageEmbeds(mask, feats.embeds))
    assert not close(plain, ref)


def test_prefill_and_every_decode_step_and_greedy_equal_transformers(setup):
    ids = VP.encode_vl_chat(setup.tok, [user("这两张图里有什么？", 2)], [im.grid_thw for im in IMS])
    want_ids, want_logits = hf_generate(setup.hf, ids, IMS, STEPS)
    eng = setup.eng
    eng.reset()
    logits = eng.prefill_vl(ids, IMS)
    for step, tok in enumerate(want_ids):
        assert close(logits, want_logits[step]), (step, np.abs(logits - want_logits[step]).max())
        logits = eng.decode(tok)
    conv = VLConversation(eng, setup.tok, max_new=STEPS, stop_ids=frozenset())
    res = conv.ask("这两张图里有什么？", IMS)
    assert res.ids == want_ids
    assert [n for n, _, _ in res.stats.images] == [15, 4]


def test_an_image_in_the_second_turn_reuses_the_cache(setup):
    eng = setup.eng
    conv = VLConversation(eng, setup.tok, max_new=4, stop_ids=frozenset())
    first = conv.ask("看第一张图。", IMS[:1])
    third = image((1, 4, 6), 3)
    ids2 = VP.encode_vl_chat(setup.tok, conv.messages + [user("再看这张。", 1)], [IMS[0].grid_thw, third.grid_thw])
    want_ids, want_logits = hf_generate(setup.hf, ids2, [IMS[0], third], 4)
    second = conv.ask("再看这张。", [third])
    assert second.stats.reused_tokens > 15 + len(first.ids) - 2   # the first image and the reply stayed cached
    assert [n for n, _, r in second.stats.images] == [6]           # only the new image was encoded
    assert second.ids == want_ids
    # replay the turn-2 logits step by step on the reused cache
    conv2 = VLConversation(eng, setup.tok, max_new=4, stop_ids=frozenset())
    conv2.ask("看第一张图。", IMS[:1])
    conv2.messages.append(user("再看这张。", 1))
    conv2.images.append(third)
    keys = VP.reuse_keys(ids2, [im.key for im in conv2.images])
    keep = common_prefix_len(conv2.cached_keys, keys)
    assert keep == second.stats.reused_tokens
    logits = eng.prefill_vl(ids2, conv2.images, keep)
    for step, tok in enumerate(want_ids):
        assert close(logits, want_logits[step]), (step, np.abs(logits - want_logits[step]).max())
        logits = eng.decode(tok)


def test_two_pictures_with_the_same_grid_do_not_share_the_cache(setup):
    eng = setup.eng
    a, b = image((1, 6, 10), 10), image((1, 6, 10), 11)
    assert a.key != b.key
    conv = VLConversation(eng, setup.tok, max_new=3, stop_ids=frozenset())
    conv.ask("这是什么？", [a])
    del conv.messages[:], conv.images[:]   # ask the same question again, about another picture of the same size:
    res = conv.ask("这是什么？", [b])      # the ids are the same as the cached ones, the picture is not
    ids = VP.encode_vl_chat(setup.tok, [user("这是什么？", 1)], [b.grid_thw])
    first_pad = ids.index(VP.IMAGE_PAD)
    assert res.stats.reused_tokens == first_pad
    want_ids, _ = hf_generate(setup.hf, ids, [b], 3)
    assert res.ids == want_ids


def test_text_only_prompt_on_the_vl_engine_equals_transformers(setup):
    ids = VP.encode_vl_chat(setup.tok, [{"role": "user", "content": "你好，今天天气怎么样？"}], [])
    ref = hf_logits(setup.hf, ids, [])
    eng = setup.eng
    eng.reset()
    assert close(eng.forward_all(ids), ref)
    assert eng.rope_delta == 0


def test_quantized_effect_is_reported(setup):
    ids = VP.encode_vl_chat(setup.tok, [user("描述这两张图。", 2)], [im.grid_thw for im in IMS])
    ref = hf_logits(setup.hf, ids, IMS)
    rows = {}
    for q in ("f32", "q8_0", "q4_0"):
        eng = Qwen3VLEngine.from_vqf(models.vqf(setup.dir, quant=q), max_context=256)
        feats = [eng.encode(im)[0] for im in IMS]
        mask = np.equal(ids, VP.IMAGE_PAD)
        im = M.ImageEmbeds(mask, np.concatenate([f.embeds for f in feats]),
                           [np.concatenate([f.deepstack[i] for f in feats]) for i in range(2)])
        rows[q] = logit_agreement(ref, eng.forward_all(ids, positions=eng.positions_for(ids, IMS), images=im))
    print("\nquant  KL mean (nats)  KL max    top-1   max|diff|/scale   (vs transformers fp32, "
          f"{rows['f32']['positions']} positions, 2 images)")
    for q, r in rows.items():
        print(f"{q:6} {r['kl_mean']:14.2e} {r['kl_max']:9.2e} {r['top1_agreement']:7.1%} "
              f"{r['max_abs_diff'] / r['logit_scale']:12.2e}")
    assert rows["f32"]["max_abs_diff"] <= TOL * rows["f32"]["logit_scale"]
    assert rows["f32"]["kl_mean"] < rows["q8_0"]["kl_mean"] < rows["q4_0"]["kl_mean"]


def test_bad_vl_inputs_are_refused(setup):
    eng = setup.eng
    ids = VP.encode_vl_chat(setup.tok, [user("hi", 2)], [im.grid_thw for im in IMS])
    eng.reset()
    with pytest.raises(ValueError, match="2 runs of image pads in the ids but 1 images"):
        eng.prefill_vl(ids, IMS[:1])
    with pytest.raises(ValueError, match=r"grid \(1, 4, 4\)\) needs 4 pads, the run at token 4 has 15"):
        eng.prefill_vl(ids, IMS[::-1])
    with pytest.raises(ValueError, match="images.embeds has shape"):
        eng.prefill(ids, images=M.ImageEmbeds(np.equal(ids, VP.IMAGE_PAD), np.zeros((3, 64), np.float32)))
    with pytest.raises(ValueError, match=r"positions must have shape \(3, "):
        eng.prefill(ids, positions=np.zeros((3, 2), np.int64))


def test_open_engine_picks_the_vl_engine(setup):
    assert isinstance(open_engine(models.vqf(setup.dir, quant="f32"), max_context=64), Qwen3VLEngine)
    text_only = open_engine(models.vqf(arch="qwen3", quant="f32"), max_context=64)
    assert not isinstance(text_only, Qwen3VLEngine)
