"""SM4-encrypted VQF with an HMAC-SM3 tag: the standards' vectors, round trips, tampering, keys.

The primitives come from ``cryptography`` (OpenSSL); the vectors are the standards' own (GB/T 32907
SM4, GB/T 32905 SM3, draft-ribose-cfrg-sm4 CTR, RFC 8998 GCM), HMAC and HKDF are recomputed here by
hand from RFC 2104 / RFC 5869 over SM3, so nothing is checked against itself.
"""
from __future__ import annotations

import hashlib
import json
import os
import struct

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from kestrel_lab.vqf import encrypt as E
from kestrel_lab.vqf import format as F
from kestrel_lab.vqf import protect as P
from kestrel_lab.vqf import synth
from kestrel_lab.vqf.format import VQFFormatError
from kestrel_lab.vqf.reader import open_vqf

STD_KEY = bytes.fromhex("0123456789abcdeffedcba9876543210")


# ------------------------------------------------------------------------------- vectors
def test_sm4_gbt32907_example_and_million_rounds():
    enc = Cipher(algorithms.SM4(STD_KEY), modes.ECB()).encryptor().update
    assert enc(STD_KEY).hex() == "681edf34d206965e86b3e94f536e4246"
    b = STD_KEY
    for _ in range(1_000_000):            # about half a second through OpenSSL
        b = enc(b)
    assert b.hex() == "595298c7c6fd271f0402f804c33d3f66"


def test_sm3_gbt32905_examples():
    assert P.sm3(b"abc").hex() == "66c7f0f462eeedd9d1f2d46bdc10e4e24167c4875cf2f7a2297da02b8f4ba8e0"
    assert P.sm3(b"abcd" * 16).hex() == "debe9ff92275b8a138604889c18e5a4d6fdb70e5387e5765293dcba39c0c5732"


def test_sm4_ctr_vector_of_draft_ribose_cfrg_sm4():
    iv = bytes.fromhex("000102030405060708090A0B0C0D0E0F")
    pt = b"".join(bytes([c]) * 8 + bytes([d]) * 8 for c, d in ((0xAA, 0xBB), (0xCC, 0xDD), (0xEE, 0xFF), (0xAA, 0xBB)))
    ct = ("AC3236CB970CC20791364C395A1342D1A3CBC1878C6F30CD074CCE385CDD70C7"
          "F234BC0E24C11980FD1286310CE37B926E02FCD0FAA0BAF38B2933851D824514")
    assert P.sm4_ctr(STD_KEY, iv, pt).tobytes().hex().upper() == ct
    assert P.sm4_ctr(STD_KEY, iv, bytes.fromhex(ct)).tobytes() == pt
    # the same stream from its second block on, CTR positioned at byte 16
    assert P.sm4_ctr(STD_KEY, iv, pt[16:], 16).tobytes().hex().upper() == ct[32:]


def test_sm4_gcm_vector_of_rfc8998():
    iv = bytes.fromhex("00001234567800000000ABCD")
    aad = bytes.fromhex("FEEDFACEDEADBEEFFEEDFACEDEADBEEFABADDAD2")
    pt = b"".join(bytes([c]) * 8 + bytes([d]) * 8 for c, d in ((0xAA, 0xBB), (0xCC, 0xDD), (0xEE, 0xFF), (0xEE, 0xAA)))
    e = Cipher(algorithms.SM4(STD_KEY), modes.GCM(iv)).encryptor()
    e.authenticate_additional_data(aad)
    ct = e.update(pt) + e.finalize()
    assert ct.hex().upper() == ("17F399F08C67D5EE19D0DC9969C4BB7D5FD46FD3756489069157B282BB200735"
                                "D82710CA5C22F0CCFA7CBF93D496AC15A56834CBCF98C397B4024A2691233B8D")
    assert e.tag.hex().upper() == "83DE3541E4C2B58177E065A9BF7B62EC"


def _sm3_hashlib_or_cryptography(data: bytes) -> bytes:
    if "sm3" in hashlib.algorithms_available:
        return hashlib.new("sm3", data).digest()
    return P.sm3(data)


def _hmac_by_hand(key: bytes, msg: bytes) -> bytes:
    """RFC 2104 over SM3 (64-byte block)."""
    if len(key) > 64:
        key = _sm3_hashlib_or_cryptography(key)
    key = key.ljust(64, b"\0")
    inner = _sm3_hashlib_or_cryptography(bytes(k ^ 0x36 for k in key) + msg)
    return _sm3_hashlib_or_cryptography(bytes(k ^ 0x5C for k in key) + inner)


@pytest.mark.parametrize("key_len, msg", [(16, b"abc"), (32, b""), (64, b"x" * 1000), (100, b"abcd" * 16)])
def test_hmac_sm3_equals_rfc2104_by_hand(key_len, msg):
    key = bytes(range(key_len))
    mac = P.new_mac(key)
    mac.update(msg)
    assert mac.finalize() == _hmac_by_hand(key, msg)


def test_hmac_sm3_regression_value():
    mac = P.new_mac(STD_KEY)
    mac.update(b"abc")
    assert mac.finalize().hex() == "28d8a61be67d8bf7652c4eda7092b612f88be62184f55005c57ddf076e764199"


def test_hkdf_sm3_equals_rfc5869_by_hand():
    key, salt = bytes(range(16)), bytes(range(100, 116))
    prk = _hmac_by_hand(salt, key)
    def expand(info, n):
        out, t, i = b"", b"", 1
        while len(out) < n:
            t = _hmac_by_hand(prk, t + info + bytes([i]))
            out, i = out + t, i + 1
        return out[:n]
    k = P.derive_keys(key, salt)
    assert k.enc == expand(P.INFO_ENC, 16) and k.mac == expand(P.INFO_MAC, 32) and k.enc != k.mac[:16]
    assert P.derive_keys(key, bytes(16)) != k  # another salt, other keys


def test_key_id_is_sm3_prefix():
    assert P.key_id(STD_KEY) == P.sm3(STD_KEY)[:8]


# ------------------------------------------------------------------------- CTR positioning
@pytest.mark.parametrize("iv_hex", ["00" * 16, "0000000000000000ffffffffffffff00", "ff" * 15 + "f0"])
def test_ctr_at_any_aligned_offset_equals_the_whole_stream(iv_hex):
    iv = bytes.fromhex(iv_hex)     # the last two carry across the 64-bit half and wrap at 2^128
    data = np.random.default_rng(1).integers(0, 256, 16 * 600, dtype=np.uint8)
    whole = P.sm4_ctr(STD_KEY, iv, data)
    for off in (0, 16, 64, 4096, 16 * 257, 16 * 599):
        part = P.sm4_ctr(STD_KEY, iv, data[off:], off)
        assert np.array_equal(part, whole[off:]), off
    with pytest.raises(ValueError, match="multiple of 16"):
        P.sm4_ctr(STD_KEY, iv, data[8:], 8)


def test_counter_block_carries_and_wraps():
    assert P.counter_block(bytes.fromhex("00" * 8 + "ff" * 8), 16) == bytes.fromhex("00" * 7 + "01" + "00" * 8)
    assert P.counter_block(b"\xff" * 16, 32) == bytes(15) + b"\x01"


# ------------------------------------------------------------------------------ key files
def test_key_file_format_mode_and_refusals(tmp_path):
    k = P.write_key_file(tmp_path / "k")
    text = k.read_bytes()
    assert len(text) == 33 and text.endswith(b"\n") and bytes.fromhex(text[:32].decode())
    assert os.stat(k).st_mode & 0o777 == 0o600
    assert len(P.read_key_file(k)) == 16
    with pytest.raises(P.KeyFileError, match="already exists"):
        P.write_key_file(k)
    os.chmod(k, 0o644)
    with pytest.raises(P.KeyFileError, match="chmod 600"):
        P.read_key_file(k)
    bad = tmp_path / "bad"
    for content in (b"zz" * 16 + b"\n", b"00" * 15 + b"\n", b"00" * 17, b""):
        bad.write_bytes(content)
        os.chmod(bad, 0o600)
        with pytest.raises(P.KeyFileError, match=str(bad)):
            P.read_key_file(bad)
    with pytest.raises(P.KeyFileError, match="not found"):
        P.read_key_file(tmp_path / "missing")


def test_key_files_that_could_hang_or_exhaust_memory_are_refused_before_reading(tmp_path):
    """A key file is fstat'ed before a byte is read: a character device (/dev/zero, endless), a named pipe
    (open would block until a writer came), a directory, a 1 GiB sparse file — each refused at once, by kind
    or size; a file of 64 bytes or less is read with a bound."""
    import stat
    import time

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    sparse = tmp_path / "sparse"
    with open(sparse, "wb") as fh:
        fh.truncate(1 << 30)
    os.chmod(sparse, 0o600)
    cases = {"/dev/zero": "is a character device", str(fifo): "is a named pipe", str(tmp_path): "is a directory",
             str(sparse): "1,073,741,824 bytes; a key file has 33"}
    for path, why in cases.items():
        t0 = time.perf_counter()
        with pytest.raises(P.KeyFileError, match=rf"^{path}: {why}"):
            P.read_key_file(path)
        assert time.perf_counter() - t0 < 1.0
    assert stat.S_ISREG(os.stat(sparse).st_mode) and P.KEY_FILE_MAX == 64


def test_eval_takes_the_key_file_its_error_suggests(tmp_path, capsys, monkeypatch):
    from kestrel_lab import models
    from kestrel_lab.cli import main

    monkeypatch.delenv(P.ENV_KEY_FILE, raising=False)
    plain = models.vqf("qwen3-tiny-poem", quant="q8_0")
    key = P.write_key_file(tmp_path / "k")
    enc = tmp_path / "poem.enc.vqf"
    E.encrypt_file(plain, enc, key)
    text = tmp_path / "t.txt"
    text.write_text("《静夜思》\n作者：李白\n床前明月光，疑是地上霜。\n", encoding="utf-8")
    assert main(["eval", "ppl", str(enc), "--text", str(text), "--window", "16", "--stride", "8"]) == 1
    assert "pass --key-file K" in capsys.readouterr().err
    ppl = []
    for path in (enc, plain):     # the key file opens the encrypted file; a plain one ignores it
        argv = ["eval", "ppl", str(path), "--window", "16", "--stride", "8", "--text", str(text), "--json"]
        assert main(argv + ["--key-file", str(key)]) == 0
        ppl.append(json.loads(capsys.readouterr().out)["ppl"])
    assert ppl[0] == ppl[1]
    assert main(["eval", "kl", str(enc), str(plain), "--text", str(text), "--json", "--key-file", str(key)]) == 0


# --------------------------------------------------------------------------- whole files
@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("prot")
    cfg = synth.small_vl_config()
    plain = synth.write_random(d / "plain.vqf", cfg, "q4_0", seed=11)
    key = P.write_key_file(d / "k")
    other = P.write_key_file(d / "other")
    enc = d / "enc.vqf"
    E.encrypt_file(plain, enc, key)
    return {"dir": d, "plain": plain, "enc": enc, "key": key, "other": other}


def test_encrypted_layout(files):
    h = F.unpack_header_raw(files["enc"].read_bytes()[:F.HEADER_END])
    p = F.unpack_header_raw(files["plain"].read_bytes()[:F.HEADER_END])
    assert h["flags"] == (p["flags"] & ~F.FLAG["FNV_TRAILER"]) | F.FLAG["ENCRYPTED"]
    assert h["enc_alg"] == P.ALG_SM4_CTR_HMAC_SM3 and h["key_id"] == P.key_id(P.read_key_file(files["key"]))
    assert files["enc"].stat().st_size == h["file_len"] + 32 == files["plain"].stat().st_size + 24
    a, b = files["plain"].read_bytes(), files["enc"].read_bytes()
    d0 = h["data_offset"]
    assert a[F.HEADER_END:d0] == b[F.HEADER_END:d0]          # directory in plaintext
    assert a[d0:h["file_len"]] != b[d0:h["file_len"]]       # data area is not
    # a second encryption uses a fresh IV and salt
    E.encrypt_file(files["plain"], files["dir"] / "enc2.vqf", files["key"])
    h2 = F.unpack_header_raw((files["dir"] / "enc2.vqf").read_bytes()[:F.HEADER_END])
    assert h2["enc_iv"] != h["enc_iv"] and h2["enc_salt"] != h["enc_salt"]


def test_decrypt_is_bit_identical_and_open_gives_the_same_tensors(files):
    out = files["dir"] / "dec.vqf"
    E.decrypt_file(files["enc"], out, files["key"])
    assert out.read_bytes() == files["plain"].read_bytes()
    with open_vqf(files["plain"], verify=True) as a, open_vqf(files["enc"], key_file=files["key"]) as b:
        assert b.encrypted and not a.encrypted and b.tag is not None
        assert [e.name for e in a.entries] == [e.name for e in b.entries]
        for e in a.entries:
            assert np.array_equal(e.data, b[e.name].data)
            assert not b[e.name].data.flags.writeable
            assert not np.shares_memory(b[e.name].data, a.raw)
        one = E.decrypt_tensor(files["enc"], a.entries[5].name, files["key"])
        assert np.array_equal(one, a.entries[5].data)


def test_key_from_environment_and_missing_or_wrong_key(files, monkeypatch):
    monkeypatch.delenv(P.ENV_KEY_FILE, raising=False)
    with pytest.raises(P.VQFProtectionError, match=r"encrypted .* no key was given: pass --key-file"):
        open_vqf(files["enc"])
    with pytest.raises(P.VQFProtectionError, match=r"field key_id at offset 424: .*wrong key file"):
        open_vqf(files["enc"], key_file=files["other"])
    monkeypatch.setenv(P.ENV_KEY_FILE, str(files["key"]))
    with open_vqf(files["enc"]) as vf:
        assert vf.encrypted
    assert E.verify_file(files["enc"], files["key"]) >= 0


def _tampered(files, name, edit) -> "os.PathLike":
    raw = bytearray(files["enc"].read_bytes())
    edit(raw)
    out = files["dir"] / f"t-{name}.vqf"
    out.write_bytes(bytes(raw))
    return out


def _flip(pos):
    def edit(raw):
        raw[pos if pos >= 0 else len(raw) + pos] ^= 0x01
    return edit


def _regions(files):
    h = F.unpack_header_raw(files["enc"].read_bytes()[:F.HEADER_END])
    d0, fl = h["data_offset"], h["file_len"]
    return h, {
        "header created (VQFSig)": _flip(F.HEADER_FIELD["created"].offset),
        "header source_model": _flip(F.HEADER_FIELD["source_model"].offset + 70 - 64),
        "header rope_theta": _flip(F.HEADER_FIELD["rope_theta"].offset),
        "header enc_iv": _flip(F.HEADER_FIELD["enc_iv"].offset + 3),
        "header enc_salt": _flip(F.HEADER_FIELD["enc_salt"].offset),
        "directory entry 1 name": _flip(F.DIR_OFFSET + 64 + 2),
        "data first byte": _flip(d0),
        "data middle": _flip((d0 + fl) // 2),
        "data last byte": _flip(fl - 1),
        "tag first byte": _flip(fl),
        "tag last byte": _flip(-1),
    }


def test_every_tampered_region_is_refused_by_the_tag(files):
    h, regions = _regions(files)
    for name, edit in regions.items():
        path = _tampered(files, name.replace(" ", "_").replace("(", "").replace(")", ""), edit)
        with pytest.raises(VQFFormatError, match=str(path)) as e:
            open_vqf(path, key_file=files["key"])
        if "name" not in name:   # a renamed entry may already fail the shape check, before the tag
            assert isinstance(e.value, P.VQFProtectionError) and "tag (HMAC-SM3)" in str(e.value), (name, e.value)
        with pytest.raises(VQFFormatError, match=str(path)):
            E.verify_file(path, files["key"])
        dst = files["dir"] / "never.vqf"
        with pytest.raises(VQFFormatError):
            E.decrypt_file(path, dst, files["key"])
        assert not dst.exists() and not list(files["dir"].glob(".never.vqf.*"))


def test_key_id_and_structure_bytes_are_refused_by_name(files):
    key_id = _tampered(files, "keyid", _flip(F.HEADER_FIELD["key_id"].offset))
    with pytest.raises(P.VQFProtectionError, match="field key_id at offset 424"):
        open_vqf(key_id, key_file=files["key"])
    both = _tampered(files, "flags", lambda r: struct.pack_into("<I", r, 8, struct.unpack_from("<I", r, 8)[0] | 1))
    with pytest.raises(VQFFormatError, match="ENCRYPTED .* and FNV_TRAILER .* are both set"):
        open_vqf(both, key_file=files["key"])
    alg = _tampered(files, "alg", lambda r: struct.pack_into("<I", r, 388, 7))
    with pytest.raises(VQFFormatError, match="field enc_alg at offset 388: unknown algorithm id 7"):
        open_vqf(alg, key_file=files["key"])


def test_truncated_or_extended_files_are_refused(files):
    raw = files["enc"].read_bytes()
    for name, data in (("cut1", raw[:-1]), ("cut-tag", raw[:-32]), ("cut-data", raw[:len(raw) // 2]),
                       ("extra", raw + b"\0")):
        p = files["dir"] / f"{name}.vqf"
        p.write_bytes(data)
        with pytest.raises(VQFFormatError, match=rf"{p}: field file_len at offset 192: file_len \+ 32"):
            open_vqf(p, key_file=files["key"])
        with pytest.raises(VQFFormatError, match=str(p)):
            E.verify_file(p, files["key"])


def test_reordered_tensors_are_refused(files):
    with open_vqf(files["plain"]) as vf:
        a, b = vf["attn_norm"].index, vf["ffn_norm"].index
        ea, eb = vf.entries[a], vf.entries[b]
        assert ea.nbytes == eb.nbytes

    def swap_entries(raw):
        pa, pb = F.DIR_OFFSET + 64 * a, F.DIR_OFFSET + 64 * b
        raw[pa:pa + 32], raw[pb:pb + 32] = raw[pb:pb + 32], raw[pa:pa + 32]   # names swapped

    def swap_data(raw):
        n = ea.nbytes
        raw[ea.offset:ea.offset + n], raw[eb.offset:eb.offset + n] = \
            raw[eb.offset:eb.offset + n], raw[ea.offset:ea.offset + n]

    for name, edit in (("swap-entries", swap_entries), ("swap-data", swap_data)):
        path = _tampered(files, name, edit)
        with pytest.raises(P.VQFProtectionError, match=r"tag \(HMAC-SM3\)"):
            open_vqf(path, key_file=files["key"])


def test_plain_file_with_encryption_bytes_is_refused(files):
    raw = bytearray(files["plain"].read_bytes())
    raw[F.HEADER_FIELD["enc_iv"].offset + 5] = 1
    p = files["dir"] / "plain-iv.vqf"
    p.write_bytes(bytes(raw))
    with pytest.raises(VQFFormatError, match=r"field enc_iv at offset 392: is not zero although ENCRYPTED"):
        open_vqf(p)


def test_encrypt_refuses_corrupt_input_and_leaves_nothing(files):
    raw = bytearray(files["plain"].read_bytes())
    h = F.unpack_header_raw(bytes(raw[:F.HEADER_END]))
    raw[h["data_offset"] + 100] ^= 0xFF
    bad = files["dir"] / "corrupt.vqf"
    bad.write_bytes(bytes(raw))
    out = files["dir"] / "sealed.vqf"
    with pytest.raises(VQFFormatError, match=r"FNV-1a 64.*refusing to encrypt"):
        E.encrypt_file(bad, out, files["key"])
    assert not out.exists() and not list(files["dir"].glob(".sealed.vqf.*"))
    with pytest.raises(VQFFormatError, match="already ENCRYPTED"):
        E.encrypt_file(files["enc"], out, files["key"])
    with pytest.raises(ValueError, match="overwrite the input"):
        E.encrypt_file(files["plain"], files["plain"], files["key"])


def test_not_enough_memory_is_refused_before_decrypting(files, monkeypatch):
    from kestrel_lab.memory_check import ENV_AVAILABLE, MemoryBudgetError

    monkeypatch.setenv(ENV_AVAILABLE, "1000")
    with pytest.raises(MemoryBudgetError, match=str(files["enc"])):
        open_vqf(files["enc"], key_file=files["key"])
    with open_vqf(files["plain"]) as vf:     # a plain file is mapped, not copied: no such limit
        assert not vf.encrypted


def test_engine_output_on_encrypted_file_equals_plain(tmp_path):
    from kestrel_lab import models
    from kestrel_lab.engine import Qwen3Engine

    plain = models.vqf("qwen3-tiny-poem", quant="q4_0")
    key = P.write_key_file(tmp_path / "k")
    enc = tmp_path / "poem.enc.vqf"
    E.encrypt_file(plain, enc, key)
    back = tmp_path / "poem.dec.vqf"
    E.decrypt_file(enc, back, key)
    assert E.files_equal(plain, back)                       # a real converted model comes back bit for bit
    back.unlink()
    ids = [151643, 100, 2000, 30000, 7]
    a = Qwen3Engine.from_vqf(plain, max_context=32)
    b = Qwen3Engine.from_vqf(enc, max_context=32, key_file=key)
    assert b.bytes_released > 0 and a.bytes_released == 0      # decrypted originals of the copied matrices
    assert b.memory_report()["copied_tensors"] == a.memory_report()["copied_tensors"]
    la, lb = a.prefill(ids), b.prefill(ids)
    assert np.array_equal(la, lb)
    assert np.array_equal(a.forward_all(ids[:3]), b.forward_all(ids[:3]))
    for _ in range(3):
        t = int(np.argmax(la))
        la, lb = a.decode(t), b.decode(t)
        assert np.array_equal(la, lb)


def test_cli_keygen_encrypt_verify_decrypt(files, tmp_path, capsys, monkeypatch):
    from kestrel_lab.cli import main

    monkeypatch.delenv(P.ENV_KEY_FILE, raising=False)
    k = tmp_path / "cli.key"
    assert main(["vqf", "keygen", "-o", str(k)]) == 0
    assert os.stat(k).st_mode & 0o777 == 0o600
    enc, dec = tmp_path / "e.vqf", tmp_path / "d.vqf"
    assert main(["vqf", "encrypt", str(files["plain"]), "-o", str(enc), "--key-file", str(k)]) == 0
    assert main(["vqf", "verify", str(enc), "--key-file", str(k)]) == 0
    assert "match=YES" in capsys.readouterr().out
    assert main(["vqf", "verify", str(enc)]) != 0
    assert "no key" in capsys.readouterr().err
    monkeypatch.setenv(P.ENV_KEY_FILE, str(k))
    assert main(["vqf", "decrypt", str(enc), "-o", str(dec)]) == 0
    assert dec.read_bytes() == files["plain"].read_bytes()
    assert main(["vqf", "verify", str(dec)]) == 0   # a plain file: the FNV check, as before


def test_bench_runs_the_engine_on_an_encrypted_copy(tmp_path, monkeypatch):
    import json

    from kestrel_lab import models
    from kestrel_lab.bench import speed

    monkeypatch.setenv("KESTREL_CACHE_DIR", str(tmp_path / "cache"))
    small = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 64,
             "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "head_dim": 16, "rms_norm_eps": 1e-6, "rope_theta": 1e6, "max_position_embeddings": 256,
             "vocab_size": 1024, "tie_word_embeddings": True}
    cfg = tmp_path / "small.config.json"
    cfg.write_text(json.dumps(small))
    path = models.vqf(config=cfg, quant="q4_0")
    key = P.write_key_file(tmp_path / "k")
    enc = tmp_path / "small.enc.vqf"
    r = E.encrypt_file(path, enc, key)
    plain = speed.engine_speed(path, 1, prompt_len=8, decode_tokens=2)
    sealed = speed.engine_speed(enc, 1, prompt_len=8, decode_tokens=2, key_file=key)
    assert sealed["weight_qtypes"] == plain["weight_qtypes"] and sealed["decode_tok_s"] > 0
    res = {"vqf": str(path), "quant": "q4_0", "threads": [1], "engine": {1: plain}, "bandwidth": {1: 10.0},
           "ceiling_tok_s": {1: 100.0}, "pct_of_ceiling": {1: 50.0}, "kernels_gbs": {1: {}}, "torch": {},
           "weight_bytes_per_token": plain["weight_bytes_per_token"],
           "first_compile": {"to_first_token_s": 3.0, "to_first_decode_s": 3.1},
           "cold_start": {"to_first_token_s": 1.0, "interpreter_s": 0.1, "import_s": 0.3, "load_s": 0.2,
                          "prefill_s": 0.4}, "encrypt": r, "engine_encrypted": sealed}
    assert "encrypted copy" in speed.format_table(res)


def test_parallel_chunks_decrypt_the_same_bytes(files, monkeypatch):
    """Many small chunks over several threads (CTR positioned per chunk) give the same plaintext."""
    import mmap as _mmap

    monkeypatch.setattr(P, "CHUNK", 4096 + 16 * 5)       # chunks that straddle pages and tensors
    h = F.unpack_header_raw(files["enc"].read_bytes()[:F.HEADER_END])
    plain = np.frombuffer(files["plain"].read_bytes(), np.uint8)
    for workers in (1, 3):
        with open(files["enc"], "rb") as fh:
            mm = _mmap.mmap(fh.fileno(), 0, access=_mmap.ACCESS_READ)
        img = P.decrypt_image(str(files["enc"]), mm, h, files["key"], workers=workers)
        got = np.frombuffer(img, np.uint8)
        d0, fl = h["data_offset"], h["file_len"]
        assert np.array_equal(got[d0:fl], plain[d0:fl]), workers
        del got
        img.close()
        mm.close()
