"""``kestrel-lab generate --image`` and ``/image`` in ``kestrel-lab chat`` on a random Qwen3-VL model.

The continuation must be the one the engine's own ``VLConversation`` gives for the same picture
(which test_vl_engine checks against transformers); bad pictures give the preprocessing's message,
exit code 2 and no traceback."""
from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from kestrel_lab import cli, models
from kestrel_lab.engine.vl import VLConversation, open_engine
from kestrel_lab.vision.preprocess import load_image
from kestrel_lab.vocab import Tokenizer


@pytest.fixture(scope="module")
def vqf():
    return models.vqf(arch="qwen3_vl", quant="q8_0", seed=3)


@pytest.fixture(scope="module")
def pictures(tmp_path_factory):
    d = tmp_path_factory.mktemp("pics")
    rng = np.random.default_rng(0)
    out = []
    for i, (h, w) in enumerate([(200, 300), (256, 256)]):
        p = d / f"pic{i}.png"
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(p)
        out.append(p)
    bad = d / "bad.png"
    bad.write_bytes(b"this is not a picture")
    return out, bad


def engine_reply(vqf, paths, text, n):
    eng = open_engine(vqf, max_context=1024)
    conv = VLConversation(eng, Tokenizer.default(), max_new=n)
    return conv.ask(text, [load_image(p, vision=eng.config.vision) for p in paths])


def test_generate_with_two_images_says_what_the_engine_says(vqf, pictures, capsys):
    paths, _ = pictures
    rc = cli.main(["generate", str(vqf), "--image", str(paths[0]), "--image", str(paths[1]),
                   "--prompt", "这两张图里有什么？", "--max-new", "6"])
    out = capsys.readouterr()
    assert rc == 0
    want = engine_reply(vqf, paths, "这两张图里有什么？", 6)
    assert out.out.rstrip("\n") == want.text
    assert "vision 2 img:" in out.err and f"{want.stats.images[0][0]} tok" in out.err
    assert "Traceback" not in out.err


def test_bad_images_exit_2_with_the_file_named(vqf, pictures, capsys):
    paths, bad = pictures
    rc = cli.main(["generate", str(vqf), "--image", str(bad), "--prompt", "x"])
    err = capsys.readouterr().err
    assert rc == 2 and str(bad) in err and "Traceback" not in err
    rc = cli.main(["generate", str(vqf), "--image", str(paths[0]), "--prompt", "x", "--max-pixels", "1000"])
    assert rc == 2
    rc = cli.main(["generate", str(vqf), "--image", str(paths[0]), "--prompt", "x", "--raw"])
    assert rc == 1 and "chat mode" in capsys.readouterr().err


def test_a_photo_past_the_context_is_scaled_to_fit_or_refused_naming_the_option(vqf, tmp_path, capsys):
    """A 2000×1500 photo would take 2,914 image tokens; with --ctx 200 it is scaled to fit, saying so; with
    an explicit --max-pixels that does not fit it is refused before decoding, naming the file and the
    option, exit 2 like every other picture the preprocessing refuses."""
    y, x = np.mgrid[0:1500, 0:2000]
    photo = tmp_path / "photo.jpg"
    Image.fromarray(np.stack([x % 256, y % 256, (x + y) % 256], -1).astype(np.uint8)).save(photo, quality=90)
    rc = cli.main(["generate", str(vqf), "--image", str(photo), "--prompt", "这是什么？", "--max-new", "4",
                   "--ctx", "200"])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert f"note: {photo}: 2000×1500 would take 2,914 image tokens" in err and "scaled to fit" in err
    tokens = int(err.split("vision 1 img: ")[1].split(" tok")[0])
    assert tokens <= 200 - 4
    rc = cli.main(["generate", str(vqf), "--image", str(photo), "--prompt", "这是什么？", "--max-new", "4",
                   "--ctx", "200", "--max-pixels", "16777216"])
    err = capsys.readouterr().err
    assert rc == 2 and f"{photo}: 2000×1500 resizes to 2,914 image tokens" in err and "--max-pixels" in err
    assert "nothing was decoded" in err and "Traceback" not in err


def test_image_on_a_text_model_is_refused(pictures, capsys):
    text = models.vqf(arch="qwen3", quant="q8_0")
    rc = cli.main(["generate", str(text), "--image", str(pictures[0][0]), "--prompt", "x"])
    assert rc == 1 and "vision tower" in capsys.readouterr().err


def test_chat_image_command(vqf, pictures, capsys, monkeypatch):
    paths, bad = pictures
    monkeypatch.setattr("sys.stdin", io.StringIO(f"/image {paths[0]}\n这是什么？\n/image {bad}\n"
                                                 f"/image {paths[1]}\n那这张呢？\n\n"))
    rc = cli.main(["chat", str(vqf), "--max-new", "4"])
    out = capsys.readouterr()
    assert rc == 0
    lines = [ln for ln in out.err.splitlines() if ln.startswith("[prompt")]
    assert len(lines) == 2 and "vision 1 img" in lines[0] and "vision 1 img" in lines[1]
    assert "cached)" in lines[1]                      # the first turn stayed in the KV cache
    assert str(bad) in out.err and "Traceback" not in out.err
    assert "image 1 attached" in out.err


def test_time_to_first_token_of_the_tiny_vl_model():
    from kestrel_lab.bench import vision as VB

    r = VB.time_to_first_token(VB.ttft_vqf("qwen3-tiny-vl"), 1)
    assert r["grid"] == [1, 30, 40] and r["image_tokens"] == 300 and r["tokens"] > 300
    assert all(r[k] > 0 for k in ("preprocess", "tower", "prefill"))
    assert abs(r["total"] - (r["preprocess"] + r["tower"] + r["prefill"])) < 1e-6
    assert "TTFT qwen3-tiny-vl, 1 thread: preprocess" in VB.format_table(
        {"threads": [1], "grid": [1, 30, 40], "vqf": "x.vqf", "matmul_gflops": 1.0, "ttft": {"qwen3-tiny-vl": {1: r}},
         "engine": {1: {"tokens": 300, "flops": 1e12, "weight_qtypes": {"a": "Q8_0"}, "seconds": 1.0,
                        "gflops": 1.0}}})


def test_bench_vision_on_the_tiny_shapes(capsys):
    pytest.importorskip("torch", reason="the bench compares with PyTorch (requirements-ref.txt)")
    cfg = models.hf_checkpoint(arch="qwen3_vl") / "config.json"
    rc = cli.main(["bench", "--vision", "--config", str(cfg), "--threads", "1", "--json"])
    out = capsys.readouterr()
    assert rc == 0
    import json

    res = json.loads(out.out)
    e = res["engine"]["1"]
    assert e["tokens"] == 300 and e["seconds"] > 0 and e["gflops"] > 0
    assert set(e["weight_qtypes"].values()) == {"Q8_0"}
    # same weights (the Q8_0 matrices dequantized for PyTorch); the engine's int8 GEMM (kernels.q8gemm)
    # quantizes the activations to Q8_0 once per matmul, which moves the output by ~1e-2 of its scale
    # (before it, a float32 sgemm on the widened rows, it was float rounding only: < 1e-4)
    assert res["torch"]["fp32"]["max_rel_diff_to_engine"] < 0.03
    assert res["torch"]["bf16"]["max_rel_diff_to_engine"] < 0.1
