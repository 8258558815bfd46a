"""The synthetic pictures the tiny Qwen3-VL was trained on: one coloured shape on a plain background.

Each picture is fully determined by its seed: a colour (6), a shape (4) and a position (5), then a
random size, jitter, rotation, background shade and colour tint. The answer to :data:`QUESTION` is one
exact Chinese sentence, e.g. 「左上角有一个红色的圆。」, which :func:`parse_answer` reads back.

Why it exists: the lessons, the tests and the training script (``scripts/train_tiny_vl.py``) must
draw the *same* pixels without torch, so a wrong vision kernel shows up as a wrong sentence about a
picture the model never saw. Only numpy (seeded ``default_rng``) and Pillow (pinned: the rasteriser
decides the bytes) are used. Pictures are drawn at 4× (1024 px) and box-reduced to 256×256, the smallest
size Qwen3-VL's ``min_pixels`` leaves unresized (16×16 patches of 16 px, 64 LLM tokens).

Held out from training: every seed ≥ :data:`HELDOUT_SEED_START` and every picture whose
(colour, shape, position) is one of :data:`HELDOUT_COMBOS`. :func:`train_seeds` skips both;
:func:`heldout_seeds` lists the evaluation set.
Taught in day21_3.
"""
from __future__ import annotations

import io
import math
import re
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

SIZE = 256          # output side in pixels (16 × 16 patches of 16 px)
SUPERSAMPLE = 4     # drawn at SIZE * SUPERSAMPLE, then box-reduced (anti-aliased edges)
QUESTION = "图里有什么？"

# name → nominal RGB (each picture tints it by up to ±TINT per channel)
COLOURS: dict[str, tuple[int, int, int]] = {
    "红": (215, 35, 35),
    "橙": (240, 130, 20),
    "黄": (232, 208, 25),
    "绿": (35, 160, 60),
    "蓝": (35, 85, 215),
    "紫": (135, 55, 185),
}
SHAPES = ("圆", "正方形", "三角形", "星形")
# name → nominal centre (x, y) in output pixels
POSITIONS: dict[str, tuple[int, int]] = {
    "左上角": (64, 64),
    "右上角": (192, 64),
    "左下角": (64, 192),
    "右下角": (192, 192),
    "中间": (128, 128),
}
TINT = 10                 # colour jitter per channel
RADIUS = (38, 52)         # shape "radius" in output pixels, inclusive range
JITTER = 8                # centre jitter in output pixels, each axis, ±
ROTATION_DEG = 12.0       # square/triangle/star rotation, ±
BACKGROUND = (200, 245)   # grey level of the background, inclusive range
BACKGROUND_TINT = 6       # per-channel tint of the background, ±

# (colour, shape, position) triples never drawn for training; each colour, shape and position
# still appears in training in other combinations.
HELDOUT_COMBOS: tuple[tuple[str, str, str], ...] = (
    ("红", "星形", "中间"),
    ("橙", "圆", "右下角"),
    ("黄", "正方形", "左上角"),
    ("绿", "三角形", "右上角"),
    ("蓝", "星形", "左下角"),
    ("紫", "圆", "中间"),
)
HELDOUT_SEED_START = 1_000_000      # seeds ≥ this are never used for training
UNSEEN_SEED_START = 2_000_000       # where the unseen-combination items of the evaluation set start
WIDE_HELDOUT_SEED_START = 1_500_000  # where the wide drawer's evaluation seeds start (never trained on)
N_WIDE_HELDOUT = 240                # the wide drawer's evaluation items
N_HELDOUT_RANDOM = 200              # evaluation items drawn from HELDOUT_SEED_START on
N_PER_UNSEEN_COMBO = 8              # evaluation items per held-out combination

_ANSWER = re.compile("^(" + "|".join(POSITIONS) + ")有一个(" + "|".join(COLOURS) + ")色的("
                     + "|".join(sorted(SHAPES, key=len, reverse=True)) + ")。$")


@dataclass(frozen=True)
class Sample:
    """One drawn picture and what it shows. Taught in day21_3."""

    seed: int
    colour: str
    shape: str
    position: str
    image: Image.Image

    @property
    def combo(self) -> tuple[str, str, str]:
        return (self.colour, self.shape, self.position)

    @property
    def answer(self) -> str:
        return answer_for(self.colour, self.shape, self.position)


def answer_for(colour: str, shape: str, position: str) -> str:
    """The exact sentence for a combination: 「左上角有一个红色的圆。」. Taught in day21_3."""
    if colour not in COLOURS or shape not in SHAPES or position not in POSITIONS:
        raise ValueError(f"unknown combination ({colour!r}, {shape!r}, {position!r}); colours "
                         f"{list(COLOURS)}, shapes {list(SHAPES)}, positions {list(POSITIONS)}")
    return f"{position}有一个{colour}色的{shape}。"


def parse_answer(text: str) -> tuple[str, str, str]:
    """(colour, shape, position) of an answer sentence; ValueError if it is not one. Taught in day21_3."""
    m = _ANSWER.match(text)
    if not m:
        raise ValueError(f"not an answer sentence of the form 「左上角有一个红色的圆。」: {text!r}")
    position, colour, shape = m.groups()
    return colour, shape, position


def _check_seed(seed) -> int:
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    return int(seed)


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng([_check_seed(seed), 0x5E1F])


def combo_of(seed: int) -> tuple[str, str, str]:
    """(colour, shape, position) of a seed's picture without drawing it (the rng's first three
    draws). Taught in day21_3."""
    rng = _rng(seed)
    c = int(rng.integers(len(COLOURS)))
    s = int(rng.integers(len(SHAPES)))
    p = int(rng.integers(len(POSITIONS)))
    return list(COLOURS)[c], SHAPES[s], list(POSITIONS)[p]


STAR_INNER = 0.42          # a star's inner radius / outer radius in this drawer


def _polygon(shape: str, cx: float, cy: float, r: float, rot: float,
             star_inner: float = STAR_INNER) -> list[tuple[float, float]]:
    """Vertices (drawing pixels) of a square, an upward triangle or a five-point star (inner radius
    ``star_inner`` × r)."""
    if shape == "正方形":
        half = 0.9 * r   # as wide as the circle: its corners, not its size, tell it apart
        pts = [(-half, -half), (half, -half), (half, half), (-half, half)]
    elif shape == "三角形":
        # equilateral, pointing up, centred on its bounding box's middle
        pts = [(r * math.cos(a), -r * math.sin(a) + 0.25 * r)
               for a in (math.pi / 2, math.pi / 2 + 2 * math.pi / 3, math.pi / 2 + 4 * math.pi / 3)]
    elif shape == "星形":
        pts = []
        for k in range(10):
            rad = r if k % 2 == 0 else star_inner * r
            a = math.pi / 2 + k * math.pi / 5
            pts.append((rad * math.cos(a), -rad * math.sin(a) + 0.1 * r))
    else:
        raise ValueError(f"not a polygon shape: {shape!r}")
    c, s = math.cos(rot), math.sin(rot)
    return [(cx + x * c - y * s, cy + x * s + y * c) for x, y in pts]


def sample(seed: int) -> Sample:
    """The picture of ``seed`` (256×256 RGB) with its colour, shape and position. Same seed, same
    bytes (with the pinned Pillow). Taught in day21_3."""
    seed = _check_seed(seed)
    rng = _rng(seed)
    c = int(rng.integers(len(COLOURS)))
    s = int(rng.integers(len(SHAPES)))
    p = int(rng.integers(len(POSITIONS)))
    colour, shape, position = list(COLOURS)[c], SHAPES[s], list(POSITIONS)[p]
    r = int(rng.integers(RADIUS[0], RADIUS[1] + 1))
    jx, jy = (int(v) for v in rng.integers(-JITTER, JITTER + 1, size=2))
    rot = math.radians(float(rng.uniform(-ROTATION_DEG, ROTATION_DEG)))
    grey = int(rng.integers(BACKGROUND[0], BACKGROUND[1] + 1))
    bg = tuple(int(v) for v in np.clip(grey + rng.integers(-BACKGROUND_TINT, BACKGROUND_TINT + 1, size=3), 0, 255))
    fg = tuple(int(v) for v in np.clip(np.array(COLOURS[colour]) + rng.integers(-TINT, TINT + 1, size=3), 0, 255))

    k = SUPERSAMPLE
    img = Image.new("RGB", (SIZE * k, SIZE * k), bg)
    draw = ImageDraw.Draw(img)
    px, py = POSITIONS[position]
    cx, cy, rr = (px + jx) * k, (py + jy) * k, r * k
    if shape == "圆":
        rc = 0.9 * rr
        draw.ellipse([cx - rc, cy - rc, cx + rc, cy + rc], fill=fg)
    else:
        draw.polygon(_polygon(shape, cx, cy, rr, rot), fill=fg)
    return Sample(seed, colour, shape, position, img.reduce(k))


def draw(seed: int) -> tuple[Image.Image, str]:
    """(picture, answer sentence) of ``seed``. Taught in day21_3."""
    smp = sample(seed)
    return smp.image, smp.answer


def is_training_seed(seed: int) -> bool:
    """True when training may use ``seed``: below HELDOUT_SEED_START and not a held-out
    combination."""
    seed = _check_seed(seed)
    return seed < HELDOUT_SEED_START and combo_of(seed) not in HELDOUT_COMBOS


def train_seeds(count: int, start: int = 0) -> list[int]:
    """The first ``count`` training seeds from ``start`` on (held-out combinations skipped)."""
    out, seed = [], _check_seed(start)
    while len(out) < count:
        if seed >= HELDOUT_SEED_START:
            raise ValueError(f"only {len(out)} training seeds between {start} and {HELDOUT_SEED_START}")
        if is_training_seed(seed):
            out.append(seed)
        seed += 1
    return out


def heldout_seeds(n_random: int = N_HELDOUT_RANDOM, n_per_unseen: int = N_PER_UNSEEN_COMBO) -> list[int]:
    """The evaluation set: the first ``n_random`` seeds from HELDOUT_SEED_START (any combination,
    so some unseen ones), then for each held-out combination the first ``n_per_unseen`` seeds from
    UNSEEN_SEED_START that draw it. Taught in day21_3."""
    out = list(range(HELDOUT_SEED_START, HELDOUT_SEED_START + n_random))
    need = {combo: n_per_unseen for combo in HELDOUT_COMBOS}
    seed = UNSEEN_SEED_START
    while any(need.values()):
        combo = combo_of(seed)
        if need.get(combo, 0) > 0:
            out.append(seed)
            need[combo] -= 1
        seed += 1
    return out


# ----------------------------------------------------------------------------- the wide drawer
# The pictures above are one drawer: one picture size, one size of shape, one palette, always
# supersampled. A student's picture is none of these, so training also draws with sample_wide: the same
# combination (and so the same held-out seeds and combinations) from the same first three draws, then
# a picture of its own size and a shape of its own size, colour, background, edge, fill and file format.
WIDE_SIDE = (224, 640)          # picture width and height, each log-uniform in this range
WIDE_SQUARE_SHARE = 0.35        # share of square pictures
WIDE_MAX_ASPECT = 2.0           # long side / short side at most
WIDE_MIN_WIDTH = 24             # the smallest shape, pixels across
WIDE_MAX_SHARE = 0.45           # the largest shape, a share of the picture's short side
WIDE_JITTER = 0.06              # centre jitter, share of the side, each axis, ±
WIDE_PALETTE_SHARE = 0.3        # share of colours from COLOURS (tinted ±TINT), the rest from WIDE_HUES
# name → (hue range in degrees (lo > hi wraps through 0), lowest saturation, lowest value) of the
# colours drawn in HSV: the named colours a student picks (CSS/X11 red … purple) and nearby shades
WIDE_HUES: dict[str, tuple[tuple[float, float], float, float]] = {
    "红": ((345.0, 8.0), 0.7, 0.55),
    "橙": ((24.0, 40.0), 0.75, 0.75),
    "黄": ((49.0, 62.0), 0.7, 0.75),
    "绿": ((88.0, 155.0), 0.5, 0.4),
    "蓝": ((200.0, 245.0), 0.55, 0.45),
    "紫": ((265.0, 305.0), 0.45, 0.4),
}
WIDE_OUTLINE_SHARE = 0.2        # outlines instead of fills
WIDE_HARD_EDGE_SHARE = 0.5      # drawn at output resolution (no supersampling)
WIDE_JPEG_SHARE = 0.25          # saved as JPEG (quality 45–95) and read back
WIDE_ROTATION_DEG = 15.0        # square (half the time)/triangle/star rotation, ±
# a star's inner radius / outer radius, uniform in this range: a student's star may be a thin pentagram
# (0.38) or a fat cartoon star; the first drawer's is always STAR_INNER
WIDE_STAR_INNER = (0.36, 0.56)
# with sample_wide(seed, small_share=…), that share of the shapes is drawn from WIDE_MIN_WIDTH to this width
# (log-uniform): the model errs most on shapes under 70 px, which cover only a few 16-px patches
WIDE_SMALL_WIDTH = 70


@dataclass(frozen=True)
class WideSample(Sample):
    """A picture of :func:`sample_wide` with every value the drawer chose (``params``)."""

    params: dict


def _hsv_rgb(h: float, s: float, v: float) -> tuple[int, int, int]:
    h = (h % 360.0) / 60.0
    i, f = int(h), h - int(h)
    p, q, t = v * (1 - s), v * (1 - s * f), v * (1 - s * (1 - f))
    r, g, b = [(v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q)][i % 6]
    return (int(round(255 * r)), int(round(255 * g)), int(round(255 * b)))


def _wide_colour(rng: np.random.Generator, colour: str) -> tuple[int, int, int]:
    if rng.random() < WIDE_PALETTE_SHARE:
        return tuple(int(v) for v in np.clip(np.array(COLOURS[colour]) + rng.integers(-TINT, TINT + 1, size=3),
                                             0, 255))
    (lo, hi), smin, vmin = WIDE_HUES[colour]
    span = (hi - lo) % 360.0
    return _hsv_rgb(lo + float(rng.uniform(0, span)), float(rng.uniform(smin, 1.0)), float(rng.uniform(vmin, 1.0)))


def _wide_picture(rng: np.random.Generator) -> tuple[int, int]:
    lo, hi = math.log(WIDE_SIDE[0]), math.log(WIDE_SIDE[1])
    w = int(round(math.exp(rng.uniform(lo, hi))))
    if rng.random() < WIDE_SQUARE_SHARE:
        return w, w
    while True:
        h = int(round(math.exp(rng.uniform(lo, hi))))
        if max(w, h) <= WIDE_MAX_ASPECT * min(w, h):
            return w, h


def _wide_background(rng: np.random.Generator) -> tuple[int, int, int]:
    u = rng.random()
    if u < 0.5:
        return (255, 255, 255)
    if u < 0.75:   # a grey like the first drawer's, lighter on average
        g = int(rng.integers(200, 256))
        return tuple(int(v) for v in np.clip(g + rng.integers(-BACKGROUND_TINT, BACKGROUND_TINT + 1, size=3), 0, 255))
    return tuple(int(v) for v in rng.integers(228, 256, size=3))   # a light tint


# the polygon "radius" of synthetic._polygon that gives a shape of width 1 (circle: 0.9 r across each way)
_WIDTH_PER_R = {"圆": 1.8, "正方形": 1.8, "三角形": math.sqrt(3.0), "星形": 2 * math.cos(math.radians(18))}


def wide_heldout_seeds(n: int = N_WIDE_HELDOUT) -> list[int]:
    """The wide drawer's own evaluation seeds: ``n`` seeds from :data:`WIDE_HELDOUT_SEED_START` on (above
    HELDOUT_SEED_START, so no training stage drew them), any combination. Beside the independent drawer they
    tell "the model cannot see a shape this small" from "the model has not met this drawer"."""
    return list(range(WIDE_HELDOUT_SEED_START, WIDE_HELDOUT_SEED_START + n))


def sample_wide(seed: int, small_share: float = 0.0, outline_share: float = WIDE_OUTLINE_SHARE) -> WideSample:
    """A picture of ``seed`` from the wide drawer: the same (colour, shape, position) as ``sample(seed)``
    (:func:`combo_of`), drawn on a 224–640 px picture (square or not) with a shape from 24 px to 45 % of
    the short side, a palette or HSV named-colour shade, a white, grey or tinted background, a fill or an
    outline, supersampled or hard edges, sometimes JPEG, a star of thin or fat proportions. Same seed,
    same bytes. With ``small_share`` > 0 that share of the seeds (chosen by a stream of their own) draws
    its shape from 24 px to :data:`WIDE_SMALL_WIDTH` instead; the picture, colour, background, edge and the
    rest are drawn as before (what scales with the shape, such as an outline's width, follows the new one).
    ``outline_share`` is the share of outlines instead of fills; a seed whose draw falls between
    :data:`WIDE_OUTLINE_SHARE` and it swaps fill for outline or back (and, drawing an outline's width or not,
    draws different edge, JPEG and star values after it). The defaults draw exactly what earlier stages
    trained on."""
    seed = _check_seed(seed)
    for name, share in (("small_share", small_share), ("outline_share", outline_share)):
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"{name} must lie in [0, 1], got {share!r}")
    small = small_share > 0 and float(np.random.default_rng([seed, 0x5A11]).random()) < small_share
    rng = _rng(seed)
    c, s, p = (int(rng.integers(n)) for n in (len(COLOURS), len(SHAPES), len(POSITIONS)))
    colour, shape, position = list(COLOURS)[c], SHAPES[s], list(POSITIONS)[p]
    rng = np.random.default_rng([seed, 0x3D1E])   # the wide drawer's own stream from here on
    W, H = _wide_picture(rng)
    top = WIDE_MAX_SHARE * min(W, H)
    if small:   # still one draw from the same stream, so the later draws keep their order
        top = min(top, WIDE_SMALL_WIDTH)
    width = float(math.exp(rng.uniform(math.log(WIDE_MIN_WIDTH), math.log(top))))
    fx, fy = (POSITIONS[position][0] / SIZE, POSITIONS[position][1] / SIZE)   # 0.25, 0.5 or 0.75
    half = width / 2
    centre = [min(max(f * side + float(rng.uniform(-WIDE_JITTER, WIDE_JITTER)) * side, half + 2), side - half - 2)
              for f, side in ((fx, W), (fy, H))]
    fg, bg = _wide_colour(rng, colour), _wide_background(rng)
    rotate = shape != "圆" and (shape != "正方形" or rng.random() < 0.5)
    rot = float(rng.uniform(-WIDE_ROTATION_DEG, WIDE_ROTATION_DEG)) if rotate else 0.0
    outline = int(rng.integers(2, max(3, int(width / 8)) + 1)) if rng.random() < outline_share else 0
    k = 1 if rng.random() < WIDE_HARD_EDGE_SHARE else SUPERSAMPLE
    quality = int(rng.integers(45, 96)) if rng.random() < WIDE_JPEG_SHARE else None
    # drawn last, so every other value of a seed is what it was before stars varied
    inner = float(rng.uniform(*WIDE_STAR_INNER)) if shape == "星形" else None

    img = Image.new("RGB", (W * k, H * k), bg)
    d = ImageDraw.Draw(img)
    cx, cy, r = centre[0] * k, centre[1] * k, width / _WIDTH_PER_R[shape] * k
    line = {"fill": None, "outline": fg, "width": outline * k} if outline else {"fill": fg}
    if shape == "圆":
        rc = 0.9 * r
        d.ellipse([cx - rc, cy - rc, cx + rc, cy + rc], **line)
    elif outline:
        pts = _polygon(shape, cx, cy, r, math.radians(rot), star_inner=inner or STAR_INNER)
        d.line(pts + pts[:1], fill=fg, width=outline * k, joint="curve")
    else:
        d.polygon(_polygon(shape, cx, cy, r, math.radians(rot), star_inner=inner or STAR_INNER), fill=fg)
    if k > 1:
        img = img.reduce(k)
    if quality is not None:
        buf = io.BytesIO()
        img.save(buf, format="JPEG", quality=quality)
        buf.seek(0)
        img = Image.open(buf).convert("RGB")
    params = {"picture": [W, H], "width_px": round(width, 1), "centre": [round(v, 1) for v in centre],
              "rgb": list(fg), "background": list(bg), "rotation_deg": round(rot, 1), "outline_px": outline,
              "supersample": k, "jpeg_quality": quality,
              "star_inner": None if inner is None else round(inner, 3), "small": small}
    return WideSample(seed, colour, shape, position, img, params)
