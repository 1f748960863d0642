"""``scripts/bench.py attention`` writes a PNG chart beside its JSON: matplotlib where installed,
else factory.benchmark's zlib bar chart (checked here: a valid PNG of the expected size and
colours)."""

from __future__ import annotations

import struct
import sys
import zlib

from conftest import ROOT


def _read_png(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, {}
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        (crc,) = struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])
        assert crc == zlib.crc32(kind + body) & 0xFFFFFFFF, kind
        chunks.setdefault(kind, []).append(body)
        pos += 12 + n
    w, h, depth, ctype = struct.unpack(">IIBB", chunks[b"IHDR"][0][:10])
    return w, h, depth, ctype, zlib.decompress(b"".join(chunks[b"IDAT"]))


def test_bar_chart_png(tmp_path):
    from factory.benchmark import bar_chart_png

    p = tmp_path / "c.png"
    bar_chart_png(p, [[1.0, 2.0], [2.0, float("nan")]], ["tab:red", "tab:blue"], bar_px=4, height=50)
    w, h, depth, ctype, raw = _read_png(p)
    assert (w, h, depth, ctype) == (2 * (4 * 2 + 4) + 4, 50, 8, 2)
    assert len(raw) == h * (1 + 3 * w)
    rows = [raw[y * (1 + 3 * w) + 1:(y + 1) * (1 + 3 * w)] for y in range(h)]
    px = lambda x, y: tuple(rows[y][3 * x:3 * x + 3])  # noqa: E731
    assert px(0, 0) == (255, 255, 255) and px(0, h - 1) == (0, 0, 0)  # background, baseline
    assert px(4, h - 2) == (214, 39, 40) and px(8, 1) == (31, 119, 180)  # a red bar; the tallest, blue
    assert px(4 + 12 + 4, h - 2) == (255, 255, 255)  # NaN: no bar


def test_bench_attention_chart(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    import bench_attention

    rows = [dict(B=1, Hq=16, Hkv=16, Sq=16384, Sk=16384, D=256, causal=c, varlen=False, ours_tflops=650.0,
                 flash_tflops=300.0, cudnn_tflops=620.0, sdpa_tflops=None, ratio_vs_best_sdpa=1.05) for c in (0, 1)]
    p = tmp_path / "bench.png"
    how = bench_attention.chart(rows, p, "test")
    assert how in ("matplotlib", "bar_chart_png")
    assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 100
