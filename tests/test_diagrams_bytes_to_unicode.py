"""The bytes_to_unicode grid is drawn from the package's tables and has Chinese labels."""
import matplotlib

matplotlib.use("Agg")

from kestrel_lab.diagrams import bytes_to_unicode as d
from kestrel_lab.vocab.bytelevel import BYTE_TO_UNICODE, decode_token_str


def test_classes_follow_the_package_tables():
    cls = d.byte_classes()
    assert len(cls) == 256
    assert d.class_counts() == {"self": 188, "back": 35, "mark": 33}
    assert cls[0x20] == "mark" and BYTE_TO_UNICODE[0x20] == "Ġ"
    assert cls[0x0A] == "mark" and cls[0x7F] == "back" and cls[0xAD] == "back" and cls[0x41] == "self"
    for b in range(256):
        if cls[b] == "back":
            assert decode_token_str(BYTE_TO_UNICODE[b]) == bytes([b]) and ord(BYTE_TO_UNICODE[b]) >= 0x100


def test_the_grid_has_a_cell_per_byte_and_chinese_labels():
    import matplotlib.pyplot as plt

    fig = d.draw_bytes_to_unicode()
    ax = fig.axes[0]
    texts = [t.get_text() for t in ax.texts]
    assert "Ġ" in texts and "Ń" in texts and "A" in texts
    assert len(ax.patches) == 256
    assert "字节" in ax.get_title() and "高 4 位" in ax.get_ylabel() and "低 4 位" in ax.get_xlabel()
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert len(legend) == 3 and all("个" in t for t in legend)
    plt.close(fig)
