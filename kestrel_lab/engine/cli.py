"""The engine wing's commands: ``generate``, ``chat``, ``bench`` and ``golden``.

``generate`` completes one prompt (raw text by default, or wrapped in the chat template with
``--chat``) and streams the continuation to stdout; the statistics line goes to stderr.
``chat`` is an interactive multi-turn chat like llmc's ``./infer``: type after ``你> ``, the answer
streams after ``助手> ``, an empty line or Ctrl-D quits, ``/reset`` forgets the conversation; after
each turn a line with prefill and decode tok/s goes to stderr. It reads stdin line by line, so it also
works with a pipe (``printf '你好\\n' | kestrel-lab chat model.vqf``).
With a Qwen3-VL model, ``generate --image PATH [--image PATH …] --prompt TEXT`` asks about pictures
(``--image`` implies chat mode; the images come before the text in the user turn, as Qwen3-VL-Instruct's
template writes them) and ``/image PATH`` inside ``chat`` attaches a picture to the next message; the
statistics line then gives each image's LLM tokens and vision-encode time. ``--min-pixels`` and
``--max-pixels`` bound the resize (Qwen3-VL's defaults otherwise). A picture's tokens are counted from its
header before it is decoded: one that would not fit the context left (less a reserve for the answer) is
scaled down to fit, with a note on stderr — or, when ``--max-pixels`` was given, refused naming the file and
the option. A picture that cannot be read or fit stops ``generate`` with the preprocessing's message (exit
code 2); in ``chat`` it is reported and skipped.
``bench`` times decode and prefill against the machine's ceiling and PyTorch (``bench.speed``;
``bench --vision``: the vision tower on one 640×480 image, ``bench.vision``; ``bench --peer llama.cpp``:
beside llama.cpp built by ``make peers``, on the same checkpoint, ``bench.peer``; ``bench --record RUNNER``
runs the notebook that owns the figures through ``kestrel-lab rerun`` — day29_1, day20_2, day22_3);
``golden check | update`` replays or regenerates the token ids each quantization must produce
(``kestrel_lab.golden``). ``--key-file K`` (or ``KESTREL_KEY_FILE``) opens an SM4-encrypted VQF
(``vqf.protect``); for ``bench`` it adds a run on an encrypted copy of the model.

Every command that runs the engine takes ``--cpus`` (``big`` — the fastest cluster, the default —
``little``, ``all`` or a CPU list such as ``4-7``) and pins the process there (``threads.use_cpus``):
on an RK3588 an even split over A76 and A55 cores makes the fast threads wait for the slow ones.
``--threads`` overrides the count (default one per CPU). The per-turn line says which CPUs, how many
threads and numba's threading layer; a layer other than ``omp`` gets a warning.

Taught in day13_1 (generate), day14_2 (chat), day29_1 (bench) and day25_3 (golden).
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
    p.add_argument("--key-file", metavar="K", default=None,
                   help="key file of an SM4-encrypted VQF (default: $KESTREL_KEY_FILE; see `kestrel-lab vqf keygen`)")


def _add_image_size(p: argparse.ArgumentParser) -> None:
    p.add_argument("--min-pixels", type=int, default=None, metavar="N",
                   help="Qwen3-VL: smallest image area after the resize (default 65,536)")
    p.add_argument("--max-pixels", type=int, default=None, metavar="N",
                   help="Qwen3-VL: largest image area after the resize (default 16,777,216)")


def _add_cpus(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cpus", default=None, metavar="SET",
                   help="where the engine runs: big (the fastest cluster, the default), little, all, or a CPU "
                        "list such as 4-7 (an RK3588's A76 cores)")


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``generate``, ``chat``, ``bench`` and ``golden`` to ``kestrel-lab``. Taught in day13_1."""
    _register_generate(sub)
    _register_chat(sub)
    _register_bench(sub)
    _register_golden(sub)


def _register_generate(sub: argparse._SubParsersAction) -> None:
    g = sub.add_parser("generate", help="complete a prompt with a VQF model, streaming the text",
                       description="Complete a prompt with the numba engine. The continuation goes to "
                                   "stdout, the statistics line to stderr.")
    _add_common(g, max_new=256, temperature=0.0)
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt",
                     help=r"the prompt; \n, \t, \r and \\ are read as escapes (real newlines work too)")
    src.add_argument("--prompt-file", metavar="FILE", help="read the prompt from a UTF-8 file, as it is")
    mode = g.add_mutually_exclusive_group()
    mode.add_argument("--raw", dest="chat", action="store_false",
                      help="use the prompt as it is (default without --image)")
    mode.add_argument("--chat", dest="chat", action="store_true",
                      help="wrap the prompt as one user message in the model's chat template "
                           "(Qwen3's, or Qwen2.5's with its default system message)")
    g.add_argument("--system", default=None, help="system message (with --chat)")
    g.add_argument("--no-think", dest="think", action="store_false",
                   help="with --chat: add the empty <think></think> block (answer without reasoning)")
    g.add_argument("--echo", action="store_true", help="print the prompt before the continuation")
    g.add_argument("--image", action="append", default=[], metavar="PATH",
                   help="Qwen3-VL: a picture to ask about (repeatable; implies --chat; images go before the text)")
    _add_image_size(g)
    g.set_defaults(func=_generate, chat=None, think=True)


def _register_chat(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser("chat", help="interactive multi-turn chat (empty line or Ctrl-D quits)",
                       description="Chat with a VQF model. Type after '你> '; an empty line or Ctrl-D quits; "
                                   "/reset forgets the conversation; with a Qwen3-VL model /image PATH attaches "
                                   "a picture to the next message. Per-turn statistics go to stderr.")
    _add_common(c, max_new=512, temperature=0.0)
    c.add_argument("--system", default=None, help="system message")
    think = c.add_mutually_exclusive_group()
    think.add_argument("--think", dest="think", action="store_true", help="let the model reason first (default)")
    think.add_argument("--no-think", dest="think", action="store_false",
                       help="add the empty <think></think> block: answer without reasoning")
    _add_image_size(c)
    c.set_defaults(func=_chat, think=True)


def _register_bench(sub: argparse._SubParsersAction) -> None:
    from kestrel_lab.bench.speed import DECODE_TOKENS, DEFAULT_CONFIG
    from kestrel_lab.bench.peer import PEERS

    b = sub.add_parser("bench", help="engine decode/prefill tok/s vs the bandwidth ceiling and PyTorch")
    b.add_argument("--config", default=None, help=f"HF config.json (default data/configs/{DEFAULT_CONFIG})")
    b.add_argument("--quant", default="q4_0", choices=["q4_0", "q4_8x8l", "q8_0", "f16"],
                   help="weight format of the random model (default q4_0)")
    _add_cpus(b)
    b.add_argument("--threads", default=None,
                   help="comma-separated thread counts (default: 1 and one per CPU of --cpus)")
    b.add_argument("--decode-tokens", type=int, default=DECODE_TOKENS, help="decode steps timed (default 32)")
    b.add_argument("--torch", dest="torch", action=argparse.BooleanOptionalAction, default=True,
                   help="also time transformers fp32 and bf16 (default: when installed; skipped, saying so, when not)")
    b.add_argument("--json", action="store_true", help="print the result as JSON")
    b.add_argument("--record", metavar="RUNNER",
                   help="record RUNNER's figures by running the notebook that owns them through "
                        "`kestrel-lab rerun`: day29_1 (with --peer: -p run_peer true), day20_2 with --vision, "
                        "day22_3 for a Qwen3-MoE config")
    b.add_argument("--peer", choices=PEERS, default=None,
                   help="run beside a peer engine built by `make peers` on the same checkpoint: interleaved rounds, "
                        "medians, ratios, the bandwidth and compute limits")
    b.add_argument("--layers", type=int, default=None, metavar="N",
                   help="a Qwen3-MoE config: keep its first N layers (per-layer figures scale to the whole model)")
    b.add_argument("--memory-limit", metavar="SIZE", default=None,
                   help="a Qwen3-MoE config: also decode under a memory cgroup of SIZE (e.g. 1G; needs root and a "
                        "cgroup memory controller): unlimited vs limited with the OS's read-ahead vs limited with "
                        "exact expert paging")
    b.add_argument("--dense-twin", metavar="CONFIG", nargs="?", default=None, const="",
                   help="a Qwen3-MoE config: also decode a dense model with about as many active parameters at the "
                        "same layers (default data/configs/qwen3-4b.config.json) and compare with what the bytes "
                        "predict")
    b.add_argument("--rounds", type=int, default=None, metavar="N",
                   help="interleaved rounds: of each thread count with --peer (default 3); of the --memory-limit "
                        "and --dense-twin runs, taken in turn (default 1)")
    b.add_argument("--key-file", metavar="K", default=None,
                   help="also time the engine on an SM4-encrypted copy of the model (default: $KESTREL_KEY_FILE)")
    b.add_argument("--vision", action="store_true",
                   help="time the Qwen3-VL vision tower instead: one 640×480 image at the 2B vision shapes "
                        "(--config: a Qwen3-VL config.json), against PyTorch fp32/bf16 on the same weights; "
                        "without --config also time to first token for a picture (tiny VL, 2B shapes)")
    b.set_defaults(func=_bench)


def _register_golden(sub: argparse._SubParsersAction) -> None:
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
    from kestrel_lab.engine.vl import open_engine
    from kestrel_lab.vocab import Tokenizer

    if args.max_new < 0:
        raise ValueError(f"--max-new {args.max_new}: must be ≥ 0")
    params = _params(args)
    args.cpu_choice = _use_cpus(args.cpus)
    engine = open_engine(args.model, max_context=args.ctx, threads=args.threads, key_file=args.key_file)
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


def _is_vl(engine) -> bool:
    return getattr(engine, "vision", None) is not None


IMAGE_RESERVE = 128   # tokens a picture leaves free for the question and the answer's first tokens


def _image_room(conv, text: str, n_new: int, max_new: int) -> int:
    """Image tokens each of ``n_new`` new pictures may take: the context less the conversation so far (its
    pictures included), this turn's text and template, and ``min(max_new, IMAGE_RESERVE)`` for the answer."""
    from kestrel_lab.vision import prompt as VP

    eng = conv.engine
    turn = {"role": "user", "content": [{"type": "image"}] * n_new + [{"type": "text", "text": text}]}
    grids = [tuple(im.grid_thw) for im in conv.images] + [(1, eng.merge, eng.merge)] * n_new  # 1 token each
    used = len(VP.encode_vl_chat(conv.tokenizer, conv.messages + [turn], grids, merge_size=eng.merge,
                                 image_pad_id=eng.image_pad_id)) - n_new
    return (eng.max_context - used - min(max_new, IMAGE_RESERVE)) // max(1, n_new)


def _load_image(engine, path: str, args, room: int | None = None):
    """Preprocess one picture for the engine's vision tower (sizes from the file's vision config). With
    ``room`` (image tokens left), a picture that would not fit is scaled down to fit, saying so — or, when
    ``--max-pixels`` was given, refused naming the file and the option (``preprocess.TokenBudget``)."""
    from kestrel_lab.vision.preprocess import load_image

    kw = {k: v for k, v in (("min_pixels", args.min_pixels), ("max_pixels", args.max_pixels)) if v is not None}
    im = load_image(path, vision=engine.config.vision, max_tokens=room, fit=args.max_pixels is None, **kw)
    if im.note:
        print(f"note: {im.note}", file=sys.stderr)
    return im


def _generate_vl(args, engine, tok, params, prompt: str) -> int:
    from kestrel_lab.engine.vl import VLConversation

    conv = VLConversation(engine, tok, system=args.system, params=params, max_new=args.max_new)
    try:
        room = _image_room(conv, prompt, len(args.image), args.max_new)
        images = [_load_image(engine, p, args, room) for p in args.image]
    except (OSError, ValueError) as e:   # the preprocessing names the file and what is wrong with it
        print(f"kestrel-lab generate: error: {e}", file=sys.stderr)
        return 2
    if args.echo:   # the template's text, one <|image_pad|> per picture (expanded to its tokens when run)
        from kestrel_lab.vision.prompt import render_vl_chat

        turn = {"role": "user", "content": [{"type": "image"}] * len(images) + [{"type": "text", "text": prompt}]}
        _write(render_vl_chat(conv.messages + [turn]))
    out = conv.ask(prompt, images, on_text=_write)
    if out.text and not out.text.endswith("\n"):
        _write("\n")
    print(out.stats.line(), file=sys.stderr)
    return 0


def _generate(args) -> int:
    from kestrel_lab.engine.chat import encode_messages
    from kestrel_lab.engine.generate import generate

    if args.prompt is not None:
        prompt = unescape_prompt(args.prompt)
    else:
        with open(args.prompt_file, encoding="utf-8") as fh:
            prompt = fh.read()
    if args.image and args.chat is False:
        raise ValueError("--image needs chat mode (it implies --chat); drop --raw")
    if (args.min_pixels is not None or args.max_pixels is not None) and not args.image:
        raise ValueError("--min-pixels/--max-pixels apply to --image")
    engine, tok, params = _load(args)
    if args.image and not _is_vl(engine):
        raise ValueError(f"{args.model}: --image needs a Qwen3-VL model with a vision tower "
                         f"(this file is {engine.config.arch} without one)")
    if _is_vl(engine) and (args.image or args.chat):
        return _generate_vl(args, engine, tok, params, prompt)
    if args.chat:
        msgs = ([{"role": "system", "content": args.system}] if args.system is not None else [])
        ids = encode_messages(tok, msgs + [{"role": "user", "content": prompt}], enable_thinking=args.think,
                              arch=engine.config.arch)      # the template of the file's architecture
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


class _Pending:
    """A conversation as it will be with the attached pictures sent (for ``_image_room`` in ``chat``)."""

    def __init__(self, conv, images):
        self.engine, self.tokenizer, self.images = conv.engine, conv.tokenizer, images
        extra = len(images) - len(conv.images)
        self.messages = conv.messages + ([{"role": "user", "content": [{"type": "image"}] * extra}] if extra else [])


def _chat(args) -> int:
    from kestrel_lab.engine.chat import Conversation
    from kestrel_lab.engine.vl import VLConversation
    from kestrel_lab.vision.positions import image_token_count

    engine, tok, params = _load(args)
    vl = _is_vl(engine)
    if vl:
        conv = VLConversation(engine, tok, system=args.system, params=params, max_new=args.max_new)
        mode = "Qwen3-VL: /image PATH attaches a picture to the next message"
    else:
        conv = Conversation(engine, tok, system=args.system, enable_thinking=args.think, params=params,
                            max_new=args.max_new)
        mode = ("Qwen2.5 template" if engine.config.arch == "qwen2"   # no thinking switch there
                else f"thinking {'on' if args.think else 'off'}")
    print(f"kestrel-lab chat: {args.model} ({mode}; empty line or Ctrl-D quits, /reset forgets)", file=sys.stderr)
    pending = []   # pictures attached with /image, sent with the next message
    while True:
        line = _read_line("你> ")
        if line is None or not line.strip():
            return 0
        if line.strip() == "/reset":
            conv.reset()
            pending = []
            print("(conversation forgotten)", file=sys.stderr)
            continue
        if line.strip().startswith("/image"):
            path = line.strip()[len("/image"):].strip()
            if not vl:
                print(f"error: /image needs a Qwen3-VL model; {args.model} has no vision tower", file=sys.stderr)
            elif not path:
                print("usage: /image PATH", file=sys.stderr)
            else:
                try:
                    pend = conv.images + pending   # the pictures already attached count as sent
                    room = _image_room(_Pending(conv, pend), "", 1, args.max_new)
                    im = _load_image(engine, path, args, room)
                except (OSError, ValueError) as e:
                    print(f"error: {e}", file=sys.stderr)
                    continue
                pending.append(im)
                t, h, w = im.grid_thw
                print(f"(image {len(pending)} attached: {path}, grid {t}×{h}×{w}, "
                      f"{image_token_count(im.grid_thw, engine.merge)} tokens; it goes with your next message)",
                      file=sys.stderr)
            continue
        _write("助手> ")
        try:
            if vl:
                res = conv.ask(line, pending, on_text=_write)
                pending = []
            else:
                res = conv.ask(line, on_text=_write)
        except ValueError as e:  # e.g. the conversation outgrew the context: say so, start afresh
            _write("\n")
            print(f"error: {e}; the conversation was reset", file=sys.stderr)
            conv.reset()
            pending = []
            continue
        except KeyboardInterrupt:  # Ctrl-C stops this answer, not the chat (the turn is forgotten)
            _write("\n")
            print("(interrupted: this turn is dropped; Ctrl-D quits)", file=sys.stderr)
            continue
        if not res.text.endswith("\n"):
            _write("\n")
        print(res.stats.line(), _where(args, engine), file=sys.stderr)
        _warn_layer()


def _record_notebook(args) -> tuple[str, dict]:
    """The notebook that owns the figures ``bench --record`` asks for, and its papermill parameters:
    day29_1 (with ``--peer``: ``run_peer``, ``rounds`` and ``peer_threads``), day20_2 with ``--vision``,
    day22_3 for a Qwen3-MoE config. Each figure file has one writer: the notebook."""
    if args.vision:
        return "day20_2", {}
    if args.config:
        from kestrel_lab.config import ModelConfig

        if ModelConfig.from_hf(args.config).arch == "qwen3_moe":
            return "day22_3", {}
    if not args.peer:
        return "day29_1", {}
    return "day29_1", {"run_peer": "true", "rounds": str(3 if args.rounds is None else args.rounds),
                       **({"peer_threads": args.threads} if args.threads else {})}


def _record(args) -> int:
    """``bench --record RUNNER``: ``kestrel-lab rerun --runner RUNNER --notebooks <owner> [-p K V …]``."""
    from kestrel_lab import cli

    nb, params = _record_notebook(args)
    argv = ["rerun", "--runner", args.record, "--notebooks", nb]
    for k, v in params.items():
        argv += ["-p", k, v]
    print(f"bench --record: the figures are {nb}'s; running `kestrel-lab {' '.join(argv)}`", file=sys.stderr)
    return cli.main(argv)


def _bench_peer(args, threads, log) -> int:
    import json

    from kestrel_lab.bench import peer

    if args.vision or args.key_file or args.layers is not None or args.quant != "q4_0":
        print("--peer compares the dense Q4_0 model only (no --vision, --layers, --key-file or --quant)",
              file=sys.stderr)
        return 2
    if peer.find() is None:
        print(f"bench --peer {args.peer}: {peer.HINT}", file=sys.stderr)
        return 1
    rounds = 3 if args.rounds is None else args.rounds
    if rounds < 1:
        print("--rounds must be ≥ 1", file=sys.stderr)
        return 2
    res = peer.run(rounds=rounds, threads=threads or (1, 2), config=args.config, log=log)
    print(json.dumps(res, indent=1, default=str) if args.json else peer.format_table(res))
    return 0


def _bench(args) -> int:
    import json

    from kestrel_lab.bench.speed import format_table, run

    from kestrel_lab import machine
    from kestrel_lab.threads import use_cpus

    if args.record:
        return _record(args)
    try:
        threads = [int(t) for t in args.threads.split(",")] if args.threads else None
    except ValueError:
        raise ValueError(f"--threads {args.threads!r}: give thread counts separated by commas, e.g. 1,4") from None
    log = (lambda *a: print(*a, file=sys.stderr)) if args.json else print
    choice = use_cpus(args.cpus)
    log(f"bench: {choice.note()}")
    for w in machine.fingerprint(probe_threading=True, cpus=list(choice.cpus))["warnings"]:
        print(f"warning: {w}", file=sys.stderr)
    if args.peer:
        return _bench_peer(args, threads, log)
    if args.vision:
        from kestrel_lab.bench import vision as vision_bench

        format_table = vision_bench.format_table
        res = vision_bench.run(args.config, threads, args.torch, log=log)
    else:
        from kestrel_lab.config import ModelConfig

        if args.config and ModelConfig.from_hf(args.config).arch == "qwen3_moe":
            from kestrel_lab.bench.moe import format_moe_table, moe_run

            from kestrel_lab.bench.moe import DENSE_TWIN_CONFIG
            from kestrel_lab.paths import configs_dir

            if args.memory_limit is not None:
                from kestrel_lab.cgroup import parse_size

                parse_size(args.memory_limit)          # a bad size fails before anything is built
            twin = None if args.dense_twin is None else (args.dense_twin or configs_dir() / DENSE_TWIN_CONFIG)
            res = moe_run(args.config, args.layers, args.quant, threads, args.decode_tokens, log=log,
                          memory_limit=args.memory_limit, dense_twin_config=twin, rounds=args.rounds or 1)
            print(json.dumps(res, indent=1, default=str) if args.json else format_moe_table(res))
            return 0
        for flag, given in (("--layers", args.layers is not None), ("--memory-limit", args.memory_limit is not None),
                            ("--dense-twin", args.dense_twin is not None)):
            if given:
                print(f"{flag} applies to a Qwen3-MoE --config", file=sys.stderr)
                return 2
        from kestrel_lab.vqf.protect import resolve_key_file

        res = run(args.config, args.quant, threads, args.torch, args.decode_tokens, log=log,
                  key_file=resolve_key_file(args.key_file))
    res["cpus"] = list(choice.cpus)
    if args.json:
        print(json.dumps(res, indent=1, default=str))
    else:
        print(format_table(res))
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
            print(f"      case {m.case} step {m.step}: golden {m.golden_id} (margin {m.golden_margin:.3f}), "
                  f"got {m.got_id}")
        bad += not r.ok
    return 1 if bad else 0


def _golden_update(args) -> int:
    from kestrel_lab import golden

    _use_cpus(args.cpus)

    for line in golden.update(args.model, tuple(args.quant or golden.QUANTS)):
        print(line)
    print(f"wrote {golden.golden_path(args.model)}")
    return 0
