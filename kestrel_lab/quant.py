"""Weight formats: the one table of quantization types, and the code that makes their bytes.

The table ``QTYPES`` (qtype id → name, block size, bytes per block) is the single place of truth used by
the VQF writer, the reader's checks, the planner, the spec page and the engine. The quantizers follow
llama.cpp's reference block formats bit for bit (checked against gguf-py in the tests):

- Q8_0: blocks of 32 values: fp16 scale ``d = max|x| / 127``, then 32 × int8 ``round(x / d)``
  (round half away from zero). 34 bytes per block.
- Q4_0: blocks of 32 values: fp16 scale ``d = m / -8`` where ``m`` is the value of largest magnitude
  (sign kept), then 16 bytes of nibbles ``q = min(15, trunc(x / d + 8.5))``; byte ``j`` holds value
  ``j`` in its low nibble and value ``j + 16`` in its high nibble. 18 bytes per block; value = d·(q − 8).
- Q4_8X8L: the same Q4_0 blocks repacked for SIMD: rows are taken 8 at a time; for each group of 8 rows
  and each block column ``b`` the 144 bytes are: the 8 rows' fp16 scales (row order, 16 bytes), then
  the 8 rows' 16 quant bytes in two 8×8 tiles — tile ``t`` (0, 1) holds, for row r = 0..7, that row's
  quant bytes ``[8t, 8t+8)``. Groups follow each other, block columns inside a group. Same size as
  Q4_0; rows must be a multiple of 8.
- F16 and F32: little-endian IEEE halves and singles. BF16 (checkpoints only) is the top half of an F32.

All arrays are little-endian. Quantizers take float32 (rows, cols) with cols a multiple of 32 and
return ``uint8`` arrays of shape (rows, bytes_per_row) (Q4_8X8L: one flat run per 8-row group).
Taught in day04_1 (Q8_0), day04_2 (Q4_0), day06_2 (Q4_8X8L) and day17_2 (bit-exact sharing).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kestrel_lab import seam


def half_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """IEEE half-precision bit patterns (uint16, or any 2-byte view) → float32, quietly.

    Exact for every finite value and infinity. Signalling-NaN halves raise the FPU's "invalid" flag
    when converted on aarch64 (not on x86), which numpy turns into ``RuntimeWarning: invalid value
    encountered in cast``; a NaN stays a NaN either way, so the flag carries no information here.
    Taught in day04_1.
    """
    with np.errstate(invalid="ignore"):
        return np.asarray(bits).view(np.float16).astype(np.float32)

QK = 32  # values per block in Q8_0 and Q4_0


@dataclass(frozen=True)
class QType:
    id: int
    name: str
    block_size: int   # values per block
    block_bytes: int  # bytes per block
    row_multiple: int = 1  # rows must be a multiple of this (interleaved layouts)

    def nbytes(self, rows: int, cols: int) -> int:
        """Bytes of a rows × cols tensor in this format."""
        if cols % self.block_size:
            raise ValueError(f"{self.name}: cols={cols} is not a multiple of the block size {self.block_size}")
        if rows % self.row_multiple:
            raise ValueError(f"{self.name}: rows={rows} is not a multiple of {self.row_multiple}")
        return rows * (cols // self.block_size) * self.block_bytes


F32 = QType(1, "F32", 1, 4)
Q8_0 = QType(2, "Q8_0", QK, 2 + QK)
Q4_0 = QType(3, "Q4_0", QK, 2 + QK // 2)
Q4_8X8L = QType(4, "Q4_8X8L", QK, 2 + QK // 2, row_multiple=8)
F16 = QType(5, "F16", 1, 2)

QTYPES: dict[int, QType] = {q.id: q for q in (F32, Q8_0, Q4_0, Q4_8X8L, F16)}
BY_NAME: dict[str, QType] = {q.name.lower(): q for q in QTYPES.values()}


def qtype(key: int | str | QType) -> QType:
    """Look a qtype up by id, by name (case-insensitive) or pass one through."""
    if isinstance(key, QType):
        return key
    try:
        return QTYPES[key] if isinstance(key, int) else BY_NAME[key.lower()]
    except KeyError:
        known = ", ".join(f"{q.id}={q.name}" for q in QTYPES.values())
        raise ValueError(f"unknown qtype {key!r} (known: {known})") from None


def tensor_bytes(qt: int | str | QType, rows: int, cols: int) -> int:
    """The bytes formula of one tensor (what a VQF directory entry's ``bytes`` must equal)."""
    return qtype(qt).nbytes(rows, cols)


# ----------------------------------------------------------------------------- float formats
def bf16_to_f32(raw: np.ndarray) -> np.ndarray:
    """bfloat16 bits (uint16) → float32: numpy has no bfloat16, but bf16 is the top half of an f32."""
    return (np.asarray(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 → bfloat16 bits (uint16), rounding to nearest even as PyTorch does (NaN kept NaN)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = bits + (np.uint32(0x7FFF) + ((bits >> 16) & 1))
    out = (rounded >> 16).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        out[nan] = 0x7FC0
    return out


def _as_blocks(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim == 1:
        x = x[None, :]
    if x.ndim != 2 or x.shape[1] % QK:
        raise ValueError(f"expected a (rows, cols) array with cols a multiple of {QK}, got shape {x.shape}")
    return x.reshape(x.shape[0], x.shape[1] // QK, QK)


def _roundf(x: np.ndarray) -> np.ndarray:
    """C's roundf: half away from zero (numpy's round is half to even).

    Not ``floor(|x| + 0.5)``: for |x| = 0.49999997 the float32 sum rounds up to 1.0. Adding the
    doubled fraction's floor to the integer part is exact.
    """
    a = np.abs(x)
    whole = np.floor(a)
    return np.sign(x) * (whole + np.floor(np.float32(2) * (a - whole)))


# ----------------------------------------------------------------------------- Q8_0
def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    """float32 (rows, cols) → Q8_0 bytes (rows, cols/32*34). Taught in day04_1."""
    blocks = _as_blocks(x)
    rows, nb, _ = blocks.shape
    d = np.abs(blocks).max(axis=-1, keepdims=True) / np.float32(127)
    with np.errstate(divide="ignore", over="ignore"):  # subnormal scales overflow 1/d, as in gguf-py
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    q = _roundf(blocks * inv).astype(np.int8)
    out = np.empty((rows, nb, Q8_0.block_bytes), dtype=np.uint8)
    out[..., :2] = d.astype(np.float16).view(np.uint8).reshape(rows, nb, 2)
    out[..., 2:] = q.view(np.uint8)
    return out.reshape(rows, nb * Q8_0.block_bytes)


def dequantize_q8_0(raw: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """Q8_0 bytes → float32 (rows, cols). Taught in day04_1."""
    b = np.asarray(raw, dtype=np.uint8).reshape(rows, cols // QK, Q8_0.block_bytes)
    d = half_bits_to_f32(np.ascontiguousarray(b[..., :2]))
    q = np.ascontiguousarray(b[..., 2:]).view(np.int8).astype(np.float32)
    return (d * q).reshape(rows, cols)


# ----------------------------------------------------------------------------- Q4_0
def quantize_q4_0(x: np.ndarray) -> np.ndarray:
    """float32 (rows, cols) → Q4_0 bytes (rows, cols/32*18). Taught in day04_2."""
    blocks = _as_blocks(x)
    rows, nb, _ = blocks.shape
    imax = np.abs(blocks).argmax(axis=-1)[..., None]
    m = np.take_along_axis(blocks, imax, axis=-1)
    d = m / np.float32(-8)
    with np.errstate(divide="ignore", over="ignore"):  # subnormal scales overflow 1/d, as in gguf-py
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    q = np.trunc(blocks * inv + np.float32(8.5)).clip(0, 15).astype(np.uint8)
    packed = q[..., :16] | (q[..., 16:] << np.uint8(4))
    out = np.empty((rows, nb, Q4_0.block_bytes), dtype=np.uint8)
    out[..., :2] = d.astype(np.float16).view(np.uint8).reshape(rows, nb, 2)
    out[..., 2:] = packed
    return out.reshape(rows, nb * Q4_0.block_bytes)


def dequantize_q4_0(raw: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """Q4_0 bytes → float32 (rows, cols). Taught in day04_2."""
    b = np.asarray(raw, dtype=np.uint8).reshape(rows, cols // QK, Q4_0.block_bytes)
    d = half_bits_to_f32(np.ascontiguousarray(b[..., :2]))
    qs = b[..., 2:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.float32) - 8
    return (d * q).reshape(rows, cols)


# ----------------------------------------------------------------------------- Q4_8X8L
def repack_q4_8x8l(q4: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """Q4_0 bytes (rows, cols/32*18) → Q4_8X8L bytes (flat). Taught in day06_2."""
    Q4_8X8L.nbytes(rows, cols)  # validates the shape
    nb = cols // QK
    b = np.asarray(q4, dtype=np.uint8).reshape(rows // 8, 8, nb, 18)
    g = b.transpose(0, 2, 1, 3)                       # (groups, nb, 8 rows, 18)
    scales = g[..., :2].reshape(rows // 8, nb, 16)
    tiles = g[..., 2:].reshape(rows // 8, nb, 8, 2, 8).transpose(0, 1, 3, 2, 4).reshape(rows // 8, nb, 128)
    return np.concatenate([scales, tiles], axis=-1).reshape(-1)


def unpack_q4_8x8l(raw: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """Q4_8X8L bytes → Q4_0 bytes (rows, cols/32*18): the inverse of ``repack_q4_8x8l``. Taught in day06_2."""
    nb = cols // QK
    g = np.asarray(raw, dtype=np.uint8).reshape(rows // 8, nb, 144)
    scales = g[..., :16].reshape(rows // 8, nb, 8, 2)
    qs = g[..., 16:].reshape(rows // 8, nb, 2, 8, 8).transpose(0, 1, 3, 2, 4).reshape(rows // 8, nb, 8, 16)
    blocks = np.concatenate([scales, qs], axis=-1)    # (groups, nb, 8, 18)
    return blocks.transpose(0, 2, 1, 3).reshape(rows, nb * 18)


# ----------------------------------------------------------------------------- one entry point
def quantize(x: np.ndarray, qt: int | str | QType) -> np.ndarray:
    """float32 (rows, cols) → the bytes of ``qt`` as a flat uint8 array (what a VQF file stores)."""
    q = qtype(qt)
    x = np.asarray(x, dtype=np.float32)
    if x.ndim == 1:
        x = x[None, :]
    rows, cols = x.shape
    if q is F32:
        return np.ascontiguousarray(x, dtype="<f4").view(np.uint8).reshape(-1)
    if q is F16:
        return np.ascontiguousarray(x.astype("<f2")).view(np.uint8).reshape(-1)
    if q is Q8_0:
        mine = seam.get("quant.quantize_q8_0")    # a student's piece (``kestrel_lab.seam``), else ours
        if mine is not None:
            return _piece_bytes(mine(x.reshape(-1).copy()), q.nbytes(rows, cols), "quant.quantize_q8_0")
        return quantize_q8_0(x).reshape(-1)
    if q is Q4_0:
        return quantize_q4_0(x).reshape(-1)
    return repack_q4_8x8l(quantize_q4_0(x), rows, cols)


def _piece_bytes(out, nbytes: int, piece: str) -> np.ndarray:
    """A piece's bytes as a flat uint8 array of the expected size, or a clear error naming the piece."""
    arr = np.frombuffer(bytes(out), dtype=np.uint8) if not isinstance(out, np.ndarray) else out.reshape(-1)
    if arr.dtype != np.uint8 or arr.size != nbytes:
        raise ValueError(f"piece {piece} returned {arr.size} {arr.dtype} values, expected {nbytes} bytes")
    return arr


def dequantize(raw: np.ndarray, qt: int | str | QType, rows: int, cols: int) -> np.ndarray:
    """The bytes of ``qt`` → float32 (rows, cols)."""
    q = qtype(qt)
    raw = np.asarray(raw, dtype=np.uint8).reshape(-1)
    if raw.size != q.nbytes(rows, cols):
        raise ValueError(f"{q.name} {rows}×{cols}: expected {q.nbytes(rows, cols)} bytes, got {raw.size}")
    if q is F32:
        return raw.view("<f4").astype(np.float32).reshape(rows, cols)
    if q is F16:
        return half_bits_to_f32(raw.view("<u2")).reshape(rows, cols)
    if q is Q8_0:
        return dequantize_q8_0(raw, rows, cols)
    if q is Q4_0:
        mine = seam.get("quant.dequantize_q4_0")  # a student's piece (``kestrel_lab.seam``), else ours
        if mine is not None:
            out = np.asarray(mine(raw.tobytes(), rows * cols), dtype=np.float32)
            if out.size != rows * cols:
                raise ValueError(f"piece quant.dequantize_q4_0 returned {out.size} values, expected {rows * cols}")
            return out.reshape(rows, cols)
        return dequantize_q4_0(raw, rows, cols)
    return dequantize_q4_0(unpack_q4_8x8l(raw, rows, cols), rows, cols)


# ----------------------------------------------------------------------------- what a format costs
def tensor_snr_db(x: np.ndarray, qt: int | str | QType) -> float:
    """Signal-to-noise ratio of storing ``x`` in ``qt``: ``10·log10(Σx² / Σ(x − x̂)²)`` in dB, where
    x̂ = dequantize(quantize(x)). One number per tensor, comparable across formats and shapes (the
    error energy relative to the signal's); +inf where the round trip is exact (F32, or an all-zero x).

    Each extra bit of a uniform quantizer buys ~6 dB, so Q8_0 sits ~24 dB above Q4_0. Sums in float64,
    over chunks of 8192 rows.
    Taught in day04_3 (SNR per tensor of a real model) and day25_2 (the SNR table of a quantized file).
    """
    q = qtype(qt)
    x = np.asarray(x, dtype=np.float32)
    if x.ndim == 1:
        x = x[None, :]
    signal = noise = 0.0
    for r0 in range(0, x.shape[0], 8192):          # row chunks: memory stays bounded on a big embedding
        xc = x[r0:r0 + 8192]
        xh = dequantize(quantize(xc, q), q, *xc.shape).astype(np.float64)
        signal += float(np.sum(xc.astype(np.float64) ** 2))
        noise += float(np.sum((xc.astype(np.float64) - xh) ** 2))
    if noise == 0.0:
        return float("inf")
    return float(10.0 * np.log10(signal / noise)) if signal > 0 else float("-inf")
