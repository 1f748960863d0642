"""scripts/bench_gemm_targets.py without a GPU: the targets table is a pure function of the
measured rows (each verdict flips when its number crosses the target), the note's summary stays
small at the full table's size, and the chart is drawn from that summary alone."""

from __future__ import annotations

import json
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import bench_gemm_targets as bt  # noqa: E402


def _rows(ratios, eager=None, flop=2.0 * 8192**3, **extra):
    """Rows whose reference time / ours is each of ``ratios`` (ours 100 µs)."""
    out = []
    for i, x in enumerate(ratios):
        r = {"shape": f"{i + 1}x4096x4096", "M": i + 1, "N": 4096, "K": 4096, "flop": flop, "ours_us": 100.0,
             "ref_us": 100.0 * x, "ok": True, **extra}
        if eager is not None:
            r.update(ours_eager_us=100.0, ref_eager_us=100.0 * eager[i])
        out.append(r)
    return out


def _groups(scale=1.0):
    """Every group with its numbers ``scale`` x each target's threshold."""
    tf = lambda target: _rows([1.0], flop=target * scale * 1e6 * 100.0)  # noqa: E731 - 100 µs at target*scale TFLOP/s
    x = (1.05**4 / 0.95) ** (1 / 3)  # three rows at x, one at 0.95: geomean 1.05, lowest 0.95
    y = (1.10**3 / 0.97) ** 0.5
    return {"bf16": _rows([x * scale] * 3 + [0.95 * scale], eager=[1.0 * scale] * 4),
            "bf16_8192": tf(760), "fp8_row": _rows([0.97 * scale, y * scale, y * scale]),
            "fp8_block_4096": tf(1300), "fp8_block": _rows([1.0 * scale] * 4),
            "grouped_bf16": _rows([1.10 * scale] * 5), "grouped_fp8": tf(1200)}


def test_each_verdict_flips_when_its_number_crosses_the_target():
    above = {t["key"]: t for t in bt.target_table(_groups(1.001))}
    below = {t["key"]: t for t in bt.target_table(_groups(0.999))}
    assert set(above) == set(below) == {k for k, *_ in bt.TARGETS}
    for key, *_ in bt.TARGETS:
        assert above[key]["verdict"] == "met", above[key]
        assert below[key]["verdict"] == "not met", below[key]
    t = above["bf16_8192"]
    assert t["unit"] == "TFLOP/s" and t["ours"] == pytest.approx(760.8, abs=0.1) and t["ratio"] == 1.0
    lo = below["bf16_lowest"]
    assert lo["at"] == "4x4096x4096" and lo["below"] == 1 and lo["ratio"] == pytest.approx(0.95 * 0.999, abs=1e-4)
    g = above["fp8_row_geomean"]  # geomean of the times: the ratio is the geomean of the ratios
    assert g["ratio"] == pytest.approx(1.10 * 1.001, abs=1e-4)
    assert g["verdict"] == "met" and above["fp8_row_lowest"]["below"] == 0


def test_missing_groups_and_failed_outputs_are_reported_not_met():
    groups = _groups(2.0)
    del groups["grouped_fp8"]
    groups["fp8_row"][0]["ok"] = False
    t = {r["key"]: r for r in bt.target_table(groups)}
    assert t["grouped_fp8_tflops"]["verdict"] == "not measured" and t["grouped_fp8_tflops"]["shapes"] == 0
    assert t["fp8_row_geomean"]["verdict"] == "met" and t["fp8_row_geomean"]["outputs_ok"] is False
    assert t["bf16_geomean"]["outputs_ok"] is True


def test_summary_of_the_full_table_stays_small_and_charts(tmp_path):
    """The full plan's row counts (130 bf16, 30 row, 16 block, 18 grouped): the summary a note
    keeps is < 4 KB; --replot draws the PNG from it alone."""
    import bench_fp8
    import bench_grouped
    from bench_offgrid import REPORT, family_shapes

    def dense(shapes):
        return [{**_rows([0.9 + 0.001 * i])[0], "shape": f"{m}x{n}x{k}", "M": m, "N": n, "K": k}
                for i, (m, n, k) in enumerate(shapes)]

    groups = _groups(1.0)
    groups["bf16"] = dense([(m, n, k) for _, _, m, n, k in family_shapes(REPORT, bt.M_REPORT)])
    groups["fp8_row"] = dense([(m, n, k) for n, k in bench_fp8.ROW_NK for m in bench_fp8.ROW_M])
    groups["fp8_block"] = dense(dict.fromkeys(bench_fp8.BLOCK_SHAPES))
    groups["grouped_bf16"] = [{**_rows([1.05])[0], "model": mo, "proj": pj, "routed": m}
                              for mo, (_, projs) in bench_grouped.MODELS.items() for pj, _, _ in projs
                              for m in bench_grouped.ROUTED]
    assert len(groups["bf16"]) >= 120 and len(groups["grouped_bf16"]) == 18
    meta = {"device": "test", "torch": "x", "date": "2026-01-01", "command": "c"}
    summ = bt.summary(meta, groups, bt.target_table(groups))
    text = bt.compact_json(summ)
    assert len(text.encode()) < 4096, len(text.encode())
    assert len(summ["ratios"]["bf16"]) - 1 == len({(r["N"], r["K"]) for r in groups["bf16"]})
    assert summ["ratios"]["bf16"]["M"] == list(bt.M_REPORT)
    p = tmp_path / "s.json"
    p.write_text(text)
    assert bt.main(["--replot", str(p), "--out", str(tmp_path / "t")]) == 0
    png = (tmp_path / "t.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and 100 < len(png) < 120_000
    assert bt.summary_targets(json.loads(text))[0]["key"] == "bf16_geomean"
    raw = tmp_path / "raw.json"  # the raw file: the summary is rebuilt from its rows
    raw.write_text(json.dumps({**meta, "groups": groups}))
    assert bt.main(["--replot", str(raw), "--out", str(tmp_path / "r")]) == 0
    assert (tmp_path / "r.summary.json").read_text() == text + "\n"
