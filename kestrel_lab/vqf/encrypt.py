"""Encrypt, decrypt and verify whole VQF files: ``kestrel-lab vqf encrypt | decrypt | verify --key-file``.

``encrypt_file`` streams a plain file into an encrypted one in one pass: it checks the input's FNV-1a
64 on the way (a corrupt file is refused, not sealed with a valid tag), encrypts the data area with
SM4-CTR and MACs everything before the tag. ``decrypt_file`` streams the other way, checks the tag
at the end and renames the output into place only if it matches: the result is bit-identical to the
original plain file (flags, zero encryption fields, FNV-1a trailer). Both write a temporary file
beside the target and rename it (``kestrel_lab.atomic``). The scheme is in ``vqf.protect``.

Taught in day26_2 (encrypt, decrypt) and day26_3 (verify; what it costs is ``bench.protect``).
"""
from __future__ import annotations

import contextlib
import mmap
import os
import struct
import time
from pathlib import Path

import numpy as np
from cryptography.exceptions import InvalidSignature

from kestrel_lab import seam
from kestrel_lab.atomic import atomic_write
from kestrel_lab.vqf import format as F
from kestrel_lab.vqf import protect as P
from kestrel_lab.vqf.checksum import fnv1a64
from kestrel_lab.vqf.format import VQFFormatError
from kestrel_lab.vqf.reader import open_vqf


def _header_of(path: Path) -> dict:
    """The checked header of a file, plain or encrypted, without decrypting anything."""
    with open(path, "rb") as fh:
        raw = fh.read(F.HEADER_END)
    h = F.unpack_header_raw(raw) if len(raw) == F.HEADER_END else None
    if h is None or h["magic"] != F.MAGIC:
        raise VQFFormatError(f"{path}: field magic at offset 0: not a VQF file")
    return h


@contextlib.contextmanager
def _mapped(path: Path):
    """A read-only mapping of ``path``, unmapped on exit unless views of it are still alive (an
    exception's traceback holds them: numpy then frees the mapping with them)."""
    with open(path, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        yield mm
    finally:
        with contextlib.suppress(BufferError):
            mm.close()


def is_encrypted(path: str | os.PathLike) -> bool:
    """Whether a VQF file has the ENCRYPTED flag (reads its first 432 bytes only). Taught in day26_2."""
    return bool(_header_of(Path(path))["flags"] & F.FLAG["ENCRYPTED"])


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except FileNotFoundError:
        return False


def encrypt_file(src: str | os.PathLike, dst: str | os.PathLike, key_file: str | os.PathLike) -> dict:
    """Encrypt the plain VQF ``src`` into ``dst`` with the key in ``key_file``; returns
    {bytes, seconds, data_bytes, key_id}. Taught in day26_2."""
    src, dst = Path(src), Path(dst)
    key = P.read_key_file(key_file)
    if _same_file(src, dst):
        raise ValueError(f"{dst}: the output would overwrite the input {src}; pick another name")
    if is_encrypted(src):
        raise VQFFormatError(f"{src}: field flags at offset 8: already ENCRYPTED")
    with open_vqf(src, verify=False) as vf:   # every structural check of a plain file; no data read
        h = dict(vf.header)
        stored_fnv = vf.checksum
    n, d0, fl = h["n_tensors"], h["data_offset"], h["file_len"]
    prot = P.new_protection(key)
    keys = P.derive_keys(key, prot.salt)
    t0 = time.perf_counter()
    with _mapped(src) as mm:
        plain = np.frombuffer(mm, dtype=np.uint8)
        head = bytearray(plain[:d0])
        flags = (h["flags"] & ~F.FLAG["FNV_TRAILER"]) | F.FLAG["ENCRYPTED"]
        struct.pack_into("<I", head, F.HEADER_FIELD["flags"].offset, flags)
        head[P.PROTECTION_OFFSET:F.HEADER_END] = prot.pack()
        mac = P.new_mac(keys.mac)
        mac.update(head)
        fnv = fnv1a64(plain[F.DIR_OFFSET:F.DIR_OFFSET + F.ENTRY_SIZE * n])
        enc = P.ctr_cipher(keys.enc, prot.iv, 0)
        buf = np.empty(min(P.CHUNK, max(fl - d0, 1)), np.uint8)
        chunk = ct = None
        with atomic_write(dst) as out:
            out.write(head)
            for lo in range(d0, fl, P.CHUNK):
                chunk = plain[lo:min(fl, lo + P.CHUNK)]
                fnv = fnv1a64(chunk, fnv)
                ct = buf[:chunk.size]
                enc.update_into(chunk, ct)
                mac.update(ct)
                out.write(memoryview(ct))
            if fnv != stored_fnv:
                raise VQFFormatError(f"{src}: field trailer (FNV-1a 64) at offset {fl}: stored {stored_fnv:016x}, "
                                     f"computed {fnv:016x}: the input is corrupt; refusing to encrypt it")
            out.write(mac.finalize())
        del plain, chunk, ct
    return {"bytes": fl + P.TAG_BYTES, "data_bytes": fl - d0, "seconds": time.perf_counter() - t0,
            "key_id": prot.key_id.hex()}


def decrypt_file(src: str | os.PathLike, dst: str | os.PathLike, key_file: str | os.PathLike) -> dict:
    """Decrypt the encrypted VQF ``src`` into the plain file ``dst`` (bit-identical to what was
    encrypted), renamed into place only when the tag matches; returns {bytes, seconds, data_bytes}.
    Taught in day26_2."""
    src, dst = Path(src), Path(dst)
    if _same_file(src, dst):
        raise ValueError(f"{dst}: the output would overwrite the input {src}; pick another name")
    h = _checked_encrypted_header(src)
    prot = P.Protection.of_header(h)
    keys = P.derive_keys(P.key_for(str(src), prot, key_file), prot.salt)
    n, d0, fl = h["n_tensors"], h["data_offset"], h["file_len"]
    t0 = time.perf_counter()
    with _mapped(src) as mm:
        ct_all = np.frombuffer(mm, dtype=np.uint8)
        head = bytearray(ct_all[:d0])
        mac = P.new_mac(keys.mac)
        mac.update(head)
        struct.pack_into("<I", head, F.HEADER_FIELD["flags"].offset,
                         (h["flags"] & ~F.FLAG["ENCRYPTED"]) | F.FLAG["FNV_TRAILER"])
        head[P.PROTECTION_OFFSET:F.HEADER_END] = bytes(F.HEADER_END - P.PROTECTION_OFFSET)
        fnv = fnv1a64(ct_all[F.DIR_OFFSET:F.DIR_OFFSET + F.ENTRY_SIZE * n])
        dec = P.ctr_cipher(keys.enc, prot.iv, 0)
        buf = np.empty(min(P.CHUNK, max(fl - d0, 1)), np.uint8)
        tag = bytes(ct_all[fl:fl + P.TAG_BYTES])
        chunk = pt = None
        with atomic_write(dst) as out:
            out.write(head)
            for lo in range(d0, fl, P.CHUNK):
                chunk = ct_all[lo:min(fl, lo + P.CHUNK)]
                mac.update(chunk)
                pt = buf[:chunk.size]
                dec.update_into(chunk, pt)
                fnv = fnv1a64(pt, fnv)
                out.write(memoryview(pt))
            try:
                mac.verify(tag)   # before the rename: a forged file never becomes a plain one
            except InvalidSignature:
                raise P.tag_error(str(src), fl) from None
            out.write(struct.pack("<Q", fnv))
        del ct_all, chunk, pt
    return {"bytes": fl + F.TRAILER_BYTES, "data_bytes": fl - d0, "seconds": time.perf_counter() - t0}


def _checked_encrypted_header(path: Path) -> dict:
    """Every structural check of ``open_vqf`` on an encrypted file, without decrypting: the checks run
    on the header and directory; the decryption step is reached only with a key."""
    h = _header_of(path)
    if not h["flags"] & F.FLAG["ENCRYPTED"]:
        raise VQFFormatError(f"{path}: field flags at offset 8: not ENCRYPTED (a plain file needs no key)")
    P.check_header(str(path), h)
    size = path.stat().st_size
    if h["file_len"] + P.TAG_BYTES != size:
        raise VQFFormatError(f"{path}: field file_len at offset {F.HEADER_FIELD['file_len'].offset}: file_len + "
                             f"{P.TAG_BYTES} = {h['file_len'] + P.TAG_BYTES:,} but the file has {size:,} bytes "
                             f"({'truncated' if size < h['file_len'] + P.TAG_BYTES else 'trailing bytes'})")
    return h


def verify_file(path: str | os.PathLike, key_file: str | os.PathLike) -> float:
    """Check an encrypted file's HMAC-SM3 tag (reads the whole file, decrypts nothing); returns the
    seconds it took, raises ``VQFProtectionError`` on a mismatch. Taught in day26_3."""
    path = Path(path)
    h = _checked_encrypted_header(path)
    with _mapped(path) as mm:
        t0 = time.perf_counter()
        P.verify_tag(str(path), mm, h, key_file)
        return time.perf_counter() - t0


def decrypt_tensor(path: str | os.PathLike, name: str, key_file: str | os.PathLike) -> np.ndarray:
    """One tensor's plaintext bytes, decrypted alone by positioning CTR at its offset — after the
    tag over the whole file has been checked (tag before use). Taught in day26_2."""
    path = Path(path)
    h = _checked_encrypted_header(path)
    prot = P.Protection.of_header(h)
    keys = P.derive_keys(P.key_for(str(path), prot, key_file), prot.salt)
    with _mapped(path) as mm:
        P.verify_tag(str(path), mm, h, key_file)
        for i in range(h["n_tensors"]):
            raw, qt, rows, cols, off, nb = struct.unpack_from(F.ENTRY_FORMAT, mm, F.DIR_OFFSET + F.ENTRY_SIZE * i)
            if raw.rstrip(b"\x00").decode("utf-8", "replace") == name:
                ct = np.frombuffer(mm, dtype=np.uint8, count=nb, offset=off)
                mine = seam.get("protect.sm4_ctr")   # a student's piece (``kestrel_lab.seam``), else ours
                out = (P.sm4_ctr(keys.enc, prot.iv, ct, off - h["data_offset"]) if mine is None else
                       np.frombuffer(bytes(mine(keys.enc, prot.iv, ct.tobytes(), off - h["data_offset"])), np.uint8))
                del ct
                return out
    raise KeyError(f"{path}: no tensor {name!r}")


def files_equal(a: Path, b: Path, chunk: int = 16 << 20) -> bool:
    if a.stat().st_size != b.stat().st_size:
        return False
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            x, y = fa.read(chunk), fb.read(chunk)
            if x != y:
                return False
            if not x:
                return True


__all__ = ["encrypt_file", "decrypt_file", "verify_file", "decrypt_tensor", "is_encrypted", "files_equal"]
