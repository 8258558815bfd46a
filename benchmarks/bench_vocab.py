#!/usr/bin/env python3
"""Encode throughput of the four encoders on the same ≥1 MB mixed corpus, side by side.

    .venv/bin/python benchmarks/bench_vocab.py [--min-mb 1] [--repeat 3] [--tokenizer-json P] [--vocab-bin P]

Greedy (the engine's encoder: numba trie over vocab.bin), the reference BPE (Python), HF tokenizers
and tiktoken, all single-threaded, on the corpus of kestrel_lab.vocab.corpus (Sphinx translations in
13 languages, Sphinx's Python code, the poem model's text; nothing downloaded). Prints MB/s encoding
the corpus as one text and one document per call, each relative to tiktoken in the same run; then
greedy-vs-BPE disagreement by language.
"""
import argparse
import os
import sys
import unicodedata

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from kestrel_lab import machine
from kestrel_lab.vocab.bench import (disagreement_by_language, encoder_functions, throughput,
                                     throughput_docs)
from kestrel_lab.vocab.corpus import corpus_text, mixed_corpus


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--min-mb", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tokenizer-json")
    ap.add_argument("--vocab-bin")
    ap.add_argument("--no-disagreement", action="store_true")
    args = ap.parse_args(argv)
    docs = mixed_corpus(int(args.min_mb * (1 << 20)))
    text = unicodedata.normalize("NFC", corpus_text(docs))
    print(f"machine: {machine.describe(machine.fingerprint())}")
    print(f"corpus: {len(docs):,} documents, {len(text.encode()):,} bytes (NFC)")
    encs = encoder_functions(args.tokenizer_json, args.vocab_bin)
    rows = throughput(text, encs, repeat=args.repeat)
    per_doc = throughput_docs([unicodedata.normalize("NFC", d.text) for d in docs], encs, repeat=args.repeat)
    ref = next((r for r in rows if r.name == "tiktoken"), None)
    ref_d = next((r for r in per_doc if r.name == "tiktoken"), None)
    print(f"\n{'encoder':<26} {'whole text':>11} {'vs tiktoken':>12} {'per doc':>9} {'vs tiktoken':>12} {'tokens':>9}")
    print(f"{'':<26} {'MB/s':>11} {'':>12} {'MB/s':>9}")
    for r, d in zip(rows, per_doc):
        rel = f"{r.mb_per_s / ref.mb_per_s:.2f}x" if ref else "-"
        rel_d = f"{d.mb_per_s / ref_d.mb_per_s:.2f}x" if ref_d else "-"
        print(f"{r.name:<26} {r.mb_per_s:>11.2f} {rel:>12} {d.mb_per_s:>9.2f} {rel_d:>12} {r.tokens:>9,}")
    if not args.no_disagreement:
        from kestrel_lab.vocab.tokenizer import Tokenizer

        bpe = Tokenizer.from_files(args.tokenizer_json, args.vocab_bin, encoder="bpe")
        greedy = Tokenizer.from_files(args.tokenizer_json, args.vocab_bin, encoder="greedy")
        print(f"\n{'lang':<6} {'docs':>6} {'docs≠':>7} {'BPE tok':>9} {'greedy tok':>11} {'tok≠':>7}")
        for d in disagreement_by_language(docs, bpe, greedy):
            print(f"{d.lang:<6} {d.docs:>6} {d.doc_rate:>7.1%} {d.bpe_tokens:>9,} {d.greedy_tokens:>11,} "
                  f"{d.token_rate:>7.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
