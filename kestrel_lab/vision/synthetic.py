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


def _polygon(shape: str, cx: float, cy: float, r: float, rot: float) -> list[tuple[float, float]]:
    """Vertices (drawing pixels) of a square, an upward triangle or a five-point star."""
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
            rad = r if k % 2 == 0 else 0.42 * r
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
