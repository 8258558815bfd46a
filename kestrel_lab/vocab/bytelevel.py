"""Byte-level conventions: GPT-2's byte↔character table and the engine's byte decoding.

Byte-level BPE (GPT-2, Qwen) never stores raw bytes in ``tokenizer.json``: every byte is written as
one printable character (``bytes_to_unicode``). The 188 printable bytes stand for themselves
(``!``..``~``, ``¡``..``¬``, ``®``..``ÿ``); the 68 others get the characters U+0100.. in byte order:
0x00..0x20 → U+0100..U+0120 (so a space is ``Ġ`` and a newline ``Ċ``), 0x7F → U+0121 ``ġ``,
0x80..0xA0 → U+0122..U+0142, 0xAD → U+0143 ``Ń``.

vocab.bin does *not* simply undo that table. Article 18-2's ``decode_token_str`` maps the
characters that stand for 0x7F, 0x80..0xA0 and 0xAD back to their single byte and writes the
latin-1 characters as their byte, but keeps U+0100..U+0120 as their UTF-8 form (``Ġ`` = C4 A0,
``Ċ`` = C4 8A): the engine marks spaces, newlines and control bytes that way, and maps text bytes
0x00..0x20 to the same two-byte forms before matching (``engine_map_text``).

Taught in day18_1 (the table) and day18_2 (the three classes of ``decode_token_str``).
"""
from __future__ import annotations

import numpy as np


def _bytes_to_unicode() -> dict[int, str]:
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    table, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


#: byte → the character tokenizer.json writes for it (GPT-2's ``bytes_to_unicode``).
BYTE_TO_UNICODE: dict[int, str] = _bytes_to_unicode()
#: character → byte, the inverse table.
UNICODE_TO_BYTE: dict[str, int] = {c: b for b, c in BYTE_TO_UNICODE.items()}

#: The branches of ``decode_token_str`` by name; ``drop_branch`` removes one to reproduce the
#: article's "forgotten fix" exercise. Each entry: (first code point, last code point, meaning).
DECODE_BRANCHES: dict[str, tuple[int, int, str]] = {
    "0x0143": (0x0143, 0x0143, "U+0143 'Ń' → byte 0xAD (soft hyphen)"),
    "0x0121": (0x0121, 0x0121, "U+0121 'ġ' → byte 0x7F (DEL)"),
    "0x0122-0x0142": (0x0122, 0x0142, "U+0122..U+0142 → bytes 0x80..0xA0 (cp - 0xA2)"),
    "latin1": (0x00A1, 0x00FF, "U+00A1..U+00AC, U+00AE..U+00FF → the same byte"),
}

_ENGINE_MARK_LEAD = 0xC4  # UTF-8 lead byte of U+0100..U+013F: the engine's marks for bytes 0x00..0x20


def _branch_bounds(drop_branch: str | None) -> tuple[bool, bool, bool, bool]:
    if drop_branch is not None and drop_branch not in DECODE_BRANCHES:
        raise ValueError(f"drop_branch {drop_branch!r}: expected one of {', '.join(DECODE_BRANCHES)}")
    return tuple(name != drop_branch for name in DECODE_BRANCHES)  # type: ignore[return-value]


def decode_token_str(s: str, drop_branch: str | None = None) -> bytes:
    """The bytes vocab.bin stores for a tokenizer.json key (article 18-2's byte decoding).

    Three classes: (1) U+0121, U+0122..U+0142 and U+0143 go back to the single bytes 0x7F,
    0x80..0xA0, 0xAD; (2) latin-1 characters U+00A1..U+00FF (but U+00AD) are their own byte;
    (3) everything else keeps its UTF-8 form, notably ``Ġ``/``Ċ`` (U+0100..U+0120), the engine's
    space/newline marks. ``drop_branch`` (a key of ``DECODE_BRANCHES``) disables one branch, so
    its characters fall through to class 3, as in the article's exercise.

    Taught in day18_2.
    """
    keep_143, keep_121, keep_range, keep_latin = _branch_bounds(drop_branch)
    out = bytearray()
    for ch in s:
        cp = ord(ch)
        if cp == 0x0143 and keep_143:
            out.append(0xAD)
        elif cp == 0x0121 and keep_121:
            out.append(0x7F)
        elif 0x0122 <= cp <= 0x0142 and keep_range:
            out.append(cp - 0xA2)
        elif keep_latin and (0x00A1 <= cp <= 0x00AC or 0x00AE <= cp <= 0x00FF):
            out.append(cp)
        else:
            out += ch.encode("utf-8")
    return bytes(out)


def token_str_to_bytes(s: str) -> bytes:
    """The true bytes of a byte-level key (the full inverse of ``bytes_to_unicode``).

    Raises ValueError on a character outside the 256-character alphabet, which means the string is
    not a byte-level key (an added token's text, say). Taught in day18_1.
    """
    try:
        return bytes(UNICODE_TO_BYTE[c] for c in s)
    except KeyError as e:
        raise ValueError(f"{s!r} is not a byte-level token: character {e.args[0]!r} "
                         f"(U+{ord(e.args[0]):04X}) is not in bytes_to_unicode") from None


def bytes_to_token_str(b: bytes) -> str:
    """The byte-level key tokenizer.json writes for token bytes ``b``. Taught in day18_1."""
    return "".join(BYTE_TO_UNICODE[x] for x in b)


def engine_map_text(data: bytes) -> bytes:
    """Text bytes in the form vocab.bin stores them: bytes 0x00..0x20 become C4 80..C4 A0.

    This is what the engine does before matching: a space becomes ``Ġ`` (C4 A0), a newline ``Ċ``
    (C4 8A); every other byte is left alone, because vocab.bin stores those bytes raw. Note the
    collision: a text character U+0100..U+0120 (``Ā``..``Ġ``: ą, ę, č, ğ…) has the same two bytes.
    Taught in day18_1.
    """
    arr = np.frombuffer(data, dtype=np.uint8)
    low = arr <= 0x20
    if not low.any():
        return bytes(data)
    out = np.empty(arr.size + int(low.sum()), dtype=np.uint8)
    pos = np.arange(arr.size) + np.concatenate(([0], np.cumsum(low)[:-1]))
    out[pos] = np.where(low, _ENGINE_MARK_LEAD, arr)
    out[pos[low] + 1] = arr[low] + 0x80
    return out.tobytes()


def engine_unmap(data: bytes) -> bytes:
    """Undo ``engine_map_text``: every C4 80..C4 A0 pair becomes the byte 0x00..0x20.

    Applied to a vocab.bin entry this gives the bytes the engine believes the entry stands for (its
    *engine view*). It differs from the true bytes exactly when the token contains a real character
    U+0100..U+0120 (652 Qwen tokens, e.g. ``ę``, `` się``, ``ič``). Taught in day18_1.
    """
    if b"\xc4" not in data:
        return bytes(data)
    out, i, n = bytearray(), 0, len(data)
    while i < n:
        b = data[i]
        if b == _ENGINE_MARK_LEAD and i + 1 < n and 0x80 <= data[i + 1] <= 0xA0:
            out.append(data[i + 1] - 0x80)
            i += 2
        else:
            out.append(b)
            i += 1
    return bytes(out)
