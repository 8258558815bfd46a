"""VQF: the engine's single-file weight format (version 2).

One file holds a model's configuration, a signature block saying where the weights came from, a
directory of 64-byte entries (name, qtype, rows, cols, offset, bytes) and the tensors themselves,
each 64-byte aligned in a page-aligned data area, followed by an FNV-1a 64 checksum (or, in an
SM4-encrypted file, a 32-byte HMAC-SM3 tag). The layout of
every byte is in ``format`` (and, generated from it, book/formats/vqf.md).

- ``format``   — the byte layout: header, model configuration, VQFSig, flags, directory entries.
- ``layout``   — which tensors a model has, in which order, built from which HF tensors (``plan``).
- ``planner``  — offsets and sizes of a planned file, without weights (``kestrel-lab vqf plan``).
- ``writer``   — ``VQFWriter``: streams tensors into a file, checksum included, atomically.
- ``reader``   — ``open_vqf``: mmap, checks, zero-copy numpy views by name; ``verify_file``.
- ``checksum`` — FNV-1a 64 in numba, over the article's exact byte range.
- ``inspect``  — the article's parser, its five assertions and an ``od``-style dump.
- ``spec``     — the generated tables of book/formats/vqf.md (``kestrel-lab vqf spec``).
- ``synth``    — seeded random-weight files of any real layout, for lessons and tests.
- ``protect``  — weight protection: key files, HKDF-SM3, SM4-CTR at any offset, the HMAC-SM3 tag.
- ``encrypt``  — whole files: ``encrypt_file`` / ``decrypt_file`` / ``verify_file`` and what they cost.
- ``cli``      — ``kestrel-lab vqf plan | inspect | verify | dump | spec | keygen | encrypt | decrypt``.

Taught in day16_1, day16_2 and day16_3.
"""
