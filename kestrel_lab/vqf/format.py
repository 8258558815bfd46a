"""The VQF byte layout, version 2: one table per structure, used to write, read and document it.

A VQF file, little-endian throughout::

    0      header: magic, version, flags, n_tensors, the model configuration, data_offset (184),
           file_len (192)
    200    VQFSig: who converted what, when, and how (ends at 432)
    448    directory: n_tensors entries of 64 bytes  (448 = (432 + 63) & ~63)
    D      data area, D = round_up(448 + 64·n, 4096): tensors in directory order, each 64-byte
           aligned, offset[i+1] = round64(offset[i] + bytes[i]); the last one ends at file_len
    file_len   8-byte FNV-1a 64 of the directory bytes then of [data_offset, file_len); an encrypted
               file (flag ENCRYPTED) ends with a 32-byte HMAC-SM3 tag instead (``vqf.protect``)

The fields are declared once, below (``HEADER_FIELDS``, ``ENTRY_FIELDS``, ``FLAGS``); the writer
packs with them, the reader unpacks and checks with them, and book/formats/vqf.md shows tables
generated from them (``spec_tables``; a test fails if the page drifts). Anything a version-2 reader
does not understand — an unknown flag bit, a non-zero reserved byte, an unknown architecture — is
rejected with the field's name and byte offset, never guessed at.

Taught in day16_1 (flags) and day16_2 (every header field).
"""
from __future__ import annotations

import datetime as _dt
import struct
from dataclasses import dataclass

from kestrel_lab import config_fields, limits
from kestrel_lab.config import ARCHS, ModelConfig, VisionConfig
from kestrel_lab.quant import QTYPES
from kestrel_lab.rope_scaling import ROPE_TYPE_NAMES, ROPE_TYPES, RopeScaling

MAGIC = b"VQF\x00"                      # bytes 0..4; as a little-endian u32: 0x00465156
MAGIC_U32 = struct.unpack("<I", MAGIC)[0]
VERSION = 2
SIG_MAGIC = b"VSIG"
SIG_VERSION = 1

HEADER_END = 432                        # header + VQFSig
DIR_OFFSET = (HEADER_END + 63) & ~63    # 448
ENTRY_SIZE = 64
ENTRY_FORMAT = "<32sIII4xQQ"            # name[32], qtype, rows, cols, pad, offset, bytes
TENSOR_ALIGN = 64
PAGE = 4096
TRAILER_BYTES = 8                       # FNV-1a 64 of a plain file
TAG_BYTES = 32                          # HMAC-SM3 tag of an encrypted file (flag ENCRYPTED)
NAME_BYTES = 32                         # name[32]: at most 31 bytes + NUL
NONE_U32 = 0xFFFFFFFF                   # "no token id"
MAX_TENSORS = limits.BOUND["vqf.n_tensors"].hi   # more entries than any model has: a corrupt count

VISION_ACTS = {1: "gelu_pytorch_tanh", 2: "gelu", 3: "quick_gelu", 4: "silu"}
VISION_ACT_IDS = {v: k for k, v in VISION_ACTS.items()}
ARCH_NAMES = {v: k for k, v in ARCHS.items()}

assert struct.calcsize(ENTRY_FORMAT) == ENTRY_SIZE and DIR_OFFSET == 448


@dataclass
class DirEntry:
    """One directory entry as stored (name, qtype, geometry, where its bytes are). Taught in day16_3."""

    index: int
    name: str
    qtype: int
    rows: int
    cols: int
    offset: int
    nbytes: int

    @property
    def end(self) -> int:
        return self.offset + self.nbytes


class VQFFormatError(ValueError):
    """A VQF file (or a header about to be written) that breaks the format; names field and offset.
    Taught in day16_3."""


def round_up(x: int, align: int) -> int:
    """Round ``x`` up to a multiple of ``align``. Taught in day16_1."""
    return (x + align - 1) // align * align


def data_offset_for(n_tensors: int) -> int:
    """Where the data area starts: the first page boundary after the directory. Taught in day16_1."""
    return round_up(DIR_OFFSET + ENTRY_SIZE * n_tensors, PAGE)


# ----------------------------------------------------------------------------------------- flags
@dataclass(frozen=True)
class Flag:
    """One bit of the header's ``flags`` field. Taught in day16_1."""
    bit: int
    name: str
    meaning: str

    @property
    def mask(self) -> int:
        return 1 << self.bit


FLAGS = (
    Flag(0, "FNV_TRAILER", "the file ends with the 8-byte FNV-1a 64 of directory + data (plain file); "
                           "set in every file this version writes"),
    Flag(1, "ENCRYPTED", "data area SM4-CTR encrypted, 32-byte HMAC-SM3 tag instead of the FNV trailer "
                         "(FNV_TRAILER clear; opened with a key file, see kestrel_lab.vqf.protect)"),
    Flag(2, "VISION", "the file carries a vision tower: vision_depth > 0 and v_* tensors present"),
    Flag(3, "REPACKED_8X8", "at least one tensor is stored as Q4_8X8L (rows interleaved 8 at a time "
                            "at conversion, so the loader never repacks)"),
)
FLAG = {f.name: f.mask for f in FLAGS}
KNOWN_FLAGS = sum(f.mask for f in FLAGS)


def describe_flags(flags: int) -> str:
    """``flags`` as names joined by ``|`` (unknown bits shown in hex). Taught in day16_1."""
    names = [f.name for f in FLAGS if flags & f.mask]
    unknown = flags & ~KNOWN_FLAGS
    if unknown:
        names.append(f"unknown 0x{unknown:x}")
    return "|".join(names) or "0"


# ------------------------------------------------------------------------------- header fields
@dataclass(frozen=True)
class Field:
    """One field of the header/VQFSig or of a directory entry. Taught in day16_2."""
    offset: int
    name: str
    code: str       # struct code of one field (little-endian implied)
    meaning: str
    rule: str = ""  # what a version-2 reader requires of it ("" = any value)

    @property
    def size(self) -> int:
        return struct.calcsize("<" + self.code)

    @property
    def ctype(self) -> str:
        return _CTYPES.get(self.code) or (f"char[{self.code[:-1]}]" if self.code.endswith("s")
                                          else f"u32[{self.code[:-1]}]")


_CTYPES = {"I": "u32", "Q": "u64", "q": "i64", "d": "f64", "f": "f32"}

HEADER_FIELDS: tuple[Field, ...] = (
    # ---- identity (fixed by the article)
    Field(0, "magic", "4s", "the bytes 'VQF\\0' (u32 0x00465156)", "== 'VQF\\0'"),
    Field(4, "version", "I", "format version", "== 2"),
    Field(8, "flags", "I", "FLAG bits (table below)", "no unknown bit; exactly one of FNV_TRAILER, ENCRYPTED"),
    Field(12, "n_tensors", "I", "directory entries", f"448 + 64·n <= file size, n <= {MAX_TENSORS}"),
    # ---- model configuration (ModelConfig), text model
    Field(16, "arch", "I", "architecture: 1 qwen3, 2 qwen3_vl, 3 qwen3_moe, 4 qwen2", "known id"),
    Field(20, "vocab_size", "I", "token embedding rows"),
    Field(24, "hidden_size", "I", "model width"),
    Field(28, "intermediate_size", "I", "dense FFN width"),
    Field(32, "num_hidden_layers", "I", "decoder layers (the stacking count of per-layer tensors)"),
    Field(36, "num_attention_heads", "I", "query heads"),
    Field(40, "num_key_value_heads", "I", "key/value heads (GQA)"),
    Field(44, "head_dim", "I", "width of one head"),
    Field(48, "rms_norm_eps", "d", "RMSNorm epsilon"),
    Field(56, "rope_theta", "d", "RoPE base"),
    Field(64, "max_position_embeddings", "I", "longest context the model was trained for"),
    Field(68, "bos_token_id", "I", "begin-of-text id, 0xFFFFFFFF = none"),
    Field(72, "eos_token_id", "I", "end-of-text id, 0xFFFFFFFF = none"),
    Field(76, "model_bits", "I", "bit 0 tie_word_embeddings, bit 1 mrope_interleaved, bit 2 norm_topk_prob",
          "bits 3..31 zero"),
    Field(80, "mrope_section", "4I", "MRoPE split of head_dim/2 (t, h, w), zero-filled; all zero = plain RoPE"),
    Field(96, "num_experts", "I", "MoE experts per layer (0 = dense)"),
    Field(100, "num_experts_per_tok", "I", "experts routed per token"),
    Field(104, "moe_intermediate_size", "I", "FFN width of one expert"),
    # ---- vision tower (all zero without one)
    Field(108, "vision_depth", "I", "vision blocks (0 = no vision tower)"),
    Field(112, "vision_hidden_size", "I", "vision width"),
    Field(116, "vision_intermediate_size", "I", "vision MLP width"),
    Field(120, "vision_num_heads", "I", "vision attention heads"),
    Field(124, "vision_in_channels", "I", "image channels (3)"),
    Field(128, "vision_patch_size", "I", "patch side in pixels"),
    Field(132, "vision_temporal_patch_size", "I", "frames per patch"),
    Field(136, "vision_spatial_merge_size", "I", "patches merged per side into one token"),
    Field(140, "vision_out_hidden_size", "I", "merger output width (= text hidden_size)"),
    Field(144, "vision_num_position_embeddings", "I", "learned position-embedding rows"),
    Field(148, "vision_hidden_act", "I", "1 gelu_pytorch_tanh, 2 gelu, 3 quick_gelu, 4 silu", "known id if vision"),
    Field(152, "n_deepstack", "I", "DeepStack mergers", "<= 4"),
    Field(156, "deepstack_visual_indexes", "4I", "vision blocks whose output feeds a DeepStack merger"),
    # ---- layout
    Field(172, "dir_offset", "I", "where the directory starts", "== 448"),
    Field(176, "entry_size", "I", "bytes per directory entry", "== 64"),
    Field(180, "rope_type", "I", "RoPE scaling: 0 none (plain RoPE), 1 linear, 2 yarn; its values are in the "
          "RoPE block at 432 (written as 'reserved0 == 0' before: an older reader refuses a scaled file)",
          "known id (0..2)"),
    Field(184, "data_offset", "Q", "start of the data area", "% 4096 == 0, >= 448 + 64·n"),
    Field(192, "file_len", "Q", "end of the data area (the trailer starts here)",
          "file size == file_len + 8 (plain) or + 32 (encrypted)"),
    # ---- VQFSig: provenance of the conversion
    Field(200, "sig_magic", "4s", "the bytes 'VSIG'", "== 'VSIG'"),
    Field(204, "sig_version", "I", "VQFSig layout version", "== 1"),
    Field(208, "tool", "32s", "converter and its version, e.g. 'kestrel-lab 0.1.0'", "NUL-padded UTF-8"),
    Field(240, "source_model", "64s", "source model (HF id or folder name)", "NUL-padded UTF-8"),
    Field(304, "source_sha256", "32s", "SHA-256 of the source weight files (all zero = not recorded)"),
    Field(336, "source_bytes", "Q", "total bytes of the source weight files"),
    Field(344, "created", "q", "conversion time, Unix seconds (UTC)"),
    Field(352, "quant", "16s", "quantization asked for ('q4_0', 'q8_0', …)", "NUL-padded UTF-8"),
    Field(368, "source_dtype", "16s", "dtype of the source weights ('bf16', 'f32', …)", "NUL-padded UTF-8"),
    Field(384, "n_source_files", "I", "source weight files hashed"),
    # ---- protection (kestrel_lab.vqf.protect): all zero in a plain file
    Field(388, "enc_alg", "I", "encryption scheme: 0 plain, 1 SM4-128-CTR + HMAC-SM3, keys by HKDF-SM3",
          "0 if plain; known id if ENCRYPTED"),
    Field(392, "enc_iv", "16s", "SM4-CTR initial counter block of data-area byte 0 (random per file)",
          "zero if plain"),
    Field(408, "enc_salt", "16s", "HKDF-SM3 salt deriving this file's SM4 and HMAC keys (random per file)",
          "zero if plain"),
    Field(424, "key_id", "8s", "first 8 bytes of SM3(key): which key file opens it (the key is never stored)",
          "zero if plain; non-zero if ENCRYPTED"),
)
HEADER_FORMAT = "<" + "".join(f.code for f in HEADER_FIELDS)

# The RoPE block: 16 bytes between VQFSig and the directory, zero unless rope_type ≠ 0. It holds the
# float32 values transformers' linear/yarn RoPE computes with (``kestrel_lab.rope_scaling``), so the
# engine rebuilds the frequencies exactly; the configuration's other inputs (original window, β, mscale,
# truncate) are folded into them at conversion.
ROPE_OFFSET, ROPE_END = HEADER_END, DIR_OFFSET
ROPE_FIELDS: tuple[Field, ...] = (
    Field(432, "rope_factor", "f", "linear/yarn: the context stretch (frequencies divided by it)", "rope_type ≠ 0"),
    Field(436, "rope_attention_factor", "f", "cos and sin multiplied by it (yarn: 0.1·ln(factor) + 1 unless "
          "the config sets it; linear: 1)", "linear: == 1"),
    Field(440, "rope_ramp_low", "f", "yarn: first frequency pair of the blend (linear: 0)", "linear: == 0"),
    Field(444, "rope_ramp_width", "f", "yarn: pairs the blend spans; pair i is interpolated by "
          "clamp((i − low) / width, 0, 1) (linear: 0)", "linear: == 0"),
)
ROPE_FORMAT = "<" + "".join(f.code for f in ROPE_FIELDS)
assert ROPE_OFFSET + struct.calcsize(ROPE_FORMAT) == ROPE_END
HEADER_FIELD = {f.name: f for f in HEADER_FIELDS + ROPE_FIELDS}

# The table must tile [0, 432) without gaps or overlaps: checked once at import.
_end = 0
for _f in HEADER_FIELDS:
    assert _f.offset == _end, (_f.name, _f.offset, _end)
    _end += _f.size
assert _end == HEADER_END and struct.calcsize(HEADER_FORMAT) == HEADER_END
assert HEADER_FIELD["data_offset"].offset == 184 and HEADER_FIELD["file_len"].offset == 192

ENTRY_FIELDS: tuple[Field, ...] = (
    Field(0, "name", "32s", "tensor name, NUL-padded ASCII/UTF-8", "1..31 bytes, then NULs only"),
    Field(32, "qtype", "I", "storage type (qtype table)", "known qtype"),
    Field(36, "rows", "I", "rows (per-layer tensors stacked along rows)", "> 0"),
    Field(40, "cols", "I", "columns (the contiguous dimension; the block dimension)", "> 0, multiple of the block"),
    Field(44, "pad", "4s", "alignment padding so that offset is 8-byte aligned", "all zero"),
    Field(48, "offset", "Q", "start of the tensor's bytes, from the start of the file",
          "% 64 == 0, >= data_offset, no overlap"),
    Field(56, "bytes", "Q", "length of the tensor's bytes", "== qtype bytes formula; offset + bytes <= file_len"),
)
_end = 0
for _f in ENTRY_FIELDS:
    assert _f.offset == _end
    _end += _f.size
assert _end == ENTRY_SIZE


# --------------------------------------------------------------------------------- strings
def pack_str(value: str, size: int, field: str) -> bytes:
    """A NUL-terminated, NUL-padded UTF-8 field of ``size`` bytes. Taught in day16_2."""
    raw = (value or "").encode("utf-8")
    if len(raw) >= size:
        raise VQFFormatError(f"{field}: {value!r} is {len(raw)} bytes; at most {size - 1} fit (NUL-terminated)")
    return raw + b"\x00" * (size - len(raw))


def unpack_str(raw: bytes, field: str, offset: int, where: str = "") -> str:
    """NUL-padded UTF-8: a NUL within the field, only NULs after it, valid UTF-8 before it. Taught in day16_2."""
    nul = raw.find(b"\x00")
    pre = f"{where}: " if where else ""
    if nul < 0:
        raise VQFFormatError(f"{pre}field {field} at offset {offset}: not NUL-terminated within {len(raw)} bytes")
    if raw[nul:].strip(b"\x00"):
        raise VQFFormatError(f"{pre}field {field} at offset {offset}: bytes after the terminating NUL are not zero")
    try:
        return raw[:nul].decode("utf-8")
    except UnicodeDecodeError as e:
        raise VQFFormatError(f"{pre}field {field} at offset {offset}: not valid UTF-8 ({e.reason})") from None


# --------------------------------------------------------------------------------- header
def _config_values(cfg: ModelConfig) -> dict:
    def u32(name, v):
        v = int(v)
        if not 0 <= v < NONE_U32:
            raise VQFFormatError(f"config field {name}={v} does not fit the header's u32")
        return v

    def tok(name, v):
        return NONE_U32 if v is None else u32(name, v)

    vals = {
        "arch": ARCHS[cfg.arch],
        "vocab_size": u32("vocab_size", cfg.vocab_size),
        "hidden_size": u32("hidden_size", cfg.hidden_size),
        "intermediate_size": u32("intermediate_size", cfg.intermediate_size),
        "num_hidden_layers": u32("num_hidden_layers", cfg.num_hidden_layers),
        "num_attention_heads": u32("num_attention_heads", cfg.num_attention_heads),
        "num_key_value_heads": u32("num_key_value_heads", cfg.num_key_value_heads),
        "head_dim": u32("head_dim", cfg.head_dim),
        "rms_norm_eps": float(cfg.rms_norm_eps),
        "rope_theta": float(cfg.rope_theta),
        "max_position_embeddings": u32("max_position_embeddings", cfg.max_position_embeddings),
        "bos_token_id": tok("bos_token_id", cfg.bos_token_id),
        "eos_token_id": tok("eos_token_id", cfg.eos_token_id),
        "model_bits": (int(cfg.tie_word_embeddings) | int(cfg.mrope_interleaved) << 1
                       | int(cfg.norm_topk_prob) << 2),
        "num_experts": u32("num_experts", cfg.num_experts),
        "num_experts_per_tok": u32("num_experts_per_tok", cfg.num_experts_per_tok),
        "moe_intermediate_size": u32("moe_intermediate_size", cfg.moe_intermediate_size),
        "rope_type": ROPE_TYPES[cfg.rope_scaling.rope_type] if cfg.rope_scaling else 0,
    }
    sec = list(cfg.mrope_section or [])
    if len(sec) > 4 or any(s <= 0 for s in sec):
        raise VQFFormatError(f"config mrope_section={sec}: at most 4 positive sections fit the header")
    vals["mrope_section"] = tuple(sec + [0] * (4 - len(sec)))
    v = cfg.vision
    if v is None:
        vals.update({f.name: 0 for f in HEADER_FIELDS if f.name.startswith("vision_")} | {"n_deepstack": 0})
        vals["deepstack_visual_indexes"] = (0, 0, 0, 0)
    else:
        if v.hidden_act not in VISION_ACT_IDS:
            raise VQFFormatError(f"vision hidden_act {v.hidden_act!r} has no id (known: {sorted(VISION_ACT_IDS)})")
        ds = list(v.deepstack_visual_indexes)
        if len(ds) > 4:
            raise VQFFormatError(f"{len(ds)} DeepStack indexes; the header holds at most 4")
        vals.update({
            "vision_depth": u32("vision.depth", v.depth),
            "vision_hidden_size": u32("vision.hidden_size", v.hidden_size),
            "vision_intermediate_size": u32("vision.intermediate_size", v.intermediate_size),
            "vision_num_heads": u32("vision.num_heads", v.num_heads),
            "vision_in_channels": u32("vision.in_channels", v.in_channels),
            "vision_patch_size": u32("vision.patch_size", v.patch_size),
            "vision_temporal_patch_size": u32("vision.temporal_patch_size", v.temporal_patch_size),
            "vision_spatial_merge_size": u32("vision.spatial_merge_size", v.spatial_merge_size),
            "vision_out_hidden_size": u32("vision.out_hidden_size", v.out_hidden_size),
            "vision_num_position_embeddings": u32("vision.num_position_embeddings", v.num_position_embeddings),
            "vision_hidden_act": VISION_ACT_IDS[v.hidden_act],
            "n_deepstack": len(ds),
            "deepstack_visual_indexes": tuple(int(i) for i in ds) + (0,) * (4 - len(ds)),
        })
        if v.depth == 0:
            raise VQFFormatError("vision.depth is 0: a vision tower needs at least one block")
    return vals


def pack_header(config: ModelConfig, *, flags: int, n_tensors: int, data_offset: int, file_len: int,
                source: dict | None = None, quant: str = "", created: int | None = None,
                tool: str | None = None) -> bytes:
    """The 432 bytes of header + VQFSig for one file. ``source`` keys: model, sha256 (hex),
    bytes, dtype, n_files (all optional). Taught in day16_2."""
    from kestrel_lab import __version__

    source = dict(source or {})
    unknown = set(source) - {"model", "sha256", "bytes", "dtype", "n_files"}
    if unknown:
        raise VQFFormatError(f"source: unknown keys {sorted(unknown)} (known: model, sha256, bytes, dtype, n_files)")
    sha = source.get("sha256") or ""
    try:
        sha_raw = bytes.fromhex(sha) if sha else b"\x00" * 32
    except ValueError:
        raise VQFFormatError(f"source sha256 {sha!r} is not hex") from None
    if len(sha_raw) != 32:
        raise VQFFormatError(f"source sha256 has {len(sha_raw)} bytes, expected 32")
    if created is None:
        created = int(_dt.datetime.now(_dt.timezone.utc).timestamp())
    vals = _config_values(config)
    vals.update({
        "magic": MAGIC, "version": VERSION, "flags": flags, "n_tensors": n_tensors,
        "dir_offset": DIR_OFFSET, "entry_size": ENTRY_SIZE,
        "data_offset": data_offset, "file_len": file_len,
        "sig_magic": SIG_MAGIC, "sig_version": SIG_VERSION,
        "tool": pack_str(tool or f"kestrel-lab {__version__}", 32, "tool"),
        "source_model": pack_str(str(source.get("model") or ""), 64, "source_model"),
        "source_sha256": sha_raw,
        "source_bytes": int(source.get("bytes") or 0),
        "created": int(created),
        "quant": pack_str(quant, 16, "quant"),
        "source_dtype": pack_str(str(source.get("dtype") or ""), 16, "source_dtype"),
        "n_source_files": int(source.get("n_files") or 0),
        "enc_alg": 0, "enc_iv": b"\x00" * 16, "enc_salt": b"\x00" * 16, "key_id": b"\x00" * 8,
    })
    args = []
    for f in HEADER_FIELDS:
        v = vals[f.name]
        args.extend(v if isinstance(v, tuple) else (v,))
    return struct.pack(HEADER_FORMAT, *args)


def pack_rope_block(config: ModelConfig) -> bytes:
    """The 16 bytes at 432: the RoPE block of a scaled configuration, zeros for plain RoPE. Taught in day24_3."""
    r = config.rope_scaling
    if r is None:
        return bytes(ROPE_END - ROPE_OFFSET)
    return struct.pack(ROPE_FORMAT, r.factor, r.attention_factor, r.ramp_low, r.ramp_width)


def unpack_header_raw(buf: bytes) -> dict:
    """The header bytes → {field name: value} without any check (what the inspector shows); given the
    first 448 bytes (or more), the RoPE block's fields too. Taught in day16_2."""
    if len(buf) < HEADER_END:
        raise VQFFormatError(f"header needs {HEADER_END} bytes, got {len(buf)}")
    values = struct.unpack_from(HEADER_FORMAT, buf, 0)
    out, i = {}, 0
    for f in HEADER_FIELDS:
        n = int(f.code[:-1]) if f.code[:-1].isdigit() and not f.code.endswith("s") else 1
        out[f.name] = tuple(values[i:i + n]) if n > 1 else values[i]
        i += n
    if len(buf) >= ROPE_END:
        out.update(zip((f.name for f in ROPE_FIELDS), struct.unpack_from(ROPE_FORMAT, buf, ROPE_OFFSET)))
    return out


def _rope_from_header(h: dict, bad) -> RopeScaling | None:
    """The rope scaling a header's ``rope_type`` and RoPE block describe (None: plain RoPE)."""
    kind = h["rope_type"]
    if kind not in ROPE_TYPE_NAMES:
        bad("rope_type", f"unknown RoPE scaling id {kind} (known: {ROPE_TYPE_NAMES})")
    if kind == 0:
        return None
    if "rope_factor" not in h:
        bad("rope_type", f"is {kind} ({ROPE_TYPE_NAMES[kind]}) but the RoPE block (bytes {ROPE_OFFSET}..{ROPE_END}) "
                         "was not read")
    vals = [h[f.name] for f in ROPE_FIELDS]
    if kind == ROPE_TYPES["linear"] and vals[1:] != [1.0, 0.0, 0.0]:
        name = ROPE_FIELDS[1 + next(i for i, (a, b) in enumerate(zip(vals[1:], [1.0, 0.0, 0.0])) if a != b)].name
        bad(name, f"{h[name]!r}: a linear scaling has attention factor 1 and no ramp")
    return RopeScaling(ROPE_TYPE_NAMES[kind], *vals)


def config_from_header(h: dict, where: str = "") -> ModelConfig:
    """Rebuild the ``ModelConfig`` a header describes; reject values a version-2 reader doesn't know.
    Taught in day16_2."""
    pre = f"{where}: " if where else ""

    def bad(name, why):
        raise VQFFormatError(f"{pre}field {name} at offset {HEADER_FIELD[name].offset}: {why}")

    if h["arch"] not in ARCH_NAMES:
        bad("arch", f"unknown architecture id {h['arch']} (known: {ARCHS})")
    if h["model_bits"] & ~0x7:
        bad("model_bits", f"0x{h['model_bits']:x} sets bits this version does not define (only 0..2)")
    rope = _rope_from_header(h, bad)
    sec = list(h["mrope_section"])
    used = [s for s in sec if s]
    if sec[:len(used)] != used:
        bad("mrope_section", f"{sec}: zero slots must come last")
    vision = None
    if h["vision_depth"]:
        if h["vision_hidden_act"] not in VISION_ACTS:
            bad("vision_hidden_act", f"unknown activation id {h['vision_hidden_act']} (known: {VISION_ACTS})")
        nds = h["n_deepstack"]
        if nds > 4:
            bad("n_deepstack", f"{nds} > 4")
        if any(h["deepstack_visual_indexes"][nds:]):
            bad("deepstack_visual_indexes", "slots past n_deepstack are not zero")
        vision = VisionConfig(
            depth=h["vision_depth"], hidden_size=h["vision_hidden_size"],
            intermediate_size=h["vision_intermediate_size"], num_heads=h["vision_num_heads"],
            in_channels=h["vision_in_channels"], patch_size=h["vision_patch_size"],
            temporal_patch_size=h["vision_temporal_patch_size"],
            spatial_merge_size=h["vision_spatial_merge_size"], out_hidden_size=h["vision_out_hidden_size"],
            num_position_embeddings=h["vision_num_position_embeddings"],
            deepstack_visual_indexes=list(h["deepstack_visual_indexes"][:nds]),
            hidden_act=VISION_ACTS[h["vision_hidden_act"]])
    else:
        for f in HEADER_FIELDS:
            if (f.name.startswith("vision_") or f.name in ("n_deepstack", "deepstack_visual_indexes")) \
                    and any(h[f.name] if isinstance(h[f.name], tuple) else (h[f.name],)):
                bad(f.name, "is not zero although vision_depth is 0")
    arch = ARCH_NAMES[h["arch"]]
    if (arch == "qwen3_vl") != (vision is not None):
        bad("vision_depth", f"arch {arch} {'needs' if arch == 'qwen3_vl' else 'cannot have'} a vision tower")

    def tok(v):
        return None if v == NONE_U32 else v

    cfg = ModelConfig(
        arch=arch, vocab_size=h["vocab_size"], hidden_size=h["hidden_size"],
        intermediate_size=h["intermediate_size"], num_hidden_layers=h["num_hidden_layers"],
        num_attention_heads=h["num_attention_heads"], num_key_value_heads=h["num_key_value_heads"],
        head_dim=h["head_dim"], rms_norm_eps=h["rms_norm_eps"], rope_theta=h["rope_theta"],
        max_position_embeddings=h["max_position_embeddings"],
        tie_word_embeddings=bool(h["model_bits"] & 1),
        bos_token_id=tok(h["bos_token_id"]), eos_token_id=tok(h["eos_token_id"]),
        mrope_section=used or None, mrope_interleaved=bool(h["model_bits"] & 2),
        num_experts=h["num_experts"], num_experts_per_tok=h["num_experts_per_tok"],
        moe_intermediate_size=h["moe_intermediate_size"], norm_topk_prob=bool(h["model_bits"] & 4),
        vision=vision, rope_scaling=rope)
    # Every count, width and float within the one table of bounds, before anything is planned from it;
    # every value that changes the math one the engine implements (the config-field table's half).
    try:
        limits.check_config(cfg)
    except limits.LimitError as e:
        bad(header_field_of(e.field), e.detail)
    refused = config_fields.check_implemented(cfg)
    if refused:
        bad(header_field_of(refused[0]), refused[1])
    return cfg


def _bound_rule(header_field: str) -> str:
    """The bound of the config field a header field stores, as the spec table shows it ('' if none)."""
    path = {"deepstack_visual_indexes": "vision.deepstack_visual_indexes", "created": "vqf.created",
            **{v: k for k, v in _ROPE_HEADER.items()}}.get(header_field, header_field.replace("vision_", "vision.", 1))
    b = limits.BOUND.get(path)
    if b is None:
        return ""
    lo, hi = (f"{b.lo:g}", f"{b.hi:g}") if b.kind == "float" else (f"{b.lo:,}", f"{b.hi:,}")
    extra = {"bos_token_id": " 或 0xFFFFFFFF", "eos_token_id": " 或 0xFFFFFFFF", "mrope_section": "（非零的各段）",
             "deepstack_visual_indexes": "（前 n_deepstack 个）"}.get(header_field, "")
    return f"[{lo}, {hi}]{extra}（界限表）" + ("，有限数" if b.kind == "float" else "")


_ROPE_HEADER = {"rope_scaling.factor": "rope_factor", "rope_scaling.attention_factor": "rope_attention_factor",
                "rope_scaling.ramp_low": "rope_ramp_low", "rope_scaling.ramp_width": "rope_ramp_width"}


def header_field_of(config_field: str) -> str:
    """The header field that stores a ``ModelConfig`` field (``vision.depth`` → ``vision_depth``).

    Taught in day27_1."""
    if config_field == "vision.deepstack_visual_indexes":
        return "deepstack_visual_indexes"
    if config_field.startswith("rope_scaling"):
        return _ROPE_HEADER.get(config_field, "rope_type")
    if config_field == "vision":
        return "vision_depth"
    name = config_field.replace("vision.", "vision_", 1)
    return name if name in HEADER_FIELD else "arch"


def source_from_header(h: dict, where: str = "") -> dict:
    """The VQFSig block as a dict (tool, model, sha256, bytes, dtype, n_files, created, quant). Taught in day16_2."""
    def s(name):
        return unpack_str(h[name], name, HEADER_FIELD[name].offset, where)

    created = h["created"]
    try:
        limits.check_value("vqf.created", created, "created")
    except limits.LimitError as e:
        raise VQFFormatError(f"{where + ': ' if where else ''}field created at offset "
                             f"{HEADER_FIELD['created'].offset}: {e.detail}") from None
    return {
        "tool": s("tool"), "model": s("source_model"),
        "sha256": h["source_sha256"].hex() if any(h["source_sha256"]) else None,
        "bytes": h["source_bytes"], "dtype": s("source_dtype"), "n_files": h["n_source_files"],
        "created": _dt.datetime.fromtimestamp(created, _dt.timezone.utc).isoformat() if created > 0 else None,
        "quant": s("quant"),
    }


# ---------------------------------------------------------------------------------- entries
def pack_entry(name: str, qtype: int, rows: int, cols: int, offset: int, nbytes: int) -> bytes:
    """The 64 bytes of one directory entry (``<32sIII4xQQ``). Taught in day16_3."""
    raw = name.encode("utf-8")
    if not raw or len(raw) >= NAME_BYTES or b"\x00" in raw:
        raise VQFFormatError(f"tensor name {name!r}: needs 1..{NAME_BYTES - 1} bytes and no NUL")
    return struct.pack(ENTRY_FORMAT, raw, qtype, rows, cols, offset, nbytes)


# ---------------------------------------------------------------------------------- the spec
def spec_tables() -> dict[str, str]:
    """Markdown tables generated from the tables above, for book/formats/vqf.md (kept in sync by a
    test and by ``kestrel-lab vqf spec``). Taught in day26_2."""
    def table(fields, base=0):
        rows = ["| 偏移 | 字节 | 类型 | 字段 | 含义 | 读取时的要求 |", "|---:|---:|---|---|---|---|"]
        for f in fields:
            rows.append(f"| {base + f.offset} | {f.size} | {f.ctype} | `{f.name}` | {f.meaning} | "
                        f"{f.rule or _bound_rule(f.name) or '—'} |")
        return "\n".join(rows)

    header = [f for f in HEADER_FIELDS if f.offset < 200]
    sig = [f for f in HEADER_FIELDS if f.offset >= 200]
    rope_ids = ", ".join(f"{v} = {k}" for k, v in ROPE_TYPES.items())
    flags = ["| 位 | 掩码 | 名字 | 含义 |", "|---:|---:|---|---|"]
    flags += [f"| {f.bit} | 0x{f.mask:x} | `{f.name}` | {f.meaning} |" for f in FLAGS]
    qt = ["| qtype | 名字 | 每块值数 | 每块字节 | 行数须为…的倍数 | bytes 公式 |", "|---:|---|---:|---:|---:|---|"]
    for q in QTYPES.values():
        formula = (f"rows × cols × {q.block_bytes}" if q.block_size == 1
                   else f"rows × cols / {q.block_size} × {q.block_bytes}")
        qt.append(f"| {q.id} | {q.name} | {q.block_size} | {q.block_bytes} | {q.row_multiple} | {formula} |")
    acts = ", ".join(f"{k} = {v}" for k, v in VISION_ACTS.items())
    return {"header": table(header), "sig": table(sig), "entry": table(ENTRY_FIELDS), "rope": table(ROPE_FIELDS),
            "flags": "\n".join(flags), "qtypes": "\n".join(qt),
            "constants": "\n".join([
                f"- magic: `{MAGIC!r}`（小端 u32 `0x{MAGIC_U32:08x}`），version = {VERSION}",
                f"- header + VQFSig 结束于 {HEADER_END}；目录起点 dir_off = ({HEADER_END} + 63) & ~63 = {DIR_OFFSET}；"
                f"每条 {ENTRY_SIZE} 字节，struct 格式串 `{ENTRY_FORMAT}`",
                f"- 数据区起点 data_offset = round_up({DIR_OFFSET} + {ENTRY_SIZE}·n, {PAGE})；"
                f"张量起点 {TENSOR_ALIGN} 字节对齐",
                f"- 明文文件尾部 {TRAILER_BYTES} 字节 FNV-1a 64；文件大小 = file_len + {TRAILER_BYTES}；"
                f"加密文件尾部 {TAG_BYTES} 字节 HMAC-SM3 标签；文件大小 = file_len + {TAG_BYTES}",
                f"- vision_hidden_act：{acts}；n_tensors 上限 {MAX_TENSORS}",
                f"- rope_type：{rope_ids}；RoPE 块在 {ROPE_OFFSET}..{ROPE_END}（VQFSig 与目录之间），"
                f"rope_type = 0 时全为 0",
            ])}
