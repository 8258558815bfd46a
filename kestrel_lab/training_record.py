"""The training record (``training.json``) of a trained embedded model, read as the chain of its stages.

A model trained in stages (``scripts/train_tiny_vl.py --init-from …``) keeps the record of the stage before
it under ``init.previous_stage``, so the newest record holds them all. The training script's README writer
and the lesson that tells the story both walk that chain; this is the one place that knows how.
Taught in day21_3.
"""
from __future__ import annotations

import json
import os
from pathlib import Path


def stages(record: dict) -> list[dict]:
    """The stages that made a checkpoint, oldest first; the last is ``record`` itself."""
    chain = [record]
    while (chain[-1].get("init") or {}).get("previous_stage"):
        chain.append(chain[-1]["init"]["previous_stage"])
    return chain[::-1]


def load(model_dir: str | os.PathLike) -> dict:
    """``training.json`` of a model folder; a clear error naming the file when it is missing or not JSON."""
    path = Path(model_dir) / "training.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        msg = f"{path}: no training record (the training script writes one beside the model)"
        raise FileNotFoundError(msg) from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON at line {e.lineno}, column {e.colno} (offset {e.pos}): {e.msg}") from None
