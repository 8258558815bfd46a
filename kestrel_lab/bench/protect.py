"""What protecting a VQF file costs, measured in one run: encrypt, tag check, decrypt, and the engine's load.

``cost`` encrypts a plain file, checks the tag alone, decrypts it back (and checks the bytes are the
original's), then loads the engine from the plain file (mmap: weights stay page cache) and from the
encrypted one (the tag checked, the data decrypted into anonymous memory), each in a fresh process
(``python -m kestrel_lab.bench.protect load-child``) so one load's pages do not flatter the other.
Taught in day26_3.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from kestrel_lab.paths import child_env
from kestrel_lab.vqf.encrypt import decrypt_file, encrypt_file, files_equal, verify_file


def load_in_child(path, key_file) -> dict:
    """The engine loaded from ``path`` (with ``key_file`` for an encrypted file) in a fresh process:
    load seconds, the growth of its resident memory by kind, the argmax after a 3-token prefill."""
    cmd = [sys.executable, "-m", "kestrel_lab.bench.protect", "load-child", str(path), str(key_file or "")]
    res = subprocess.run(cmd, capture_output=True, text=True, check=True, env=child_env())
    return json.loads(res.stdout.strip().splitlines()[-1])


def cost(plain: str | os.PathLike, key_file: str | os.PathLike, workdir: str | os.PathLike) -> dict:
    """What protection costs, measured in one run on ``plain``: encrypt, tag check, decrypt (MB/s),
    and the engine's load time and memory from the plain file (mmap) vs the encrypted one (decrypted
    into anonymous memory), each in a fresh process. Writes the encrypted copy into ``workdir``.
    Taught in day26_3."""
    plain, workdir = Path(plain), Path(workdir)
    enc, dec = workdir / (plain.stem + ".enc.vqf"), workdir / (plain.stem + ".dec.vqf")
    r_enc = encrypt_file(plain, enc, key_file)
    tag_s = verify_file(enc, key_file)
    r_dec = decrypt_file(enc, dec, key_file)
    identical = files_equal(plain, dec)
    dec.unlink()
    load_in_child(plain, None)                   # warm-up: numba's cache and the page cache
    load_plain = load_in_child(plain, None)
    load_enc = load_in_child(enc, key_file)
    data = r_enc["data_bytes"]
    return {"file_bytes": plain.stat().st_size, "data_bytes": data,
            "encrypt_s": r_enc["seconds"], "encrypt_mb_s": data / r_enc["seconds"] / 1e6,
            "tag_s": tag_s, "tag_mb_s": enc.stat().st_size / tag_s / 1e6,
            "decrypt_s": r_dec["seconds"], "decrypt_mb_s": data / r_dec["seconds"] / 1e6,
            "decrypted_identical": identical, "same_output": load_plain["argmax"] == load_enc["argmax"],
            "load_plain": load_plain, "load_encrypted": load_enc, "encrypted_path": str(enc)}


def _load_child(path: str, key: str) -> None:
    from kestrel_lab.engine import Qwen3Engine
    from kestrel_lab.procfs import status_bytes

    keys = ("RssAnon", "RssFile", "VmRSS")
    r0 = status_bytes(*keys)
    t0 = time.perf_counter()
    eng = Qwen3Engine.from_vqf(path, max_context=64, key_file=key or None)
    load_s = time.perf_counter() - t0
    logits = eng.prefill([1, 2, 3])
    r1 = status_bytes(*keys)
    print(json.dumps({"load_s": load_s, "anon": r1["RssAnon"] - r0["RssAnon"], "file": r1["RssFile"] - r0["RssFile"],
                      "rss": r1["VmRSS"] - r0["VmRSS"], "argmax": int(logits.argmax()),
                      "released": eng.bytes_released, "copied": eng.memory_report()["copied_at_load_bytes"]}))


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] != "load-child":
        raise SystemExit("usage: python -m kestrel_lab.bench.protect load-child VQF KEY_FILE_OR_EMPTY")
    _load_child(sys.argv[2], sys.argv[3])
