"""The engine's encoder: greedy longest-prefix matching over vocab.bin, on a trie, in numba.

The C engine does not run BPE (article 18-1): at each position it takes the longest vocab.bin
entry that is a prefix of the remaining text, emits its id and moves past it. It compares the
text's bytes, mapped the way vocab.bin stores them (bytes 0x00..0x20 as their two-byte ``Ġ``/``Ċ``
forms, C4 80..C4 A0; all other bytes raw), with the stored bytes; of several entries with the same
bytes, the lowest id wins (what a scan that keeps the first longest match does).

The C code finds the longest match with a linear memcmp scan over 151,669 strings. Here the entries
sit in a byte trie: node 0 is the root; the nodes of every one- and two-byte prefix are in direct
tables (256 and 65,536 entries); every deeper edge (node, byte) → child is in one open-addressing hash
table of packed int64 slots, so a match costs one probe per byte walked, whatever the vocabulary size.

Two modes (``GreedyEncoder(..., mode=…)``):

- ``"engine"``: literally the above. It has a blind spot: a text character U+0100..U+0120 (ą, ę, č,
  ğ, đ…) has the same two bytes as a mapped control byte, so text ``ę`` matches the entry of byte
  0x19, and text ``i\\r`` matches the token ``ič``. Decoding such ids does not give the text back.
- ``"exact"`` (the default): the same matching done on raw text bytes against each entry's *engine
  view* (``bytelevel.engine_unmap``), skipping the ids whose engine view is not their true bytes (the
  652 Qwen tokens that contain a real U+0100..U+0120 character, when the true bytes are known). It
  always round-trips. On ordinary text it gives the engine's ids; it differs where the engine's blind
  spot bites: a real U+0100..U+0120 character in the text, a conflicting token that would swallow a
  control byte (``i\r`` → ``ič``), or an engine match ending between the two bytes of a mark.

Taught in day18_1.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from kestrel_lab.vocab.loader import VocabBin

_CHILD_BITS = 24


@njit(cache=True)
def _slot(key, bits):
    return np.int64((np.uint64(key) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(64 - bits))


@njit(cache=True)
def _build_trie(offsets, data, allowed, bits, max_nodes):
    """Insert every allowed entry (in id order) into the trie; returns its arrays."""
    root = np.full(256, -1, dtype=np.int32)
    slots = np.full(1 << bits, -1, dtype=np.int64)
    mask = (1 << bits) - 1
    node_tok = np.full(max_nodes, -1, dtype=np.int32)
    n_nodes = 1
    for tid in range(offsets.size - 1):
        if not allowed[tid]:
            continue
        node = 0
        for j in range(offsets[tid], offsets[tid + 1]):
            b = np.int64(data[j])
            if node == 0:
                child = root[b]
                if child < 0:
                    child = n_nodes
                    n_nodes += 1
                    root[b] = child
            else:
                key = np.int64(node) * 256 + b
                h = _slot(key, bits)
                while True:
                    s = slots[h]
                    if s < 0:
                        child = n_nodes
                        n_nodes += 1
                        slots[h] = (key << 24) | child
                        break
                    if (s >> 24) == key:
                        child = np.int32(s & 0xFFFFFF)
                        break
                    h = (h + 1) & mask
            node = child
        if node != 0 and node_tok[node] < 0:
            node_tok[node] = tid
    # Second level as a direct table too: l2[b0 * 256 + b1] is the node of the two-byte prefix.
    l2 = np.full(65536, -1, dtype=np.int32)
    for b0 in range(256):
        c0 = root[b0]
        if c0 < 0:
            continue
        for b1 in range(256):
            key = np.int64(c0) * 256 + b1
            h = _slot(key, bits)
            while True:
                s = slots[h]
                if s < 0:
                    break
                if (s >> 24) == key:
                    l2[b0 * 256 + b1] = np.int32(s & 0xFFFFFF)
                    break
                h = (h + 1) & mask
    return root, l2, slots, node_tok[:n_nodes].copy()


@njit(cache=True)
def _encode(text, root, l2, slots, node_tok, bits, out, skip_missing):
    """Greedy longest prefix; returns the number of ids, or -(position + 1) where nothing matches.

    With ``skip_missing`` an unmatched byte is passed over and marked by the id -1 instead."""
    mask = (1 << bits) - 1
    n = text.size
    i = 0
    k = 0
    while i < n:
        node = root[text[i]]
        best = -1
        best_len = 0
        j = i + 1
        while node >= 0:
            t = node_tok[node]
            if t >= 0:
                best = t
                best_len = j - i
            if j >= n:
                break
            if j == i + 1:  # the first two bytes come from the direct tables
                node = l2[np.int64(text[i]) * 256 + np.int64(text[j])]
                j += 1
                continue
            key = np.int64(node) * 256 + np.int64(text[j])
            h = _slot(key, bits)
            nxt = -1
            while True:
                s = slots[h]
                if s < 0:
                    break
                if (s >> 24) == key:
                    nxt = np.int32(s & 0xFFFFFF)
                    break
                h = (h + 1) & mask
            node = nxt
            j += 1
        if best < 0:
            if not skip_missing:
                return -(i + 1)
            best_len = 1
        out[k] = best
        k += 1
        i += best_len
    return k


@njit(cache=True)
def _engine_view(offsets, data):
    """Every C4 80..C4 A0 pair of every entry collapsed to the byte 0x00..0x20."""
    n = offsets.size - 1
    new_off = np.zeros(n + 1, dtype=np.int64)
    out = np.empty(data.size, dtype=np.uint8)
    k = 0
    for tid in range(n):
        j = offsets[tid]
        end = offsets[tid + 1]
        while j < end:
            b = data[j]
            if b == 0xC4 and j + 1 < end and 0x80 <= data[j + 1] <= 0xA0:
                out[k] = data[j + 1] - 0x80
                j += 2
            else:
                out[k] = b
                j += 1
            k += 1
        new_off[tid + 1] = k
    return new_off, out[:k].copy()


@njit(cache=True)
def _engine_map(text):
    """Text bytes 0x00..0x20 → C4 80..C4 A0 (the engine's marks); other bytes unchanged."""
    extra = 0
    for b in text:
        if b <= 0x20:
            extra += 1
    out = np.empty(text.size + extra, dtype=np.uint8)
    k = 0
    for b in text:
        if b <= 0x20:
            out[k] = 0xC4
            out[k + 1] = b + 0x80
            k += 2
        else:
            out[k] = b
            k += 1
    return out


def engine_view(vocab: VocabBin) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, data) of every entry as the bytes the engine believes it stands for. Taught in day18_1."""
    return _engine_view(vocab.offsets, vocab.data)


class GreedyEncoder:
    """Greedy longest-prefix encoder over a vocab.bin (see the module docstring for the two modes).

    ``exclude``: ids never emitted (the Tokenizer passes the special tokens, which it matches
    itself, and in ``"exact"`` mode the ids whose engine view differs from their true bytes).
    Taught in day18_1.
    """

    def __init__(self, vocab: VocabBin, mode: str = "exact", exclude=None):
        if mode not in ("exact", "engine"):
            raise ValueError(f"mode {mode!r}: expected 'exact' or 'engine'")
        self.mode = mode
        self.vocab = vocab
        allowed = np.ones(vocab.n, dtype=np.bool_)
        if exclude is not None:
            allowed[np.asarray(list(exclude) if not isinstance(exclude, np.ndarray) else exclude,
                               dtype=np.int64)] = False
        if mode == "exact":
            offsets, data = engine_view(vocab)
        else:
            offsets, data = vocab.offsets, vocab.data
        self.allowed = allowed
        nbytes = int(offsets[-1])
        if nbytes + 1 >= 1 << _CHILD_BITS:
            raise ValueError(f"{nbytes:,} bytes of entries: the trie packs node ids in {_CHILD_BITS} bits")
        bits = max(10, int(np.ceil(np.log2(max(nbytes, 1) * 2))))
        self._bits = bits
        self._root, self._l2, self._slots, self._node_tok = _build_trie(offsets, data, allowed, bits, nbytes + 1)
        self.n_nodes = int(self._node_tok.size)

    def encode_array(self, data: bytes | np.ndarray, on_missing: str = "raise") -> np.ndarray:
        """Encode raw UTF-8 bytes; returns int32 ids.

        ``on_missing="skip"``: a byte no entry starts with (a broken vocab.bin) gives id -1.
        Taught in day18_1.
        """
        if on_missing not in ("raise", "skip"):
            raise ValueError(f"on_missing {on_missing!r}: expected 'raise' or 'skip'")
        text = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data
        if self.mode == "engine":
            text = _engine_map(text)
        out = np.empty(text.size, dtype=np.int32)
        k = _encode(text, self._root, self._l2, self._slots, self._node_tok, self._bits, out, on_missing == "skip")
        if k < 0:
            pos = -k - 1
            raise ValueError(f"greedy encode: no vocab entry starts with byte 0x{int(text[pos]):02X} "
                             f"(position {pos} of the {'mapped ' if self.mode == 'engine' else ''}text)")
        return out[:k]

    def encode(self, text: str) -> list[int]:
        """Encode text (no normalization, no special-token matching). Taught in day18_1."""
        return self.encode_array(text.encode("utf-8")).tolist()
