"""Move a runner's figures between machines: ``export-measurements`` packs ``data/measurements/<runner>/``
into a .tar.gz, ``import-measurements`` validates every file of an archive and installs all or none.

Taught in day28_2.
"""
from __future__ import annotations

import contextlib
import io
import os
import re
import tarfile
import zipfile
from pathlib import Path

from kestrel_lab import measure
from kestrel_lab.atomic import atomic_write
from kestrel_lab.book.selection import RunnerError
from kestrel_lab.measure import utc_now
from kestrel_lab.paths import measurements_dir

MAX_IMPORT_FILE = 8 * 2**20


def _archive_members(archive: Path) -> list[tuple[str, bytes | None, str | None]]:
    """(name, bytes or None, why-not) of every regular file in a directory, tar or zip archive."""
    archive = Path(archive)
    out: list[tuple[str, bytes | None, str | None]] = []
    if archive.is_dir():
        for p in sorted(archive.rglob("*")):
            if p.is_file():
                size = p.stat().st_size
                out.append((p.relative_to(archive).as_posix(),
                            p.read_bytes() if size <= MAX_IMPORT_FILE else None,
                            None if size <= MAX_IMPORT_FILE else f"{size} bytes is too large"))
        return out
    if not archive.exists():
        raise RunnerError(f"{archive}: no such file or folder")
    if tarfile.is_tarfile(archive):
        with tarfile.open(archive) as tar:
            for m in tar.getmembers():
                if m.isdir():
                    continue
                if not m.isfile():
                    out.append((m.name, None, "is a link or special file"))
                elif m.size > MAX_IMPORT_FILE:
                    out.append((m.name, None, f"{m.size} bytes is too large"))
                else:
                    out.append((m.name, tar.extractfile(m).read(), None))
        return out
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():
                if info.is_dir():
                    continue
                if info.file_size > MAX_IMPORT_FILE:
                    out.append((info.filename, None, f"{info.file_size} bytes is too large"))
                else:
                    out.append((info.filename, zf.read(info), None))
        return out
    raise RunnerError(f"{archive}: not a folder, a tar archive (.tar, .tar.gz) or a zip archive")


def import_measurements(archive: Path, runner: str, root: Path | None = None, *,
                        dry_run: bool = False) -> list[Path]:
    """Validate every ``dayDD_P.json`` in ``archive`` and install them under ``<root>/<runner>/``.

    All or nothing: a file that does not parse, fails the schema, claims another runner or another
    notebook, or comes twice refuses the whole archive, and nothing is written. Files that are not
    measurement files (logs, executed notebooks) are ignored. Taught in day28_2.
    """
    measure.check_runner(runner)
    root = root or measurements_dir()
    problems: list[str] = []
    accepted: dict[str, tuple[str, bytes]] = {}
    for name, data, why in _archive_members(archive):
        base = name.rsplit("/", 1)[-1]
        if not re.fullmatch(r"day\d\d_[123]\.json", base):
            continue
        where = f"{archive}:{name}"
        if data is None:
            problems.append(f"{where}: {why}")
            continue
        parts = [p for p in name.split("/") if p not in ("", ".")]
        if ".." in parts or name.startswith("/"):
            problems.append(f"{where}: a path that leaves the archive")
            continue
        try:
            doc = measure.parse_bytes(data, where)
        except measure.MeasurementError as e:
            problems.append(str(e))
            continue
        claimed = doc["provenance"]["runner"]
        if claimed != runner:
            problems.append(f"{where}: field 'provenance.runner' claims {claimed!r}, not {runner!r}")
            continue
        if len(parts) >= 2 and parts[-2] != runner and measure.RUNNER_NAME.match(parts[-2]) and (
                len(parts) >= 3 and parts[-3] == "measurements"):
            problems.append(f"{where}: stored under measurements/{parts[-2]}/, not measurements/{runner}/")
            continue
        if doc["notebook"] != base[:-5]:
            problems.append(f"{where}: field 'notebook' is {doc['notebook']!r} but the file is {base}")
            continue
        if doc["source"] == "article" and not runner.startswith("article-"):
            problems.append(f"{where}: field 'source' is 'article', only article-* runners hold article figures")
            continue
        if doc["notebook"] in accepted:
            problems.append(f"{where}: a second file for {doc['notebook']} "
                            f"(first: {accepted[doc['notebook']][0]})")
            continue
        accepted[doc["notebook"]] = (name, data)
    if problems:
        raise measure.MeasurementError(f"{archive}: refused, nothing imported ({len(problems)} problem"
                                       f"{'s' if len(problems) > 1 else ''}):\n  " + "\n  ".join(problems))
    if not accepted:
        raise measure.MeasurementError(f"{archive}: refused: no measurement file (dayDD_P.json) in it")
    targets = [root / runner / f"{nb}.json" for nb in sorted(accepted)]
    if dry_run:
        return targets
    # Write every file beside its target first, then rename them all: an I/O error while writing
    # leaves the runner's folder exactly as it was.
    tmp_files = []
    try:
        for nb, target in zip(sorted(accepted), targets):
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.parent / f".{target.name}.import.tmp"
            with open(tmp, "wb") as fh:
                fh.write(accepted[nb][1])
                fh.flush()
                os.fsync(fh.fileno())
            tmp_files.append((tmp, target))
    except BaseException:
        for tmp, _ in tmp_files:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        raise
    for tmp, target in tmp_files:
        os.replace(tmp, target)
    return targets


def export_measurements(runner: str, output: Path | None = None, root: Path | None = None) -> Path:
    """Pack ``<root>/<runner>/*.json`` (validated) into a .tar.gz for ``import-measurements``.

    Taught in day28_2.
    """
    measure.check_runner(runner)
    root = root or measurements_dir()
    files = sorted((root / runner).glob("day*_*.json"))
    if not files:
        raise RunnerError(f"{root / runner}: no measurement files for runner {runner!r}")
    for f in files:
        measure.load_file(f)
    output = Path(output or f"kestrel-measurements-{runner}-{utc_now(compact=True)}.tar.gz")
    with atomic_write(output, "wb") as fh:
        with tarfile.open(fileobj=fh, mode="w:gz") as tar:
            for f in files:
                data = f.read_bytes()
                info = tarfile.TarInfo(f"measurements/{runner}/{f.name}")
                info.size, info.mtime, info.mode = len(data), int(f.stat().st_mtime), 0o644
                tar.addfile(info, io.BytesIO(data))
    return output
