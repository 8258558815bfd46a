"""The compiler reproduces the board's vocab.bin bit for bit (article 18-2), and its options work."""
import hashlib
import json

import pytest

from kestrel_lab.vocab import compile_vocab, decode_token_str, default_tokenizer_json, load_vocab_bin
from kestrel_lab.vocab.bytelevel import BYTE_TO_UNICODE, engine_map_text, engine_unmap, token_str_to_bytes

BOARD_SHA256 = "299e1c156bff1b85b5b4dc098c1d7f2e33e0b76fe1967d0d21df328985637a73"


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    out = tmp_path_factory.mktemp("vocab") / "vocab.bin"
    return compile_vocab(None, out)


def test_article_statistics_and_hash(compiled):
    s = compiled
    assert (s.total, s.converted, s.kept, s.special) == (151669, 57286, 94357, 26)
    assert s.bytes == 1_950_864 == s.out_path.stat().st_size
    assert s.sha256 == BOARD_SHA256 == hashlib.sha256(s.out_path.read_bytes()).hexdigest()


def test_coverage_lines_match_the_article(compiled):
    hits = dict(compiled.coverage)
    assert hits["回答"] == [102104, 111423]
    assert hits["你好"] == [108386]
    assert len(hits["Ġgood"]) == 6 and hits["Ġgood"][:3] == [1661, 11561, 38426]
    assert len(hits["Ċ"]) == 2179 and hits["Ċ"][:3] == [198, 271, 280]
    assert compiled.missing == []
    assert "converted: 57286  kept: 94357  special copied: 26" in compiled.report()


def test_specials_copied_from_old_file_give_the_same_file(compiled, tmp_path):
    again = compile_vocab(None, tmp_path / "v.bin", specials_from=compiled.out_path)
    assert again.sha256 == BOARD_SHA256 and again.special_source == str(compiled.out_path)


def test_article_inspect_ids(compiled):
    vb = load_vocab_bin(compiled.out_path)
    assert vb.token(220) == b"\xc4\xa0"   # Ġ kept: the engine's space mark
    assert vb.token(198) == b"\xc4\x8a"   # Ċ kept: newline mark
    assert vb.token(255) == b"\xad"       # Ń → 0xAD
    assert vb.token(221) == b"\x7f"       # ġ → 0x7F
    assert vb.token(151644) == b"<|im_start|>"


@pytest.mark.parametrize("branch, token_id, stored", [("0x0143", 255, "Ń".encode()),
                                                      ("0x0121", 221, "ġ".encode()),
                                                      ("0x0122-0x0142", 188 + 33 + 1, "Ģ".encode())])
def test_drop_branch_changes_exactly_that_class(compiled, tmp_path, branch, token_id, stored):
    broken = compile_vocab(None, tmp_path / "b.bin", drop_branch=branch)
    assert broken.sha256 != BOARD_SHA256 and broken.converted < compiled.converted
    vb = load_vocab_bin(broken.out_path)
    assert vb.token(token_id) == stored


def test_decode_token_str_three_classes():
    assert decode_token_str("Ġapple") == b"\xc4\xa0apple"
    assert decode_token_str("Ń") == b"\xad" and decode_token_str("ġ") == b"\x7f"
    assert decode_token_str("Ģ") == b"\x80" and decode_token_str("ł") == b"\xa0"
    assert decode_token_str("åĽŀçŃĶ") == "回答".encode()
    with pytest.raises(ValueError, match="drop_branch"):
        decode_token_str("a", drop_branch="0x9999")


def test_decode_token_str_is_byte_level_inverse_except_marks():
    # For every byte, the stored form is the true byte unless it is 0x00..0x20 (kept as its mark).
    for b, ch in BYTE_TO_UNICODE.items():
        expected = ch.encode("utf-8") if b <= 0x20 else bytes([b])
        assert decode_token_str(ch) == expected, hex(b)
        assert token_str_to_bytes(ch) == bytes([b])
        assert engine_unmap(decode_token_str(ch)) == bytes([b])
    assert engine_map_text(b"a b\n\x00") == b"a\xc4\xa0b\xc4\x8a\xc4\x80"
    assert engine_unmap(engine_map_text(bytes(range(256)))) == bytes(range(256))


def test_default_tokenizer_json_shape():
    doc = json.loads(default_tokenizer_json().read_text(encoding="utf-8"))
    assert len(doc["model"]["vocab"]) == 151643
    assert len(doc["model"]["merges"]) == 151643 - 256
    added = doc["added_tokens"]
    assert [a["id"] for a in added] == list(range(151643, 151669))
    assert added[1]["content"] == "<|im_start|>" and added[1]["special"]
    assert added[-1]["content"] == "</think>" and not added[-1]["special"]
    assert doc["normalizer"] == {"type": "NFC"}


def test_compiler_rejects_bad_tokenizer_json(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"model": {"vocab": {"a": 0, "b": 5}}}')
    with pytest.raises(ValueError, match=r"bad.json.*model.vocab\['b'\]"):
        compile_vocab(bad, tmp_path / "x.bin")
    bad.write_text('{"model": ')
    with pytest.raises(ValueError, match=r"bad.json: not valid JSON"):
        compile_vocab(bad, tmp_path / "x.bin")
    assert not (tmp_path / "x.bin").exists()
