"""``kestrel-lab student check``: every piece the student wrote, run where it matters and compared with the package.

Each check first compares the piece with the package's own function on real inputs (the poem model's
weights, the Qwen vocabulary, the tiny VL model's pictures), then runs the package with the piece swapped
in (``kestrel_lab.seam``) on something whole — vocab.bin, the poem VQF, the golden token ids, a picture
— and compares that too. A wrong piece fails with a message that says where it first goes wrong: the byte
offset of vocab.bin and its token, the tensor and offset of a VQF file, the layer, position and max |Δ|
where the hidden state leaves the package's, the first differing token id. A slow piece passes and says
how slow (seconds per token, MB/s); speed is never a failure.

Engine pieces are each checked alone (the rest of the engine the package's), so a failure points at one
piece; ``engine`` then runs every written engine piece together. The student page (book/student.md) explains its table.
"""
from __future__ import annotations

import struct
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from kestrel_lab import golden, models, seam
from kestrel_lab import quant as Q

NOT_STARTED, PASSES, FAILS = "not started", "passes", "fails"
GOLDEN_STEPS = 8          # teacher-forced steps of the first golden case a check replays (``--full``: all)
TRACE_TOL = 1e-3          # relative: where the hidden state first differs by more, the location is reported


class PieceFailure(AssertionError):
    """A piece computed something else than the package; the message says where."""


@dataclass
class Row:
    """One line of the progress table."""

    key: str
    lesson: str
    status: str
    seconds: float = 0.0
    detail: str = ""


# --------------------------------------------------------------------------- shared inputs
_CACHE: dict = {}


def _memo(name: str, make: Callable):
    """The package's answer ``name``, made once, always with the package's own code (never a piece's)."""
    if name not in _CACHE:
        with seam.package_only():
            _CACHE[name] = make()
    return _CACHE[name]


def poem_vqf(quant: str) -> Path:
    return _memo(f"poem-{quant}", lambda: models.vqf("qwen3-tiny-poem", quant=quant))


def poem_weights() -> dict[str, np.ndarray]:
    """A few real float32 matrices of the poem model (its first layer's attention and FFN)."""
    def make():
        from kestrel_lab.vqf.reader import open_vqf

        f = open_vqf(poem_vqf("f32"))
        out = {n: np.array(f.tensors[n].dequantize()[:256]) for n in ("q4_q", "q4_k", "q4_gate", "q4_down")}
        f.close()
        return out
    return _memo("poem-weights", make)


def _first_diff(a: bytes, b: bytes) -> int | None:
    n = min(len(a), len(b))
    x, y = np.frombuffer(a[:n], np.uint8), np.frombuffer(b[:n], np.uint8)
    d = np.flatnonzero(x != y)
    return int(d[0]) if d.size else (None if len(a) == len(b) else n)


def _close(got, want, what: str, rtol: float = 1e-5, atol: float = 1e-6) -> float:
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        raise PieceFailure(f"{what}: shape {got.shape}, expected {want.shape}")
    err = np.abs(got.astype(np.float64) - want.astype(np.float64))
    bad = err > atol + rtol * np.abs(want.astype(np.float64))
    if bad.any():
        i = np.unravel_index(int(np.argmax(bad)), bad.shape)
        raise PieceFailure(f"{what}: first differs at index {tuple(int(v) for v in i)}: got {float(got[i]):.6g}, "
                           f"expected {float(want[i]):.6g} (max |Δ| {err.max():.3g})")
    return float(err.max()) if err.size else 0.0


# --------------------------------------------------------------------------- the engine on golden tokens
def _engine(model: str, quant: str, pieces: dict):
    """An engine on an embedded model's VQF, built with ``pieces`` swapped in (it keeps them)."""
    with seam.swapped(pieces):
        return golden._open(model, quant)


def locate(mine, ours, ids: list[int]) -> str:
    """Where the student's engine first leaves the package's on ``ids``: the layer and position where a hidden
    state differs by more than ``TRACE_TOL`` of its scale, with the max |Δ|; else where the logits differ."""
    runs = []
    for eng in (mine, ours):
        seen: dict[int, np.ndarray] = {}
        eng.trace = lambda layer, h, seen=seen: seen.__setitem__(layer, np.array(h))
        try:
            eng.reset()
            logits = eng.forward_all(np.asarray(ids))
        finally:
            eng.trace = None
        runs.append((seen, logits))
    (a, la), (b, lb) = runs
    for layer in sorted(b):
        d = np.abs(a[layer] - b[layer])
        scale = float(np.abs(b[layer]).max()) or 1.0
        rows = d.max(axis=1)
        if rows.max() > TRACE_TOL * scale:
            pos = int(np.argmax(rows > TRACE_TOL * scale))
            return (f"the hidden state first leaves the package's after layer {layer}, at position {pos} "
                    f"(token {ids[pos]}): max |Δ| {rows[pos]:.3g} there against a scale of {scale:.3g}")
    d = np.abs(la - lb).max(axis=1)
    scale = float(np.abs(lb).max()) or 1.0
    pos = int(np.argmax(d > TRACE_TOL * scale)) if d.max() > TRACE_TOL * scale else int(np.argmax(d))
    return (f"every layer agrees within {TRACE_TOL:g} of its scale; the logits first differ at position {pos} "
            f"(token {ids[pos]}): max |Δ| {d[pos]:.3g}")


def golden_run(pieces: dict, model: str = "qwen3-tiny-poem", quant: str = "f32", full: bool = False) -> str:
    """Replay the golden tokens of ``model`` at ``quant`` (teacher forcing) on an engine with ``pieces``; a token
    that differs where the golden margin is clear (``golden.MARGIN_THRESHOLD["q4_0"]``: a piece is another
    float path, like another kernel) fails, located by ``locate``."""
    doc = golden.load(golden.golden_path(model))
    cases = doc["cases"] if full else doc["cases"][:1]
    mine = _engine(model, quant, pieces)
    threshold = golden.MARGIN_THRESHOLD["q4_0"]
    t0, n = time.perf_counter(), 0
    for ci, case in enumerate(cases):
        g = case["golden"][quant]
        steps = len(g["ids"]) if full else min(GOLDEN_STEPS, len(g["ids"]))
        logits = golden._prefill(mine, case)
        for step in range(steps):
            want, margin, got = g["ids"][step], g["margins"][step], int(np.argmax(logits))
            n += 1
            if got != want and margin > threshold:
                where = ("" if "seed" in case else
                         "; " + locate(mine, golden._open(model, quant), list(case["prompt_ids"]) + g["ids"][:step]))
                raise PieceFailure(f"golden {model} ({quant}), case {ci}, step {step}: token {got} where the golden "
                                   f"file has {want} (its margin {margin:.2f}){where}")
            if step + 1 < steps:
                logits = mine.decode(want)
    return f"{n} golden tokens of {model} ({quant}) equal, {(time.perf_counter() - t0) / n:.2f} s per token"


# --------------------------------------------------------------------------- one check per piece
def check_quantize_q8_0(fn) -> str:
    rows = [np.zeros(64, np.float32), np.array([127, 0.5, 1.5, -2.5, 3.5, -0.5] + [0] * 26, np.float32)]
    rows += [w.reshape(-1)[:4096] for w in poem_weights().values()]
    for i, x in enumerate(rows):
        want = bytes(Q.quantize_q8_0(x[None, :])[0])
        got = bytes(fn(x.copy()))
        at = _first_diff(got, want)
        if at is not None:
            if at >= len(want):
                raise PieceFailure(f"input {i}: {len(got)} bytes, expected {len(want)}")
            part = "the fp16 scale" if at % 34 < 2 else f"q[{at % 34 - 2}]"
            raise PieceFailure(f"input {i}: byte {at} differs (block {at // 34}, {part}): got "
                               f"{got[at:at + 1].hex()}, expected {want[at:at + 1].hex()}")
    with tempfile.TemporaryDirectory(prefix="kestrel-check-") as tmp:
        return "the poem's blocks equal quant.quantize_q8_0; " + _convert_equal(fn, "quant.quantize_q8_0", "q8_0", tmp)


def _convert_equal(fn, key: str, quant: str, tmp: str) -> str:
    """The poem model converted at ``quant`` with the piece swapped in equals the package's file, byte for byte."""
    from kestrel_lab.convert import convert
    from kestrel_lab.paths import tiny_poem_dir
    from kestrel_lab.vqf import format as F
    from kestrel_lab.vqf.reader import open_vqf

    ours = Path(tmp) / "ours.vqf"
    convert(tiny_poem_dir(), ours, quant, hash_source=False)
    mine = Path(tmp) / "mine.vqf"
    t0 = time.perf_counter()
    with seam.swapped({key: fn}):
        convert(tiny_poem_dir(), mine, quant, hash_source=False)
    secs = time.perf_counter() - t0
    a, b = bytearray(mine.read_bytes()), ours.read_bytes()
    created = F.HEADER_FIELD["created"]        # the conversion time (Unix seconds): the two runs may straddle a second
    a[created.offset:created.offset + created.size] = b[created.offset:created.offset + created.size]
    at = _first_diff(bytes(a), b)
    if at is None:
        return (f"the poem VQF written with it ({quant}, {len(a):,} bytes) is the package's, byte for byte but the "
                f"conversion time ({secs:.1f} s)")
    f = open_vqf(ours)
    hit = next((e for e in f.entries if e.offset <= at < e.offset + e.nbytes), None)
    f.close()
    where = f"tensor {hit.name!r}, byte {at - hit.offset} of it" if hit else "the header or directory"
    raise PieceFailure(f"the poem VQF written with it ({quant}) first differs at byte {at:,}: {where}")


def check_dequantize_q4_0(fn) -> str:
    from kestrel_lab.vqf.reader import open_vqf

    f = open_vqf(poem_vqf("q4_0"))
    try:
        n = 0
        for t in f.entries:
            if t.qtype != Q.Q4_0.id:
                continue
            rows = min(t.rows, 64)
            raw = np.asarray(t.data[:rows * t.nbytes // t.rows])
            want = Q.dequantize_q4_0(raw, rows, t.cols).reshape(-1)
            got = np.asarray(fn(raw.tobytes(), rows * t.cols), np.float32).reshape(-1)
            if got.shape != want.shape:
                raise PieceFailure(f"tensor {t.name!r}: {got.size} values, expected {want.size}")
            bad = np.flatnonzero(got != want)
            if bad.size:
                i = int(bad[0])
                raise PieceFailure(f"tensor {t.name!r}, row {i // t.cols}, block {i % t.cols // 32}, value "
                                   f"{i % 32}: got {float(got[i]):.6g}, expected {float(want[i]):.6g}")
            n += 1
    finally:
        f.close()
    return f"the first 64 rows of the poem's {n} Q4_0 tensors equal quant.dequantize_q4_0, bit for bit"


def check_quantize_act(fn) -> str:
    from kestrel_lab.kernels import ops as K

    rng = np.random.default_rng(0)
    ties = np.zeros(32, np.float32)
    ties[:6] = [127, 0.5, 1.5, -2.5, 3.5, -0.5]
    for v in (ties, np.zeros(64, np.float32), rng.standard_normal(1024, dtype=np.float32),
              (rng.standard_normal(256) * 1e-6).astype(np.float32)):
        q, d = fn(v.copy())
        xq, xd = np.empty((1, v.size), np.int8), np.empty((1, v.size // 32), np.float32)
        K.quantize_act(v[None, :], xq, xd)
        q = np.asarray(q).reshape(-1)
        bad = np.flatnonzero(q != xq[0]) if q.size == xq.size else [0]
        if len(bad):
            raise PieceFailure(f"a {v.size}-value vector: q[{bad[0]}] is {q[bad[0]] if q.size == xq.size else q.size}, "
                               f"expected {xq[0, bad[0]]}")
        _close(np.asarray(d).reshape(-1), xd[0], f"a {v.size}-value vector's scales", rtol=0, atol=0)
    return "equals kernels.ops.quantize_act bit for bit; " + golden_run({"kernels.quantize_act": fn}, quant="q4_0")


def check_matvec_q4_0(fn) -> str:
    from kestrel_lab.kernels import ops as K

    q4 = Q.quantize_q4_0(poem_weights()["q4_gate"])
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, q4.shape[1] // 18 * 32), dtype=np.float32)
    xq, xd = np.empty(x.shape, np.int8), np.empty((1, x.shape[1] // 32), np.float32)
    K.quantize_act(x, xq, xd)
    want = np.empty((1, q4.shape[0]), np.float32)
    K.matvec_q4_0(q4, xq, xd, K.F16_TO_F32, want[0], 1)
    _close(fn(q4, xq[0], xd[0]), want[0], "W·x of a poem FFN matrix", rtol=1e-5, atol=1e-5 * np.abs(want).max())
    return "equals kernels.ops.matvec_q4_0; " + golden_run({"kernels.matvec_q4_0": fn}, quant="q4_0")


def _layer_check(key: str, fn, direct: Callable[[Callable], str]) -> str:
    return direct(fn) + "; " + golden_run({key: fn})


def _direct_rmsnorm(fn) -> str:
    from kestrel_lab.kernels import ops as K

    rng = np.random.default_rng(2)
    x = rng.standard_normal((5, 256), dtype=np.float32) * 3
    x[1] = 0.0                                             # a zero row must give zeros, not NaN
    w = rng.standard_normal(256, dtype=np.float32)
    want = np.empty_like(x)
    K.rmsnorm(x, w, np.float32(1e-6), want)
    d = _close(fn(x.copy(), w, 1e-6), want, "RMSNorm of 5 rows", rtol=1e-5, atol=1e-5)
    return f"equals kernels.ops.rmsnorm within {d:.1e}"


def _direct_rmsnorm_heads(fn) -> str:
    from kestrel_lab.kernels import ops as K

    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 3, 64), dtype=np.float32)
    w = rng.standard_normal(64, dtype=np.float32)
    want = x.copy()
    K.rmsnorm_heads(want, w, np.float32(1e-6))
    before = x.copy()
    d = _close(fn(x, w, 1e-6), want, "q/k norm of 4 tokens × 3 heads", rtol=1e-5, atol=1e-5)
    if not np.array_equal(x, before):
        raise PieceFailure("it changed its input x in place: return a new array")
    return f"equals kernels.ops.rmsnorm_heads within {d:.1e}"


def _direct_rope_cos_sin(fn) -> str:
    from kestrel_lab.kernels import rope

    pos = np.arange(4096)
    c, s = fn(pos, 64, 1e6)
    pc, ps = rope.rope_cos_sin(pos, 64, 1e6)
    _close(np.asarray(c)[:64], pc[:64], "cos at positions 0–63", rtol=0, atol=1e-5)
    d = max(_close(c, pc, "cos", rtol=0, atol=1e-3), _close(s, ps, "sin", rtol=0, atol=1e-3))
    return f"4,096 positions equal kernels.rope.rope_cos_sin within {d:.1e}"


def _direct_apply_rope(fn) -> str:
    from kestrel_lab.kernels import rope

    rng = np.random.default_rng(4)
    x = rng.standard_normal((6, 2, 64), dtype=np.float32)
    c, s = rope.rope_cos_sin(np.arange(10, 16), 64, 1e6)
    want = x.copy()
    rope.apply_rope(want, c, s)
    before = x.copy()
    d = _close(fn(x, c, s), want, "q rotated at positions 10–15", rtol=0, atol=1e-5)
    if not np.array_equal(x, before):
        raise PieceFailure("it changed its input x in place: return a new array")
    return f"equals kernels.rope.apply_rope within {d:.1e}"


def _direct_attention(fn) -> str:
    from kestrel_lab.kernels.attention import attend_reference

    rng = np.random.default_rng(5)
    n, T, H, KVH, D = 12, 4, 4, 2, 32
    q = rng.standard_normal((T, H, D)).astype(np.float32)
    k = rng.standard_normal((KVH, n, D)).astype(np.float32)
    v = rng.standard_normal((KVH, n, D)).astype(np.float32)
    d = _close(fn(q, k, v), attend_reference(q, k, v, n - T), f"{T} queries over {n} cached positions",
               rtol=1e-4, atol=1e-5)
    _close(fn(q[-1:], k, v), attend_reference(q[-1:], k, v, n - 1), "one decode step", rtol=1e-4, atol=1e-5)
    return f"equals kernels.attention.attend_reference within {d:.1e} (prefill and decode)"


def check_draw(fn) -> str:
    from kestrel_lab.engine.sample import Sampler

    logits = np.random.default_rng(6).standard_normal(1000).astype(np.float32) * 3
    n = 0
    for T, k, p in ((1.0, 0, 1.0), (1.5, 40, 0.9), (0.7, 5, 0.95)):
        for s in range(10):
            want = Sampler(temperature=T, top_k=k, top_p=p, seed=s)(logits)
            got = int(fn(logits.copy(), T, k, p, np.random.default_rng(s).random()))
            if got != want:
                raise PieceFailure(f"T={T}, top_k={k}, top_p={p}, u from seed {s}: drew {got}, the package's "
                                   f"Sampler {want}")
            n += 1
    if int(fn(logits.copy(), 0.0, 0, 1.0, 0.5)) != int(np.argmax(logits)):
        raise PieceFailure("T = 0 must be greedy: the argmax")
    return f"{n} draws equal the seeded Sampler's; T = 0 is the argmax"


def check_render(fn) -> str:
    from kestrel_lab.engine import chat
    from kestrel_lab.vocab import Tokenizer

    sys_user = [{"role": "system", "content": "你是诗人。"}, {"role": "user", "content": "床前明月光，"}]
    turns = sys_user + [{"role": "assistant", "content": "<think>\n下一句。\n</think>\n\n疑是地上霜。"},
                        {"role": "user", "content": "再下一句？"}]
    convs = [(sys_user, True), (turns, True), (turns[:3], False), ([{"role": "user", "content": "Hi"}], True)]
    for m, gen in convs:
        want = chat.render(m, add_generation_prompt=gen)
        got = fn([dict(x) for x in m], add_generation_prompt=gen)
        if got != want:
            at = _first_diff(got.encode(), want.encode())
            raise PieceFailure(f"{len(m)} messages (add_generation_prompt={gen}): the text differs at byte {at}: "
                               f"…{got.encode()[max(0, at - 20):at + 20]!r} where chat.render has "
                               f"…{want.encode()[max(0, at - 20):at + 20]!r}")
    tok = Tokenizer.default()
    with seam.swapped({"chat.render": fn}):
        ids = chat.encode_messages(tok, turns)
    if ids != chat.encode_messages(tok, turns):
        raise PieceFailure("the ids the engine encodes with it differ from the package's")
    return f"{len(convs)} conversations equal chat.render; the engine's prompt ids through it are the same"


def check_parse_header(fn) -> str:
    from kestrel_lab.vqf.reader import open_vqf, read_header

    files = [poem_vqf("q4_0"), poem_vqf("f32"), golden.model_vqf("qwen3-tiny-vl", "q4_0")]
    for path in files:
        with open(path, "rb") as fh:
            raw = fh.read(448)
        want = read_header(path)
        got = fn(raw)
        for key in ("version", "flags", "n_tensors", "data_offset", "file_len"):
            if not isinstance(got, dict) or got.get(key) != want[key]:
                raise PieceFailure(f"{path.name}: field {key} is {got.get(key) if isinstance(got, dict) else got!r}, "
                                   f"the header holds {want[key]!r}")
    with seam.swapped({"vqf.parse_header": fn}):
        f = open_vqf(files[0])
        n = len(f.entries)
        f.close()
    return (f"the headers of {len(files)} files equal the reader's; the reader opens the poem file through it "
            f"({n} tensors)")


def check_parse_directory(fn) -> str:
    from kestrel_lab.vqf import format as F
    from kestrel_lab.vqf.reader import open_vqf

    files = [poem_vqf("q4_0"), golden.model_vqf("qwen3-tiny-vl", "q4_0")]
    for path in files:
        f = open_vqf(path)
        want = [(e.name, e.qtype, e.rows, e.cols, e.offset, e.nbytes) for e in f.entries]
        f.close()
        with open(path, "rb") as fh:
            fh.seek(F.DIR_OFFSET)
            raw = fh.read(F.ENTRY_SIZE * len(want))
        got = [tuple(x) for x in fn(raw, len(want))]
        if len(got) != len(want):
            raise PieceFailure(f"{path.name}: {len(got)} entries, the directory holds {len(want)}")
        for i, (g, w) in enumerate(zip(got, want)):
            if g != w:
                names = ("name", "qtype", "rows", "cols", "offset", "nbytes")
                field = next(n for n, a, b in zip(names, g, w) if a != b)
                raise PieceFailure(f"{path.name}: entry {i} ({w[0]}) field {field} is {g} — expected {w} "
                                   f"(the entry starts at byte {F.DIR_OFFSET + F.ENTRY_SIZE * i})")
    with seam.swapped({"vqf.parse_directory": fn}):
        f = open_vqf(files[0])
        f.close()
    return (f"the directories of {len(files)} files equal the reader's, entry for entry; the reader opens the "
            f"poem through it")


def check_chain_offsets(fn) -> str:
    from kestrel_lab.vqf.planner import chain, plan_file
    from kestrel_lab.paths import tiny_poem_dir

    specs = [e.spec for e in plan_file(tiny_poem_dir() / "config.json", "q4_0").entries]
    entries, d0, end = chain(specs)
    offsets, fl = fn([s.nbytes for s in specs], d0)
    offsets = [int(o) for o in offsets]
    for i, (got, e) in enumerate(zip(offsets, entries)):
        if got != e.offset:
            raise PieceFailure(f"tensor {i} ({e.spec.name}, {e.spec.nbytes:,} bytes): offset {got:,}, expected "
                               f"{e.offset:,}" + (" (64-byte aligned after the previous tensor's end)" if i else
                                                   f" (data_offset {d0:,})"))
    if len(offsets) != len(entries) or int(fl) != end:
        raise PieceFailure(f"{len(offsets)} offsets and file_len {fl}, expected {len(entries)} and {end:,}")
    with tempfile.TemporaryDirectory(prefix="kestrel-check-") as tmp:
        return "the poem plan's offsets are the planner's; " + _convert_equal(fn, "vqf.chain_offsets", "q4_0", tmp)


def _vocab_bytes() -> tuple[Path, bytes]:
    def make():
        from kestrel_lab.vocab.compiler import compile_vocab
        from kestrel_lab.vocab.tokenizer_json import default_tokenizer_json

        tmp = Path(tempfile.mkdtemp(prefix="kestrel-vocab-"))
        compile_vocab(None, tmp / "vocab.bin")
        return default_tokenizer_json(), (tmp / "vocab.bin").read_bytes()
    return _memo("vocab", make)


def _vocab_equal(got: bytes, what: str) -> str:
    import hashlib

    _, want = _vocab_bytes()
    at = _first_diff(got, want)
    if at is None:
        return f"{what}: sha256 {hashlib.sha256(got).hexdigest()[:16]}… equals the compiler's ({len(got):,} bytes)"
    pos, tid = 4, None
    while pos <= at and pos + 6 <= len(want):                 # walk the records to the one holding the byte
        tid, n = struct.unpack_from("<IH", want, pos)
        if at < pos + 6 + n:
            break
        pos += 6 + n
    raise PieceFailure(f"{what}: byte {at:,} differs (got {got[at:at + 1].hex() or 'end of file'}, expected "
                       f"{want[at:at + 1].hex()}): it belongs to the record of token {tid} "
                       f"({want[pos + 6:pos + 6 + struct.unpack_from('<H', want, pos + 4)[0]]!r})")


def check_decode_token_str(fn) -> str:
    from kestrel_lab.vocab.compiler import compile_vocab

    with tempfile.TemporaryDirectory(prefix="kestrel-check-") as tmp, seam.swapped({"vocab.decode_token_str": fn}):
        t0 = time.perf_counter()
        compile_vocab(None, Path(tmp) / "vocab.bin")
        return _vocab_equal((Path(tmp) / "vocab.bin").read_bytes(),
                            f"vocab.bin compiled with it ({time.perf_counter() - t0:.1f} s)")


def check_compile_vocab(fn) -> str:
    src, _ = _vocab_bytes()
    t0 = time.perf_counter()
    return _vocab_equal(bytes(fn(str(src))), f"its vocab.bin ({time.perf_counter() - t0:.1f} s)")


def _vl_case():
    doc = golden.load(golden.golden_path("qwen3-tiny-vl"))
    return doc["cases"][0]


def check_patchify(fn) -> str:
    from kestrel_lab.vision import preprocess, synthetic

    picture, _ = synthetic.draw(_vl_case()["seed"])
    im = preprocess.load_image(picture)
    with seam.swapped({"vision.patchify": fn}):
        mine = preprocess.load_image(picture)
    d = _close(mine.pixel_values, im.pixel_values, "pixel_values of a golden picture", rtol=0, atol=1e-6)
    return f"a golden picture's pixel_values equal the preprocessor's within {d:.1e}; " + \
        golden_run({"vision.patchify": fn}, "qwen3-tiny-vl")


def check_merge(fn) -> str:
    eng = golden._open("qwen3-tiny-vl", "f32")
    tw = eng.vision
    x = np.random.default_rng(7).standard_normal((64, tw.vc.hidden_size)).astype(np.float32)
    want = tw.merge_tokens(x, tw.merger, postshuffle=False)
    d = _close(fn(x.copy(), tw.merger), want, "the merger on 64 patches", rtol=1e-4, atol=1e-4 * np.abs(want).max())
    return f"equals the tower's merger within {d:.1e}; " + golden_run({"vision.merge": fn}, "qwen3-tiny-vl")


def check_image_positions(fn) -> str:
    from kestrel_lab.vision.positions import mrope_positions

    pad = 151655
    for grid in ((1, 16, 16), (1, 20, 32), (1, 12, 4), (2, 4, 6)):
        ids = [11, 12, 13] + [pad] * (grid[0] * grid[1] * grid[2] // 4) + [14, 15]
        want, _ = mrope_positions(ids, [grid], image_pad_id=pad)
        got, _ = mrope_positions(ids, [grid], image_pad_id=pad, image_positions=fn)
        bad = np.argwhere(got != want)
        if bad.size:
            ax, i = (int(v) for v in bad[0])
            raise PieceFailure(f"grid {grid}: token {i}, axis {'thw'[ax]}: position {got[ax, i]}, "
                               f"expected {want[ax, i]}")
    return "four grids (t = 2 among them) equal mrope_positions; " + \
        golden_run({"vision.image_positions": fn}, "qwen3-tiny-vl")


def check_route(fn) -> str:
    from kestrel_lab.engine import Qwen3Engine, moe

    rng = np.random.default_rng(8)
    lg = rng.standard_normal((16, 128)).astype(np.float32)
    lg[3, :2] = 5.0                                          # a tie: the lower expert id comes first
    for norm in (True, False):
        wi, ww = moe.route(lg, 8, norm)
        gi, gw = fn(lg.copy(), 8, norm)
        if not np.array_equal(np.asarray(gi), wi):
            t = int(np.argwhere(np.asarray(gi) != wi)[0][0])
            raise PieceFailure(f"norm={norm}: token {t} chose experts {np.asarray(gi)[t].tolist()}, "
                               f"expected {wi[t].tolist()}")
        _close(gw, ww, f"norm={norm}: the weights", rtol=1e-5, atol=1e-7)
    path = models.vqf(arch="qwen3_moe", quant="f32")
    ids = [1, 5, 9, 200, 7]
    ours = Qwen3Engine.from_vqf(path, max_context=32).forward_all(ids)
    with seam.swapped({"moe.route": fn}):
        mine = Qwen3Engine.from_vqf(path, max_context=32)
    d = _close(mine.forward_all(ids), ours, "a random Qwen3-MoE's logits", rtol=1e-4, atol=1e-4 * np.abs(ours).max())
    return (f"128 experts, top 8, ties included, equal moe.route; a Qwen3-MoE routed by it gives the same "
            f"logits ({d:.1e})")


def check_sm4_ctr(fn) -> str:
    from kestrel_lab.vqf import encrypt, protect

    with tempfile.TemporaryDirectory(prefix="kestrel-check-") as tmp:
        key = protect.write_key_file(Path(tmp) / "k.key")
        enc = Path(tmp) / "poem.enc.vqf"
        encrypt.encrypt_file(poem_vqf("q4_0"), enc, key)
        n = 0
        for name in ("attn_norm", "q4_q", "q4_down"):
            want = encrypt.decrypt_tensor(enc, name, key)
            t0 = time.perf_counter()
            with seam.swapped({"protect.sm4_ctr": fn}):
                got = encrypt.decrypt_tensor(enc, name, key)
            secs = time.perf_counter() - t0
            at = _first_diff(bytes(got), bytes(want))
            if at is not None:
                raise PieceFailure(f"tensor {name!r} decrypted with it differs at byte {at:,} of the tensor "
                                   f"(block {at // 16} of its key stream)")
            n += want.size
    return (f"three tensors of an encrypted poem file ({n / 1e6:.1f} MB) decrypt to the plaintext "
            f"({n / 1e6 / secs:.1f} MB/s on the last)")


CHECKS: dict[str, Callable] = {
    "quant.quantize_q8_0": check_quantize_q8_0,
    "quant.dequantize_q4_0": check_dequantize_q4_0,
    "kernels.quantize_act": check_quantize_act,
    "kernels.matvec_q4_0": check_matvec_q4_0,
    "layers.rmsnorm": lambda fn: _layer_check("layers.rmsnorm", fn, _direct_rmsnorm),
    "layers.rope_cos_sin": lambda fn: _layer_check("layers.rope_cos_sin", fn, _direct_rope_cos_sin),
    "layers.apply_rope": lambda fn: _layer_check("layers.apply_rope", fn, _direct_apply_rope),
    "layers.rmsnorm_heads": lambda fn: _layer_check("layers.rmsnorm_heads", fn, _direct_rmsnorm_heads),
    "layers.attention": lambda fn: _layer_check("layers.attention", fn, _direct_attention),
    "sampling.draw": check_draw,
    "chat.render": check_render,
    "vqf.parse_header": check_parse_header,
    "vqf.parse_directory": check_parse_directory,
    "vqf.chain_offsets": check_chain_offsets,
    "vocab.decode_token_str": check_decode_token_str,
    "vocab.compile_vocab": check_compile_vocab,
    "vision.patchify": check_patchify,
    "vision.merge": check_merge,
    "vision.image_positions": check_image_positions,
    "moe.route": check_route,
    "protect.sm4_ctr": check_sm4_ctr,
}
ENGINE = "engine"          # the table's last row: every written engine piece together on the golden tokens


def run_one(key: str, fn) -> Row:
    """Check one piece: its row of the table."""
    piece = seam.BY_KEY[key]
    if fn is None or seam.is_skeleton(fn):
        return Row(key, piece.lesson, NOT_STARTED)
    t0 = time.perf_counter()
    try:
        detail = CHECKS[key](fn)
    except NotImplementedError:
        return Row(key, piece.lesson, NOT_STARTED, time.perf_counter() - t0, "it still raises NotImplementedError")
    except PieceFailure as e:
        return Row(key, piece.lesson, FAILS, time.perf_counter() - t0, str(e))
    except Exception as e:  # the student's code may raise anything: report it on its row, check the others
        return Row(key, piece.lesson, FAILS, time.perf_counter() - t0, f"raised {type(e).__name__}: {e}")
    return Row(key, piece.lesson, PASSES, time.perf_counter() - t0, detail)


def run_engine(pieces: dict) -> Row:
    """Every written engine piece together on the golden tokens (Q4_0 when the matvec is among them)."""
    from kestrel_lab.engine.pieces import ENGINE_PIECES, MATVEC_PIECES

    mine = {k: fn for k, fn in pieces.items() if k in ENGINE_PIECES and k != "moe.route"}
    if not mine:
        return Row(ENGINE, "day30_1", NOT_STARTED, detail="no engine piece written yet")
    t0 = time.perf_counter()
    quant = "q4_0" if any(k in mine for k in MATVEC_PIECES) else "f32"
    try:
        detail = f"{len(mine)} pieces together: " + golden_run(mine, quant=quant)
    except PieceFailure as e:
        return Row(ENGINE, "day30_1", FAILS, time.perf_counter() - t0, str(e))
    except Exception as e:
        return Row(ENGINE, "day30_1", FAILS, time.perf_counter() - t0, f"raised {type(e).__name__}: {e}")
    return Row(ENGINE, "day30_1", PASSES, time.perf_counter() - t0, detail)


# --------------------------------------------------------------------------- the command
def select(pieces: list[str] | None = None, days: list[int] | None = None) -> list[str]:
    """The piece keys to check: ``pieces`` (keys, or module names meaning all their pieces), the pieces taught
    on ``days``, else all of them; in the table's order."""
    keys = list(seam.BY_KEY)
    if pieces:
        unknown = [p for p in pieces if p not in seam.BY_KEY and p not in seam.MODULES]
        if unknown:
            raise KeyError(f"no such piece or module: {', '.join(unknown)} (pieces: {', '.join(seam.BY_KEY)})")
        keys = [k for k in keys if k in pieces or seam.BY_KEY[k].module in pieces]
    if days:
        keys = [k for k in keys if int(seam.BY_KEY[k].lesson[3:5]) in days]
    return keys


def _safe_function(ws: seam.Workspace, key: str):
    try:
        return ws.function(key)
    except seam.WorkspaceError:
        return None


def run(ws: seam.Workspace, keys: list[str], *, full: bool = False, log=print) -> list[Row]:
    """Check ``keys`` of workspace ``ws`` one by one (``log`` hears each row as it is done), then — when every
    piece is selected — the written engine pieces together."""
    global GOLDEN_STEPS
    steps, GOLDEN_STEPS = GOLDEN_STEPS, (10 ** 6 if full else GOLDEN_STEPS)
    rows = []
    try:
        broken = {}
        for key in keys:
            try:
                rows.append(run_one(key, ws.function(key)))
            except seam.WorkspaceError as e:   # a module with a syntax error fails its pieces; the others go on
                broken[key] = e
                rows.append(Row(key, seam.BY_KEY[key].lesson, FAILS, detail=str(e)))
            log(_line(rows[-1]))
        if set(keys) == set(seam.BY_KEY):
            written = {k: fn for k, fn in ((k, _safe_function(ws, k)) for k in keys if k not in broken)
                       if fn is not None and not seam.is_skeleton(fn)}
            rows.append(run_engine(written))
            log(_line(rows[-1]))
    finally:
        GOLDEN_STEPS = steps
    return rows


MARK = {NOT_STARTED: "·", PASSES: "✔", FAILS: "✘"}


def _line(r: Row) -> str:
    secs = f"{r.seconds:6.1f} s" if r.seconds else " " * 8
    return f"{MARK[r.status]} {r.key:<24} {r.lesson:<8} {r.status:<12} {secs}  {r.detail}"


HEAD = f"  {'piece':<24} {'lesson':<8} {'status':<12} {'time':>8}  what was checked"


def summary(rows: list[Row]) -> str:
    """One line counting each status (the engine row is not a piece)."""
    counts = {s: sum(r.status == s for r in rows if r.key != ENGINE) for s in (PASSES, FAILS, NOT_STARTED)}
    return f"{counts[PASSES]} passes, {counts[FAILS]} fails, {counts[NOT_STARTED]} not started"


def format_table(rows: list[Row]) -> str:
    """The progress table, then one line counting each status."""
    return "\n".join([HEAD, *(_line(r) for r in rows), summary(rows)])
