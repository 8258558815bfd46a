"""tokenizer.json → vocab.bin: the engine's vocabulary compiler (article 18-2's build_vocab_bin.py).

Records for ids 0..n-1 come from ``model.vocab`` in id order, each key passed through
``decode_token_str``; then the added tokens (ids n..), as their UTF-8 text, taken from the
tokenizer.json's ``added_tokens`` or copied byte for byte from an older vocab.bin, as the article
does. The compiler is a pure function of its inputs: the same tokenizer.json gives the same file,
which is how the article proves the board's vocab.bin (sha256 ``299e1c15…``) was built from
Qwen3-VL's tokenizer.json.

Taught in day18_2.
"""
from __future__ import annotations

import hashlib
import os
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path

from kestrel_lab import seam
from kestrel_lab.atomic import atomic_write
from kestrel_lab.vocab.bytelevel import decode_token_str
from kestrel_lab.vocab.loader import load_vocab_bin
from kestrel_lab.vocab.tokenizer_json import default_tokenizer_json, read_tokenizer_json

#: The strings whose hits the compiler prints (article 18-2, §3.1), in vocab.bin's byte form.
COVERAGE_STRINGS = ("回答", "你好", "Ġgood", "Ċ")
#: Common characters that must each be one whole entry; a missing one is printed as MISSING.
COMMON_CHARS = ("的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学"
                "对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面"
                "，。！？：；、“”《》（）")


@dataclass
class CompileStats:
    """What one compilation did: the article's four numbers, the file's size and hash, coverage."""

    total: int
    converted: int
    kept: int
    special: int
    special_source: str
    bytes: int
    sha256: str
    seconds: float
    out_path: Path
    drop_branch: str | None = None
    coverage: list[tuple[str, list[int]]] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    def report(self) -> str:
        """The compiler's log, in the article's layout. Taught in day18_2."""
        lines = [f"total entries: {self.total}",
                 f"converted: {self.converted}  kept: {self.kept}  special copied: {self.special}"
                 f"  (from {self.special_source})"]
        if self.drop_branch:
            lines.append(f"WARNING: decode branch {self.drop_branch} dropped (exercise build)")
        lines += ["", "-- common char coverage --"]
        lines += [f"   MISSING {c!r}" for c in self.missing]
        lines.append("   (no MISSING lines above = full coverage)")
        for text, ids in self.coverage:
            lines.append(f"   {text!r}: {len(ids)} hits {ids[:3]}")
        lines += [f"size: {self.bytes:,} bytes", f"sha256: {self.sha256}", f"DONE -> {self.out_path}"]
        return "\n".join(lines)


def _specials_from_bin(path: Path, first_id: int) -> list[tuple[int, bytes]]:
    old = load_vocab_bin(path)
    return [(tid, old.token(tid)) for tid in range(first_id, old.n)]


def compile_vocab(tokenizer_json: str | os.PathLike | None, out_path: str | os.PathLike,
                  specials_from: str | os.PathLike | None = None,
                  drop_branch: str | None = None) -> CompileStats:
    """Compile ``tokenizer_json`` (None: the embedded Qwen3 one) into vocab.bin at ``out_path``.

    ``specials_from``: copy the added tokens (ids ≥ len(model.vocab)) from this older vocab.bin
    instead of taking them from ``added_tokens``; both give the same file for Qwen3.
    ``drop_branch``: disable one branch of ``decode_token_str`` (the article's exercise).
    The file is written atomically. Taught in day18_2.
    """
    t0 = time.perf_counter()
    src = Path(tokenizer_json) if tokenizer_json is not None else default_tokenizer_json()
    spec = read_tokenizer_json(src)
    whole = seam.get("vocab.compile_vocab")       # a student's compiler (``kestrel_lab.seam``): its bytes
    if whole is not None and specials_from is None and drop_branch is None:
        return _write(bytes(whole(str(src))), spec, Path(out_path), t0, "the student's compile_vocab", None)
    n_base = len(spec.vocab_keys)
    if specials_from is not None:
        specials = _specials_from_bin(Path(specials_from), n_base)
        special_source = str(specials_from)
    else:
        specials = [(a.id, a.content.encode("utf-8")) for a in spec.added if a.id >= n_base]
        special_source = "added_tokens"
        expected = list(range(n_base, n_base + len(specials)))
        if [tid for tid, _ in specials] != expected:
            raise ValueError(f"{src}: field 'added_tokens': ids above the vocab must run {n_base}.. without gaps, "
                             f"got {[tid for tid, _ in specials][:8]}…")
    parts = [struct.pack("<I", n_base + len(specials))]
    mine = seam.get("vocab.decode_token_str") if drop_branch is None else None   # a student's piece, else ours
    for tid, key in enumerate(spec.vocab_keys):
        rec = decode_token_str(key, drop_branch) if mine is None else bytes(mine(key))
        if not 0 < len(rec) < 1 << 16:
            raise ValueError(f"{src}: field 'model.vocab' id {tid}: {len(rec)} bytes do not fit a u16 length")
        parts.append(struct.pack("<IH", tid, len(rec)))
        parts.append(rec)
    for tid, text in specials:
        parts.append(struct.pack("<IH", tid, len(text)))
        parts.append(text)
    return _write(b"".join(parts), spec, Path(out_path), t0, special_source, drop_branch)


def _write(blob: bytes, spec, out_path: Path, t0: float, special_source: str, drop_branch) -> CompileStats:
    """Write ``blob`` atomically, read it back and count what it holds (the converted, kept and special
    tokens against the tokenizer's keys) and what it covers."""
    with atomic_write(out_path, "wb") as fh:
        fh.write(blob)
    seconds = time.perf_counter() - t0
    vb = load_vocab_bin(out_path)
    n_base = min(len(spec.vocab_keys), vb.n)
    converted = sum(vb.token(tid) != key.encode("utf-8") for tid, key in enumerate(spec.vocab_keys[:n_base]))
    stats = CompileStats(total=vb.n, converted=converted, kept=n_base - converted, special=vb.n - n_base,
                         special_source=special_source, bytes=len(blob), sha256=hashlib.sha256(blob).hexdigest(),
                         seconds=seconds, out_path=out_path, drop_branch=drop_branch)
    stats.coverage, stats.missing = coverage(vb)
    return stats


def coverage(vb) -> tuple[list[tuple[str, list[int]]], list[str]]:
    """The compiler's self-check: ids containing each ``COVERAGE_STRINGS`` entry, and missing chars.

    Taught in day18_2.
    """
    whole = set()
    lengths = vb.lengths
    for tid in range(vb.n):
        if lengths[tid] <= 3:
            whole.add(vb.token(tid))
    missing = [c for c in COMMON_CHARS if c.encode("utf-8") not in whole]
    hits = [(s, vb.find(s.encode("utf-8"))) for s in COVERAGE_STRINGS]
    return hits, missing
