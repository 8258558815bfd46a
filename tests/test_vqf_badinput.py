"""Malformed VQF files: each is rejected with an error naming the field and its byte offset; a
bounded fuzz test shows that mutations give a clean rejection or a correct load, nothing else."""
from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from kestrel_lab.vqf import format as F
from kestrel_lab.vqf import synth
from kestrel_lab.vqf.reader import open_vqf

E0 = F.DIR_OFFSET  # entry 0


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> bytes:
    path = synth.write_random(tmp_path_factory.mktemp("bad") / "good.vqf", synth.small_vl_config(), seed=1)
    return path.read_bytes()


def _u32(data, off, v):
    struct.pack_into("<I", data, off, v)


def _u64(data, off, v):
    struct.pack_into("<Q", data, off, v)


def _entry(data, i):
    return struct.unpack_from(F.ENTRY_FORMAT, data, E0 + 64 * i)


def _file_len(data):
    return struct.unpack_from("<Q", data, 192)[0]


# Each case: a mutation of the good file's bytes and the error it must produce (regex).
CASES = {
    "truncated_by_one": (lambda d: d[:-1], r"file_len at offset 192: .*truncated"),
    "trailing_bytes": (lambda d: d + b"\0" * 8, r"file_len at offset 192: .*trailing bytes"),
    "truncated_in_directory": (lambda d: d[:E0 + 100], r"n_tensors at offset 12: 41 entries end at byte 3,072, "
                                                       r"past the file's 548 bytes"),
    "shorter_than_header": (lambda d: d[:300], r"file is 300 bytes, shorter than the 448-byte header"),
    "empty": (lambda d: b"", r"file is 0 bytes"),
    "bad_magic": (lambda d: b"GGUF" + d[4:], r"field magic at offset 0: b'GGUF' is not b'VQF\\x00'"),
    "wrong_version": (lambda d: _set(d, _u32, 4, 3), r"field version at offset 4: 3 is not supported"),
    "huge_tensor_count": (lambda d: _set(d, _u32, 12, 0xFFFFFFFF), r"field n_tensors at offset 12: 4,294,967,295 "
                                                                  r"exceeds the format's limit"),
    "count_past_end": (lambda d: _set(d, _u32, 12, 20_000), r"field n_tensors at offset 12: 20,000 entries end"),
    "header_larger_than_file": (lambda d: _set(d, _u64, 184, 1 << 40),
                                r"field data_offset at offset 184: .* past the end of the file"),
    "data_offset_unaligned": (lambda d: _set(d, _u64, 184, 4000),
                              r"data_offset at offset 184: 4,000 is not a multiple"),
    "data_offset_in_directory": (lambda d: _set(d, _u64, 184, 0),
                                 r"data_offset at offset 184: 0 is inside the directory"),
    "file_len_before_data": (lambda d: _set(d, _u64, 192, 8), r"file_len at offset 192: 8 is before data_offset"),
    "unknown_flag": (lambda d: _set(d, _u32, 8, 0x1 | 0x4 | 0x100),
                     r"flags at offset 8: 0x105 sets unknown bits 0x100"),
    "encrypted_flag": (lambda d: _set(d, _u32, 8, 0x7), r"flags at offset 8: ENCRYPTED .* and FNV_TRAILER .* both set"),
    "no_trailer_flag": (lambda d: _set(d, _u32, 8, 0x4), r"flags at offset 8: FNV_TRAILER .* is not set"),
    "vision_flag_inconsistent": (lambda d: _set(d, _u32, 8, 0x1), r"flags at offset 8: VISION \(0x4\) is clear"),
    "repacked_flag_inconsistent": (lambda d: _set(d, _u32, 8, 0xD),
                                   r"flags at offset 8: REPACKED_8X8 .* is set but no"),
    "unknown_arch": (lambda d: _set(d, _u32, 16, 9), r"field arch at offset 16: unknown architecture id 9"),
    "model_bits": (lambda d: _set(d, _u32, 76, 0x80), r"field model_bits at offset 76"),
    "dir_offset": (lambda d: _set(d, _u32, 172, 512), r"field dir_offset at offset 172: 512 must be 448"),
    "rope_type_unknown": (lambda d: _set(d, _u32, 180, 7), r"field rope_type at offset 180: unknown RoPE scaling id 7"),
    "rope_type_linear_empty_block": (lambda d: _set(d, _u32, 180, 1),
                                     r"field rope_attention_factor at offset 436: 0\.0: a linear scaling"),
    "rope_type_yarn_empty_block": (lambda d: _set(d, _u32, 180, 2), r"field rope_factor at offset 432: 0: expected a "
                                                                     r"finite number in \[1, 1024\]"),
    "rope_factor_nan": (lambda d: _set(_set(d, _u32, 180, 2), lambda b, o, v: struct.pack_into("<4f", b, o, *v), 432,
                                       (float("nan"), 1.0, 0.0, 5.0)), r"field rope_factor at offset 432: nan"),
    "sig_magic": (lambda d: d[:200] + b"XSIG" + d[204:], r"field sig_magic at offset 200"),
    "sig_string_unterminated": (lambda d: d[:352] + b"q" * 16 + d[368:],
                                r"field quant at offset 352: not NUL-terminated"),
    "enc_iv_in_plain_file": (lambda d: _set(d, _u32, 400, 5),
                             r"field enc_iv at offset 392: is not zero although ENCRYPTED"),
    "padding_after_sig": (lambda d: d[:440] + b"\x01" + d[441:],
                          r"field RoPE block \(rope_type is 0\) at offset 440: not zero"),
    "padding_before_data": (lambda d: d[:4000] + b"\x01" + d[4001:],
                            r"field padding between directory and data at offset 4000"),
    "name_unterminated": (lambda d: d[:E0] + b"t" * 32 + d[E0 + 32:], r"field entry\[0\].name at offset 448: not NUL"),
    "name_empty": (lambda d: d[:E0] + b"\0" * 32 + d[E0 + 32:], r"entry\[0\].name at offset 448: empty name"),
    "name_bad_utf8": (lambda d: d[:E0] + b"\xff\xfe" + d[E0 + 2:], r"entry\[0\].name at offset 448: not valid UTF-8"),
    "duplicate_name": (lambda d: d[:E0 + 64] + d[E0:E0 + 32] + d[E0 + 96:],
                       r"entry\[1\] \(token_embed\).name at offset 512: duplicate of entry\[0\]"),
    "unknown_qtype": (lambda d: _set(d, _u32, E0 + 32, 7),
                      r"entry\[0\] \(token_embed\).qtype at offset 480: unknown qtype 7"),
    "entry_pad": (lambda d: _set(d, _u32, E0 + 44, 1), r"entry\[0\] \(token_embed\).pad at offset 492"),
    "bytes_inconsistent": (lambda d: _set(d, _u64, E0 + 56, 1024), r"entry\[0\] \(token_embed\).bytes at offset 504: "
                                                                   r"1,024 but F16 320×64 takes 40,960"),
    "cols_not_block": (lambda d: _set(d, _u32, E0 + 64 * 6 + 40, 33), r"entry\[6\] \(q4_q\).rows/cols at offset 868: "
                                                                      r".*not a multiple of the block size 32"),
    "empty_tensor": (lambda d: _set(d, _u32, E0 + 36, 0), r"entry\[0\] \(token_embed\).rows/cols at offset 484: 0×64"),
    "shape_vs_config": (lambda d: _set(_set(d, _u32, E0 + 36, 160), _u64, E0 + 56, 160 * 64 * 2),
                        r"entry\[0\] \(token_embed\).rows/cols at offset 484: 160×64, but the header's configuration"),
    "offset_unaligned": (lambda d: _set(d, _u64, E0 + 48, 4096 + 8),
                         r"entry\[0\] \(token_embed\).offset at offset 496: "
                         r"4,104 is not 64-byte aligned"),
    "offset_before_data": (lambda d: _set(d, _u64, E0 + 48, 0),
                           r"entry\[0\] \(token_embed\).offset at offset 496: 0 is before"),
    "offset_past_end": (lambda d: _set(d, _u64, E0 + 64 * 40 + 48, _file_len(d)),
                        r"entry\[40\] \(v_ds_fc2_b\).offset at offset 3056: offset \+ bytes = .* past file_len"),
    "overlap": (lambda d: _set(d, _u64, E0 + 64 * 2 + 48, _entry(d, 1)[4]),
                r"overlaps entry\[1\] \(final_norm\)|overlaps entry\[2\] \(attn_norm\)"),
    "bad_checksum": (lambda d: d[:-8] + bytes(8), r"trailer \(FNV-1a 64\) at offset \d+: stored 0000000000000000"),
    "flipped_data_byte": (lambda d: d[:-9] + bytes([d[-9] ^ 0x10]) + d[-8:], r"trailer \(FNV-1a 64\) .*corrupt"),
    "flipped_directory_byte": (lambda d: _set(d, _u32, E0 + 64 * 3 + 28, 0x01000000), r"trailer|name"),
}


def _set(d, fn, off, v):
    d = bytearray(d)
    fn(d, off, v)
    return bytes(d)


@pytest.mark.parametrize("case", list(CASES))
def test_rejected_with_field_and_offset(case, good, tmp_path):
    mutate, pattern = CASES[case]
    path = tmp_path / f"{case}.vqf"
    path.write_bytes(mutate(good))
    with pytest.raises(F.VQFFormatError, match=pattern) as err:
        open_vqf(path, verify=True)
    msg = str(err.value)
    assert msg.startswith(str(path)), msg                    # names the file
    assert "offset" in msg or "bytes" in msg, msg            # and where


def test_good_file_loads(good, tmp_path):
    path = tmp_path / "good.vqf"
    path.write_bytes(good)
    with open_vqf(path, verify=True) as vf:
        assert len(vf.tensors) == 41


# ------------------------------------------------------------------------------------ fuzz
_mutation = st.one_of(
    st.tuples(st.just("byte"), st.integers(0, 4200), st.integers(0, 255)),          # header + directory
    st.tuples(st.just("byte"), st.integers(0, 700_000), st.integers(0, 255)),       # anywhere
    st.tuples(st.just("u32"), st.sampled_from(list(range(0, 200, 4)) + [E0 + 64 * i + k for i in (0, 6, 40)
                                                                        for k in (32, 36, 40, 48, 52, 56)]),
              st.sampled_from([0, 1, 7, 63, 64, 4096, 0x7FFFFFFF, 0xFFFFFFFF])),
    st.tuples(st.just("cut"), st.integers(0, 700_000), st.just(0)),
    st.tuples(st.just("grow"), st.integers(1, 5000), st.integers(0, 255)),
)


@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_mutation, min_size=1, max_size=4))
def test_fuzz_clean_rejection_or_correct_load(good, tmp_path, mutations):
    data = bytearray(good)
    for kind, pos, val in mutations:
        if kind == "byte" and pos < len(data):
            data[pos] = val
        elif kind == "u32" and pos + 4 <= len(data):
            struct.pack_into("<I", data, pos, val)
        elif kind == "cut":
            del data[pos:]
        elif kind == "grow":
            data += bytes([val]) * pos
    path = tmp_path / "fuzz.vqf"
    path.write_bytes(bytes(data))
    try:
        vf = open_vqf(path, verify=True)
    except F.VQFFormatError as e:
        assert str(e).startswith(str(path))
        return
    # It loaded: then every tensor is exactly what the good file holds.
    ref_path = tmp_path / "ref.vqf"
    ref_path.write_bytes(good)
    with vf, open_vqf(ref_path) as ref:
        assert list(vf.tensors) == list(ref.tensors)
        for name, t in vf.tensors.items():
            r = ref.tensors[name]
            assert (t.qtype, t.rows, t.cols, t.nbytes) == (r.qtype, r.rows, r.cols, r.nbytes)
            np.testing.assert_array_equal(t.data, r.data)
