"""``kestrel-lab vocab …``: write tokenizer.json, compile vocab.bin, check, inspect, encode, probe.

The lessons (day18_1, day18_2) call the modules behind these commands directly.
"""
from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    vocab = sub.add_parser("vocab", help="tokenizer.json → vocab.bin compiler, loader, encoders, probes")
    vs = vocab.add_subparsers(dest="vocab_command", metavar="ACTION", required=True)

    p = vs.add_parser("tokenizer-json", help="write the embedded Qwen3 tokenizer.json (from qwen.tiktoken)")
    p.add_argument("-o", "--output", required=True, help="where to write tokenizer.json")
    p.set_defaults(func=_tokenizer_json)

    p = vs.add_parser("compile", help="compile tokenizer.json into vocab.bin (article 18-2)")
    p.add_argument("tokenizer_json", nargs="?", help="tokenizer.json (default: the embedded Qwen3 one)")
    p.add_argument("-o", "--output", required=True, help="vocab.bin to write (atomically)")
    p.add_argument("--specials-from", metavar="OLD_VOCAB_BIN",
                   help="copy the added tokens from this vocab.bin instead of added_tokens")
    p.add_argument("--drop-branch", choices=_branches(), help="disable one decode branch (exercise A2)")
    p.set_defaults(func=_compile)

    p = vs.add_parser("check", help="load a vocab.bin with every loader check and summarise it")
    p.add_argument("vocab_bin")
    p.add_argument("--max-entries", type=int, default=None, help="largest N accepted")
    p.add_argument("--id-limit", type=int, default=None, help="token ids must be below this (default N)")
    p.set_defaults(func=_check)

    p = vs.add_parser("inspect", help="show the stored bytes of token ids (exercise A3: 220 198 255 221)")
    p.add_argument("ids", nargs="+", type=int)
    _files(p)
    p.set_defaults(func=_inspect)

    p = vs.add_parser("encode", help="encode text and show the ids")
    p.add_argument("text")
    p.add_argument("--encoder", default="bpe", choices=("bpe", "greedy", "greedy-engine"))
    _files(p)
    p.set_defaults(func=_encode)

    p = vs.add_parser("probes", help="run the 15 probes; with --drop-branch, the broken-branch table")
    p.add_argument("--drop-branch", choices=_branches())
    _files(p)
    p.set_defaults(func=_probes)


def _branches():
    from kestrel_lab.vocab.bytelevel import DECODE_BRANCHES

    return list(DECODE_BRANCHES)


def _files(p):
    p.add_argument("--tokenizer-json", default=None, help="tokenizer.json (default: embedded)")
    p.add_argument("--vocab-bin", default=None, help="vocab.bin (default: compiled from the tokenizer.json)")


def _tokenizer_json(args) -> int:
    from kestrel_lab.vocab.tokenizer_json import write_tokenizer_json

    path = write_tokenizer_json(args.output)
    print(f"wrote {path} ({path.stat().st_size:,} bytes)")
    return 0


def _compile(args) -> int:
    from kestrel_lab.vocab.compiler import compile_vocab

    stats = compile_vocab(args.tokenizer_json, args.output, specials_from=args.specials_from,
                          drop_branch=args.drop_branch)
    print(stats.report())
    print(f"compiled in {stats.seconds:.2f} s")
    return 0


def _check(args) -> int:
    from kestrel_lab.vocab.loader import DEFAULT_MAX_ENTRIES, load_vocab_bin

    vb = load_vocab_bin(args.vocab_bin, max_entries=args.max_entries or DEFAULT_MAX_ENTRIES,
                        id_limit=args.id_limit)
    print(f"{args.vocab_bin}: {vb.n:,} entries, {vb.data.size:,} token bytes, max_len={vb.max_len}: OK")
    return 0


def _inspect(args) -> int:
    from kestrel_lab.vocab.bytelevel import engine_unmap
    from kestrel_lab.vocab.loader import load_vocab_bin
    from kestrel_lab.vocab.tokenizer import default_vocab_bin
    from kestrel_lab.vocab.tokenizer_json import default_tokenizer_json, read_tokenizer_json

    tj = args.tokenizer_json or (None if args.vocab_bin else default_tokenizer_json())
    vb = load_vocab_bin(args.vocab_bin or default_vocab_bin(tj))
    keys = read_tokenizer_json(tj).vocab_keys if tj else []
    for tid in args.ids:
        stored = vb.token(tid)
        line = f"id {tid:>6}"
        if tid < len(keys):
            raw = keys[tid].encode("utf-8")
            verdict = "kept" if raw == stored else "converted"
            line += f"  str {keys[tid]!r:<8} utf-8 {raw.hex():<10} → stored {stored.hex()} ({verdict})"
        else:
            line += f"  stored {stored.hex()} {stored.decode('utf-8', 'replace')!r}"
        line += f"  engine view {engine_unmap(stored).hex()}"
        print(line)
    return 0


def _encode(args) -> int:
    from kestrel_lab.vocab.tokenizer import Tokenizer

    tok = Tokenizer.from_files(args.tokenizer_json, args.vocab_bin, encoder=args.encoder)
    ids = tok.encode(args.text)
    print(" ".join(map(str, ids)))
    print(f"{len(ids)} tokens; " + " | ".join(repr(tok.token_bytes(i).decode("utf-8", "replace")) for i in ids))
    return 0


def _probes(args) -> int:
    from kestrel_lab.vocab.probes import broken_branch_table, load_probes
    from kestrel_lab.vocab.tokenizer import Tokenizer

    if args.drop_branch:
        rows = broken_branch_table(args.drop_branch, args.tokenizer_json, args.vocab_bin)
        print(f"{'probe':<14} {'ids':>4} {'broken':>6} {'1st diff':>8} {'unmatched':>9}  printed via the broken file")
        for r in rows:
            mark = "" if r.encoded_ok and r.printed_ok else "  ✗"
            print(f"{r.probe:<14} {r.good_ids:>4} {r.broken_ids:>6} {str(r.first_diff):>8} "
                  f"{r.unmatched_bytes:>9}  {r.printed!r}{mark}")
        return 0
    bpe = Tokenizer.from_files(args.tokenizer_json, args.vocab_bin, encoder="bpe")
    greedy = Tokenizer.from_files(args.tokenizer_json, args.vocab_bin, encoder="greedy")
    probes = load_probes()
    same = {"bpe": 0, "greedy": 0}
    print(f"{'probe':<14} {'ref':>4} {'bpe':>5} {'greedy':>7}  exercises")
    for p in probes:
        cells = []
        for name, tok in (("bpe", bpe), ("greedy", greedy)):
            ids = tok.encode(p.text)
            ok = tuple(ids) == p.ids
            same[name] += ok
            cells.append(f"{'=' if ok else '≠'}{len(ids)}")
        print(f"{p.name:<14} {len(p.ids):>4} {cells[0]:>5} {cells[1]:>7}  {p.exercises}")
    print(f"equal to the reference ids: bpe {same['bpe']}/{len(probes)}, greedy {same['greedy']}/{len(probes)}")
    return 0 if same["bpe"] == len(probes) else 1
