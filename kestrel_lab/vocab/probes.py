"""The 15 probe texts of article 18-2 (``tokprobe``) and the broken-branch experiment.

``data/vocab_probes.json`` holds each probe's text, what it exercises, and its reference ids (HF
``tokenizers`` on the embedded Qwen3 tokenizer.json, which our BPE reproduces). ``broken_branch_table``
recompiles vocab.bin with one branch of ``decode_token_str`` removed and shows, probe by probe, what
goes wrong on both sides of the engine: encoding (greedy over the broken file) and printing (the
correct ids decoded through the broken file's bytes).

Taught in day18_2.
"""
from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kestrel_lab.paths import data_dir
from kestrel_lab.vocab.compiler import compile_vocab
from kestrel_lab.vocab.greedy import GreedyEncoder
from kestrel_lab.vocab.loader import VocabBin, load_vocab_bin


@dataclass(frozen=True)
class Probe:
    name: str
    text: str
    exercises: str
    ids: tuple[int, ...]


def probes_path() -> Path:
    """data/vocab_probes.json. Taught in day18_2."""
    return data_dir() / "vocab_probes.json"


def load_probes(path: str | Path | None = None) -> list[Probe]:
    """The probe set (15 texts with their reference ids). Taught in day18_2."""
    path = Path(path) if path else probes_path()
    doc = json.loads(path.read_text(encoding="utf-8"))
    out = []
    for i, p in enumerate(doc.get("probes") or []):
        try:
            out.append(Probe(p["name"], p["text"], p["exercises"], tuple(int(x) for x in p["ids"])))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{path}: field 'probes[{i}]': {e!r}") from None
    return out


def _engine_decode(vocab: VocabBin, ids) -> bytes:
    """What the engine prints: each id's stored bytes, with its Ġ/Ċ marks turned back into bytes."""
    from kestrel_lab.vocab.bytelevel import engine_unmap

    return engine_unmap(b"".join(vocab.token(int(i)) for i in ids if 0 <= int(i) < vocab.n))


@dataclass
class ProbeRow:
    probe: str
    good_ids: int
    broken_ids: int
    first_diff: int | None
    unmatched_bytes: int
    encoded_ok: bool
    printed: str
    printed_ok: bool

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def probe_rows(good: VocabBin, broken: VocabBin, probes: list[Probe] | None = None) -> list[ProbeRow]:
    """Compare the engine on ``good`` and ``broken`` vocab.bin files, probe by probe.

    Both sides use the engine's literal greedy (every entry, specials included, matched against the
    mapped text bytes). Taught in day18_2.
    """
    probes = probes if probes is not None else load_probes()
    enc_good = GreedyEncoder(good, mode="engine")
    enc_bad = GreedyEncoder(broken, mode="engine")
    rows = []
    for p in probes:
        data = p.text.encode("utf-8")
        a = enc_good.encode_array(data).tolist()
        b = enc_bad.encode_array(data, on_missing="skip").tolist()
        diff = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if diff is None and len(a) != len(b):
            diff = min(len(a), len(b))
        printed = _engine_decode(broken, p.ids)
        rows.append(ProbeRow(p.name, len(a), len(b), diff, b.count(-1), a == b,
                             printed.decode("utf-8", errors="replace"), printed == _engine_decode(good, p.ids)))
    return rows


def broken_branch_table(drop_branch: str, tokenizer_json=None, good_vocab_bin=None,
                        probes: list[Probe] | None = None) -> list[ProbeRow]:
    """Recompile with ``drop_branch`` removed (in a temp folder) and compare it with the good file."""
    from kestrel_lab.vocab.tokenizer import default_vocab_bin

    good = load_vocab_bin(good_vocab_bin or default_vocab_bin(tokenizer_json))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"vocab-no-{drop_branch}.bin"
        compile_vocab(tokenizer_json, path, drop_branch=drop_branch)
        broken = load_vocab_bin(path)
    return probe_rows(good, broken, probes)
