"""Kernel choice by measurement (``kernels.choice``): a fake timing table picks the measured winner, noise keeps
the ISA default, the cache is keyed by the machine so another CPU measures again, and the registry follows."""
from __future__ import annotations

import pytest

from kestrel_lab.kernels import choice, variants

VNNI_HOST = frozenset({"x86_64", "avx2", "avx512f", "avx512_vnni"})
AVX2_HOST = frozenset({"x86_64", "avx2"})


def fake(table):
    """A timer that returns ``table`` (seconds per run) for the candidates it is given, and counts its calls."""
    calls = []

    def timer(candidates):
        calls.append([v.name for v in candidates])
        return {v.name: list(table[v.name]) for v in candidates}
    timer.calls = calls
    return timer


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KESTREL_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(choice.ENV, raising=False)
    return tmp_path


def test_the_ladder_is_the_isa_list():
    assert choice.ladder(VNNI_HOST).name == "v16_vnni"
    assert choice.ladder(AVX2_HOST).name == "v16_avx2"
    assert choice.ladder(frozenset({"aarch64", "dotprod"})).name == "r32"


def test_a_clearly_faster_variant_wins():
    t = {"v16_vnni": [1.0, 1.02, 0.99], "v16_avx2": [0.80, 0.82, 0.81], "r32": [1.5] * 3, "v16": [2.0] * 3}
    name, why = choice.decide(t, "v16_vnni")
    assert name == "v16_avx2" and "faster than the ISA default" in why


def test_noise_keeps_the_default():
    overlap = {"v16_vnni": [1.0, 0.7, 1.0], "v16_avx2": [0.8, 0.8, 0.75]}      # 20 % faster median, runs overlap
    assert choice.decide(overlap, "v16_vnni")[0] == "v16_vnni"
    small = {"v16_vnni": [1.0] * 3, "v16_avx2": [0.95] * 3}                     # every run faster, but only 5 %
    assert choice.decide(small, "v16_vnni")[0] == "v16_vnni"


def test_choice_is_measured_once_per_machine_and_cached(cache):
    timer = fake({"v16_vnni": [1.0] * 5, "v16_avx2": [0.7] * 5, "r32": [1.2] * 5, "v16": [3.0] * 5})
    c = choice.choose(VNNI_HOST, timer=timer)
    assert c.variant.name == "v16_avx2" and c.how == "measured" and c.default == "v16_vnni"
    assert sorted(timer.calls[0]) == ["r32", "v16", "v16_avx2", "v16_vnni"]     # every row-grouped variant it runs
    again = choice.choose(VNNI_HOST, timer=timer)
    assert again.variant.name == "v16_avx2" and len(timer.calls) == 1          # read back, not measured again
    assert "v16_avx2" in again.report() and "ISA default" in again.report()
    other = choice.choose(AVX2_HOST, timer=timer)                               # another CPU: measured again
    assert len(timer.calls) == 2 and "v16_vnni" not in timer.calls[1]
    assert other.identity != c.identity and (cache / choice.FILE).exists()


def test_isa_mode_measures_nothing(cache, monkeypatch):
    monkeypatch.setenv(choice.ENV, "isa")
    timer = fake({})
    c = choice.choose(VNNI_HOST, timer=timer)
    assert c.variant.name == "v16_vnni" and c.how == "isa" and not timer.calls


def test_the_registry_follows_the_choice(monkeypatch):
    """The engine's layout and the V16 kernels come from the choice on this host; asking for other features
    still gives the ISA list's pick (what the board would use)."""
    from kestrel_lab.kernels import registry

    pick = choice.Choice(variants.of("v16_avx2"), "measured", "v16_vnni", reason="test")
    monkeypatch.setattr(choice, "current", lambda features=None: pick)
    monkeypatch.delenv("KESTREL_Q4_LAYOUT", raising=False)
    assert registry.q4_load_layout() == "Q4_0_V16"
    assert registry.select("Q4_0_V16", "one").name == "matvec_q4_v16_avx2"
    assert registry.select("Q4_0_V16", "one", VNNI_HOST).name == "matvec_q4_v16_vnni"
    r32 = choice.Choice(variants.of("r32"), "measured", "v16_vnni")
    monkeypatch.setattr(choice, "current", lambda features=None: r32)
    assert registry.q4_load_layout() == "Q4_0_R32"
    assert registry.q4_load_layout(frozenset({"aarch64", "dotprod"})) == "Q4_0_R32"


def test_a_variant_can_be_forced_by_name(monkeypatch):
    """KESTREL_KERNEL_CHOICE=<variant> picks that variant (same-ISA comparisons); one the host cannot run: refused."""
    from kestrel_lab.kernels import choice, variants

    feats = frozenset({"x86_64", "avx2", "avx512f", "avx512_vnni"})
    monkeypatch.setenv(choice.ENV, "v16_avx2")
    c = choice.choose(feats, timer=lambda cands: pytest.fail("a forced variant is not measured"), store=False)
    assert c.variant is variants.of("v16_avx2") and c.how == "forced" and c.default == "v16_vnni"
    monkeypatch.setenv(choice.ENV, "v16_vnni")
    with pytest.raises(ValueError, match="cannot run"):
        choice.choose(frozenset({"x86_64", "avx2"}), store=False)
