"""Look inside a VQF file the way article 16-3 does: the parser, its five assertions, an ``od`` dump.

Unlike the reader, the inspector does not stop at the first problem: it prints what it finds and
reports each assertion as passed or failed, so it also works on damaged files and on a header-only
file written by ``kestrel-lab vqf plan --write-header`` (whose data area is absent).

The five assertions (article 16-3, exercise A):

1. every entry's ``offset % 64 == 0``;
2. offsets chain: ``offset[i] == round64(offset[i-1] + bytes[i-1])`` (strictly increasing, no gap);
3. ``entry[0].offset == data_offset``;
4. the last entry's ``offset + bytes == file_len``;
5. ``bytes`` equals the qtype's formula (the article spot-checks q4_lm, v_q8_qkv and attn_norm; we
   check every entry and show those three).

Taught in day16_3.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

from kestrel_lab import quant as Q
from kestrel_lab.vqf import format as F


Entry = F.DirEntry  # one directory entry as read by ``parse``


@dataclass
class Parsed:
    """Header, directory and trailer of a file, read without rejections. Taught in day16_3."""
    path: str
    size: int
    header: dict
    entries: list[Entry]
    trailer: int | None  # the stored FNV (None when the file has no room for it)

    @property
    def header_only(self) -> bool:
        return self.size <= self.header["data_offset"] < self.header["file_len"]


def parse(path: str | os.PathLike, max_entries: int = F.MAX_TENSORS) -> Parsed:
    """Read header and directory with ``struct`` only — the article's parser, without rejections
    beyond what makes reading impossible. Taught in day16_3."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(F.DIR_OFFSET)                   # header, VQFSig and the RoPE block
        if len(head) < F.HEADER_END:
            raise F.VQFFormatError(f"{path}: only {len(head)} bytes; the header alone is {F.HEADER_END}")
        h = F.unpack_header_raw(head)
        n = min(h["n_tensors"], max_entries, max(0, (size - F.DIR_OFFSET) // F.ENTRY_SIZE))
        fh.seek(F.DIR_OFFSET)
        entries = []
        for i in range(n):
            name, qt, r, c, o, b = struct.unpack(F.ENTRY_FORMAT, fh.read(F.ENTRY_SIZE))
            entries.append(Entry(i, name.split(b"\0")[0].decode("utf-8", "replace"), qt, r, c, o, b))
        trailer = None
        if size >= h["file_len"] + 8:
            fh.seek(h["file_len"])
            trailer = struct.unpack("<Q", fh.read(8))[0]
    return Parsed(str(path), size, h, entries, trailer)


@dataclass
class Check:
    """The outcome of one assertion. Taught in day16_3."""
    number: int | str
    what: str
    ok: bool
    detail: str


def _formula(e: Entry) -> tuple[int | None, str]:
    q = Q.QTYPES.get(e.qtype)
    if q is None:
        return None, f"unknown qtype {e.qtype}"
    try:
        want = q.nbytes(e.rows, e.cols)
    except ValueError as err:
        return None, str(err)
    if q.block_size == 1:
        return want, f"{e.rows:,} × {e.cols:,} × {q.block_bytes} = {want:,}"
    return want, f"{e.rows:,} × {e.cols:,} / {q.block_size} × {q.block_bytes} = {want:,} ({q.name})"


def assertions(p: Parsed) -> list[Check]:
    """The article's five assertions plus the size invariants (dir sum, file_len + 8 == size). Taught in day16_3."""
    es, h = p.entries, p.header
    out = []
    bad = [e for e in es if e.offset % 64]
    out.append(Check(1, "offset % 64 == 0 for every entry", not bad,
                     "all aligned" if not bad else f"{len(bad)} misaligned, first [{bad[0].index}] {bad[0].name} "
                                                   f"offset {bad[0].offset:,}"))
    broken = [(a, b) for a, b in zip(es, es[1:]) if b.offset != F.round_up(a.end, F.TENSOR_ALIGN)]
    out.append(Check(2, "offset[i] == round64(offset[i-1] + bytes[i-1])", not broken,
                     f"{len(es) - 1} links chained" if not broken else
                     f"[{broken[0][1].index}] {broken[0][1].name} starts at {broken[0][1].offset:,}, "
                     f"expected {F.round_up(broken[0][0].end, 64):,}"))
    first = es[0].offset if es else None
    out.append(Check(3, "entry[0].offset == data_offset", first == h["data_offset"],
                     f"{first} vs data_offset {h['data_offset']:,}"))
    last = es[-1].end if es else None
    out.append(Check(4, "last entry's offset + bytes == file_len", last == h["file_len"],
                     f"{last if last is None else format(last, ',')} vs file_len {h['file_len']:,}"))
    wrong, samples = [], []
    for e in es:
        want, text = _formula(e)
        if want != e.nbytes:
            wrong.append(f"[{e.index}] {e.name}: bytes {e.nbytes:,}, formula {text}")
        if e.name in ("q4_lm", "v_q8_qkv", "attn_norm"):
            samples.append(f"{e.name}: {text}")
    out.append(Check(5, "bytes == qtype formula (every entry)", not wrong,
                     "; ".join(samples) if not wrong else wrong[0]))
    total = sum(e.nbytes for e in es)
    area = h["file_len"] - h["data_offset"]
    out.append(Check("sum", "directory bytes sum == file_len - data_offset", total == area,
                     f"{total:,} vs {area:,}" + ("" if total == area else " (padding between tensors)")))
    t = F.TAG_BYTES if h["flags"] & F.FLAG["ENCRYPTED"] else F.TRAILER_BYTES   # HMAC-SM3 tag or FNV-1a 64
    if p.header_only:
        out.append(Check("size", f"file size == file_len + {t}", True,
                         f"header-only file ({p.size:,} B): the full file would be {h['file_len'] + t:,} B"))
    else:
        out.append(Check("size", f"file size == file_len + {t}", p.size == h["file_len"] + t,
                         f"{p.size:,} vs {h['file_len'] + t:,}"))
    return out


def report(p: Parsed, checks: list[Check] | None = None) -> str:
    """The article's parser output: one header line, one line per entry, then the assertions. Taught in day16_3."""
    h = p.header
    lines = [f"v{h['version']} n={h['n_tensors']} flags=0x{h['flags']:03x} ({F.describe_flags(h['flags'])}) "
             f"data_off={h['data_offset']} file_len={h['file_len']} size={p.size}"]
    for e in p.entries:
        lines.append(f"[{e.index:2}] {e.name:<18} qt={e.qtype} {e.rows}x{e.cols} off={e.offset} bytes={e.nbytes}")
    if p.trailer is not None and h["flags"] & F.FLAG["ENCRYPTED"]:
        lines.append("trailer: 32-byte HMAC-SM3 tag (encrypted file; check it with `vqf verify --key-file`)")
    elif p.trailer is not None:
        lines.append(f"trailer (FNV-1a 64 stored) = {p.trailer:016x}")
    for c in checks if checks is not None else assertions(p):
        lines.append(f"{'PASS' if c.ok else 'FAIL'} ({c.number}) {c.what}: {c.detail}")
    return "\n".join(lines)


def header_report(p: Parsed) -> str:
    """Every header field: offset, name, value. Taught in day16_2."""
    lines = []
    for f in F.HEADER_FIELDS + (F.ROPE_FIELDS if "rope_factor" in p.header else ()):
        v = p.header[f.name]
        if f.name in ("magic", "sig_magic"):
            shown = repr(v)
        elif isinstance(v, bytes):
            shown = v.hex() if f.name == "source_sha256" or not v.strip(b"\0").isascii() else repr(v.rstrip(b"\0"))
        elif f.name == "flags":
            shown = f"0x{v:x} ({F.describe_flags(v)})"
        else:
            shown = repr(v)
        lines.append(f"{f.offset:4}  {f.ctype:<9} {f.name:<31} {shown}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------- od
def od(data: bytes, start: int = 0) -> str:
    """Format ``data`` (which starts at file offset ``start``) exactly as ``od -A x -t x1`` does:
    16 bytes a line, repeated lines folded into ``*``, the end address on the last line. Taught in day16_3."""
    lines, prev, folded = [], None, False
    for i in range(0, len(data), 16):
        chunk = data[i:i + 16]
        if chunk == prev and len(chunk) == 16:
            if not folded:
                lines.append("*")
                folded = True
            continue
        folded = False
        prev = chunk
        lines.append(f"{start + i:06x}" + "".join(f" {b:02x}" for b in chunk))
    lines.append(f"{start + len(data):06x}")
    return "\n".join(lines)


def od_file(path: str | os.PathLike, skip: int, count: int) -> str:
    """``od -A x -t x1 -j skip -N count FILE``. Taught in day16_3."""
    with open(path, "rb") as fh:
        fh.seek(skip)
        return od(fh.read(count), skip)


def entry_fields(raw: bytes, base: int) -> list[tuple[int, str, str, str]]:
    """One 64-byte entry split into (file offset, field, bytes in hex, value) — article 16-3 §3.1. Taught in day16_3."""
    name, qt, r, c, o, b = struct.unpack(F.ENTRY_FORMAT, raw)
    values = {"name": name.split(b"\0")[0].decode("utf-8", "replace"),
              "qtype": f"{qt} = {Q.QTYPES[qt].name}" if qt in Q.QTYPES else f"{qt} (unknown)",
              "rows": f"0x{r:x} = {r:,}", "cols": f"0x{c:x} = {c:,}", "pad": "alignment padding",
              "offset": f"0x{o:x} = {o:,}", "bytes": f"0x{b:x} = {b:,}"}
    out = []
    for f in F.ENTRY_FIELDS:
        seg = raw[f.offset:f.offset + f.size]
        shown = seg.rstrip(b"\0") + b"\0" if f.name == "name" else seg
        out.append((base + f.offset, f.name, " ".join(f"{x:02x}" for x in shown), values[f.name]))
    return out
