"""Shared test settings: keep generated artefacts in a per-session cache, never in the repository."""
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require_built_book() -> Path:
    """The HTML book, built by `make book` before pytest runs in `make test`."""
    html = REPO / "_build" / "html"
    if not (html / "index.html").exists():
        if IN_CI:
            pytest.fail("_build/html is missing: `make test` builds the book before running pytest")
        pytest.skip("book not built: run `make book` first")
    return html


@pytest.fixture
def data(tmp_path, monkeypatch):
    """A private data folder: measurements go there, in this process and in every kernel it starts."""
    from kestrel_lab import measure

    d = tmp_path / "data"
    (d / "measurements").mkdir(parents=True)
    monkeypatch.setenv("KESTREL_DATA_DIR", str(d))
    monkeypatch.delenv(measure.STAGE_ENV, raising=False)
    return d
