"""A protected VQF file drawn from the format's own constants: what stays plaintext, what is encrypted, and
where the IV, the salt, the key id and the tag live.

Row 1 is the whole file (a real plan, ``vqf.planner.plan_file``): header and directory in plaintext, the data
area ``[data_offset, file_len)`` under SM4-CTR, the 32-byte HMAC-SM3 tag where a plain file has its 8-byte
FNV-1a trailer, and the tag's span (every byte before it). Row 2 zooms on the header's last 52 bytes: the
encryption fields at their offsets (``vqf.format.HEADER_FIELD``). Nothing is typed in: change a field's
offset or the tag's size and the picture follows. Taught in day26_1.
"""
from __future__ import annotations

ENC_FIELDS = ("enc_alg", "enc_iv", "enc_salt", "key_id")
FIELD_NOTES = {"enc_alg": "算法号 1：SM4-CTR\n+ HMAC-SM3", "enc_iv": "IV：每个文件随机",
               "enc_salt": "salt：派生两把子密钥", "key_id": "密钥编号：\nSM3(密钥) 前 8 字节"}
MIN_SHARE = 0.08     # the smallest share of the bar a region gets (the data area is ~99.9 % of the file)


def protected_regions(fp) -> list[tuple[int, int, str, str]]:
    """(start, end, what, colour) of a protected file planned by ``fp``: header, directory and padding in
    plaintext, the data area encrypted, then the tag."""
    from kestrel_lab.vqf import format as F

    dir_end = F.DIR_OFFSET + F.ENTRY_SIZE * len(fp.entries)
    return [(0, F.HEADER_END, "头部\n（明文）", "#4c72b0"),
            (F.HEADER_END, dir_end, "目录\n（明文）", "#dd8452"),
            (dir_end, fp.data_offset, "填充", "#bbbbbb"),
            (fp.data_offset, fp.file_len, "数据区：SM4-CTR 密文", "#8c564b"),
            (fp.file_len, fp.file_len + F.TAG_BYTES, f"HMAC-SM3\n标签 {F.TAG_BYTES} B", "#c44e52")]


def draw_protected_vqf(fp, name: str):
    """Two rows: the protected file of plan ``fp`` to scale, and the header's encryption fields at their
    offsets. Returns the Figure. Taught in day26_1."""
    import matplotlib.pyplot as plt

    from kestrel_lab.vqf import format as F

    regs = protected_regions(fp)
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(12, 5.0), gridspec_kw={"hspace": 1.0})
    total = regs[-1][1]
    share = [max((e - s) / total, MIN_SHARE) for s, e, _, _ in regs]     # not to scale: small parts made visible
    share = [w / sum(share) for w in share]
    x = 0.0
    for (s, e, what, colour), w in zip(regs, share):
        a1.broken_barh([(x, w)], (0, 1), facecolors=colour, edgecolors="white")
        a1.text(x + w / 2, 0.5, what, ha="center", va="center", color="white", fontsize=8.5 if w > 0.09 else 7.5,
                linespacing=1.2)
        if e - s >= 64:                                   # the tag's start is file_len: the last label says it
            a1.text(x, -0.12, f"{s:,}", ha="center", va="top", fontsize=7, color="#555555")
        x += w
    a1.text(1.0 - share[-1], -0.12, f"file_len {regs[-1][0]:,}", ha="center", va="top", fontsize=7, color="#555555")
    a1.annotate("", (0.0, -0.65), (1.0 - share[-1], -0.65), arrowprops={"arrowstyle": "<->", "color": "#c44e52"})
    a1.text((1.0 - share[-1]) / 2, -0.85, "HMAC-SM3 覆盖的范围：标签之前的每一个字节（先加密后认证）；"
            "第 p 个数据字节用计数块 IV + p/16", ha="center", va="top", fontsize=8.5, color="#c44e52")
    a1.set_xlim(0, 1)
    a1.set_ylim(-1.2, 2.6)
    a1.axis("off")
    a1.set_title(f"{name} 加密后的 VQF：{total:,} 字节（file_len + {F.TAG_BYTES}；小的部分放大了，不按比例）",
                 fontsize=11)

    lo = F.HEADER_FIELD[ENC_FIELDS[0]].offset
    for i, fname in enumerate(ENC_FIELDS):
        f = F.HEADER_FIELD[fname]
        end = F.HEADER_FIELD[ENC_FIELDS[i + 1]].offset if i + 1 < len(ENC_FIELDS) else F.HEADER_END
        size = end - f.offset
        a2.broken_barh([(f.offset, size)], (0, 1), facecolors="#4c72b0", edgecolors="white")
        a2.text(f.offset + size / 2, 0.5, f"{fname}\n{size} B", ha="center", va="center", color="white", fontsize=8)
        a2.text(f.offset + size / 2, -0.25, FIELD_NOTES[fname], ha="center", va="top", fontsize=7.5, rotation=0)
        a2.text(f.offset, 1.12, str(f.offset), ha="center", fontsize=7.5, color="#555555")
    a2.text(F.HEADER_END, 1.12, str(F.HEADER_END), ha="center", fontsize=7.5, color="#555555")
    a2.set_xlim(lo - 2, F.HEADER_END + 2)
    a2.set_ylim(-1.0, 1.5)
    a2.axis("off")
    a2.set_title(f"头部的字节 {lo}–{F.HEADER_END}：加密字段（密钥本身从不写进文件）", fontsize=10)
    return fig
