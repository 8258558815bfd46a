"""kestrel_lab.machine on a fake RK3588 (tests/fixtures/rk3588/: 4×A55 + 2×A76@2256 + 2×A76@2304, mixed
governors): clusters, the fastest cluster as the default, --cpus names and lists, per-cluster governors
and the warnings; numba's threading layer and libgomp; the emulated mark. qemu-user shows the host's
/proc and /sys, so the fixture is the only way to check the big.LITTLE code off a board."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kestrel_lab import machine
from kestrel_lab.paths import REPO_ROOT

RK = Path(__file__).parent / "fixtures" / "rk3588"
ROOTS = machine.Roots(RK / "proc", RK / "sys")


def test_rk3588_clusters_from_cpu_part_and_max_frequency():
    cl = machine.cpu_clusters(ROOTS)
    assert [(c["model"], c["max_mhz"], c["cpus"]) for c in cl] == [
        ("Cortex-A55", 1800, [0, 1, 2, 3]), ("Cortex-A76", 2256, [4, 5]), ("Cortex-A76", 2304, [6, 7])]
    assert [c["governor"] for c in cl] == ["schedutil", "performance", "ondemand"]
    assert cl[0]["governors"] == {"schedutil": [0, 1, 2, 3]}


def test_core_types_merge_the_two_a76_pairs_and_rank_the_a55_slowest():
    types = machine.core_types(machine.cpu_clusters(ROOTS))
    assert [(t["model"], t["cpus"], t["max_mhz"]) for t in types] == [
        ("Cortex-A55", [0, 1, 2, 3], 1800), ("Cortex-A76", [4, 5, 6, 7], 2304)]


def test_without_cpufreq_the_little_part_still_ranks_below(tmp_path):
    (tmp_path / "sys").mkdir()
    shutil.copytree(RK / "proc", tmp_path / "proc")
    roots = machine.Roots(tmp_path / "proc", tmp_path / "sys")
    choice = machine.resolve_cpus(None, roots=roots)
    assert choice.cpus == (4, 5, 6, 7) and choice.model == "Cortex-A76"
    assert machine.cpu_clusters(roots)[0]["governor"] is None


def test_default_is_the_fastest_cluster_and_says_so():
    choice = machine.resolve_cpus(None, roots=ROOTS)
    assert choice.cpus == (4, 5, 6, 7) and choice.name == "big" and choice.default and choice.multi
    assert choice.note() == "cpus 4-7 (4 × Cortex-A76, the fastest cluster; default, --cpus to change)"


@pytest.mark.parametrize("spec, cpus, model", [
    ("big", (4, 5, 6, 7), "Cortex-A76"), ("BIG", (4, 5, 6, 7), "Cortex-A76"),
    ("little", (0, 1, 2, 3), "Cortex-A55"), ("all", tuple(range(8)), None),
    ("4-7", (4, 5, 6, 7), "Cortex-A76"), ("0,2", (0, 2), "Cortex-A55"), ("3-4", (3, 4), None),
])
def test_cpus_names_and_lists(spec, cpus, model):
    choice = machine.resolve_cpus(spec, roots=ROOTS)
    assert choice.cpus == cpus and choice.model == model and not choice.default


def test_default_respects_an_outer_pin():
    """Pinned to the A55s by taskset or rerun --cpus 0-3, the default is the fastest of those."""
    choice = machine.resolve_cpus(None, roots=ROOTS, allowed=[0, 1, 2, 3])
    assert choice.cpus == (0, 1, 2, 3) and choice.model == "Cortex-A55"
    with pytest.raises(ValueError, match=r"--cpus big: the big cluster \(cpus 4-7, Cortex-A76\) is outside"):
        machine.resolve_cpus("big", roots=ROOTS, allowed=[0, 1, 2, 3])


@pytest.mark.parametrize("spec, match", [
    ("9", r"--cpus 9: CPU\(s\) 9 are not available"), ("7-4", r"--cpus 7-4: '7-4' is not a CPU number"),
    ("fast", r"--cpus fast: 'fast' is not a CPU number.*big, little or all"), ("", r"--cpus : '' is not"),
])
def test_bad_cpus_name_the_option(spec, match):
    with pytest.raises(ValueError, match=match):
        machine.resolve_cpus(spec, roots=ROOTS)


def test_single_cluster_machine_big_little_all_agree():
    cl = [{"model": "AMD EPYC", "max_mhz": None, "cpus": [0, 1], "governor": None, "governors": {}, "part": None}]
    for spec in (None, "big", "little", "all"):
        assert machine.resolve_cpus(spec, clusters=cl, allowed=[0, 1]).cpus == (0, 1)
    choice = machine.resolve_cpus(None, clusters=cl, allowed=[0, 1])
    assert not choice.multi and "all cores" in choice.note()


def test_affinity_and_memory_come_from_the_injected_roots():
    assert machine.affinity(ROOTS) == list(range(8))
    assert machine.memory_bytes(ROOTS) == 16139064 * 1024


def test_governor_warnings_only_for_the_measured_cpus():
    fp = machine.fingerprint(roots=ROOTS, cpus=[4, 5, 6, 7])
    gov = [w for w in fp["warnings"] if "governor" in w]
    assert gov == ["cpus 6-7 (Cortex-A76) run the 'ondemand' cpufreq governor, not 'performance': the clock "
                   "ramps while a measurement runs (see book/rerun.md §4)"]
    assert not [w for w in machine.fingerprint(roots=ROOTS, cpus=[4, 5])["warnings"] if "governor" in w]
    every = [w for w in machine.fingerprint(roots=ROOTS)["warnings"] if "governor" in w]
    assert len(every) == 2 and "cpus 0-3 (Cortex-A55)" in every[0]   # default: the whole affinity


def test_describe_shows_each_cluster_governor_and_the_engine_default():
    text = machine.describe(machine.fingerprint(roots=ROOTS, cpus=[4, 5, 6, 7]))
    assert "cluster     4 × Cortex-A55 @ 1800 MHz  (cpus 0-3, governor schedutil)" in text
    assert "cluster     2 × Cortex-A76 @ 2304 MHz  (cpus 6-7, governor ondemand)" in text
    assert "engine      cpus 4-7 (4 × Cortex-A76, the fastest cluster; default, --cpus to change)" in text
    assert "\ngovernor " not in text          # no top-level line that reads cpu0 (an A55) only
    assert text.splitlines()[-1].startswith("warning: cpus 6-7 (Cortex-A76) run the 'ondemand'")


def test_mixed_governors_inside_one_cluster(tmp_path):
    shutil.copytree(RK, tmp_path / "rk")
    (tmp_path / "rk/sys/devices/system/cpu/cpu5/cpufreq/scaling_governor").write_text("powersave\n")
    roots = machine.Roots(tmp_path / "rk/proc", tmp_path / "rk/sys")
    c = machine.cpu_clusters(roots)[1]
    assert c["governor"] == "mixed" and c["governors"] == {"performance": [4], "powersave": [5]}
    assert "governors performance on 4, powersave on 5" in machine.describe(machine.fingerprint(roots=roots))


def test_threading_layer_is_probed_and_omp_needs_libgomp():
    nb = machine.numba_threading(probe=True)
    assert nb["layer_in_use"] in ("omp", "tbb", "workqueue") and isinstance(nb["libgomp"], bool)
    # What the wheel's omp layer links: loadable exactly when that layer can be chosen.
    if nb["layer_in_use"] == "omp":
        assert nb["libgomp"] is True
    text = machine.describe(machine.fingerprint(probe_threading=True))
    assert f"numba layer {nb['layer_in_use']} (asked: " in text


def test_layer_and_libgomp_warnings():
    fp = {"numba": {"layer_in_use": "workqueue", "libgomp": False}, "clusters": [], "measured_cpus": []}
    (w,) = machine.warnings_for(fp)
    assert "'workqueue' threading layer, not 'omp' (libgomp.so.1 is not loadable: sudo apt-get install libgomp1)" in w
    fp["numba"] = {"layer_in_use": None, "libgomp": False}
    assert "sudo apt-get install libgomp1" in machine.warnings_for(fp)[0]
    fp["numba"] = {"layer_in_use": "omp", "libgomp": True}
    assert machine.warnings_for(fp) == []


def test_emulated_mark(monkeypatch):
    monkeypatch.setenv(machine.EMULATED_ENV, "qemu-aarch64-cortex-a76")
    fp = machine.fingerprint(roots=ROOTS)
    assert fp["emulated"] == "qemu-aarch64-cortex-a76" and fp["numba_env"][machine.EMULATED_ENV]
    assert "emulated    qemu-aarch64-cortex-a76 (not a board's timings)" in machine.describe(fp)
    monkeypatch.delenv(machine.EMULATED_ENV)
    monkeypatch.setattr(machine.platform, "machine", lambda: "aarch64")
    host = machine.Roots(Path("/proc"), Path("/sys"))
    x86_host = "sse2" in Path("/proc/cpuinfo").read_text()
    assert bool(machine.emulated(host)) == x86_host   # an aarch64 process seeing x86 cores is emulated
    assert machine.emulated(ROOTS) is None            # a real board's cpuinfo


def test_parse_cpu_list():
    assert machine.parse_cpu_list("0-3,6") == [0, 1, 2, 3, 6] and machine.ranges([0, 1, 2, 3, 6]) == "0-3,6"
    with pytest.raises(ValueError, match="'x' is not a CPU number"):
        machine.parse_cpu_list("1,x")


def test_runner_info_reads_the_fixture_through_the_environment():
    env = dict(os.environ, KESTREL_PROC_ROOT=str(RK / "proc"), KESTREL_SYS_ROOT=str(RK / "sys"),
               PYTHONPATH=str(REPO_ROOT))
    p = subprocess.run([sys.executable, "-m", "kestrel_lab", "runner-info"], env=env, capture_output=True,
                       text=True, timeout=300, cwd=REPO_ROOT)
    assert p.returncode == 0, p.stderr
    assert "cpus 4-7 (4 × Cortex-A76, the fastest cluster" in p.stdout
    assert "checked     governors of cpus 4-7" in p.stdout
    assert "warning: cpus 6-7 (Cortex-A76) run the 'ondemand'" in p.stdout
    little = subprocess.run([sys.executable, "-m", "kestrel_lab", "runner-info", "--cpus", "little"], env=env,
                            capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert "warning: cpus 0-3 (Cortex-A55) run the 'schedutil'" in little.stdout
    assert p.stderr == "" and little.stderr == ""
