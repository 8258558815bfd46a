"""The vision tower (kestrel_lab.vision.tower) against transformers' Qwen3VLVisionModel, piece by piece
and whole, on a deterministic random Qwen3-VL checkpoint saved by transformers itself (bf16 on disk)."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is a test dependency (requirements-ref.txt)")
transformers = pytest.importorskip("transformers", reason="transformers is a test dependency")

from transformers import vision_utils  # noqa: E402  (after importorskip)

from kestrel_lab import models  # noqa: E402  (after importorskip)
from kestrel_lab.kernels import vision as VK  # noqa: E402  (after importorskip)
from kestrel_lab.vision import tower as T  # noqa: E402  (after importorskip)
from kestrel_lab.vqf.reader import open_vqf  # noqa: E402  (after importorskip)

# 3 blocks with DeepStack taps after blocks 0 and 2 (not only the last), the tiny default otherwise:
# width 64, 2 heads of 32, MLP 128, 8×8 position table, merge 2, text width 64.
OVERRIDES = {"vision_config": {"depth": 3, "deepstack_visual_indexes": [0, 2]}}
GRIDS = [(1, 6, 10), (1, 4, 4), (1, 12, 8)]   # non-square, smaller and larger than the 8×8 table


@pytest.fixture(scope="module")
def ckpt():
    d = models.hf_checkpoint(arch="qwen3_vl", overrides=OVERRIDES, saver="transformers")
    hf = transformers.Qwen3VLForConditionalGeneration.from_pretrained(d, dtype=torch.float32).eval()
    return d, hf


@pytest.fixture(scope="module")
def tower(ckpt):
    return T.VisionTower.from_vqf(models.vqf(ckpt[0], quant="f32"))


def pixels(grids, seed=0):
    n = sum(t * h * w for t, h, w in grids)
    return np.random.default_rng(seed).uniform(-1, 1, (n, 1536)).astype(np.float32)


def test_geometry_equals_transformers_helpers(tower):
    g = torch.tensor(GRIDS)
    idx, w = vision_utils.get_vision_interpolation_indices_and_weights(
        g, num_grid_per_side=8, mode="bilinear", align_corners=True, spatial_merge_size=2)
    my_idx, my_w = T.pos_interpolation(GRIDS, 8, 2)
    assert np.array_equal(my_idx, idx.numpy())
    np.testing.assert_allclose(my_w, w.numpy(), rtol=0, atol=1e-7)
    pos = vision_utils.get_vision_position_ids(g, 2).numpy()
    rc = np.concatenate([np.stack(T.patch_rows_cols(h, w, 2), 1) for _, h, w in GRIDS])
    assert np.array_equal(rc, pos)
    cu = vision_utils.get_vision_cu_seqlens(g).numpy()
    assert np.array_equal(T.cu_seqlens(GRIDS), cu)


def test_rotary_tables_equal_transformers(ckpt):
    hf = ckpt[1]
    pos = vision_utils.get_vision_position_ids(torch.tensor(GRIDS), 2)
    cos, sin = hf.model.visual.rotary_pos_emb(torch.zeros(1), pos)
    my_cos, my_sin = T.rotary_cos_sin(GRIDS, 32, 2)
    # transformers repeats the half table (cat(f, f)); rotate-half only needs one half. The angles are
    # the same float32 numbers; numpy's and torch's cos may differ by one ulp (1.2e-7 near 1).
    np.testing.assert_allclose(np.concatenate([my_cos, my_cos], 1), cos.numpy(), rtol=0, atol=1.2e-7)
    np.testing.assert_allclose(np.concatenate([my_sin, my_sin], 1), sin.numpy(), rtol=0, atol=1.2e-7)


def test_kernels_equal_torch():
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((7, 96)) * 3 + 0.5).astype(np.float32)
    w, b = rng.standard_normal(96).astype(np.float32), rng.standard_normal(96).astype(np.float32)
    out = np.empty_like(x)
    VK.layernorm(x, w, b, 1e-6, out)
    ref = torch.nn.functional.layer_norm(torch.from_numpy(x), (96,), torch.from_numpy(w), torch.from_numpy(b), 1e-6)
    np.testing.assert_allclose(out, ref.numpy(), rtol=0, atol=2e-6)
    g = x.copy()
    VK.gelu_tanh(g)
    np.testing.assert_allclose(g, torch.nn.functional.gelu(torch.from_numpy(x), approximate="tanh").numpy(),
                               rtol=0, atol=2e-6)
    e = x.copy()
    VK.gelu_erf(e)
    np.testing.assert_allclose(e, torch.nn.functional.gelu(torch.from_numpy(x)).numpy(), rtol=0, atol=2e-6)
    assert np.abs(g - e).max() > 1e-4   # the two GELUs differ enough to tell apart


def test_whole_tower_equals_transformers(ckpt, tower):
    hf = ckpt[1]
    px = pixels(GRIDS)
    with torch.no_grad():
        ref = hf.model.visual(torch.from_numpy(px), grid_thw=torch.tensor(GRIDS))
    out = tower.encode(px, GRIDS)
    assert out.tokens == [t * h * w // 4 for t, h, w in GRIDS]
    want = ref.pooler_output.numpy()
    assert out.embeds.shape == want.shape
    scale = np.abs(want).max()
    assert np.abs(out.embeds - want).max() <= 1e-4 * scale
    assert len(out.deepstack) == len(ref.deepstack_features) == 2
    for mine, theirs in zip(out.deepstack, ref.deepstack_features):
        assert np.abs(mine - theirs.numpy()).max() <= 1e-4 * np.abs(theirs.numpy()).max()
    # images are independent: one at a time gives the same features as the batch
    alone = tower.encode(px[:60], [GRIDS[0]])
    np.testing.assert_allclose(alone.embeds, out.embeds[:15], rtol=0, atol=1e-5 * scale)


def test_q8_0_tower_is_close_and_reads_q8_0(ckpt):
    hf = ckpt[1]
    tw = T.VisionTower.from_vqf(models.vqf(ckpt[0], quant="q8_0"))
    assert set(tw.weight_qtypes.values()) == {"Q8_0"}
    px = pixels(GRIDS[:2], seed=3)
    with torch.no_grad():
        want = hf.model.visual(torch.from_numpy(px), grid_thw=torch.tensor(GRIDS[:2])).pooler_output.numpy()
    got = tw.encode(px, GRIDS[:2]).embeds
    rel = np.abs(got - want).max() / np.abs(want).max()
    print(f"Q8_0 vision tower: max |diff| / scale = {rel:.2e}")
    assert 0 < rel < 0.05


def test_bad_inputs_are_refused(tower, ckpt):
    px = pixels([(1, 4, 4)])
    with pytest.raises(ValueError, match="describes 16 patches, pixel_values has 15"):
        tower.encode(px[:15], [(1, 4, 4)])
    with pytest.raises(ValueError, match="multiples of the merge size"):
        tower.encode(px[:15], [(1, 3, 5)])
    with pytest.raises(ValueError, match=r"\(patches, 1536\)"):
        tower.encode(px[:, :100], [(1, 4, 4)])
    f = open_vqf(models.vqf(ckpt[0], quant="f32"))
    tensors = dict(f.tensors)
    del tensors["v_merger_fc2"]
    with pytest.raises(ValueError, match="v_merger_fc2"):
        T.VisionTower(f.config, tensors, source="x.vqf")


def test_flops_of_the_2b_shapes_640x480():
    from kestrel_lab import paths
    from kestrel_lab.config import ModelConfig

    cfg = ModelConfig.from_hf(paths.configs_dir() / "qwen3-vl-2b-instruct.config.json")
    tw = T.VisionTower.__new__(T.VisionTower)
    tw.vc, tw.merge = cfg.vision, 2
    fl = tw.flops([(1, 30, 40)])
    assert 0.85e12 < fl < 1.0e12   # ~0.79 TFLOP linear + ~0.14 attention (wave-2 facts §1.1)


def test_attention_stays_inside_each_image_like_sdpa():
    rng = np.random.default_rng(5)
    cu = np.array([0, 24, 40, 100])
    q, k, v = (rng.standard_normal((100, 3, 32)).astype(np.float32) for _ in range(3))
    got = T.attend_segments(q, k, v, cu)
    want = []
    for a, b in zip(cu[:-1], cu[1:]):
        tq, tk, tv = (torch.from_numpy(x[a:b]).transpose(0, 1) for x in (q, k, v))
        want.append(torch.nn.functional.scaled_dot_product_attention(tq, tk, tv).transpose(0, 1).reshape(b - a, -1))
    np.testing.assert_allclose(got, torch.cat(want).numpy(), rtol=0, atol=2e-6)
