"""import-measurements / export-measurements: validation, refusals, all-or-nothing installs."""
from __future__ import annotations

import io
import json
import tarfile
import zipfile
from pathlib import Path

import pytest

from kestrel_lab import cli, measure
from kestrel_lab.book import archive, selection

BOARD = "rk3588-a76"



def doc_bytes(notebook: str, runner_label: str = BOARD, value=3.5) -> bytes:
    rec = measure.Recorder(notebook, runner_label, params={"quick": False})
    rec.record("tok_per_s", value, "tok/s", "decode speed")
    return (json.dumps(rec.document(), ensure_ascii=False, indent=1) + "\n").encode()


def make_tar(path: Path, files: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_import_installs_valid_files_and_ignores_others(data, tmp_path, capsys):
    arch = make_tar(tmp_path / "a.tar.gz", {
        f"measurements/{BOARD}/day16_3.json": doc_bytes("day16_3"),
        f"measurements/{BOARD}/day18_2.json": doc_bytes("day18_2"),
        "runs/day16_3.log": b"log text, not a measurement",
    })
    assert cli.main(["import-measurements", str(arch), "--runner", BOARD]) == 0
    out = capsys.readouterr().out
    assert "installed" in out and "day18_2.json" in out
    for nb in ("day16_3", "day18_2"):
        doc = measure.load_file(data / "measurements" / BOARD / f"{nb}.json")
        assert doc["provenance"]["runner"] == BOARD
    assert sorted(p.name for p in (data / "measurements" / BOARD).iterdir()) == ["day16_3.json", "day18_2.json"]


@pytest.mark.parametrize("bad, message", [
    (b'{"schema": "kestrel-lab/measurements/1", "notebook": ', "byte offset"),
    (None, "claims 'other-board'"),
    (b'{"schema": "kestrel-lab/measurements/1", "notebook": "day16_3", "source": "run", '
     b'"provenance": {"runner": "rk3588-a76", "date": "2026-11-30"}, "figures": []}', "'figures'"),
    (b"\xff\xfe not utf-8", "not UTF-8"),
])
def test_import_refuses_the_whole_archive(data, tmp_path, capsys, bad, message):
    old = data / "measurements" / BOARD / "day16_3.json"
    old.parent.mkdir(parents=True)
    old.write_bytes(doc_bytes("day16_3", value=1.0))
    before = old.read_bytes()
    bad = doc_bytes("day16_3", "other-board") if bad is None else bad
    arch = make_tar(tmp_path / "bad.tar.gz", {
        f"measurements/{BOARD}/day18_2.json": doc_bytes("day18_2"),  # good, but must not land
        "day16_3.json": bad,
    })
    assert cli.main(["import-measurements", str(arch), "--runner", BOARD]) == 1
    err = capsys.readouterr().err
    assert "refused, nothing imported" in err and message in err and "day16_3.json" in err
    assert old.read_bytes() == before
    assert not (data / "measurements" / BOARD / "day18_2.json").exists()
    assert sorted(p.name for p in old.parent.iterdir()) == ["day16_3.json"]  # no temp files


def test_import_refuses_wrong_folder_name_duplicates_and_empty(data, tmp_path):
    arch = make_tar(tmp_path / "a.tar.gz", {"measurements/other/day16_3.json": doc_bytes("day16_3")})
    with pytest.raises(measure.MeasurementError, match="stored under measurements/other/"):
        archive.import_measurements(arch, BOARD)
    arch = make_tar(tmp_path / "b.tar.gz", {"x/day16_3.json": doc_bytes("day16_3"),
                                            "y/day16_3.json": doc_bytes("day16_3")})
    with pytest.raises(measure.MeasurementError, match="a second file for day16_3"):
        archive.import_measurements(arch, BOARD)
    arch = make_tar(tmp_path / "c.tar.gz", {"day18_2.json": doc_bytes("day16_3")})
    with pytest.raises(measure.MeasurementError, match="field 'notebook'"):
        archive.import_measurements(arch, BOARD)
    arch = make_tar(tmp_path / "d.tar.gz", {"README": b"hello"})
    with pytest.raises(measure.MeasurementError, match="no measurement file"):
        archive.import_measurements(arch, BOARD)
    (tmp_path / "e.txt").write_text("not an archive")
    with pytest.raises(selection.RunnerError, match="not a folder, a tar archive"):
        archive.import_measurements(tmp_path / "e.txt", BOARD)
    assert not (data / "measurements" / BOARD).exists()


def test_zip_and_folder_archives_and_dry_run(data, tmp_path):
    z = tmp_path / "m.zip"
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr("day16_3.json", doc_bytes("day16_3"))
    targets = archive.import_measurements(z, BOARD, dry_run=True)
    assert [t.name for t in targets] == ["day16_3.json"] and not targets[0].exists()
    archive.import_measurements(z, BOARD)
    assert targets[0].exists()
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "day18_2.json").write_bytes(doc_bytes("day18_2"))
    assert [t.name for t in archive.import_measurements(folder, BOARD)] == ["day18_2.json"]


def test_export_then_import_round_trip(data, tmp_path, monkeypatch):
    src = data / "measurements" / BOARD
    src.mkdir(parents=True)
    for nb in ("day16_3", "day18_2"):
        (src / f"{nb}.json").write_bytes(doc_bytes(nb))
    arch = archive.export_measurements(BOARD, tmp_path / "out.tar.gz")
    with tarfile.open(arch) as tar:
        assert sorted(tar.getnames()) == [f"measurements/{BOARD}/day16_3.json", f"measurements/{BOARD}/day18_2.json"]
    other = tmp_path / "other-data"
    (other / "measurements").mkdir(parents=True)
    monkeypatch.setenv("KESTREL_DATA_DIR", str(other))
    archive.import_measurements(arch, BOARD)
    for nb in ("day16_3", "day18_2"):
        assert (other / "measurements" / BOARD / f"{nb}.json").read_bytes() == (src / f"{nb}.json").read_bytes()
    with pytest.raises(selection.RunnerError, match="no measurement files"):
        archive.export_measurements("nobody", tmp_path / "x.tar.gz")
