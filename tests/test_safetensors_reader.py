"""Our safetensors reader against the `safetensors` package, tensor for tensor."""
import json

import numpy as np
import pytest

from kestrel_lab import paths
from kestrel_lab.quant import bf16_to_f32
from kestrel_lab.safetensors import (DTYPES, SafetensorsError, header_bytes, open_checkpoint, open_safetensors,
                                     save_safetensors)
from kestrel_lab.tiny_model import make_tiny_model

torch = pytest.importorskip("torch")
st = pytest.importorskip("safetensors")
from safetensors import safe_open  # noqa: E402  (after importorskip)

SMALL = {"vocab_size": 512}


def _reference(path):
    """name → (dtype string, numpy array of the stored bits) as the safetensors package reads them."""
    out = {}
    with safe_open(str(path), framework="pt") as f:
        for k in f.keys():
            t = f.get_tensor(k)
            if t.dtype == torch.bfloat16:
                out[k] = t.view(torch.int16).numpy().view(np.uint16)
            else:
                out[k] = t.numpy()
    return out


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    base = tmp_path_factory.mktemp("st")
    return {
        ("qwen3", "bfloat16"): make_tiny_model(base / "q3bf", "qwen3", 1, SMALL, "bfloat16"),
        ("qwen3", "float16"): make_tiny_model(base / "q3f16", "qwen3", 2, SMALL, "float16"),
        ("qwen3_vl", "float32"): make_tiny_model(base / "vlf32", "qwen3_vl", 3, {"text_config": SMALL}, "float32"),
        ("qwen3_vl", "sharded"): make_tiny_model(base / "vlsh", "qwen3_vl", 4, {"text_config": SMALL},
                                                 "bfloat16", max_shard_bytes=60_000),
    }


@pytest.mark.parametrize("key", [("qwen3", "bfloat16"), ("qwen3", "float16"), ("qwen3_vl", "float32")])
def test_single_file_equals_safetensors_package(tiny_dirs, key):
    folder = tiny_dirs[key]
    ref = _reference(folder / "model.safetensors")
    with open_checkpoint(folder) as ck:
        assert sorted(ck.keys()) == sorted(ref)
        for name, want in ref.items():
            got = ck.raw(name)
            assert got.shape == want.shape and got.dtype == want.dtype, name
            assert np.array_equal(got, want), name


def test_sharded_checkpoint(tiny_dirs):
    folder = tiny_dirs[("qwen3_vl", "sharded")]
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2
    ref = {}
    for s in shards:
        ref.update(_reference(folder / s))
    with open_checkpoint(folder) as ck:
        assert len(ck.files) == len(shards)
        assert sorted(ck.keys()) == sorted(ref) == sorted(index["weight_map"])
        for name, want in ref.items():
            assert ck.file_of[name].path.name == index["weight_map"][name]
            assert np.array_equal(ck.raw(name), want), name


def test_bf16_widening_equals_torch(tiny_dirs):
    folder = tiny_dirs[("qwen3", "bfloat16")]
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f, open_checkpoint(folder) as ck:
        for name in f.keys():
            want = f.get_tensor(name).float().numpy()
            assert ck.info(name).dtype == "BF16"
            np.testing.assert_array_equal(ck.f32(name), want)


def test_trained_poem_model_equals_safetensors_package():
    folder = paths.tiny_poem_dir()
    ref = _reference(folder / "model.safetensors")
    with open_checkpoint(folder) as ck:
        assert sorted(ck.keys()) == sorted(ref)
        for name, want in ref.items():
            assert np.array_equal(ck.raw(name), want), name
        # rows of the embedding, widened, equal torch's bf16 → f32
        with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
            emb = f.get_slice("model.embed_tokens.weight")[100:164].float().numpy()
        np.testing.assert_array_equal(ck.f32("model.embed_tokens.weight", slice(100, 164)), emb)


def test_views_are_zero_copy_and_read_only(tiny_dirs):
    folder = tiny_dirs[("qwen3", "bfloat16")]
    f = open_safetensors(folder / "model.safetensors")
    a = f.raw("model.embed_tokens.weight")
    b = f.raw("model.embed_tokens.weight")
    assert np.shares_memory(a, b)              # both views of the same mapped pages
    assert not a.flags.writeable and not a.flags.owndata
    base = a
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    assert type(base).__name__ == "mmap"       # the base chain ends at the file mapping
    f.release("model.embed_tokens.weight")     # dropping pages keeps the data readable (re-faulted)
    assert np.array_equal(a, b)
    del a, b, base
    f.close()


def test_save_safetensors_round_trip_all_dtypes(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {}
    for dtype, (storage, _) in DTYPES.items():
        if dtype in ("BF16", "F8_E4M3", "F8_E5M2"):
            tensors[f"t_{dtype}"] = (dtype, rng.integers(0, 255, size=(3, 5)).astype(storage))
        elif dtype == "BOOL":
            tensors["t_BOOL"] = rng.integers(0, 2, size=(4,)).astype(bool)
        else:
            tensors[f"t_{dtype}"] = (rng.standard_normal((2, 3)) * 50).astype(storage)
    tensors["empty"] = np.zeros((0, 4), np.float32)
    tensors["scalar"] = np.array(3.5, np.float32)
    path = save_safetensors(tmp_path / "all.safetensors", tensors, {"who": "test"})
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    assert n % 8 == 0                          # padded like the safetensors package
    with safe_open(str(path), framework="pt") as f:
        assert f.metadata() == {"who": "test"}
        names = set(f.keys())
    assert names == set(tensors)
    g = open_safetensors(path)
    assert g.metadata == {"who": "test"}
    for name, v in tensors.items():
        want = v[1] if isinstance(v, tuple) else v
        got = g.raw(name)
        assert got.shape == want.shape
        assert np.array_equal(got, want), name
    with safe_open(str(path), framework="numpy") as f:
        np.testing.assert_array_equal(f.get_tensor("t_F32"), g.raw("t_F32"))
        np.testing.assert_array_equal(f.get_tensor("t_I64"), g.raw("t_I64"))


def test_header_bytes_layout_is_the_documented_one():
    head = header_bytes({"a": ("F32", (2,), 8), "b": ("BF16", (3,), 6)})
    n = int.from_bytes(head[:8], "little")
    doc = json.loads(head[8:8 + n])
    assert doc["a"]["data_offsets"] == [0, 8] and doc["b"]["data_offsets"] == [8, 14]
    assert len(head) == 8 + n and n % 8 == 0


def test_f32_rejects_integer_tensors(tmp_path):
    path = save_safetensors(tmp_path / "i.safetensors", {"ids": np.arange(4, dtype=np.int64)})
    with pytest.raises(SafetensorsError, match="ids.*not a floating-point"):
        open_safetensors(path).f32("ids")


def test_bf16_helper_matches_torch():
    x = np.random.default_rng(1).standard_normal(1000).astype(np.float32)
    bits = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    from kestrel_lab.safetensors import bf16
    assert np.array_equal(bf16(x)[1], bits)
    np.testing.assert_array_equal(bf16_to_f32(bits), torch.from_numpy(x).to(torch.bfloat16).float().numpy())
