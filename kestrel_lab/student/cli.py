"""``kestrel-lab student init | check | notebooks``: the student's engine, its checks, the lessons without answers.

Taught in day30_1.
"""
from __future__ import annotations

import argparse
from pathlib import Path

DEFAULT_WORKSPACE = "~/kestrel-student"   # where ``student init`` makes the workspace when no DIR is given


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``kestrel-lab student …`` to the command line."""
    st = sub.add_parser("student", help="your own engine: make the workspace, check its pieces, "
                                        "write the lessons without their answers")
    act = st.add_subparsers(dest="student_command", metavar="ACTION", required=True)

    i = act.add_parser("init", help="make (or complete) the workspace: mykestrel/ with one skeleton per piece; "
                                    "never overwrites what you wrote")
    i.add_argument("dir", nargs="?", default=DEFAULT_WORKSPACE,
                   help=f"the workspace folder (default {DEFAULT_WORKSPACE})")
    i.add_argument("--no-config", action="store_true",
                   help="do not record the folder in ~/.config/kestrel_lab/student.json (use KESTREL_STUDENT instead)")
    i.set_defaults(func=_init)

    c = act.add_parser("check", help="run every piece you wrote where it matters and compare it with the package; "
                                     "exits 1 when a piece fails")
    which = c.add_mutually_exclusive_group()
    which.add_argument("--all", action="store_true",
                       help="every piece, then your engine pieces together on the golden tokens (the default)")
    which.add_argument("--day", metavar="D", help="only the pieces taught on these days, e.g. 17 or 16-18")
    which.add_argument("--piece", metavar="P", action="append",
                       help="only this piece (e.g. quant.dequantize_q4_0) or module (e.g. quant); repeatable")
    c.add_argument("--full", action="store_true",
                   help="run the golden files to their last token (default: the first tokens, a few seconds each)")
    c.add_argument("--workspace", metavar="W", default=None,
                   help="the workspace to check (default: KESTREL_STUDENT or the one `student init` recorded)")
    c.set_defaults(func=_check)

    n = act.add_parser("notebooks", help="write the lessons without their reference solutions and answers, "
                                         "pointed at your workspace")
    n.add_argument("dir", nargs="?", type=Path, default=None,
                   help="where to write them, as notebooks/dayDD/ (default: <workspace>/notebooks)")
    n.add_argument("--workspace", metavar="W", default=None,
                   help="the workspace the exercise checks use (default: KESTREL_STUDENT or the one `student init` "
                        "recorded)")
    n.add_argument("--days", help="only these days, e.g. 1-5 or 8,9 (default: every written lesson)")
    n.add_argument("--book-url", metavar="URL", default=None,
                   help="the book the answers point to: a URL or a folder (default: this checkout's _build/html/, "
                        "built by `make book`)")
    n.set_defaults(func=_notebooks)


def _init(args) -> int:
    from kestrel_lab import seam
    from kestrel_lab.student import workspace

    try:
        print(workspace.init(Path(args.dir).expanduser(), write_config=not args.no_config).summary())
    except seam.WorkspaceError as e:
        print(f"kestrel-lab student init: {e}")
        return 1
    return 0


def _check(args) -> int:
    from kestrel_lab import seam
    from kestrel_lab.book import selection
    from kestrel_lab.student import checks

    try:
        ws = seam.workspace(Path(args.workspace).expanduser() if args.workspace else None)
        if ws is None:
            print("kestrel-lab student check: no workspace configured (make one with `kestrel-lab student init`, "
                  f"or name one with --workspace or {seam.ENV})")
            return 1
        days = selection.parse_days(args.day) if args.day else None
        keys = checks.select(pieces=args.piece, days=days)
    except (seam.WorkspaceError, selection.RunnerError, KeyError) as e:
        print(f"kestrel-lab student check: {e}")
        return 1
    print(f"workspace {ws.root}: checking {len(keys)} of {len(seam.PIECES)} pieces")
    print(checks.HEAD)
    rows = checks.run(ws, keys, full=args.full, log=lambda line: print(line, flush=True))
    print(checks.summary(rows))
    return 1 if any(r.status == checks.FAILS for r in rows) else 0


def _notebooks(args) -> int:
    from kestrel_lab import seam
    from kestrel_lab.book import selection
    from kestrel_lab.student.notebooks import write_student_notebooks

    ids = None
    if args.days:
        ids = list(selection.select_notebooks(days=selection.parse_days(args.days)))
    try:
        report = write_student_notebooks(args.dir, workspace=args.workspace, notebooks=ids, book_url=args.book_url)
    except seam.WorkspaceError as e:
        print(f"kestrel-lab student notebooks: {e}")
        return 1
    print(report.summary())
    print(f"open them: jupyter lab {report.out_dir}")
    return 0
