"""Workbook-wide commands: the book's generated sources, measurements, and the machine's fingerprint."""
from __future__ import annotations

import argparse
import json


def register(sub: argparse._SubParsersAction) -> None:
    book = sub.add_parser("book", help="generate the book's table of contents and syllabus page")
    book_sub = book.add_subparsers(dest="book_command", metavar="ACTION", required=True)
    src = book_sub.add_parser("sources", help="regenerate _toc.yml and book/syllabus.md")
    src.add_argument("--check", action="store_true", help="fail if they are out of date instead")
    src.set_defaults(func=_book_sources)
    links = book_sub.add_parser("links", help="check (or --fix) every mention of another part: a link, "
                                                "or 「计划中」 when the part is not written")
    links.add_argument("pages", nargs="*", help="notebooks or book pages (default: all prose pages)")
    links.add_argument("--fix", action="store_true", help="rewrite bare mentions in place")
    links.set_defaults(func=_book_links)
    sweep = book_sub.add_parser("sweep-cache", help="drop cached outputs of notebooks whose package or "
                                                     "data inputs changed (run before jupyter-book build)")
    sweep.add_argument("--cache", default="_build/.jupyter_cache", help="jupyter-cache folder")
    sweep.set_defaults(func=_book_sweep_cache)

    golden = sub.add_parser("golden", help="golden files: the token ids each quantization must produce")
    golden_sub = golden.add_subparsers(dest="golden_command", metavar="ACTION", required=True)
    for action, what in (("check", "replay the committed golden file and report mismatches"),
                         ("update", "regenerate the golden file from this engine and show what changed")):
        g = golden_sub.add_parser(action, help=what)
        g.add_argument("--model", default="qwen3-tiny-poem", help="an embedded model under data/models/")
        g.add_argument("--quant", action="append", choices=("f32", "f16", "q8_0", "q4_0"),
                       help="only this quantization (repeatable; default all)")
        g.set_defaults(func=_golden_check if action == "check" else _golden_update)

    meas = sub.add_parser("measurements", help="show a notebook's measured figures across runners")
    meas.add_argument("notebook", help="notebook id, e.g. day02_3")
    meas.set_defaults(func=_measurements)

    info = sub.add_parser("runner-info", help="print this machine's fingerprint (as recorded with figures)")
    info.add_argument("--json", action="store_true", help="print the JSON recorded in provenance")
    info.set_defaults(func=_runner_info)


def _book_sources(args) -> int:
    from kestrel_lab import syllabus

    if args.check:
        stale = [p for p, text in syllabus.generated_sources() if p.read_text(encoding="utf-8") != text]
        for p in stale:
            print(f"{p.relative_to(syllabus.REPO_ROOT)} is out of date: run `kestrel-lab book sources`")
        return 1 if stale else 0
    for path in syllabus.write_sources():
        print(f"wrote {path}")
    return 0


def _book_links(args) -> int:
    from pathlib import Path

    from kestrel_lab import booklinks
    from kestrel_lab.paths import REPO_ROOT

    pages = [Path(p).resolve().relative_to(REPO_ROOT) for p in args.pages] or booklinks.prose_pages()
    if args.fix:
        for page in pages:
            if booklinks.fix_page(page):
                print(f"fixed {page}")
    found = [p for page in pages for p in booklinks.page_problems(page)]
    for p in found:
        print(p)
    return 1 if found else 0


def _book_sweep_cache(args) -> int:
    from pathlib import Path

    from kestrel_lab import bookcache, syllabus
    from kestrel_lab.paths import REPO_ROOT

    notebooks = [REPO_ROOT / p for p in syllabus.find_notebooks().values()]
    cache = Path(args.cache) if Path(args.cache).is_absolute() else REPO_ROOT / args.cache
    dropped = bookcache.sweep(cache, notebooks, bookcache.Project(REPO_ROOT))
    for nb in dropped:
        print(f"inputs changed, will re-run: {nb.relative_to(REPO_ROOT)}")
    print(f"book cache: {len(dropped)} of {len(notebooks)} notebooks to re-run because their inputs changed")
    return 0


def _golden_check(args) -> int:
    from kestrel_lab import golden

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

    for line in golden.update(args.model, tuple(args.quant or golden.QUANTS)):
        print(line)
    print(f"wrote {golden.golden_path(args.model)}")
    return 0


def _measurements(args) -> int:
    from kestrel_lab import measure

    table = measure.compare(args.notebook)
    if not len(table):
        print(f"no figures recorded for {args.notebook}")
        return 1
    print(table.to_markdown())
    return 0


def _runner_info(args) -> int:
    from kestrel_lab import machine

    fp = machine.fingerprint(probe_threading=True)
    print(json.dumps(fp, indent=1, ensure_ascii=False) if args.json else machine.describe(fp))
    return 0
