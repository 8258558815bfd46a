"""kestrel_lab.roofline: kernels agree with numpy, the arithmetic of ceilings, thread handling.

Speeds are printed by the day02_3 notebook, never asserted: here only shapes, units and invariants.
"""
import json

import numba
import numpy as np
import pytest

from kestrel_lab import roofline
from kestrel_lab.paths import configs_dir


@pytest.mark.parametrize("n,chunks", [(1, 1), (7, 8), (1000, 3), (100_003, 8), (4096, 4)])
def test_sum_kernel_matches_numpy(n, chunks):
    a = np.random.default_rng(n).random(n, dtype=np.float32)
    assert roofline._sum_chunks(a, chunks) == pytest.approx(float(a.astype(np.float64).sum()), rel=1e-5)


@pytest.mark.parametrize("n,chunks", [(1, 1), (7, 8), (100_003, 8)])
def test_copy_and_fill_kernels(n, chunks):
    src = np.random.default_rng(0).random(n, dtype=np.float32)
    dst = np.zeros_like(src)
    roofline._copy_chunks(dst, src, chunks)
    assert np.array_equal(dst, src)
    roofline._fill_chunks(dst, np.float32(2.5), chunks)
    assert np.all(dst == 2.5)


@pytest.mark.parametrize("rows,cols", [(1, 1), (3, 37), (64, 256)])
def test_matvec_kernel_matches_numpy(rows, cols):
    rng = np.random.default_rng(rows * cols)
    w = rng.standard_normal((rows, cols), dtype=np.float32)
    x = rng.standard_normal(cols, dtype=np.float32)
    y = np.empty(rows, dtype=np.float32)
    roofline._matvec_f32(w, x, y)
    np.testing.assert_allclose(y, w.astype(np.float64) @ x.astype(np.float64), rtol=1e-4, atol=1e-4)


def test_memory_bandwidth_reports_and_restores_threads():
    before = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        res = roofline.memory_bandwidth(threads=None, size_mb=4, repeat=2)
        assert numba.get_num_threads() == 1  # restored
        assert res["threads"] == numba.config.NUMBA_NUM_THREADS
    finally:
        numba.set_num_threads(before)
    assert res["bytes"] == 4 * 2**20
    assert res["repeat"] == 2 and len(res["read_seconds"]) == 2 and len(res["copy_seconds"]) == 2
    for key in ("read_gbs", "copy_gbs"):
        assert isinstance(res[key], float) and res[key] > 0
    # The medians and the reported GB/s are the same numbers seen two ways.
    assert res["read_gbs"] == pytest.approx(res["bytes"] / np.median(res["read_seconds"]) / 1e9)
    assert res["copy_gbs"] == pytest.approx(2 * res["bytes"] / np.median(res["copy_seconds"]) / 1e9)


def test_memory_bandwidth_one_thread():
    res = roofline.memory_bandwidth(threads=1, size_mb=2, repeat=1)
    assert res["threads"] == 1


@pytest.mark.parametrize("bad,err", [(0, ValueError), (-1, ValueError), (10_000, ValueError),
                                     (1.5, TypeError), (True, TypeError)])
def test_bad_thread_counts_are_refused(bad, err):
    before = numba.get_num_threads()
    with pytest.raises(err, match="threads"):
        roofline.memory_bandwidth(threads=bad, size_mb=1, repeat=1)
    assert numba.get_num_threads() == before


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="size_mb"):
        roofline.memory_bandwidth(size_mb=0)
    with pytest.raises(ValueError, match="repeat"):
        roofline.matvec_gflops(rows=8, cols=8, repeat=0)
    with pytest.raises(TypeError, match="rows"):
        roofline.matvec_gflops(rows=8.0, cols=8)


def test_thread_count_restored_after_an_error(monkeypatch):
    before = numba.get_num_threads()

    def boom(*a, **k):
        raise RuntimeError("kernel failed")

    monkeypatch.setattr(roofline, "_check_kernels", boom)
    with pytest.raises(RuntimeError, match="kernel failed"):
        roofline.memory_bandwidth(threads=1, size_mb=1, repeat=1)
    assert numba.get_num_threads() == before


def test_matvec_gflops_fields():
    res = roofline.matvec_gflops(rows=128, cols=96, threads=1, repeat=2)
    assert res["flops"] == 2 * 128 * 96
    assert res["bytes"] == 4 * (128 * 96 + 96 + 128)
    assert res["intensity"] == pytest.approx(res["flops"] / res["bytes"])
    assert res["max_abs_diff"] < 1e-3
    for key in ("numpy_gflops", "numba_gflops", "numpy_gbs", "numba_gbs"):
        assert res[key] > 0
    # GFLOP/s and GB/s of the same run differ exactly by the intensity.
    assert res["numba_gflops"] == pytest.approx(res["numba_gbs"] * res["intensity"])


def test_matmul_gflops_fields():
    res = roofline.matmul_gflops(n=64, repeat=2)
    assert res["flops"] == 2 * 64**3 and res["intensity"] == pytest.approx(64 / 6)
    assert res["gflops"] > 0


def test_decode_ceiling():
    # 16 GB/s over 335.5 MB per token: the DESIGN.md reference ceiling of ~48 tok/s.
    assert roofline.decode_ceiling(335_503_360, 16.0) == pytest.approx(47.69, abs=0.01)
    assert roofline.decode_ceiling(1_000_000_000, 1.0) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="weight_bytes_per_token"):
        roofline.decode_ceiling(0, 16.0)
    with pytest.raises(ValueError, match="read_gbs"):
        roofline.decode_ceiling(100, float("nan"))
    with pytest.raises(TypeError, match="weight_bytes_per_token"):
        roofline.decode_ceiling(1.5e8, 16.0)


def test_roofline_model():
    got = roofline.attainable_gflops([0.25, 1.0, 10.0, 100.0], peak_gflops=100.0, bandwidth_gbs=20.0)
    np.testing.assert_allclose(got, [5.0, 20.0, 100.0, 100.0])
    assert roofline.ridge_intensity(100.0, 20.0) == 5.0
    with pytest.raises(ValueError, match="bandwidth_gbs"):
        roofline.ridge_intensity(100.0, 0.0)


def qwen3_06b():
    return json.loads((configs_dir() / "qwen3-0.6b.config.json").read_text())


def test_weights_read_per_token_qwen3_06b_q4_0():
    res = roofline.weights_read_per_token(qwen3_06b())
    # q 2048x1024, k/v 1024x1024, o 1024x2048, gate/up 3072x1024, down 1024x3072
    assert res["per_layer_weights"] == 15 * 2**20
    assert res["layer_matrix_bytes"] == 28 * 15 * 2**20 // 32 * 18
    assert res["lm_head_bytes"] == 151936 * 1024 // 32 * 18
    assert res["norm_bytes"] == 4 * (28 * (2 * 1024 + 2 * 128) + 1024)
    assert res["total"] == 335_503_360  # DESIGN.md: 335.5 MB read per token, lm head included


def test_weights_read_per_token_q8_0_and_errors():
    cfg = qwen3_06b()
    q8 = roofline.weights_read_per_token(cfg, block_bytes=34)
    q4 = roofline.weights_read_per_token(cfg, block_bytes=18)
    assert q8["layer_matrix_bytes"] * 18 == q4["layer_matrix_bytes"] * 34
    del cfg["vocab_size"]
    with pytest.raises(KeyError, match="vocab_size"):
        roofline.weights_read_per_token(cfg)
    cfg = qwen3_06b()
    cfg["hidden_size"] = "1024"
    with pytest.raises(ValueError, match="hidden_size"):
        roofline.weights_read_per_token(cfg)
    cfg = qwen3_06b()
    cfg["hidden_size"] = 1000  # not a multiple of 32
    with pytest.raises(ValueError, match="block size"):
        roofline.weights_read_per_token(cfg)


def test_last_level_cache_is_plausible():
    llc = roofline.last_level_cache_bytes()
    assert llc is None or 2**15 <= llc <= 2**31


def test_schedule_is_restored_and_best_is_not_slower_than_median():
    before = numba.get_parallel_chunksize()
    res = roofline.memory_bandwidth(threads=1, size_mb=2, repeat=3)
    roofline.matvec_gflops(rows=64, cols=64, threads=1, repeat=1)
    assert numba.get_parallel_chunksize() == before
    assert res["read_gbs_best"] >= res["read_gbs"] and res["copy_gbs_best"] >= res["copy_gbs"]


def test_chunk_count():
    assert roofline._n_chunks(256 * 2**20, 2) == 2 * roofline._CHUNKS_PER_THREAD
    assert roofline._n_chunks(3 * 2**20, 8) == 3  # never below 1 MiB per unit
    assert roofline._n_chunks(100, 4) == 1


@pytest.mark.parametrize("layout", ["Q4_0_R32", "Q4_0_V16"])
def test_int8_dot_peak_kernel_computes_the_matvec(layout):
    """The compute-limit loop runs the engine's real group function: its last outputs are the rows of
    the matvec of the group it ended on, checked against a float64 dequantized product."""
    from kestrel_lab import quant as Q

    case = roofline._peak_case(layout, cols=256, groups=3)
    qr = case["rows_per_group"]
    units, iters = 2, 5
    last = np.zeros((units, qr), np.float32)
    case["kernel"](case["nib"], case["sc"], case["xq"], case["xc"], case["xd"], iters, last)
    w = Q.dequantize(case["q4"].reshape(-1), Q.Q4_0, 3 * qr, 256).astype(np.float64)
    x = case["xq"][0].astype(np.float64) * np.repeat(case["xd"][0].astype(np.float64), 32)
    y = w @ x
    for u in range(units):
        g = (iters - 1 + u) % 3
        np.testing.assert_allclose(last[u], y[g * qr:(g + 1) * qr], rtol=1e-4, atol=1e-4)


def test_int8_dot_peak_reports_consistent_units():
    res = roofline.int8_dot_peak(threads=1, layout="Q4_0_R32", repeat=2, seconds=0.01)
    assert res["threads"] == 1 and res["layout"] == "Q4_0_R32" and len(res["samples"]) == 2
    macs = res["iters"] * 32 * res["cols"]
    assert res["gmacs"] == pytest.approx(macs / np.median(res["samples"]) / 1e9)
    assert res["weight_gbs"] == pytest.approx(res["gmacs"] * 18 / 32)
    assert res["resident_bytes"] < 64 * 1024


@pytest.mark.parametrize("kw,err", [({"layout": "Q8_0"}, ValueError), ({"cols": 100}, ValueError),
                                    ({"groups": 0}, ValueError), ({"threads": 0}, ValueError)])
def test_int8_dot_peak_rejects_bad_arguments(kw, err):
    with pytest.raises(err):
        roofline.int8_dot_peak(repeat=1, seconds=0.001, **kw)


def test_dram_working_set_is_a_multiple_of_the_cache_within_the_cap():
    MiB = roofline.MiB
    small = roofline.dram_working_set(4, llc=8 * MiB)            # a laptop: 4x its L3, not capped
    assert small.nbytes == small.wanted == 32 * MiB and not small.capped and small.streams
    assert small.llc_ratio == 4
    vm = roofline.dram_working_set(4, llc=480 * MiB)             # a VM that reports 480 MiB: capped
    assert vm.nbytes == roofline.DRAM_SET_CAP < vm.wanted and vm.capped and vm.streams is False
    assert "封顶" in vm.note() and "未必" in vm.note()
    assert roofline.dram_working_set(4, floor=64 * MiB, llc=8 * MiB).nbytes == 64 * MiB
    assert roofline.dram_working_set(4, floor=10 * roofline.DRAM_SET_CAP, llc=MiB).nbytes == roofline.DRAM_SET_CAP
    unknown = roofline.dram_working_set(4, llc=0)                # /sys says nothing: the assumed LLC
    assert unknown.nbytes == 4 * roofline.ASSUMED_LLC and unknown.streams is None and unknown.llc_ratio is None
    assert "没有报告" in unknown.note()
    with pytest.raises(ValueError):
        roofline.dram_working_set(0)


def test_working_set_rows_round_towards_the_rule():
    MiB = roofline.MiB
    ws = roofline.dram_working_set(4, llc=MiB)                   # wants 4 MiB: rows rounded up to reach it
    rows = ws.rows(1000, 64)
    assert rows % 64 == 0 and rows * 1000 >= ws.wanted and (rows - 64) * 1000 < ws.wanted
    capped = roofline.dram_working_set(4, llc=1024 * MiB, cap=10 * MiB)   # capped: rounded down to stay under
    rows = capped.rows(1000, 64)
    assert rows % 64 == 0 and rows * 1000 <= capped.cap and (rows + 64) * 1000 > capped.cap
    assert capped.sized(rows * 1000).nbytes == rows * 1000 and capped.sized(rows * 1000).capped
    assert roofline.dram_working_set(1, llc=1, cap=10).rows(1000, 32) == 32    # never fewer than one group
