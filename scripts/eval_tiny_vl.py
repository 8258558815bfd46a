"""Evaluate qwen3-tiny-vl on its held-out sets, transformers and the engine side by side.

Three sets: today's held-out pictures (``synthetic.heldout_seeds()``, the training drawer on seeds and
combinations training never used), the independent set (``independent.evaluation_set()``, a second
drawer written for this: other code, colours, sizes, picture sizes, JPEG) and the wide training drawer
on seeds no stage trained on (``synthetic.wide_heldout_seeds()``), whose table by size band tells a
shape too small for the model to see from a drawer it has not met. For each picture:

- transformers (the reference): the checkpoint loaded in float32, greedy ``generate`` (the training
  script's ``greedy``: its prompt, its pixel processor);
- the numba engine on the VQF files at each quant (``tiny_vl_agreement.answer``: ``load_image``,
  ``encode_vl_chat``, greedy), compared with transformers token for token.

Each answer is parsed back into (colour, shape, position) and scored exactly and per field; the
totals go by field, size band, picture size, style, background and JPEG, with the confusion tables
(``independent.tally``). Writes independent.json beside heldout.json (atomically: per independent item
the drawer's parameters, expected and answered text, the fields; every set's tables; the agreement per
quant; commit, machine, seconds) and the README section between its markers.

    nice -n 10 python scripts/eval_tiny_vl.py [--quants f32,q8_0,q4_0] [--limit N] [--model DIR]
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
for _p in (REPO, REPO / "scripts"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from kestrel_lab import machine, models  # noqa: E402
from kestrel_lab.atomic import atomic_write, write_json  # noqa: E402
from kestrel_lab.golden import MARGIN_THRESHOLD  # noqa: E402
from kestrel_lab.measure import utc_now  # noqa: E402
from kestrel_lab.vision import independent, synthetic  # noqa: E402

MODEL_DIR = REPO / "data" / "models" / "qwen3-tiny-vl"
OUT_NAME = "independent.json"
BEGIN = "<!-- independent-eval:begin (written by scripts/eval_tiny_vl.py) -->"
END = "<!-- independent-eval:end -->"
HEADING = "## A second, independent drawer"
IM_END = 151645
SETS = ("heldout", "independent", "wide")
WIDE_BY = ("band", "style", "jpeg")   # the wide drawer's picture sizes are random: no table by picture


def _rows(kind: str, limit: int | None) -> list[dict]:
    """The items of one set as rows: picture-making parameters and the expected combination."""
    if kind == "heldout":
        seeds = synthetic.heldout_seeds()
        if limit:   # the training script's choice for --n-heldout: the first half and the last (unseen) half
            seeds = seeds[:limit // 2] + seeds[-(limit - limit // 2):]
        return [{"seed": s, "expected": list(synthetic.combo_of(s)),
                 "unseen": str(synthetic.combo_of(s) in synthetic.HELDOUT_COMBOS).lower(),
                 "picture": f"{synthetic.SIZE}×{synthetic.SIZE}"} for s in seeds]
    if kind == "wide":
        rows = []
        for s in synthetic.wide_heldout_seeds()[:limit]:
            p = synthetic.sample_wide(s).params
            rows.append({"seed": s, "expected": list(synthetic.combo_of(s)),
                         "band": independent.band_of(p["width_px"]), "width_px": p["width_px"],
                         "picture": f"{p['picture'][0]}×{p['picture'][1]}",
                         "style": "outline" if p["outline_px"] else "fill",
                         "jpeg": "jpeg" if p["jpeg_quality"] else "png"})
        return rows
    items = independent.evaluation_set()
    if limit:   # a quick look: spread over the set, so every band shows
        items = items[::max(1, len(items) // limit)][:limit]
    return [{**it.params(), "expected": list(it.combo), "picture": it.picture_label,
             "jpeg": "jpeg" if it.jpeg_quality else "png"} for it in items]


def _tally(kind: str, rows: list[dict]) -> dict:
    """A scored set's tables: the independent drawer's by every key of ``independent.tally``, the wide one's by
    :data:`WIDE_BY`."""
    return independent.tally(rows, by=WIDE_BY) if kind == "wide" else independent.tally(rows)


def _image(kind: str, row: dict):
    if kind == "wide":
        return synthetic.sample_wide(row["seed"]).image
    return synthetic.sample(row["seed"]).image if kind == "heldout" else independent.render(
        independent.item(row["index"]))


def run_transformers(kind: str, rows: list[dict], model, batcher, tok, log, every: int = 1) -> float:
    """Fill every ``every``-th row with transformers' greedy answer and its score; returns the seconds."""
    from train_tiny_vl import greedy

    t0 = time.perf_counter()
    rows = rows[::every]
    for k, r in enumerate(rows):
        ids = greedy(model, batcher, _image(kind, r))
        r["got_ids"] = ids
        r["got"] = tok.decode([t for t in ids if t != IM_END])
        r.update(independent.score(tuple(r["expected"]), r["got"], ids[-1:] == [IM_END]))
        r["expected_text"] = synthetic.answer_for(*r["expected"])
        r["answered_by"] = "transformers"
        if (k + 1) % 20 == 0:
            log(f"transformers {kind} {k + 1}/{len(rows)}: {sum(x['exact'] for x in rows[:k + 1])} exact")
    return round(time.perf_counter() - t0, 1)


def run_engine(quant: str, sets: dict, tok, log, model_dir: Path = MODEL_DIR) -> dict:
    """The engine at one quant on every row of every set: exact answers and agreement with transformers."""
    from tiny_vl_agreement import answer

    from kestrel_lab.engine.vl import open_engine
    from kestrel_lab.vision.preprocess import load_image

    src = "qwen3-tiny-vl" if model_dir.resolve() == MODEL_DIR.resolve() else model_dir
    eng = open_engine(models.vqf(src, quant=quant), max_context=1024)
    out = {}
    for kind, rows in sets.items():
        t0 = time.perf_counter()
        agree = exact = 0
        differ = []
        compared = 0
        scored = []
        for k, r in enumerate(rows):
            image = load_image(_image(kind, r), vision=eng.config.vision)
            margins = [] if quant == "f32" else None
            ids = answer(eng, tok, image, synthetic.QUESTION, margins)
            text = tok.decode([i for i in ids if i != IM_END])
            sc = independent.score(tuple(r["expected"]), text, ids[-1:] == [IM_END])
            r.setdefault("engine", {})[quant] = {"ids": ids, "got": text, **sc,
                                                 **({"margins": margins} if margins is not None else {})}
            scored.append({**r, **sc})
            exact += sc["exact"]
            if "got_ids" in r:   # transformers answered this one: compare token for token
                compared += 1
                same = ids == r["got_ids"]
                agree += same
                r.setdefault("engine_same", {})[quant] = same
                if not same:
                    differ.append({"id": r.get("seed", r.get("index")), "transformers": r["got"], "engine": text,
                                   **first_difference(r, ids, quant)})
            if (k + 1) % 40 == 0:
                log(f"engine {quant} {kind} {k + 1}/{len(rows)}: {exact} exact, {time.perf_counter() - t0:.0f} s")
        n = len(rows)
        out[kind] = {"n": n, "exact": exact, "accuracy": exact / n, "compared": compared, "agree": agree,
                     "agreement": agree / compared if compared else None,
                     "margin_threshold": MARGIN_THRESHOLD[quant],
                     "near_ties": sum(bool(d["near_tie"]) for d in differ),
                     "tables": None if kind == "heldout" else _tally(kind, scored),
                     "seconds": round(time.perf_counter() - t0, 1), "disagreements": differ}
        log(f"engine {quant} {kind}: {agree}/{compared} same ids, {exact}/{n} exact, {out[kind]['seconds']} s")
    return out


def first_difference(r: dict, ids: list[int], quant: str) -> dict:
    """Where the engine's ids first leave transformers' and how close that step was: the reference's top-2
    margin there (its chosen logit minus the runner-up). The reference margins are the F32 engine's, taken
    only where its ids equal transformers' on this item (its logits then follow transformers' to float
    rounding). A difference at a margin ≤ ``golden.MARGIN_THRESHOLD[quant]`` is a near-tie that a quantised
    weight may flip, as in the golden files; one above it is not explained by quantisation noise."""
    want = r["got_ids"]
    step = next((i for i, (a, b) in enumerate(zip(ids, want)) if a != b), min(len(ids), len(want)))
    ref = r.get("engine", {}).get("f32", {})
    margin = None
    if quant != "f32" and ref.get("ids") == want and step < len(ref.get("margins", [])):
        margin = ref["margins"][step]
    return {"step": step, "margin": margin,
            "near_tie": margin is not None and margin <= MARGIN_THRESHOLD[quant]}


def pct(x) -> str:
    return "—" if x is None else f"{100 * x:.1f} %"


def _share_table(title: str, shares: dict) -> list[str]:
    lines = [f"| {title} | items | exact | colour | shape | position |", "|---|---|---|---|---|---|"]
    for k, v in shares.items():
        lines.append(f"| {k} | {v['n']} | {v['exact']} ({pct(v['accuracy'])}) | {pct(v['colour'])} "
                     f"| {pct(v['shape'])} | {pct(v['position'])} |")
    return lines


def readme_section(doc: dict) -> str:
    """The README's section on the held-out sets (between BEGIN and END), every figure from ``doc``."""
    ind, ho, p = doc["independent"], doc["heldout"], doc["provenance"]
    t = ind["tables"]
    by = ", ".join(f"{n} by {who}" for who, n in sorted(ind["answered_by"].items()))
    every = ind["transformers_every"]
    lines = [f"Independent set answered {by}" + ("." if every == 1 else
             f" (transformers on the items whose index is a multiple of {every}; on the others the engine's answer "
             "stands in, and the last table shows how often the two agree where both answered).") + "", ""]
    wide = doc.get("wide")
    rows = {"today's held-out (training drawer, transformers)": ho["transformers"]["overall"]}
    if wide:
        rows["wide training drawer, unseen seeds (transformers)"] = wide["transformers"]["overall"]
    lines += _share_table("set", {**rows, "independent drawer": t["overall"]}) + [""]
    lines += _share_table("independent: size band", t["by"]["band"]) + [""]
    if wide:
        lines += _share_table("wide training drawer, unseen seeds: size band", wide["transformers"]["by"]["band"])
        lines += ["", f"The wide drawer's seeds from {wide['first_seed']:,} on are never trained on; its table "
                  "beside the independent one tells a shape too small for the model to see (low in both) from a "
                  "drawer it has not met (low in the independent set only).", ""]
    lines += _share_table("independent: picture", t["by"]["picture"]) + [""]
    for f in independent.FIELDS:
        lines += [independent.confusion_markdown(t["confusion"][f], f"{f}: drawn \\ answered"), ""]
    eng = ["| VQF | set | items | engine exact | compared with transformers | same ids | differ at a near-tie "
           "| differ beyond it |", "|---|---|---|---|---|---|---|---|"]
    for q, sets in doc["engine"].items():
        for kind, r in sets.items():
            near = r.get("near_ties")
            beyond = None if near is None else r["compared"] - r["agree"] - near
            eng.append(f"| {q.upper()} | {kind} | {r['n']} | {r['exact']} ({pct(r['accuracy'])}) | {r['compared']} "
                       f"| {r['agree']} ({pct(r['agreement'])}) | {'—' if near is None else near} "
                       f"| {'—' if beyond is None else beyond} |")
    lines += eng + ["", "A near-tie: where the engine's ids first leave transformers', the reference's top-2 margin "
                    "(its chosen logit minus the runner-up; the F32 engine's, which gives transformers' ids on that "
                    "item) is at most the golden files' threshold for that quant "
                    f"({', '.join(f'{q.upper()} {t}' for q, t in MARGIN_THRESHOLD.items() if q in doc['engine'])}): "
                    "a quantised weight may flip such a step. A difference beyond it is not quantisation noise.",
                    "", f"Computed by `scripts/eval_tiny_vl.py` at commit {p['commit']} on {p['machine']} "
                    f"({p['seconds']:.0f} s, {p['date']}); every independent item, with the drawer's parameters "
                    "and the answers, is in `independent.json`."]
    return "\n".join(lines)


def rewrite_readme(readme: Path, doc: dict) -> None:
    text = readme.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{readme}: the markers {BEGIN!r} … {END!r} are missing; add them under {HEADING!r}")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    with atomic_write(readme, "w") as fh:
        fh.write(head + BEGIN + "\n" + readme_section(doc) + "\n" + END + tail)


def _from_heldout_json(rows: list[dict], model_dir: Path, tok) -> None:
    """Fill today's held-out rows with transformers' answers recorded in heldout.json (the training
    script's greedy on the same checkpoint), instead of generating them again."""
    path = model_dir / "heldout.json"
    held = {it["seed"]: it for it in json.loads(path.read_text(encoding="utf-8"))["items"]}
    for r in rows:
        if r["seed"] not in held:
            raise SystemExit(f"{path}: no item for held-out seed {r['seed']}; run with --rerun-heldout")
        ids = held[r["seed"]]["got_ids"]
        r["got_ids"], r["got"] = ids, tok.decode([t for t in ids if t != IM_END])
        r.update(independent.score(tuple(r["expected"]), r["got"], ids[-1:] == [IM_END]))
        r["expected_text"] = synthetic.answer_for(*r["expected"])


def _primary(r: dict) -> dict:
    """A row with its reference answer on top: transformers' where it answered, else the engine's (F32 if
    it ran; the engine matches transformers token for token where both answered, see "engine")."""
    if "got_ids" in r or not r.get("engine"):
        return r
    q = "f32" if "f32" in r["engine"] else next(iter(r["engine"]))
    e = r["engine"][q]
    return {**r, "got": e["got"], "got_ids": e["ids"], "answered": e["answered"], "exact": e["exact"],
            "fields": e["fields"], "answered_by": f"engine {q}"}


KEEP = ("index", "colour", "colour_name", "rgb", "shape", "position", "band", "width_px", "picture", "centre",
        "rotation_deg", "background", "background_rgb", "style", "outline_px", "jpeg_quality", "expected_text", "got",
        "got_ids", "answered", "exact", "fields", "answered_by", "engine_same")
WIDE_KEEP = ("seed", "band", "width_px", "picture", "style", "jpeg", "expected_text", "got", "got_ids", "answered",
             "exact", "fields")


def evaluate(model_dir: Path, quants: list[str], limit: int | None, log=print,
             engine_sets: tuple[str, ...] = ("heldout", "independent"), rerun_heldout: bool = False,
             on_progress=None, transformers_every: int = 1) -> dict:
    """Both sets through transformers and the engine; the document independent.json holds.
    ``on_progress(doc)`` is called after transformers and after each quant (a partial document)."""
    import torch
    from train_tiny_vl import Batcher, Prompts
    from transformers import Qwen3VLForConditionalGeneration

    from kestrel_lab.vocab import Tokenizer

    t0 = time.perf_counter()
    tok = Tokenizer.default()
    batcher = Batcher(Prompts(tok))
    model = Qwen3VLForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
    sets = {kind: _rows(kind, limit) for kind in SETS}
    secs = {}
    for kind, rows in sets.items():
        if kind == "heldout" and not rerun_heldout:
            _from_heldout_json(rows, model_dir, tok)
            secs[kind] = None
        else:
            secs[kind] = run_transformers(kind, rows, model, batcher, tok, log,
                                          transformers_every if kind == "independent" else 1)
    fp = machine.fingerprint()
    cpu = fp["clusters"][0]["model"] if fp.get("clusters") else platform.processor()
    engine: dict = {}

    def doc() -> dict:
        views = [_primary(r) for r in sets["independent"]]
        return {
            "what": "qwen3-tiny-vl greedy answers to 「图里有什么？」 on two held-out sets: transformers (F32, the "
                    "reference) and the engine per VQF quant",
            "question": synthetic.QUESTION, "quants": list(engine), "limit": limit, "engine_sets": list(engine_sets),
            "heldout": {"drawer": "kestrel_lab.vision.synthetic.heldout_seeds()",
                        "transformers": independent.tally(sets["heldout"], by=("unseen",)),
                        "transformers_seconds": secs["heldout"],
                        "transformers_from": "generated" if rerun_heldout else "heldout.json (got_ids)"},
            "independent": {"drawer": "kestrel_lab.vision.independent.evaluation_set()",
                            "tables": independent.tally([v for v in views if "answered" in v]),
                            "answered_by": dict(Counter(v.get("answered_by", "nobody") for v in views)),
                            "transformers": independent.tally([r for r in sets["independent"] if "got_ids" in r]),
                            "transformers_every": transformers_every,
                            "transformers_seconds": secs["independent"],
                            "items": [{k: v[k] for k in KEEP if k in v} for v in views]},
            "wide": {"drawer": "kestrel_lab.vision.synthetic.sample_wide on wide_heldout_seeds()",
                     "first_seed": synthetic.WIDE_HELDOUT_SEED_START,
                     "transformers": _tally("wide", sets["wide"]),
                     "transformers_seconds": secs["wide"],
                     "items": [{k: r[k] for k in WIDE_KEEP if k in r} for r in sets["wide"]]},
            "engine": engine,
            "provenance": {"script": "scripts/eval_tiny_vl.py", "commit": machine.git_commit(), "date": utc_now(),
                           "machine": f"{cpu}, {fp['arch']}, {fp['cores']} logical CPUs",
                           "seconds": round(time.perf_counter() - t0, 1), "python": platform.python_version(),
                           "model": _rel(model_dir)},
        }

    if on_progress:
        on_progress(doc())
    for q in quants:
        engine[q] = run_engine(q, {k: v for k, v in sets.items() if k in engine_sets}, tok, log, model_dir)
        if on_progress:
            on_progress(doc())
    return doc()


def _rel(p: Path) -> str:
    return str(p.relative_to(REPO)) if p.is_relative_to(REPO) else str(p)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=MODEL_DIR)
    ap.add_argument("--quants", default="f32,q8_0,q4_0")
    ap.add_argument("--engine-sets", default="heldout,independent",
                    help="the sets the engine runs (transformers always runs all three); today's held-out set is also "
                    "checked by scripts/tiny_vl_agreement.py")
    ap.add_argument("--rerun-heldout", action="store_true",
                    help="generate transformers' answers to today's held-out set again instead of reading heldout.json")
    ap.add_argument("--transformers-every", type=int, default=1,
                    help="transformers answers every N-th independent item only (a slow machine); the engine "
                    "answers all, and stands in where transformers did not run")
    ap.add_argument("--limit", type=int, default=None,
                    help="only N items of each set (a quick look: nothing is written)")
    a = ap.parse_args(argv)
    quants = [q.strip() for q in a.quants.split(",") if q.strip()]
    quants.sort(key=lambda q: q != "f32")   # F32 first: its margins explain the other quants' differences
    sets = tuple(k.strip() for k in a.engine_sets.split(",") if k.strip())
    bad = [k for k in sets if k not in SETS]
    if bad:
        raise SystemExit(f"--engine-sets: unknown set(s) {bad}; the sets are {', '.join(SETS)}")
    model = a.model.resolve()

    def save(doc: dict) -> None:   # after transformers and after each quant: a cut run keeps what it did
        if not a.limit:
            write_json(model / OUT_NAME, doc)

    doc = evaluate(model, quants, a.limit, log=lambda m: print(m, file=sys.stderr, flush=True),
                   engine_sets=sets, rerun_heldout=a.rerun_heldout, on_progress=save,
                   transformers_every=a.transformers_every)
    print(readme_section(doc))
    if a.limit:
        print("(--limit: nothing written)", file=sys.stderr)
        return 0
    save(doc)
    if (model / "README.md").is_file():
        rewrite_readme(model / "README.md", doc)
    print(f"wrote {model / OUT_NAME} and the README section", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
