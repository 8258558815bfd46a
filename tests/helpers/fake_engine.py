"""A stand-in engine for the generation and chat tests (no weights, no numba).

``FakeEngine`` has the engine's interface (prefill/decode/truncate/reset/pos/max_context) and keeps
the ids of its "KV cache" in a list, so a test can check exactly what was prefilled. Its logits depend
on every cached id (a wrong cache gives different logits), or follow a script: after the generation
prompt ``<|im_start|>assistant\\n`` (and an optional think block) it "answers" a fixed reply.
"""
from __future__ import annotations

import zlib
from functools import lru_cache

import numpy as np

VOCAB = 151936
IM_START, IM_END, ENDOFTEXT = 151644, 151645, 151643


@lru_cache(maxsize=1)
def tokenizer():
    from kestrel_lab.vocab import Tokenizer

    return Tokenizer.default(encoder="bpe")


class FakeEngine:
    def __init__(self, max_context: int = 4096, reply: list[int] | None = None, vocab: int = VOCAB):
        self.max_context = max_context
        self.vocab = vocab
        self.reply = reply
        self.ids: list[int] = []
        self.prefills: list[list[int]] = []
        self.decodes = 0
        self.truncations: list[int] = []

    @property
    def pos(self) -> int:
        return len(self.ids)

    def reset(self):
        self.ids = []

    def truncate(self, pos: int):
        if not 0 <= pos <= len(self.ids):
            raise ValueError(f"truncate({pos}) outside 0..{len(self.ids)}")
        self.truncations.append(pos)
        self.ids = self.ids[:pos]

    def _append(self, ids):
        if len(self.ids) + len(ids) > self.max_context:
            raise ValueError(f"context limit {self.max_context} exceeded")
        self.ids.extend(int(i) for i in ids)
        return self._logits()

    def prefill(self, ids):
        ids = list(ids)
        if not ids:
            raise ValueError("prefill of nothing")
        self.prefills.append(ids)
        return self._logits_after(ids)

    def _logits_after(self, ids):
        return self._append(ids)

    def decode(self, tok):
        self.decodes += 1
        return self._append([tok])

    def forward_all(self, ids):
        self.reset()
        out = []
        for i in ids:
            out.append(self._append([i]))
        return np.stack(out)

    def _logits(self):
        if self.reply is None:
            seed = zlib.crc32(np.asarray(self.ids, dtype=np.int64).tobytes())
            return (np.random.default_rng(seed).standard_normal(self.vocab) * 2).astype(np.float32)
        logits = np.zeros(self.vocab, dtype=np.float32)
        logits[self._next_scripted()] = 20.0
        return logits

    def _next_scripted(self) -> int:
        ids = self.ids
        starts = [i for i, t in enumerate(ids) if t == IM_START]
        if not starts:
            return ENDOFTEXT
        seg = ids[starts[-1] + 1:]
        if seg[:2] != [77091, 198]:  # "assistant", "\n"
            return ENDOFTEXT
        seg = seg[2:]
        if 151668 in seg[:6]:  # skip an empty or short think block
            seg = seg[seg.index(151668) + 1:]
            while seg and seg[0] in (271, 198):
                seg = seg[1:]
        n = len(seg)
        return self.reply[n] if n < len(self.reply) else IM_END
