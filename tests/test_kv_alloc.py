"""The KV cache commits memory where it is written, not in 2 MiB huge pages (kestrel_lab.engine.kv)."""
import numpy as np
import pytest

from kestrel_lab.procfs import rss_bytes
from kestrel_lab.engine.kv import KVCache, lazy_zeros


def test_lazy_zeros_is_a_writable_zero_array():
    a = lazy_zeros((3, 5, 7))
    assert a.dtype == np.float32 and a.shape == (3, 5, 7) and a.flags.writeable
    assert not a.any()
    a[1, 2, 3] = 4.0
    assert a.sum() == 4.0
    assert lazy_zeros((0, 4)).shape == (0, 4)


def test_first_token_of_a_06b_cache_commits_megabytes_not_896_mib():
    # Qwen3-0.6B's shapes at 4,096 positions: 896 MiB reserved. One token writes one row in each of the
    # 28 × 8 (layer, head) runs of K and of V; with 4 KiB pages that is 448 pages ≈ 1.75 MiB.
    cache = KVCache(28, 8, 128, 4096)
    assert cache.alloc == "lazy"
    r0 = rss_bytes()
    cache.k[:, :, 0] = 1.0
    cache.v[:, :, 0] = 1.0
    grown = (rss_bytes() - r0) / 2**20
    assert grown < 64, f"writing one position committed {grown:.0f} MiB"


def test_alloc_is_checked():
    with pytest.raises(ValueError, match="alloc"):
        KVCache(1, 1, 32, 8, alloc="huge")
    assert KVCache(1, 1, 32, 8, alloc="numpy").k.shape == (1, 1, 8, 32)
