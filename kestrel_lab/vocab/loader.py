"""vocab.bin reader: the C loader's two passes, with numpy arrays instead of 151,669 objects.

Format (little-endian): ``<u32 N>`` then N records ``<u32 token_id><u16 len><len bytes>``.
Pass 1 walks the records and only reads ``token_id``/``len``, checking each header and that the
bytes fit in the file, and notes every record's offset; pass 2 copies the bytes into one contiguous
buffer *placed by token id* (``data[offsets[i]:offsets[i+1]]`` is token i), so the file's record
order does not matter. Every error names the file, the record, the field and the byte offset.

Taught in day18_2.
"""
from __future__ import annotations

import contextlib
import mmap
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numba import njit

from kestrel_lab.limits import BOUND, LimitError

HEADER_BYTES = 4            # u32 N
RECORD_HEADER_BYTES = 6     # u32 token_id + u16 len
DEFAULT_MAX_ENTRIES = BOUND["vocab_bin.N"].hi   # the one table of bounds (kestrel_lab.limits)

# Status codes of the scan kernel (0 = fine).
_TRUNC_HEADER, _TRUNC_BYTES, _ID_RANGE, _DUPLICATE, _EMPTY_TOKEN = 1, 2, 3, 4, 5


class VocabFormatError(ValueError):
    """A vocab.bin that does not follow the format; the message names file, field and offset."""


@njit(cache=True)
def _scan(buf, n, id_limit, rec_off, rec_id, rec_len):
    """Pass 1: record offsets, ids and lengths; returns (status, record index, offset, value)."""
    pos = 4
    size = buf.size
    seen = np.full(id_limit, -1, dtype=np.int64)
    for k in range(n):
        if pos + 6 > size:
            return _TRUNC_HEADER, k, pos, size - pos
        tid = (np.int64(buf[pos]) | (np.int64(buf[pos + 1]) << 8) | (np.int64(buf[pos + 2]) << 16)
               | (np.int64(buf[pos + 3]) << 24))
        ln = np.int64(buf[pos + 4]) | (np.int64(buf[pos + 5]) << 8)
        if tid >= id_limit:
            return _ID_RANGE, k, pos, tid
        if seen[tid] >= 0:
            return _DUPLICATE, k, pos, tid
        if ln == 0:
            return _EMPTY_TOKEN, k, pos + 4, tid
        if pos + 6 + ln > size:
            return _TRUNC_BYTES, k, pos + 6, ln
        seen[tid] = k
        rec_off[k] = pos + 6
        rec_id[k] = tid
        rec_len[k] = ln
        pos += 6 + ln
    return 0, n, pos, 0


@njit(cache=True)
def _place(buf, rec_off, rec_id, rec_len, offsets, data):
    """Pass 2: copy each record's bytes to its token id's slot in one contiguous buffer."""
    for k in range(rec_id.size):
        dst = offsets[rec_id[k]]
        src = rec_off[k]
        for j in range(rec_len[k]):
            data[dst + j] = buf[src + j]


@dataclass
class VocabBin:
    """A loaded vocab.bin: token i's stored bytes are ``data[offsets[i]:offsets[i + 1]]``.

    ``file_order`` holds the ids in the order the file lists them; ``path`` the source file.
    Taught in day18_2.
    """

    offsets: np.ndarray   # int64, N + 1
    data: np.ndarray      # uint8, all token bytes back to back, in id order
    file_order: np.ndarray  # int32, ids as they appear in the file
    path: Path | None = None

    @property
    def n(self) -> int:
        return self.offsets.size - 1

    def __len__(self) -> int:
        return self.n

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    @property
    def max_len(self) -> int:
        return int(self.lengths.max()) if self.n else 0

    def token(self, tid: int) -> bytes:
        """The stored bytes of token ``tid``. Taught in day18_2."""
        if not 0 <= tid < self.n:
            raise IndexError(f"token id {tid} out of range 0..{self.n - 1}")
        return self.data[self.offsets[tid]:self.offsets[tid + 1]].tobytes()

    def find(self, needle: bytes, limit: int | None = None) -> list[int]:
        """Ids whose stored bytes contain ``needle`` (the compiler's coverage check). Taught in day18_2."""
        hits = []
        blob = self.data.tobytes()
        start = 0
        while True:
            at = blob.find(needle, start)
            if at < 0:
                break
            tid = int(np.searchsorted(self.offsets, at, side="right")) - 1
            end = int(self.offsets[tid + 1])
            if at + len(needle) <= end:
                hits.append(tid)
                start = end  # one hit per token
            else:
                start = at + 1
            if limit is not None and len(hits) >= limit:
                break
        return hits


def parse_vocab_bin(buf: bytes | np.ndarray, *, where: str = "<bytes>", max_entries: int = DEFAULT_MAX_ENTRIES,
                    id_limit: int | None = None) -> VocabBin:
    """Parse vocab.bin bytes (see ``load_vocab_bin``). Taught in day18_2."""
    arr = np.frombuffer(buf, dtype=np.uint8) if not isinstance(buf, np.ndarray) else buf
    size = arr.size

    def fail(msg: str):
        raise VocabFormatError(f"{where}: {msg}")

    if size == 0:
        fail("empty file: field N (u32 entry count) at offset 0 needs 4 bytes, the file has 0")
    if size < HEADER_BYTES:
        fail(f"truncated header: field N (u32 entry count) at offset 0 needs 4 bytes, the file has {size}")
    n = int(arr[:4].view("<u4")[0])
    if id_limit is not None:
        try:
            BOUND["vocab_size"].check(id_limit, "id_limit")
        except LimitError as e:
            raise VocabFormatError(f"{where}: parameter id_limit: {e.detail}") from None
    if n > max_entries:
        fail(f"field N at offset 0 is {n:,}, above the limit of {max_entries:,} entries")
    capacity = (size - HEADER_BYTES) // (RECORD_HEADER_BYTES + 1)
    if n > capacity:
        fail(f"field N at offset 0 is {n:,}, but a file of {size:,} bytes holds at most {capacity:,} "
             f"records of at least {RECORD_HEADER_BYTES + 1} bytes")
    limit = n if id_limit is None else int(id_limit)
    rec_off = np.empty(n, dtype=np.int64)
    rec_id = np.empty(n, dtype=np.int32)
    rec_len = np.empty(n, dtype=np.int64)
    status, k, off, val = _scan(arr, n, limit, rec_off, rec_id, rec_len)
    if status == _TRUNC_HEADER:
        fail(f"record {k}: truncated header: fields token_id/len at offset {off:,} need 6 bytes, "
             f"only {val} left (file is {size:,} bytes; N says {n:,} records)")
    if status == _TRUNC_BYTES:
        fail(f"record {k}: truncated bytes: field len says {val} bytes at offset {off:,}, "
             f"only {size - off:,} left (file is {size:,} bytes)")
    if status == _ID_RANGE:
        fail(f"record {k}: field token_id at offset {off:,} is {val:,}, out of range 0..{limit - 1:,}")
    if status == _DUPLICATE:
        fail(f"record {k}: field token_id at offset {off:,} is {val:,}, a duplicate id")
    if status == _EMPTY_TOKEN:
        fail(f"record {k}: field len at offset {off:,} is 0 (token {val:,} has no bytes)")
    if off != size:
        fail(f"{size - off:,} trailing bytes at offset {off:,} after the {n:,} records N announces")
    lengths = np.zeros(limit, dtype=np.int64)
    lengths[rec_id] = rec_len
    offsets = np.zeros(limit + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    data = np.empty(int(offsets[-1]), dtype=np.uint8)
    _place(arr, rec_off, rec_id, rec_len, offsets, data)
    return VocabBin(offsets, data, rec_id, Path(where) if where != "<bytes>" else None)


def load_vocab_bin(path: str | os.PathLike, *, max_entries: int = DEFAULT_MAX_ENTRIES,
                   id_limit: int | None = None) -> VocabBin:
    """Load and validate a vocab.bin.

    Checks, in order: empty/short header; N above ``max_entries``; N more than the file can hold;
    per record: truncated header, token id ≥ ``id_limit`` (default N), duplicate id, zero length,
    truncated bytes; then trailing bytes. With ``id_limit`` above N (say, the model's 151,936 rows)
    ids without a record get no bytes. Taught in day18_2.
    """
    path = Path(path)
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size == 0:
            return parse_vocab_bin(b"", where=str(path), max_entries=max_entries, id_limit=id_limit)
        # mapped, not read: pass 1 touches only the record headers, and a huge file costs no memory
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        return parse_vocab_bin(np.frombuffer(mm, dtype=np.uint8), where=str(path), max_entries=max_entries,
                               id_limit=id_limit)
    finally:
        # the result holds copies; a failure's traceback may still hold a view (numpy then frees it)
        with contextlib.suppress(BufferError):
            mm.close()
