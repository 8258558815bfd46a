"""The book's commands: ``book sources | links | sweep-cache | report``, ``measurements``, ``runner-info``, and the
board re-run loop — ``rerun``, ``import-measurements``, ``export-measurements`` and ``dashboard``.

Taught in day28_1 (the book's sources). The lessons on re-runs and the dashboard call those modules directly.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    """Add the book's commands to ``kestrel-lab``. Taught in day28_1."""
    from kestrel_lab.book.rerun import DEFAULT_QUIET_WAIT_S, DEFAULT_TIMEOUT_S

    _register_book(sub)

    meas = sub.add_parser("measurements", help="show a notebook's measured figures across runners")
    meas.add_argument("notebook", help="notebook id, e.g. day02_3")
    meas.set_defaults(func=_measurements)

    info = sub.add_parser("runner-info", help="print this machine's fingerprint (as recorded with figures)")
    info.add_argument("--json", action="store_true", help="print the JSON recorded in provenance")
    info.add_argument("--cpus", default=None, metavar="SET",
                      help="the CPUs whose governors to check: big (default: what the engine uses), little, all "
                           "or a list such as 4-7")
    info.set_defaults(func=_runner_info)

    rr = sub.add_parser(
        "rerun", help="execute notebooks with papermill and record their figures for a runner",
        description="Execute notebooks with papermill into runs/<runner>/<UTC time>/ and publish each "
                    "notebook's figures into data/measurements/<runner>/. Re-running the same command "
                    "resumes the latest unfinished run folder, skipping notebooks done there.")
    rr.add_argument("--runner", required=True, help="runner label, e.g. rk3588-a76 or ci-check")
    sel = rr.add_mutually_exclusive_group()
    sel.add_argument("--days", help="days to run, e.g. 16-18 or 1,3,5-7 (default: every written notebook)")
    sel.add_argument("--notebooks", help="notebook ids, e.g. day16_3,day18_2")
    rr.add_argument("-p", "--parameter", nargs=2, action="append", metavar=("KEY", "VALUE"),
                    help="a papermill parameter for every notebook, e.g. -p quick false "
                         "-p vqf_path /mnt/emmc/Modl/Qwen3-VL-2B-Instruct/model.vqf (repeatable)")
    rr.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                    help=f"seconds a notebook may run (default {DEFAULT_TIMEOUT_S})")
    rr.add_argument("--jobs", type=int, default=1,
                    help="notebooks at a time (default 1: measurements want a quiet machine, and each "
                         "notebook may hold up to 2 GiB)")
    rr.add_argument("--cpus", help="pin the notebooks to these CPUs: big (the fastest cluster: an RK3588's A76), "
                                   "little, all, or a list such as 4-7; sets NUMBA_NUM_THREADS to their count")
    rr.add_argument("--quiet-load", type=float, metavar="L",
                    help="before each notebook, wait until the 1-minute load average is at most L (read every "
                         "few seconds), e.g. half the CPU count; the load it started at, and whether it waited "
                         "or gave up waiting, go into run.json and the figures' provenance (rerun.quiet)")
    rr.add_argument("--quiet-wait", type=float, metavar="S",
                    help=f"with --quiet-load: wait at most S seconds, then start anyway and say so "
                         f"(default {DEFAULT_QUIET_WAIT_S})")
    rr.add_argument("--keep-going", action="store_true", help="run the other notebooks after a failure")
    rr.add_argument("--force", action="store_true", help="re-run notebooks already done in the run folder")
    rr.add_argument("--new-run", action="store_true", help="start a new run folder instead of resuming")
    rr.add_argument("--allow-dirty", action="store_true",
                    help="run and publish even though the checkout has uncommitted changes (figures from "
                         "such a tree cannot be reproduced; each published file records allow_dirty: true)")
    rr.add_argument("--run-dir", type=Path, help="use (or resume) this run folder")
    rr.add_argument("--runs-root", type=Path, help="where run folders go (default: runs/ in the checkout)")
    rr.add_argument("--root", type=Path, help=argparse.SUPPRESS)  # tests: a tree with notebooks/
    rr.set_defaults(func=_rerun)

    im = sub.add_parser("import-measurements",
                        help="install a runner's figures from an archive, after validating every file")
    im.add_argument("archive", type=Path, help=".tar.gz, .tar, .zip or a folder of dayDD_P.json files")
    im.add_argument("--runner", required=True, help="the runner the files must claim")
    im.add_argument("--dry-run", action="store_true", help="validate only")
    im.set_defaults(func=_import)

    ex = sub.add_parser("export-measurements", help="pack data/measurements/<runner>/ into a .tar.gz")
    ex.add_argument("--runner", required=True)
    ex.add_argument("-o", "--output", type=Path,
                    help="archive path (default: kestrel-measurements-<runner>-<time>.tar.gz)")
    ex.set_defaults(func=_export)

    db = sub.add_parser("dashboard", help="regenerate book/dashboard.md: every runner's figures and plots")
    db.add_argument("--check", action="store_true", help="fail if book/dashboard.md is out of date")
    db.add_argument("--include-local", action="store_true",
                    help="also show data/measurements/local/ (machine-specific, not committed)")
    db.set_defaults(func=_dashboard)


def _register_book(sub: argparse._SubParsersAction) -> None:
    """``kestrel-lab book sources | links | sweep-cache | report``."""
    book = sub.add_parser("book", help="generate the book's table of contents and syllabus page")
    book_sub = book.add_subparsers(dest="book_command", metavar="ACTION", required=True)
    src = book_sub.add_parser("sources", help="regenerate _toc.yml, book/syllabus.md and the generated "
                                                 "tables of book/contributing.md and book/student.md")
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
    rep = book_sub.add_parser("report", help="after a build: each notebook's seconds and peak RSS, flagged "
                                               "over 60 s or 2 GiB (run by `make book`)")
    rep.add_argument("--cache", default="_build/.jupyter_cache", help="jupyter-cache folder")
    rep.set_defaults(func=_book_report)


def _book_sources(args) -> int:
    from kestrel_lab.book import sources
    from kestrel_lab.paths import REPO_ROOT

    if args.check:
        stale = [p for p, text in sources.generated_sources() if p.read_text(encoding="utf-8") != text]
        for p in stale:
            print(f"{p.relative_to(REPO_ROOT)} is out of date: run `kestrel-lab book sources`")
        return 1 if stale else 0
    for path in sources.write_sources():
        print(f"wrote {path}")
    return 0


def _book_links(args) -> int:
    from pathlib import Path

    from kestrel_lab.book import links
    from kestrel_lab.paths import REPO_ROOT

    pages = [Path(p).resolve().relative_to(REPO_ROOT) for p in args.pages] or links.prose_pages()
    if args.fix:
        for page in pages:
            if links.fix_page(page):
                print(f"fixed {page}")
    found = [p for page in pages for p in links.page_problems(page)]
    for p in found:
        print(p)
    return 1 if found else 0


def _book_sweep_cache(args) -> int:
    from pathlib import Path

    from kestrel_lab import syllabus
    from kestrel_lab.book import cache as bookcache
    from kestrel_lab.paths import REPO_ROOT

    notebooks = [REPO_ROOT / p for p in syllabus.find_notebooks().values()]
    cache = Path(args.cache) if Path(args.cache).is_absolute() else REPO_ROOT / args.cache
    dropped = bookcache.sweep(cache, notebooks, bookcache.Project(REPO_ROOT))
    for nb in dropped:
        print(f"inputs changed, will re-run: {nb.relative_to(REPO_ROOT)}")
    print(f"book cache: {len(dropped)} of {len(notebooks)} notebooks to re-run because their inputs changed")
    return 0


def _book_report(args) -> int:
    from kestrel_lab.book.report import build_report
    from kestrel_lab.paths import REPO_ROOT

    cache = Path(args.cache) if Path(args.cache).is_absolute() else REPO_ROOT / args.cache
    print(build_report(REPO_ROOT, cache))
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

    fp = machine.fingerprint(probe_threading=True, cpus=list(machine.resolve_cpus(args.cpus).cpus))
    print(json.dumps(fp, indent=1, ensure_ascii=False) if args.json else machine.describe(fp))
    return 0


def _rerun(args) -> int:
    from kestrel_lab.book import selection
    from kestrel_lab.book.rerun import DEFAULT_QUIET_WAIT_S, QuietGate, rerun
    from kestrel_lab.book.selection import RunnerError
    from kestrel_lab.book.runs import OK
    from kestrel_lab.paths import REPO_ROOT

    root = args.root or REPO_ROOT
    days = selection.parse_days(args.days) if args.days else None
    ids = [s for s in args.notebooks.split(",") if s.strip()] if args.notebooks else None
    notebooks = selection.select_notebooks(root, days=days, ids=ids)
    cpus = selection.parse_cpus(args.cpus) if args.cpus else None
    if args.quiet_wait is not None and args.quiet_load is None:
        raise RunnerError("--quiet-wait needs --quiet-load (the load average to wait for)")
    quiet = (QuietGate(args.quiet_load, DEFAULT_QUIET_WAIT_S if args.quiet_wait is None else args.quiet_wait)
             if args.quiet_load is not None else None)
    results, folder = rerun(args.runner, notebooks, params=selection.parse_parameters(args.parameter),
                               timeout=args.timeout, jobs=args.jobs, cpus=cpus, keep_going=args.keep_going,
                               force=args.force, runs_root=args.runs_root or root / "runs",
                               run_dir=args.run_dir, new_run=args.new_run, allow_dirty=args.allow_dirty,
                               quiet=quiet)
    from kestrel_lab.paths import measurements_dir

    ok = all(r.status == OK for r in results)
    print(f"figures: {measurements_dir() / args.runner}/ (commit them, or `kestrel-lab export-measurements "
          f"--runner {args.runner}`); executed notebooks and logs: {folder.path}/")
    if not ok:
        print("re-run the same command to resume: notebooks done in that run folder are skipped")
    return 0 if ok else 1


def _import(args) -> int:
    from kestrel_lab import measure
    from kestrel_lab.book.archive import import_measurements

    targets = import_measurements(args.archive, args.runner, dry_run=args.dry_run)
    verb = "would install" if args.dry_run else "installed"
    for t in targets:
        doc = measure.load_file(t) if not args.dry_run else None
        when = f" (measured {doc['provenance']['date'][:10]})" if doc else ""
        print(f"{verb} {t}{when}")
    return 0


def _export(args) -> int:
    from kestrel_lab.book.archive import export_measurements

    path = export_measurements(args.runner, args.output)
    print(f"wrote {path}: send it to the instructor (`kestrel-lab import-measurements {path.name} "
          f"--runner {args.runner}`)")
    return 0


def _dashboard(args) -> int:
    from kestrel_lab.book import dashboard

    if args.check:
        stale = dashboard.is_stale(include_local=args.include_local)
        if stale:
            print(f"{dashboard.PAGE} is out of date: run `kestrel-lab dashboard`")
        return 1 if stale else 0
    path, changed = dashboard.write(include_local=args.include_local)
    print(f"{'wrote' if changed else 'unchanged'} {path}")
    return 0
