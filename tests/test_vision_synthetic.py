"""The tiny VL model's pictures: deterministic bytes, held-out seeds and combinations kept out of
training, answers that parse back, and pictures that really show what their answer says."""
import hashlib
import itertools
import json

import numpy as np
import pytest

from kestrel_lab.paths import data_dir
from kestrel_lab.vision import synthetic as syn

# sha256 of seed 0's raw RGB bytes with the pinned Pillow (requirements.txt) and numpy's PCG64:
# a change of rasteriser, rng or drawing code changes the pictures the committed model was trained on.
SEED0_SHA256 = "cd4a04486694dcc2bbcd0a742794299a5e30afc8a12caf8171a357a61bfd5ab6"


def test_same_seed_same_bytes_and_pinned_digest():
    a, ans_a = syn.draw(0)
    b, ans_b = syn.draw(0)
    assert a.tobytes() == b.tobytes() and ans_a == ans_b
    assert a.size == (syn.SIZE, syn.SIZE) and a.mode == "RGB"
    assert hashlib.sha256(a.tobytes()).hexdigest() == SEED0_SHA256
    assert syn.draw(1)[0].tobytes() != a.tobytes()


def test_combo_of_matches_the_drawn_sample():
    for seed in range(40):
        smp = syn.sample(seed)
        assert syn.combo_of(seed) == smp.combo
        assert syn.draw(seed)[1] == smp.answer


def test_every_combination_parses_back():
    for c, s, p in itertools.product(syn.COLOURS, syn.SHAPES, syn.POSITIONS):
        assert syn.parse_answer(syn.answer_for(c, s, p)) == (c, s, p)
    assert syn.answer_for("红", "圆", "左上角") == "左上角有一个红色的圆。"


@pytest.mark.parametrize("bad", ["", "左上角有一个红色的圆", "左上角有一个红色的圆。。", "左上角有一个粉色的圆。",
                                 "上面有一个红色的圆。", "左上角有两个红色的圆。", " 左上角有一个红色的圆。"])
def test_parse_rejects_what_is_not_an_answer(bad):
    with pytest.raises(ValueError, match="not an answer sentence"):
        syn.parse_answer(bad)


@pytest.mark.parametrize("bad", [-1, 1.5, "3", None, True])
def test_bad_seed_is_refused(bad):
    with pytest.raises(ValueError, match="seed"):
        syn.sample(bad)


def test_heldout_combos_never_in_training_seeds():
    train = syn.train_seeds(6000)
    assert len(set(train)) == 6000 and max(train) < syn.HELDOUT_SEED_START
    assert not {syn.combo_of(s) for s in train} & set(syn.HELDOUT_COMBOS)
    # the skipped seeds are exactly those of the held-out combinations
    skipped = set(range(train[-1] + 1)) - set(train)
    assert skipped and all(syn.combo_of(s) in syn.HELDOUT_COMBOS for s in skipped)
    # every colour, shape and position still appears in training
    seen = {syn.combo_of(s) for s in train}
    for i, names in enumerate((syn.COLOURS, syn.SHAPES, syn.POSITIONS)):
        assert {c[i] for c in seen} == set(names)


def test_heldout_set_is_disjoint_from_training_and_covers_every_unseen_combo():
    held = syn.heldout_seeds()
    assert len(held) == len(set(held)) >= 200
    assert not any(syn.is_training_seed(s) for s in held)
    assert min(held) >= syn.HELDOUT_SEED_START
    unseen = [syn.combo_of(s) for s in held if syn.combo_of(s) in syn.HELDOUT_COMBOS]
    for combo in syn.HELDOUT_COMBOS:
        assert unseen.count(combo) >= syn.N_PER_UNSEEN_COMBO
    assert held == syn.heldout_seeds()   # deterministic
    with pytest.raises(ValueError, match="training seeds"):
        syn.train_seeds(10, start=syn.HELDOUT_SEED_START - 5)


def _foreground(img):
    """Mask of the pixels that differ from the background (the corner pixel) by more than 40."""
    a = np.asarray(img).astype(np.int32)
    return np.abs(a - a[0, 0]).sum(axis=2) > 40, a


@pytest.mark.parametrize("seed", range(60))
def test_picture_shows_what_the_answer_says(seed):
    smp = syn.sample(seed)
    mask, a = _foreground(smp.image)
    ys, xs = np.nonzero(mask)
    assert len(xs) > 400
    # position: the shape's centroid is nearest to the named position
    cx, cy = xs.mean(), ys.mean()
    nearest = min(syn.POSITIONS, key=lambda p: (syn.POSITIONS[p][0] - cx) ** 2 + (syn.POSITIONS[p][1] - cy) ** 2)
    assert nearest == smp.position
    # colour: the shape's median colour is nearest to the named colour
    med = np.median(a[mask], axis=0)
    assert min(syn.COLOURS, key=lambda c: ((np.array(syn.COLOURS[c]) - med) ** 2).sum()) == smp.colour
    # shape: compactness (area over the circle through its farthest pixel: circle ~1, square ~2/pi)
    # and how much of its bounding box it fills (triangle ~1/2, five-point star ~0.37)
    compact = mask.sum() / (np.pi * ((xs - cx) ** 2 + (ys - cy) ** 2).max())
    fill = mask.sum() / ((xs.max() - xs.min() + 1) * (ys.max() - ys.min() + 1))
    if compact > 0.9:
        seen = "圆"
    elif 0.55 < compact < 0.75 and fill > 0.6:
        seen = "正方形"
    else:
        seen = "三角形" if fill > 0.44 else "星形"
    assert seen == smp.shape, (compact, fill)


# ----------------------------------------------------------------------------- the committed model
MODEL = data_dir() / "models" / "qwen3-tiny-vl"
IM_END = 151645


def _json(name):
    return json.loads((MODEL / name).read_text(encoding="utf-8"))


def _prompt_ids():
    """The prompt by the vision package's chat template (not the training script's hand-built one)."""
    from kestrel_lab.vision.prompt import encode_vl_chat
    from kestrel_lab.vocab.tokenizer import Tokenizer

    tok = Tokenizer.default()
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": syn.QUESTION}]}]
    return tok, encode_vl_chat(tok, msgs, [(1, 16, 16)])


def test_committed_config_is_a_small_real_qwen3_vl():
    cfg = _json("config.json")
    v, t = cfg["vision_config"], cfg["text_config"]
    assert cfg["architectures"] == ["Qwen3VLForConditionalGeneration"] and cfg["tie_word_embeddings"]
    assert (v["patch_size"], v["temporal_patch_size"], v["spatial_merge_size"]) == (16, 2, 2)
    side = int(round(v["num_position_embeddings"] ** 0.5))
    assert side * side == v["num_position_embeddings"] and side >= syn.SIZE // v["patch_size"]
    assert 4 <= v["depth"] <= 6 and 64 <= v["hidden_size"] <= 128
    assert all(0 <= i < v["depth"] for i in v["deepstack_visual_indexes"])
    assert v["out_hidden_size"] == t["hidden_size"] <= 256 and t["num_hidden_layers"] <= 4
    assert t["vocab_size"] == 151936


def test_committed_weights_are_bf16_with_only_the_used_rows_nonzero():
    from kestrel_lab.safetensors import open_safetensors

    tok, prompt = _prompt_ids()
    used = set(prompt) | {IM_END}
    for c, s, p in itertools.product(syn.COLOURS, syn.SHAPES, syn.POSITIONS):
        used |= set(tok.encode(syn.answer_for(c, s, p), allow_special=False))
    used.discard(151655)   # <|image_pad|>: overwritten by the merger, its row stays zero
    with open_safetensors(MODEL / "model.safetensors") as st:
        assert {st.info(n).dtype for n in st.keys()} == {"BF16"}
        assert "lm_head.weight" not in st          # tied
        emb = st.f32("model.language_model.embed_tokens.weight")
    assert emb.shape == (151936, 256)
    assert set(np.flatnonzero(np.abs(emb).sum(axis=1))) == used


def test_committed_heldout_results_are_consistent_with_the_generator():
    ho = _json("heldout.json")
    items = ho["items"]
    assert [i["seed"] for i in items] == syn.heldout_seeds() and len(items) >= 200
    for i in items:
        assert tuple(i["combo"]) == syn.combo_of(i["seed"])
        assert i["expected"] == syn.draw(i["seed"])[1] == syn.answer_for(*i["combo"])
        assert i["unseen_combo"] == (tuple(i["combo"]) in syn.HELDOUT_COMBOS)
        assert i["ok"] == (i["got"] == i["expected"] and i["got_ids"][-1:] == [IM_END])
    right = sum(i["ok"] for i in items)
    assert ho["overall"] == {"n": len(items), "right": right, "accuracy": right / len(items)}
    unseen = [i for i in items if i["unseen_combo"]]
    assert ho["unseen_combos"]["n"] == len(unseen) >= len(syn.HELDOUT_COMBOS) * syn.N_PER_UNSEEN_COMBO
    assert _json("training.json")["heldout_accuracy"] == ho["overall"]["accuracy"]


def test_committed_greedy_cases_use_the_chat_template_and_decode_to_their_text():
    tok, prompt = _prompt_ids()
    g = _json("greedy.json")
    assert len(g["cases"]) >= 10
    for case in g["cases"]:
        assert case["prompt_ids"] == prompt
        assert tok.decode(case["greedy_ids"]) == case["greedy_text"]
        assert case["expected"] == syn.draw(case["seed"])[1] and not syn.is_training_seed(case["seed"])
