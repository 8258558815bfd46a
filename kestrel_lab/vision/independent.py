"""A second, independent drawer for evaluating qwen3-tiny-vl on pictures it was not trained on.

The training pictures (:mod:`kestrel_lab.vision.synthetic`) come from one drawer: its palette, its
sizes, drawn at 4× and box-reduced. A model can learn that drawer rather than "a red circle", so this
module draws the evaluation pictures the way a student would, with its own code path and its own
values, sharing nothing with the training drawer but the answer sentence (``synthetic.answer_for``):

- PIL ``ImageDraw`` primitives (``ellipse``, ``rectangle``, ``regular_polygon``, a star ``polygon``)
  at the output resolution, no supersampling (hard edges);
- its own colours: pure RGB values and CSS/X11 named colours (:data:`COLOURS`);
- its own sizes: the shape's width in pixels in four bands (:data:`SIZE_BANDS`), from 24 px to 45 % of
  the picture's short side;
- its own pictures: square and non-square, 256 to 640 px (:data:`PICTURE_SIZES`), white or a light
  named background, some outlines instead of fills, some saved as JPEG and read back.

:func:`evaluation_set` is the fixed set (:data:`N_ITEMS` items): every (colour, shape, position)
combination :data:`PER_COMBO` times, each time in a different size band, so colours, shapes, positions
and bands are all balanced. Each item is fully determined by its index (a seeded numpy rng).
:func:`tally` turns answered items into the tables the evaluation reports (per field, per size band,
per picture size, confusion tables). Taught in day21_3.
"""
from __future__ import annotations

import io
import math
from collections import Counter
from dataclasses import asdict, dataclass

import numpy as np
from PIL import Image, ImageDraw

from . import synthetic

# answer word → (CSS/X11 or plain name, RGB); none of these is the training palette's value
COLOURS: dict[str, tuple[tuple[str, tuple[int, int, int]], ...]] = {
    "红": (("pure red", (255, 0, 0)), ("crimson", (220, 20, 60)), ("firebrick", (178, 34, 34)),
          ("red3", (205, 0, 0))),
    "橙": (("orange", (255, 165, 0)), ("darkorange", (255, 140, 0)), ("pure orange", (255, 128, 0)),
          ("orange3", (205, 133, 0))),
    "黄": (("pure yellow", (255, 255, 0)), ("gold", (255, 215, 0)), ("yellow3", (205, 205, 0)),
          ("yellow2", (238, 238, 0))),
    "绿": (("green", (0, 128, 0)), ("pure green", (0, 255, 0)), ("forestgreen", (34, 139, 34)),
          ("limegreen", (50, 205, 50))),
    "蓝": (("pure blue", (0, 0, 255)), ("royalblue", (65, 105, 225)), ("dodgerblue", (30, 144, 255)),
          ("mediumblue", (0, 0, 205))),
    "紫": (("purple", (128, 0, 128)), ("darkviolet", (148, 0, 211)), ("blueviolet", (138, 43, 226)),
          ("darkorchid", (153, 50, 204))),
}
# (name, RGB) of the backgrounds: white most of the time, else a light named colour
BACKGROUNDS: tuple[tuple[str, tuple[int, int, int]], ...] = (
    ("white", (255, 255, 255)), ("white", (255, 255, 255)), ("white", (255, 255, 255)),
    ("whitesmoke", (245, 245, 245)), ("aliceblue", (240, 248, 255)), ("linen", (250, 240, 230)),
    ("gainsboro", (220, 220, 220)), ("honeydew", (240, 255, 240)),
)
# (width, height) of the pictures: square and not, up to 640 px
PICTURE_SIZES: tuple[tuple[int, int], ...] = ((256, 256), (320, 240), (512, 512), (640, 480),
                                              (300, 400), (400, 400))
# size band → (smallest, largest) shape width in pixels; None: 45 % of the picture's short side
SIZE_BANDS: dict[str, tuple[int, int | None]] = {
    "24-39 px": (24, 39), "40-69 px": (40, 69), "70-109 px": (70, 109), "110 px-45 %": (110, None),
}
MAX_SHARE = 0.45          # the largest shape: 45 % of the picture's short side
# where the five positions put the shape's centre, as a share of the picture's width and height
POSITIONS: dict[str, tuple[float, float]] = {
    "左上角": (0.25, 0.25), "右上角": (0.75, 0.25), "左下角": (0.25, 0.75), "右下角": (0.75, 0.75),
    "中间": (0.5, 0.5),
}
JITTER = 0.05             # centre jitter, a share of the picture's side, each axis, ±
MARGIN = 4                # pixels kept between the shape and the picture's edge
PER_COMBO = 2             # items per (colour, shape, position), each in a different size band
N_ITEMS = len(COLOURS) * len(synthetic.SHAPES) * len(POSITIONS) * PER_COMBO   # 240
OUTLINE_EVERY = 8         # every 8th item is an outline (3–6 px) instead of a fill
JPEG_EVERY = 6            # every 6th item (offset 3) is saved as JPEG (quality 60–85) and read back
SET_SEED = 0x1DE9         # mixed with the index into each item's rng


@dataclass(frozen=True)
class Item:
    """One picture of the independent set: everything the drawer decided. Taught in day21_3."""

    index: int
    colour: str
    colour_name: str
    rgb: tuple[int, int, int]
    shape: str
    position: str
    band: str
    width_px: int                 # the shape's width (bounding box) in pixels
    picture: tuple[int, int]      # (width, height)
    centre: tuple[int, int]
    rotation_deg: float           # triangle and star only
    background: str
    background_rgb: tuple[int, int, int]
    style: str                    # "fill" or "outline"
    outline_px: int               # 0 for a fill
    jpeg_quality: int | None

    @property
    def combo(self) -> tuple[str, str, str]:
        return (self.colour, self.shape, self.position)

    @property
    def answer(self) -> str:
        return synthetic.answer_for(self.colour, self.shape, self.position)

    @property
    def picture_label(self) -> str:
        return f"{self.picture[0]}×{self.picture[1]}"

    def params(self) -> dict:
        """The drawer's parameters as JSON-ready values."""
        d = asdict(self)
        d["rgb"], d["picture"], d["centre"] = list(self.rgb), list(self.picture), list(self.centre)
        d["background_rgb"] = list(self.background_rgb)
        return d


def _band_range(band: str, picture: tuple[int, int]) -> tuple[int, int]:
    lo, hi = SIZE_BANDS[band]
    top = int(MAX_SHARE * min(picture))
    return lo, min(hi, top) if hi is not None else top


def band_of(width_px: float) -> str:
    """The size band (:data:`SIZE_BANDS`) of a shape ``width_px`` across, for pictures of other drawers."""
    if width_px < min(lo for lo, _ in SIZE_BANDS.values()):
        raise ValueError(f"a shape {width_px} px across is below the smallest size band {next(iter(SIZE_BANDS))}")
    return [name for name, (lo, _) in SIZE_BANDS.items() if width_px >= lo][-1]


def _combos() -> list[tuple[str, str, str]]:
    return [(c, s, p) for c in COLOURS for s in synthetic.SHAPES for p in POSITIONS]


def item(index: int) -> Item:
    """The ``index``-th item of the set (0 ≤ index < N_ITEMS): its combination and band come from the
    index (balanced), everything else from a rng seeded by it. Taught in day21_3."""
    if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or not 0 <= index < N_ITEMS:
        raise ValueError(f"index must be an integer in [0, {N_ITEMS}), got {index!r}")
    index = int(index)
    k, rep = divmod(index, PER_COMBO)
    colour, shape, position = _combos()[k]
    bands = list(SIZE_BANDS)
    # a Latin-square walk: every colour, shape and position meets every band equally often, and the
    # PER_COMBO items of one combination fall in different bands
    ci, si, pi = list(COLOURS).index(colour), synthetic.SHAPES.index(shape), list(POSITIONS).index(position)
    band = bands[(ci + si + pi + rep * len(bands) // PER_COMBO) % len(bands)]
    rng = np.random.default_rng([index, SET_SEED])
    fits = [p for p in PICTURE_SIZES if _band_range(band, p)[0] <= _band_range(band, p)[1]]
    picture = fits[int(rng.integers(len(fits)))]
    lo, hi = _band_range(band, picture)
    width = int(rng.integers(lo, hi + 1))
    cname, rgb = COLOURS[colour][int(rng.integers(len(COLOURS[colour])))]
    bname, bg = BACKGROUNDS[int(rng.integers(len(BACKGROUNDS)))]
    fx, fy = POSITIONS[position]
    half = width / 2
    centre = []
    for side, f in zip(picture, (fx, fy)):
        c = f * side + float(rng.uniform(-JITTER, JITTER)) * side
        centre.append(int(round(min(max(c, half + MARGIN), side - half - MARGIN))))
    rot = round(float(rng.uniform(-15.0, 15.0)), 1) if shape in ("三角形", "星形") else 0.0
    outline = index % OUTLINE_EVERY == OUTLINE_EVERY - 1
    quality = int(rng.integers(60, 86)) if index % JPEG_EVERY == 3 else None
    return Item(index, colour, cname, rgb, shape, position, band, width, picture, (centre[0], centre[1]), rot,
                bname, bg, "outline" if outline else "fill",
                int(rng.integers(3, 7)) if outline else 0, quality)


def evaluation_set() -> list[Item]:
    """All N_ITEMS items, in index order."""
    return [item(i) for i in range(N_ITEMS)]


def _star(cx: float, cy: float, r: float, rot_deg: float, inner: float = 0.45) -> list[tuple[float, float]]:
    pts = []
    for k in range(10):
        a = math.radians(-90.0 + rot_deg + 36.0 * k)
        rad = r if k % 2 == 0 else inner * r
        pts.append((cx + rad * math.cos(a), cy + rad * math.sin(a)))
    return pts


def render(it: Item) -> Image.Image:
    """The picture of an item: PIL primitives at output resolution, then JPEG if the item says so."""
    img = Image.new("RGB", it.picture, it.background_rgb)
    d = ImageDraw.Draw(img)
    cx, cy = it.centre
    r = it.width_px / 2
    fill = None if it.style == "outline" else it.rgb
    line = it.rgb if it.style == "outline" else None
    w = it.outline_px or 1
    if it.shape == "圆":
        d.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill, outline=line, width=w)
    elif it.shape == "正方形":
        d.rectangle([cx - r, cy - r, cx + r, cy + r], fill=fill, outline=line, width=w)
    elif it.shape == "三角形":
        d.regular_polygon((cx, cy, r), 3, rotation=it.rotation_deg, fill=fill, outline=line, width=w)
    else:
        pts = _star(cx, cy, r, it.rotation_deg)
        if fill is not None:
            d.polygon(pts, fill=fill)
        else:
            d.line(pts + pts[:1], fill=line, width=w, joint="curve")
    if it.jpeg_quality is not None:
        buf = io.BytesIO()
        img.save(buf, format="JPEG", quality=it.jpeg_quality)
        buf.seek(0)
        img = Image.open(buf).convert("RGB")
    return img


def draw(index: int) -> tuple[Image.Image, str]:
    """(picture, answer sentence) of the ``index``-th item. Taught in day21_3."""
    it = item(index)
    return render(it), it.answer


# ----------------------------------------------------------------------------- bookkeeping
FIELDS = ("colour", "shape", "position")


def score(expected: tuple[str, str, str], got_text: str, ended: bool = True) -> dict:
    """One answer against its (colour, shape, position): exact (the sentence and the end token) and
    per field; an answer that is not a sentence of the format is wrong in every field."""
    try:
        got = synthetic.parse_answer(got_text)
    except ValueError:
        got = ("?", "?", "?")
    fields = {f: got[i] == expected[i] for i, f in enumerate(FIELDS)}
    return {"answered": list(got), "exact": ended and all(fields.values()), "fields": fields}


def _share(rows: list[dict]) -> dict:
    n = len(rows)
    out = {"n": n, "exact": sum(r["exact"] for r in rows)}
    out["accuracy"] = out["exact"] / n if n else None
    for f in FIELDS:
        out[f] = sum(r["fields"][f] for r in rows) / n if n else None
    return out


def tally(rows: list[dict], by: tuple[str, ...] = ("band", "picture", "style", "background", "jpeg")) -> dict:
    """Totals of scored rows: overall, per field, per value of each key in ``by`` and the confusion tables.

    Each row needs ``expected`` ((colour, shape, position)), ``answered`` (the same, '?' where it did
    not parse), ``exact``, ``fields`` ({field: bool}) and a value for each key of ``by`` that it has
    (rows without the key are left out of that breakdown)."""
    out = {"overall": _share(rows), "by": {}}
    for key in by:
        values = sorted({str(r[key]) for r in rows if key in r}, key=_natural)
        if values:
            out["by"][key] = {v: _share([r for r in rows if key in r and str(r[key]) == v]) for v in values}
    labels = {"colour": list(COLOURS), "shape": list(synthetic.SHAPES), "position": list(POSITIONS)}
    out["confusion"] = {}
    for i, f in enumerate(FIELDS):
        count = Counter((r["expected"][i], r["answered"][i]) for r in rows)
        cols = labels[f] + ["?"]
        out["confusion"][f] = {"rows": labels[f], "columns": cols,
                               "counts": [[count[(a, b)] for b in cols] for a in labels[f]]}
    return out


def _natural(v: str):
    """Sort '24-39 px' before '110 px-45 %', '256×256' before '512×512'."""
    head = ""
    for ch in v:
        if not ch.isdigit():
            break
        head += ch
    return (int(head) if head else math.inf, v)


def confusion_markdown(table: dict, title: str = "drawn \\ answered") -> str:
    """A confusion table of :func:`tally` as markdown (rows drawn, columns answered)."""
    lines = [f"| {title} | " + " | ".join(table["columns"]) + " |", "|---" * (len(table["columns"]) + 1) + "|"]
    for name, counts in zip(table["rows"], table["counts"]):
        lines.append(f"| {name} | " + " | ".join(str(c) for c in counts) + " |")
    return "\n".join(lines)
