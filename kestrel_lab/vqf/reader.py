"""Open a VQF file: mmap it, check it, and hand out zero-copy numpy views by tensor name.

Loading costs a few kilobytes of reading whatever the model's size: the header, the directory, and
``stat``. The kernel pages the weights in when the engine first touches them. The loader checks
everything it can check cheaply — magic, version, flags, the size (``file_len + 8`` must be the
file's size: a truncated copy is caught at once), and each entry: a NUL-terminated name, a known
qtype, ``bytes`` equal to the qtype's formula, 64-byte alignment, ``offset + bytes <= file_len``, no
overlap — and rejects with the file, the field and its byte offset. The full checksum reads the whole
file, so it runs only when asked: ``verify=True`` or ``KESTREL_VQF_CHECK=1``.

Names the layout does not define are ignored (listed in ``unknown``): a newer converter may add
tensors and an older engine still loads the ones it knows (article 16-3's forward compatibility).

Taught in day16_3 (checks) and day17_3 (mmap, zero copy, cold start).
"""
from __future__ import annotations

import contextlib
import mmap
import os
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kestrel_lab import quant as Q
from kestrel_lab import seam
from kestrel_lab.config import ModelConfig
from kestrel_lab.memory_check import check_memory
from kestrel_lab.vqf import format as F
from kestrel_lab.vqf import protect
from kestrel_lab.vqf.checksum import hash_ranges, warm_up as checksum_warm_up
from kestrel_lab.vqf.format import VQFFormatError

ENV_CHECK = "KESTREL_VQF_CHECK"
_NO_DATA = np.empty(0, np.uint8)   # an entry's data until the whole file has been checked


@dataclass
class VQFTensor(F.DirEntry):
    """One directory entry and its bytes in the mapped file. Taught in day17_3."""

    data: np.ndarray = field(repr=False)  # read-only uint8 view of the mmap (no copy)

    @property
    def qtype_name(self) -> str:
        return Q.qtype(self.qtype).name

    def array(self) -> np.ndarray:
        """Typed zero-copy view: F32/F16 → (rows, cols) floats; Q8_0/Q4_0 → uint8 (rows, bytes per row);
        Q4_8X8L → uint8 (rows/8, cols/32, 144), one 144-byte record per 8-row group and block column.
        Taught in day17_3."""
        q = Q.qtype(self.qtype)
        if q is Q.F32:
            return self.data.view("<f4").reshape(self.rows, self.cols)
        if q is Q.F16:
            return self.data.view("<f2").reshape(self.rows, self.cols)
        if q is Q.Q4_8X8L:
            return self.data.reshape(self.rows // 8, self.cols // Q.QK, 8 * q.block_bytes)
        return self.data.reshape(self.rows, self.nbytes // self.rows)

    def dequantize(self) -> np.ndarray:
        """float32 (rows, cols), whatever the storage (a copy). Taught in day17_2."""
        return Q.dequantize(self.data, self.qtype, self.rows, self.cols)


class VQFFile:
    """An opened VQF file. Use ``open_vqf``; close it (or use ``with``) to unmap. Taught in day17_3."""

    def __init__(self, path: Path, mm: mmap.mmap, header: dict, config: ModelConfig, source: dict,
                 tensors: dict[str, VQFTensor], unknown: list[str], missing: list[str], entries: list[VQFTensor],
                 checksum: int, verified: bool):
        self.path = path
        self._mm = mm
        self.header = header
        self.config = config
        self.source = source
        self.tensors = tensors
        self.unknown = unknown
        self.missing = missing
        self.entries = entries
        self.checksum = checksum  # the stored trailer (None in an encrypted file)
        self.verified = verified
        self.tag: bytes | None = None  # an encrypted file's HMAC-SM3 tag (checked before any tensor is handed out)

    @property
    def flags(self) -> int:
        return self.header["flags"]

    @property
    def encrypted(self) -> bool:
        """True for an SM4-encrypted file: its tensors are views of decrypted anonymous memory, not of
        the file. Taught in day26_2."""
        return bool(self.flags & F.FLAG["ENCRYPTED"])

    @property
    def data_offset(self) -> int:
        return self.header["data_offset"]

    @property
    def file_len(self) -> int:
        return self.header["file_len"]

    @property
    def raw(self) -> np.ndarray:
        """The whole file as a read-only uint8 view of the mapping (every tensor's ``data`` is a slice
        of it). Taught in day16_1."""
        if self._mm is None:
            raise ValueError(f"{self.path}: closed")
        return np.frombuffer(self._mm, dtype=np.uint8)

    def __getitem__(self, name: str) -> VQFTensor:
        try:
            return self.tensors[name]
        except KeyError:
            raise KeyError(f"{self.path}: no tensor {name!r} (has {len(self.tensors)}: "
                           f"{', '.join(list(self.tensors)[:6])} …)") from None

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def release(self, names) -> int:
        """Give back the decrypted pages of tensors a caller has copied and will not read again (an
        encrypted file only: its tensors live in anonymous memory, a plain file's pages are the page
        cache's). The names leave ``tensors``; returns the bytes given back. Taught in day26_3."""
        if not self.encrypted or self._mm is None:
            return 0
        page, freed = mmap.PAGESIZE, 0
        for name in names:
            t = self.tensors.pop(name, None)
            if t is None:
                continue
            lo, hi = -(-t.offset // page) * page, (t.offset + t.nbytes) // page * page
            t.data = t.data[:0]
            if hi > lo:
                self._mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)   # private anonymous: the pages are freed
                freed += hi - lo
        return freed

    def close(self) -> None:
        """Drop the views and unmap. If arrays obtained from this file are still alive, the mapping
        stays until they are garbage-collected (numpy holds it); nothing is invalidated under them."""
        self.tensors = {}
        self.entries = []
        mm, self._mm = self._mm, None
        if mm is not None:
            with contextlib.suppress(BufferError):
                mm.close()

    def __enter__(self) -> "VQFFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"VQFFile({str(self.path)!r}, {self.config.arch}, {len(self.entries)} tensors, "
                f"file_len={self.file_len:,}, flags={F.describe_flags(self.flags)})")


def _env_verify() -> bool:
    return os.environ.get(ENV_CHECK, "").strip() not in ("", "0", "false", "no")


def open_vqf(path: str | os.PathLike, verify: bool | None = None, key_file: str | os.PathLike | None = None) -> VQFFile:
    """Map ``path``, check header and directory, return the tensors by name.

    ``verify``: also recompute the FNV-1a 64 over directory + data (reads the whole file); None →
    the ``KESTREL_VQF_CHECK`` environment variable decides. An encrypted file (flag ENCRYPTED) needs
    ``key_file`` (or ``KESTREL_KEY_FILE``): its HMAC-SM3 tag is always checked while the data area
    is decrypted into anonymous memory, and its tensors are views of that memory
    (``vqf.protect.decrypt_image``). Raises ``VQFFormatError`` naming the file, the field and its
    byte offset. Taught in day16_3, day17_3 and day26_2.
    """
    path = Path(path)
    if verify is None:
        verify = _env_verify()
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size < F.DIR_OFFSET:
            raise VQFFormatError(f"{path}: file is {size} bytes, shorter than the {F.DIR_OFFSET}-byte header "
                                 f"(offset {size}: truncated or not a VQF file)")
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        return _parse(path, mm, size, verify, key_file)
    except BaseException:
        # Views made before the failure live on in the traceback's frames; numpy then holds the
        # mapping and frees it with them.
        with contextlib.suppress(BufferError):
            mm.close()
        raise


def _parse(path: Path, mm: mmap.mmap, size: int, verify: bool, key_file=None) -> VQFFile:
    where = str(path)

    def bad(field_name: str, offset: int, why: str):
        raise VQFFormatError(f"{where}: field {field_name} at offset {offset}: {why}")

    def hbad(name: str, why: str):
        bad(name, F.HEADER_FIELD[name].offset, why)

    buf = memoryview(mm)
    try:
        h = F.unpack_header_raw(buf[:F.DIR_OFFSET])     # header, VQFSig and the RoPE block
        mine = seam.get("vqf.parse_header")        # a student's piece (``kestrel_lab.seam``): its fields win
        if mine is not None:
            h.update(_piece_header(mine(bytes(buf[:F.DIR_OFFSET])), where))
    finally:
        buf.release()
    flags = h["flags"]
    _check_identity(where, h, hbad)
    n, dir_end, d0, fl = _check_extent(h, size, hbad)
    source, config = _check_signature(where, h, hbad)
    _check_padding(mm, h, dir_end, d0, bad)
    entries = _parse_directory(where, mm, n, d0, fl, bad)
    repacked = any(e.qtype == Q.Q4_8X8L.id for e in entries)
    if bool(flags & F.FLAG["REPACKED_8X8"]) != repacked:
        hbad("flags", f"REPACKED_8X8 (0x8) is {'set' if flags & 8 else 'clear'} but "
                      f"{'a' if repacked else 'no'} tensor is Q4_8X8L")
    config, tensors, unknown, missing = _attach(where, config, entries, bad)
    if flags & F.FLAG["ENCRYPTED"]:
        return _decrypted(path, mm, h, config, source, tensors, unknown, missing, entries, key_file)
    stored = struct.unpack_from("<Q", mm, fl)[0]
    if verify:
        arr = np.frombuffer(mm, dtype=np.uint8)
        computed = hash_ranges(arr, n, d0, fl)
        del arr
        if computed != stored:
            bad("trailer (FNV-1a 64)", fl, f"stored {stored:016x}, computed {computed:016x}: "
                                           f"the directory or the data area is corrupt")
    # Views of the mapping only now that every check passed: a refused file leaves no view behind, so
    # its mapping is closed at once (not when the garbage collector gets to the traceback's frames).
    whole = np.frombuffer(mm, dtype=np.uint8)
    for e in entries:
        e.data = whole[e.offset:e.offset + e.nbytes]
    return VQFFile(path, mm, h, config, source, tensors, unknown, missing, entries, stored, bool(verify))


def _check_identity(where: str, h: dict, hbad) -> None:
    """Magic, version, known flag bits, and the flags' and encryption fields' agreement."""
    if h["magic"] != F.MAGIC:
        hbad("magic", f"{h['magic']!r} is not {F.MAGIC!r}: not a VQF file")
    if h["version"] != F.VERSION:
        hbad("version", f"{h['version']} is not supported (this reader reads version {F.VERSION})")
    flags = h["flags"]
    if flags & ~F.KNOWN_FLAGS:
        hbad("flags", f"0x{flags:x} sets unknown bits 0x{flags & ~F.KNOWN_FLAGS:x} (known: "
                      f"{', '.join(f'{f.name}=0x{f.mask:x}' for f in F.FLAGS)})")
    protect.check_header(where, h)   # FNV_TRAILER xor ENCRYPTED; the encryption fields (388..432)


def _check_extent(h: dict, size: int, hbad) -> tuple[int, int, int, int]:
    """The directory and data area inside a file of ``size`` bytes: (n_tensors, end of the directory,
    data_offset, file_len)."""
    trailer = protect.trailer_bytes(h["flags"])
    n = h["n_tensors"]
    dir_end = F.DIR_OFFSET + F.ENTRY_SIZE * n
    if n > F.MAX_TENSORS:
        hbad("n_tensors", f"{n:,} exceeds the format's limit of {F.MAX_TENSORS:,}")
    if dir_end > size:
        hbad("n_tensors", f"{n:,} entries end at byte {dir_end:,}, past the file's {size:,} bytes")
    for name, want in (("dir_offset", F.DIR_OFFSET), ("entry_size", F.ENTRY_SIZE)):
        if h[name] != want:
            hbad(name, f"{h[name]} must be {want} in version {F.VERSION}")
    d0, fl = h["data_offset"], h["file_len"]
    if d0 % F.PAGE:
        hbad("data_offset", f"{d0:,} is not a multiple of {F.PAGE}")
    if d0 < dir_end:
        hbad("data_offset", f"{d0:,} is inside the directory (which ends at {dir_end:,})")
    if d0 > size:
        hbad("data_offset", f"{d0:,} is past the end of the file ({size:,} bytes)")
    if fl < d0:
        hbad("file_len", f"{fl:,} is before data_offset {d0:,}")
    if fl + trailer != size:
        hbad("file_len", f"file_len + {trailer} = {fl + trailer:,} but the file has {size:,} bytes "
                         f"({'truncated' if size < fl + trailer else 'trailing bytes'})")
    return n, dir_end, d0, fl


def _check_signature(where: str, h: dict, hbad) -> tuple[dict, ModelConfig]:
    """The VQFSig block: its magic and version, then the source and the model configuration it holds
    (which must agree with the VISION flag)."""
    if h["sig_magic"] != F.SIG_MAGIC:
        hbad("sig_magic", f"{h['sig_magic']!r} is not {F.SIG_MAGIC!r}")
    if h["sig_version"] != F.SIG_VERSION:
        hbad("sig_version", f"{h['sig_version']} is not supported (expected {F.SIG_VERSION})")
    source = F.source_from_header(h, where)
    config = F.config_from_header(h, where)
    flags = h["flags"]
    if bool(flags & F.FLAG["VISION"]) != (config.vision is not None):
        hbad("flags", f"VISION (0x4) is {'set' if flags & 4 else 'clear'} but vision_depth is "
                      f"{h['vision_depth']}")
    return source, config


def _check_padding(mm: mmap.mmap, h: dict, dir_end: int, d0: int, bad) -> None:
    """Padding that is not hashed must be zero (so a file has one valid byte image): between the directory
    and the data, and the RoPE block after VQFSig when the file's RoPE is plain (``rope_type`` 0)."""
    pads = [(dir_end, d0, "padding between directory and data")]
    if not h["rope_type"]:
        pads.insert(0, (F.ROPE_OFFSET, F.ROPE_END, "RoPE block (rope_type is 0)"))
    for lo, hi, what in pads:
        seg = mm[lo:hi]
        if seg.strip(b"\x00"):
            bad(what, lo + len(seg) - len(seg.lstrip(b"\x00")), "not zero")


def _attach(where: str, config: ModelConfig, entries: list[VQFTensor],
            bad) -> tuple[ModelConfig, dict[str, VQFTensor], list[str], list[str]]:
    """Attach the entries by name: a known name must have the shape the configuration implies and a
    qtype some ``--quant`` gives it. Returns the configuration the directory completes (an MoE file's
    dense layers), the known tensors by name, the unknown names and the missing ones."""
    from kestrel_lab.vqf.layout import QUANTS, config_for_directory, plan

    config = config_for_directory(config, [e.name for e in entries])  # an MoE file's dense layers
    try:
        expected = {s.name: s for s in plan(config, "f32")}   # F32 takes any shape
    except ValueError as e:
        raise VQFFormatError(f"{where}: the header's model configuration (bytes 16..184) gives no valid "
                             f"layout: {e}") from None
    # the qtypes a converter may give each entry: the union over every --quant that can hold the shapes
    # (a quantized format needs its block size; the directory's own entries were checked against theirs)
    allowed = {}
    for quant in QUANTS:
        try:
            specs = plan(config, quant)
        except ValueError:
            continue
        for s in specs:
            allowed.setdefault(s.name, set()).add(s.qtype)
    tensors, unknown = {}, []
    for e in entries:
        s = expected.get(e.name)
        if s is None:
            unknown.append(e.name)
            continue
        if (e.rows, e.cols) != (s.rows, s.cols):
            bad(f"entry[{e.index}] ({e.name}).rows/cols", F.DIR_OFFSET + F.ENTRY_SIZE * e.index + 36,
                f"{e.rows}×{e.cols}, but the header's configuration implies {s.rows}×{s.cols}")
        if e.qtype not in allowed[e.name]:
            bad(f"entry[{e.index}] ({e.name}).qtype", F.DIR_OFFSET + F.ENTRY_SIZE * e.index + 32,
                f"{Q.qtype(e.qtype).name}, but a converter stores {e.name} as "
                f"{' or '.join(sorted(Q.qtype(q).name for q in allowed[e.name]))}")
        tensors[e.name] = e
    missing = [name for name in expected if name not in tensors]
    return config, tensors, unknown, missing


def _check_layout(h: dict, size: int, hbad) -> tuple[int, int, int, int]:
    """(n_tensors, end of the directory, data_offset, file_len), each checked against the file's size."""
    trailer = protect.trailer_bytes(h["flags"])
    n = h["n_tensors"]
    dir_end = F.DIR_OFFSET + F.ENTRY_SIZE * n
    if n > F.MAX_TENSORS:
        hbad("n_tensors", f"{n:,} exceeds the format's limit of {F.MAX_TENSORS:,}")
    if dir_end > size:
        hbad("n_tensors", f"{n:,} entries end at byte {dir_end:,}, past the file's {size:,} bytes")
    for name, want in (("dir_offset", F.DIR_OFFSET), ("entry_size", F.ENTRY_SIZE)):
        if h[name] != want:
            hbad(name, f"{h[name]} must be {want} in version {F.VERSION}")
    d0, fl = h["data_offset"], h["file_len"]
    if d0 % F.PAGE:
        hbad("data_offset", f"{d0:,} is not a multiple of {F.PAGE}")
    if d0 < dir_end:
        hbad("data_offset", f"{d0:,} is inside the directory (which ends at {dir_end:,})")
    if d0 > size:
        hbad("data_offset", f"{d0:,} is past the end of the file ({size:,} bytes)")
    if fl < d0:
        hbad("file_len", f"{fl:,} is before data_offset {d0:,}")
    if fl + trailer != size:
        hbad("file_len", f"file_len + {trailer} = {fl + trailer:,} but the file has {size:,} bytes "
                         f"({'truncated' if size < fl + trailer else 'trailing bytes'})")
    return n, dir_end, d0, fl


def _attach(where: str, config, entries, bad):
    """(config, tensors, unknown, missing): the entries the configuration names, by name — each with the
    shape it implies and a qtype some converter gives it — the names it does not know, and those it lacks."""
    from kestrel_lab.vqf.layout import QUANTS, config_for_directory, plan

    config = config_for_directory(config, [e.name for e in entries])  # an MoE file's dense layers
    try:
        expected = {s.name: s for s in plan(config, "f32")}   # F32 takes any shape
    except ValueError as e:
        raise VQFFormatError(f"{where}: the header's model configuration (bytes 16..184) gives no valid "
                             f"layout: {e}") from None
    # the qtypes a converter may give each entry: the union over every --quant that can hold the shapes
    # (a quantized format needs its block size; the directory's own entries were checked against theirs)
    allowed = {}
    for quant in QUANTS:
        try:
            specs = plan(config, quant)
        except ValueError:
            continue
        for s in specs:
            allowed.setdefault(s.name, set()).add(s.qtype)
    tensors, unknown = {}, []
    for e in entries:
        s = expected.get(e.name)
        if s is None:
            unknown.append(e.name)
            continue
        if (e.rows, e.cols) != (s.rows, s.cols):
            bad(f"entry[{e.index}] ({e.name}).rows/cols", F.DIR_OFFSET + F.ENTRY_SIZE * e.index + 36,
                f"{e.rows}×{e.cols}, but the header's configuration implies {s.rows}×{s.cols}")
        if e.qtype not in allowed[e.name]:
            bad(f"entry[{e.index}] ({e.name}).qtype", F.DIR_OFFSET + F.ENTRY_SIZE * e.index + 32,
                f"{Q.qtype(e.qtype).name}, but a converter stores {e.name} as "
                f"{' or '.join(sorted(Q.qtype(q).name for q in allowed[e.name]))}")
        tensors[e.name] = e
    missing = [name for name in expected if name not in tensors]
    return config, tensors, unknown, missing


def _decrypted(path, mm, h, config, source, tensors, unknown, missing, entries, key_file) -> VQFFile:
    """An encrypted file, checked like a plain one: authenticate, decrypt into anonymous memory, and
    point every entry at its plaintext (``vqf.protect``)."""
    # the plaintext goes to anonymous memory: refuse before allocating it if it cannot fit
    check_memory({"decrypted data area": h["file_len"] - h["data_offset"]}, str(path),
                 hint="an encrypted file is decrypted into memory; open the plain file instead (mmap)")
    image = protect.decrypt_image(str(path), mm, h, key_file)
    whole = np.frombuffer(image, dtype=np.uint8)
    whole.setflags(write=False)
    for e in entries:
        e.data = whole[e.offset:e.offset + e.nbytes]
    tag = bytes(mm[h["file_len"]:h["file_len"] + protect.TAG_BYTES])
    with contextlib.suppress(BufferError):
        mm.close()  # the file's pages are no longer needed: every view is of the decrypted copy
    vf = VQFFile(path, image, h, config, source, tensors, unknown, missing, entries, None, True)
    vf.tag = tag
    return vf


def _piece_header(fields, where: str) -> dict:
    """A student's ``parse_header`` result as the header fields it stands for (ints), or a clear error."""
    keys = ("version", "flags", "n_tensors", "data_offset", "file_len")
    if not isinstance(fields, dict) or any(not isinstance(fields.get(k), int) for k in keys):
        raise VQFFormatError(f"{where}: piece vqf.parse_header must return a dict of ints with {', '.join(keys)}, "
                             f"got {fields!r:.200}")
    return {k: fields[k] for k in keys}


def _directory_rows(mm: mmap.mmap, n: int, where: str) -> list[tuple]:
    """The n directory entries as (name bytes or str, qtype, rows, cols, offset, nbytes): our ``struct`` read,
    or a student's ``vqf.parse_directory`` piece (``kestrel_lab.seam``)."""
    mine = seam.get("vqf.parse_directory")
    if mine is None:
        return [struct.unpack_from(F.ENTRY_FORMAT, mm, F.DIR_OFFSET + F.ENTRY_SIZE * i) for i in range(n)]
    rows = [tuple(r) for r in mine(bytes(mm[F.DIR_OFFSET:F.DIR_OFFSET + F.ENTRY_SIZE * n]), n)]
    if len(rows) != n or any(len(r) != 6 for r in rows):
        raise VQFFormatError(f"{where}: piece vqf.parse_directory must return {n} tuples of 6 fields")
    return rows


def _parse_directory(where: str, mm: mmap.mmap, n: int, d0: int, fl: int, bad) -> list[VQFTensor]:
    entries, seen = [], {}
    for i, (raw_name, qt, rows, cols, offset, nbytes) in enumerate(_directory_rows(mm, n, where)):
        base = F.DIR_OFFSET + F.ENTRY_SIZE * i
        label = f"entry[{i}]"
        name = raw_name if isinstance(raw_name, str) else F.unpack_str(raw_name, f"{label}.name", base, where)
        if not name:
            bad(f"{label}.name", base, "empty name")
        label = f"entry[{i}] ({name})"
        if name in seen:
            bad(f"{label}.name", base, f"duplicate of entry[{seen[name]}]: a name may appear once")
        seen[name] = i
        if any(mm[base + 44:base + 48]):
            bad(f"{label}.pad", base + 44, "padding bytes are not zero")
        if qt not in Q.QTYPES:
            bad(f"{label}.qtype", base + 32, f"unknown qtype {qt} (known: "
                                            f"{', '.join(f'{k}={v.name}' for k, v in Q.QTYPES.items())})")
        if rows == 0 or cols == 0:
            bad(f"{label}.rows/cols", base + 36, f"{rows}×{cols}: empty tensor")
        try:
            want = Q.tensor_bytes(qt, rows, cols)
        except ValueError as e:
            bad(f"{label}.rows/cols", base + 36, str(e))
        if nbytes != want:
            bad(f"{label}.bytes", base + 56, f"{nbytes:,} but {Q.QTYPES[qt].name} {rows}×{cols} takes {want:,}")
        if offset % F.TENSOR_ALIGN:
            bad(f"{label}.offset", base + 48, f"{offset:,} is not {F.TENSOR_ALIGN}-byte aligned")
        if offset < d0:
            bad(f"{label}.offset", base + 48, f"{offset:,} is before data_offset {d0:,}")
        if offset + nbytes > fl:
            bad(f"{label}.offset", base + 48, f"offset + bytes = {offset + nbytes:,} is past file_len {fl:,}")
        entries.append(VQFTensor(i, name, qt, rows, cols, offset, nbytes, _NO_DATA))  # views come last
    prev = None
    for e in sorted(entries, key=lambda e: e.offset):
        if prev is not None and e.offset < prev.offset + prev.nbytes:
            bad(f"entry[{e.index}] ({e.name}).offset", F.DIR_OFFSET + F.ENTRY_SIZE * e.index + 48,
                f"{e.offset:,} overlaps entry[{prev.index}] ({prev.name}), which ends at {prev.offset + prev.nbytes:,}")
        prev = e
    return entries


def read_header(path: str | os.PathLike) -> dict:
    """Just the checked header fields of a file (no directory views kept)."""
    with open_vqf(path, verify=False) as vf:
        return dict(vf.header)


def verify_file(path: str | os.PathLike) -> tuple[int, int, float]:
    """(computed, stored, seconds) for a plain VQF file; the header is checked first (``open_vqf``).

    Seconds cover the hash only (directory + data area read through the mmap). Taught in day16_3.
    """
    with open_vqf(path, verify=False) as vf:
        h = vf.header
        n, d0, fl = h["n_tensors"], h["data_offset"], h["file_len"]
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        arr = np.frombuffer(mm, dtype=np.uint8)
        checksum_warm_up()  # the timing is of hashing, not of compiling or loading the kernel
        t0 = time.perf_counter()
        computed = hash_ranges(arr, n, d0, fl)
        seconds = time.perf_counter() - t0
        stored = struct.unpack_from("<Q", mm, fl)[0]
        del arr
    return computed, stored, seconds
