"""Property: decode(encode(s)) gives the text back, for arbitrary Unicode, with both encoders."""
import functools
import unicodedata

from hypothesis import given, settings, strategies as st

from kestrel_lab.vocab import Tokenizer


@functools.lru_cache(None)
def tok(encoder):
    return Tokenizer.default(encoder)


TEXT = st.text(st.characters(codec="utf-8"), max_size=64)
MIXED = st.lists(st.sampled_from(["你好", " ", "\n", "\r\n", "\t", "ę", "Ġ", "\x00", "\x7f", "\u00ad", "🚀",
                                  "the", "  ", "<|im_end|>", "é", "e\u0301", "ič"]), max_size=20).map("".join)


@settings(max_examples=300, deadline=None)
@given(st.one_of(TEXT, MIXED))
def test_greedy_round_trip(s):
    assert tok("greedy").decode(tok("greedy").encode(s)) == s


@settings(max_examples=300, deadline=None)
@given(st.one_of(TEXT, MIXED))
def test_bpe_round_trip_up_to_nfc(s):
    # BPE normalizes to NFC first (as HF does), so it gives back the NFC form of the text.
    assert tok("bpe").decode(tok("bpe").encode(s)) == unicodedata.normalize("NFC", s)


@settings(max_examples=100, deadline=None)
@given(TEXT)
def test_bpe_equals_hf(s):
    import pytest

    tokenizers = pytest.importorskip("tokenizers")
    from kestrel_lab.vocab import default_tokenizer_json

    hf = _hf(tokenizers, str(default_tokenizer_json()))
    assert tok("bpe").encode(s) == hf.encode(s, add_special_tokens=False).ids


@functools.lru_cache(None)
def _hf(tokenizers, path):
    return tokenizers.Tokenizer.from_file(path)
