"""The kernel registry: one table (layout, call, ISA) → kernel, a portable fallback for every key,
and the engine reporting which kernel ran."""
import numpy as np
import pytest

from kestrel_lab import quant as Q
from kestrel_lab.engine import registry

LAYOUTS = [q.name for q in Q.QTYPES.values()] + ["Q4_0_R32"]


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


def test_the_engine_reports_and_counts_the_kernels_it_runs(tmp_path):
    from kestrel_lab.convert import convert
    from kestrel_lab.engine import Qwen3Engine
    from kestrel_lab.models import hf_checkpoint

    out = tmp_path / "m.vqf"
    convert(hf_checkpoint(), out, "q4_0", hash_source=False)
    eng = Qwen3Engine.from_vqf(out, max_context=32)
    paths = eng.kernel_paths()
    assert paths["decode_step"] == "decode_layers_r32"
    assert paths["matrices"]["Q4_0_R32"] == {"one": "matvec_q4_r32", "many": "matmul_q4_r32",
                                            "qkv": "matvec3_q4_r32", "swiglu": "matvec_swiglu_q4_r32"}
    before = dict(registry.used())
    eng.prefill([1, 2, 3])
    eng.decode(4)
    after = registry.used()
    assert after["decode_layers_r32"] == before.get("decode_layers_r32", 0) + 1
    assert after["matmul_q4_r32"] > before.get("matmul_q4_r32", 0)
    plain = Qwen3Engine.from_vqf(out, max_context=32, interleave=False).kernel_paths()
    assert plain["decode_step"] is None and plain["matrices"]["Q4_0"]["qkv"] == "matvec3_q4_0"
    assert np.isfinite(eng.decode(5)).all()
