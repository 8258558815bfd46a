"""The trained qwen3-tiny-poem model: the engine reproduces its five greedy continuations (greedy.json,
checked with transformers in float32 when the model was made) from F32, F16 and Q8_0 files; at Q4_0
the test reports which continuations survive quantization and where the first divergence is."""
from __future__ import annotations

import json

import numpy as np
import pytest

from kestrel_lab.convert import convert
from kestrel_lab.engine import Qwen3Engine
from kestrel_lab.paths import tiny_poem_dir

EOT = 151643
CASES = json.loads((tiny_poem_dir() / "greedy.json").read_text(encoding="utf-8"))["cases"]
# Observed (deterministic: integer dots, fixed quantizer): every continuation survives Q4_0 token for
# token. If a kernel or the quantizer changes this, the test says which case and where.
Q4_0_SURVIVORS = {0, 1, 2, 3, 4}


@pytest.fixture(scope="module")
def poem_vqf(tmp_path_factory):
    d = tmp_path_factory.mktemp("poem")
    out = {}
    for q in ("f32", "f16", "q8_0", "q4_0"):
        out[q] = d / f"qwen3-tiny-poem-{q}.vqf"
        convert(tiny_poem_dir(), out[q], quant=q, hash_source=False)
    return out


def greedy(eng: Qwen3Engine, prompt_ids: list[int], n: int) -> list[int]:
    eng.reset()
    logits = eng.prefill(prompt_ids)
    out: list[int] = []
    while True:
        tok = int(np.argmax(logits))
        out.append(tok)
        if tok == EOT or len(out) == n:
            return out
        logits = eng.decode(tok)


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@pytest.mark.parametrize("quant", ["f32", "f16", "q8_0"])
def test_greedy_continuations_reproduced(poem_vqf, quant):
    eng = Qwen3Engine.from_vqf(poem_vqf[quant], max_context=256)
    for i, case in enumerate(CASES):
        got = greedy(eng, case["prompt_ids"], len(case["greedy_ids"]))
        assert got == case["greedy_ids"], (f"{quant} case {i} ({case['prompt']!r}): first divergence at "
                                           f"token {first_divergence(got, case['greedy_ids'])}")


def test_q4_0_survivors_reported(poem_vqf):
    eng = Qwen3Engine.from_vqf(poem_vqf["q4_0"], max_context=256)
    survivors, report = set(), []
    for i, case in enumerate(CASES):
        got = greedy(eng, case["prompt_ids"], len(case["greedy_ids"]))
        div = first_divergence(got, case["greedy_ids"])
        if div is None:
            survivors.add(i)
        report.append(f"case {i} {case['prompt']!r}: {'survives' if div is None else f'diverges at token {div}'}"
                      f" ({len(case['greedy_ids'])} tokens)")
    print("\nQ4_0 greedy continuations of qwen3-tiny-poem:\n  " + "\n  ".join(report))
    assert survivors == Q4_0_SURVIVORS, "\n".join(report)
