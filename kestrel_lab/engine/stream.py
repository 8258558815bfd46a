"""Streaming detokenization that never prints half a UTF-8 character.

A byte-level BPE token is a run of *bytes*, not of characters: one Chinese character (3 bytes in
UTF-8) may be split over two tokens, and a token may even be a lone continuation byte (0x80–0xBF).
Decoding each token on its own would print U+FFFD (�) in the middle of a perfectly good answer.

``StreamDecoder`` keeps a byte buffer: each ``push(token_id)`` appends the token's bytes, emits every
complete character, and holds back only the *incomplete tail* — a lead byte and the continuation bytes
after it that could still become a valid character once more bytes arrive. Bytes that can never become
valid (a stray continuation byte, 0xC0, 0xFF, an overlong or surrogate start) are emitted as U+FFFD at
once, exactly where a full decode with ``errors="replace"`` puts them, so the concatenated stream always
equals ``b"".join(all bytes).decode("utf-8", "replace")``. ``flush()`` at the end emits what is left.

Taught in day14_3.
"""
from __future__ import annotations

from typing import Callable

__all__ = ["StreamDecoder", "incomplete_tail_len", "utf8_sequence_len"]


def utf8_sequence_len(lead: int) -> int:
    """Bytes of the UTF-8 sequence a lead byte starts: 1 (ASCII), 2, 3, 4; 0 when it cannot start one.

    0x80–0xBF are continuation bytes; 0xC0, 0xC1 (overlong) and 0xF5–0xFF (beyond U+10FFFF) never start
    a valid sequence. Taught in day14_3.
    """
    if lead < 0x80:
        return 1
    if 0xC2 <= lead <= 0xDF:
        return 2
    if 0xE0 <= lead <= 0xEF:
        return 3
    if 0xF0 <= lead <= 0xF4:
        return 4
    return 0


def _second_byte_ok(lead: int, second: int) -> bool:
    """The second byte's allowed range (Unicode table 3-7): excludes overlongs, surrogates, > U+10FFFF."""
    lo, hi = {0xE0: (0xA0, 0xBF), 0xED: (0x80, 0x9F), 0xF0: (0x90, 0xBF), 0xF4: (0x80, 0x8F)}.get(
        lead, (0x80, 0xBF))
    return lo <= second <= hi


def incomplete_tail_len(buf: bytes) -> int:
    """How many bytes at the end of ``buf`` are the valid beginning of a character not yet complete.

    Those bytes must be held back: the next token may complete them. 0 when ``buf`` ends on a character
    boundary or with bytes that can never be completed. Looks at most at the last 3 bytes.
    Taught in day14_3.
    """
    n = len(buf)
    for back in range(1, min(4, n) + 1):
        b = buf[n - back]
        if 0x80 <= b <= 0xBF:  # continuation byte: the lead, if any, is further back
            continue
        need = utf8_sequence_len(b)
        if need <= back:  # ASCII, an invalid lead, or a sequence already long enough
            return 0
        if back >= 2 and not _second_byte_ok(b, buf[n - back + 1]):
            return 0  # e.g. E0 80: can never complete, decode it (as U+FFFD) now
        return back
    return 0


class StreamDecoder:
    """Incremental detokenizer: ``push`` token ids, get text that is safe to print.

    ``token_bytes`` maps an id to its bytes (``Tokenizer.token_bytes``). ``pending`` holds the bytes
    held back. Taught in day14_3.
    """

    def __init__(self, token_bytes: Callable[[int], bytes]):
        self.token_bytes = token_bytes
        self.pending = b""
        self.emitted: list[str] = []

    def push_bytes(self, data: bytes) -> str:
        """Append raw bytes; return the text now complete (may be empty)."""
        buf = self.pending + data
        hold = incomplete_tail_len(buf)
        ready, self.pending = buf[:len(buf) - hold], buf[len(buf) - hold:]
        text = ready.decode("utf-8", errors="replace")
        if text:
            self.emitted.append(text)
        return text

    def push(self, token_id: int) -> str:
        """Append one token; return the text now complete (may be empty)."""
        return self.push_bytes(self.token_bytes(int(token_id)))

    def flush(self) -> str:
        """End of stream: emit the held-back bytes (an unfinished character becomes U+FFFD)."""
        text = self.pending.decode("utf-8", errors="replace")
        self.pending = b""
        if text:
            self.emitted.append(text)
        return text

    @property
    def text(self) -> str:
        """Everything emitted so far."""
        return "".join(self.emitted)
