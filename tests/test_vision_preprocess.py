"""Image preprocessing against transformers' ``Qwen2VLImageProcessorPil`` with Qwen3-VL's settings.

Tolerance: **bit-exact** (``assert_array_equal``). Both sides resize the same uint8 RGB image with the
same Pillow bicubic filter (so the uint8 result is identical), then do the same float arithmetic —
×(1/255) in float64 cast to float32, (x − 0.5)/0.5 in float32 — and the same reshapes. The PIL backend
is the pinned reference: the torchvision backend ("fast" processor) resizes with its own bicubic and
differs in the last bits; it cannot be installed beside the pinned torch here anyway.

Bad images: each case must raise ``VisionInputError`` whose message names the file.
"""
from __future__ import annotations

import io
import math
import struct
import zlib
from functools import lru_cache

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from PIL import Image

from kestrel_lab.vision import preprocess
from kestrel_lab.vision.preprocess import VisionInputError, load_image, smart_resize


@lru_cache(maxsize=1)
def _hf():
    pytest.importorskip("transformers")
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    # Qwen3-VL's preprocessor_config.json (the class defaults are Qwen2-VL's: patch 14, CLIP mean/std)
    return Qwen2VLImageProcessorPil(patch_size=16, temporal_patch_size=2, merge_size=2, image_mean=[0.5] * 3,
                                    image_std=[0.5] * 3,
                                    size={"shortest_edge": 65536, "longest_edge": 16777216})


def _hf_smart_resize(h, w, **kw):
    pytest.importorskip("transformers")
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as ref

    return ref(h, w, **kw)


def _check_equal(src, hf_input=None, **kw):
    ours = load_image(src, **kw)
    hf = _hf()
    size = None
    if "min_pixels" in kw or "max_pixels" in kw:
        size = {"shortest_edge": kw.get("min_pixels", 65536), "longest_edge": kw.get("max_pixels", 16777216)}
    ref = hf(hf_input if hf_input is not None else src, return_tensors="np",
             **({"size": size} if size else {}))
    assert ours.pixel_values.dtype == np.float32
    np.testing.assert_array_equal(ours.pixel_values, ref["pixel_values"])
    assert list(ours.grid_thw) == ref["image_grid_thw"][0].tolist()
    t, h, w = ours.grid_thw
    assert ours.size == (w * 16, h * 16) and ours.n_tokens == h * w // 4
    return ours


def _noise(h, w, c=3, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (h, w, c), dtype=np.uint8)


def _smooth(h, w, seed=0):
    """A photo-like image: smooth gradients plus an edge, so bicubic's overshoot and clipping are exercised."""
    y, x = np.mgrid[0:h, 0:w]
    r = 127.5 + 127.5 * np.sin(x / max(w, 1) * 6.1 + seed)
    g = 255.0 * (y / max(h - 1, 1))
    b = np.where((x - w / 2) ** 2 + (y - h / 2) ** 2 < (min(h, w) / 3) ** 2, 250.0, 5.0)
    return np.stack([r, g, b], axis=-1).round().astype(np.uint8)


# --------------------------------------------------------------------------------------------- resize
@pytest.mark.parametrize("h, w, expect", [(480, 640, (480, 640)), (1080, 1920, (1088, 1920)),
                                          (100, 100, (256, 256)), (336, 336, (320, 320)), (80, 3000, (64, 3008))])
def test_smart_resize_known_sizes(h, w, expect):
    assert smart_resize(h, w) == expect == _hf_smart_resize(h, w, factor=32, min_pixels=65536,
                                                           max_pixels=16777216)


def test_round_half_to_even_trap():
    """336/32 = 10.5 rounds to 10 (even), so 336 px → 320; 368/32 = 11.5 → 12 → 384."""
    assert round(10.5) == 10 and round(11.5) == 12
    assert smart_resize(336, 336, min_pixels=32 * 32)[0] == 320
    assert smart_resize(368, 368, min_pixels=32 * 32)[0] == 384
    assert math.floor(336 / 32 + 0.5) * 32 == 352      # what "round half up" would have said


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 20000), st.integers(1, 20000), st.sampled_from([28, 32]),
       st.sampled_from([(65536, 16777216), (3136, 1003520), (1024, 200_000)]))
def test_smart_resize_equals_transformers(h, w, factor, bounds):
    lo, hi = bounds
    try:
        ref = _hf_smart_resize(h, w, factor=factor, min_pixels=lo, max_pixels=hi)
    except ValueError:
        with pytest.raises(ValueError, match="aspect ratio"):
            smart_resize(h, w, factor, lo, hi)
        return
    assert smart_resize(h, w, factor, lo, hi) == ref


# --------------------------------------------------------------------------------------------- pixels
@pytest.mark.parametrize("h, w", [(480, 640), (336, 336), (301, 517), (1000, 333), (60, 100), (16, 16),
                                  (256, 256)])
def test_pixel_values_equal_transformers(h, w):
    for a in (_smooth(h, w), _noise(h, w, seed=h + w)):
        _check_equal(Image.fromarray(a))


def test_downscaled_and_custom_bounds_equal_transformers():
    a = _smooth(900, 1300)
    ours = _check_equal(Image.fromarray(a), max_pixels=200_000)
    assert ours.size[0] * ours.size[1] <= 200_000 and ours.size != (1300, 900)
    ours = _check_equal(Image.fromarray(_smooth(40, 50)), min_pixels=400_000)
    assert ours.size[0] * ours.size[1] >= 400_000


@pytest.mark.slow
def test_large_image_downscaled_with_default_bounds_equals_transformers():
    """4128×4096 rounds to 16.9 M pixels > max_pixels: the β-downscale branch at Qwen3-VL's own bounds
    (~0.4 GB of pixel_values on each side)."""
    a = _smooth(4096, 4128)
    ours = _check_equal(Image.fromarray(a))
    w, h = ours.size
    assert w * h <= 16_777_216 and (w, h) != (4128, 4096)


def test_patch_order_is_merge_blocks_of_c_t_py_px():
    """Row k of a 2×2 block, value (c, t, y, x) is pixel (c, 16·row + y, 16·col + x) of the normalised image."""
    a = _noise(64, 96, seed=3)
    out = load_image(a)
    assert out.size == (320, 224) and out.grid_thw == (1, 14, 20)   # 64×96 upscaled by min_pixels
    img = preprocess.normalize(np.array(Image.fromarray(a).resize((320, 224), Image.Resampling.BICUBIC)))
    pv = out.pixel_values.reshape(-1, 3, 2, 16, 16)
    bw = 20 // 2
    for k in (0, 1, 2, 3, 4, 5, 97, 279):
        block, inner = divmod(k, 4)
        row = (block // bw) * 2 + inner // 2
        col = (block % bw) * 2 + inner % 2
        patch = img[:, 16 * row:16 * row + 16, 16 * col:16 * col + 16]
        np.testing.assert_array_equal(pv[k, :, 0], patch)
        np.testing.assert_array_equal(pv[k, :, 1], patch)      # the frame, duplicated in time


@pytest.mark.parametrize("mode", ["RGBA", "LA", "P", "P+transparency", "L", "1", "CMYK", "YCbCr", "HSV", "PA"])
def test_modes_converted_like_transformers(mode):
    a = _smooth(200, 300)
    im = Image.fromarray(a)
    if mode == "RGBA":
        alpha = np.linspace(0, 255, 300, dtype=np.uint8)[None, :].repeat(200, axis=0)
        im = Image.fromarray(np.dstack([a, alpha]), "RGBA")
    elif mode == "P+transparency":
        im = im.convert("P")
        im.info["transparency"] = 3
    elif mode == "PA":
        im = im.convert("P").convert("PA")
    else:
        im = im.convert(mode)
    _check_equal(im)


@pytest.mark.parametrize("shape", [(120, 200, 1), (120, 200, 3), (120, 200, 4)])
def test_arrays_like_transformers(shape):
    a = np.random.default_rng(1).integers(0, 256, shape, dtype=np.uint8)
    ours = load_image(a)
    ref = _hf()(a, return_tensors="np", input_data_format="channels_last")
    np.testing.assert_array_equal(ours.pixel_values, ref["pixel_values"])
    assert ours.source == "<array>"


def test_files_like_transformers_with_exif_orientation(tmp_path):
    from PIL import ImageOps

    a = _smooth(240, 400)
    png = tmp_path / "plain.png"
    Image.fromarray(a).save(png)
    ours = _check_equal(png, Image.open(png))
    assert ours.source == "plain.png" and ours.original_size == (400, 240)
    jpg = tmp_path / "rotated.jpg"
    exif = Image.Exif()
    exif[0x0112] = 6                                     # orientation: rotate 90° CW to display
    Image.fromarray(a).save(jpg, quality=92, exif=exif)
    ours = _check_equal(jpg, ImageOps.exif_transpose(Image.open(jpg)))
    assert ours.original_size == (240, 400)               # upright: portrait


def test_files_in_other_modes_like_transformers(tmp_path):
    """CMYK JPEG, RGBA and grey+alpha PNGs, palette PNG with a transparent index, grey PNG: bit-exact with
    transformers given the same path (its ``load_image``: EXIF orientation, then ``convert("RGB")``, which
    drops alpha — the reference this package follows for files; a PIL image with alpha is composited
    onto white instead, as ``test_modes_converted_like_transformers`` checks)."""
    a = _smooth(180, 260)
    ramp = np.linspace(0, 255, 260, dtype=np.uint8)[None, :].repeat(180, axis=0)
    rgba = np.dstack([a, ramp])
    files = {"cmyk.jpg": Image.fromarray(a).convert("CMYK"), "alpha.png": Image.fromarray(rgba, "RGBA"),
             "grey.png": Image.fromarray(a).convert("L"),
             "grey_alpha.png": Image.fromarray(np.dstack([a[..., 0], ramp]), "LA")}
    pal = Image.fromarray(a).convert("P")
    files["pal.png"] = pal
    for name, im in files.items():
        path = tmp_path / name
        im.save(path, **({"transparency": 5} if name == "pal.png" else {}))
        opened = Image.open(path)
        assert name != "pal.png" or opened.info.get("transparency") is not None
        ours = _check_equal(path, str(path))
        if "alpha" in name:   # the transparent pixels keep their stored colour: not composited onto white
            composited = load_image(Image.open(path))
            assert not np.array_equal(ours.pixel_values, composited.pixel_values)


def test_vision_config_sets_the_geometry():
    from kestrel_lab import tiny_model
    from kestrel_lab.config import ModelConfig

    cfg = ModelConfig.from_hf(tiny_model.default_config("qwen3_vl"))
    out = load_image(_smooth(256, 256), vision=cfg.vision)
    assert out.pixel_values.shape == (256, cfg.vision.patch_dim) and out.merge_size == 2
    other = tiny_model.default_config("qwen3_vl")
    other["vision_config"].update(patch_size=14)
    cfg14 = ModelConfig.from_hf(other)
    out14 = load_image(_smooth(256, 256), vision=cfg14.vision)
    # 256/28 → 9 → 252, below min_pixels → 280
    assert out14.pixel_values.shape[1] == 3 * 2 * 14 * 14 and out14.size == (280, 280)


def test_keys_tell_same_size_pictures_apart():
    a, b = load_image(_smooth(256, 256, seed=0)), load_image(_smooth(256, 256, seed=1))
    assert a.grid_thw == b.grid_thw and a.key != b.key
    assert load_image(_smooth(256, 256, seed=0)).key == a.key


# --------------------------------------------------------------------------------------------- bad input
def _png_header_only(path, w, h):
    """A PNG whose IHDR claims w×h but holds no pixel data (what a decompression bomb's header says)."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
                     + chunk(b"IEND", b""))


def _bad_files(tmp_path):
    cases = {}
    p = tmp_path / "notes.txt"
    p.write_text("not a picture at all\n")
    cases["not an image"] = (p, "not an image")
    for fmt in ("png", "jpeg"):
        buf = io.BytesIO()
        Image.fromarray(_noise(300, 400)).save(buf, format=fmt)
        p = tmp_path / f"cut.{fmt}"
        p.write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
        cases[f"truncated {fmt}"] = (p, "truncated")
    p = tmp_path / "line.png"
    Image.fromarray(_noise(1, 10000)).save(p)
    cases["1×10000"] = (p, "aspect ratio")
    p = tmp_path / "deep.png"
    Image.fromarray(np.full((64, 64), 40000, dtype=np.uint16)).save(p)
    cases["16-bit"] = (p, "16-bit")
    p = tmp_path / "float.tiff"
    Image.fromarray(np.full((64, 64), 0.5, dtype=np.float32)).save(p)
    cases["float"] = (p, "32-bit float")
    p = tmp_path / "bomb.png"
    _png_header_only(p, 9000, 9000)
    cases["over max_source_pixels"] = (p, "max_source_pixels")
    p = tmp_path / "huge.png"
    _png_header_only(p, 30000, 30000)
    cases["Pillow's bomb limit"] = (p, "decompression bomb|max_source_pixels")
    cases["missing"] = (tmp_path / "nowhere.png", "no such file")
    return cases


def test_bad_files_are_refused_naming_the_file(tmp_path):
    for name, (path, what) in _bad_files(tmp_path).items():
        with pytest.raises(VisionInputError, match=what) as e:
            load_image(path)
        assert str(path) in str(e.value), (name, str(e.value))


def test_bad_in_memory_images():
    with pytest.raises(VisionInputError, match="empty"):
        load_image(np.zeros((0, 0, 3), np.uint8))
    with pytest.raises(VisionInputError, match="empty"):
        load_image(Image.new("RGB", (0, 0)))
    with pytest.raises(VisionInputError, match="aspect ratio"):
        load_image(np.zeros((1, 10000, 3), np.uint8))
    with pytest.raises(VisionInputError, match="dtype float32"):
        load_image(np.zeros((32, 32, 3), np.float32))
    with pytest.raises(VisionInputError, match="shape"):
        load_image(np.zeros((32, 32, 2), np.uint8))
    with pytest.raises(VisionInputError, match="channel axis"):
        load_image(np.zeros((32, 32), np.uint8))          # transformers cannot take it either
    with pytest.raises(VisionInputError, match="16-bit"):
        load_image(Image.fromarray(np.zeros((32, 32), np.uint16)))
    with pytest.raises(TypeError, match="expected a path"):
        load_image(b"\x89PNG")


def test_the_bomb_is_refused_before_decoding(tmp_path, monkeypatch):
    """The size check runs on the header: ``Image.load`` is never reached."""
    p = tmp_path / "bomb.png"
    _png_header_only(p, 9000, 9000)
    from PIL import ImageFile

    calls = []
    monkeypatch.setattr(ImageFile.ImageFile, "load", lambda self: calls.append(1))
    with pytest.raises(VisionInputError, match="nothing was decoded"):
        load_image(p)
    assert calls == []


# ------------------------------------------------------------------------------------ token budget
def _photo(path, w, h, orientation=None):
    exif = Image.Exif()
    if orientation:
        exif[0x0112] = orientation
    Image.fromarray(_smooth(h, w)).save(path, quality=90, exif=exif)
    return path


def test_a_picture_over_the_token_budget_is_refused_before_decoding(tmp_path, monkeypatch):
    """A 4032×3024 phone photo resizes to 11,844 tokens: with 1,000 left, it is refused from the header's
    size — no pixel decoded — naming the file and --max-pixels."""
    from PIL import ImageFile

    p = _photo(tmp_path / "phone.jpg", 4032, 3024)
    calls = []
    monkeypatch.setattr(ImageFile.ImageFile, "load", lambda self: calls.append(1))
    with pytest.raises(VisionInputError, match=rf"^{p}: 4032×3024 resizes to 11,844 image tokens, but 1,000 are "
                                               r"left in the context; nothing was decoded — pass a smaller "
                                               r"--max-pixels \(at most 1,024,000"):
        load_image(p, max_tokens=1000)
    assert calls == []


@pytest.mark.parametrize("size, orientation", [((2000, 1500), None), ((1500, 2000), 6), ((3000, 400), None)])
def test_fit_scales_like_max_pixels_and_says_so(tmp_path, size, orientation):
    """``fit`` lowers max_pixels to max_tokens × 32²: the result is transformers' with that max_pixels (so
    the picture stays bit-exact with the reference), within the budget, and ``note`` says what happened."""
    p = _photo(tmp_path / "big.jpg", *size, orientation=orientation)
    ours = load_image(p, max_tokens=300, fit=True)
    assert ours.n_tokens <= 300 and "scaled to fit (max_pixels 307,200" in ours.note and str(p) in ours.note
    ref = _check_equal(p, str(p), max_pixels=300 * 1024, min_pixels=65536)
    assert ref.grid_thw == ours.grid_thw
    assert load_image(p, max_tokens=100_000, fit=True).note == ""          # it fits: nothing said


def test_fit_lowers_min_pixels_for_a_tiny_budget(tmp_path):
    p = _photo(tmp_path / "p.jpg", 640, 480)
    im = load_image(p, max_tokens=20, fit=True)       # 20 tokens < min_pixels' 64
    assert im.n_tokens <= 20 and im.note
    with pytest.raises(VisionInputError, match="0 are left"):
        load_image(p, max_tokens=0, fit=True)
