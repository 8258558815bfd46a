"""Sampling: greedy, temperature, top-k, top-p, min-p, repetition penalty, seeds (deterministic)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from kestrel_lab.engine.sample import (Sampler, SamplingParams, apply_repetition_penalty, entropy,
                                       min_p_filter, softmax, top_k_filter, top_p_filter)

V = 1000


def _logits(seed: int, n: int = V, scale: float = 3.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(n) * scale).astype(np.float32)


def test_params_validation_names_the_field():
    for kwargs, field in ((dict(temperature=-1), "temperature"), (dict(top_k=-2), "top_k"),
                          (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"), (dict(min_p=1.0), "min_p"),
                          (dict(repetition_penalty=0), "repetition_penalty"), (dict(seed=-1), "seed"),
                          (dict(temperature=float("nan")), "temperature")):
        with pytest.raises(ValueError, match=field):
            SamplingParams(**kwargs)


def test_softmax_and_entropy():
    p = softmax(np.array([0.0, 0.0, -np.inf, 0.0, 0.0]))
    assert p.tolist() == [0.25, 0.25, 0.0, 0.25, 0.25]
    assert entropy(p) == pytest.approx(2.0)
    assert softmax(np.array([1000.0, 0.0]))[0] == pytest.approx(1.0)
    with pytest.raises(ValueError):
        softmax(np.array([-np.inf, -np.inf]))


def test_greedy_is_argmax_and_uses_no_randomness():
    s = Sampler(temperature=0.0, seed=1)
    state = s.rng.bit_generator.state
    for seed in range(20):
        x = _logits(seed)
        assert s(x) == int(np.argmax(x))
    assert s.rng.bit_generator.state == state


@pytest.mark.parametrize("seed", range(5))
def test_temperature_to_zero_equals_greedy(seed):
    x = _logits(seed)
    cold = Sampler(temperature=1e-4, seed=seed)
    assert all(cold(x) == int(np.argmax(x)) for _ in range(50))


def test_same_seed_same_ids_different_seed_different_ids():
    xs = [_logits(i, scale=1.0) for i in range(64)]
    a = [Sampler(temperature=1.0, seed=7)(x) for x in xs]  # fresh sampler per step: same first draw
    s1, s2, s3 = Sampler(temperature=1.0, seed=7), Sampler(temperature=1.0, seed=7), Sampler(temperature=1.0, seed=8)
    r1 = [s1(x) for x in xs]
    r2 = [s2(x) for x in xs]
    r3 = [s3(x) for x in xs]
    assert r1 == r2
    assert r1 != r3
    assert len(set(a)) > 1
    s1.reseed()
    assert [s1(x) for x in xs] == r1


@given(st.integers(0, 10_000), st.integers(1, 50))
@settings(max_examples=60, deadline=None)
def test_top_k_never_emits_outside_the_top_k(seed, k):
    x = _logits(seed)
    allowed = set(np.argsort(-x)[:k].tolist())
    s = Sampler(temperature=2.0, top_k=k, seed=seed)  # hot: the tail would show up if allowed
    got = {s(x) for _ in range(40)}
    assert got <= allowed
    assert np.count_nonzero(np.isfinite(top_k_filter(x, k))) == k


def test_top_k_keeps_ties_like_transformers():
    x = np.array([3.0, 1.0, 3.0, 2.0, 3.0])
    assert np.isfinite(top_k_filter(x, 2)).tolist() == [True, False, True, False, True]


@given(st.integers(0, 10_000), st.floats(0.01, 0.99))
@settings(max_examples=80, deadline=None)
def test_top_p_keeps_the_smallest_set_with_mass_at_least_p(seed, p):
    x = _logits(seed)
    probs = softmax(x)
    kept = np.isfinite(top_p_filter(x, p))
    # mass of the kept set reaches p …
    assert probs[kept].sum() >= p - 1e-12
    # … every kept token is at least as likely as every dropped one …
    if (~kept).any():
        assert probs[kept].min() >= probs[~kept].max()
    # … and dropping the least likely kept token would fall below p (smallest such set)
    n = int(kept.sum())
    if n > 1:
        assert probs[kept].sum() - probs[kept].min() < p + 1e-12
    s = Sampler(temperature=1.0, top_p=p, seed=seed)
    assert all(kept[s(x)] for _ in range(30))


def test_top_p_numbers_by_hand():
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    x = np.log(probs)
    assert np.isfinite(top_p_filter(x, 0.5)).tolist() == [True, False, False, False]
    assert np.isfinite(top_p_filter(x, 0.75)).tolist() == [True, True, False, False]
    assert np.isfinite(top_p_filter(x, 0.85)).tolist() == [True, True, True, False]
    assert np.isfinite(top_p_filter(x, 1.0)).all()


def test_min_p():
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    kept = np.isfinite(min_p_filter(np.log(probs), 0.2)).tolist()
    assert kept == [True, True, True, False]  # threshold 0.1


def test_repetition_penalty_ctrl_convention():
    x = np.array([2.0, -2.0, 1.0, -1.0, 0.5], dtype=np.float32)
    y = apply_repetition_penalty(x, [0, 1, 1, 4], 2.0)
    assert y.tolist() == [1.0, -4.0, 1.0, -1.0, 0.25]
    assert x.tolist() == [2.0, -2.0, 1.0, -1.0, 0.5]  # not modified in place
    assert apply_repetition_penalty(x, [], 2.0).tolist() == x.tolist()
    with pytest.raises(ValueError, match="outside the vocabulary"):
        apply_repetition_penalty(x, [5], 1.3)


def test_repetition_penalty_matches_transformers():
    torch = pytest.importorskip("torch")
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    x = _logits(3)
    hist = [5, 9, 9, 100, 999, 0]
    ref = RepetitionPenaltyLogitsProcessor(1.3)(torch.tensor([hist]), torch.tensor(x)[None].clone())
    np.testing.assert_allclose(apply_repetition_penalty(x, hist, 1.3), ref[0].numpy(), rtol=1e-6)


def test_filters_match_transformers_warpers():
    torch = pytest.importorskip("torch")
    from transformers.generation.logits_process import (MinPLogitsWarper, TemperatureLogitsWarper,
                                                        TopKLogitsWarper, TopPLogitsWarper)

    for seed in range(10):
        x = _logits(seed)
        ours = Sampler(temperature=0.7, top_k=40, top_p=0.9, min_p=0.05).adjusted_logits(x)
        t = torch.tensor(x, dtype=torch.float64)[None]
        ids = torch.zeros((1, 1), dtype=torch.long)
        for w in (TemperatureLogitsWarper(0.7), TopKLogitsWarper(40), TopPLogitsWarper(0.9),
                  MinPLogitsWarper(0.05)):
            t = w(ids, t)
        ref = t[0].numpy()
        assert (np.isfinite(ours) == np.isfinite(ref)).all(), f"seed {seed}: kept sets differ"
        np.testing.assert_allclose(ours[np.isfinite(ours)], ref[np.isfinite(ref)], rtol=1e-12)


def test_sampling_frequencies_follow_the_distribution():
    x = np.log(np.array([0.6, 0.3, 0.1]))
    s = Sampler(temperature=1.0, seed=123)
    counts = np.bincount([s(x) for _ in range(20_000)], minlength=3) / 20_000
    np.testing.assert_allclose(counts, [0.6, 0.3, 0.1], atol=0.015)


def test_penalty_changes_greedy_choice():
    x = np.array([5.0, 4.0, 1.0], dtype=np.float32)
    assert Sampler(temperature=0.0)(x, history=[0]) == 0
    assert Sampler(temperature=0.0, repetition_penalty=1.5)(x, history=[0]) == 1


def test_probs_is_the_distribution_drawn_from():
    x = _logits(1)
    s = Sampler(temperature=0.8, top_k=5, seed=0)
    p = s.probs(x)
    assert p.sum() == pytest.approx(1.0) and np.count_nonzero(p) == 5
    g = Sampler(temperature=0.0).probs(x)
    assert g.max() == 1.0 and int(np.argmax(g)) == int(np.argmax(x))


def test_bad_logits_shape():
    with pytest.raises(ValueError, match="1-D"):
        Sampler()(np.zeros((2, 3)))


def _top_p_by_full_sort(logits, p):
    """The nucleus by sorting every probability: what top_p_filter's partition shortcut must equal."""
    x = np.array(logits, dtype=np.float64, copy=True)
    probs = softmax(x)
    order = np.argsort(-probs, kind="stable")
    before = np.cumsum(probs[order]) - probs[order]
    x[order[before >= p]] = -np.inf
    return x


@pytest.mark.parametrize("vocab", [7, 3000, 151_936])
@pytest.mark.parametrize("p", [0.05, 0.9, 0.999999])
def test_top_p_shortcut_equals_the_full_sort(vocab, p):
    # Wide logits (small nucleus), flat ones (a nucleus larger than the first candidate guess, so the
    # candidate set has to grow) and rounded ones (ties at the candidate boundary, kept by id).
    rng = np.random.default_rng(vocab)
    for x in (rng.standard_normal(vocab) * 8, rng.standard_normal(vocab) * 0.3,
              np.round(rng.standard_normal(vocab), 1), np.zeros(vocab)):
        x = x.astype(np.float32)
        assert np.array_equal(top_p_filter(x, p), _top_p_by_full_sort(x, p))
