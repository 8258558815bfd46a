"""Encoders against the reference implementations: BPE = HF tokenizers = tiktoken; greedy's contract."""
import functools
import json
import unicodedata

import pytest

from kestrel_lab.paths import tiny_poem_dir
from kestrel_lab.vocab import QWEN2_PATTERN, Tokenizer, default_tokenizer_json, load_tiktoken_ranks
from kestrel_lab.vocab.corpus import mixed_corpus
from kestrel_lab.vocab.greedy import GreedyEncoder
from kestrel_lab.vocab.probes import load_probes


@functools.lru_cache(None)
def tok(encoder):
    return Tokenizer.default(encoder)


@functools.lru_cache(None)
def hf():
    tokenizers = pytest.importorskip("tokenizers")
    return tokenizers.Tokenizer.from_file(str(default_tokenizer_json()))


@functools.lru_cache(None)
def corpus_sample():
    """Every language's documents, plus a slice of code: ~300 KB, deterministic."""
    docs = mixed_corpus()
    text = [d for d in docs if d.lang != "code"]
    code = [d for d in docs if d.lang == "code"][:400]
    return [unicodedata.normalize("NFC", d.text) for d in text + code]


def test_brief_example_ids():
    s = "《夜思》\n作者：李白\n"
    expected = [26940, 99530, 90663, 25067, 198, 57421, 5122, 115187, 198]
    assert tok("bpe").encode(s) == expected
    assert tok("greedy").encode(s) == expected


def test_poem_model_prompts_and_continuations():
    cases = json.loads((tiny_poem_dir() / "greedy.json").read_text(encoding="utf-8"))["cases"]
    for c in cases:
        assert tok("bpe").encode(c["prompt"]) == c["prompt_ids"]
        assert tok("bpe").decode(c["greedy_ids"]) == c["greedy_text"]
        assert tok("bpe").decode_bytes(c["greedy_ids"]) == c["greedy_text"].encode()


def test_generated_tokenizer_json_equals_tiktoken_on_corpus():
    tiktoken = pytest.importorskip("tiktoken")
    enc = tiktoken.Encoding("qwen", pat_str=QWEN2_PATTERN, mergeable_ranks=load_tiktoken_ranks(),
                            special_tokens={})
    docs = corpus_sample()
    got = [e.ids for e in hf().encode_batch(docs, add_special_tokens=False)]
    assert got == enc.encode_ordinary_batch(docs, num_threads=1)


def test_bpe_equals_hf_on_corpus():
    docs = corpus_sample()
    ref = [e.ids for e in hf().encode_batch(docs, add_special_tokens=False)]
    bpe = tok("bpe")
    bad = [i for i, (d, r) in enumerate(zip(docs, ref)) if bpe.encode(d, allow_special=False) != r]
    assert bad == [], f"{len(bad)} documents differ, first: {docs[bad[0]][:80]!r}"


def test_probes_reference_ids():
    for p in load_probes():
        assert tuple(tok("bpe").encode(p.text)) == p.ids, p.name
        assert tuple(hf().encode(p.text, add_special_tokens=False).ids) == p.ids, p.name
    assert len(load_probes()) == 15


def test_greedy_decodes_to_the_text_hf_decodes_and_agrees_on_chinese():
    docs = corpus_sample()
    ref = [e.ids for e in hf().encode_batch(docs, add_special_tokens=False)]
    g = tok("greedy")
    for d, r in zip(docs, ref):
        ids = g.encode(d, allow_special=False)
        assert g.decode_bytes(ids) == d.encode() == tok("bpe").decode_bytes(r)
    # the poem prompts tokenize identically under both encoders
    cases = json.loads((tiny_poem_dir() / "greedy.json").read_text(encoding="utf-8"))["cases"]
    for c in cases:
        assert g.encode(c["prompt"]) == c["prompt_ids"]


def test_greedy_is_longest_prefix():
    """Each greedy token is the longest vocabulary entry that prefixes the rest of the text."""
    g = tok("greedy")
    allowed = g._enc.allowed
    by_bytes = {}
    for i in range(151643):
        if allowed[i]:
            by_bytes.setdefault(g.token_bytes(i), i)
    for text in ["Hello world, 你好世界", "    return x\n\n", "def f(a, b):\n\treturn a+b"]:
        data, pos = text.encode(), 0
        for tid in g.encode(text, allow_special=False):
            best = max(n for n in range(1, 257) if data[pos:pos + n] in by_bytes and pos + n <= len(data))
            assert by_bytes[data[pos:pos + best]] == tid
            pos += best
        assert pos == len(data)


def test_exact_and_engine_modes_agree_on_corpus_text_without_marks_and_differ_on_polish():
    exact, engine = tok("greedy"), tok("greedy-engine")
    for d in corpus_sample()[:2000]:
        if not any(0x100 <= ord(c) <= 0x120 for c in d):
            assert exact.encode(d) == engine.encode(d)
    # The engine's blind spot: text 'ę' (C4 99) has the bytes of the mark of control byte 0x19.
    assert engine.decode(engine.encode("ę")) == "\x19"
    assert exact.decode(exact.encode("ę")) == "ę"
    # ... and a conflicting token swallows a carriage return: text 'i\r' becomes the token 'ič'.
    assert engine.decode(engine.encode("i\r\n")) == "ič\n"
    assert exact.decode(exact.encode("i\r\n")) == "i\r\n"
    assert len(exact.engine_view_conflicts()) == 652


def test_special_tokens_and_errors():
    t = tok("bpe")
    assert len(t.special_tokens) == 26 and t.special_tokens["<|im_end|>"] == 151645
    assert t.encode("<|im_start|>") == [151644]
    assert len(t.encode("<|im_start|>", allow_special=False)) > 1
    assert t.vocab_size == 151669 and t.token_bytes(151667) == b"<think>"
    with pytest.raises(IndexError, match="out of range"):
        t.decode([151669])
    with pytest.raises(ValueError, match="encoder"):
        Tokenizer.default("wordpiece")


def test_from_vocab_bin_only(tmp_path):
    from kestrel_lab.vocab import default_vocab_bin

    t = Tokenizer.from_files(vocab_bin=default_vocab_bin(), encoder="greedy")
    assert len(t.special_tokens) == 26 and t.special_tokens["</think>"] == 151668
    s = "《夜思》\n作者：李白\n<|im_end|>"
    assert t.encode(s) == tok("greedy").encode(s)
    assert t.decode(t.encode(s)) == s


def test_broken_trie_input_reports_position():
    from kestrel_lab.vocab import parse_vocab_bin
    import struct

    blob = struct.pack("<I", 2) + struct.pack("<IH", 0, 1) + b"a" + struct.pack("<IH", 1, 2) + b"ab"
    enc = GreedyEncoder(parse_vocab_bin(blob))
    assert enc.encode("abaab") == [1, 0, 1]
    with pytest.raises(ValueError, match="no vocab entry starts with byte 0x63 \\(position 2"):
        enc.encode("abc")
    assert enc.encode_array(b"abc", on_missing="skip").tolist() == [1, -1]
