"""A picture → Qwen3-VL's ``pixel_values`` and ``grid_thw``, exactly as transformers' image processor.

The reference is ``Qwen2VLImageProcessorPil`` (transformers 5.24; Qwen3-VL reuses the Qwen2-VL processor)
with Qwen3-VL's ``preprocessor_config.json``: patch 16, temporal patch 2, merge 2, mean = std = 0.5,
min/max pixels 65,536 / 16,777,216. Step by step:

1. **RGB**, as transformers does given the same input. A **file** is what ``transformers.image_utils.load_image``
   makes of the path — EXIF orientation applied, then Pillow's ``convert("RGB")``, which *drops* alpha: a
   transparent pixel keeps whatever colour it stores (qwen-vl-utils would composite it onto white first;
   the reference chosen here is transformers, which Qwen3-VL's model card calls with paths and URLs) —
   except a palette PNG's transparent index, whose colour the processor's ``convert_to_rgb`` turns white. A
   **PIL image** or an array with alpha is composited onto white (transformers' ``convert_to_rgb``).
2. **smart resize**: each side to a multiple of 32 (patch × merge) with Python's ``round`` — which rounds
   halves to *even*, so 336 px → 320, not 352 — then scaled into [min_pixels, max_pixels] keeping the
   aspect ratio; an aspect ratio above 200 is refused.
3. **bicubic** resize with Pillow on the uint8 image (so the result depends on Pillow's version: pinned).
4. **rescale** ×1/255 (in float64, then float32) and **normalise** (x − 0.5)/0.5 → [−1, 1].
5. **patchify**: the frame is duplicated along time (temporal patch 2), each 16×16 patch flattened to
   3·2·16·16 = 1,536 values in (C, T, Py, Px) order, and the patches emitted in 2×2 *merge-block* order —
   the four patches that become one LLM token are consecutive.

Bad input fails early with ``VisionInputError`` naming the file and what is wrong, before any large
buffer exists: the size is read from the header and checked (0×0, aspect, ``max_source_pixels``) before
a pixel is decoded. So is the token budget: with ``max_tokens``, the image tokens the resize would give are
counted from the header's size; a picture that would not fit is refused before decoding (naming the file
and ``--max-pixels``), or with ``fit=True`` resized to fit — ``max_pixels`` lowered to ``max_tokens`` ×
(patch · merge)², as Qwen's own ``max_pixels`` does — and ``ImageInput.note`` says so. numpy + Pillow only.

Taught in day20_3.
"""
from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from kestrel_lab import seam
from kestrel_lab.limits import BOUND
from kestrel_lab.vision.prompt import image_key

__all__ = ["VisionInputError", "ImageInput", "TokenBudget", "load_image", "smart_resize", "to_rgb", "normalize",
           "patchify", "MIN_PIXELS", "MAX_PIXELS", "MAX_SOURCE_PIXELS", "IMAGE_MEAN", "IMAGE_STD"]

#: Qwen3-VL's preprocessor_config.json: size.shortest_edge / size.longest_edge (pixels after resizing).
MIN_PIXELS = 65_536          # 256 × 256
MAX_PIXELS = 16_777_216      # 4096 × 4096
#: Refuse to decode a source larger than this (8192 × 8192): a decompression-bomb guard, checked on the
#: header's size before any pixel is decoded; the bound is the one table's (``kestrel_lab.limits``,
#: ``image.pixels``). Pass ``max_source_pixels`` to allow more.
MAX_SOURCE_PIXELS = int(BOUND["image.pixels"].hi)
IMAGE_MEAN = (0.5, 0.5, 0.5)
IMAGE_STD = (0.5, 0.5, 0.5)
RESCALE = 1 / 255
MAX_ASPECT = 200

#: Pillow modes whose ``convert("RGB")`` cannot be right: it clips 16/32-bit and float values at 255,
#: and LAB's "A" band (a*) would be taken for alpha.
_REFUSED_MODES = {
    "I;16": "16-bit", "I;16L": "16-bit", "I;16B": "16-bit", "I;16N": "16-bit", "I": "32-bit integer",
    "F": "32-bit float", "LAB": "CIELAB",
}


class VisionInputError(ValueError):
    """An image the preprocessor cannot take; the message names the file and what is wrong."""


@dataclass
class ImageInput:
    """One preprocessed image, ready for the vision tower.

    ``pixel_values`` (n_patches, C·T·P·P) float32 in merge-block order; ``grid_thw`` (t, h, w) in patches;
    ``size`` the resized (width, height) in pixels; ``original_size`` the source's (width, height);
    ``source`` the file name or "<array>"/"<PIL image>"; ``key`` ``prompt.image_key`` of the pixels.
    """

    pixel_values: np.ndarray
    grid_thw: tuple[int, int, int]
    size: tuple[int, int]
    original_size: tuple[int, int]
    source: str
    key: str
    merge_size: int = 2
    note: str = ""      # set when the picture was scaled down to fit a token budget

    @property
    def n_tokens(self) -> int:
        """LLM tokens (image pads) of this image: t·h·w / merge²."""
        t, h, w = self.grid_thw
        return t * h * w // (self.merge_size * self.merge_size)


def smart_resize(height: int, width: int, factor: int = 32, min_pixels: int = MIN_PIXELS,
                 max_pixels: int = MAX_PIXELS) -> tuple[int, int]:
    """(height, width) after Qwen2-VL's smart resize: multiples of ``factor``, pixels in range, same aspect.

    transformers' rule line for line (``round`` is Python's: halves to even). Taught in day20_3.
    """
    if height <= 0 or width <= 0:
        raise ValueError(f"image size {width}×{height}: both sides must be at least 1 pixel")
    if factor <= 0 or min_pixels <= 0 or max_pixels < min_pixels:
        raise ValueError(f"smart_resize: need factor > 0 and 0 < min_pixels ≤ max_pixels, got factor={factor}, "
                         f"min_pixels={min_pixels}, max_pixels={max_pixels}")
    if max(height, width) / min(height, width) > MAX_ASPECT:
        raise ValueError(f"absolute aspect ratio must be smaller than {MAX_ASPECT}, "
                         f"got {max(height, width) / min(height, width)}")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def to_rgb(image: Image.Image) -> np.ndarray:
    """(H, W, 3) uint8 as transformers' ``convert_to_rgb``: alpha (or palette transparency) composited
    onto white with Pillow, anything else ``convert("RGB")`` (``load_image`` does the same on its way).
    """
    return np.array(_rgb_image(image))


def _rgb_image(image: Image.Image) -> Image.Image:
    """``to_rgb`` as a PIL image (no numpy copy of a large picture before it is resized)."""
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image if image.mode == "RGB" else image.convert("RGB")


def _array_to_rgb(a: np.ndarray, where: str) -> np.ndarray:
    """An (H, W, 1), (H, W, 3) or (H, W, 4) uint8 array → (H, W, 3), as transformers' numpy path."""
    if a.dtype != np.uint8:
        raise VisionInputError(f"{where}: array dtype {a.dtype}, expected uint8 (0..255) pixels")
    if a.ndim == 2:
        raise VisionInputError(f"{where}: array shape {a.shape} has no channel axis; pass (height, width, 1) "
                               "for grey (transformers refuses a 2-D array too)")
    if a.ndim != 3 or a.shape[2] not in (1, 3, 4):
        raise VisionInputError(f"{where}: array shape {a.shape}, expected (height, width[, 1|3|4 channels])")
    if a.shape[2] == 1:
        return np.repeat(a, 3, axis=2)
    if a.shape[2] == 4:
        alpha = a[..., 3:4] / 255
        return np.round(alpha * a[..., :3] + (1 - alpha) * 255).astype(np.uint8)
    return np.ascontiguousarray(a)


def normalize(rgb: np.ndarray, mean=IMAGE_MEAN, std=IMAGE_STD) -> np.ndarray:
    """(H, W, 3) uint8 → (3, H, W) float32: ×1/255 in float64 then float32, then (x − mean)/std in float32,
    the arithmetic of transformers' ``rescale`` and ``normalize``. Taught in day20_3.
    """
    x = (rgb.astype(np.float64) * RESCALE).astype(np.float32)           # element-wise: any layout gives
    x = (x - np.asarray(mean, dtype=np.float32)) / np.asarray(std, dtype=np.float32)   # the same bits
    return x.astype(np.float32, copy=False).transpose(2, 0, 1)


def patchify(chw: np.ndarray, patch_size: int = 16, temporal_patch_size: int = 2,
             merge_size: int = 2) -> tuple[np.ndarray, tuple[int, int, int]]:
    """(C, H, W) → ((gh·gw), C·T·P·P) rows in merge-block order, and grid (1, gh, gw).

    Each row is one patch (C, T, Py, Px) with the frame repeated T times; rows go block by block
    (gh/m × gw/m blocks, row-major), and inside a block over its m × m patches. Taught in day20_3.
    """
    c, h, w = chw.shape
    p, m = patch_size, merge_size
    if h % (p * m) or w % (p * m):
        raise ValueError(f"patchify: {w}×{h} is not a multiple of patch·merge = {p * m}")
    gh, gw = h // p, w // p
    x = chw.reshape(c, gh // m, m, p, gw // m, m, p).transpose(1, 4, 2, 5, 0, 3, 6)  # (bh, bw, mh, mw, C, Py, Px)
    x = np.broadcast_to(x[:, :, :, :, :, None], (*x.shape[:5], temporal_patch_size, p, p))
    return np.ascontiguousarray(x.reshape(gh * gw, c * temporal_patch_size * p * p)), (1, gh, gw)


def _upright_size(im: Image.Image) -> tuple[int, int]:
    """(width, height) once the EXIF orientation is applied, read before decoding."""
    try:
        turned = im.getexif().get(0x0112) in (5, 6, 7, 8)
    except Exception:  # an unreadable EXIF block: transformers' exif_transpose ignores it too
        turned = False
    return (im.size[1], im.size[0]) if turned else im.size


def _open(path: Path, max_source_pixels: int, budget=None) -> Image.Image:
    """Open a file and check its header (and, with ``budget``, its token count) before decoding a pixel."""
    if not path.is_file():
        raise VisionInputError(f"{path}: no such file")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            im = Image.open(path)
    except Image.DecompressionBombError as e:
        raise VisionInputError(f"{path}: {e}") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        with open(path, "rb") as f:
            head = f.read(8)
        raise VisionInputError(f"{path}: not an image Pillow can read (first bytes {head!r}): {e}") from None
    try:
        _check_size(im.size, str(path), max_source_pixels)
        if budget is not None:
            budget(_upright_size(im))
        try:
            im.load()
        except (OSError, SyntaxError, ValueError) as e:
            raise VisionInputError(f"{path}: truncated or corrupt image data ({im.format} {im.size[0]}×"
                                   f"{im.size[1]}, {path.stat().st_size} bytes): {e}") from None
    except VisionInputError:
        im.close()
        raise
    return ImageOps.exif_transpose(im)


def _check_size(size: tuple[int, int], where: str, max_source_pixels: int) -> None:
    w, h = size
    if w <= 0 or h <= 0:
        raise VisionInputError(f"{where}: the image is {w}×{h} pixels — empty")
    if w * h > max_source_pixels:
        raise VisionInputError(f"{where}: {w}×{h} = {w * h:,} pixels is more than max_source_pixels = "
                               f"{max_source_pixels:,} (a decompression-bomb guard); nothing was decoded — "
                               "shrink the image or pass a larger max_source_pixels")
    if max(w, h) > BOUND["image.width"].hi:
        raise VisionInputError(f"{where}: {w}×{h}: a side of more than {int(BOUND['image.width'].hi):,} pixels "
                               "(the image.width/height bound of kestrel_lab.limits) — shrink the image")
    if max(w, h) / min(w, h) > MAX_ASPECT:
        raise VisionInputError(f"{where}: {w}×{h} has aspect ratio {max(w, h) / min(w, h):.0f}, more than "
                               f"the {MAX_ASPECT} the Qwen-VL processor accepts — crop it first")


def _check_mode(im: Image.Image, where: str) -> None:
    if im.mode in _REFUSED_MODES:
        kind = _REFUSED_MODES[im.mode]
        raise VisionInputError(
            f"{where}: a {kind} image (Pillow mode {im.mode}); transformers' convert('RGB') would clip or "
            "misread it — convert it to 8-bit RGB first (e.g. scale 16-bit values by 1/257, or use "
            "PIL.ImageCms for CIELAB)")


@dataclass
class TokenBudget:
    """How many image tokens a picture may take, and what to do when it would take more: refuse (naming the
    file and ``--max-pixels``) or, with ``fit``, lower ``max_pixels`` until it fits. Taught in day20_3."""

    max_tokens: int
    fit: bool
    min_pixels: int
    max_pixels: int
    factor: int
    where: str = ""
    note: str = ""

    def check(self, size: tuple[int, int]) -> None:
        """Count the tokens of a (width, height) source; refuse or lower ``max_pixels`` (``VisionInputError``)."""
        w, h = size
        f2 = self.factor * self.factor
        try:
            tokens = _tokens(h, w, self.factor, self.min_pixels, self.max_pixels)
        except ValueError as e:
            raise VisionInputError(f"{self.where}: {e}") from None
        if tokens <= self.max_tokens:
            return
        if not self.fit or self.max_tokens < 1:
            raise VisionInputError(
                f"{self.where}: {w}×{h} resizes to {tokens:,} image tokens, but {max(self.max_tokens, 0):,} are left "
                f"in the context; nothing was decoded — pass a smaller --max-pixels (at most "
                f"{max(self.max_tokens, 1) * f2:,}, i.e. {max(self.max_tokens, 1):,} tokens of "
                f"{self.factor}×{self.factor} pixels), or a longer --ctx if the model allows it")
        self.max_pixels = self.max_tokens * f2
        self.min_pixels = min(self.min_pixels, self.max_pixels)
        fitted = _tokens(h, w, self.factor, self.min_pixels, self.max_pixels)
        self.note = (f"{self.where}: {w}×{h} would take {tokens:,} image tokens, {self.max_tokens:,} are left in the "
                     f"context: scaled to fit (max_pixels {self.max_pixels:,}, {fitted:,} tokens); pass --max-pixels "
                     f"to choose the size")


def _tokens(h: int, w: int, factor: int, min_pixels: int, max_pixels: int) -> int:
    hb, wb = smart_resize(h, w, factor, min_pixels, max_pixels)
    return (hb // factor) * (wb // factor)


def load_image(src, *, vision=None, min_pixels: int = MIN_PIXELS, max_pixels: int = MAX_PIXELS,
               patch_size: int = 16, temporal_patch_size: int = 2, merge_size: int = 2,
               max_source_pixels: int = MAX_SOURCE_PIXELS, max_tokens: int | None = None,
               fit: bool = False) -> ImageInput:
    """A path, a PIL image or an (H, W, 3) uint8 array → ``ImageInput`` (pixel_values, grid_thw, …).

    ``vision``: a ``config.VisionConfig`` (e.g. a VQF header's ``ModelConfig.vision``) — its patch size,
    temporal patch and merge size then replace the keyword defaults. ``max_tokens``: the image tokens the
    picture may take (checked from the header's size, before decoding); beyond it the picture is refused,
    or with ``fit`` scaled down to fit (``ImageInput.note`` says so). Raises ``VisionInputError``.
    Taught in day20_3.
    """
    if vision is not None:
        if vision.in_channels != 3:
            raise ValueError(f"vision config has in_channels={vision.in_channels}; only RGB (3) is supported")
        patch_size, temporal_patch_size = vision.patch_size, vision.temporal_patch_size
        merge_size = vision.spatial_merge_size
    where = str(src) if isinstance(src, (str, os.PathLike)) else "<PIL image>" if isinstance(src, Image.Image) \
        else "<array>"
    budget = None if max_tokens is None else TokenBudget(int(max_tokens), fit, min_pixels, max_pixels,
                                                         patch_size * merge_size, where)
    rgb, source = _rgb_of(src, where, max_source_pixels, budget)      # a PIL RGB image: resized, never copied
    if budget is not None:
        budget.check(rgb.size)                 # the decoded size (an EXIF block read only on decoding)
        min_pixels, max_pixels = budget.min_pixels, budget.max_pixels
    w0, h0 = rgb.size
    try:
        h, w = smart_resize(h0, w0, patch_size * merge_size, min_pixels, max_pixels)
    except ValueError as e:
        raise VisionInputError(f"{where}: {e}") from None
    resized = np.array(rgb.resize((w, h), resample=Image.Resampling.BICUBIC))
    del rgb
    pixel_values, grid = _patches(normalize(resized), patch_size, temporal_patch_size, merge_size)
    return ImageInput(pixel_values, grid, (w, h), (w0, h0), source, image_key(pixel_values, grid), merge_size,
                      budget.note if budget is not None else "")


def _rgb_of(src, where: str, max_source_pixels: int, budget: TokenBudget | None) -> tuple[Image.Image, str]:
    """An RGB PIL image of a path (transformers' ``load_image``: alpha dropped), a PIL image or an array
    (alpha composited onto white), and the name the ``ImageInput`` keeps; sizes checked before decoding."""
    check = budget.check if budget is not None else None
    if isinstance(src, (str, os.PathLike)):
        path = Path(src)
        im = _open(path, max_source_pixels, check)
        _check_mode(im, where)
        # load_image's convert("RGB"), then the processor's convert_to_rgb: a palette image's transparent
        # index survives the first as an RGB colour in ``info``, and the second turns that colour white
        rgb = im.convert("RGB")
        im.close()
        return _rgb_image(rgb), path.name
    if isinstance(src, Image.Image):
        _check_size(src.size, where, max_source_pixels)
        if check:
            check(src.size)
        _check_mode(src, where)
        return _rgb_image(src), where
    if isinstance(src, np.ndarray):
        if src.ndim >= 2:
            _check_size((src.shape[1], src.shape[0]), where, max_source_pixels)
            if check:
                check((src.shape[1], src.shape[0]))
        return Image.fromarray(_array_to_rgb(src, where)), where
    raise TypeError(f"load_image: expected a path, a PIL image or a numpy array, got {type(src).__name__}")


def _patches(chw: np.ndarray, patch_size: int, temporal_patch_size: int, merge_size: int):
    """``patchify`` — or a student's ``vision.patchify`` piece while one is swapped in (``kestrel_lab.seam``):
    its rows, checked for shape, with our grid."""
    mine = seam.get("vision.patchify")
    if mine is None:
        return patchify(chw, patch_size, temporal_patch_size, merge_size)
    grid = (1, chw.shape[1] // patch_size, chw.shape[2] // patch_size)
    rows = np.asarray(mine(chw, patch_size, temporal_patch_size, merge_size), np.float32)
    want = (grid[1] * grid[2], chw.shape[0] * temporal_patch_size * patch_size * patch_size)
    if rows.shape != want:
        raise ValueError(f"piece vision.patchify returned shape {rows.shape}, expected {want}")
    return rows, grid
