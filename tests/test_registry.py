"""The kernel registry: one table (layout, call, ISA) → kernel, a portable fallback for every key,
and the engine reporting which kernel ran."""
import numpy as np
import pytest

from kestrel_lab import quant as Q
from kestrel_lab.kernels import registry, variants

LAYOUTS = [q.name for q in Q.QTYPES.values()] + list(variants.PLANE_LAYOUTS)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_has_portable_matvec_and_matmul(layout):
    for call in ("one", "many"):
        k = registry.select(layout, call, frozenset())
        assert k is not None and k.isa == registry.PORTABLE, (layout, call)


def test_an_isa_kernel_is_chosen_only_where_the_host_has_the_feature():
    key = ("TEST_LAYOUT", "one")
    try:
        registry.register("TEST_LAYOUT", "one", name="portable_test")(lambda w, a, o: "portable")
        registry.register("TEST_LAYOUT", "one", isa="fancy_isa", name="fancy_test")(lambda w, a, o: "fancy")
        assert registry.select(*key, frozenset()).name == "portable_test"
        assert registry.select(*key, frozenset({"fancy_isa"})).name == "fancy_test"
        with pytest.raises(ValueError, match="already registered"):
            registry.register("TEST_LAYOUT", "one", isa="fancy_isa")(lambda w, a, o: None)
    finally:
        registry.TABLE.pop(key, None)
    with pytest.raises(ValueError, match="call"):
        registry.register("F32", "sideways")
    assert registry.select("NO_SUCH_LAYOUT", "one", frozenset()) is None


@pytest.mark.parametrize("forced", ["r32", "v16"])
def test_the_engine_reports_and_counts_the_kernels_it_runs(tmp_path, monkeypatch, forced):
    from kestrel_lab.convert import convert
    from kestrel_lab.engine import Qwen3Engine
    from kestrel_lab.models import hf_checkpoint

    monkeypatch.setenv("KESTREL_Q4_LAYOUT", forced)
    layout = {"r32": "Q4_0_R32", "v16": "Q4_0_V16"}[forced]
    # the V16 kernels run with vpdpbusd where the host has AVX-512 VNNI, else their portable twins
    sfx = "_vnni" if forced == "v16" and "avx512_vnni" in registry.host_features() else ""
    out = tmp_path / "m.vqf"
    convert(hf_checkpoint(), out, "q4_0", hash_source=False)
    eng = Qwen3Engine.from_vqf(out, max_context=32)
    paths = eng.kernel_paths()
    assert eng.q4_layout == layout
    assert paths["decode_step"] == f"decode_layers_{forced}{sfx}"
    assert paths["matrices"][layout] == {"one": f"matvec_q4_{forced}{sfx}", "many": f"matmul_q4_{forced}{sfx}",
                                         "qkv": f"matvec3_q4_{forced}{sfx}",
                                         "swiglu": f"matvec_swiglu_q4_{forced}{sfx}"}
    before = dict(registry.used())
    eng.prefill([1, 2, 3])
    eng.decode(4)
    after = registry.used()
    step = f"decode_layers_{forced}{sfx}"
    assert after[step] == before.get(step, 0) + 1
    assert after[f"matmul_q4_{forced}{sfx}"] > before.get(f"matmul_q4_{forced}{sfx}", 0)
    plain = Qwen3Engine.from_vqf(out, max_context=32, interleave=False).kernel_paths()
    # plain Q4_0 runs the int8-dot (sdot) twins on a CPU with dotprod (the board's A76), else the lanes
    plain_sfx = "_sdot" if "dotprod" in registry.host_features() else ""
    assert plain["decode_step"] is None and plain["matrices"]["Q4_0"]["qkv"] == f"matvec3_q4_0{plain_sfx}"
    assert np.isfinite(eng.decode(5)).all()


def test_the_load_layout_follows_the_host_and_the_override(monkeypatch):
    monkeypatch.delenv("KESTREL_Q4_LAYOUT", raising=False)
    assert registry.q4_load_layout(frozenset()) == "Q4_0_R32"
    assert registry.q4_load_layout(frozenset({"avx512_vnni"})) == "Q4_0_V16"
    monkeypatch.setenv("KESTREL_Q4_LAYOUT", "r32")
    assert registry.q4_load_layout(frozenset({"avx512_vnni"})) == "Q4_0_R32"
    monkeypatch.setenv("KESTREL_Q4_LAYOUT", "wide")
    with pytest.raises(ValueError, match="KESTREL_Q4_LAYOUT"):
        registry.q4_load_layout()
