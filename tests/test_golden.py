"""Golden files: the committed token ids of the poem model and of the tiny VL model hold at every
quantization, and the replay counts a mismatch only where the golden margin is above the stated
threshold (F32: always). The VL replay redraws each picture and checks the prompt ids first."""
import json
from types import SimpleNamespace

import numpy as np
import pytest

from kestrel_lab import golden
from kestrel_lab.vision import synthetic

MODEL = "qwen3-tiny-poem"
VL = "qwen3-tiny-vl"
MIN_STEPS = {MODEL: 100, VL: 80}


@pytest.mark.parametrize("quant", golden.QUANTS)
@pytest.mark.parametrize("model", [MODEL, VL])
def test_committed_golden_file_holds(model, quant):
    (result,) = golden.check(model, [quant])
    assert result.steps >= MIN_STEPS[model]
    assert result.ok, "\n".join(f"case {m.case} step {m.step}: golden {m.golden_id} (margin "
                                f"{m.golden_margin:.3f}) got {m.got_id}" for m in result.failures)


def test_vl_golden_file_is_the_greedy_json_pictures():
    doc = golden.load(golden.golden_path(VL))
    greedy = json.loads((golden.data_dir() / "models" / VL / "greedy.json").read_text(encoding="utf-8"))
    assert [c["seed"] for c in doc["cases"]] == [c["seed"] for c in greedy["cases"]] and len(doc["cases"]) == 10
    assert doc["quants"] == list(golden.QUANTS) and doc["margin_threshold"]["f32"] == 0.0
    for case, g in zip(doc["cases"], greedy["cases"]):
        assert synthetic.draw(case["seed"])[1] == case["expected"] == g["expected"]
        assert case["prompt_ids"] == g["prompt_ids"]
        # the F32 golden is the engine's own greedy run; transformers' continuation is greedy.json's
        assert case["golden"]["f32"]["ids"] == g["greedy_ids"]
        for q in doc["quants"]:
            assert case["golden"][q]["ids"][-1] in doc["stop_ids"]


def test_vl_replay_checks_the_prompt_ids_of_the_redrawn_picture():
    case = golden.load(golden.golden_path(VL))["cases"][0]
    eng = SimpleNamespace(config=SimpleNamespace(vision=None))  # load_image's defaults: Qwen3-VL's
    ids, image = golden.vl_prompt(eng, case)
    assert ids == case["prompt_ids"] and list(image.grid_thw) == [1, 16, 16]
    bad = dict(case, prompt_ids=case["prompt_ids"][:-3] + [case["prompt_ids"][-1]] * 3)
    with pytest.raises(ValueError, match="differs from the golden prompt_ids at position"):
        golden.vl_prompt(eng, bad)
    with pytest.raises(ValueError, match="differs from the golden prompt_ids"):
        golden.vl_prompt(eng, dict(case, prompt_ids=case["prompt_ids"][:-1]))


class ScriptedEngine:
    """Returns logits that put ``want[step]`` first with the given margin; records what it was fed."""

    def __init__(self, winners, margins, vocab=8):
        self.winners, self.margins, self.vocab = winners, margins, vocab
        self.fed, self.step = [], 0

    def _logits(self):
        z = np.zeros(self.vocab, np.float32)
        z[self.winners[self.step]] = self.margins[self.step]
        return z

    def reset(self):
        self.step, self.fed = 0, []

    def prefill(self, ids):
        return self._logits()

    def decode(self, tok):
        self.fed.append(tok)
        self.step += 1
        return self._logits()


CASE = {"prompt_ids": [1, 2], "golden": None}


def test_replay_feeds_the_golden_ids_and_applies_the_threshold():
    gold = {"ids": [3, 4, 5, 6], "margins": [2.0, 0.1, 2.0, 0.3]}
    eng = ScriptedEngine([3, 7, 1, 6], [1.0, 1.0, 1.0, 1.0])
    steps, mism = golden.replay(eng, CASE, gold, threshold=0.5)
    assert steps == 4 and eng.fed == [3, 4, 5]  # teacher forcing: the golden ids, not the engine's
    assert [(m.step, m.counted) for m in mism] == [(1, False), (2, True)]  # near-tie tolerated, step 2 fails
    _, mism = golden.replay(ScriptedEngine([3, 7, 5, 6], [1] * 4), CASE, gold, threshold=0.0)
    assert [(m.step, m.counted) for m in mism] == [(1, True)]  # F32: every disagreement counts


def test_top2_margin():
    assert golden.top2_margin(np.array([0.0, 3.0, 1.0, 2.5], np.float32)) == (1, 0.5)


def test_update_shows_the_diff_and_keeps_other_quantizations(tmp_path):
    path = tmp_path / "g.json"
    prompts = golden.default_prompts(MODEL)

    def opener(winner):
        return lambda quant: ScriptedEngine([winner] * 64, [3.0] * 64, vocab=200_000)

    assert golden.update(MODEL, ("f32", "q4_0"), path=path, open_engine=opener(5))[0].startswith("new golden file")
    lines = golden.update(MODEL, ("q4_0",), path=path, open_engine=opener(6))
    assert len(lines) == len(prompts) and all("q4_0: ids change from step 0" in line for line in lines)
    doc = json.loads(path.read_text(encoding="utf-8"))
    assert doc["quants"] == ["f32", "q4_0"]
    assert doc["cases"][0]["golden"]["f32"]["ids"][0] == 5 and doc["cases"][0]["golden"]["q4_0"]["ids"][0] == 6
    assert golden.update(MODEL, ("q4_0",), path=path, open_engine=opener(6)) == \
        ["no token id changed (margins may differ in the last digits)"]


def test_a_damaged_golden_file_is_refused(tmp_path):
    doc = json.loads(golden.golden_path(MODEL).read_text(encoding="utf-8"))
    doc["cases"][1]["golden"]["q8_0"]["margins"].pop()
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(ValueError, match=r"cases\[1\]\.golden\.q8_0"):
        golden.load(bad)
