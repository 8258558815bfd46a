"""vocab.bin loader: two passes into numpy arrays, and a clear error for every malformed file."""
import struct

import numpy as np
import pytest

from kestrel_lab.vocab import VocabFormatError, load_vocab_bin, parse_vocab_bin


def make(records, n=None):
    out = struct.pack("<I", len(records) if n is None else n)
    for tid, b in records:
        out += struct.pack("<IH", tid, len(b)) + b
    return out


GOOD = [(0, b"a"), (2, b"ccc"), (1, b"bb")]   # file order need not be id order


def test_two_pass_layout():
    vb = parse_vocab_bin(make(GOOD))
    assert vb.n == 3 and vb.offsets.tolist() == [0, 1, 3, 6] and vb.data.tobytes() == b"abbccc"
    assert vb.file_order.tolist() == [0, 2, 1] and vb.max_len == 3
    assert [vb.token(i) for i in range(3)] == [b"a", b"bb", b"ccc"]
    assert vb.find(b"b") == [1]
    with pytest.raises(IndexError):
        vb.token(3)


def test_empty_file(tmp_path):
    p = tmp_path / "v.bin"
    p.write_bytes(b"")
    with pytest.raises(VocabFormatError, match=r"v.bin: empty file: field N .* offset 0"):
        load_vocab_bin(p)


def test_short_header():
    with pytest.raises(VocabFormatError, match=r"truncated header: field N .* offset 0"):
        parse_vocab_bin(b"\x03\x00")


def test_count_above_limit():
    with pytest.raises(VocabFormatError, match=r"field N at offset 0 is 300, above the limit of 100"):
        parse_vocab_bin(make(GOOD, n=300), max_entries=100)


def test_count_larger_than_file_can_hold():
    with pytest.raises(VocabFormatError, match=r"field N at offset 0 is 1,000, but a file of 28 bytes holds at most 3"):
        parse_vocab_bin(make(GOOD, n=1000))


def test_article_n_200000_is_caught_by_truncation(tmp_path):
    from kestrel_lab.vocab import compile_vocab

    out = tmp_path / "v.bin"
    compile_vocab(None, out)
    data = bytearray(out.read_bytes())
    data[:4] = struct.pack("<I", 200_000)
    with pytest.raises(VocabFormatError,
                       match=r"record 151669: truncated header: fields token_id/len at offset 1,950,864"):
        parse_vocab_bin(bytes(data))


def test_truncated_record_bytes():
    data = make(GOOD)[:-2]
    with pytest.raises(VocabFormatError,
                       match=r"record 2: truncated bytes: field len says 2 bytes at offset 26, only 0 left"):
        parse_vocab_bin(data)
    # the record header itself cut short
    with pytest.raises(VocabFormatError, match=r"record 2: truncated header: .* offset 37 need 6 bytes, only 3 left"):
        parse_vocab_bin(make([(0, b"a" * 20), (1, b"b"), (2, b"c")])[:40])


def test_token_id_out_of_range():
    with pytest.raises(VocabFormatError, match=r"record 1: field token_id at offset 11 is 7, out of range 0..2"):
        parse_vocab_bin(make([(0, b"a"), (7, b"b"), (1, b"c")]))
    vb = parse_vocab_bin(make([(0, b"a"), (7, b"b"), (1, b"c")]), id_limit=8)
    assert vb.n == 8 and vb.token(7) == b"b" and vb.token(3) == b""


def test_duplicate_id():
    with pytest.raises(VocabFormatError, match=r"record 2: field token_id at offset 18 is 0, a duplicate id"):
        parse_vocab_bin(make([(0, b"a"), (1, b"b"), (0, b"c")]))


def test_zero_length_and_trailing_bytes():
    with pytest.raises(VocabFormatError, match=r"record 1: field len at offset 24 is 0"):
        parse_vocab_bin(make([(0, b"a" * 10), (1, b""), (2, b"c")]))
    with pytest.raises(VocabFormatError, match=r"2 trailing bytes at offset 28"):
        parse_vocab_bin(make(GOOD) + b"xx")


def test_real_file_round_trip(tmp_path):
    from kestrel_lab.vocab import default_vocab_bin

    vb = load_vocab_bin(default_vocab_bin())
    assert vb.n == 151669 and vb.max_len == 256 and vb.data.dtype == np.uint8
    assert vb.offsets[-1] == 1_950_864 - 4 - 6 * 151669
    assert (vb.file_order == np.arange(151669)).all()
