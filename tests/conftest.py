"""Shared test settings: keep generated artefacts in a per-session cache, never in the repository.

Helpers that tests import by name live in ``tests/helpers/`` (a conftest is not a module to import)."""
import pytest


@pytest.fixture
def data(tmp_path, monkeypatch):
    """A private data folder: measurements go there, in this process and in every kernel it starts."""
    from kestrel_lab import measure

    d = tmp_path / "data"
    (d / "measurements").mkdir(parents=True)
    monkeypatch.setenv("KESTREL_DATA_DIR", str(d))
    monkeypatch.delenv(measure.STAGE_ENV, raising=False)
    return d
