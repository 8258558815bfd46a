"""Kernel choice by measurement (``kernels.choice``): a fake timing table picks the measured winner, noise keeps
the ISA default, the cache is keyed by the machine so another CPU measures again, and the registry follows; the
same for the V16 kernels' prefetch distance, whose kernels give the same bits at every distance."""
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


def fake_prefetch(table):
    """A prefetch timer returning ``table`` (distance → seconds per round) for the variant it is given."""
    calls = []

    def timer(variant):
        calls.append(variant.name)
        return {k: list(v) for k, v in table.items()}
    timer.calls = calls
    return timer


NO_GAIN = fake_prefetch({"2048": [1.0] * 5, "0": [1.0] * 5})


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KESTREL_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(choice.ENV, raising=False)
    monkeypatch.delenv(choice.PREFETCH_ENV, raising=False)
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
    c = choice.choose(VNNI_HOST, timer=timer, prefetch_timer=NO_GAIN)
    assert c.variant.name == "v16_avx2" and c.how == "measured" and c.default == "v16_vnni"
    assert sorted(timer.calls[0]) == ["r32", "v16", "v16_avx2", "v16_vnni"]     # every row-grouped variant it runs
    again = choice.choose(VNNI_HOST, timer=timer, prefetch_timer=NO_GAIN)
    assert again.variant.name == "v16_avx2" and len(timer.calls) == 1          # read back, not measured again
    assert "v16_avx2" in again.report() and "ISA default" in again.report()
    other = choice.choose(AVX2_HOST, timer=timer, prefetch_timer=NO_GAIN)       # another CPU: measured again
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


def test_the_prefetch_distance_is_chosen_by_paired_rounds():
    """No prefetch replaces the 2 KiB default only when its median is clearly lower and it wins all rounds but one."""
    clear = {"2048": [1.00, 1.10, 0.95, 1.00, 1.05], "0": [0.90, 1.00, 0.90, 0.92, 0.96]}
    d, why = choice.decide_prefetch(clear)
    assert d == 0 and "in 5 of 5 rounds" in why
    one_loss = {"2048": [1.0, 1.0, 0.8, 1.0, 1.0], "0": [0.9, 0.9, 0.9, 0.9, 0.9]}     # the VM's slow round
    assert choice.decide_prefetch(one_loss)[0] == 0
    split = {"2048": [1.0, 0.8, 0.8, 1.0, 1.0], "0": [0.9, 0.9, 0.9, 0.85, 0.9]}       # loses two rounds
    assert choice.decide_prefetch(split)[0] == 2048
    tiny = {"2048": [1.0] * 5, "0": [0.99] * 5}                                       # 1 %: noise
    assert choice.decide_prefetch(tiny)[0] == 2048
    assert choice.decide_prefetch({"2048": [0.9] * 5, "0": [1.0] * 5})[0] == 2048


def test_the_prefetch_choice_is_cached_and_can_be_forced(cache, monkeypatch):
    timer = fake({"v16_vnni": [1.0] * 5, "v16_avx2": [1.1] * 5, "r32": [1.2] * 5, "v16": [3.0] * 5})
    pf = fake_prefetch({"2048": [1.0] * 5, "0": [0.8] * 5})
    c = choice.choose(VNNI_HOST, timer=timer, prefetch_timer=pf)
    assert c.prefetch_bytes == 0 and pf.calls == ["v16_vnni"]                 # timed on the chosen variant
    assert "hardware prefetchers alone" in c.report()
    again = choice.choose(VNNI_HOST, timer=timer, prefetch_timer=pf)
    assert again.prefetch_bytes == 0 and len(pf.calls) == 1
    monkeypatch.setattr(choice, "current", lambda features=None: again)
    assert choice.prefetch_bytes() == 0
    monkeypatch.setenv(choice.PREFETCH_ENV, "4096")
    assert choice.prefetch_bytes() == 4096
    monkeypatch.setenv(choice.PREFETCH_ENV, "far")
    with pytest.raises(ValueError, match=choice.PREFETCH_ENV):
        choice.prefetch_bytes()


def test_an_r32_choice_times_no_prefetch(cache):
    timer = fake({"v16_vnni": [1.0] * 5, "v16_avx2": [1.1] * 5, "r32": [0.5] * 5, "v16": [3.0] * 5})
    c = choice.choose(VNNI_HOST, timer=timer, prefetch_timer=lambda v: pytest.fail("r32 does not prefetch"))
    assert c.variant.name == "r32" and "do not prefetch" in c.prefetch_reason


def test_a_choice_file_without_the_prefetch_distance_is_measured_again(cache):
    import json

    timer = fake({"v16_vnni": [1.0] * 5, "v16_avx2": [1.1] * 5, "r32": [1.2] * 5, "v16": [3.0] * 5})
    choice.choose(VNNI_HOST, timer=timer, prefetch_timer=NO_GAIN)
    doc = json.loads((cache / choice.FILE).read_text())
    for entry in doc.values():
        if isinstance(entry, dict):
            del entry["prefetch_bytes"]                                    # a file written before the distance
    (cache / choice.FILE).write_text(json.dumps(doc))
    choice.choose(VNNI_HOST, timer=timer, prefetch_timer=NO_GAIN)
    assert len(timer.calls) == 2


def test_every_prefetch_distance_gives_the_same_bits():
    """The distance only moves prefetch instructions: each x86 V16 kernel's outputs are identical at 0 and 2 KiB."""
    import numpy as np

    from kestrel_lab.kernels import ops as K
    from kestrel_lab.kernels.host import host_features

    rng = np.random.default_rng(3)
    rows, cols = 64, 512
    q4 = rng.integers(0, 256, size=(rows, cols // 32, 18), dtype=np.uint8)
    q4[..., :2] = np.frombuffer(np.float16(0.02).tobytes(), np.uint8)
    q4 = q4.reshape(rows, -1)
    x = rng.standard_normal((1, cols), dtype=np.float32)
    nb = cols // 32
    xq, xd, xc = np.empty((1, cols), np.int8), np.empty((1, nb), np.float32), np.empty((1, nb), np.int16)
    K.quantize_act(x, xq, xd)
    K.act_block_sums(xq, xc)
    for v in variants.supported(host_features()):
        if not v.prefetches:
            continue
        nib, sc = np.empty((rows // 16, cols // 32 * 256), np.uint8), np.empty((rows // 16, cols // 32 * 16), np.uint16)
        v.repack(q4, nib, sc, 2)
        outs = []
        for d in (0, 2048):
            y = np.empty(rows, np.float32)
            v.matvec(nib, sc, xq, xc, xd, y, 2, d)
            g = np.empty(rows // 2, np.float32)
            v.swiglu(nib[:2], sc[:2], nib[2:], sc[2:], xq, xc, xd, g, 2, d)
            outs.append((y, g))
        assert all(np.array_equal(a, b) for a, b in zip(*outs)), v.name


def test_the_prefetch_timer_runs_a_real_decode_step():
    """``measure_prefetch`` times the variant's whole-step kernel at each distance (one small layer here)."""
    from kestrel_lab.kernels.host import host_features

    v = next(v for v in variants.supported(host_features()) if v.prefetches)
    t = choice.measure_prefetch(v, repeats=2, layers=1)
    assert sorted(t) == ["0", "2048"] and all(len(s) == 2 and min(s) > 0 for s in t.values())
