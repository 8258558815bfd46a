"""Encoder measurements: throughput side by side, and how often greedy differs from BPE, by language.

Taught in day18_1; run as a script by benchmarks/bench_vocab.py.
"""
from __future__ import annotations

import os
import time
import unicodedata
from collections import defaultdict
from dataclasses import dataclass

from kestrel_lab.vocab.corpus import Doc


@dataclass
class Throughput:
    name: str
    seconds: float       # best of the repeats
    megabytes: float
    tokens: int

    @property
    def mb_per_s(self) -> float:
        return self.megabytes / self.seconds


def encoder_functions(tokenizer_json=None, vocab_bin=None, which=("greedy", "bpe", "hf", "tiktoken")):
    """name → function(text) -> ids, for the encoders to compare (HF/tiktoken only if installed).

    All single-threaded; HF and tiktoken are given the same ranks/merges and regex as ours.
    Taught in day18_1.
    """
    from kestrel_lab.vocab.tokenizer import Tokenizer
    from kestrel_lab.vocab.tokenizer_json import default_tokenizer_json, read_tokenizer_json

    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    tj = tokenizer_json or (default_tokenizer_json() if vocab_bin is None else None)
    out = {}
    if "greedy" in which:
        g = Tokenizer.from_files(tj, vocab_bin, encoder="greedy")
        out["greedy (numba trie)"] = lambda text, _e=g._enc: _e.encode_array(text.encode("utf-8"))
    if "bpe" in which:
        b = Tokenizer.from_files(tj, vocab_bin, encoder="bpe")
        out["BPE (reference, Python)"] = b._enc.encode
    if "hf" in which and tj is not None:
        try:
            import tokenizers
        except ImportError:
            pass
        else:
            hf = tokenizers.Tokenizer.from_file(str(tj))
            out["HF tokenizers"] = lambda text: hf.encode(text, add_special_tokens=False).ids
    if "tiktoken" in which and tj is not None:
        try:
            import tiktoken
        except ImportError:
            pass
        else:
            from kestrel_lab.vocab.bytelevel import token_str_to_bytes
            from kestrel_lab.vocab.tokenizer_json import QWEN2_PATTERN

            spec = read_tokenizer_json(tj)
            ranks = {token_str_to_bytes(k): i for i, k in enumerate(spec.vocab_keys)}
            enc = tiktoken.Encoding("kestrel", pat_str=spec.pattern or QWEN2_PATTERN, mergeable_ranks=ranks,
                                    special_tokens={})
            out["tiktoken"] = enc.encode_ordinary
    return out


def throughput(text: str, encoders: dict, repeat: int = 3) -> list[Throughput]:
    """Best-of-``repeat`` encode time of ``text`` (already NFC) per encoder, after one warm-up.

    Taught in day18_1.
    """
    mb = len(text.encode("utf-8")) / 1e6
    rows = []
    for name, fn in encoders.items():
        fn(text[:2000])
        best, n = float("inf"), 0
        for _ in range(repeat):
            t0 = time.perf_counter()
            ids = fn(text)
            best = min(best, time.perf_counter() - t0)
            n = len(ids)
        rows.append(Throughput(name, best, mb, n))
    return rows


def throughput_docs(texts: list[str], encoders: dict, repeat: int = 3) -> list[Throughput]:
    """Like ``throughput`` but one call per document (short inputs: per-call costs show).

    Taught in day18_1.
    """
    mb = sum(len(t.encode("utf-8")) for t in texts) / 1e6
    rows = []
    for name, fn in encoders.items():
        fn(texts[0])
        best, n = float("inf"), 0
        for _ in range(repeat):
            t0 = time.perf_counter()
            n = sum(len(fn(t)) for t in texts)
            best = min(best, time.perf_counter() - t0)
        rows.append(Throughput(name, best, mb, n))
    return rows


@dataclass
class Disagreement:
    lang: str
    docs: int
    docs_differ: int
    bpe_tokens: int
    greedy_tokens: int
    tokens_differ: int   # BPE tokens not reproduced by greedy at the same byte span

    @property
    def doc_rate(self) -> float:
        return self.docs_differ / self.docs if self.docs else 0.0

    @property
    def token_rate(self) -> float:
        return self.tokens_differ / self.bpe_tokens if self.bpe_tokens else 0.0


def _spans(ids, tok) -> set[tuple[int, int, int]]:
    out, pos = set(), 0
    for i in ids:
        n = len(tok.token_bytes(int(i)))
        out.add((pos, pos + n, int(i)))
        pos += n
    return out


def disagreement_by_language(docs: list[Doc], bpe, greedy) -> list[Disagreement]:
    """Per language: documents whose greedy ids differ from BPE's, and BPE tokens greedy misses.

    ``bpe``/``greedy`` are ``Tokenizer`` objects. Taught in day18_1.
    """
    acc: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0])
    for d in docs:
        text = unicodedata.normalize("NFC", d.text)
        a = bpe.encode(text, allow_special=False)
        b = greedy.encode(text, allow_special=False)
        row = acc[d.lang]
        row[0] += 1
        row[2] += len(a)
        row[3] += len(b)
        if a != b:
            row[1] += 1
            row[4] += len(_spans(a, bpe) - _spans(b, greedy))
    return [Disagreement(lang, *v) for lang, v in acc.items()]
