"""The ``kestrel-lab`` command: the wings of the package, each registering its own commands.

One convention: every wing has a ``cli`` module exposing ``register(subparsers)``, which adds its
parsers and sets ``func`` (called with the parsed arguments, returning an exit code). A wing that is
a folder keeps it in ``<wing>/cli.py``; a wing that is a set of top-level modules keeps it in
``<wing>_cli.py`` beside them. This file only lists the wings. Taught in day13_1 and day14_2.
"""
from __future__ import annotations

import argparse
import importlib
import sys

# The wings' command modules, in the order ``--help`` lists them.
COMMAND_MODULES = [
    "kestrel_lab.book.cli",  # book sources/links/sweep-cache, measurements, runner-info, rerun,
    #                          import-measurements, export-measurements, dashboard
    "kestrel_lab.vocab.cli",  # vocab: tokenizer.json, compile, check, inspect, encode, probes
    "kestrel_lab.vqf.cli",  # vqf plan, inspect, verify, dump, spec
    "kestrel_lab.convert_cli",  # convert, tiny-model
    "kestrel_lab.engine.cli",  # generate, chat, bench, golden
    "kestrel_lab.eval_cli",  # eval ppl, eval kl
    "kestrel_lab.student.cli",  # student init, check, notebooks
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kestrel-lab",
        description="Kestrel Lab: the workbook tools of the Qwen inference-engine course.",
    )
    from kestrel_lab import __version__

    parser.add_argument("--version", action="version", version=f"kestrel-lab {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0 if args.command is None else 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (OSError, ValueError) as e:  # format and I/O errors carry their own file/field/offset
        print(f"kestrel-lab {args.command}: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
