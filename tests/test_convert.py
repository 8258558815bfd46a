"""safetensors → VQF: every entry, dequantized, equals the stacked source weights within its qtype's bound.

Error bounds, per 32-value block (d computed in float32 from the source block, d16 = fp16(d), the scale
the file stores):
- F32: exact.  F16: exactly IEEE round-to-nearest-even of x, hence |x − x̂| ≤ max(|x|·2⁻¹¹, 2⁻²⁵)
  (half an fp16 ulp; the subnormal step is 2⁻²⁴).
- Q8_0: d = max|x|/127; |x − x̂| ≤ d/2 + 127·|d − d16| (rounding to the grid, plus the scale's own
  fp16 rounding times the largest |q|).
- Q4_0 (and Q4_8X8L, the same blocks repacked): d = m/−8 with m the value of largest magnitude;
  values with x/d ≤ 7.5 land on the grid: |x − x̂| ≤ |d|/2 + 8·|d − d16|; the few above (the opposite
  extreme, clipped to q = 15) are within |d| + 8·|d − d16|.
Each bound is scaled by 1 + 1e-5 for float32 arithmetic.
"""
import hashlib
import json
import os

import numpy as np
import pytest

from kestrel_lab import paths
from kestrel_lab import quant as Q
from kestrel_lab.cli import main as cli_main
from kestrel_lab.config import ModelConfig
from kestrel_lab.convert import ConversionError, check_sources, convert
from kestrel_lab.safetensors import open_checkpoint
from kestrel_lab.tiny_model import make_tiny_model
from kestrel_lab.vqf.layout import plan
from kestrel_lab.vqf.reader import open_vqf

SLACK = np.float32(1 + 1e-5)


def _small(arch):
    return {"vocab_size": 1024} if arch == "qwen3" else {"text_config": {"vocab_size": 1024}}


def stacked_source(ck, spec) -> np.ndarray:
    """The build rule, written independently: each source reshaped to (-1, cols), rows concatenated."""
    return np.concatenate([ck.f32(src).reshape(-1, spec.cols) for src in spec.sources], axis=0)


def assert_within_bound(x: np.ndarray, xh: np.ndarray, qt: Q.QType, what: str):
    assert x.shape == xh.shape, what
    if qt is Q.F32:                # bit for bit (faster than assert_array_equal on 39 M values)
        assert np.array_equal(xh.view(np.uint32), np.ascontiguousarray(x).view(np.uint32)), what
        return
    if qt is Q.F16:                # IEEE round-to-nearest-even, which implies the half-ulp bound
        assert np.array_equal(xh, x.astype(np.float16).astype(np.float32)), what
        return
    b = x.reshape(x.shape[0], -1, 32)
    e = np.abs(x - xh).reshape(b.shape)   # float32: exact when x and x̂ are close (Sterbenz), else one rounding
    if qt is Q.Q8_0:
        d = np.abs(b).max(axis=-1, keepdims=True) / np.float32(127)
        bound = d / 2 + 127 * np.abs(d - d.astype(np.float16).astype(np.float32))
        assert (e <= bound * SLACK + 1e-30).all(), f"{what}: Q8_0 error over bound"
        return
    idx = np.abs(b).argmax(axis=-1)[..., None]
    d = np.take_along_axis(b, idx, axis=-1) / np.float32(-8)
    dd = 8 * np.abs(d - d.astype(np.float16).astype(np.float32))
    with np.errstate(divide="ignore", invalid="ignore"):
        clipped = (d != 0) & (b / d > 7.5)
    assert (e <= (np.abs(d) / 2 + dd) * SLACK + 1e-30)[~clipped].all(), f"{what}: Q4_0 grid error over bound"
    assert (e <= (np.abs(d) + dd) * SLACK + 1e-30).all(), f"{what}: Q4_0 clipped error over bound"


def check_file(vqf_path, hf_dir, quant, verify=True):
    """Every entry of the file against the checkpoint; the header's config and signature too."""
    with open_checkpoint(hf_dir) as ck, open_vqf(vqf_path, verify=verify) as f:
        cfg = ModelConfig.from_hf(hf_dir)
        assert f.config == cfg
        specs = plan(cfg, quant)
        assert [e.name for e in f.entries] == [s.name for s in specs]
        for s in specs:
            t = f[s.name]
            assert (t.qtype, t.rows, t.cols) == (s.qtype, s.rows, s.cols)
            assert_within_bound(stacked_source(ck, s), t.dequantize(), Q.qtype(s.qtype), f"{hf_dir.name}:{s.name}")
        return f.source, ck


# ----------------------------------------------------------------------------- tiny models
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    base = tmp_path_factory.mktemp("conv")
    return {arch: make_tiny_model(base / arch, arch, seed=21, overrides=_small(arch)) for arch in ("qwen3", "qwen3_vl")}


@pytest.mark.parametrize("quant", ["f32", "f16", "q8_0", "q4_0", "q4_8x8l"])
@pytest.mark.parametrize("arch", ["qwen3", "qwen3_vl"])
def test_dequantized_entries_equal_source_within_bound(tiny, tmp_path, arch, quant):
    out = tmp_path / f"{arch}_{quant}.vqf"
    rep = convert(tiny[arch], out, quant, chunk_values=3000)   # small chunks: many parts per entry
    assert rep.n_tensors == (41 if arch == "qwen3_vl" else 14)
    assert rep.output_bytes == out.stat().st_size
    source, ck = check_file(out, tiny[arch], quant)
    files = sorted(p for p in tiny[arch].glob("*.safetensors"))
    assert source["sha256"] == hashlib.sha256(b"".join(p.read_bytes() for p in files)).hexdigest()
    assert source["bytes"] == sum(p.stat().st_size for p in files) and source["n_files"] == len(files)
    assert source["dtype"] == "bf16" and source["quant"] == quant and source["model"] == arch
    assert source["tool"].startswith("kestrel-lab ")


@pytest.mark.parametrize("quant", ["q8_0", "q4_0"])
def test_quantized_bytes_equal_gguf(tiny, tmp_path, quant):
    gguf = pytest.importorskip("gguf")
    from gguf import quants as gq
    out = tmp_path / f"g_{quant}.vqf"
    convert(tiny["qwen3_vl"], out, quant, hash_source=False)
    gtype = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0}
    with open_checkpoint(tiny["qwen3_vl"]) as ck, open_vqf(out) as f:
        for s in plan(ck.config(), quant):
            if s.qtype in (Q.Q8_0.id, Q.Q4_0.id):
                ref = gq.quantize(stacked_source(ck, s), gtype[Q.qtype(s.qtype).name.lower()])
                assert np.array_equal(f[s.name].data, ref.reshape(-1)), s.name


def test_q4_8x8l_is_the_q4_0_file_repacked(tiny, tmp_path):
    a, b = tmp_path / "a.vqf", tmp_path / "b.vqf"
    convert(tiny["qwen3"], a, "q4_0", hash_source=False)
    convert(tiny["qwen3"], b, "q4_8x8l", hash_source=False)
    with open_vqf(a) as fa, open_vqf(b) as fb:
        for e in fb.entries:
            if e.qtype == Q.Q4_8X8L.id:
                assert np.array_equal(Q.unpack_q4_8x8l(e.data, e.rows, e.cols).reshape(-1), fa[e.name].data)
            else:
                assert np.array_equal(e.data, fa[e.name].data)


# ----------------------------------------------------------------------------- checkpoints written by transformers
@pytest.mark.parametrize("arch, tie", [("qwen3", False), ("qwen3", True), ("qwen3_vl", True), ("qwen3_vl", False)])
def test_layout_names_match_what_transformers_saves(tmp_path, arch, tie):
    """The layout table's HF names against save_pretrained of the transformers classes themselves."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from kestrel_lab.tiny_model import build_config
    over = _small(arch)
    if arch == "qwen3":
        over["tie_word_embeddings"] = tie
    else:
        over["tie_word_embeddings"] = tie
        over["text_config"]["tie_word_embeddings"] = tie
    cfg = build_config(arch, over, dtype="float32")
    cls = transformers.Qwen3ForCausalLM if arch == "qwen3" else transformers.Qwen3VLForConditionalGeneration
    torch.manual_seed(1)
    model = cls(transformers.AutoConfig.for_model(**cfg))
    model.save_pretrained(tmp_path / "hf")
    with open_checkpoint(tmp_path / "hf") as ck:
        mc = ck.config()
        specs = plan(mc, "q8_0")
        check_sources(ck, specs)                      # every source name exists and splits into rows
        used = {s for spec in specs for s in spec.sources}
        assert set(ck.keys()) - used == set()         # and every saved tensor has a place
    out = tmp_path / "m.vqf"
    convert(tmp_path / "hf", out, "f32")
    sd = model.state_dict()
    prefix = "model.language_model." if arch == "qwen3_vl" else "model."
    with open_vqf(out) as f:
        L, qd = mc.num_hidden_layers, mc.q_dim
        q = f["q4_q"].dequantize().reshape(L, qd, mc.hidden_size)
        for i in range(L):
            np.testing.assert_array_equal(q[i], sd[f"{prefix}layers.{i}.self_attn.q_proj.weight"].numpy())
        lm = sd["lm_head.weight"].numpy()
        np.testing.assert_array_equal(f["q4_lm"].dequantize(), lm)
        if arch == "qwen3_vl":
            w = sd["model.visual.patch_embed.proj.weight"].numpy()          # Conv3d (hidden, C, T, P, P)
            np.testing.assert_array_equal(f["v_patch"].dequantize(), w.reshape(w.shape[0], -1))
            qkv = f["v_q8_qkv"].dequantize()
            np.testing.assert_array_equal(qkv[-qkv.shape[0] // 2:],
                                          sd["model.visual.blocks.1.attn.qkv.weight"].numpy())


# ----------------------------------------------------------------------------- the trained poem model
@pytest.mark.parametrize("quant", ["f32", "f16", "q8_0", "q4_0"])
def test_trained_poem_model_converts(tmp_path, quant):
    out = tmp_path / f"poem_{quant}.vqf"
    rep = convert(paths.tiny_poem_dir(), out, quant, hash_source=(quant == "q4_0"))
    assert rep.unused == []            # tied: the checkpoint has no lm_head.weight
    source, _ = check_file(out, paths.tiny_poem_dir(), quant, verify=quant == "q4_0")  # one FNV pass is enough
    if quant == "q4_0":                # the README's sha256 of model.safetensors
        assert source["sha256"] == "2ac9409badc6537b9a03cf1366f9622550a589921781418275ac63f9298ccf29"


# ----------------------------------------------------------------------------- config styles, shards
def _data_area(path):
    with open_vqf(path) as f:
        lo, hi = f.data_offset, f.file_len
    return path.read_bytes()[lo:hi + 8]


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_vl"])
def test_both_config_styles_and_shards_convert_to_the_same_weights(tmp_path, arch):
    v5 = make_tiny_model(tmp_path / "v5", arch, 8, _small(arch), style="hf5")
    v4 = make_tiny_model(tmp_path / "v4", arch, 8, _small(arch), style="hf4")
    sh = make_tiny_model(tmp_path / "sh", arch, 8, _small(arch), style="hf4", max_shard_bytes=50_000)
    v4_config = json.loads((v4 / "config.json").read_text())
    assert "rope_theta" in v4_config.get("text_config", v4_config)
    outs = []
    for d in (v5, v4, sh):
        outs.append(tmp_path / f"{d.name}.vqf")
        convert(d, outs[-1], "q4_0", hash_source=False)
    areas = [_data_area(p) for p in outs]       # data + FNV trailer (covers the directory too)
    assert areas[0] == areas[1] == areas[2]
    cfgs = []
    for p in outs:
        with open_vqf(p) as f:
            cfgs.append(f.config)
    assert cfgs[0] == cfgs[1] == cfgs[2]
    if arch == "qwen3_vl":
        assert cfgs[0].mrope_section == [6, 5, 5] and cfgs[0].rope_theta == 5e6


# ----------------------------------------------------------------------------- errors
def test_missing_tensor_named_and_nothing_written(tmp_path, tiny):
    from kestrel_lab.safetensors import save_safetensors
    d = tmp_path / "broken"
    d.mkdir()
    (d / "config.json").write_text((tiny["qwen3"] / "config.json").read_text())
    with open_checkpoint(tiny["qwen3"]) as ck:
        save_safetensors(d / "model.safetensors",
                         {n: ("BF16", np.array(ck.raw(n))) for n in ck.keys() if "layers.1.self_attn.k_norm" not in n})
    with pytest.raises(ConversionError, match=r"model.layers.1.self_attn.k_norm.weight \(for k_norm\)"):
        convert(d, tmp_path / "x.vqf")
    assert not (tmp_path / "x.vqf").exists()


def test_config_that_does_not_match_the_weights(tmp_path, tiny):
    d = tmp_path / "mismatch"
    d.mkdir()
    cfg = json.loads((tiny["qwen3"] / "config.json").read_text())
    cfg["intermediate_size"] = 160
    (d / "config.json").write_text(json.dumps(cfg))
    os.symlink(tiny["qwen3"] / "model.safetensors", d / "model.safetensors")
    with pytest.raises(ConversionError, match=r"q4_gate: its sources give 384 rows of 64, the plan needs 320"):
        convert(d, tmp_path / "y.vqf")


def test_weights_without_a_place_are_refused(tmp_path):
    d = make_tiny_model(tmp_path / "bias", "qwen3", 0, {"vocab_size": 256, "attention_bias": True})
    # the config says so: refused by name before the weights are looked at (config_fields: attention_bias)
    with pytest.raises(ValueError, match=r"bias/config\.json: field 'attention_bias' at line \d+ .*is True: not "
                                         r"implemented"):
        convert(d, tmp_path / "z.vqf")
    cfg = json.loads((d / "config.json").read_text())
    cfg["attention_bias"] = False                      # the weights still carry the biases
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConversionError, match=r"'model.layers.0.self_attn.k_proj.bias' .*has no place"):
        convert(d, tmp_path / "z.vqf")
    assert not list(tmp_path.glob("*.vqf")) and not list(tmp_path.glob(".z.vqf*"))


def test_f16_overflow_is_reported(tmp_path):
    from kestrel_lab.safetensors import save_safetensors
    d = make_tiny_model(tmp_path / "big", "qwen3", 0, {"vocab_size": 256}, dtype="float32")
    with open_checkpoint(d) as ck:
        tensors = {n: np.array(ck.raw(n)) for n in ck.keys()}
    tensors["model.layers.0.mlp.up_proj.weight"][5, 7] = 1e6
    save_safetensors(d / "model.safetensors", tensors)
    with pytest.raises(ConversionError, match=r"up_proj.weight': value 1e\+06 at row 5 overflows F16 \(entry q4_up\)"):
        convert(d, tmp_path / "o.vqf", "f16")


# ----------------------------------------------------------------------------- memory and the CLI
def test_conversion_streams_in_bounded_memory(tmp_path):
    """The true peak RSS (VmHWM, reset on entry) while converting the 84 MB poem model to a 324 MB F32
    file — the largest entry alone is 156 MB as float32 — stays well under the model's size."""
    import numpy as np
    from kestrel_lab.procfs import PeakRSS
    from kestrel_lab.vqf.checksum import warm_up
    warm_up()                                   # numba's one-off memory is not the converter's
    Q.quantize(np.ones((8, 64), np.float32), "q4_0")
    with PeakRSS() as mem:
        rep = convert(paths.tiny_poem_dir(), tmp_path / "p.vqf", "f32", hash_source=False)
    if not mem.exact:
        pytest.skip("/proc/self/clear_refs is not available: cannot reset the peak RSS")
    assert rep.output_bytes > 3 * rep.source_bytes
    assert mem.growth < 0.4 * rep.source_bytes, (mem.growth, rep.source_bytes)
    # and the whole-entry way of doing it does exceed that bound (the test can fail)
    with PeakRSS() as whole:
        x = Q.bf16_to_f32(open_checkpoint(paths.tiny_poem_dir()).raw("model.embed_tokens.weight"))
        del x
    assert whole.growth > 0.4 * rep.source_bytes


def test_cli_convert_json(tmp_path, tiny, capsys):
    out = tmp_path / "c.vqf"
    assert cli_main(["convert", str(tiny["qwen3_vl"]), "-o", str(out), "--quant", "q8_0", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["n_tensors"] == 41 and rep["output_bytes"] == out.stat().st_size and rep["mb_per_s"] > 0
    assert cli_main(["convert", str(tmp_path / "nowhere"), "-o", str(tmp_path / "n.vqf")]) == 1
    assert "not a folder" in capsys.readouterr().err


def test_name_map_table_is_generated_from_the_layout():
    from kestrel_lab.convert import name_map, name_map_markdown, source_pattern
    cfg = ModelConfig.from_hf(paths.configs_dir() / "qwen3-vl-2b-instruct.config.json")
    rows = name_map(cfg)
    assert [r["entry"] for r in rows] == [s.name for s in plan(cfg)] and len(rows) == 41
    by = {r["entry"]: r for r in rows}
    assert by["q4_q"]["sources"] == "model.language_model.layers.{i}.self_attn.q_proj.weight, i = 0..27"
    assert by["v_ds_fc1"]["sources"] == "model.visual.deepstack_merger_list.{i}.linear_fc1.weight, i = 0..2"
    assert by["q4_lm"]["sources"] == "model.language_model.embed_tokens.weight"     # tied
    md = name_map_markdown(cfg)
    assert md.count("\n") == 42 and "| 18 | `v_patch` | F32 | 1,024 × 1,536 |" in md
    assert source_pattern(("a.1.x", "a.3.x")) == "a.1.x + a.3.x"              # not a run: listed


def test_summary_labels_the_source_and_the_output_hash(tmp_path):
    """A reader expects `sha256sum model.vqf` next to the output: both hashes are there, labelled."""
    from kestrel_lab.models import hf_checkpoint

    out = tmp_path / "m.vqf"
    rep = convert(hf_checkpoint(), out, "q8_0")
    assert rep.output_sha256 == hashlib.sha256(out.read_bytes()).hexdigest()
    text = rep.summary()
    assert f"output sha256 (this VQF) {rep.output_sha256[:16]}" in text
    assert f"source sha256 (safetensors) {rep.sha256[:16]}" in text
