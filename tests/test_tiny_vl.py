"""The engine on the trained tiny Qwen3-VL (data/models/qwen3-tiny-vl) against transformers' own answers.

greedy.json holds ten held-out pictures with the prompt ids and the greedy continuation that
transformers' ``generate`` produced on this checkpoint (loaded in float32). The engine, on the F32 VQF
converted from the same safetensors, must build the same prompt ids from the picture and reproduce the
continuation token for token; ``kestrel-lab generate --image`` on a PNG of one picture must print the
sentence. A wrong patch order, position table, MRoPE index or DeepStack slot changes the sentence."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from kestrel_lab import models
from kestrel_lab.engine.vl import open_engine
from kestrel_lab.paths import REPO_ROOT
from kestrel_lab.vision import prompt as VP
from kestrel_lab.vision import synthetic
from kestrel_lab.vision.preprocess import load_image
from kestrel_lab.vocab import Tokenizer

MODEL_DIR = REPO_ROOT / "data" / "models" / "qwen3-tiny-vl"
GREEDY = json.loads((MODEL_DIR / "greedy.json").read_text(encoding="utf-8"))
CASES = GREEDY["cases"]


@pytest.fixture(scope="module")
def engine():
    return open_engine(models.vqf("qwen3-tiny-vl", quant="f32"), max_context=256)


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.default()


def prompt_ids(tok, image) -> list[int]:
    msg = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": GREEDY["question"]}]}]
    return [int(i) for i in VP.encode_vl_chat(tok, msg, [image.grid_thw])]


def greedy(eng, ids, image, n: int, eos) -> list[int]:
    eng.reset()
    logits = eng.prefill_vl(ids, [image])
    out = []
    for _ in range(n):
        nxt = int(np.argmax(logits))
        out.append(nxt)
        if nxt in eos:
            break
        logits = eng.decode(nxt)
    return out


def test_greedy_json_is_what_it_claims():
    assert len(CASES) == 10 and GREEDY["image"]["grid_thw"] == [1, 16, 16]
    for c in CASES:
        assert synthetic.draw(c["seed"])[1] == c["expected"]
        assert c["greedy_ids"][-1] in GREEDY["eos_token_ids"]


@pytest.mark.parametrize("case", CASES, ids=[str(c["seed"]) for c in CASES])
def test_engine_reproduces_transformers_greedy(engine, tok, case):
    picture, _ = synthetic.draw(case["seed"])
    image = load_image(picture, vision=engine.config.vision)
    assert list(image.grid_thw) == GREEDY["image"]["grid_thw"]
    ids = prompt_ids(tok, image)
    assert ids == case["prompt_ids"]
    got = greedy(engine, ids, image, GREEDY["max_new_tokens"], set(GREEDY["eos_token_ids"]))
    assert got == case["greedy_ids"], (tok.decode(got), case["greedy_text"])
    assert tok.decode(got) == case["greedy_text"]


def test_generate_cli_says_the_sentence(tmp_path):
    case = next(c for c in CASES if c["greedy_text"] == c["expected"] + "<|im_end|>")
    png = tmp_path / f"seed{case['seed']}.png"
    synthetic.draw(case["seed"])[0].save(png)
    vqf = models.vqf("qwen3-tiny-vl", quant="f32")
    r = subprocess.run([sys.executable, "-m", "kestrel_lab", "generate", str(vqf), "--image", str(png),
                        "--prompt", "图里有什么？", "--max-new", "24"],
                       capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == case["expected"], (r.stdout, r.stderr[-2000:])


def test_engine_agreement_json_matches_heldout_and_readme():
    """engine_agreement.json (scripts/tiny_vl_agreement.py) describes heldout.json's items, the F32 engine
    agrees with transformers on every one, and the README's section shows the same counts."""
    held = json.loads((MODEL_DIR / "heldout.json").read_text(encoding="utf-8"))
    doc = json.loads((MODEL_DIR / "engine_agreement.json").read_text(encoding="utf-8"))
    rows = {r["quant"]: r for r in doc["results"]}
    assert set(rows) == {"f32", "q8_0", "q4_0"}
    for r in rows.values():
        assert r["n"] == len(held["items"]) and r["transformers_right"] == held["overall"]["right"]
        assert r["agree"] + len(r["disagreements"]) == r["n"]
    assert rows["f32"]["agree"] == rows["f32"]["n"] and rows["f32"]["right"] == held["overall"]["right"]
    readme = (MODEL_DIR / "README.md").read_text(encoding="utf-8")
    section = readme.split("<!-- engine-agreement:begin", 1)[1].split("<!-- engine-agreement:end -->", 1)[0]
    for q, r in rows.items():
        assert f"| {q.upper()} | {r['n']} | {r['agree']} | {100 * r['agreement']:.1f} % | {r['right']} |" in section
