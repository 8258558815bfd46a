"""Malformed safetensors files and checkpoint folders: each rejected with a clear message.

Every case is also given to the `safetensors` package, which must reject it too (so the case is a real
format violation, not a quirk of our reader), and a bounded hypothesis fuzz mutates a valid file.
"""
import json
import os
import re
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from kestrel_lab.safetensors import (SafetensorsError, header_bytes, open_checkpoint, open_safetensors,
                                     save_safetensors)

safetensors = pytest.importorskip("safetensors")
from safetensors import safe_open  # noqa: E402  (after importorskip)


def _file(path: Path, header, data: bytes, n: int | None = None) -> Path:
    """Write ``<u64 n><header><data>``; ``header`` is a dict (dumped to JSON) or raw bytes."""
    raw = json.dumps(header).encode() if isinstance(header, dict) else header
    if n is not None and n < 0:  # no length field at all: just these bytes
        path.write_bytes(raw)
        return path
    path.write_bytes((len(raw) if n is None else n).to_bytes(8, "little") + raw + data)
    return path


def _ok_header():
    return {"a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
            "b": {"dtype": "BF16", "shape": [4], "data_offsets": [16, 24]}}


DATA = bytes(range(24))

# name → (header, data, n override, regex the message must contain)
CASES = {
    "too_short": (b"\x01\x02\x03", b"", -1, r"3 bytes, too short for the 8-byte header length at byte 0"),
    "header_len_past_end": (json.dumps(_ok_header()).encode(), DATA, 10_000,
                            r"header length 10000 at byte 0 runs past the end"),
    "header_len_huge": (b"{}", b"", 2**63, r"header length \d+ at byte 0"),
    "bad_json": (b'{"a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]', DATA[:16], None,
                 r"not valid JSON at byte \d+"),
    "not_object": (b"[1, 2, 3]", b"", None, r"does not start with '\{'"),
    "not_utf8": (b'{"\xff\xfe": 1}', b"", None, r"not UTF-8 \(byte 10"),
    "unknown_dtype": ({"a": {"dtype": "F12", "shape": [4], "data_offsets": [0, 8]}}, bytes(8), None,
                      r"tensor 'a': unknown dtype 'F12'"),
    "size_mismatch": ({"a": {"dtype": "F32", "shape": [3, 2], "data_offsets": [0, 16]}}, bytes(16), None,
                      r"tensor 'a': shape \[3, 2\] × F32 needs 24 bytes but data_offsets give 16 "
                      r"\(file bytes \d+\.\.\d+\)"),
    "offset_past_end": ({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                         "b": {"dtype": "F32", "shape": [4], "data_offsets": [16, 32]}}, bytes(24), None,
                        r"tensor 'b': data ends at file byte \d+, past the end of the file"),
    "overlap": ({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                 "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}}, bytes(24), None,
                r"tensor '(a|b)' \(file bytes \d+\.\.\d+\) overlaps tensor '(a|b)'"),
    "gap": ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
             "b": {"dtype": "F32", "shape": [2], "data_offsets": [16, 24]}}, bytes(24), None,
            r"gap in the data area: file bytes \d+\.\.\d+ before tensor 'b'"),
    "trailing_bytes": ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, bytes(12), None,
                       r"file bytes \d+\.\.\d+ after the last tensor belong to no tensor"),
    "end_before_begin": ({"a": {"dtype": "F32", "shape": [0], "data_offsets": [8, 0]}}, bytes(8), None,
                         r"tensor 'a': data_offsets end 0 < begin 8"),
    "missing_field": ({"a": {"dtype": "F32", "shape": [2]}}, bytes(8), None,
                      r"tensor 'a': field 'data_offsets' is missing"),
    "negative_shape": ({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, bytes(8), None,
                       r"tensor 'a': field 'shape' must be a list of non-negative integers"),
    "duplicate_name": (b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                       b'"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', bytes(2), None,
                       r"names tensor 'a' twice"),
    "bad_metadata": ({"__metadata__": {"k": 3}, "a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}},
                     bytes(1), None, r"field '__metadata__' must map strings to strings"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_malformed_file_rejected_with_clear_message(tmp_path, case):
    header, data, n, pattern = CASES[case]
    path = _file(tmp_path / f"{case}.safetensors", header, data, n)
    with pytest.raises(SafetensorsError) as err:
        open_safetensors(path)
    msg = str(err.value)
    assert str(path) in msg                        # names the file
    assert re.search(pattern, msg), msg            # names the tensor/field and the byte offset
    # the reference implementation rejects it too
    with pytest.raises(Exception):
        with safe_open(str(path), framework="numpy") as f:
            for k in f.keys():
                f.get_tensor(k)


def test_valid_base_case_loads(tmp_path):
    path = _file(tmp_path / "ok.safetensors", _ok_header(), DATA)
    f = open_safetensors(path)
    assert f.raw("a").shape == (2, 2) and f.raw("b").dtype == np.uint16
    with safe_open(str(path), framework="numpy") as g:
        np.testing.assert_array_equal(g.get_tensor("a"), f.raw("a"))


def test_header_padding_with_spaces_is_accepted(tmp_path):
    raw = json.dumps(_ok_header()).encode() + b"      "
    f = open_safetensors(_file(tmp_path / "pad.safetensors", raw, DATA))
    assert set(f.keys()) == {"a", "b"}


# ----------------------------------------------------------------------------- sharded folders
@pytest.fixture
def sharded(tmp_path):
    save_safetensors(tmp_path / "s1.safetensors", {"x": np.ones(4, np.float32)})
    save_safetensors(tmp_path / "s2.safetensors", {"y": np.zeros(2, np.float32), "z": np.zeros(1, np.float32)})
    (tmp_path / "config.json").write_text("{}")
    return tmp_path


def _index(folder, weight_map):
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def test_sharded_ok(sharded):
    _index(sharded, {"x": "s1.safetensors", "y": "s2.safetensors", "z": "s2.safetensors"})
    ck = open_checkpoint(sharded)
    assert sorted(ck.keys()) == ["x", "y", "z"] and len(ck.files) == 2


@pytest.mark.parametrize("weight_map, pattern", [
    ({"x": "s1.safetensors", "y": "s3.safetensors", "z": "s2.safetensors"},
     r"names shard 's3.safetensors', which is not a file"),
    ({"x": "s1.safetensors", "y": "s1.safetensors", "z": "s2.safetensors"},
     r"puts tensor 'y' in s1.safetensors, which has no such tensor"),
    ({"x": "s1.safetensors", "y": "s2.safetensors"}, r"s2.safetensors: tensor 'z' \(file byte \d+\) is not mapped"),
    ({"x": "../s1.safetensors", "y": "s2.safetensors", "z": "s2.safetensors"}, r"which is not a file"),
    ([1, 2], r"field 'weight_map' must map"),
])
def test_bad_index_rejected(sharded, weight_map, pattern):
    _index(sharded, weight_map)
    with pytest.raises(SafetensorsError, match=pattern):
        open_checkpoint(sharded)


def test_index_not_json(sharded):
    (sharded / "model.safetensors.index.json").write_text("{nope")
    with pytest.raises(SafetensorsError, match=r"model.safetensors.index.json: not valid JSON"):
        open_checkpoint(sharded)


def test_folder_without_weights(tmp_path):
    with pytest.raises(SafetensorsError, match="neither model.safetensors nor model.safetensors.index.json"):
        open_checkpoint(tmp_path)
    with pytest.raises(SafetensorsError, match="not a folder"):
        open_checkpoint(tmp_path / "missing")


# ----------------------------------------------------------------------------- fuzz
def _valid_file_bytes() -> bytes:
    rng = np.random.default_rng(7)
    tensors = {"w": rng.standard_normal((4, 8)).astype(np.float32),
               "b": ("BF16", rng.integers(0, 65535, 6).astype(np.uint16)),
               "h": rng.standard_normal(5).astype(np.float16)}
    head = header_bytes({n: (v[0] if isinstance(v, tuple) else {"float32": "F32", "float16": "F16"}[v.dtype.name],
                             (v[1] if isinstance(v, tuple) else v).shape,
                             (v[1] if isinstance(v, tuple) else v).nbytes) for n, v in tensors.items()})
    body = b"".join((v[1] if isinstance(v, tuple) else v).tobytes() for v in tensors.values())
    return head + body


VALID = _valid_file_bytes()


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hs.lists(hs.tuples(hs.integers(0, len(VALID) - 1), hs.integers(0, 255)), min_size=1, max_size=4),
       hs.sampled_from(["flip", "truncate", "append"]), hs.integers(0, 64))
def test_fuzz_header_mutations(edits, mode, k):
    """Mutate a valid file: a clean SafetensorsError, or a load whose tensors lie inside the file and
    agree with the safetensors package when it loads the file too."""
    raw = bytearray(VALID)
    n = int.from_bytes(raw[:8], "little")
    for pos, val in edits:
        raw[pos % (8 + n)] = val  # mutate the length and the JSON, where the parser decides
    if mode == "truncate":
        raw = raw[:max(0, len(raw) - k)]
    elif mode == "append":
        raw += bytes(k)
    fd, name = tempfile.mkstemp(suffix=".safetensors")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
        try:
            f = open_safetensors(name)
        except SafetensorsError as e:
            assert name in str(e)
            return
        ours = {}
        for t in f.tensors.values():
            assert t.file_offset + t.nbytes <= len(raw)
            ours[t.name] = np.array(f.raw(t.name))
        f.close()
        try:
            with safe_open(name, framework="numpy") as g:
                ref = {k2: g.get_tensor(k2) for k2 in g.keys()}
        except Exception:
            return  # e.g. BF16, which numpy cannot hold; our load was still in bounds
        assert sorted(ref) == sorted(ours)
        for k2 in ref:
            assert ref[k2].tobytes() == ours[k2].tobytes()
    finally:
        os.unlink(name)
