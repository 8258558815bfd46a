"""Weight protection for VQF: SM4-CTR encryption of the data area and an HMAC-SM3 tag over the file.

The scheme (algorithm id 1 in the header's ``enc_alg``; article 16-3 reserves the mode):

- **Key**: one random 16-byte key in a key file (32 hex characters and a newline, mode 0600). It is
  never stored in the VQF file; the file stores its **key id**, the first 8 bytes of SM3(key), so a
  wrong key is told apart from a modified file before anything is decrypted.
- **Two keys from one** (HKDF-SM3, RFC 5869 with SM3): a fresh random 16-byte salt per file gives
  ``K_enc`` (16 B, SM4) and ``K_mac`` (32 B, HMAC-SM3) with different ``info`` labels, so the
  cipher and the MAC never share a key and no two files share either.
- **Encryption**: SM4-128 in CTR mode over the data area ``[data_offset, file_len)`` — the tensors
  and the zero padding between them. The header (the model configuration) and the directory stay in
  plaintext: the loader checks every offset and size before it touches a byte of data, and one
  tensor can be decrypted alone. Byte ``p`` of the data area (``p`` a multiple of 16) is block
  ``p / 16`` of the key stream, whose counter block is ``(IV + p / 16) mod 2^128`` (big-endian, the
  counter OpenSSL increments), so a tensor at file offset ``o`` starts at counter ``IV + (o −
  data_offset) / 16``. A fresh random IV per file: a (key, IV) pair is never reused.
- **Tag**: HMAC-SM3 with ``K_mac`` over every byte before it, ``[0, file_len)`` — header (flags,
  configuration, VQFSig, IV, salt, key id), directory, padding and ciphertext (encrypt-then-MAC).
  The 32-byte tag replaces the FNV-1a trailer: file size = file_len + 32. ``flags`` has ENCRYPTED
  set and FNV_TRAILER clear.
- **Tag before use**: the loader verifies the tag (constant time) over the ciphertext as it decrypts
  it into anonymous memory, and hands out no tensor unless the tag matches; on a mismatch the
  decrypted memory is unmapped. Nothing is ever written to a temporary file.

This module holds the primitives and the in-memory decryption the reader calls; whole-file
``encrypt`` / ``decrypt`` / ``verify`` are in ``kestrel_lab.vqf.encrypt``. The cryptography comes from
the ``cryptography`` package (OpenSSL's SM4, SM3, HMAC and HKDF), not from this project.

Taught in day26_1 (threat model), day26_2 (SM4-CTR) and day26_3 (the tag).
"""
from __future__ import annotations

import contextlib
import mmap
import os
import secrets
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kestrel_lab import seam
from kestrel_lab.vqf import format as F
from kestrel_lab.vqf.format import VQFFormatError

ENV_KEY_FILE = "KESTREL_KEY_FILE"
ALG_SM4_CTR_HMAC_SM3 = 1          # enc_alg: SM4-128-CTR + HMAC-SM3, keys by HKDF-SM3 (scheme version 1)
ALGORITHMS = {ALG_SM4_CTR_HMAC_SM3: "SM4-128-CTR + HMAC-SM3-256, keys by HKDF-SM3 (v1)"}
KEY_BYTES = 16
IV_BYTES = 16
SALT_BYTES = 16
KEY_ID_BYTES = 8
TAG_BYTES = F.TAG_BYTES          # 32: the HMAC-SM3 output
BLOCK = 16
INFO_ENC = b"kestrel-lab vqf v1: SM4-CTR key"
INFO_MAC = b"kestrel-lab vqf v1: HMAC-SM3 key"
CHUNK = 8 << 20                   # bytes per cipher/MAC call when streaming a file


class KeyFileError(ValueError):
    """A key file that is missing, malformed or readable by others. Taught in day26_1."""


class VQFProtectionError(VQFFormatError):
    """An encrypted VQF file that cannot be opened: no key, the wrong key, or a tag that does not match.
    Taught in day26_3."""


# ------------------------------------------------------------------------------------ keys
def new_key() -> bytes:
    """A random 16-byte SM4 key from the OS's CSPRNG. Taught in day26_1."""
    return secrets.token_bytes(KEY_BYTES)


def write_key_file(path: str | os.PathLike, key: bytes | None = None, *, overwrite: bool = False) -> Path:
    """Write ``key`` (default: a new one) as 32 hex characters and a newline, mode 0600.

    The file is created 0600 from the start (never readable by others, not even for a moment) and
    renamed into place; an existing file is kept unless ``overwrite``. Taught in day26_1.
    """
    path = Path(path)
    key = new_key() if key is None else key
    if len(key) != KEY_BYTES:
        raise KeyFileError(f"{path}: a key has {KEY_BYTES} bytes, got {len(key)}")
    if path.exists() and not overwrite:
        raise KeyFileError(f"{path}: already exists; refusing to replace a key (files encrypted with it "
                           f"could no longer be opened). Remove it first or pick another name")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), 0o600)  # whatever the umask
            fh.write(key.hex().encode("ascii") + b"\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


KEY_FILE_MAX = 64          # bytes a key file may have: 32 hex characters and a newline, with room to say so


def read_key_file(path: str | os.PathLike) -> bytes:
    """The 16-byte key in ``path``: exactly 32 hex characters, optionally one newline; refused when
    the file is readable or writable by group or others (as ssh refuses such a private key).

    The file is opened without blocking (a named pipe cannot hang it) and checked with ``fstat`` to be a
    small regular file before a byte is read; then at most ``KEY_FILE_MAX`` + 1 bytes are read, so
    ``/dev/zero``, a FIFO or a 1 GiB sparse file is refused at once. Taught in day26_1."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise KeyFileError(f"{path}: key file not found (make one with `kestrel-lab vqf keygen -o {path}`)") from None
    except OSError as e:
        raise KeyFileError(f"{path}: cannot read the key file: {e.strerror}") from None
    try:
        raw = _read_small_regular(path, fd)
    finally:
        os.close(fd)
    text = raw[:-1] if raw.endswith(b"\n") else raw
    if len(text) != 2 * KEY_BYTES or any(c not in b"0123456789abcdefABCDEF" for c in text):
        raise KeyFileError(f"{path}: expected {2 * KEY_BYTES} hex characters and a newline (byte 0..{2 * KEY_BYTES}), "
                           f"got {len(raw)} bytes{' that are not all hex' if len(text) == 2 * KEY_BYTES else ''}")
    return bytes.fromhex(text.decode("ascii"))


def _read_small_regular(path: Path, fd: int) -> bytes:
    """The bytes of an open key file, after checking that it is a regular file of at most KEY_FILE_MAX bytes
    that only its owner can access."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        kind = ("a named pipe" if stat.S_ISFIFO(st.st_mode) else "a character device" if stat.S_ISCHR(st.st_mode)
                else "a directory" if stat.S_ISDIR(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode)
                else "a block device" if stat.S_ISBLK(st.st_mode) else "not a regular file")
        raise KeyFileError(f"{path}: is {kind}; a key file is a regular file of {2 * KEY_BYTES + 1} bytes "
                           f"(make one with `kestrel-lab vqf keygen -o K`)")
    if st.st_mode & 0o077:
        raise KeyFileError(f"{path}: mode {stat.S_IMODE(st.st_mode):04o} lets group or others access the key; "
                           f"run `chmod 600 {path}`")
    if st.st_size > KEY_FILE_MAX:
        raise KeyFileError(f"{path}: {st.st_size:,} bytes; a key file has {2 * KEY_BYTES + 1} "
                           f"({2 * KEY_BYTES} hex characters and a newline): nothing was read")
    try:
        raw = os.read(fd, KEY_FILE_MAX + 1)
    except OSError as e:
        raise KeyFileError(f"{path}: cannot read the key file: {e.strerror}") from None
    if len(raw) > KEY_FILE_MAX:   # it grew after fstat
        raise KeyFileError(f"{path}: more than {KEY_FILE_MAX} bytes; a key file has {2 * KEY_BYTES + 1}")
    return raw


def resolve_key_file(key_file: str | os.PathLike | None) -> Path | None:
    """``key_file`` if given, else the ``KESTREL_KEY_FILE`` environment variable, else None. Taught in day26_2."""
    if key_file:
        return Path(key_file)
    env = os.environ.get(ENV_KEY_FILE, "").strip()
    return Path(env) if env else None


def sm3(data: bytes) -> bytes:
    """SM3 (GB/T 32905) digest of ``data``, 32 bytes. Taught in day26_3."""
    from cryptography.hazmat.primitives import hashes

    h = hashes.Hash(hashes.SM3())
    h.update(data)
    return h.finalize()


def key_id(key: bytes) -> bytes:
    """The key's public name in a file: the first 8 bytes of SM3(key). Taught in day26_1."""
    return sm3(key)[:KEY_ID_BYTES]


@dataclass(frozen=True)
class FileKeys:
    """The two keys of one file, derived from the key file's key and the file's salt. Taught in day26_2."""
    enc: bytes   # 16 B, SM4-CTR
    mac: bytes   # 32 B, HMAC-SM3


def derive_keys(key: bytes, salt: bytes) -> FileKeys:
    """HKDF-SM3(key, salt) with two ``info`` labels → the SM4 key and the HMAC key. Taught in day26_2."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    def one(info: bytes, n: int) -> bytes:
        return HKDF(algorithm=hashes.SM3(), length=n, salt=salt, info=info).derive(key)

    return FileKeys(one(INFO_ENC, KEY_BYTES), one(INFO_MAC, TAG_BYTES))


# ----------------------------------------------------------------------------- SM4-CTR at p
def counter_block(iv: bytes, position: int) -> bytes:
    """The CTR counter block for byte ``position`` of the stream (a multiple of 16): IV + position/16
    mod 2^128, big-endian. Taught in day26_2."""
    if position % BLOCK:
        raise ValueError(f"CTR position {position} is not a multiple of {BLOCK}")
    return ((int.from_bytes(iv, "big") + position // BLOCK) % (1 << 128)).to_bytes(BLOCK, "big")


def ctr_cipher(enc_key: bytes, iv: bytes, position: int = 0):
    """An SM4-CTR encryptor (encryption and decryption are the same XOR) positioned at byte ``position``.
    Taught in day26_2."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    return Cipher(algorithms.SM4(enc_key), modes.CTR(counter_block(iv, position))).encryptor()


def sm4_ctr(enc_key: bytes, iv: bytes, data, position: int = 0) -> np.ndarray:
    """``data`` XOR the SM4-CTR key stream from byte ``position`` on (uint8 array; encrypts or decrypts).
    Taught in day26_2."""
    src = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data.reshape(-1)
    out = np.empty(src.size, np.uint8)
    if src.size:
        ctr_cipher(enc_key, iv, position).update_into(src, out)
    return out


def new_mac(mac_key: bytes):
    """An HMAC-SM3 context (``update``, ``finalize``, constant-time ``verify``). Taught in day26_3."""
    from cryptography.hazmat.primitives import hashes, hmac

    return hmac.HMAC(mac_key, hashes.SM3())


# --------------------------------------------------------------------------- header fields
@dataclass(frozen=True)
class Protection:
    """The encryption fields of a header (bytes 388..432). Taught in day26_2."""
    alg: int
    iv: bytes
    salt: bytes
    key_id: bytes

    @classmethod
    def of_header(cls, h: dict) -> "Protection":
        return cls(h["enc_alg"], h["enc_iv"], h["enc_salt"], h["key_id"])

    def pack(self) -> bytes:
        """The 44 bytes at offset 388."""
        return struct.pack("<I16s16s8s", self.alg, self.iv, self.salt, self.key_id)


PROTECTION_OFFSET = F.HEADER_FIELD["enc_alg"].offset
assert PROTECTION_OFFSET + struct.calcsize("<I16s16s8s") == F.HEADER_END


def new_protection(key: bytes) -> Protection:
    """Fresh random IV and salt for one file encrypted with ``key``. Taught in day26_2."""
    return Protection(ALG_SM4_CTR_HMAC_SM3, secrets.token_bytes(IV_BYTES), secrets.token_bytes(SALT_BYTES),
                      key_id(key))


def check_header(where: str, h: dict) -> None:
    """The header rules that depend on ENCRYPTED: a plain file has zero encryption fields and
    FNV_TRAILER; an encrypted one a known algorithm, a key id, no FNV_TRAILER. Taught in day26_2."""
    def bad(name, why):
        raise VQFFormatError(f"{where}: field {name} at offset {F.HEADER_FIELD[name].offset}: {why}")

    flags = h["flags"]
    enc = bool(flags & F.FLAG["ENCRYPTED"])
    fnv = bool(flags & F.FLAG["FNV_TRAILER"])
    if enc and fnv:
        bad("flags", "ENCRYPTED (0x2) and FNV_TRAILER (0x1) are both set: a file ends with either a 32-byte "
                     "HMAC-SM3 tag or an 8-byte FNV-1a 64, not both")
    if not enc and not fnv:
        bad("flags", "FNV_TRAILER (0x1) is not set: a version-2 plain file always ends with its FNV-1a 64")
    if not enc:
        for name in ("enc_alg", "enc_iv", "enc_salt", "key_id"):
            if any(h[name]) if isinstance(h[name], bytes) else h[name]:
                bad(name, "is not zero although ENCRYPTED (0x2) is clear (these bytes belong to encrypted files)")
        return
    if h["enc_alg"] not in ALGORITHMS:
        bad("enc_alg", f"unknown algorithm id {h['enc_alg']} (known: "
                       f"{', '.join(f'{k} = {v}' for k, v in ALGORITHMS.items())})")
    if not any(h["key_id"]):
        bad("key_id", "is all zero: an encrypted file names the key it needs")


def trailer_bytes(flags: int) -> int:
    """8 (FNV-1a 64) for a plain file, 32 (HMAC-SM3 tag) for an encrypted one. Taught in day26_3."""
    return TAG_BYTES if flags & F.FLAG["ENCRYPTED"] else F.TRAILER_BYTES


# ------------------------------------------------------------------- opening for the reader
def key_for(where: str, prot: Protection, key_file) -> bytes:
    """The key that opens a file: read from ``key_file`` (or ``KESTREL_KEY_FILE``), its id checked against
    the header's ``key_id``; a clear error when there is none or it is the wrong one. Taught in day26_1."""
    path = resolve_key_file(key_file)
    if path is None:
        raise VQFProtectionError(
            f"{where}: the file is encrypted (flags ENCRYPTED, key id {prot.key_id.hex()}) and no key was given: "
            f"pass --key-file K (key_file=...) or set {ENV_KEY_FILE}")
    key = read_key_file(path)
    if key_id(key) != prot.key_id:
        raise VQFProtectionError(
            f"{where}: field key_id at offset {F.HEADER_FIELD['key_id'].offset}: the file was encrypted with key "
            f"{prot.key_id.hex()}, but {path} holds key {key_id(key).hex()}: wrong key file; nothing was decrypted")
    return key


def tag_error(where: str, file_len: int) -> VQFProtectionError:
    """The error of a tag that does not match (it names the file, the field and its offset). Taught in day26_3."""
    return VQFProtectionError(
        f"{where}: field tag (HMAC-SM3) at offset {file_len}: does not match the file's bytes: the header, "
        f"the directory, the data or the tag was modified after encryption (the key id matches, so the key "
        f"is right); no decrypted byte was used")


def _ctr_into(enc_key: bytes, iv: bytes, src, dst, position: int) -> None:
    ctr_cipher(enc_key, iv, position).update_into(src, dst)


def decrypt_image(where: str, mm, h: dict, key_file=None, workers: int | None = None) -> mmap.mmap:
    """Authenticate an encrypted file's mapping and decrypt it into anonymous memory.

    Returns an anonymous mapping of ``file_len`` bytes laid out as the file: the header and directory
    copied as they are, the data area decrypted. The HMAC runs over the ciphertext chunk by chunk in
    this thread while ``workers`` threads (default: the CPU count) decrypt the chunks, each with CTR
    positioned at its own offset (``cryptography`` releases the GIL for large buffers); the mapping is
    returned only when the tag matches (else it is unmapped and ``VQFProtectionError`` raised). The
    caller checks first that ``file_len`` bytes fit in memory (the reader does, with
    ``kestrel_lab.memory_check``). Taught in day26_3.
    """
    from concurrent.futures import ThreadPoolExecutor

    from cryptography.exceptions import InvalidSignature

    prot = Protection.of_header(h)
    key = key_for(where, prot, key_file)
    keys = derive_keys(key, prot.salt)
    d0, fl = h["data_offset"], h["file_len"]
    src = np.frombuffer(mm, dtype=np.uint8)
    mine = seam.get("protect.sm4_ctr")      # a student's SM4-CTR (``kestrel_lab.seam``): chunk by chunk, in order
    image = mmap.mmap(-1, max(fl, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        out = np.frombuffer(image, dtype=np.uint8)[:fl]
        out[:d0] = src[:d0]
        mac = new_mac(keys.mac)
        mac.update(src[:d0])
        with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 1) as pool:
            jobs = []
            for lo in range(d0, fl, CHUNK):
                hi = min(fl, lo + CHUNK)
                if mine is None:
                    jobs.append(pool.submit(_ctr_into, keys.enc, prot.iv, src[lo:hi], out[lo:hi], lo - d0))
                else:
                    out[lo:hi] = np.frombuffer(bytes(mine(keys.enc, prot.iv, bytes(src[lo:hi]), lo - d0)), np.uint8)
                mac.update(src[lo:hi])
            for job in jobs:
                job.result()
            del jobs
        tag = bytes(src[fl:fl + TAG_BYTES])
        del out, src
        try:
            mac.verify(tag)     # constant time
        except InvalidSignature:
            raise tag_error(where, fl) from None
    except BaseException:
        with contextlib.suppress(BufferError):
            image.close()
        raise
    return image


def verify_tag(where: str, mm, h: dict, key_file=None) -> None:
    """Check an encrypted file's tag without decrypting (reads the whole file once). Taught in day26_3."""
    from cryptography.exceptions import InvalidSignature

    prot = Protection.of_header(h)
    keys = derive_keys(key_for(where, prot, key_file), prot.salt)
    fl = h["file_len"]
    src = np.frombuffer(mm, dtype=np.uint8)
    mac = new_mac(keys.mac)
    for lo in range(0, fl, CHUNK):
        mac.update(src[lo:min(fl, lo + CHUNK)])
    tag = bytes(src[fl:fl + TAG_BYTES])
    del src
    try:
        mac.verify(tag)
    except InvalidSignature:
        raise tag_error(where, fl) from None


def spec_markdown() -> str:
    """The protection section's facts for book/formats/vqf.md, from this module's constants. Taught in day26_2."""
    f = F.HEADER_FIELD
    enc, fnv = F.FLAG["ENCRYPTED"], F.FLAG["FNV_TRAILER"]
    rows = ["| 项目 | 规定 |", "|---|---|"]
    rows += [f"| `enc_alg` = {k} | {v} |" for k, v in ALGORITHMS.items()]
    rows += [
        f"| 密钥文件 | {KEY_BYTES} 字节随机密钥，写成 {2 * KEY_BYTES} 个十六进制字符加换行，权限 0600"
        f"（组或其他人可读写就拒绝）；命令行 `--key-file K`，或环境变量 `{ENV_KEY_FILE}` |",
        f"| 密钥编号 `key_id`（偏移 {f['key_id'].offset}，{KEY_ID_BYTES} 字节） | SM3(key) 的前 {KEY_ID_BYTES} 字节；"
        f"先比对编号，错的密钥在解密任何字节之前就被认出 |",
        f"| 两把子密钥 | HKDF-SM3(IKM = key, salt = `enc_salt`（偏移 {f['enc_salt'].offset}，{SALT_BYTES} 字节，"
        f"每个文件随机）)：info `{INFO_ENC.decode()}` → {KEY_BYTES} 字节 SM4 密钥；"
        f"info `{INFO_MAC.decode()}` → {TAG_BYTES} 字节 HMAC 密钥 |",
        "| 加密的范围 | 数据区 `[data_offset, file_len)`（张量与它们之间的 0 填充）；头部、VQFSig、目录与填充是明文 |",
        f"| SM4-CTR 计数器 | 数据区第 p 字节（p 为 {BLOCK} 的倍数）用计数块 (IV + p / {BLOCK}) mod 2^128（大端），"
        f"IV 为 `enc_iv`（偏移 {f['enc_iv'].offset}，{IV_BYTES} 字节，每个文件随机）；偏移 o 的张量从 "
        f"IV + (o − data_offset) / {BLOCK} 开始，可以单独解密 |",
        f"| 标签 | HMAC-SM3(HMAC 密钥, 文件字节 `[0, file_len)`)：头部（含 flags、IV、salt、key_id）、目录、填充与密文"
        f"（先加密后认证）；{TAG_BYTES} 字节写在 `file_len` 处，代替 {F.TRAILER_BYTES} 字节的 FNV-1a |",
        f"| flags | `ENCRYPTED` (0x{enc:x}) 置位、`FNV_TRAILER` (0x{fnv:x}) 清零；文件大小 = file_len + {TAG_BYTES} |",
        f"| 明文文件 | 偏移 {f['enc_alg'].offset}..{F.HEADER_END} 的 {F.HEADER_END - f['enc_alg'].offset} 字节全为 0 |",
    ]
    return "\n".join(rows)


__all__ = ["ENV_KEY_FILE", "KeyFileError", "VQFProtectionError", "new_key", "write_key_file", "read_key_file",
           "resolve_key_file", "key_for", "tag_error", "sm3", "key_id", "derive_keys", "counter_block", "ctr_cipher",
           "sm4_ctr", "new_mac", "Protection", "new_protection", "check_header", "trailer_bytes", "decrypt_image",
           "verify_tag", "spec_markdown"]
