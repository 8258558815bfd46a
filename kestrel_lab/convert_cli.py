"""The convert wing's commands: ``kestrel-lab convert`` (HF folder → VQF) and ``kestrel-lab tiny-model``
(a deterministic random HF checkpoint with a real architecture).

The wing is the modules ``convert``, ``tiny_model`` and ``safetensors``, not a folder, so its commands
live here, in ``convert_cli.py`` (see ``kestrel_lab.cli``). The lessons (day17_1, day15_2) call
``kestrel_lab.convert`` and ``kestrel_lab.tiny_model`` directly; these are their command-line faces.
"""
from __future__ import annotations

import argparse
import json
import sys


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``kestrel-lab convert`` and ``kestrel-lab tiny-model``."""
    from kestrel_lab.vqf.layout import QUANTS

    conv = sub.add_parser("convert", help="convert a Hugging Face checkpoint folder to one VQF file",
                          description="Stream config.json + safetensors (single or sharded, bf16/f16/f32) into a "
                                      "VQF file: text matrices in --quant, embedding F16, norms F32, vision "
                                      "matrices Q8_0.")
    conv.add_argument("hf_dir", help="folder with config.json and model.safetensors (or an index + shards)")
    conv.add_argument("-o", "--output", required=True, help="VQF file to write (atomically)")
    conv.add_argument("--quant", default="q4_0", choices=QUANTS, help="qtype of the text matrices (default q4_0)")
    conv.add_argument("--no-hash", action="store_true",
                      help="do not record the SHA-256 of the weight files (saves one read of them)")
    conv.add_argument("--name", help="source model name for the signature block (default: the folder name)")
    conv.add_argument("-q", "--quiet", action="store_true", help="no progress line")
    conv.add_argument("--json", action="store_true", help="print the report as JSON")
    conv.set_defaults(func=_convert)

    tiny = sub.add_parser("tiny-model",
                          help="write a deterministic random HF checkpoint (Qwen3, Qwen3-MoE or Qwen3-VL)",
                          description="Real architecture and config.json, small shapes by default, random "
                                      "weights from --seed: the same arguments give the same bytes.")
    tiny.add_argument("out_dir", help="folder to write config.json and the safetensors into")
    tiny.add_argument("--arch", default="qwen3", choices=("qwen3", "qwen3_moe", "qwen3_vl", "qwen2"))
    tiny.add_argument("--seed", type=int, default=0)
    tiny.add_argument("--config", help="config.json fields to override: a JSON object or a JSON file "
                                       "(nested objects such as text_config merge key by key)")
    tiny.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    tiny.add_argument("--style", default="hf5", choices=("hf5", "hf4"),
                      help="config.json style: hf5 = rope_parameters (transformers 5), hf4 = rope_theta/rope_scaling")
    tiny.add_argument("--max-shard-mb", type=float,
                      help="split into shards of at most this many MB, with model.safetensors.index.json")
    tiny.set_defaults(func=_tiny)


def _convert(args) -> int:
    from kestrel_lab.convert import convert

    rep = convert(args.hf_dir, args.output, args.quant, hash_source=not args.no_hash,
                  progress=None if args.quiet or args.json else True, model_name=args.name)
    if rep.ignored and not args.quiet:   # once, on stderr: keys config_fields does not read (never guessed at)
        print(f"config.json: keys not read (the config table has no row for them; book/formats/vqf.md): "
              f"{', '.join(rep.ignored)}", file=sys.stderr)
    if args.json:
        print(json.dumps({"output": str(rep.output), "quant": rep.quant, "n_tensors": rep.n_tensors,
                          "output_bytes": rep.output_bytes, "source_bytes": rep.source_bytes,
                          "bytes_read": rep.bytes_read, "seconds": round(rep.seconds, 4),
                          "mb_per_s": round(rep.mb_per_s, 2), "hash_seconds": round(rep.hash_seconds, 4),
                          "sha256": rep.sha256, "source_sha256": rep.sha256,
                          "output_sha256": rep.output_sha256, "rss_start": rep.rss_start, "rss_peak": rep.rss_peak,
                          "unused_source_tensors": rep.unused, "ignored_config_keys": rep.ignored}, indent=1))
    else:
        print(rep.summary())
        if rep.unused:
            print(f"  source tensors not used by any entry: {', '.join(rep.unused)}")
    return 0


def _tiny(args) -> int:
    from kestrel_lab.safetensors import open_checkpoint
    from kestrel_lab.tiny_model import load_overrides, make_tiny_model

    out = make_tiny_model(args.out_dir, args.arch, args.seed, load_overrides(args.config), args.dtype, args.style,
                          max_shard_bytes=int(args.max_shard_mb * 1e6) if args.max_shard_mb else None)
    with open_checkpoint(out) as ck:
        n_params = sum(t.numel for t in ck.tensors.values())
        print(f"{out}: {args.arch}, {len(ck.tensors)} tensors, {n_params:,} parameters, "
              f"{ck.nbytes():,} bytes in {len(ck.files)} file(s), seed {args.seed}")
    return 0
