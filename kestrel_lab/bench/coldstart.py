"""``python -m kestrel_lab.bench.coldstart VQF``: one cold start, timed from inside the fresh process.

Prints one JSON line of wall-clock stamps (``time.time``, so the parent can add the interpreter's own
start-up before this module ran): this module running, the engine imported, the file loaded, the first
token after an 8-token prefill, one decode step. ``bench.speed.cold_start`` starts it (with an empty
``NUMBA_CACHE_DIR`` to measure the first compile). It imports nothing of the package before its first
stamp but the two package ``__init__`` files ``-m`` must run.
"""
import json
import sys
import time

t_start = time.time()


def main(path: str) -> None:
    import numpy as np

    from kestrel_lab.engine import Qwen3Engine

    t_import = time.time()
    eng = Qwen3Engine.from_vqf(path, max_context=64)
    t_load = time.time()
    tok = int(np.argmax(eng.prefill(list(range(1, 9)))))
    t_first = time.time()
    eng.decode(tok)
    t_decode = time.time()
    print(json.dumps({"t_start": t_start, "t_import": t_import, "t_load": t_load, "t_first": t_first,
                      "t_decode": t_decode}))


if __name__ == "__main__":
    main(sys.argv[1])
