"""`kestrel-lab vocab …` commands and the spec page's byte-decoding table."""
import re

from kestrel_lab.cli import main
from kestrel_lab.paths import REPO_ROOT
from kestrel_lab.vocab import decode_token_str


def test_compile_prints_the_article_lines(tmp_path, capsys):
    assert main(["vocab", "compile", "-o", str(tmp_path / "v.bin")]) == 0
    out = capsys.readouterr().out
    assert "total entries: 151669" in out
    assert "converted: 57286  kept: 94357  special copied: 26" in out
    assert "'回答': 2 hits [102104, 111423]" in out
    assert "size: 1,950,864 bytes" in out
    assert "sha256: 299e1c156bff1b85b5b4dc098c1d7f2e33e0b76fe1967d0d21df328985637a73" in out
    assert main(["vocab", "check", str(tmp_path / "v.bin")]) == 0
    assert "151,669 entries" in capsys.readouterr().out


def test_inspect_and_bad_file(tmp_path, capsys):
    assert main(["vocab", "inspect", "220", "198", "255", "221"]) == 0
    out = capsys.readouterr().out
    assert "stored c4a0 (kept)" in out and "stored ad (converted)" in out and "stored 7f (converted)" in out
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"\x05\x00\x00\x00")
    assert main(["vocab", "check", str(bad)]) == 1
    assert "bad.bin: field N at offset 0 is 5" in capsys.readouterr().err


def test_encode_command(capsys):
    assert main(["vocab", "encode", "《夜思》\n作者：李白\n", "--encoder", "greedy"]) == 0
    assert capsys.readouterr().out.startswith("26940 99530 90663 25067 198 57421 5122 115187 198")


def test_spec_page_table_matches_decode_token_str():
    page = (REPO_ROOT / "book" / "formats" / "vocab_bin.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| U\+([0-9A-F]{4})\.\.U\+([0-9A-F]{4})[^|]*\| (0x[0-9A-F]{2})\.\.(0x[0-9A-F]{2}) \|",
                      page, re.M)
    assert len(rows) >= 3
    for lo, hi, b_lo, b_hi in rows:
        lo, hi, b_lo, b_hi = int(lo, 16), int(hi, 16), int(b_lo, 16), int(b_hi, 16)
        assert hi - lo == b_hi - b_lo
        for cp, b in zip(range(lo, hi + 1), range(b_lo, b_hi + 1)):
            stored = decode_token_str(chr(cp))
            assert stored in (bytes([b]), chr(cp).encode("utf-8"))
    assert "1,950,864" in page and "299e1c156bff1b85b5b4dc098c1d7f2e33e0b76fe1967d0d21df328985637a73" in page
