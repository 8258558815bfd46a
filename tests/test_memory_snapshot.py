"""bench.memory_snapshot: the kernel's own accounting (smaps_rollup, status), checked by making memory
of each kind and watching the right field move — against statm (procfs.rss_bytes) and a second process."""
import subprocess
import sys

import numpy as np
import pytest

from kestrel_lab.procfs import rss_bytes
from kestrel_lab.procfs import memory_snapshot

MiB = 1 << 20
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def test_rss_agrees_with_statm():
    s = memory_snapshot()
    assert abs(s["Rss"] - rss_bytes()) < 8 * MiB
    assert s["RssAnon"] + s["RssFile"] + s["RssShmem"] == pytest.approx(s["Rss"], abs=8 * MiB)


def test_touched_anonymous_memory_is_counted_private_and_anonymous():
    before = memory_snapshot()
    a = np.ones(64 * MiB // 8)              # 64 MiB, every page written
    after = memory_snapshot()
    assert 56 * MiB < after["Anonymous"] - before["Anonymous"] < 96 * MiB
    assert 56 * MiB < after["Private_Dirty"] - before["Private_Dirty"] < 96 * MiB
    del a


def test_a_file_mapped_by_two_processes_is_shared_and_its_pss_halves(tmp_path):
    path = tmp_path / "blob.bin"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 32 * MiB, dtype=np.uint8).tobytes())
    m = np.memmap(path, mode="r")
    int(m[::4096].sum())                      # touch every page
    alone = memory_snapshot()
    child = subprocess.Popen([sys.executable, "-c", "import numpy as np, sys; m = np.memmap(sys.argv[1], mode='r'); "
                              "print(int(m[::4096].sum()), flush=True); sys.stdin.read()", str(path)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip()
        both = memory_snapshot()
    finally:
        child.stdin.close()
        child.wait()

    def shared(s):  # just-written pages may be dirty
        return s["Shared_Clean"] + s["Shared_Dirty"]

    assert shared(both) - shared(alone) > 24 * MiB
    # the file's 32 MiB now count half; the child's Python also shares library pages with us, so the
    # drop can be a little larger than 16 MiB, never much smaller
    assert 12 * MiB < alone["Pss"] - both["Pss"] < 32 * MiB
    del m


def test_an_unreadable_process_names_the_file():
    with pytest.raises(OSError, match="/proc/999999999/smaps_rollup"):
        memory_snapshot(999999999)
