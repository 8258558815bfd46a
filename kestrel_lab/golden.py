"""Golden files: the token ids a model must produce, per quantization, committed and checked by tests.

A golden file records, for a few prompts, the greedy continuation the engine produced when the file
was made, and at every step the **top-2 margin** (logit of the chosen token minus the runner-up). It
guards kernel rewrites: after any change, ``check`` replays each continuation with teacher forcing
(the golden token is fed back, so one disagreement cannot cascade) and compares the engine's argmax
with the golden id at every step.

When does a golden file lie? Quantized dot products are integer sums scaled in float32; another
kernel path (row-interleaved vs plain, VNNI vs portable, ARM vs x86) rounds the last bits of those
scalings differently, so where the top two logits are nearly tied the argmax may flip without any
bug. A mismatch therefore counts only where the golden margin exceeds ``MARGIN_THRESHOLD`` for that
quantization; F32 goldens are exact (threshold 0: every step must agree). The threshold is stated,
not tuned: it is a multiple of the largest logit difference measured between two kernel paths of the
engine on the same file (``kernel_path_spread``).

A model with a vision tower (``qwen3-tiny-vl``) keeps, per case, the seed of a synthetic picture
instead of a text prompt: the replay redraws the picture (``vision.synthetic.draw``), preprocesses it
(``vision.preprocess.load_image``), builds the chat prompt around it (``vision.prompt.encode_vl_chat``)
and checks those ids against the golden ``prompt_ids`` before it replays the continuation through
``prefill_vl`` — so a change in drawing, resizing or the template fails the check too, not only a
kernel. Its continuations end at ``<|im_end|>`` (or ``<|endoftext|>``).

Golden files change only through ``kestrel-lab golden update``, which prints what changed.
Taught in day25_3.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kestrel_lab.atomic import write_json
from kestrel_lab.engine.generate import ENDOFTEXT, IM_END
from kestrel_lab.paths import data_dir

SCHEMA = "kestrel-lab/golden/1"
QUANTS = ("f32", "f16", "q8_0", "q4_0")
MAX_NEW = 32
EOT = ENDOFTEXT  # the poem model ends every poem with <|endoftext|>
VL_STOP = (IM_END, ENDOFTEXT)  # a VL answer ends its chat message
# A mismatch counts only where the golden top-2 margin exceeds this (logits). F32 is exact. For the
# others: 0.5, about 2.5× the largest logit difference measured between the engine's two Q4_0 kernel
# paths on the poem model's golden prompts (row-interleaved vs plain: 0.19 on the course's x86 machine,
# ``kernel_path_spread``). That spread is not a bug: a last-bit difference in a float sum moves an
# activation across a rounding boundary of its Q8_0 quantization, and the flipped int8 travels through
# the later layers. The poem model's margins are mostly above 5, so the threshold hides little.
MARGIN_THRESHOLD = {"f32": 0.0, "f16": 0.5, "q8_0": 0.5, "q4_0": 0.5}


def golden_dir() -> Path:
    return data_dir() / "golden"


def golden_path(model: str) -> Path:
    return golden_dir() / f"{model}.json"


def model_vqf(model: str, quant: str) -> Path:
    """The VQF of an embedded model at ``quant`` (``models.vqf``: converted once, cached by content)."""
    from kestrel_lab import models

    return models.vqf(model if model in models.TRAINED else data_dir() / "models" / model, quant=quant)


def _greedy_doc(model: str) -> dict:
    return json.loads((data_dir() / "models" / model / "greedy.json").read_text(encoding="utf-8"))


def is_vl(model: str) -> bool:
    """Whether the embedded model's greedy.json holds pictures (seeds) rather than text prompts."""
    cases = _greedy_doc(model)["cases"]
    return bool(cases) and "seed" in cases[0]


def default_prompts(model: str) -> list[dict]:
    """The prompts of a model's golden file: the model's greedy.json cases (id lists; for a VL model
    also the picture's seed and the expected sentence)."""
    cases = _greedy_doc(model)["cases"]
    if cases and "seed" in cases[0]:
        return [{"prompt": f"seed {c['seed']}: {c['expected']}", "seed": int(c["seed"]), "expected": c["expected"],
                 "prompt_ids": list(c["prompt_ids"])} for c in cases]
    return [{"prompt": c["prompt"], "prompt_ids": list(c["prompt_ids"])} for c in cases]


def _limits(model: str) -> tuple[int, tuple[int, ...]]:
    """(max new tokens, stop ids) of a model's golden continuations."""
    if is_vl(model):
        g = _greedy_doc(model)
        return int(g.get("max_new_tokens", 24)), tuple(g.get("eos_token_ids", VL_STOP))
    return MAX_NEW, (EOT,)


def vl_prompt(engine, case: dict):
    """Redraw and preprocess the case's picture and build its prompt: (ids, image). Raises ValueError
    where the ids differ from the golden ``prompt_ids`` (drawing, resizing or the template changed)."""
    from kestrel_lab.vision import prompt as VP
    from kestrel_lab.vision import synthetic
    from kestrel_lab.vision.preprocess import load_image
    from kestrel_lab.vocab import Tokenizer

    picture, _ = synthetic.draw(case["seed"])
    image = load_image(picture, vision=engine.config.vision)
    msg = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": synthetic.QUESTION}]}]
    ids = [int(i) for i in VP.encode_vl_chat(Tokenizer.default(), msg, [image.grid_thw])]
    want = list(case["prompt_ids"])
    if ids != want:
        at = next((k for k, (a, b) in enumerate(zip(ids, want)) if a != b), min(len(ids), len(want)))
        raise ValueError(f"golden case seed {case['seed']}: the prompt built from the redrawn picture differs from "
                         f"the golden prompt_ids at position {at} ({len(ids)} vs {len(want)} ids)")
    return ids, image


def _prefill(engine, case: dict) -> np.ndarray:
    """Reset the engine and prefill the case's prompt (a picture's prompt through ``prefill_vl``)."""
    engine.reset()
    if "seed" in case:
        ids, image = vl_prompt(engine, case)
        return engine.prefill_vl(ids, [image])
    return engine.prefill(case["prompt_ids"])


def top2_margin(logits: np.ndarray) -> tuple[int, float]:
    """(argmax, logit[argmax] − the second-largest logit)."""
    top2 = np.argpartition(logits, -2)[-2:]
    a, b = (top2[1], top2[0]) if logits[top2[1]] >= logits[top2[0]] else (top2[0], top2[1])
    return int(a), float(logits[a] - logits[b])


def greedy_with_margins(engine, prompt_ids, max_new: int = MAX_NEW,
                        stop: tuple[int, ...] = (EOT,)) -> tuple[list[int], list[float]]:
    """The greedy continuation (stopping after a stop id) and the top-2 margin at each step.
    ``prompt_ids``: a list of ids, or a golden case (a VL case is prefilled with its picture)."""
    logits = _prefill(engine, prompt_ids if isinstance(prompt_ids, dict) else {"prompt_ids": prompt_ids})
    ids, margins = [], []
    while True:
        tok, margin = top2_margin(logits)
        ids.append(tok)
        margins.append(round(margin, 6))
        if tok in stop or len(ids) == max_new:
            return ids, margins
        logits = engine.decode(tok)


@dataclass
class Mismatch:
    case: int
    step: int
    golden_id: int
    got_id: int
    golden_margin: float
    counted: bool  # False where the golden margin is within the threshold (a near-tie may flip)


@dataclass
class QuantResult:
    quant: str
    steps: int = 0
    threshold: float = 0.0
    mismatches: list[Mismatch] = field(default_factory=list)

    @property
    def failures(self) -> list[Mismatch]:
        return [m for m in self.mismatches if m.counted]

    @property
    def ok(self) -> bool:
        return not self.failures


def replay(engine, case: dict, golden: dict, threshold: float, index: int = 0) -> tuple[int, list[Mismatch]]:
    """Teacher-forced replay of one golden continuation; return (steps, mismatches)."""
    logits = _prefill(engine, case)
    out = []
    ids, margins = golden["ids"], golden["margins"]
    for step, (want, margin) in enumerate(zip(ids, margins)):
        got = int(np.argmax(logits))
        if got != want:
            out.append(Mismatch(index, step, want, got, margin, counted=margin > threshold))
        if step + 1 < len(ids):
            logits = engine.decode(want)
    return len(ids), out


def check(model: str = "qwen3-tiny-poem", quants=None, *, path: Path | None = None,
          open_engine=None) -> list[QuantResult]:
    """Replay every case of the model's golden file at each quantization; one result per quant."""
    doc = load(path or golden_path(model))
    results = []
    for quant in quants or doc["quants"]:
        engine = open_engine(quant) if open_engine else _open(model, quant)
        res = QuantResult(quant, threshold=doc["margin_threshold"][quant])
        for i, case in enumerate(doc["cases"]):
            n, mism = replay(engine, case, case["golden"][quant], res.threshold, i)
            res.steps += n
            res.mismatches += mism
        results.append(res)
    return results


def _open(model: str, quant: str, **kw):
    if is_vl(model):
        from kestrel_lab.engine.vl import open_engine

        return open_engine(model_vqf(model, quant), max_context=256, **kw)
    from kestrel_lab.engine import Qwen3Engine

    return Qwen3Engine.from_vqf(model_vqf(model, quant), max_context=256, **kw)


def make(model: str = "qwen3-tiny-poem", quants=QUANTS, *, open_engine=None) -> dict:
    """A fresh golden document for ``model`` (not written: ``update`` writes it)."""
    from kestrel_lab.measure import provenance

    cases = default_prompts(model)
    max_new, stop = _limits(model)
    for case in cases:
        case["golden"] = {}
    for quant in quants:
        engine = open_engine(quant) if open_engine else _open(model, quant)
        for case in cases:
            ids, margins = greedy_with_margins(engine, case, max_new, stop)
            case["golden"][quant] = {"ids": ids, "margins": margins}
    prov = provenance("golden")
    return {"schema": SCHEMA, "model": model, "quants": list(quants), "max_new": max_new,
            **({"stop_ids": list(stop), "pictures": "vision.synthetic.draw(seed), preprocessed by "
                "vision.preprocess.load_image; the prompt ids are checked before each replay"}
               if is_vl(model) else {}),
            "margin_threshold": {q: MARGIN_THRESHOLD[q] for q in quants},
            "made_with": {k: prov[k] for k in ("date",) if k in prov} | {
                "git_commit": (prov.get("machine") or {}).get("git_commit"),
                "cpu": ((prov.get("machine") or {}).get("clusters") or [{}])[0].get("model"),
                "arch": (prov.get("machine") or {}).get("arch")},
            "cases": cases}


def load(path: Path) -> dict:
    doc = json.loads(Path(path).read_text(encoding="utf-8"))
    if doc.get("schema") != SCHEMA:
        raise ValueError(f"{path}: field 'schema' is {doc.get('schema')!r}, expected {SCHEMA!r}")
    for i, case in enumerate(doc["cases"]):
        for q in doc["quants"]:
            g = case.get("golden", {}).get(q)
            if not g or len(g["ids"]) != len(g["margins"]):
                raise ValueError(f"{path}: cases[{i}].golden.{q} is missing or its ids and margins differ in length")
    return doc


def diff(old: dict | None, new: dict) -> list[str]:
    """Human-readable lines: which case and quantization changed, and from which step."""
    if old is None:
        return [f"new golden file: {len(new['cases'])} cases × {len(new['quants'])} quantizations"]
    lines = []
    for i, case in enumerate(new["cases"]):
        before = old["cases"][i]["golden"] if i < len(old["cases"]) else {}
        for q in new["quants"]:
            a, b = before.get(q, {}).get("ids"), case["golden"][q]["ids"]
            if a != b:
                step = next((k for k, (x, y) in enumerate(zip(a or [], b)) if x != y), min(len(a or []), len(b)))
                lines.append(f"case {i} ({case['prompt']!r}) {q}: ids change from step {step}")
    return lines or ["no token id changed (margins may differ in the last digits)"]


def update(model: str = "qwen3-tiny-poem", quants=QUANTS, *, path: Path | None = None, open_engine=None) -> list[str]:
    """Regenerate the golden file (atomically) and return the diff against the old one."""
    path = path or golden_path(model)
    old = load(path) if path.exists() else None
    new = make(model, quants, open_engine=open_engine)
    if old is not None:  # regenerating some quantizations keeps the others as they were
        kept = [q for q in old["quants"] if q not in quants]
        if kept and [c["prompt_ids"] for c in old["cases"]] == [c["prompt_ids"] for c in new["cases"]]:
            for case, before in zip(new["cases"], old["cases"]):
                case["golden"].update({q: before["golden"][q] for q in kept})
            new["quants"] = [q for q in QUANTS if q in set(quants) | set(kept)]
            new["margin_threshold"] = {q: MARGIN_THRESHOLD[q] for q in new["quants"]}
    write_json(path, new)
    return diff(old, new)


def kernel_path_spread(model: str = "qwen3-tiny-poem", quant: str = "q4_0") -> float:
    """Largest |logit difference| between the engine's row-interleaved and plain Q4_0 kernels, over
    the golden prompts' prefill and greedy steps: the size of a legitimate last-bits difference."""
    a, b = _open(model, quant), _open(model, quant, interleave=False)
    max_new, stop = _limits(model)
    spread = 0.0
    for case in default_prompts(model):
        la, lb = _prefill(a, case), _prefill(b, case)
        for _ in range(max_new):
            spread = max(spread, float(np.max(np.abs(la - lb))))
            tok = int(np.argmax(la))
            if tok in stop:
                break
            la, lb = a.decode(tok), b.decode(tok)
    return spread
