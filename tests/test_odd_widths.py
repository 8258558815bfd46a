"""F32 and F16 files take any width; quantized files need their block size, and ``convert`` says so before it
writes a byte. Checkpoints saved by transformers with an FFN of 40, a vocabulary of 4,098 rows and (dense)
a hidden size of 48, converted to F32/F16 and run against transformers, prefill and decode; Qwen3-MoE with
odd expert and dense widths too."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is a reference dependency (requirements-ref.txt)")
transformers = pytest.importorskip("transformers", reason="transformers is a reference dependency")

from kestrel_lab import models  # noqa: E402  (after importorskip)
from kestrel_lab.convert import ConversionError, convert  # noqa: E402  (after importorskip)
from kestrel_lab.engine import Qwen3Engine  # noqa: E402  (after importorskip)
from kestrel_lab.vqf.reader import open_vqf  # noqa: E402  (after importorskip)
from helpers.logits import compare_steps  # noqa: E402  (after importorskip)

IDS = [3, 5, 7, 11, 13, 17, 400, 4097, 2, 9, 1000, 4000]
CASES = {
    "dense-f32": ("qwen3", {"vocab_size": 4098, "intermediate_size": 40, "hidden_size": 48, "head_dim": 16}, "float32"),
    "dense-f16": ("qwen3", {"vocab_size": 4098, "intermediate_size": 40}, "float16"),
    "moe-f32": ("qwen3_moe", {"vocab_size": 4098, "intermediate_size": 40, "moe_intermediate_size": 24,
                              "mlp_only_layers": [1]}, "float32"),
}


@pytest.fixture(scope="module", params=list(CASES), ids=list(CASES))
def odd(request):
    arch, overrides, dtype = CASES[request.param]
    d = models.hf_checkpoint(arch=arch, overrides={**overrides, "bos_token_id": 1, "eos_token_id": 2},
                             saver="transformers", dtype=dtype)
    model = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = model(torch.tensor([IDS])).logits[0].numpy()
    return request.param, d, dtype, ref


@pytest.mark.parametrize("quant", ["f32", "f16"])
def test_float_files_of_any_width_run_equal_to_transformers(odd, quant, tmp_path):
    name, d, dtype, ref = odd
    out = tmp_path / f"{quant}.vqf"
    convert(d, out, quant=quant, hash_source=False)
    eng = Qwen3Engine.from_vqf(out, max_context=64)
    # an F16 file of an F32 checkpoint rounds the weights: that costs ~1e-3 of the logit scale, not more
    tol = 2e-3 if quant == "f16" and dtype == "float32" else 1e-5
    compare_steps(eng, ref, IDS[:6], IDS[6:], tol=tol, label=f"{name} {quant}")


@pytest.mark.parametrize("quant", ["q8_0", "q4_0", "q4_8x8l"])
def test_a_quant_that_cannot_hold_a_width_is_refused_before_writing(odd, quant, tmp_path):
    name, d, dtype, ref = odd
    out = tmp_path / "x.vqf"
    with pytest.raises(ConversionError, match=rf"config\.json: --quant {quant}: {quant.upper()} cannot hold entry "
                                              r"\w+ \([\d,]+ × [\d,]+, from model\.[\w.]+.*\): .* not a multiple "
                                              r"\(.* is config\.json's \w+.*\); .*f32"):
        convert(d, out, quant=quant, hash_source=False)
    assert not list(tmp_path.iterdir())                 # nothing written, not even a temporary file


def test_vocab_of_4098_rows_refused_only_by_the_row_interleaved_layout(tmp_path):
    d = models.hf_checkpoint(arch="qwen3", overrides={"vocab_size": 4098, "bos_token_id": 1, "eos_token_id": 2},
                             saver="transformers", dtype="float32")
    with pytest.raises(ConversionError, match=r"Q4_8X8L cannot hold entry q4_lm \(4,098 × 64.*rows = 4,098 is not "
                                              r"a multiple \(the row count is config\.json's vocab_size\)"):
        convert(d, tmp_path / "r.vqf", quant="q4_8x8l", hash_source=False)
    convert(d, tmp_path / "q.vqf", quant="q4_0", hash_source=False)
    with open_vqf(tmp_path / "q.vqf") as vf:           # every quant's block rule is not every file's rule
        assert vf.tensors["q4_lm"].rows == 4098
