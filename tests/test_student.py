"""The student's own engine (issue 22): ``student init`` and ``student check`` on real workspaces.

A fresh workspace lists every piece as not started and exits 0; deliberately wrong pieces fail naming the
piece and where they first go wrong; ``init`` never overwrites what a student wrote.
"""
from __future__ import annotations

import textwrap

import pytest

from kestrel_lab import seam
from kestrel_lab.cli import main
from kestrel_lab.student import checks, workspace


@pytest.fixture
def ws(tmp_path):
    workspace.init(tmp_path / "ws", write_config=False)
    return tmp_path / "ws"


def _write_piece(root, module: str, source: str) -> None:
    """Append a student's function to ``module`` (the last definition wins over the skeleton)."""
    path = root / seam.PACKAGE / f"{module}.py"
    path.write_text(path.read_text() + "\n\n" + textwrap.dedent(source))


def test_fresh_workspace_lists_every_piece_not_started(ws, capsys):
    assert main(["student", "check", "--all", "--workspace", str(ws)]) == 0
    out = capsys.readouterr().out
    for key in seam.BY_KEY:
        assert any(line.split()[1:4] == [key, seam.BY_KEY[key].lesson, "not"] for line in out.splitlines()), key
    assert f"0 passes, 0 fails, {len(seam.PIECES)} not started" in out


def test_init_again_keeps_the_students_code_and_adds_what_is_missing(ws):
    _write_piece(ws, "quant", """
        def quantize_q8_0(x):
            return b"mine"
        """)
    mod = ws / seam.PACKAGE / "moe.py"
    mod.unlink()
    report = workspace.init(ws, write_config=False)
    assert "moe.py" in " ".join(report.created)
    assert 'return b"mine"' in (ws / seam.PACKAGE / "quant.py").read_text()
    w = seam.Workspace(ws)
    assert set(w.implemented()) == {"quant.quantize_q8_0"}


def test_dequant_forgetting_the_offset_fails_naming_tensor_row_block(ws, capsys):
    _write_piece(ws, "quant", """
        import numpy as np

        def dequantize_q4_0(raw, n):
            blk = np.frombuffer(bytes(raw), np.uint8).reshape(-1, 18)
            d = blk[:, :2].copy().view(np.float16).astype(np.float32)
            q = np.concatenate([blk[:, 2:] & 15, blk[:, 2:] >> 4], axis=1).astype(np.float32)   # no - 8
            return (d * q).reshape(-1)[:n]
        """)
    assert main(["student", "check", "--piece", "quant.dequantize_q4_0", "--workspace", str(ws)]) == 1
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if "quant.dequantize_q4_0" in ln)
    assert "fails" in line and "tensor '" in line and ", row 0, block 0, value " in line, line


BYTE_LEVEL = """
    def decoder(latin1=True):
        def decode_token_str(key):
            out = bytearray()
            for ch in key:
                cp = ord(ch)
                if cp == 0x143:
                    out.append(0xAD)
                elif cp == 0x121:
                    out.append(0x7F)
                elif 0x122 <= cp <= 0x142:
                    out.append(cp - 0xA2)
                elif latin1 and (0xA1 <= cp <= 0xAC or 0xAE <= cp <= 0xFF):
                    out.append(cp)
                else:
                    out += ch.encode("utf-8")
            return bytes(out)
        return decode_token_str
"""


def test_vocab_compiler_dropping_a_byte_class_fails_naming_offset_and_token(ws, capsys):
    # the student forgot that the latin-1 characters stand for their own byte (article 18-2's second class)
    _write_piece(ws, "vocab", BYTE_LEVEL + """
    decode_token_str = decoder(latin1=False)
    """)
    assert main(["student", "check", "--piece", "vocab.decode_token_str", "--workspace", str(ws)]) == 1
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "vocab.decode_token_str" in ln)
    assert "fails" in line and "byte " in line and "the record of token " in line, line


def test_vocab_compiler_with_all_three_classes_passes(ws, capsys):
    _write_piece(ws, "vocab", BYTE_LEVEL + """
    decode_token_str = decoder()
    """)
    assert main(["student", "check", "--piece", "vocab.decode_token_str", "--workspace", str(ws)]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "vocab.decode_token_str" in ln)
    assert "passes" in line and "sha256" in line, line


def test_rope_pairing_neighbours_fails_naming_layer_and_position(ws):
    # GPT-J's pairing (x0, x1), (x2, x3)… where Qwen rotates the halves (x_i, x_{i+D/2}). (Swapping the two
    # output halves would not do: it permutes q and k alike, so q·k and the model's tokens stay the same.)
    _write_piece(ws, "layers", """
        import numpy as np

        def apply_rope(x, cos, sin):
            c, s = cos[:, None, :], sin[:, None, :]
            a, b = x[..., 0::2], x[..., 1::2]
            out = np.empty_like(x)
            out[..., 0::2], out[..., 1::2] = a * c - b * s, b * c + a * s
            return out
        """)
    w = seam.Workspace(ws)
    rows = checks.run(w, ["layers.apply_rope"], log=lambda line: None)
    assert rows[0].status == checks.FAILS, rows[0]
    assert "q rotated at positions " in rows[0].detail and "max |Δ|" in rows[0].detail, rows[0].detail
    engine = checks.run_engine(w.implemented())          # the same piece inside the poem model's golden run
    assert engine.status == checks.FAILS, engine
    assert "after layer 0, at position " in engine.detail and "max |Δ|" in engine.detail, engine.detail


def test_a_module_that_does_not_import_fails_its_pieces_only(ws):
    _write_piece(ws, "chat", "def render(:\n")
    rows = checks.run(seam.Workspace(ws), checks.select(["chat", "moe"]), log=lambda line: None)
    status = {r.key: r.status for r in rows}
    assert status["chat.render"] == checks.FAILS and "does not import" in rows[0].detail
    assert status["moe.route"] == checks.NOT_STARTED


def test_select_by_day_and_unknown_piece():
    assert checks.select(days=[16]) == ["vqf.parse_header", "vqf.parse_directory", "vqf.chain_offsets"]
    with pytest.raises(KeyError, match="no such piece"):
        checks.select(["layers.softmax"])


def test_the_shared_model_cache_is_built_with_the_packages_code(tmp_path, monkeypatch):
    from kestrel_lab import models

    def wrong(x):
        raise AssertionError("a student's piece ran while the shared cache was built")

    monkeypatch.setenv("KESTREL_CACHE_DIR", str(tmp_path / "cache"))
    with seam.swapped({"quant.quantize_q8_0": wrong}):
        with seam.package_only():
            assert seam.get("quant.quantize_q8_0") is None
        assert seam.get("quant.quantize_q8_0") is wrong
        path = models.vqf("qwen3-tiny-poem", quant="q8_0")
    assert path.is_file() and str(path).startswith(str(tmp_path))


def test_a_workspace_of_the_reference_solutions_passes_check_all(tmp_path, capsys):
    """The lessons' folded reference answers, written into a workspace, are a whole engine that passes."""
    from kestrel_lab.student import solutions

    solutions.fill(tmp_path / "ws")
    assert main(["student", "check", "--all", "--workspace", str(tmp_path / "ws")]) == 0
    out = capsys.readouterr().out
    assert f"{len(seam.PIECES)} passes, 0 fails, 0 not started" in out, out
    engine = next(ln for ln in out.splitlines() if ln.split()[1:2] == [checks.ENGINE])
    assert "passes" in engine and "pieces together" in engine, engine


def test_capstone_takes_the_students_pieces_and_the_reference_for_the_rest(ws):
    from kestrel_lab.student import capstone

    _write_piece(ws, "layers", """
        import numpy as np

        def rmsnorm(x, w, eps):
            x64 = np.asarray(x, np.float64)
            return (x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + eps) * w).astype(np.float32)
        """)
    mine = capstone.assemble(seam.Workspace(ws))
    assert mine.origin["layers.rmsnorm"] == capstone.YOURS
    assert {o for k, o in mine.origin.items() if k != "layers.rmsnorm"} == {capstone.REFERENCE}
    assert all(not seam.is_skeleton(fn) for fn in mine.functions.values())
    with mine.counting():
        from kestrel_lab.golden import _open

        eng = _open("qwen3-tiny-poem", "f32")
        eng.forward_all([151644, 872, 198])
    assert mine.calls["layers.rmsnorm"] > 0 and mine.calls["moe.route"] == 0
    assert seam.active() == {}
