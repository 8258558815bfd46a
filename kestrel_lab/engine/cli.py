"""The engine wing's commands: ``generate``, ``chat``, ``bench`` and ``golden``.

``generate`` completes one prompt (raw text by default, or wrapped in the chat template with
``--chat``) and streams the continuation to stdout; the statistics line goes to stderr.
``chat`` is an interactive multi-turn chat like llmc's ``./infer``: type after ``你> ``, the answer
streams after ``助手> ``, an empty line or Ctrl-D quits, ``/reset`` forgets the conversation; after
each turn a line with prefill and decode tok/s goes to stderr. It reads stdin line by line, so it also
works with a pipe (``printf '你好\\n' | kestrel-lab chat model.vqf``).
``bench`` times decode and prefill against the machine's ceiling and PyTorch (``engine.bench``);
``golden check | update`` replays or regenerates the token ids each quantization must produce
(``kestrel_lab.golden``).

Every command that runs the engine takes ``--cpus`` (``big`` — the fastest cluster, the default —
``little``, ``all`` or a CPU list such as ``4-7``) and pins the process there (``threads.use_cpus``):
on an RK3588 an even split over A76 and A55 cores makes the fast threads wait for the slow ones.
``--threads`` overrides the count (default one per CPU). The per-turn line says which CPUs, how many
threads and numba's threading layer; a layer other than ``omp`` gets a warning.

Taught in day13_1 (generate), day14_2 (chat), day29_1 (planned; bench) and day25_3 (planned; golden).
"""
from __future__ import annotations

import argparse
import re
import sys

_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}


def unescape_prompt(text: str) -> str:
    r"""Turn the two-character escapes ``\n``, ``\t``, ``\r`` and ``\\`` into the characters they name.

    A shell makes typing a newline awkward, so ``--prompt "《夜思》\n作者：李白\n"`` means two lines.
    Real newlines pass through unchanged; any other backslash stays as it is. Taught in day13_1.
    """
    return re.sub(r"\\([ntr\\])", lambda m: _ESCAPES[m.group(1)], text)


def _add_common(p: argparse.ArgumentParser, *, max_new: int, temperature: float) -> None:
    p.add_argument("model", metavar="MODEL.vqf", help="the weights (a VQF file, e.g. from `kestrel-lab convert`)")
    p.add_argument("--max-new", type=int, default=max_new, metavar="N",
                   help=f"most tokens to generate per answer (default {max_new})")
    p.add_argument("--temperature", type=float, default=temperature, metavar="T",
                   help=f"0 = greedy (default {temperature})")
    p.add_argument("--top-k", type=int, default=0, metavar="K", help="keep the K most likely tokens (0 = off)")
    p.add_argument("--top-p", type=float, default=1.0, metavar="P",
                   help="keep the smallest set with probability mass ≥ P (1 = off)")
    p.add_argument("--min-p", type=float, default=0.0, metavar="P",
                   help="drop tokens less likely than P × the top one (0 = off)")
    p.add_argument("--repetition-penalty", type=float, default=1.0, metavar="R",
                   help="CTRL repetition penalty on every id seen so far (1 = off)")
    p.add_argument("--seed", type=int, default=None, metavar="S", help="random seed (default: not reproducible)")
    p.add_argument("--tokenizer", choices=("bpe", "greedy"), default="bpe",
                   help="encoder: the reference byte-level BPE (default) or the engine's greedy longest-prefix")
    p.add_argument("--tokenizer-json", metavar="FILE", default=None,
                   help="a Qwen3 tokenizer.json (default: the embedded one generated from qwen.tiktoken)")
    p.add_argument("--vocab-bin", metavar="FILE", default=None,
                   help="the engine's vocab.bin (for --tokenizer greedy; default: compiled from the tokenizer.json)")
    p.add_argument("--ctx", type=int, default=4096, metavar="N", help="context limit in tokens (default 4096)")
    _add_cpus(p)
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="numba threads (default: one per CPU of --cpus)")


def _add_cpus(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cpus", default=None, metavar="SET",
                   help="where the engine runs: big (the fastest cluster, the default), little, all, or a CPU "
                        "list such as 4-7 (an RK3588's A76 cores)")


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``generate``, ``chat``, ``bench`` and ``golden`` to ``kestrel-lab``. Taught in day13_1."""
    g = sub.add_parser("generate", help="complete a prompt with a VQF model, streaming the text",
                       description="Complete a prompt with the numba engine. The continuation goes to "
                                   "stdout, the statistics line to stderr.")
    _add_common(g, max_new=256, temperature=0.0)
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help=r"the prompt; \n, \t, \r and \\ are read as escapes (real newlines work too)")
    src.add_argument("--prompt-file", metavar="FILE", help="read the prompt from a UTF-8 file, as it is")
    mode = g.add_mutually_exclusive_group()
    mode.add_argument("--raw", dest="chat", action="store_false", help="use the prompt as it is (default)")
    mode.add_argument("--chat", dest="chat", action="store_true",
                      help="wrap the prompt as one user message in the Qwen3 chat template")
    g.add_argument("--system", default=None, help="system message (with --chat)")
    g.add_argument("--no-think", dest="think", action="store_false",
                   help="with --chat: add the empty <think></think> block (answer without reasoning)")
    g.add_argument("--echo", action="store_true", help="print the prompt before the continuation")
    g.set_defaults(func=_generate, chat=False, think=True)

    c = sub.add_parser("chat", help="interactive multi-turn chat (empty line or Ctrl-D quits)",
                       description="Chat with a VQF model. Type after '你> '; an empty line or Ctrl-D quits; "
                                   "/reset forgets the conversation. Per-turn statistics go to stderr.")
    _add_common(c, max_new=512, temperature=0.0)
    c.add_argument("--system", default=None, help="system message")
    think = c.add_mutually_exclusive_group()
    think.add_argument("--think", dest="think", action="store_true", help="let the model reason first (default)")
    think.add_argument("--no-think", dest="think", action="store_false",
                       help="add the empty <think></think> block: answer without reasoning")
    c.set_defaults(func=_chat, think=True)

    from kestrel_lab.engine.bench import DECODE_TOKENS, DEFAULT_CONFIG

    b = sub.add_parser("bench", help="engine decode/prefill tok/s vs the bandwidth ceiling and PyTorch")
    b.add_argument("--config", default=None, help=f"HF config.json (default data/configs/{DEFAULT_CONFIG})")
    b.add_argument("--quant", default="q4_0", choices=["q4_0", "q4_8x8l", "q8_0", "f16"],
                   help="weight format of the random model (default q4_0)")
    _add_cpus(b)
    b.add_argument("--threads", default=None, help="comma-separated thread counts (default: 1 and one per CPU of --cpus)")
    b.add_argument("--decode-tokens", type=int, default=DECODE_TOKENS, help="decode steps timed (default 32)")
    b.add_argument("--torch", dest="torch", action=argparse.BooleanOptionalAction, default=True,
                   help="also time transformers fp32 and bf16 (default: when installed; skipped, saying so, when not)")
    b.add_argument("--json", action="store_true", help="print the result as JSON")
    b.add_argument("--record", metavar="RUNNER", help="record the figures as day29_1 for RUNNER")
    b.set_defaults(func=_bench)

    golden = sub.add_parser("golden", help="golden files: the token ids each quantization must produce")
    golden_sub = golden.add_subparsers(dest="golden_command", metavar="ACTION", required=True)
    for action, what in (("check", "replay the committed golden file and report mismatches"),
                         ("update", "regenerate the golden file from this engine and show what changed")):
        g = golden_sub.add_parser(action, help=what)
        g.add_argument("--model", default="qwen3-tiny-poem", help="an embedded model under data/models/")
        g.add_argument("--quant", action="append", choices=("f32", "f16", "q8_0", "q4_0"),
                       help="only this quantization (repeatable; default all)")
        _add_cpus(g)
        g.set_defaults(func=_golden_check if action == "check" else _golden_update)


def _params(args):
    from kestrel_lab.engine.sample import SamplingParams

    return SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                          repetition_penalty=args.repetition_penalty, seed=args.seed)


def _load(args):
    from kestrel_lab.engine import Qwen3Engine
    from kestrel_lab.vocab import Tokenizer

    if args.max_new < 0:
        raise ValueError(f"--max-new {args.max_new}: must be ≥ 0")
    params = _params(args)
    args.cpu_choice = _use_cpus(args.cpus)
    engine = Qwen3Engine.from_vqf(args.model, max_context=args.ctx, threads=args.threads)
    if args.tokenizer_json is None and args.vocab_bin is None:
        tok = Tokenizer.default(encoder=args.tokenizer)
    else:
        tok = Tokenizer.from_files(args.tokenizer_json, args.vocab_bin, encoder=args.tokenizer)
    return engine, tok, params


def _use_cpus(spec: str | None):
    """Pin the process to ``--cpus`` (default: the fastest cluster)."""
    from kestrel_lab.threads import use_cpus

    return use_cpus(spec)


def _where(args, engine) -> str:
    """The per-turn line's second half: which CPUs, how many threads, numba's threading layer."""
    from kestrel_lab.threads import threading_layer

    layer = threading_layer()
    return f"[{args.cpu_choice.note()} | {engine.threads} threads | numba layer {layer or '—'}]"


_LAYER_WARNED = []


def _warn_layer() -> None:
    from kestrel_lab.threads import threading_layer

    layer = threading_layer()
    if layer and layer != "omp" and not _LAYER_WARNED:
        _LAYER_WARNED.append(layer)
        from kestrel_lab import machine

        print(f"warning: {machine.layer_warning(layer, machine.libgomp_loadable())}", file=sys.stderr)


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _generate(args) -> int:
    from kestrel_lab.engine.chat import encode_messages
    from kestrel_lab.engine.generate import generate

    if args.prompt is not None:
        prompt = unescape_prompt(args.prompt)
    else:
        with open(args.prompt_file, encoding="utf-8") as fh:
            prompt = fh.read()
    engine, tok, params = _load(args)
    if args.chat:
        msgs = ([{"role": "system", "content": args.system}] if args.system is not None else [])
        ids = encode_messages(tok, msgs + [{"role": "user", "content": prompt}], enable_thinking=args.think)
        if args.echo:
            _write(tok.decode(ids))
    else:
        if args.system is not None:
            raise ValueError("--system needs --chat")
        ids = tok.encode(prompt, allow_special=True)
        if args.echo:
            _write(prompt)
    out = generate(engine, tok, ids, params, max_new=args.max_new, on_text=_write)
    if out.text and not out.text.endswith("\n"):
        _write("\n")
    print(out.stats.line(), _where(args, engine), file=sys.stderr)
    _warn_layer()
    return 0


def _read_line(prompt: str) -> str | None:
    """One line of input, or None at end of input. Uses readline editing on a terminal."""
    if sys.stdin.isatty():
        try:
            import readline  # noqa: F401  (line editing and history for input())
        except ImportError:
            pass
        try:
            return input(prompt)
        except EOFError:
            _write("\n")
            return None
    _write(prompt)
    line = sys.stdin.readline()
    if not line:
        _write("\n")
        return None
    _write(line if line.endswith("\n") else line + "\n")  # echo, so a piped transcript reads well
    return line.rstrip("\r\n")


def _chat(args) -> int:
    from kestrel_lab.engine.chat import Conversation

    engine, tok, params = _load(args)
    conv = Conversation(engine, tok, system=args.system, enable_thinking=args.think, params=params,
                        max_new=args.max_new)
    print(f"kestrel-lab chat: {args.model} (thinking {'on' if args.think else 'off'}; empty line or Ctrl-D "
          f"quits, /reset forgets)", file=sys.stderr)
    while True:
        line = _read_line("你> ")
        if line is None or not line.strip():
            return 0
        if line.strip() == "/reset":
            conv.reset()
            print("(conversation forgotten)", file=sys.stderr)
            continue
        _write("助手> ")
        try:
            res = conv.ask(line, on_text=_write)
        except ValueError as e:  # e.g. the conversation outgrew the context: say so, start afresh
            _write("\n")
            print(f"error: {e}; the conversation was reset", file=sys.stderr)
            conv.reset()
            continue
        except KeyboardInterrupt:  # Ctrl-C stops this answer, not the chat (the turn is forgotten)
            _write("\n")
            print("(interrupted: this turn is dropped; Ctrl-D quits)", file=sys.stderr)
            continue
        if not res.text.endswith("\n"):
            _write("\n")
        print(res.stats.line(), _where(args, engine), file=sys.stderr)
        _warn_layer()


def _bench(args) -> int:
    import json

    from kestrel_lab.engine.bench import format_table, record, run

    from kestrel_lab import machine
    from kestrel_lab.threads import use_cpus

    try:
        threads = [int(t) for t in args.threads.split(",")] if args.threads else None
    except ValueError:
        raise ValueError(f"--threads {args.threads!r}: give thread counts separated by commas, e.g. 1,4") from None
    log = (lambda *a: print(*a, file=sys.stderr)) if args.json else print
    choice = use_cpus(args.cpus)
    log(f"bench: {choice.note()}")
    for w in machine.fingerprint(probe_threading=True, cpus=list(choice.cpus))["warnings"]:
        print(f"warning: {w}", file=sys.stderr)
    res = run(args.config, args.quant, threads, args.torch, args.decode_tokens, log=log)
    res["cpus"] = list(choice.cpus)
    if args.json:
        print(json.dumps(res, indent=1, default=str))
    else:
        print(format_table(res))
    if args.record:
        print(f"recorded {record(res, args.record)}", file=sys.stderr if args.json else sys.stdout)
    return 0


def _golden_check(args) -> int:
    from kestrel_lab import golden

    _use_cpus(args.cpus)

    bad = 0
    for r in golden.check(args.model, args.quant):
        tolerated = len(r.mismatches) - len(r.failures)
        print(f"{r.quant:5} {'ok' if r.ok else 'FAIL':4} {r.steps} steps, {len(r.failures)} mismatches "
              f"(+{tolerated} within the margin threshold {r.threshold:g})")
        for m in r.failures:
            print(f"      case {m.case} step {m.step}: golden {m.golden_id} (margin {m.golden_margin:.3f}), got {m.got_id}")
        bad += not r.ok
    return 1 if bad else 0


def _golden_update(args) -> int:
    from kestrel_lab import golden

    _use_cpus(args.cpus)

    for line in golden.update(args.model, tuple(args.quant or golden.QUANTS)):
        print(line)
    print(f"wrote {golden.golden_path(args.model)}")
    return 0
