"""kestrel_lab.cgroup: which hierarchy a memory cgroup goes in (v1/v2/hybrid fixture trees), that the
cgroup is removed after success, failure, timeout and an exception, and — where this machine allows
it (root, a memory controller) — a real limited run: the child is inside, an allocation past the
limit is killed by the kernel, nothing is left behind."""
from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

import pytest

from kestrel_lab import cgroup as C


# ------------------------------------------------------------------------------ fixture trees
def _tree(tmp_path: Path, files: dict[str, str], proc: str) -> tuple[Path, Path]:
    root = tmp_path / "cg"
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    pc = tmp_path / "proc_self_cgroup"
    pc.write_text(proc)
    return root, pc


def test_v2_unified_tree_uses_our_own_cgroup(tmp_path):
    root, pc = _tree(tmp_path, {"cgroup.controllers": "cpuset cpu io memory pids",
                                "user.slice/s1/cgroup.controllers": "cpu memory pids",
                                "user.slice/s1/cgroup.subtree_control": ""}, "0::/user.slice/s1\n")
    h = C.detect(root, pc)
    assert h == C.Hierarchy(2, root / "user.slice" / "s1", root)


def test_v2_without_memory_in_our_cgroup_says_so(tmp_path):
    root, pc = _tree(tmp_path, {"cgroup.controllers": "cpu memory", "a/cgroup.controllers": "cpu"}, "0::/a\n")
    with pytest.raises(C.Unavailable, match="not available in .*a"):
        C.detect(root, pc)


def test_v2_without_the_memory_controller_and_no_v1_tree(tmp_path):
    root, pc = _tree(tmp_path, {"cgroup.controllers": "cpu io pids"}, "0::/\n")
    with pytest.raises(C.Unavailable, match="without the memory controller"):
        C.detect(root, pc)


def test_hybrid_tree_takes_v1_memory_when_unified_lacks_it(tmp_path):
    # what this kind of VM shows: v1 controllers, a cgroup2 'unified' mount with hugetlb only
    root, pc = _tree(tmp_path, {"unified/cgroup.controllers": "hugetlb",
                                "memory/memory.limit_in_bytes": "9223372036854771712",
                                "memory/box/abc/memory.limit_in_bytes": "9223372036854771712"},
                     "9:name=systemd:/\n4:memory:/box/abc\n1:cpu:/\n0::/\n")
    assert C.detect(root, pc) == C.Hierarchy(1, root / "memory" / "box" / "abc", root / "memory")


def test_hybrid_tree_prefers_unified_v2_with_memory(tmp_path):
    root, pc = _tree(tmp_path, {"unified/cgroup.controllers": "memory pids",
                                "memory/memory.limit_in_bytes": "1"}, "4:memory:/\n0::/\n")
    assert C.detect(root, pc).version == 2
    assert C.detect(root, pc).mount == root / "unified"


def test_v1_with_our_cgroup_missing_falls_back_to_the_top(tmp_path):
    root, pc = _tree(tmp_path, {"memory/memory.limit_in_bytes": "1"}, "3:cpu,memory:/gone\n")
    assert C.detect(root, pc).parent == root / "memory"


def test_no_cgroup_at_all(tmp_path):
    root, pc = _tree(tmp_path, {"README": ""}, "")
    with pytest.raises(C.Unavailable, match="no cgroup memory controller"):
        C.detect(root, pc)
    assert "no cgroup memory controller" in C.unavailable_reason(root, pc)


def test_not_root_is_a_reason(tmp_path, monkeypatch):
    root, pc = _tree(tmp_path, {"memory/memory.limit_in_bytes": "1"}, "4:memory:/\n")
    monkeypatch.setattr(C.os, "access", lambda *a: False)
    assert "not root (uid 1000)" in C.unavailable_reason(root, pc, euid=1000)
    assert C.unavailable_reason(root, pc, euid=0) is None


@pytest.mark.parametrize("text,want", [("1G", 2**30), ("1GiB", 2**30), ("512m", 512 * 2**20), ("1.5G", 3 * 2**29),
                                       ("300000000", 300_000_000), ("64K", 65536), (4096, 4096)])
def test_parse_size(text, want):
    assert C.parse_size(text) == want


@pytest.mark.parametrize("bad", ["", "1X", "-1G", "G", "0"])
def test_parse_size_refuses(bad):
    with pytest.raises(ValueError, match="memory size"):
        C.parse_size(bad)


# ------------------------------------------------------------------------------ clean-up, on a fake tree
@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A v1-like tree in tmp_path; removing a cgroup there deletes the plain files first (a real cgroupfs
    directory goes with one rmdir)."""
    parent = tmp_path / "memory" / "me"
    parent.mkdir(parents=True)
    removed = []

    def rmdir(p):
        removed.append(p)
        shutil.rmtree(p)

    monkeypatch.setattr(C, "_rmdir", rmdir)
    return C.Hierarchy(1, parent, tmp_path / "memory"), parent, removed


def _left(parent: Path) -> list[str]:
    return [p.name for p in parent.iterdir()]


def test_success_writes_the_limit_and_removes_the_cgroup(fake, monkeypatch):
    h, parent, removed = fake
    seen = {}
    real_popen = C.subprocess.Popen

    def spy(cmd, **kw):          # look inside the cgroup while the child runs
        path = Path(cmd[2]).parent        # [python, cgroup_launch.py, cgroup.procs, command…]
        seen["limit"] = (path / "memory.limit_in_bytes").read_text()
        return real_popen(cmd, **kw)

    monkeypatch.setattr(C.subprocess, "Popen", spy)
    r = C.run([sys.executable, "-c", "import os; print(os.getpid())"], "256M", hierarchy=h)
    monkeypatch.undo()
    assert r.returncode == 0 and not r.timed_out and r.limit == 256 * 2**20
    assert seen["limit"] == str(256 * 2**20)
    assert len(removed) == 1 and _left(parent) == []
    # the launcher wrote the command's own pid (exec keeps it) into cgroup.procs before it ran
    assert int(r.stdout.split()[0]) > 0


def test_failure_removes_the_cgroup(fake):
    h, parent, removed = fake
    r = C.run([sys.executable, "-c", "import sys; sys.exit(3)"], "64M", hierarchy=h)
    assert r.returncode == 3 and not r.timed_out
    assert len(removed) == 1 and _left(parent) == []


def test_timeout_kills_the_command_and_removes_the_cgroup(fake):
    h, parent, removed = fake
    code = "import os, time; print(os.getpid(), flush=True); time.sleep(60)"
    t0 = time.monotonic()
    r = C.run([sys.executable, "-c", code], "64M", timeout=1.0, hierarchy=h)
    assert r.timed_out and r.returncode is None and time.monotonic() - t0 < 30
    pid = int(r.stdout.split()[0])
    assert not C._alive(pid)
    assert len(removed) == 1 and _left(parent) == []


def test_an_exception_in_the_parent_removes_the_cgroup(fake, monkeypatch):
    h, parent, removed = fake

    def boom(self, timeout=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(C.subprocess.Popen, "communicate", boom)
    with pytest.raises(KeyboardInterrupt):
        C.run([sys.executable, "-c", "import time; time.sleep(60)"], "64M", hierarchy=h)
    assert len(removed) == 1 and _left(parent) == []


def test_a_missing_command_still_removes_the_cgroup(fake):
    h, parent, removed = fake
    r = C.run(["/nonexistent/kestrel-no-such-command"], "64M", hierarchy=h)
    assert r.returncode != 0 and "kestrel-no-such-command" in r.stderr
    assert _left(parent) == []


def test_v2_enables_memory_for_children_and_turns_swap_off(tmp_path, monkeypatch):
    parent = tmp_path / "me"
    parent.mkdir()
    (parent / "cgroup.controllers").write_text("cpu memory")
    (parent / "cgroup.subtree_control").write_text("cpu")
    monkeypatch.setattr(C, "_rmdir", shutil.rmtree)
    cg = C.MemoryCgroup(2**30, C.Hierarchy(2, parent, tmp_path))
    real_mkdir = Path.mkdir

    def mkdir_with_swap_file(self, *a, **kw):      # a real v2 cgroup comes with memory.swap.max
        real_mkdir(self, *a, **kw)
        (self / "memory.swap.max").write_text("max")

    monkeypatch.setattr(Path, "mkdir", mkdir_with_swap_file)
    with cg:
        assert (parent / "cgroup.subtree_control").read_text() == "+memory"
        assert (cg.path / "memory.max").read_text() == str(2**30)
        assert (cg.path / "memory.swap.max").read_text() == "0"
        inside = cg.path
    assert not inside.exists() and cg.path is None


def test_v2_refusal_to_enable_memory_is_a_reason(tmp_path, monkeypatch):
    parent = tmp_path / "me"
    parent.mkdir()
    (parent / "cgroup.controllers").write_text("memory")
    (parent / "cgroup.subtree_control").mkdir()          # writing to it fails
    with pytest.raises(C.Unavailable, match="cannot enable the memory controller"):
        C.MemoryCgroup(2**30, C.Hierarchy(2, parent, tmp_path)).create()
    assert sorted(_left(parent)) == ["cgroup.controllers", "cgroup.subtree_control"]


# ------------------------------------------------------------------------------ a real limited run
REASON = C.unavailable_reason()
real = pytest.mark.skipif(REASON is not None, reason=f"no memory cgroup here: {REASON}")


def _run_and_check_cleanup(argv, limit, timeout):
    """C.run in a real cgroup; the parent's folder holds exactly what it held before, on every outcome."""
    parent = C.detect().parent
    before = set(os.listdir(parent))
    r = C.run(argv, limit, timeout=timeout)
    assert set(os.listdir(parent)) == before
    return r


@real
def test_real_run_is_inside_and_within_the_limit():
    r = _run_and_check_cleanup(
        [sys.executable, "-c", "b = bytearray(64 << 20); print(open('/proc/self/cgroup').read())"], "512M", 120)
    assert r.returncode == 0, r.stderr
    assert r.cgroup.rsplit("/", 1)[-1] in r.stdout           # the child ran inside the new cgroup
    assert r.peak_bytes is None or r.peak_bytes >= 64 << 20


@real
def test_real_allocation_past_the_limit_is_killed_and_cleaned_up():
    r = _run_and_check_cleanup(
        [sys.executable, "-c", "b = bytearray(400 << 20); b[::4096] = b'x' * len(b[::4096])"], "100M", 120)
    assert r.returncode != 0
    assert r.oom_kills is None or r.oom_kills >= 1
    assert r.peak_bytes is None or r.peak_bytes <= 100 << 20


@real
def test_real_timeout_is_cleaned_up():
    assert _run_and_check_cleanup(["sleep", "60"], "64M", 0.5).timed_out
