"""kestrel-lab rerun refuses to publish figures from a dirty checkout unless --allow-dirty, and records
the flag in the provenance: a figure measured at '<commit>+dirty' names no code anyone can check out."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from kestrel_lab import cli, machine, measure
from kestrel_lab.book import executor, selection, rerun as book_rerun

FIXTURES = Path(__file__).parent / "fixtures"
RUNNER = "test-runner"
DIRTY = ["kestrel_lab/engine/model.py", "notebooks/day01/day01_3_beta.ipynb"]


def git(repo: Path, *args) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          check=True, capture_output=True, text=True).stdout


def rerun(capsys, tmp_path, *args) -> tuple[int, str, str]:
    code = cli.main(["rerun", "--runner", RUNNER, "--root", str(FIXTURES),
                     "--runs-root", str(tmp_path / "runs"), "--notebooks", "day01_3", "--timeout", "120", *args])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def test_dirty_files_of_a_fixture_checkout(tmp_path):
    repo = tmp_path / "repo"
    for rel in ("kestrel_lab/a.py", "notebooks/day01/day01_1_x.ipynb", "data/measurements/r/day01_1.json",
                "README.md"):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text("committed\n")
    git(tmp_path, "init", "-q", str(repo))
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "clean")
    assert machine.dirty_files(repo) == []
    # what a re-run writes, and untracked files outside the code, do not make the tree dirty
    (repo / "data/measurements/r/day01_1.json").write_text("re-measured\n")
    (repo / "data/measurements/r/day01_2.json").write_text("new\n")
    (repo / "runs").mkdir()
    (repo / "runs/log.txt").write_text("log\n")
    (repo / "notes.txt").write_text("scratch\n")
    assert machine.dirty_files(repo) == []
    # a changed tracked file, and an untracked module a notebook would import, do
    (repo / "README.md").write_text("edited\n")
    (repo / "kestrel_lab/new.py").write_text("x = 1\n")
    assert machine.dirty_files(repo) == ["README.md", "kestrel_lab/new.py"]
    assert machine.dirty_files(tmp_path / "not-a-repo-at-all") is None


def test_rerun_refuses_a_dirty_tree_and_says_how_to_proceed(data, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(machine, "dirty_files", lambda repo=None: list(DIRTY))
    code, out, err = rerun(capsys, tmp_path)
    assert code == 1
    assert "refused" in err and "uncommitted changes in 2 files" in err
    assert all(f in err for f in DIRTY)  # which files
    assert "Commit the changes" in err and "--allow-dirty" in err  # how to proceed
    assert not (tmp_path / "runs").exists()  # nothing ran
    assert not (data / "measurements" / RUNNER).exists()
    with pytest.raises(selection.RunnerError, match="allow-dirty"):
        book_rerun.rerun(RUNNER, selection.select_notebooks(FIXTURES, ids=["day01_3"]), runs_root=tmp_path / "r")


def test_allow_dirty_publishes_and_is_recorded(data, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(machine, "dirty_files", lambda repo=None: list(DIRTY))
    code, out, err = rerun(capsys, tmp_path, "--allow-dirty")
    assert code == 0, out + err
    assert "--allow-dirty: 2 uncommitted file(s)" in out
    doc = measure.load_file(data / "measurements" / RUNNER / "day01_3.json")
    assert doc["provenance"]["allow_dirty"] is True
    assert doc["provenance"]["rerun"]["allow_dirty"] is True
    state = json.loads(next((tmp_path / "runs" / RUNNER).glob("*/run.json")).read_text())
    assert state["allow_dirty"] is True


def test_a_clean_run_does_not_claim_allow_dirty(data, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(machine, "dirty_files", lambda repo=None: [])
    code, out, err = rerun(capsys, tmp_path)
    assert code == 0, out + err
    doc = measure.load_file(data / "measurements" / RUNNER / "day01_3.json")
    assert "allow_dirty" not in doc["provenance"] and "allow_dirty" not in doc["provenance"]["rerun"]


def test_a_tree_dirtied_during_the_run_is_not_published(data, tmp_path, capsys, monkeypatch):
    calls = []

    def dirty_after_start(repo=None):
        calls.append(1)
        return [] if len(calls) == 1 else ["kestrel_lab/edited_meanwhile.py"]

    monkeypatch.setattr(machine, "dirty_files", dirty_after_start)
    code, out, err = rerun(capsys, tmp_path)
    assert code == 1
    assert "not published" in out and "kestrel_lab/edited_meanwhile.py" in out
    assert not (data / "measurements" / RUNNER / "day01_3.json").exists()


def test_publish_records_allow_dirty(data, tmp_path):
    rec = measure.Recorder("day01_1", RUNNER)
    rec.record("x", 1, "items", "x")
    staged = rec.save(tmp_path / "stage")
    path = executor.publish(staged, RUNNER, "day01_1", allow_dirty=True)
    assert measure.load_file(path)["provenance"]["allow_dirty"] is True
    path = executor.publish(staged, RUNNER, "day01_1")
    assert "allow_dirty" not in measure.load_file(path)["provenance"]
