"""The engine's logits against a reference, step by step: one loop for every architecture's tests.

``compare_steps`` runs ``prompt`` through ``engine.prefill`` and then each id of ``cont`` through
``engine.decode``, and compares every step's logits with the reference's logits of the whole sequence
(``ref``: (len(prompt) + len(cont), vocab), e.g. transformers' forward on the same ids): the prefill
step with row ``len(prompt) - 1``, decode step k with the row after it. It asserts that each step is
within ``tol`` of the logit scale (``max |ref|``) and returns the per-step max abs differences.
"""
from __future__ import annotations

import numpy as np


def compare_steps(engine, ref: np.ndarray, prompt, cont, *, tol: float = 1e-4, label: str = "engine") -> np.ndarray:
    """Per-step max |engine − ref| (step 0 = prefill); AssertionError naming the first step beyond
    ``tol`` · max|ref|."""
    prompt, cont = list(prompt), list(cont)
    assert ref.shape[0] == len(prompt) + len(cont), "ref must hold the logits of prompt + cont"
    got = [engine.prefill(prompt)]
    got += [engine.decode(t) for t in cont]
    diff = np.abs(np.stack(got) - ref[len(prompt) - 1:]).max(axis=1)
    scale = float(np.abs(ref).max())
    print(f"\n{label} vs reference: prefill {diff[0]:.3g}, worst decode step "
          f"{diff[1:].max() if diff.size > 1 else float('nan'):.3g} (logit scale {scale:.3g}, tolerance {tol:g} of it)")
    assert diff[0] <= tol * scale, f"{label}: prefill logits differ by {diff[0]:.3g} (scale {scale:.3g})"
    bad = np.nonzero(diff[1:] > tol * scale)[0]
    assert bad.size == 0, f"{label}: decode step {int(bad[0])} differs by {diff[1 + bad[0]]:.3g} (scale {scale:.3g})"
    return diff
