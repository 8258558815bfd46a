"""Shared test settings: keep generated artefacts in a per-session cache, never in the repository.

Helpers that tests import by name live in ``tests/helpers/`` (a conftest is not a module to import).
The ``board`` marker is the pinned subset a board runs (``make board-test``): the files listed in
tests/board_subset.txt."""
import os
from pathlib import Path

import pytest

# Kernel names in tests follow the ISA list, whatever this host measures fastest (``kernels.choice``; its own
# tests set the variable themselves). The book build and the command line measure.
os.environ.setdefault("KESTREL_KERNEL_CHOICE", "isa")

# A developer's own student workspace (KESTREL_STUDENT, or the file `kestrel-lab student init` writes) never
# changes a test: every test, and every kernel or worker a test starts, runs with none. A test that wants
# one sets KESTREL_STUDENT itself (monkeypatch.setenv).
os.environ["KESTREL_STUDENT"] = "off"

BOARD_SUBSET = frozenset(
    name for line in (Path(__file__).parent / "board_subset.txt").read_text(encoding="utf-8").splitlines()
    if (name := line.split("#", 1)[0].strip()))


def pytest_collection_modifyitems(config, items):
    """Mark the board subset; skip the long fuzz run unless asked (``-m fuzz_long`` or
    ``KESTREL_FUZZ_LONG=1``)."""
    for item in items:
        if item.path.name in BOARD_SUBSET:
            item.add_marker(pytest.mark.board)
    if "fuzz_long" in (config.getoption("-m") or "") or os.environ.get("KESTREL_FUZZ_LONG") == "1":
        return
    skip = pytest.mark.skip(reason="long fuzz run: pass -m fuzz_long or set KESTREL_FUZZ_LONG=1")
    for item in items:
        if "fuzz_long" in item.keywords:
            item.add_marker(skip)


def pytest_ignore_collect(collection_path, config):
    """With ``-m board`` the other test modules are not even imported: they may need torch or Chromium."""
    if (config.getoption("markexpr", "") == "board" and collection_path.suffix == ".py"
            and collection_path.name.startswith("test_") and collection_path.name not in BOARD_SUBSET):
        return True
    return None


@pytest.fixture
def data(tmp_path, monkeypatch):
    """A private data folder: measurements go there, in this process and in every kernel it starts."""
    from kestrel_lab import measure

    d = tmp_path / "data"
    (d / "measurements").mkdir(parents=True)
    monkeypatch.setenv("KESTREL_DATA_DIR", str(d))
    monkeypatch.delenv(measure.STAGE_ENV, raising=False)
    return d

