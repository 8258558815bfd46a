"""Reference byte-level BPE: what HF ``tokenizers`` does with a Qwen tokenizer.json, in plain Python.

Three steps: NFC-normalize; cut the text into pieces with the pre-tokenizer regex (each match is a
piece; no piece crosses a word/number/punctuation/space boundary); in each piece start from single
bytes and repeatedly join the adjacent pair with the best (lowest) merge priority until no pair can
be joined. Each piece's ids are cached, as HF does, since natural text repeats its words.

Taught in day18_1.
"""
from __future__ import annotations

import unicodedata

import regex

from kestrel_lab.vocab.tokenizer_json import QWEN2_PATTERN


class BPEEncoder:
    """BPE over ``token_bytes`` (id → bytes) and ``merges`` (pairs in priority order).

    Taught in day18_1.
    """

    def __init__(self, token_bytes: list[bytes], merges: list[tuple[bytes, bytes]],
                 pattern: str | None = QWEN2_PATTERN, normalizer: str | None = "NFC"):
        self.token_ids: dict[bytes, int] = {}
        for i, b in enumerate(token_bytes):
            self.token_ids.setdefault(b, i)  # the lowest id wins for repeated bytes
        self.pair_rank: dict[tuple[bytes, bytes], int] = {}
        for rank, (a, b) in enumerate(merges):
            if a + b not in self.token_ids:
                raise ValueError(f"merge {rank} ({a!r}, {b!r}) makes {a + b!r}, which is not in the vocabulary")
            self.pair_rank.setdefault((a, b), rank)
        missing = [b for b in range(256) if bytes([b]) not in self.token_ids]
        if missing:
            raise ValueError(f"byte-level BPE needs all 256 single bytes; missing {missing[:8]}")
        self.pattern = regex.compile(pattern) if pattern else None
        self.normalizer = normalizer
        self._cache: dict[bytes, list[int]] = {}

    def bpe(self, piece: bytes) -> list[bytes]:
        """Merge one piece: lowest priority first, leftmost on ties. Taught in day18_1."""
        parts = [piece[i:i + 1] for i in range(len(piece))]
        ranks = self.pair_rank
        while len(parts) > 1:
            best, best_i = None, -1
            for i in range(len(parts) - 1):
                r = ranks.get((parts[i], parts[i + 1]))
                if r is not None and (best is None or r < best):
                    best, best_i = r, i
            if best_i < 0:
                break
            parts[best_i:best_i + 2] = [parts[best_i] + parts[best_i + 1]]
        return parts

    def encode_piece(self, piece: bytes) -> list[int]:
        """Ids of one piece (cached). Taught in day18_1."""
        ids = self._cache.get(piece)
        if ids is None:
            tid = self.token_ids.get(piece)
            ids = [tid] if tid is not None and len(piece) == 1 else [self.token_ids[p] for p in self.bpe(piece)]
            if len(self._cache) < 200_000:
                self._cache[piece] = ids
        return ids

    def pieces(self, text: str) -> list[str]:
        """The pre-tokenizer's pieces of (normalized) text. Taught in day18_1."""
        if self.normalizer == "NFC":
            text = unicodedata.normalize("NFC", text)
        if self.pattern is None:
            return [text] if text else []
        return self.pattern.findall(text)

    def encode(self, text: str) -> list[int]:
        """Encode text without special-token matching. Taught in day18_1."""
        out: list[int] = []
        for piece in self.pieces(text):
            out += self.encode_piece(piece.encode("utf-8"))
        return out
