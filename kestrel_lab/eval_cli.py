"""The eval wing's commands: ``kestrel-lab eval ppl`` (perplexity of a VQF file on a text) and
``kestrel-lab eval kl`` (KL and top-1 of a quantized file against its F32 twin).

The wing is the module ``eval``, not a folder, so its commands live here (see ``kestrel_lab.cli``).
A text is a UTF-8 file; entries separated by lines ``%`` (the fortune format) are joined by
``<|endoftext|>``; ``--fortunes NAME`` reads Debian's fortunes-zh file NAME (``tang300``, ``song100``:
the poem model's training text; ``chinese``: modern prose). Taught in day25_1.
"""
from __future__ import annotations

import argparse
import json


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``kestrel-lab eval ppl`` and ``kestrel-lab eval kl``. Taught in day25_1."""
    from kestrel_lab import eval as E

    ev = sub.add_parser("eval", help="evaluate a VQF file: perplexity, KL against its F32 twin")
    actions = ev.add_subparsers(dest="eval_command", metavar="ACTION", required=True)
    ppl = actions.add_parser("ppl", help="perplexity on a text, sliding window (every token scored once)")
    ppl.add_argument("vqf", help="the VQF file to evaluate (any quantization)")
    ppl.add_argument("--window", type=int, default=E.WINDOW, help=f"tokens per window (default {E.WINDOW})")
    ppl.add_argument("--stride", type=int, default=E.STRIDE, help=f"a new window every N tokens (default {E.STRIDE})")
    kl = actions.add_parser("kl", help="per-position KL(F32 ‖ quantized) and top-1 agreement")
    kl.add_argument("vqf", help="the quantized VQF file")
    kl.add_argument("f32_vqf", help="its F32 twin (the same checkpoint converted with --quant f32)")
    for p, default in ((ppl, 4096), (kl, 256)):
        src = p.add_mutually_exclusive_group(required=True)
        src.add_argument("--text", help="a UTF-8 text file (fortune format: entries separated by '%%' lines)")
        src.add_argument("--fortunes", help="a fortunes-zh file by name: tang300, song100, chinese")
        p.add_argument("--max-tokens", type=int, default=default,
                       help=f"evaluate the first N tokens (default {default})")
        p.add_argument("--tokenizer-json", help="tokenizer.json (default: the embedded Qwen3 tokenizer)")
        p.add_argument("--json", action="store_true", help="print the result as JSON")
        p.add_argument("--key-file", metavar="K", default=None,
                       help="key file of SM4-encrypted VQF files (default: $KESTREL_KEY_FILE; "
                            "`kestrel-lab vqf keygen`)")
    ppl.set_defaults(func=_ppl)
    kl.set_defaults(func=_kl)


def _tokens(args):
    from kestrel_lab import eval as E
    from kestrel_lab.engine.generate import ENDOFTEXT
    from kestrel_lab.vocab import Tokenizer

    if args.fortunes:
        path = E.fortunes_path(args.fortunes)
        if path is None:
            raise ValueError(f"{E.FORTUNES_DIR / args.fortunes}: no such fortunes-zh file "
                             f"(apt-get install fortunes-zh, or give --text)")
    else:
        path = args.text
    tok = Tokenizer.from_files(args.tokenizer_json) if args.tokenizer_json else Tokenizer.default()
    return str(path), E.encode_entries(E.read_fortunes(path), tok, ENDOFTEXT, args.max_tokens)


def _engine(path: str, context: int, args):
    """The engine of one VQF file, opened with ``--key-file`` when it is encrypted."""
    from kestrel_lab.engine.model import Qwen3Engine

    return Qwen3Engine.from_vqf(path, max_context=context, key_file=args.key_file)


def _ppl(args) -> int:
    from kestrel_lab import eval as E

    where, ids = _tokens(args)
    r = E.perplexity(_engine(args.vqf, args.window, args), ids, args.window, args.stride)
    out = {"vqf": args.vqf, "text": where, "tokens": int(ids.size), "scored": r.scored, "windows": r.windows,
           "window": r.window, "stride": r.stride, "mean_nll": r.mean_nll, "ppl": r.ppl}
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print(f"{args.vqf}: perplexity {r.ppl:.4g} (mean NLL {r.mean_nll:.4f} nat) on {r.scored} tokens of {where}, "
              f"{r.windows} windows of {r.window}, stride {r.stride}")
    return 0


def _kl(args) -> int:
    from kestrel_lab import eval as E

    where, ids = _tokens(args)
    r = E.kl_top1(_engine(args.vqf, ids.size, args), _engine(args.f32_vqf, ids.size, args), ids)
    out = {"vqf": args.vqf, "f32_vqf": args.f32_vqf, "text": where, "positions": int(ids.size),
           "kl_mean": r.kl_mean, "kl_max": r.kl_max, "top1_agreement": r.top1_agreement}
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print(f"{args.vqf} vs {args.f32_vqf}: mean KL {r.kl_mean:.3e} nat (max {r.kl_max:.3e}), "
              f"top-1 agreement {r.top1_agreement:.1%} over {ids.size} positions of {where}")
    return 0
