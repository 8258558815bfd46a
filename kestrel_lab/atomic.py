"""Write-then-rename helpers: a failed or interrupted write never leaves a half file behind."""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import IO, Iterator

from kestrel_lab.procfs import umask


def _umask() -> int:
    """The process umask, read without changing it where Linux reports it (setting and restoring it
    would race with other threads creating files)."""
    mask = umask()
    if mask is None:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def new_temp_file(path: Path) -> tuple[int, str]:
    """A temporary file beside ``path`` with the permissions an ordinary ``open(path, "w")`` gives.

    ``mkstemp`` creates files mode 0600, which would make every vocab.bin, model.vqf and measurement
    file private to its creator once renamed; ordinary tools honour the umask (usually 0644).
    """
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.fchmod(fd, 0o666 & ~_umask())
    return fd, tmp


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "wb") -> Iterator[IO]:
    """Open a temporary file beside ``path``; rename it over ``path`` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = new_temp_file(path)
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_json(path: str | os.PathLike, obj) -> Path:
    with atomic_write(path, "w") as fh:
        json.dump(obj, fh, ensure_ascii=False, indent=1, sort_keys=False)
        fh.write("\n")
    return Path(path)
