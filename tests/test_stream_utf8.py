"""StreamDecoder: streamed text == full decode, and no U+FFFD unless the bytes really were invalid."""
from __future__ import annotations

import codecs
from functools import lru_cache

from hypothesis import HealthCheck, given, settings, strategies as st

from kestrel_lab.engine.stream import StreamDecoder, incomplete_tail_len, utf8_sequence_len


@lru_cache(maxsize=1)
def _vocab_bytes() -> list[bytes]:
    from kestrel_lab.vocab.tokenizer_json import load_tiktoken_ranks

    ranks = load_tiktoken_ranks()
    out = [b""] * len(ranks)
    for b, r in ranks.items():
        out[r] = b
    return out


def _stream(chunks: list[bytes]) -> list[str]:
    table = dict(enumerate(chunks))
    dec = StreamDecoder(table.__getitem__)
    out = [dec.push(i) for i in range(len(chunks))]
    out.append(dec.flush())
    return out


def test_sequence_lengths():
    assert [utf8_sequence_len(b) for b in (0x41, 0xC3, 0xE5, 0xF0, 0x80, 0xC0, 0xC1, 0xF5, 0xFF)] == \
        [1, 2, 3, 4, 0, 0, 0, 0, 0]


def test_tail_rules():
    ch = "床".encode()  # e5 ba 8a
    assert incomplete_tail_len(b"") == 0
    assert incomplete_tail_len(b"abc") == 0
    assert incomplete_tail_len(ch) == 0
    assert incomplete_tail_len(ch[:1]) == 1
    assert incomplete_tail_len(b"x" + ch[:2]) == 2
    assert incomplete_tail_len("😀".encode()[:3]) == 3
    assert incomplete_tail_len(b"\x8a") == 0           # lone continuation: never completable
    assert incomplete_tail_len(b"\xe0\x80") == 0       # overlong start
    assert incomplete_tail_len(b"\xed\xa0") == 0       # surrogate start
    assert incomplete_tail_len(b"\xf4\x90") == 0       # beyond U+10FFFF
    assert incomplete_tail_len(b"\xc0") == 0


def test_chinese_split_across_tokens_and_lone_continuation_byte():
    ch = "床前".encode()  # e5 ba 8a e5 89 8d
    chunks = [ch[:2], ch[2:3], ch[3:4], ch[4:]]  # second chunk is a lone continuation byte
    out = _stream(chunks)
    assert out == ["", "床", "", "前", ""]
    assert "".join(out) == "床前"


def test_invalid_bytes_come_out_where_full_decode_puts_them():
    chunks = [b"a\x8a", b"\xe5\xba", b"b", b"\xff", "好".encode()]
    out = _stream(chunks)
    full = b"".join(chunks).decode("utf-8", "replace")
    assert "".join(out) == full
    assert out[0] == "a\ufffd" and out[1] == "" and out[2] == "\ufffdb"


def test_unfinished_character_at_the_end_is_flushed_as_replacement():
    out = _stream([b"ok", "好".encode()[:2]])
    assert out == ["ok", "", "\ufffd"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.binary(min_size=0, max_size=5), max_size=30))
def test_arbitrary_bytes_match_full_and_incremental_decoders(chunks):
    out = _stream(chunks)
    data = b"".join(chunks)
    assert "".join(out) == data.decode("utf-8", "replace")
    # Every prefix of the stream is a prefix of the full decode, and the stream never lags behind
    # CPython's incremental decoder (it may run ahead: bytes that can never complete, such as ED A0,
    # are replaced at once, where CPython waits for the next byte).
    full = data.decode("utf-8", "replace")
    inc = codecs.getincrementaldecoder("utf-8")("replace")
    ours = ref = ""
    for piece, c in zip(out, chunks):
        ours += piece
        ref += inc.decode(c)
        assert full.startswith(ours) and len(ours) >= len(ref)


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=0, max_size=40), st.lists(st.integers(1, 6), min_size=1, max_size=40))
def test_valid_text_cut_anywhere_never_emits_replacement(text, cuts):
    data = text.encode("utf-8")
    chunks, i, k = [], 0, 0
    while i < len(data):
        n = cuts[k % len(cuts)]
        chunks.append(data[i:i + n])
        i, k = i + n, k + 1
    out = _stream(chunks)
    assert "".join(out) == text
    assert all("\ufffd" not in piece for piece in out) or "\ufffd" in text


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 151642), min_size=1, max_size=40))
def test_real_vocabulary_tokens(ids):
    vocab = _vocab_bytes()
    dec = StreamDecoder(lambda i: vocab[i])
    out = [dec.push(i) for i in ids] + [dec.flush()]
    data = b"".join(vocab[i] for i in ids)
    full = data.decode("utf-8", "replace")
    assert "".join(out) == full
    if "\ufffd" not in full:  # valid bytes: no chunk may show a replacement character
        assert all("\ufffd" not in piece for piece in out)
    else:  # every replacement emitted is one the full decode has too
        assert sum(p.count("\ufffd") for p in out) == full.count("\ufffd")


def test_real_token_ending_mid_character_is_held_back():
    from kestrel_lab.vocab.tokenizer_json import load_tiktoken_ranks

    vocab = _vocab_bytes()
    ranks = load_tiktoken_ranks()
    # Byte-level tokens that split a character exist in the real vocabulary: find one and check it.
    partial = [i for i, b in enumerate(vocab) if b and incomplete_tail_len(b) == len(b) == 2]
    assert partial, "the Qwen vocabulary has tokens ending mid-character"
    tok = partial[0]
    lead = vocab[tok]
    # complete it with continuation bytes taken from a real character that starts with these bytes
    for cp in (c for c in range(0x800, 0x10000) if not 0xD800 <= c <= 0xDFFF):
        enc = chr(cp).encode()
        if enc.startswith(lead) and enc[len(lead):] in ranks:
            rest = ranks[enc[len(lead):]]
            dec = StreamDecoder(lambda i: vocab[i])
            assert dec.push(tok) == "" and dec.pending == lead
            assert dec.push(rest) == chr(cp) and dec.pending == b""
            break
    else:
        raise AssertionError(f"no character completes token {tok} ({lead!r}) with one token")
