"""Where the workbook keeps its data, its caches and its measurements.

The repository's ``data/`` holds what is committed (configs, the trained tiny model, the article's
figures, board re-runs). Everything generated (tokenizer.json, random models, numba's cache) goes
to a cache folder outside the repository so that a clean clone stays clean.
"""
from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def data_dir() -> Path:
    """The committed data folder (``KESTREL_DATA_DIR`` overrides it)."""
    return Path(os.environ.get("KESTREL_DATA_DIR", REPO_ROOT / "data"))


def cache_dir() -> Path:
    """Generated artefacts: ``KESTREL_CACHE_DIR``, else ``$XDG_CACHE_HOME/kestrel_lab``."""
    env = os.environ.get("KESTREL_CACHE_DIR")
    if env:
        path = Path(env)
    else:
        base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
        path = Path(base) / "kestrel_lab"
    path.mkdir(parents=True, exist_ok=True)
    return path


def measurements_dir() -> Path:
    return data_dir() / "measurements"


def configs_dir() -> Path:
    return data_dir() / "configs"


def tiny_poem_dir() -> Path:
    """The trained 42 M-parameter Qwen3 that recites Tang poems (data/models/qwen3-tiny-poem)."""
    return data_dir() / "models" / "qwen3-tiny-poem"


def child_env(**extra: str) -> dict:
    """The environment for a child ``python -m kestrel_lab…`` process: this one's, with the folder that
    holds this ``kestrel_lab`` first on ``PYTHONPATH`` (so the child runs the same checkout, installed or
    not), plus ``extra``."""
    env = dict(os.environ, **extra)
    root = str(REPO_ROOT)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env
