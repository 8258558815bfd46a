"""``kestrel-lab vqf plan | inspect | verify | dump | spec | keygen | encrypt | decrypt``: the VQF tools.

``keygen``, ``encrypt``, ``decrypt`` and ``verify --key-file`` are the weight-protection commands
(``vqf.protect``, ``vqf.encrypt``); ``--key-file`` defaults to the ``KESTREL_KEY_FILE`` variable.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SPEC_PAGE = Path(__file__).resolve().parents[2] / "book" / "formats" / "vqf.md"


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``kestrel-lab vqf …`` to the command line (day16_3 calls the modules behind it directly)."""
    vqf = sub.add_parser("vqf", help="plan, inspect, verify and dump VQF weight files")
    act = vqf.add_subparsers(dest="vqf_command", metavar="ACTION", required=True)

    p = act.add_parser("plan", help="a model's VQF layout from its config.json alone (no weights)")
    p.add_argument("config", help="config.json (or a model folder holding one)")
    p.add_argument("--quant", default="q4_0", help="f32 | f16 | q8_0 | q4_0 | q4_8x8l (default q4_0)")
    p.add_argument("--json", action="store_true", help="print {data_offset, file_len, file_size, tensors}")
    p.add_argument("--write-header", metavar="OUT", help="also write the planned file's first data_offset bytes")
    p.set_defaults(func=_plan)

    i = act.add_parser("inspect", help="print header and directory, run the article's five assertions")
    i.add_argument("file")
    i.add_argument("--fields", action="store_true", help="also print every header field with its offset")
    i.set_defaults(func=_inspect)

    v = act.add_parser("verify", help="plain file: recompute the FNV-1a 64 over directory + data and compare; "
                                      "encrypted file: check its HMAC-SM3 tag (needs --key-file)")
    v.add_argument("file")
    v.add_argument("--key-file", metavar="K", default=None,
                   help="key file of an encrypted file (default: $KESTREL_KEY_FILE)")
    v.add_argument("--config", metavar="CONFIG", default=None,
                   help="also compare the header's model configuration (which no checksum covers) with this "
                        "config.json (or model folder), field by field")
    v.set_defaults(func=_verify)

    k = act.add_parser("keygen", help="write a new random SM4 key file (32 hex characters, mode 0600)")
    k.add_argument("-o", "--output", required=True, metavar="K", help="the key file to create (never overwritten)")
    k.set_defaults(func=_keygen)

    for name, what in (("encrypt", "SM4-CTR encrypt a plain VQF file and seal it with an HMAC-SM3 tag"),
                       ("decrypt", "check the tag and decrypt into the original plain VQF file (bit-identical)")):
        e = act.add_parser(name, help=what)
        e.add_argument("file", metavar="IN.vqf")
        e.add_argument("-o", "--output", required=True, metavar="OUT.vqf")
        e.add_argument("--key-file", metavar="K", default=None, help="the key file (default: $KESTREL_KEY_FILE)")
        e.set_defaults(func=_crypt, action=name)

    d = act.add_parser("dump", help="od -A x -t x1 style dump of a directory entry or a byte range")
    d.add_argument("file")
    g = d.add_mutually_exclusive_group(required=True)
    g.add_argument("--entry", type=int, metavar="I", help="directory entry I (bytes 448+64·I …)")
    g.add_argument("--offset", type=int, metavar="N", help="first byte (with --length)")
    d.add_argument("--length", type=int, default=64, metavar="M", help="bytes to dump (default 64)")
    d.set_defaults(func=_dump)

    s = act.add_parser("spec", help="regenerate the generated tables of book/formats/vqf.md")
    s.add_argument("--check", action="store_true", help="fail if the page is out of date instead")
    s.set_defaults(func=_spec)


def _plan(args) -> int:
    from kestrel_lab.vqf.planner import plan_file

    fp = plan_file(args.config, args.quant)
    if args.json:
        print(json.dumps(fp.to_json(), indent=1))
    else:
        print(fp.table())
    if args.write_header:
        out = fp.write_header(args.write_header)
        print(f"wrote {out} ({fp.data_offset:,} bytes: header, VQFSig, directory)",
              file=sys.stderr if args.json else sys.stdout)
    return 0


def _inspect(args) -> int:
    from kestrel_lab.vqf import inspect as I

    p = I.parse(args.file)
    checks = I.assertions(p)
    if args.fields:
        print(I.header_report(p))
    print(I.report(p, checks))
    return 0 if all(c.ok for c in checks) else 1


def _key_file(args):
    from kestrel_lab.vqf.protect import ENV_KEY_FILE, resolve_key_file

    path = resolve_key_file(args.key_file)
    if path is None:
        raise ValueError(f"{args.file}: no key: pass --key-file K or set {ENV_KEY_FILE}")
    return path


def _keygen(args) -> int:
    from kestrel_lab.vqf.protect import key_id, read_key_file, write_key_file

    path = write_key_file(args.output)
    print(f"wrote {path} (mode 0600, key id {key_id(read_key_file(path)).hex()}); keep it off shared storage "
          f"and out of version control")
    return 0


def _crypt(args) -> int:
    from kestrel_lab.vqf.encrypt import decrypt_file, encrypt_file

    fn = encrypt_file if args.action == "encrypt" else decrypt_file
    r = fn(args.file, args.output, _key_file(args))
    print(f"{args.action}ed {args.file} -> {args.output}: {r['bytes']:,} bytes in {r['seconds']:.2f} s "
          f"({r['data_bytes'] / r['seconds'] / 1e6:.0f} MB/s of data area)"
          + (f", key id {r['key_id']}" if "key_id" in r else ""))
    return 0


def _verify(args) -> int:
    import os

    from kestrel_lab.vqf.encrypt import is_encrypted, verify_file as verify_tag
    from kestrel_lab.vqf.reader import open_vqf, verify_file

    if is_encrypted(args.file):
        seconds = verify_tag(args.file, _key_file(args))
        size = os.path.getsize(args.file)
        print(f"tag (HMAC-SM3) match=YES ({seconds:.2f} s, {size / seconds / 1e9:.2f} GB/s)")
        return 0

    with open_vqf(args.file, verify=False) as vf:
        h, config, missing = vf.header, vf.config, list(vf.missing)
        print(f"version={h['version']} n_tensors={h['n_tensors']} data_off={h['data_offset']} "
              f"file_len={h['file_len']} data_bytes={h['file_len'] - h['data_offset']}")
    computed, stored, seconds = verify_file(args.file)
    size = (h["file_len"] - h["data_offset"]) + 64 * h["n_tensors"]
    print(f"computed={computed:016x}\nstored  ={stored:016x}\n"
          f"match={'YES' if computed == stored else 'NO'} ({seconds:.2f} s, {size / seconds / 1e9:.2f} GB/s)")
    ok = _header_report(args, config, missing)
    return 0 if computed == stored and ok else 1


def _header_report(args, config, missing) -> bool:
    """What the checksum does not cover, the header's consistency with the directory, and (``--config``)
    the header's configuration against a config.json."""
    from kestrel_lab.vqf.verify import UNCONFIRMED, compare_config

    print("covers: the directory and the data area (FNV-1a 64); not the header (model configuration, VQFSig, "
          "RoPE block)")
    print("header vs directory: " + ("every entry the configuration implies is present with the implied shape"
                                     if not missing else f"MISSING {len(missing)}: {', '.join(missing[:6])}"))
    if args.config is None:
        print(f"not confirmed by the directory: {', '.join(UNCONFIRMED)} — compare them with --config config.json")
        return not missing
    diffs = compare_config(config, args.config)
    for d in diffs:
        print(f"header vs {args.config}: {d}")
    print(f"header vs {args.config}: " + ("every field matches" if not diffs else f"{len(diffs)} field(s) DIFFER"))
    return not missing and not diffs


def _dump(args) -> int:
    from kestrel_lab.vqf import format as F
    from kestrel_lab.vqf.inspect import entry_fields, od_file

    if args.entry is not None:
        base = F.DIR_OFFSET + F.ENTRY_SIZE * args.entry
        print(od_file(args.file, base, F.ENTRY_SIZE))
        with open(args.file, "rb") as fh:
            fh.seek(base)
            raw = fh.read(F.ENTRY_SIZE)
        if len(raw) < F.ENTRY_SIZE:
            raise ValueError(f"{args.file}: entry {args.entry} at offset {base} is past the end of the file")
        for off, name, hexes, value in entry_fields(raw, base):
            print(f"  0x{off:x}  {name:<7} {hexes:<48} {value}")
    else:
        print(od_file(args.file, args.offset, args.length))
    return 0


def _spec(args) -> int:
    from kestrel_lab.vqf.spec import render, splice

    text = SPEC_PAGE.read_text(encoding="utf-8")
    new = splice(text, render())
    if args.check:
        if new != text:
            print(f"{SPEC_PAGE} is out of date: run `kestrel-lab vqf spec`")
            return 1
        print(f"{SPEC_PAGE} is up to date")
        return 0
    if new != text:
        from kestrel_lab.atomic import atomic_write

        with atomic_write(SPEC_PAGE, "w") as fh:
            fh.write(new)
        print(f"updated {SPEC_PAGE}")
    else:
        print(f"{SPEC_PAGE} already up to date")
    return 0
