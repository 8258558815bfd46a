"""`kestrel-lab generate` and `kestrel-lab chat` on the trained poem model (real engine, Q8_0 VQF)."""
from __future__ import annotations

import io
import json

import pytest

from kestrel_lab import cli
from kestrel_lab.engine.cli import unescape_prompt
from kestrel_lab import models
from kestrel_lab.paths import tiny_poem_dir

POEM = "床前明月光，疑是地上霜。\n举头望明月，低头思故乡。\n"


@pytest.fixture(scope="module")
def vqf():
    return models.vqf("qwen3-tiny-poem", quant="q8_0")


def test_unescape_prompt():
    assert unescape_prompt(r"《夜思》\n作者：李白\n") == "《夜思》\n作者：李白\n"
    assert unescape_prompt("real\nnewline") == "real\nnewline"
    assert unescape_prompt(r"a\\nb\tc\q") == "a\\nb\tc\\q"


def test_poem_vqf_is_cached(vqf):
    again = models.vqf("qwen3-tiny-poem", quant="q8_0")
    assert again == vqf and vqf.stat().st_mtime_ns == again.stat().st_mtime_ns
    stamp = json.loads(vqf.with_suffix(".vqf.json").read_text(encoding="utf-8"))
    assert stamp["quant"] == "q8_0" and "model.safetensors" in stamp["files"]


def test_generate_recites_the_poem(vqf, capsys):
    rc = cli.main(["generate", str(vqf), "--prompt", r"《夜思》\n作者：李白\n", "--temperature", "0"])
    out = capsys.readouterr()
    assert rc == 0
    assert out.out == POEM
    assert "prefill 9 tok" in out.err and "stop: stop" in out.err


def test_generate_with_the_engines_greedy_encoder(vqf, capsys):
    case = json.loads((tiny_poem_dir() / "greedy.json").read_text(encoding="utf-8"))["cases"][1]
    text = case["greedy_text"].replace("<|endoftext|>", "")
    cli.main(["generate", str(vqf), "--prompt", case["prompt"], "--max-new", "48", "--tokenizer", "greedy",
              "--echo"])
    assert capsys.readouterr().out == case["prompt"] + text


def test_generate_seeded_sampling_repeats(vqf, capsys):
    args = ["generate", str(vqf), "--prompt", "《春晓》\n", "--temperature", "1.2", "--top-k", "20",
            "--seed", "3", "--max-new", "8"]
    cli.main(args)
    a = capsys.readouterr().out
    cli.main(args)
    b = capsys.readouterr().out
    assert a == b and a


def test_generate_bad_arguments(vqf, capsys):
    assert cli.main(["generate", str(vqf), "--prompt", "x", "--top-p", "0"]) == 1
    assert "top_p" in capsys.readouterr().err
    assert cli.main(["generate", str(vqf) + ".missing", "--prompt", "x"]) == 1


def test_chat_reads_stdin_and_quits_on_empty_line(vqf, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("《夜思》\n第二问\n\n不会读到这里\n"))
    rc = cli.main(["chat", str(vqf), "--max-new", "12", "--no-think"])
    out = capsys.readouterr()
    assert rc == 0
    assert out.out.count("你> ") == 3 and out.out.count("助手> ") == 2
    assert "不会读到这里" not in out.out
    lines = [line for line in out.err.splitlines() if line.startswith("[prompt")]
    assert len(lines) == 2 and "cached" in lines[1]


def test_chat_ends_at_end_of_input(vqf, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("你好"))  # no newline, then EOF
    assert cli.main(["chat", str(vqf), "--max-new", "4"]) == 0
    assert capsys.readouterr().out.count("助手> ") == 1


def test_generate_chat_mode_wraps_the_prompt_in_the_template(vqf, capsys):
    from kestrel_lab.vocab import default_tokenizer_json

    rc = cli.main(["generate", str(vqf), "--chat", "--no-think", "--system", "背诗", "--prompt", "你好",
                   "--max-new", "3", "--echo", "--tokenizer-json", str(default_tokenizer_json())])
    out = capsys.readouterr().out
    assert rc == 0
    assert out.startswith("<|im_start|>system\n背诗<|im_end|>\n<|im_start|>user\n你好<|im_end|>\n"
                          "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert cli.main(["generate", str(vqf), "--system", "x", "--prompt", "y"]) == 1
    assert "--system needs --chat" in capsys.readouterr().err
