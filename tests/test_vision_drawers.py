"""The tiny VL model's two other drawers: the wide training drawer (synthetic.sample_wide) and the
independent evaluation drawer (vision.independent) — their ranges, determinism, the balance of the
evaluation set, that each picture shows what its answer says, and the evaluation's bookkeeping."""
import colorsys
import hashlib
from collections import Counter

import numpy as np
import pytest

from kestrel_lab.vision import independent as ind
from kestrel_lab.vision import synthetic as syn

WIDE_SEEDS = range(0, 400, 3)


def _shape_pixels(img, bg) -> np.ndarray:
    a = np.asarray(img, dtype=np.int16)
    return np.abs(a - np.array(bg, dtype=np.int16)).sum(axis=2) > 60


def _bbox(mask: np.ndarray) -> tuple[int, int, int, int]:
    ys, xs = np.nonzero(mask)
    return int(xs.min()), int(ys.min()), int(xs.max()), int(ys.max())


def _quadrant_ok(position: str, cx: float, cy: float, w: int, h: int) -> bool:
    fx, fy = cx / w, cy / h
    want = {"左上角": (fx < 0.5, fy < 0.5), "右上角": (fx > 0.5, fy < 0.5), "左下角": (fx < 0.5, fy > 0.5),
            "右下角": (fx > 0.5, fy > 0.5), "中间": (0.35 < fx < 0.65, 0.35 < fy < 0.65)}
    return all(want[position])


# ----------------------------------------------------------------------------- the wide drawer
def test_wide_is_deterministic_and_keeps_the_seed_combination():
    for seed in (0, 7, 123):
        a, b = syn.sample_wide(seed), syn.sample_wide(seed)
        assert a.image.tobytes() == b.image.tobytes() and a.params == b.params
        assert a.combo == syn.combo_of(seed) == syn.sample(seed).combo and a.answer == syn.sample(seed).answer
    assert syn.sample_wide(1).image.tobytes() != syn.sample_wide(2).image.tobytes()
    with pytest.raises(ValueError, match="non-negative integer"):
        syn.sample_wide(-1)


def test_wide_ranges_cover_what_a_student_draws():
    ps = [syn.sample_wide(s).params for s in WIDE_SEEDS]
    for p in ps:
        w, h = p["picture"]
        assert syn.WIDE_SIDE[0] <= min(w, h) and max(w, h) <= syn.WIDE_SIDE[1]
        assert max(w, h) <= syn.WIDE_MAX_ASPECT * min(w, h)
        assert syn.WIDE_MIN_WIDTH - 0.1 <= p["width_px"] <= syn.WIDE_MAX_SHARE * min(w, h) + 0.1
    shares = {"non-square": np.mean([p["picture"][0] != p["picture"][1] for p in ps]),
              "outline": np.mean([p["outline_px"] > 0 for p in ps]),
              "hard edge": np.mean([p["supersample"] == 1 for p in ps]),
              "jpeg": np.mean([p["jpeg_quality"] is not None for p in ps]),
              "white": np.mean([p["background"] == [255, 255, 255] for p in ps])}
    for name, v in shares.items():
        assert 0.08 < v < 0.9, (name, v)
    widths = [p["width_px"] for p in ps]
    assert min(widths) < 32 and max(widths) > 150   # both ends of the size range are drawn
    assert min(min(p["picture"]) for p in ps) < 260 and max(max(p["picture"]) for p in ps) > 560
    inner = [p["star_inner"] for p in ps if p["star_inner"] is not None]   # stars only, thin and fat
    assert len(inner) > 5 and all(syn.WIDE_STAR_INNER[0] <= v <= syn.WIDE_STAR_INNER[1] for v in inner)
    assert min(inner) < 0.40 and max(inner) > 0.50
    assert all(p["star_inner"] is None for s, p in zip(WIDE_SEEDS, ps) if syn.combo_of(s)[1] != "星形")


def test_wide_small_share_draws_small_shapes_and_keeps_the_rest():
    """small_share=0 is the plain drawer byte for byte; a small seed changes its width and nothing drawn before it."""
    for seed in WIDE_SEEDS[:20]:
        assert syn.sample_wide(seed, 0.0).image.tobytes() == syn.sample_wide(seed).image.tobytes()
    half = [syn.sample_wide(s, 0.5).params for s in WIDE_SEEDS]
    assert 0.3 < np.mean([p["small"] for p in half]) < 0.7
    for s, p in zip(WIDE_SEEDS, half):
        plain = syn.sample_wide(s).params
        assert p["picture"] == plain["picture"]
        if p["small"]:
            assert syn.WIDE_MIN_WIDTH - 0.1 <= p["width_px"] <= syn.WIDE_SMALL_WIDTH + 0.1
        else:
            assert p == plain
    assert all(syn.sample_wide(s, 1.0).params["width_px"] <= syn.WIDE_SMALL_WIDTH + 0.1 for s in WIDE_SEEDS)
    with pytest.raises(ValueError, match="small_share"):
        syn.sample_wide(3, 1.5)


def test_wide_outline_share_turns_fills_into_outlines_and_keeps_the_picture():
    """The default outline_share is the old drawer; a higher one turns some fills into outlines and nothing
    drawn before the outline's draw changes; 1.0 draws only outlines."""
    for seed in WIDE_SEEDS[:20]:
        assert (syn.sample_wide(seed, 0.0, syn.WIDE_OUTLINE_SHARE).image.tobytes()
                == syn.sample_wide(seed).image.tobytes())
    more = [syn.sample_wide(s, 0.0, 0.6).params for s in WIDE_SEEDS]
    plain = [syn.sample_wide(s).params for s in WIDE_SEEDS]
    assert sum(p["outline_px"] > 0 for p in more) > sum(p["outline_px"] > 0 for p in plain) + len(WIDE_SEEDS) // 5
    for p, q in zip(more, plain):
        assert (p["picture"], p["width_px"], p["centre"], p["rgb"], p["rotation_deg"]) == \
            (q["picture"], q["width_px"], q["centre"], q["rgb"], q["rotation_deg"])
        if q["outline_px"]:   # an outline stays that outline
            assert p == q
    assert all(syn.sample_wide(s, 0.0, 1.0).params["outline_px"] >= 2 for s in WIDE_SEEDS)
    with pytest.raises(ValueError, match="outline_share"):
        syn.sample_wide(3, 0.0, -0.1)


def test_wide_colours_are_their_named_hue():
    """Every colour the wide drawer picks is its palette colour (tinted) or lies in its hue range."""
    for seed in range(300):
        smp = syn.sample_wide(seed)
        rgb = smp.params["rgb"]
        pal = np.array(syn.COLOURS[smp.colour])
        if np.abs(np.array(rgb) - pal).max() <= syn.TINT:
            continue
        h, s, v = colorsys.rgb_to_hsv(*(c / 255 for c in rgb))
        (lo, hi), smin, vmin = syn.WIDE_HUES[smp.colour]
        deg = h * 360
        inside = lo - 1 <= deg <= hi + 1 if lo < hi else deg >= lo - 1 or deg <= hi + 1
        assert inside and s >= smin - 0.01 and v >= vmin - 0.01, (seed, smp.colour, rgb, deg, s, v)


def test_wide_picture_shows_its_answer():
    for seed in WIDE_SEEDS:
        smp = syn.sample_wide(seed)
        p = smp.params
        mask = _shape_pixels(smp.image, p["background"])
        assert mask.sum() > 20, seed
        x0, y0, x1, y1 = _bbox(mask)
        assert _quadrant_ok(smp.position, (x0 + x1) / 2, (y0 + y1) / 2, *smp.image.size), (seed, smp.position)
        # rotated squares, triangles and stars are wider than their upright width; outlines add their line
        w = p["width_px"]
        assert 0.75 * w - 4 <= x1 - x0 + 1 <= 1.45 * w + p["outline_px"] + 4, (seed, smp.shape, x1 - x0, p)


def test_the_first_drawer_is_untouched_by_the_wide_one():
    """sample/draw give the same bytes whether or not sample_wide ran (no shared state)."""
    before = syn.draw(5)[0].tobytes()
    syn.sample_wide(5)
    assert syn.draw(5)[0].tobytes() == before


# ----------------------------------------------------------------------------- the independent drawer


def test_independent_set_is_stratified():
    items = ind.evaluation_set()
    assert len(items) == ind.N_ITEMS == 240
    assert [it.index for it in items] == list(range(ind.N_ITEMS))
    combos = Counter(it.combo for it in items)
    assert len(combos) == len(syn.COLOURS) * len(syn.SHAPES) * len(syn.POSITIONS)
    assert set(combos.values()) == {ind.PER_COMBO}
    for combo in combos:   # the items of one combination are in different size bands
        bands = [it.band for it in items if it.combo == combo]
        assert len(set(bands)) == len(bands)
    assert set(Counter(it.band for it in items).values()) == {ind.N_ITEMS // len(ind.SIZE_BANDS)}
    for field in ("colour", "shape", "position"):
        per = Counter((getattr(it, field), it.band) for it in items)
        assert len(set(per.values())) == 1, (field, per)


def test_independent_items_stay_in_their_ranges():
    items = ind.evaluation_set()
    for it in items:
        w, h = it.picture
        lo, hi = ind.SIZE_BANDS[it.band]
        assert lo <= it.width_px <= (hi if hi is not None else int(ind.MAX_SHARE * min(w, h)))
        assert it.width_px <= ind.MAX_SHARE * min(w, h)
        cx, cy = it.centre
        assert it.width_px / 2 <= cx <= w - it.width_px / 2 and it.width_px / 2 <= cy <= h - it.width_px / 2
        assert it.rgb in [rgb for _, rgb in ind.COLOURS[it.colour]]
    assert any(it.picture[0] != it.picture[1] for it in items) and any(min(it.picture) >= 512 for it in items)
    assert sum(it.jpeg_quality is not None for it in items) == ind.N_ITEMS // ind.JPEG_EVERY
    assert sum(it.style == "outline" for it in items) == ind.N_ITEMS // ind.OUTLINE_EVERY


def test_wide_heldout_seeds_are_never_trained_on_and_fall_in_every_size_band():
    seeds = syn.wide_heldout_seeds()
    assert len(seeds) == len(set(seeds)) == syn.N_WIDE_HELDOUT
    assert min(seeds) >= syn.HELDOUT_SEED_START and not any(syn.is_training_seed(s) for s in seeds)
    assert not set(seeds) & set(syn.heldout_seeds())
    assert {ind.band_of(syn.sample_wide(s).params["width_px"]) for s in seeds[:80]} == set(ind.SIZE_BANDS)


def test_band_of_agrees_with_the_independent_items():
    assert all(ind.band_of(it.width_px) == it.band for it in ind.evaluation_set())
    assert ind.band_of(39.6) == "24-39 px" and ind.band_of(40) == "40-69 px" and ind.band_of(300) == "110 px-45 %"
    with pytest.raises(ValueError, match="below the smallest size band"):
        ind.band_of(23.9)


def test_independent_colours_are_not_the_training_palette():
    for name, shades in ind.COLOURS.items():
        for _, rgb in shades:
            assert np.abs(np.array(rgb) - np.array(syn.COLOURS[name])).max() > syn.TINT, (name, rgb)


def test_independent_is_deterministic_and_pinned():
    a, ans = ind.draw(0)
    b, _ = ind.draw(0)
    assert a.tobytes() == b.tobytes() and ans == ind.item(0).answer
    assert a.size == ind.item(0).picture and a.mode == "RGB"
    digest = hashlib.sha256(b"".join(ind.draw(i)[0].tobytes() for i in (0, 3, 7))).hexdigest()
    # items 0 (PNG), 3 (JPEG) and 7 (an outline) with the pinned Pillow: the evaluation set's pixels
    assert digest == "ef8bdb5f2928c6e5f2df71d3a05ea57f4664f20b28e86dece47008f2fb1ec301"
    with pytest.raises(ValueError, match="index must be"):
        ind.item(ind.N_ITEMS)


@pytest.mark.parametrize("index", [0, 1, 5, 7, 15, 33, 64, 101, 150, 199, 238, 239])
def test_independent_picture_shows_its_answer(index):
    it = ind.item(index)
    img = ind.render(it)
    mask = _shape_pixels(img, it.background_rgb)
    x0, y0, x1, y1 = _bbox(mask)
    assert _quadrant_ok(it.position, (x0 + x1) / 2, (y0 + y1) / 2, *it.picture)
    assert abs((x1 - x0 + 1) - it.width_px) <= 0.15 * it.width_px + 3, (x1 - x0 + 1, it.width_px)
    if it.style == "fill" and it.jpeg_quality is None:
        a = np.asarray(img)
        assert (a[mask] == np.array(it.rgb)).all(axis=1).mean() > 0.95   # hard edges: one colour


# ----------------------------------------------------------------------------- bookkeeping
def _row(expected, got_text, **keys):
    return {"expected": list(expected), **ind.score(expected, got_text), **keys}


def test_score_and_tally_on_a_tiny_fake():
    rows = [_row(("红", "圆", "左上角"), "左上角有一个红色的圆。", band="24-39 px", picture="256×256"),
            _row(("红", "圆", "左上角"), "左上角有一个橙色的圆。", band="24-39 px", picture="512×512"),
            _row(("蓝", "星形", "中间"), "中间有一个蓝色的三角形。", band="110 px-45 %", picture="512×512"),
            _row(("绿", "正方形", "右下角"), "不是答案", band="110 px-45 %", picture="256×256")]
    assert rows[0]["exact"] and not rows[1]["exact"] and rows[3]["answered"] == ["?", "?", "?"]
    assert not ind.score(("红", "圆", "左上角"), "左上角有一个红色的圆。", ended=False)["exact"]
    t = ind.tally(rows, by=("band", "picture"))
    ov = t["overall"]
    assert (ov["n"], ov["exact"], ov["accuracy"]) == (4, 1, 0.25)
    assert (ov["colour"], ov["shape"], ov["position"]) == (0.5, 0.5, 0.75)
    assert list(t["by"]["band"]) == ["24-39 px", "110 px-45 %"]          # natural order
    assert t["by"]["band"]["24-39 px"]["exact"] == 1 and t["by"]["band"]["110 px-45 %"]["shape"] == 0.0
    assert t["by"]["picture"]["512×512"]["n"] == 2 and t["by"]["picture"]["256×256"]["accuracy"] == 0.5
    col = t["confusion"]["colour"]
    assert col["columns"][-1] == "?" and col["rows"] == list(syn.COLOURS)
    red = col["counts"][col["rows"].index("红")]
    assert red[col["columns"].index("红")] == 1 and red[col["columns"].index("橙")] == 1
    shape = t["confusion"]["shape"]
    assert shape["counts"][shape["rows"].index("星形")][shape["columns"].index("三角形")] == 1
    assert shape["counts"][shape["rows"].index("正方形")][-1] == 1
    assert sum(map(sum, shape["counts"])) == len(rows)
    md = ind.confusion_markdown(shape)
    assert md.splitlines()[0].startswith("| drawn \\ answered | 圆") and len(md.splitlines()) == 2 + 4


def _eval_script():
    import importlib.util

    from kestrel_lab.paths import REPO_ROOT

    spec = importlib.util.spec_from_file_location("eval_tiny_vl", REPO_ROOT / "scripts" / "eval_tiny_vl.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_eval_readme_section_from_a_fake_run(tmp_path):
    ev = _eval_script()
    rows = [_row(("红", "圆", "左上角"), "左上角有一个红色的圆。", band="24-39 px", picture="256×256"),
            _row(("橙", "圆", "左上角"), "左上角有一个黄色的圆。", band="40-69 px", picture="320×240")]
    doc = {"heldout": {"transformers": ind.tally(rows[:1], by=())},
           "independent": {"tables": ind.tally(rows), "answered_by": {"transformers": 2}, "transformers_every": 1},
           "engine": {"q4_0": {"independent": {"n": 2, "compared": 2, "agree": 1, "agreement": 0.5, "exact": 1,
                                               "accuracy": 0.5}}},
           "provenance": {"commit": "abc", "machine": "m", "seconds": 3.0, "date": "d"}}
    text = ev.readme_section(doc)
    assert "| independent drawer | 2 | 1 (50.0 %) | 50.0 % | 100.0 % | 100.0 % |" in text
    assert "wide training drawer" not in text   # an evaluation from before the third set
    doc["wide"] = {"first_seed": syn.WIDE_HELDOUT_SEED_START, "transformers": ind.tally(rows[:1], by=ev.WIDE_BY)}
    own = ev.readme_section(doc).split("wide training drawer, unseen seeds: size")[1]
    assert "| 24-39 px | 1 | 1 (100.0 %) |" in own
    del doc["wide"]
    assert "| 40-69 px | 1 | 0 (0.0 %) | 0.0 % |" in text and "| 320×240 | 1 |" in text
    assert "| Q4_0 | independent | 2 | 1 (50.0 %) | 2 | 1 (50.0 %) | — | — |" in text   # no margins recorded
    doc["engine"]["q4_0"]["independent"].update(near_ties=1, margin_threshold=0.5)
    text = ev.readme_section(doc)
    assert "| Q4_0 | independent | 2 | 1 (50.0 %) | 2 | 1 (50.0 %) | 1 | 0 |" in text and "Q4_0 0.5" in text
    assert text.startswith("Independent set answered 2 by transformers.")
    assert "| 橙 | 0 | 0 | 1 | 0 | 0 | 0 | 0 |" in text    # colour confusion: orange answered yellow
    readme = tmp_path / "README.md"
    readme.write_text(f"# m\n\n{ev.BEGIN}\nOLD SECTION\n{ev.END}\ntail\n", encoding="utf-8")
    ev.rewrite_readme(readme, doc)
    new = readme.read_text(encoding="utf-8")
    assert "OLD SECTION" not in new and text in new and new.endswith(f"{ev.END}\ntail\n")
    readme.write_text("# no markers\n", encoding="utf-8")
    with pytest.raises(SystemExit, match="README.md: the markers"):
        ev.rewrite_readme(readme, doc)


def test_first_difference_takes_the_f32_engines_margin_where_it_equals_transformers():
    ev = _eval_script()
    row = {"got_ids": [5, 6, 7, 151645], "engine": {"f32": {"ids": [5, 6, 7, 151645], "margins": [9.0, 0.3, 4.0, 8.0]}}}
    assert ev.first_difference(row, [5, 9, 7, 151645], "q4_0") == {"step": 1, "margin": 0.3, "near_tie": True}
    assert ev.first_difference(row, [5, 6, 8, 151645], "q4_0") == {"step": 2, "margin": 4.0, "near_tie": False}
    assert ev.first_difference(row, [5, 6, 7], "q8_0")["step"] == 3          # stopped early: the next step
    row["engine"]["f32"]["ids"] = [5, 6, 8, 151645]                         # F32 itself differs: no margin to lean on
    assert ev.first_difference(row, [5, 9, 7, 151645], "q4_0") == {"step": 1, "margin": None, "near_tie": False}
    assert ev.first_difference(row, [5, 9, 7, 151645], "f32")["near_tie"] is False


def test_committed_independent_json_is_consistent():
    """independent.json (scripts/eval_tiny_vl.py): its items are the independent set's, its tables are
    what tally makes of its items, and the model README shows its section."""
    from kestrel_lab.paths import data_dir

    folder = data_dir() / "models" / "qwen3-tiny-vl"
    doc = __import__("json").loads((folder / "independent.json").read_text(encoding="utf-8"))
    items = doc["independent"]["items"]
    if doc["limit"] is None:
        assert [it["index"] for it in items] == list(range(ind.N_ITEMS))
    rows = []
    for it in items:
        want = ind.item(it["index"])
        assert it["expected_text"] == want.answer and it["band"] == want.band and it["rgb"] == list(want.rgb)
        assert it["picture"] == want.picture_label
        assert it["exact"] == (it["got"] == want.answer and it["got_ids"][-1] == 151645)
        rows.append({**it, "expected": list(want.combo), "jpeg": "jpeg" if it["jpeg_quality"] else "png"})
    assert ind.tally(rows) == doc["independent"]["tables"]
    assert ind.tally([r for r in rows if r["answered_by"] == "transformers"]) == doc["independent"]["transformers"]
    for q, sets in doc["engine"].items():
        r = sets["independent"]
        assert r["n"] == len(items) and r["agree"] == sum(it.get("engine_same", {}).get(q, False) for it in items)
        assert r["compared"] == sum(it["answered_by"] == "transformers" for it in items)
    if "wide" in doc:   # the wide drawer's unseen seeds (added after the first evaluations)
        wide = doc["wide"]["items"]
        if doc["limit"] is None:
            assert [it["seed"] for it in wide] == syn.wide_heldout_seeds()
        for it in wide[:24]:   # drawing all 240 takes seconds; the first ones pin the bookkeeping
            smp = syn.sample_wide(it["seed"])
            assert it["band"] == ind.band_of(smp.params["width_px"]) and it["expected_text"] == smp.answer
        rows = [{**it, "expected": list(syn.combo_of(it["seed"]))} for it in wide]
        assert ind.tally(rows, by=_eval_script().WIDE_BY) == doc["wide"]["transformers"]
    readme = (folder / "README.md").read_text(encoding="utf-8")
    assert _eval_script().readme_section(doc) in readme
