"""How closely the numba engine follows transformers on qwen3-tiny-vl's 248 held-out pictures.

For every item of data/models/qwen3-tiny-vl/heldout.json (written by scripts/train_tiny_vl.py: the
picture's seed, the expected sentence and transformers' greedy ids on the checkpoint loaded in float32)
the engine draws the same picture, preprocesses it, builds the prompt and decodes greedily on the VQF
converted at F32, Q8_0 and Q4_0 (vision matrices stay Q8_0 in the quantised files). Per quant:

- agreement: the share of items whose continuation equals transformers' token for token;
- accuracy: the share answered exactly right (sentence + ``<|im_end|>``), to set beside transformers' own.

Writes engine_agreement.json (atomically, with commit, machine and seconds) beside heldout.json,
rewrites the README's table between its two markers and prints the table.

    nice -n 10 python scripts/tiny_vl_agreement.py [--quants f32,q8_0,q4_0] [--limit N]
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time

import numpy as np

from kestrel_lab import machine, models
from kestrel_lab.atomic import atomic_write, write_json
from kestrel_lab.engine.vl import open_engine
from kestrel_lab.golden import top2_margin
from kestrel_lab.measure import utc_now
from kestrel_lab.paths import REPO_ROOT
from kestrel_lab.vision import prompt as VP
from kestrel_lab.vision import synthetic
from kestrel_lab.vision.preprocess import load_image
from kestrel_lab.vocab import Tokenizer

MODEL_DIR = REPO_ROOT / "data" / "models" / "qwen3-tiny-vl"
OUT = MODEL_DIR / "engine_agreement.json"
README = MODEL_DIR / "README.md"
BEGIN = "<!-- engine-agreement:begin (written by scripts/tiny_vl_agreement.py) -->"
END = "<!-- engine-agreement:end -->"
IM_END = 151645
MAX_NEW = 24


def answer(eng, tok, image, question: str, margins: list | None = None) -> list[int]:
    """The engine's greedy ids for one picture (stops after <|im_end|> or <|endoftext|>); with ``margins`` (a
    list), each step's top-2 margin (chosen logit minus the runner-up, ``golden.top2_margin``) is appended."""
    msg = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]
    ids = VP.encode_vl_chat(tok, msg, [image.grid_thw])
    eng.reset()
    logits = eng.prefill_vl(ids, [image])
    out = []
    for _ in range(MAX_NEW):
        nxt = int(np.argmax(logits))
        if margins is not None:
            margins.append(round(top2_margin(logits)[1], 4))
        out.append(nxt)
        if nxt in (IM_END, 151643):
            break
        logits = eng.decode(nxt)
    return out


def run_quant(quant: str, items: list[dict], question: str, tok) -> dict:
    eng = open_engine(models.vqf("qwen3-tiny-vl", quant=quant), max_context=256)
    t0 = time.perf_counter()
    agree = right = hf_right = 0
    disagreements = []
    for it in items:
        image = load_image(synthetic.draw(it["seed"])[0], vision=eng.config.vision)
        got = answer(eng, tok, image, question)
        text = tok.decode([i for i in got if i != IM_END])
        ok = got[-1:] == [IM_END] and text == it["expected"]
        same = got == it["got_ids"]
        agree += same
        right += ok
        hf_right += bool(it["ok"])
        if not same:
            disagreements.append({"seed": it["seed"], "expected": it["expected"], "transformers": it["got"],
                                  "engine": text})
    n = len(items)
    return {"quant": quant, "n": n, "agree": agree, "agreement": agree / n, "right": right,
            "accuracy": right / n, "transformers_right": hf_right, "transformers_accuracy": hf_right / n,
            "seconds": round(time.perf_counter() - t0, 1), "disagreements": disagreements}


def table(rows: list[dict]) -> str:
    lines = ["| VQF | items | same ids as transformers | agreement | engine right | engine accuracy "
             "| transformers accuracy |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['quant'].upper()} | {r['n']} | {r['agree']} | {100 * r['agreement']:.1f} % "
                     f"| {r['right']} | {100 * r['accuracy']:.1f} % | {100 * r['transformers_accuracy']:.1f} % |")
    return "\n".join(lines)


def rewrite_readme(doc: dict) -> None:
    text = README.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{README}: the markers {BEGIN!r} … {END!r} are missing; add them to the section "
                         "'## The engine on the same pictures'")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    p = doc["provenance"]
    body = [table(doc["results"]), "",
            f"Computed by `scripts/tiny_vl_agreement.py` at commit {p['commit']} on {p['machine']} "
            f"({p['seconds']:.0f} s for all quants, {p['date']}); the full result, with every item that "
            "differs, is in `engine_agreement.json`."]
    for r in doc["results"]:
        if r["disagreements"]:
            ex = "; ".join(f"seed {d['seed']} transformers 「{d['transformers']}」 engine 「{d['engine']}」"
                           for d in r["disagreements"][:4])
            body.append(f"\n{r['quant'].upper()}: {len(r['disagreements'])} items differ from transformers, "
                        f"e.g. {ex}.")
    with atomic_write(README, "w") as fh:
        fh.write(head + BEGIN + "\n" + "\n".join(body) + "\n" + END + tail)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quants", default="f32,q8_0,q4_0")
    ap.add_argument("--limit", type=int, default=None, help="only the first N items (a quick look; "
                    "the JSON and README are then not written)")
    a = ap.parse_args(argv)
    held = json.loads((MODEL_DIR / "heldout.json").read_text(encoding="utf-8"))
    items = held["items"][:a.limit] if a.limit else held["items"]
    tok = Tokenizer.default()
    t0 = time.perf_counter()
    rows = []
    for q in a.quants.split(","):
        rows.append(run_quant(q.strip(), items, held["question"], tok))
        r = rows[-1]
        print(f"{r['quant']}: {r['agree']}/{r['n']} same ids, {r['right']} right, {r['seconds']} s",
              file=sys.stderr)
    fp = machine.fingerprint()
    cpu = fp["clusters"][0]["model"] if fp.get("clusters") else platform.processor()
    doc = {"what": "engine greedy answers on heldout.json vs transformers' (got_ids)",
           "question": held["question"], "max_new_tokens": MAX_NEW, "results": rows,
           "provenance": {"script": "scripts/tiny_vl_agreement.py", "commit": machine.git_commit(),
                          "date": utc_now(), "machine": f"{cpu}, {fp['arch']}, {fp['cores']} logical CPUs",
                          "seconds": round(time.perf_counter() - t0, 1), "python": platform.python_version()}}
    print(table(rows))
    if a.limit:
        print("(--limit: nothing written)", file=sys.stderr)
        return 0
    write_json(OUT, doc)
    rewrite_readme(doc)
    print(f"wrote {OUT.relative_to(REPO_ROOT)} and the README section", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
