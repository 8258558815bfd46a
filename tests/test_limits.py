"""The one table of bounds and the memory check: each known failure reproduced with a hand-made file,
refused by the loader's own error class naming the file, the field and the byte offset, before
anything big is allocated."""
from __future__ import annotations

import dataclasses
import json
import struct
import tracemalloc

import numpy as np
import pytest

from kestrel_lab import limits, memory_check
from kestrel_lab.config import ConfigError, ModelConfig
from kestrel_lab.engine.model import Qwen3Engine
from kestrel_lab.paths import configs_dir
from kestrel_lab.safetensors import SafetensorsError, parse_header
from kestrel_lab.vocab import VocabFormatError, parse_vocab_bin
from kestrel_lab.vqf import format as F
from kestrel_lab.vqf import synth
from kestrel_lab.vqf.reader import open_vqf

SMALL = {"model_type": "qwen3", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-6,
         "rope_theta": 1e6, "max_position_embeddings": 256, "vocab_size": 1024, "tie_word_embeddings": True}


@pytest.fixture(scope="module")
def small_vqf(tmp_path_factory):
    path = tmp_path_factory.mktemp("limits") / "small.vqf"
    synth.write_model(path, ModelConfig.from_hf(SMALL), "q4_0")
    return path


def _patched(src, dst, field, value):
    d = bytearray(src.read_bytes())
    f = F.HEADER_FIELD[field]
    struct.pack_into("<" + f.code, d, f.offset, value)
    dst.write_bytes(d)
    return dst


# ------------------------------------------------------------------ the five failures (VQF)
KNOWN = {
    # field, value, what happened before: the message must name the field at its offset
    "huge_layer_count": ("num_hidden_layers", 4_000_000_000, r"field num_hidden_layers at offset 32: "
                                                             r"4,000,000,000: expected an integer in \[1, 1,024\]"),
    "nan_epsilon": ("rms_norm_eps", float("nan"), r"field rms_norm_eps at offset 48: nan: expected a finite number"),
    "zero_context": ("max_position_embeddings", 0, r"field max_position_embeddings at offset 64: 0: expected"),
    "unparseable_date": ("created", 2**62, r"field created at offset 344: 4,611,686,018,427,387,904: expected "
                                           r"an integer in \[0, 253,402,300,799\]"),
    "rope_theta_zero": ("rope_theta", 0.0, r"field rope_theta at offset 56: 0: expected a finite number in "
                                           r"\[10, 1e\+12\]"),
    "negative_epsilon": ("rms_norm_eps", -1e-6, r"field rms_norm_eps at offset 48"),
    "infinite_theta": ("rope_theta", float("inf"), r"field rope_theta at offset 56: inf"),
    "zero_heads": ("num_attention_heads", 0, r"field num_attention_heads at offset 36: 0"),
    "gqa_not_dividing": ("num_key_value_heads", 3, r"field num_key_value_heads at offset 40: 3: expected "
                                                   r"num_attention_heads % num_key_value_heads == 0"),
    "odd_head_dim": ("head_dim", 15, r"field head_dim at offset 44: 15: expected head_dim is even"),
    "huge_vocab": ("vocab_size", 2**31, r"field vocab_size at offset 20: 2,147,483,648"),
}


@pytest.mark.parametrize("case", list(KNOWN))
def test_absurd_header_config_refused_before_planning(case, small_vqf, tmp_path):
    field, value, pattern = KNOWN[case]
    path = _patched(small_vqf, tmp_path / f"{case}.vqf", field, value)
    tracemalloc.start()
    try:
        with pytest.raises(F.VQFFormatError, match=pattern) as err:
            Qwen3Engine.from_vqf(path, max_context=32)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(err.value).startswith(str(path))
    assert peak < 8 << 20, f"{peak:,} bytes allocated before the refusal"   # before: 4e9 names / a KV cache


def test_rope_theta_zero_in_memory_is_refused_by_the_engine(small_vqf):
    with open_vqf(small_vqf) as vf:
        cfg = dataclasses.replace(vf.config, rope_theta=0.0)
        with pytest.raises(limits.LimitError, match=r"^<tensors>: field rope_theta: 0: expected"):
            Qwen3Engine.from_tensors(cfg, vf.tensors, max_context=16)
        with pytest.raises(limits.LimitError, match=r"^<tensors>: field max_context: 0"):
            Qwen3Engine.from_tensors(vf.config, vf.tensors, max_context=0)


def test_entry_qtype_must_be_one_a_converter_writes(small_vqf, tmp_path):
    # final_norm (F32, 1×64 = 256 bytes) relabelled F16 with consistent bytes (128): the formula holds,
    # the layout does not — before, the engine failed later with its own message
    d = bytearray(small_vqf.read_bytes())
    base = F.DIR_OFFSET + F.ENTRY_SIZE * 1
    name, qt, rows, cols, off, nb = struct.unpack_from(F.ENTRY_FORMAT, d, base)
    assert name.rstrip(b"\0") == b"final_norm"
    struct.pack_into(F.ENTRY_FORMAT, d, base, name, 5, rows, cols, off, nb // 2)
    path = tmp_path / "qtype.vqf"
    path.write_bytes(d)
    with pytest.raises(F.VQFFormatError, match=r"entry\[1\] \(final_norm\)\.qtype at offset 544: F16, but a "
                                               r"converter stores final_norm as F32"):
        open_vqf(path)


# ------------------------------------------------------------------ memory
def test_engine_memory_estimate_matches_what_it_allocates(small_vqf):
    eng = Qwen3Engine.from_vqf(small_vqf, max_context=200)
    needs = memory_check.engine_needs(eng.config, 200, sum(eng.bytes_copied.values()))
    assert needs["kv_cache"] == eng.cache.nbytes
    assert needs["rope_tables"] >= eng._cos.nbytes + eng._sin.nbytes
    assert needs["weights_copied"] == eng.memory_report()["copied_at_load_bytes"] > 0


def test_engine_refuses_before_allocating_when_memory_is_short(small_vqf, monkeypatch):
    needs = memory_check.engine_needs(open_vqf(small_vqf).config, 256, 0)
    with pytest.raises(memory_check.MemoryBudgetError, match=rf"^{small_vqf}: needs .*kv_cache .* but .* is "
                                                              r"available \(given\); lower max_context"):
        Qwen3Engine.from_vqf(small_vqf, max_context=256, available_memory=needs["kv_cache"])
    # the same through the environment (what a notebook or the CLI can set)
    monkeypatch.setenv(memory_check.ENV_AVAILABLE, "1000")
    assert memory_check.available_memory() == (1000, f"${memory_check.ENV_AVAILABLE}")
    with pytest.raises(memory_check.MemoryBudgetError, match=r"\$KESTREL_MEMORY_AVAILABLE"):
        Qwen3Engine.from_vqf(small_vqf, max_context=16)
    monkeypatch.setenv(memory_check.ENV_AVAILABLE, "lots")
    with pytest.raises(memory_check.MemoryBudgetError, match="expected a number of bytes"):
        memory_check.available_memory()


def test_a_context_the_machine_cannot_hold_is_refused_not_overcommitted(small_vqf):
    # 2 layers × 2 KV heads × 16 × 4 B × 2 = 512 B per token: max_position_embeddings 16M would be 8 GiB of
    # KV cache that np.zeros would hand out lazily and the OOM killer would collect later
    cfg = dataclasses.replace(open_vqf(small_vqf).config, max_position_embeddings=1 << 24)
    with open_vqf(small_vqf) as vf, pytest.raises(memory_check.MemoryBudgetError, match=r"kv_cache 8\.00 GiB"):
        Qwen3Engine.from_tensors(cfg, vf.tensors, max_context=1 << 24, available_memory=4 << 30)


def test_machine_memory_is_read():
    avail, src = memory_check.available_memory()
    assert avail is None or (avail > 0 and src)


# ------------------------------------------------------------------ config.json
def _write(tmp_path, doc):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(doc, indent=2))
    return p


def _vl():
    return json.loads((configs_dir() / "qwen3-vl-2b-instruct.config.json").read_text())


CONFIG_CASES = {
    "theta_zero": (("text_config", "rope_theta"), 0, "0"),
    "heads_zero": (("text_config", "num_attention_heads"), 0, "0"),       # before: ZeroDivisionError
    "layers_string": (("text_config", "num_hidden_layers"), "28", '"28"'),  # before: TypeError in the planner
    "layers_bool": (("text_config", "num_hidden_layers"), True, "true"),
    "eps_nan": (("text_config", "rms_norm_eps"), float("nan"), "NaN"),
    "depth_float": (("vision_config", "depth"), 24.5, "24.5"),
    "mrope_sum": (("text_config", "rope_scaling", "mrope_section"), [24, 20, 19], "["),
    "out_hidden": (("vision_config", "out_hidden_size"), 1024, "1024"),
    "pos_not_square": (("vision_config", "num_position_embeddings"), 2305, "2305"),
    "deepstack_past_depth": (("vision_config", "deepstack_visual_indexes"), [5, 11, 24], "["),
}


@pytest.mark.parametrize("case", list(CONFIG_CASES))
def test_config_json_refusals_point_at_the_value(case, tmp_path):
    path_keys, value, text_at = CONFIG_CASES[case]
    doc = _vl()
    node = doc
    for k in path_keys[:-1]:
        node = node[k]
    node[path_keys[-1]] = value
    p = _write(tmp_path, doc)
    with pytest.raises(ConfigError) as err:
        ModelConfig.from_hf(p)
    msg = str(err.value)
    key = ".".join(path_keys)
    assert msg.startswith(f"{p}: field '{key}' at line "), msg
    byte = int(msg.split("(byte ")[1].split(")")[0])
    assert p.read_bytes()[byte:].startswith(text_at.encode()), (msg, p.read_bytes()[byte:byte + 20])


@pytest.mark.parametrize("doc, pattern", [
    ({"model_type": ["qwen3"]}, r"field 'model_type'.*supported"),               # before: TypeError (unhashable)
    ({"model_type": "qwen3_vl", "text_config": 3}, r"field 'text_config'.*expected a JSON object"),
    ([1, 2], r"top level is a list"),
    ({**SMALL, "rope_parameters": "x", "rope_theta": None}, r"rope_parameters.*expected a JSON object"),
    ({**SMALL, "tie_word_embeddings": "yes"}, r"tie_word_embeddings.*expected true or false"),
    ({**SMALL, "rms_norm_eps": "1e-6"}, r"rms_norm_eps.*expected a number"),
])
def test_config_shape_errors(doc, pattern, tmp_path):
    p = tmp_path / "c.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match=pattern):
        ModelConfig.from_hf(p)


def test_config_unusable_json(tmp_path):
    p = tmp_path / "c.json"
    p.write_text('{"model_type": ' + "[" * 100_000 + "]" * 100_000 + "}")   # before: RecursionError
    with pytest.raises(ConfigError, match="nested deeper"):
        ModelConfig.from_hf(p)
    p.write_text('{"vocab_size": ' + "9" * 5000 + "}")                      # before: bare ValueError
    with pytest.raises(ConfigError, match=f"^{p}: not usable JSON"):
        ModelConfig.from_hf(p)


# ------------------------------------------------------------------ the table itself
def test_shipped_configs_are_inside_the_table():
    for p in sorted(configs_dir().glob("*.config.json")):
        limits.check_config(ModelConfig.from_hf(p))


def test_every_bound_has_a_reason_and_a_range():
    for b in limits.BOUNDS:
        assert b.lo <= b.hi and len(b.why) > 10 and b.kind in ("int", "float"), b
    assert F.MAX_TENSORS == limits.BOUND["vqf.n_tensors"].hi       # the format reads the table
    # every numeric field of ModelConfig / VisionConfig has a bound
    from kestrel_lab.config import VisionConfig
    for f in dataclasses.fields(ModelConfig):
        if f.type in ("int", "float", "int | None", "list[int] | None"):
            assert f.name in limits.BOUND, f.name
    for f in dataclasses.fields(VisionConfig):
        if f.type in ("int", "list[int]"):
            assert "vision." + f.name in limits.BOUND, f.name


def test_bound_kinds():
    b = limits.BOUND["num_hidden_layers"]
    for bad in (0, 1025, True, 2.0, "3", None):
        with pytest.raises(limits.LimitError):
            b.check(bad)
    b.check(1)
    b.check(1024)
    e = limits.BOUND["rms_norm_eps"]
    for bad in (0.0, float("nan"), float("inf"), -1e-6, 0.5):
        with pytest.raises(limits.LimitError):
            e.check(bad)
    e.check(1e-6)


def test_image_size():
    limits.check_image_size(1920, 1080)
    with pytest.raises(limits.LimitError, match=r"field image\.pixels: 4,294,836,225"):
        limits.check_image_size(65535, 65535)
    with pytest.raises(limits.LimitError, match=r"field image\.width: 0"):
        limits.check_image_size(0, 10)


# ------------------------------------------------------------------ vocab.bin and safetensors
def test_vocab_id_limit_and_count_bounds():
    rec = struct.pack("<I", 1) + struct.pack("<IH", 0, 1) + b"a"
    with pytest.raises(VocabFormatError, match=r"parameter id_limit: 4,294,967,296: expected an integer"):
        parse_vocab_bin(rec, id_limit=2**32)
    huge = struct.pack("<I", limits.MAX_VOCAB + 1) + b"\0" * 16
    with pytest.raises(VocabFormatError, match=r"field N at offset 0 is 1,048,577, above the limit of 1,048,576"):
        parse_vocab_bin(huge)


def test_safetensors_nesting_and_huge_integers_refused(tmp_path):
    safetensors = pytest.importorskip("safetensors")
    cases = {"deep": b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}",     # before: RecursionError
             "digits": b'{"a":{"dtype":"F32","shape":[' + b"9" * 5000 + b'],"data_offsets":[0,4]}}'}  # ValueError
    for name, raw in cases.items():
        raw += b" " * (-len(raw) % 8)
        blob = len(raw).to_bytes(8, "little") + raw + bytes(4)
        with pytest.raises(SafetensorsError, match=r"header \(bytes 8\.\.\d+\)"):
            parse_header(blob, len(blob), "x.safetensors")
        p = tmp_path / f"{name}.safetensors"
        p.write_bytes(blob)
        with pytest.raises(Exception):                    # the reference refuses them too
            with safetensors.safe_open(str(p), framework="numpy") as f:
                list(f.keys())


def test_engine_still_runs_on_good_files(small_vqf):
    eng = Qwen3Engine.from_vqf(small_vqf, max_context=32)
    assert np.isfinite(eng.prefill([1, 2, 3])).all()


@pytest.mark.parametrize("doc", [
    {"__metadata__": [], "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}},       # falsy, not a map
    {"__metadata__": "", "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}},
    {"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4], "x": float("nan")}},         # NaN is not JSON
])
def test_safetensors_agrees_with_the_reference_found_by_the_long_fuzz_run(doc, tmp_path):
    """KESTREL_FUZZ_SEED=1631783662: our reader accepted these, the safetensors package refuses them."""
    safetensors = pytest.importorskip("safetensors")
    raw = json.dumps(doc).encode()
    raw += b" " * (-len(raw) % 8)
    p = tmp_path / "m.safetensors"
    p.write_bytes(len(raw).to_bytes(8, "little") + raw + bytes(4))
    with pytest.raises(SafetensorsError, match=r"m\.safetensors: (header|field)"):
        parse_header(p.read_bytes(), p.stat().st_size, str(p))
    with pytest.raises(Exception):
        with safetensors.safe_open(str(p), framework="numpy") as f:
            list(f.keys())
