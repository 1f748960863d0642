"""The attention targets table (``scripts/attention_targets.py``, ``bench_attention.py --grid
targets``) from timings alone, no GPU: each verdict flips when its timing crosses the target, rows
the bundle cannot run stay in the table with their reason, the published figures sit beside the
rows they describe, and the chart and the note's summary come out of the JSON."""

from __future__ import annotations

import sys

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import attention_targets as at  # noqa: E402

D128 = at.flops((1, 16, 16, 16384, 16384, 128, False))  # 4·16·16384²·128


def _us(flops, tflops):
    return flops / tflops / 1e6


def _table(dtype, specs, ours_us, torch_us, eager=None):
    return at.targets_table(dtype, specs, {s["id"]: {"ours_us": ours_us, "torch_us": torch_us,
                                                     "ours_eager_us": eager} for s in specs})


def test_flops_causal_is_half_plus_the_diagonal():
    assert D128 == 4.0 * 16 * 16384 ** 2 * 128
    causal = at.flops((1, 16, 16, 16384, 16384, 128, True))
    assert causal == 4.0 * 16 * (16384 ** 2 - 16384 * 16383 / 2) * 128


@pytest.mark.parametrize("tflops, met", [(719.0, False), (721.0, True)])
def test_tflops_target_flips_at_the_target(tflops, met):
    spec = [s for s in at.BF16_ROWS if s["id"] == "d128"]
    (row,) = _table("bf16", spec, _us(D128, tflops), {"cudnn": _us(D128, 600.0), "flash": None})
    assert row["ours_tflops"] == pytest.approx(tflops)
    assert row["best_torch"] == "cudnn" and row["ratio"] == pytest.approx(tflops / 600.0)
    (tv,) = [v for v in row["verdicts"] if v["what"].startswith("TFLOP/s")]
    assert tv["what"] == "TFLOP/s >= 720" and tv["met"] is met
    assert row["met"] is met  # (the ratio verdict is met either way here)


def test_ratio_verdict_flips_when_torch_is_faster():
    spec = [s for s in at.BF16_ROWS if s["id"] == "d256"]  # no TFLOP/s target: the ratio alone
    fl = at.flops(spec[0]["shape"])
    for torch_tf, met in ((650.0, True), (700.0, False)):
        (row,) = _table("bf16", spec, _us(fl, 680.0), {"flash": _us(fl, 300.0), "cudnn": _us(fl, torch_tf)})
        assert [v["what"] for v in row["verdicts"]] == ["best torch time / ours >= 1.0"]
        assert row["met"] is met


@pytest.mark.parametrize("graph, eager, met", [(4.9, 9.9, (True, True)), (5.1, 9.9, (False, True)),
                                               (4.9, 10.1, (True, False))])
def test_small_problem_us_targets(graph, eager, met):
    spec = [s for s in at.BF16_ROWS if s["id"] == "seed"]
    (row,) = _table("bf16", spec, graph, {"cudnn": 20.0}, eager)
    got = {v["what"].split(" <=")[0]: v["met"] for v in row["verdicts"]}
    assert (got["graph µs"], got["eager µs per synchronised call"]) == met
    assert row["met"] is all(met)
    (row,) = _table("bf16", spec, graph, {"cudnn": 20.0}, None)  # no eager figure: not met, never assumed
    assert not [v for v in row["verdicts"] if v["what"].startswith("eager")][0]["met"]


def test_skipped_rows_keep_their_reason():
    specs = [s for s in at.FP8_ROWS if s["id"] in ("f8d128", "f8varlen")]
    t = at.targets_table("e4m3", specs, {"f8d128": {"skipped": "no variant: attention_fp8 head_dim 128"}})
    assert [r["skipped"] for r in t] == ["no variant: attention_fp8 head_dim 128", "ours did not run"]
    assert all(r["met"] is None and r["verdicts"] == [] for r in t)


def test_published_figures_beside_their_rows():
    pub = {s["id"]: [(p["who"], p["tflops"]) for p in at.published_for(d, s)]
           for d, rows in (("bf16", at.BF16_ROWS), ("e4m3", at.FP8_ROWS)) for s in rows}
    assert pub["d128"] == [("FA3", 648)] and pub["d128c"] == []
    assert pub["gqa"] == [("cuDNN 9.19", 702)] and pub["gqac"] == [("cuDNN 9.19", 673)]
    assert pub["d256"] == [("FA3", 756)] and pub["d256c"] == [("FA3", 642)]
    assert pub["f8d128"] == [("FA3", 1008)] and pub["f8d256"] == [("FA3", 1171)]
    assert pub["f8gqa"] == [("cuDNN 9.19", 1055)]
    assert pub["seed"] == pub["f8varlen"] == []
    assert all(p["source"] and p["device"] for p in at.PUBLISHED)


def test_chart_and_summary_from_runs(tmp_path):
    import json

    from factory.benchmark import dump_summary

    specs = at.BF16_ROWS[:2] + at.BF16_ROWS[-1:]
    raws = []
    for tf in (700.0, 725.0):
        measured = {s["id"]: {"ours_us": _us(at.flops(s["shape"]), tf) if s["shape"][3] > 1024 else 4.0,
                              "torch_us": {"cudnn": _us(at.flops(s["shape"]), 600.0) if s["shape"][3] > 1024 else 9.0},
                              "ours_eager_us": 12.0} for s in specs}
        measured[specs[1]["id"]] = {"skipped": "no variant"}
        raws.append({"device": "GPU", "torch": "t", "date": "d", "measured": {"bf16": measured},
                     "tables": {"bf16": at.targets_table("bf16", specs, measured)}})
    s = at.summary(raws)
    rows = {r[0]: r for r in s["rows"]}
    assert s["verdicts"]["d128"] == ["TFLOP/s >= 720"] and s["verdicts"]["every row (last)"] == at.RATIO
    assert rows["d128"][1:3] == ["TF/s", [700.0, 725.0]] and rows["d128"][6] == [[0, 1], [1, 1]]
    assert s["skipped"] == {"d128c": "no variant"} and "d128c" not in rows
    assert rows["seedc"][1:3] == ["µs", [4.0, 4.0]] and rows["seedc"][7] == {"eager_us": [12.0, 12.0]}
    assert rows["seedc"][6] == [[1, 0, 1], [1, 0, 1]]
    assert len(dump_summary(s)) < 4096
    json.loads(dump_summary(s))
    p = tmp_path / "t.png"
    assert at.chart_targets(raws[0]["tables"], p, "test") in ("matplotlib", "bar_chart_png")
    assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
