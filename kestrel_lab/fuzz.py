"""Fuzzing the loaders: real small seed files, one call per loader, and what counts as a finding.

A loader is robust when, whatever bytes it is given, it either loads them or raises *its own* error
class (``VQFFormatError``, ``VocabFormatError``, ``SafetensorsError``, ``ConfigError``, ``KeyFileError``)
whose message starts with the file's name — never ``ZeroDivisionError``, ``OverflowError``, ``RecursionError``,
``MemoryError``, a bare ``ValueError``, a hang or a crash. ``targets`` builds one seed per loader
from a real file (a VQF with every kind of entry, the first records of Qwen's vocab.bin, a checkpoint
saved by transformers itself, the Qwen3-VL-2B config.json, Qwen3-30B-A3B's with YaRN, a key file) and says
which bytes are worth mutating
(header and directory, not the weights); ``run`` feeds one mutated input to the loader and classifies
the result. The mutation strategies live with their users: the tests and day27_2 drive Hypothesis,
``scripts/fuzz_atheris.py`` drives atheris (coverage-guided), and day27_2 writes a random mutator in a
few lines of numpy.

A loaded VQF also goes through the engine's constructor (with a small injected "machine memory",
so the memory check is exercised, not the machine) and one prefill: a file that loads must give
finite logits, or the finding is ``nonfinite``.

Taught in day27_2.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

ENGINE_MEMORY = 64 << 20   # the "machine memory" the engine is given when a fuzzed file loads


@dataclass
class Target:
    """One loader under test: its seed bytes, the bytes worth mutating, its error class, how to call it.

    Taught in day27_2."""

    name: str
    seed: bytes
    hot: int                           # mutate bytes [0, hot): header and directory
    error: type                        # the loader's own error class
    load: Callable[[Path], object]     # loads the file at the path (bytes written there by ``run``)
    suffix: str = ".bin"
    note: str = ""


@dataclass
class Outcome:
    """What one input did: ``loaded``, ``refused`` (own error class, file named), or a finding:
    ``crash`` (any other exception), ``unnamed`` (own class, but the message does not start with the
    file) or ``nonfinite`` (loaded, but the engine's logits are not finite). Taught in day27_2."""

    status: str
    error: str = ""
    message: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def finding(self) -> bool:
        return self.status not in ("loaded", "refused")


def _vqf_target(workdir: Path) -> Target:
    from kestrel_lab.vqf import format as F
    from kestrel_lab.vqf import synth
    from kestrel_lab.vqf.reader import open_vqf

    path = synth.write_random(workdir / "seed.vqf", synth.small_vl_config(), seed=1)
    seed = path.read_bytes()
    data_offset = struct.unpack_from("<Q", seed, F.HEADER_FIELD["data_offset"].offset)[0]

    def load(p: Path):
        vf = open_vqf(p, verify=False)       # the default path: no full read of the file
        return _through_engine(vf, p)

    return Target("vqf", seed, data_offset, F.VQFFormatError, load, ".vqf",
                  "small Qwen3-VL (2 text layers, 3 vision blocks, 41 entries), random weights")


def _through_engine(vf, p: Path) -> dict:
    """A file that loads must build an engine (or be refused by it, naming the file); if its checksum
    holds too (only header fields changed), its logits must be finite."""
    from kestrel_lab.engine.model import Qwen3Engine
    from kestrel_lab.vqf.checksum import hash_ranges

    with vf:
        intact = hash_ranges(vf.raw, vf.header["n_tensors"], vf.data_offset, vf.file_len) == vf.checksum
        try:
            eng = Qwen3Engine(vf.config, vf.tensors, max_context=32, source=str(p), keepalive=vf,
                              available_memory=ENGINE_MEMORY, threads=1)
        except ValueError as e:    # the engine's refusals: LimitError, MemoryBudgetError, missing tensors
            if not str(e).startswith(str(p)):
                raise
            return {"engine": f"refused: {type(e).__name__}"}
        logits = eng.prefill([1, 2, 3])
        finite = bool(np.isfinite(logits).all())
        return {"engine": "ran", "intact": intact, "finite": finite or not intact}


def _vocab_target(workdir: Path, records: int = 2000) -> Target:
    from kestrel_lab.vocab import VocabFormatError, default_vocab_bin, load_vocab_bin

    full = default_vocab_bin().read_bytes()
    pos = 4
    for _ in range(records):
        pos += 6 + struct.unpack_from("<H", full, pos + 4)[0]
    seed = struct.pack("<I", records) + full[4:pos]
    return Target("vocab", seed, 4 + 64 * 6, VocabFormatError, lambda p: load_vocab_bin(p),
                  ".bin", f"the first {records:,} records of Qwen3's vocab.bin")


def _safetensors_target(workdir: Path) -> Target:
    from kestrel_lab import models
    from kestrel_lab.safetensors import SafetensorsError, open_safetensors

    folder = models.hf_checkpoint(arch="qwen3", overrides={"vocab_size": 256, "intermediate_size": 128,
                                                                "bos_token_id": 1, "eos_token_id": 2},
                                  saver="transformers")
    seed = (folder / "model.safetensors").read_bytes()
    hot = 8 + int.from_bytes(seed[:8], "little")

    def load(p: Path):
        with open_safetensors(p) as f:
            return {"tensors": len(f.tensors)}

    return Target("safetensors", seed, hot, SafetensorsError, load, ".safetensors",
                  "a tiny Qwen3 checkpoint saved by transformers' save_pretrained")


def _config_target(workdir: Path) -> Target:
    from kestrel_lab.config import ConfigError, ModelConfig
    from kestrel_lab.paths import configs_dir

    seed = (configs_dir() / "qwen3-vl-2b-instruct.config.json").read_bytes()
    return Target("config", seed, len(seed), ConfigError, lambda p: ModelConfig.from_hf(p), ".json",
                  "Qwen3-VL-2B-Instruct's config.json")


def _config_moe_target(workdir: Path) -> Target:
    """Qwen3-30B-A3B's config.json with the YaRN scaling Qwen's model cards give: every MoE and RoPE-scaling
    field of the config table in one seed (a loaded case also goes to transformers: tests/helpers)."""
    from kestrel_lab.config import ConfigError, ModelConfig
    from kestrel_lab.paths import configs_dir

    doc = json.loads((configs_dir() / "qwen3-30b-a3b.config.json").read_text(encoding="utf-8"))
    doc["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    seed = json.dumps(doc, indent=2).encode()
    return Target("config_moe", seed, len(seed), ConfigError, lambda p: {"config": ModelConfig.from_hf(p)}, ".json",
                  "Qwen3-30B-A3B's config.json with rope_scaling yarn ×4 (Qwen3's model card)")


def _key_target(workdir: Path) -> Target:
    """A key file as ``vqf keygen`` writes it (33 bytes, mode 0600); each case is written 0600 too, so the
    bytes are what is tested."""
    import os

    from kestrel_lab.vqf.protect import KeyFileError, read_key_file, write_key_file

    seed = write_key_file(workdir / "seed.key", bytes(range(16)), overwrite=True).read_bytes()

    def load(p: Path):
        os.chmod(p, 0o600)
        return {"key_bytes": len(read_key_file(p))}

    return Target("keyfile", seed, len(seed), KeyFileError, load, ".key", "a 33-byte key file from vqf keygen")


BUILDERS = {"vqf": _vqf_target, "vocab": _vocab_target, "safetensors": _safetensors_target,
            "config": _config_target, "config_moe": _config_moe_target, "keyfile": _key_target}
LESSON_TARGETS = ("vqf", "vocab", "safetensors", "config")


def targets(workdir: str | Path, names=None) -> dict[str, Target]:
    """The loaders under test by name, their seeds written under ``workdir``: by default the four loaders
    of day27 (``vqf``, ``vocab``, ``safetensors``, ``config``); ``config_moe`` and ``keyfile`` on request
    (``make test`` fuzzes all six). Taught in day27_2."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    return {n: BUILDERS[n](workdir) for n in (names or LESSON_TARGETS)}


def run(target: Target, data: bytes, path: str | Path) -> Outcome:
    """Write ``data`` to ``path``, call the loader, classify what happened. Taught in day27_2."""
    path = Path(path)
    path.write_bytes(data)
    try:
        extra = target.load(path)
    except target.error as e:
        if not str(e).startswith(str(path)):
            return Outcome("unnamed", type(e).__name__, str(e))
        return Outcome("refused", type(e).__name__, str(e))
    except Exception as e:  # any other class is the finding
        return Outcome("crash", type(e).__name__, str(e)[:500])
    extra = extra if isinstance(extra, dict) else {}
    if extra.get("finite") is False:
        return Outcome("nonfinite", "", "the engine's logits are not finite", extra)
    return Outcome("loaded", "", "", extra)


def mutate_json_value(doc, path: tuple, value, delete: bool = False):
    """A copy of JSON ``doc`` with the value at ``path`` (keys / list indexes) replaced or deleted."""
    doc = json.loads(json.dumps(doc))
    node = doc
    for k in path[:-1]:
        node = node[k]
    if delete:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return doc


def json_paths(doc, prefix=()) -> list[tuple]:
    """Every path to a value in a JSON document (objects and lists walked)."""
    out = []
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for k, v in items:
        out.append(prefix + (k,))
        out.extend(json_paths(v, prefix + (k,)))
    return out


__all__ = ["Target", "Outcome", "targets", "run", "mutate_json_value", "json_paths", "ENGINE_MEMORY"]
