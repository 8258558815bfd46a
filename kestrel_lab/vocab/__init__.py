"""vocab: Qwen's tokenizer for the engine — tokenizer.json, the vocab.bin compiler and loader, encoders.

``qwen.tiktoken`` (ranks) → ``tokenizer.json`` (HF layout) → ``vocab.bin`` (the engine's file) →
greedy longest-prefix encoding in numba; plus a reference BPE that agrees with HF ``tokenizers``, a
decoder, and the probe texts of article 18-2.

Taught in day18_1 (BPE, byte level, greedy vs BPE) and day18_2 (vocab.bin, compiler, loader).
"""
from kestrel_lab.vocab.bytelevel import (BYTE_TO_UNICODE, DECODE_BRANCHES, UNICODE_TO_BYTE, decode_token_str,
                                         engine_map_text, engine_unmap, token_str_to_bytes)
from kestrel_lab.vocab.compiler import CompileStats, compile_vocab
from kestrel_lab.vocab.loader import VocabBin, VocabFormatError, load_vocab_bin, parse_vocab_bin
from kestrel_lab.vocab.tokenizer import Tokenizer, default_vocab_bin
from kestrel_lab.vocab.tokenizer_json import (QWEN2_PATTERN, QWEN3_ADDED_TOKENS, default_tokenizer_json,
                                              load_tiktoken_ranks, read_tokenizer_json)

__all__ = [
    "BYTE_TO_UNICODE", "UNICODE_TO_BYTE", "DECODE_BRANCHES", "decode_token_str", "engine_map_text",
    "engine_unmap", "token_str_to_bytes", "CompileStats", "compile_vocab", "VocabBin", "VocabFormatError",
    "load_vocab_bin", "parse_vocab_bin", "Tokenizer", "default_vocab_bin", "QWEN2_PATTERN",
    "QWEN3_ADDED_TOKENS", "default_tokenizer_json", "load_tiktoken_ranks", "read_tokenizer_json",
]
