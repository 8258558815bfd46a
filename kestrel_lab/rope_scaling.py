"""RoPE scaling for contexts past the trained window: ``linear`` and ``yarn``, as transformers computes them.

Plain RoPE rotates frequency pair ``i`` of a head by ``pos · θ^(−2i/D)``. A model trained on windows of
``W`` tokens has never seen the angles of the slow pairs past ``W``; two ways to stretch it:

- **linear** (position interpolation): every frequency divided by ``factor`` — position ``p`` looks like
  ``p / factor``. The fast pairs, which told neighbours apart, are squeezed too.
- **yarn** (Peng et al. 2023): pairs that turn many times inside the original window keep their
  frequency (extrapolation), pairs that turn less than once are divided by ``factor`` (interpolation),
  and a linear *ramp* over the pair index blends the two in between. The ramp runs from
  ``low = floor(d(β_fast))`` to ``high = ceil(d(β_slow))``, where ``d(r) = D·ln(W / (2π·r)) / (2·ln θ)`` is the
  pair index that makes ``r`` turns in ``W`` tokens (β_fast = 32, β_slow = 1 by default). cos and sin are
  then multiplied by the *attention factor* ``0.1·ln(factor) + 1`` (or the config's ``attention_factor``, or
  DeepSeek's ``mscale`` ratio), which sharpens the softmax that the longer context flattens.

transformers 5.24's ``_compute_linear_scaling_rope_parameters`` / ``_compute_yarn_parameters`` are the
reference, line for line and in the same precisions: the frequencies, the ramp and the products in
float32, the factor and the attention factor entering as float32 scalars (torch rounds a Python scalar
to the tensor's dtype), the correction range in float64. ``RopeScaling`` therefore keeps exactly the
float32 values the arithmetic consumes — ``factor``, ``attention_factor``, the ramp's ``low`` and ``width``
— which is also what a VQF header stores (``vqf.format.ROPE_FIELDS``). Other rope types are refused by
name (``REFUSED``). numpy only; this module knows config-level values, nothing of the engine.

Taught in day24_3.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: The rope types the engine implements, with their id in a VQF header's ``rope_type`` field.
ROPE_TYPES = {"default": 0, "linear": 1, "yarn": 2}
ROPE_TYPE_NAMES = {v: k for k, v in ROPE_TYPES.items()}
#: transformers' other rope types: each changes the math, none is implemented here.
REFUSED = {
    "dynamic": "dynamic NTK: the frequencies change with the sequence length",
    "longrope": "LongRoPE: per-frequency factor lists switched at the original window",
    "llama3": "Llama 3's piecewise frequency rescaling",
    "proportional": "proportional RoPE",
}
YARN_BETA_FAST = 32.0
YARN_BETA_SLOW = 1.0


@dataclass(frozen=True)
class RopeScaling:
    """A resolved rope scaling: the float32 values the frequencies and cos/sin are computed from.

    ``rope_type`` "linear" or "yarn"; ``factor`` the context stretch; ``attention_factor`` multiplies cos
    and sin (1 for linear); yarn's ramp blends pair ``i`` by ``clamp((i − ramp_low) / ramp_width, 0, 1)``
    from extrapolated (0) to interpolated (1). Taught in day24_3.
    """

    rope_type: str
    factor: float
    attention_factor: float = 1.0
    ramp_low: float = 0.0
    ramp_width: float = 0.0


def _f32(x: float) -> float:
    return float(np.float32(x))


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's attention factor ``0.1·mscale·ln(scale) + 1`` (1 for scale ≤ 1), in float64. Taught in day24_3."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def correction_dim(turns: float, dim: int, theta: float, window: int) -> float:
    """The (fractional) pair index whose frequency makes ``turns`` full turns in ``window`` tokens.

    transformers' ``find_correction_dim``. Taught in day24_3."""
    return (dim * math.log(window / (turns * 2 * math.pi))) / (2 * math.log(theta))


def yarn(factor: float, head_dim: int, theta: float, original_window: int, *, beta_fast: float | None = None,
         beta_slow: float | None = None, attention_factor: float | None = None, mscale: float | None = None,
         mscale_all_dim: float | None = None, truncate: bool = True) -> RopeScaling:
    """The ``RopeScaling`` of a yarn configuration (the keys of ``rope_parameters``). Taught in day24_3."""
    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = float(yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim))
        else:
            attention_factor = yarn_mscale(factor)
    fast, slow = beta_fast or YARN_BETA_FAST, beta_slow or YARN_BETA_SLOW      # transformers' `or` defaults
    low = correction_dim(fast, head_dim, theta, original_window)
    high = correction_dim(slow, head_dim, theta, original_window)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001                                     # transformers: "prevent singularity"
    return RopeScaling("yarn", _f32(factor), _f32(attention_factor), _f32(low), _f32(high - low))


def linear(factor: float) -> RopeScaling:
    """The ``RopeScaling`` of a linear configuration. Taught in day24_3."""
    return RopeScaling("linear", _f32(factor))


def _power(head_dim: int, theta: float) -> np.ndarray:
    """``θ^(2i/D)`` for i < D/2, float32, correctly rounded (torch's float32 ``pow`` is within an ulp)."""
    expo = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    return (np.float64(theta) ** expo.astype(np.float64)).astype(np.float32)


def base_inv_freq(head_dim: int, theta: float) -> np.ndarray:
    """Plain RoPE's ``θ^(−2i/D)`` for i < D/2: ``1 / power`` in float32. Taught in day24_3."""
    return (np.float32(1.0) / _power(head_dim, theta)).astype(np.float32)


def ramp(scaling: RopeScaling, half: int) -> np.ndarray:
    """yarn's blend per pair, float32: 0 keeps the original frequency, 1 divides it by ``factor``.

    (transformers' ``1 − inv_freq_extrapolation_factor``.) Taught in day24_3."""
    i = np.arange(half, dtype=np.float32)
    r = (i - np.float32(scaling.ramp_low)) / np.float32(scaling.ramp_width)
    return np.clip(r, np.float32(0), np.float32(1)).astype(np.float32)


def inv_freq(head_dim: int, theta: float, scaling: RopeScaling | None = None) -> np.ndarray:
    """The D/2 inverse frequencies of a (possibly scaled) RoPE, float32, as transformers computes them.

    Taught in day24_3."""
    power = _power(head_dim, theta)
    inv = (np.float32(1.0) / power).astype(np.float32)
    if scaling is None:
        return inv
    f = np.float32(scaling.factor)
    if scaling.rope_type == "linear":
        return (inv / f).astype(np.float32)
    if scaling.rope_type != "yarn":
        raise ValueError(f"rope type {scaling.rope_type!r} is not implemented (known: linear, yarn)")
    interp = np.float32(1.0) / (f * power)
    extra = np.float32(1.0) - ramp(scaling, head_dim // 2)          # transformers' extrapolation factor
    return (interp * (np.float32(1.0) - extra) + inv * extra).astype(np.float32)


def attention_factor(scaling: RopeScaling | None) -> np.float32:
    """What cos and sin are multiplied by (float32; 1 without scaling). Taught in day24_3."""
    return np.float32(1.0 if scaling is None else scaling.attention_factor)


def cos_sin(positions, head_dim: int, theta: float, scaling: RopeScaling | None = None):
    """cos and sin (n, D/2) float32 of 1-D positions under ``scaling``: angle = pos · inv_freq in float32,
    then cos/sin times the attention factor. Taught in day24_3."""
    pos = np.asarray(positions, dtype=np.float32).reshape(-1)
    ang = pos[:, None] * inv_freq(head_dim, theta, scaling)[None, :]
    a = attention_factor(scaling)
    return (np.cos(ang) * a).astype(np.float32), (np.sin(ang) * a).astype(np.float32)


__all__ = ["ROPE_TYPES", "ROPE_TYPE_NAMES", "REFUSED", "RopeScaling", "yarn", "linear", "yarn_mscale",
           "correction_dim", "base_inv_freq", "ramp", "inv_freq", "attention_factor", "cos_sin"]
