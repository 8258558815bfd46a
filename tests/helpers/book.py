"""The repository and the built book, for the tests that check the HTML book."""
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require_built_book() -> Path:
    """The HTML book, built by `make book` before pytest runs in `make test`."""
    html = REPO / "_build" / "html"
    if not (html / "index.html").exists():
        if IN_CI:
            pytest.fail("_build/html is missing: `make test` builds the book before running pytest")
        pytest.skip("book not built: run `make book` first")
    return html
