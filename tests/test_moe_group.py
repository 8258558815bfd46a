"""Routing and grouping invariants on arbitrary inputs (no reference library needed)."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from kestrel_lab.engine import moe


@settings(max_examples=200, deadline=None)
@given(T=st.integers(1, 70), E=st.integers(1, 40), data=st.data())
def test_group_is_a_permutation_sorted_by_expert(T, E, data):
    k = data.draw(st.integers(1, E))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    selected = np.stack([rng.permutation(E)[:k] for _ in range(T)])
    g = moe.group(selected)
    assert (np.diff(g.experts) > 0).all() and g.start[0] == 0 and g.start[-1] == T * k
    for a, e in enumerate(g.experts):               # every pair of expert e's run really chose e
        toks = g.tok[g.start[a]:g.start[a + 1]]
        assert (selected[toks] == e).any(axis=1).all() and (np.diff(toks) > 0).all()
    for t in range(T):                              # pair_of maps (token, slot) back into the runs
        for j in range(k):
            p = g.pair_of[t, j]
            a = np.searchsorted(g.start, p, side="right") - 1
            assert g.tok[p] == t and g.experts[a] == selected[t, j]


@settings(max_examples=200, deadline=None)
@given(T=st.integers(1, 20), E=st.integers(2, 64), norm=st.booleans(), data=st.data())
def test_route_takes_the_k_largest_in_order(T, E, norm, data):
    k = data.draw(st.integers(1, E))
    logits = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1))).standard_normal((T, E)).astype(np.float32) * 4
    idx, w = moe.route(logits, k, norm)
    p = moe.softmax_f32(logits)
    assert np.allclose(p.sum(-1), 1, atol=1e-5)
    chosen = np.take_along_axis(p, idx, -1)
    assert (np.diff(chosen, axis=-1) <= 0).all()                               # descending
    assert (chosen[:, -1] >= np.sort(p, -1)[:, E - k] - 1e-7).all()           # nothing larger left out
    np.testing.assert_allclose(w.sum(-1), 1.0 if norm else chosen.sum(-1), rtol=1e-5)
