"""kestrel_lab.training_record: the chain of a staged model's training records."""
from __future__ import annotations

import json

import pytest

from kestrel_lab import training_record
from kestrel_lab.paths import REPO_ROOT

TINY_VL = REPO_ROOT / "data" / "models" / "qwen3-tiny-vl"


def test_stages_walk_previous_stage_oldest_first():
    one = {"steps": 1, "init": {"poem_tensors_copied": 45}}
    two = {"steps": 2, "init": {"previous_stage": one}}
    three = {"steps": 3, "init": {"previous_stage": two}}
    assert [s["steps"] for s in training_record.stages(three)] == [1, 2, 3]
    assert training_record.stages(one) == [one]
    assert training_record.stages({"steps": 5}) == [{"steps": 5}]   # a record without init


def test_the_committed_tiny_vl_record_chains_to_its_first_stage():
    rec = training_record.load(TINY_VL)
    chain = training_record.stages(rec)
    assert len(chain) >= 2 and chain[-1] is rec
    assert "poem_tensors_copied" in chain[0]["init"]          # the first stage started from the poem model
    # seeds run on from stage to stage: no stage trains on a seed an earlier one used
    for a, b in zip(chain, chain[1:]):
        assert b["first_train_seed"] > a["last_train_seed"], (a["command"], b["command"])


def test_load_names_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="training.json"):
        training_record.load(tmp_path)
    (tmp_path / "training.json").write_text('{"steps": 1,\n oops}', encoding="utf-8")
    with pytest.raises(ValueError, match=r"training.json: not JSON at line 2"):
        training_record.load(tmp_path)
    (tmp_path / "training.json").write_text(json.dumps({"steps": 1}), encoding="utf-8")
    assert training_record.load(tmp_path) == {"steps": 1}
