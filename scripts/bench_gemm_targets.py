#!/usr/bin/env python3
"""The GEMM targets table: each speed target of the Hopper GEMM forms, measured in one run beside
its reference, with the verdict.

One row per target (``TARGETS``): bf16 over the off-grid report half vs cuBLAS (graph-replay
geomean, lowest, eager geomean) and 8192^3 TFLOP/s; row-wise fp8 vs ``torch._scaled_mm`` row-wise
(geomean, lowest); block-scaled fp8 TFLOP/s at 4096x7168x16384 and geomean vs torch's block-scaled
``_scaled_mm`` (or a bf16 mm of the dequantized operands where this torch has none: the JSON says
which ran); grouped bf16 vs ``torch._grouped_mm`` on DeepSeek-V3 / Qwen3-MoE / Mixtral expert
shapes (geomean and every row); grouped fp8 block-scaled TFLOP/s, contiguous 8 x 8192 rows, N 4096,
K 7168.  The measurements are the other benches' own functions (imported, not copied):
``bench_offgrid.sweep`` (selection's pick only), ``bench_fp8.bench_row`` / ``bench_block``,
``bench_grouped.bench_contig`` / ``bench_fp8``.  So: same-run references, CUDA events around
graph replays (and eager where the target says so), medians, fresh random inputs, NaN-poisoned
outputs, values checked against float32 (of the dequantized operands for fp8).

Each row: ours, the reference, their ratio, the target, met / not met (``target_table``, a pure
function of the measured rows).  ``OUT.json``: everything measured (raw, outside the tree);
``OUT.summary.json``: the table plus per-shape ratio sub-tables (a few KB, what notes/results
keeps); ``OUT.png``: one panel per target group (ratio or TFLOP/s bars, the target as a line).

    python3 scripts/bench_gemm_targets.py --bundle B --out OUT [--quick] [--groups bf16 fp8_row ...]
    python3 scripts/bench_gemm_targets.py --replot OUT.summary.json --out OUT2   # the PNG again, no GPU
    python3 scripts/bench_gemm_targets.py --replot OUT.json --out OUT2   # summary and PNG from the raw file
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from factory.benchmark import bar_chart_png, compact_json, default_out  # noqa: E402

# (key, group, what, measure, target): measure "geomean" / "lowest" / "eager" compare a time ratio
# (reference time / ours) with the target; "tflops" compares our TFLOP/s.
TARGETS = [
    ("bf16_geomean", "bf16", "bf16 report half vs cuBLAS, graph replay geomean", "geomean", 1.05),
    ("bf16_lowest", "bf16", "bf16 report half vs cuBLAS, lowest", "lowest", 0.95),
    ("bf16_eager", "bf16", "bf16 report half vs cuBLAS, eager geomean", "eager", 1.00),
    ("bf16_8192", "bf16_8192", "bf16 8192^3 TFLOP/s (reference: cuBLAS)", "tflops", 760.0),
    ("fp8_row_geomean", "fp8_row", "row-wise fp8 vs torch._scaled_mm row-wise, geomean", "geomean", 1.10),
    ("fp8_row_lowest", "fp8_row", "row-wise fp8 vs torch._scaled_mm row-wise, lowest", "lowest", 0.97),
    ("fp8_block_tflops", "fp8_block_4096", "block-scaled fp8 4096x7168x16384 TFLOP/s", "tflops", 1300.0),
    ("fp8_block_geomean", "fp8_block", "block-scaled fp8 vs torch block-scaled, DeepSeek-V3 shapes, geomean",
     "geomean", 1.00),
    ("grouped_bf16_geomean", "grouped_bf16", "grouped bf16 vs torch._grouped_mm, geomean", "geomean", 1.10),
    ("grouped_bf16_lowest", "grouped_bf16", "grouped bf16 vs torch._grouped_mm, every row", "lowest", 1.10),
    ("grouped_fp8_tflops", "grouped_fp8", "grouped fp8 block-scaled, contiguous 8x8192 rows, N 4096, K 7168, TFLOP/s",
     "tflops", 1200.0),
]
# Published figure shown beside ours (data, not a target): DeepGEMM's normal-GEMM kernel on the
# power-capped H800, as the README of github.com/deepseek-ai/DeepGEMM quoted it (news of
# 2025-04-18: "up to 1550 TFLOPS on H800", PRs #74 #78 #81 #86; 1426-1550 over its dense shapes).
DEEPGEMM_H800_TFLOPS = {"low": 1426, "high": 1550, "device": "H800 (power-capped)",
                        "source": "github.com/deepseek-ai/DeepGEMM README, 2025-04-18 (PRs #74-#86)"}
M_REPORT = (1, 128, 512, 2048, 8192)
# ours / reference: µs (the geomean over the rows, or the lowest row's), or TFLOP/s for the keys
# ending in _tflops and bf16_8192; the verdict compares the ratio (reference time / ours), or our
# TFLOP/s, with the target.
SUMMARY_COLUMNS = ("key", "ours", "reference", "ratio", "target", "verdict", "below", "at")


def _geo(xs) -> float:
    xs = [x for x in xs if x is not None and x == x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def _verdict(value, target) -> str:
    if value is None or value != value:
        return "not measured"
    return "met" if value >= target else "not met"


def _r(x, nd=3):
    return None if x is None or x != x else round(x, nd)


def target_table(groups: dict) -> list[dict]:
    """The targets table from measured rows (pure: no GPU).  ``groups`` maps a group name (the
    second field of ``TARGETS``) to a list of rows ``{"shape", "ours_us", "ref_us", "flop",
    ["ours_eager_us", "ref_eager_us"], "ok"}`` and optionally ``"ref_name"``.  Per target: ours and
    the reference (geomean of µs over the rows, or the lowest row's µs, or TFLOP/s of the first
    row), ratio = reference time / ours, the compared value, the target, met / not met / not
    measured (a group with no rows), how many rows fall below the target, whether every row's
    output passed its checks."""
    out = []
    for key, group, what, measure, target in TARGETS:
        rows = [r for r in groups.get(group) or [] if r.get("ours_us") and r.get("ref_us")]
        row = {"key": key, "what": what, "target": target, "shapes": len(rows)}
        ok = all(r.get("ok", False) for r in rows) if rows else None
        if not rows:
            row.update(ours=None, reference=None, ratio=None, value=None)
        elif measure in ("geomean", "eager"):
            o, f = ("ours_eager_us", "ref_eager_us") if measure == "eager" else ("ours_us", "ref_us")
            ours, ref = _geo(r.get(o) for r in rows), _geo(r.get(f) for r in rows)
            row.update(unit="us geomean", ours=_r(ours, 1), reference=_r(ref, 1), ratio=_r(ref / ours, 4),
                       value=ref / ours, below=sum(r[f] / r[o] < target for r in rows if r.get(o) and r.get(f)))
        elif measure == "lowest":
            lo = min(rows, key=lambda r: r["ref_us"] / r["ours_us"])
            row.update(unit="us", ours=_r(lo["ours_us"], 1), reference=_r(lo["ref_us"], 1),
                       ratio=_r(lo["ref_us"] / lo["ours_us"], 4), value=lo["ref_us"] / lo["ours_us"],
                       at=lo["shape"], below=sum(r["ref_us"] / r["ours_us"] < target for r in rows))
        else:  # tflops of the group's first row
            r = rows[0]
            ours, ref = r["flop"] / r["ours_us"] / 1e6, r["flop"] / r["ref_us"] / 1e6
            row.update(unit="TFLOP/s", ours=_r(ours, 1), reference=_r(ref, 1), ratio=_r(r["ref_us"] / r["ours_us"], 4),
                       value=ours)
        row["reference_is"] = next((r["ref_name"] for r in rows if r.get("ref_name")), None)
        row["value"] = _r(row["value"], 4)
        row["verdict"] = _verdict(row["value"], target)
        row["outputs_ok"] = ok
        out.append(row)
    return out


# --- the measured rows of each group, in target_table's form ------------------------------------
def _dense_row(M, N, K, ours_us, ref_us, ok, **extra) -> dict:
    return {"shape": f"{M}x{N}x{K}", "M": M, "N": N, "K": K, "flop": 2.0 * M * N * K, "ours_us": ours_us,
            "ref_us": ref_us, "ok": ok, **extra}


def measure_bf16(bundle, l2, shapes, log, deadline: float = float("inf")) -> list[dict]:
    """bench_offgrid.sweep with the selection's pick only (its eager calls too); no shape is
    started after ``deadline`` (time.time())."""
    import torch

    from bench_offgrid import sweep

    rows = []
    for fam, proj, M, N, K in shapes:
        if time.time() > deadline:
            log(f"bf16: time budget spent, {len(rows)} of {len(shapes)} shapes measured")
            break
        r = sweep(bundle, M, N, K, "bf16", l2, None, False, True)
        rows.append(_dense_row(M, N, K, r["ours_us"], r["ref_us"], r["nan"] == 0 and r["rel_err"] < 2e-2,
                               ours_eager_us=r["ours_eager_us"], ref_eager_us=r["ref_eager_us"], family=fam,
                               proj=proj, variant=r["pick"], nan=r["nan"], rel_err=r["rel_err"],
                               ref_name="torch.mm (cuBLAS)"))
        log(f"bf16 {fam:>11} {M:>6}x{N:>6}x{K:>6} ours {r['ours_us']:9.1f} cuBLAS {r['ref_us']:9.1f} "
            f"x{r['ratio']:.3f} eager x{r['eager_ratio']:.3f} err {r['rel_err']:.1e} nan {r['nan']} {r['pick']}")
        torch.cuda.empty_cache()
    return rows


def measure_fp8(bundle, l2, form: str, shapes, log) -> list[dict]:
    """bench_fp8.bench_row / bench_block (errors against float32 of the dequantized operands)."""
    import torch

    import bench_fp8

    fn = bench_fp8.bench_row if form == "row" else bench_fp8.bench_block
    rows = []
    for M, N, K in shapes:
        r = fn(bundle, M, N, K, l2)
        rows.append(_dense_row(M, N, K, r["ours_us"], r["ref_us"], r["nan"] == 0 and r["rel_err"] < 2e-2,
                               variant=r["variant"], nan=r["nan"], rel_err=r["rel_err"], ref_name=r["ref"]
                               + (" (use_fast_accum as our variant)" if "ref_fast_accum" in r else ""),
                               ref_fast_accum=r.get("ref_fast_accum"),
                               ref_rel_err=r.get("ref_rel_err")))
        log(f"fp8 {form:5} {M:>6}x{N:>6}x{K:>6} ours {r['ours_us']:9.1f} ({r['ours_tflops']:6.0f} TF) ref "
            f"{r['ref_us']:9.1f} x{r['ratio']:.3f} err {r['rel_err']:.1e} nan {r['nan']} {r['variant']} | {r['ref']}")
        torch.cuda.empty_cache()
    return rows


def measure_grouped(bundle, cases, gen, log) -> list[dict]:
    """bench_grouped.bench_contig per (model, projection, routed rows), checked against float32."""
    import torch

    from bench_grouped import bench_contig

    rows = []
    for model, proj, E, N, K, M in cases:
        r = bench_contig(bundle, E, N, K, M, gen, False, f32=True)
        rows.append({"shape": f"{model} {proj} E{E} {N}x{K} {M}", "model": model, "proj": proj, "E": E, "N": N,
                     "K": K, "routed": M, "M_total": r["M_total"], "flop": 2.0 * r["M_total"] * N * K,
                     "ours_us": r["ours_us"], "ref_us": r["torch_us"], "ours_eager_us": r["ours_eager_us"],
                     "ref_eager_us": r["torch_eager_us"], "ok": bool(r["ok"]), "variant": r["variant"],
                     "empty": r["empty"], "max_rows": r["max_rows"], "rel_err_f32": r["rel_err_f32"],
                     "ref_name": "torch._grouped_mm (bf16)"})
        log(f"grouped {model:>15} {proj:>7} E{E:<3} {N}x{K} routed {M:>6} ours {r['ours_us']:9.1f} torch "
            f"{r['torch_us']:9.1f} x{r['speedup']:.3f} f32 err {r['rel_err_f32']:.1e} ok {r['ok']} {r['variant']}")
        torch.cuda.empty_cache()
    return rows


def measure_grouped_fp8(bundle, gen, log) -> list[dict]:
    """bench_grouped.bench_fp8 on 8 groups x 8192 rows, N 4096, K 7168 (block-scaled row kept)."""
    import torch

    from bench_grouped import bench_fp8

    rows = []
    for r in bench_fp8(bundle, "8x8192", 8, 4096, 7168, [8192] * 8, gen):
        log(f"grouped fp8 {r['form']} 8x8192 N4096 K7168 ours {r['ours_us']:9.1f} ({r['ours_tflops']:6.0f} TF) "
            f"torch bf16 {r['torch_bf16_us']:9.1f} ours bf16 {r['ours_bf16_us']:9.1f} ok {r['ok']} {r['variant']}")
        if r["form"] == "block":
            rows.append({"shape": "8x8192 N4096 K7168", "flop": 2.0 * r["M_total"] * 4096 * 7168,
                         "ours_us": r["ours_us"], "ref_us": r["torch_bf16_us"], "ok": bool(r["ok"]),
                         "ours_bf16_us": r["ours_bf16_us"], "variant": r["variant"], "max_abs_err": r["max_abs_err"],
                         "ref_name": "torch._grouped_mm bf16 (unquantized operands; torch has no block-scaled "
                                     "grouped mm)"})
    torch.cuda.empty_cache()
    return rows


# --- the summary a note keeps -------------------------------------------------------------------
def _sub(rows, col: str, key) -> dict:
    """Per-shape ratios (reference time / ours, 2 decimals) as {``col``: its sorted values, key:
    [ratio per value or None]}: a sub-table of one line per key."""
    cols = sorted({r[col] for r in rows})
    table = {}
    for r in rows:
        table.setdefault(key(r), [None] * len(cols))[cols.index(r[col])] = round(r["ref_us"] / r["ours_us"], 2)
    return {col: cols, **table}


def summary(meta: dict, groups: dict, table: list[dict]) -> dict:
    nk = lambda r: f"{r['N']}x{r['K']}"  # noqa: E731
    sub = {}
    if groups.get("bf16"):
        sub["bf16"] = _sub(groups["bf16"], "M", nk)
    for g in ("fp8_row", "fp8_block"):
        if groups.get(g):
            sub[g] = _sub(groups[g], "M", nk)
    if groups.get("grouped_bf16"):
        sub["grouped_bf16"] = _sub(groups["grouped_bf16"], "routed", lambda r: f"{r['model']} {r['proj']}")
    def max_err(rs):  # relative to the largest reference value (rows that record one)
        errs = [r.get("rel_err", r.get("rel_err_f32")) for r in rs]
        return _r(max((e for e in errs if e is not None), default=None), 4)

    checks = {g: [len(rs), all(r.get("ok") for r in rs), sum(r.get("nan", 0) for r in rs), max_err(rs)]
              for g, rs in groups.items() if rs and g != "fp8_block_4096"}  # that row is in fp8_block
    refs = {}
    for (key, group, *_), t in zip(TARGETS, table):
        if t["reference_is"] and t["reference_is"] not in refs.values():
            refs.setdefault(group.replace("_4096", ""), t["reference_is"])
    return {**{k: meta[k] for k in ("device", "torch", "date", "selection", "command", "seconds") if k in meta},
            "targets": {"columns": list(SUMMARY_COLUMNS), "rows": [[t.get(c) for c in SUMMARY_COLUMNS] for t in table]},
            "references": refs, "deepgemm_published": DEEPGEMM_H800_TFLOPS,
            "checks": {"columns": ["rows", "all_ok", "nan", "max_rel_err"], **checks}, "ratios": sub}


def summary_targets(summ: dict) -> list[dict]:
    """The summary's targets table as one dict per row, with ``value`` (what the verdict compared)."""
    cols = summ["targets"]["columns"]
    tflops = {key for key, _, _, measure, _ in TARGETS if measure == "tflops"}
    rows = [dict(zip(cols, row)) for row in summ["targets"]["rows"]]
    return [{**t, "value": t["ours"] if t["key"] in tflops else t["ratio"]} for t in rows]


def chart(summ: dict, path: Path) -> str:
    """One panel per target group: the per-shape ratio bars with the targets as lines, and one
    panel of the TFLOP/s targets (ours, the reference, the target; DeepGEMM's published range).
    matplotlib where installed, else factory.benchmark.bar_chart_png (value / target per row)."""
    targets = summary_targets(summ)
    tab = {t["key"]: t for t in targets}
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        bar_chart_png(path, [[(t["value"] or 0.0) / t["target"] for t in targets]], ["tab:blue"], bar_px=12)
        return "bar_chart_png"
    panels = [("bf16", "bf16 report half vs cuBLAS", ["bf16_geomean", "bf16_lowest"]),
              ("fp8_row", "row-wise fp8 vs torch._scaled_mm", ["fp8_row_geomean", "fp8_row_lowest"]),
              ("fp8_block", "block-scaled fp8 vs torch", ["fp8_block_geomean"]),
              ("grouped_bf16", "grouped bf16 vs torch._grouped_mm", ["grouped_bf16_geomean", "grouped_bf16_lowest"])]
    fig, axes = plt.subplots(3, 2, figsize=(15, 11), gridspec_kw={"height_ratios": [1.2, 1, 1]})
    axes = axes.ravel()
    for ax, (g, title, keys) in zip([axes[0], axes[2], axes[3], axes[4]], panels):
        sub = summ["ratios"].get(g)
        if not sub:
            ax.set_title(f"{title}: not measured", fontsize=9)
            continue
        labels, vals = [], []
        by, cols = next(iter(sub.items()))  # the column values first (M, or routed rows)
        for k, v in list(sub.items())[1:]:
            for c, x in zip(cols, v):
                if x is not None:
                    labels.append(f"{k} {by} {c}" if g == "grouped_bf16" else f"{c}x{k}")
                    vals.append(x)
        colors = ["tab:blue" if x >= tab[keys[-1]]["target"] else "tab:red" for x in vals]
        ax.bar(range(len(vals)), vals, color=colors)
        for k in keys:
            ax.axhline(tab[k]["target"], color="k", lw=0.8, ls="--")
        ax.axhline(1.0, color="gray", lw=0.5)
        ax.set_ylim(0, max(vals + [1.2]) * 1.08)
        if len(vals) > 60:  # too many to name: the JSON's order (per N x K, M ascending)
            ax.set_xticks([])
            ax.set_xlabel("per N x K of the JSON's ratios, M ascending", fontsize=7)
        else:
            ax.set_xticks(range(len(vals)), labels, rotation=90, fontsize=6)
        ax.set_ylabel("reference time / ours", fontsize=8)
        verdicts = "; ".join(f"{k.split('_')[-1]} {tab[k]['value']} (target {tab[k]['target']}: {tab[k]['verdict']})"
                             for k in keys)
        ax.set_title(f"{title}, {len(vals)} shapes: {verdicts}", fontsize=8)
    ax = axes[1]  # TFLOP/s targets
    names = [("bf16_8192", "bf16 8192^3"), ("fp8_block_tflops", "fp8 block 4096x7168x16384"),
             ("grouped_fp8_tflops", "grouped fp8 block 8x8192")]
    for i, (k, lab) in enumerate(names):
        t = tab[k]
        ax.bar(i - 0.2, t["ours"] or 0, 0.4, color="tab:blue", label="ours" if i == 0 else None)
        ax.bar(i + 0.2, t["reference"] or 0, 0.4, color="tab:gray", label="reference (same run)" if i == 0 else None)
        ax.hlines(t["target"], i - 0.45, i + 0.45, color="r", lw=1.5, label="target" if i == 0 else None)
        ax.text(i, t["target"], f"{t['target']:.0f}: {t['verdict']}", fontsize=7, ha="center", va="bottom")
    d = summ["deepgemm_published"]
    ax.vlines(1.45, d["low"], d["high"], color="tab:green", lw=6, label=f"DeepGEMM published, {d['device']}")
    ax.set_xticks(range(len(names)), [lab for _, lab in names], fontsize=8)
    ax.set_ylabel("TFLOP/s", fontsize=8)
    top = [d["high"]] + [tab[k][c] or 0 for k, _ in names for c in ("ours", "reference")]
    ax.set_ylim(0, max(top) * 1.2)
    ax.legend(fontsize=7, loc="upper left")
    ax.set_title("TFLOP/s targets (reference: cuBLAS / torch block-scaled / torch._grouped_mm bf16)", fontsize=9)
    ax = axes[5]  # the verdicts as text
    ax.axis("off")
    lines = [f"{t['key']:<22} {t['value'] if t['value'] is not None else '-':>8}  target {t['target']:<6} "
             f"{t['verdict']}" for t in targets]
    ax.text(0, 1, "\n".join(lines), family="monospace", fontsize=8, va="top")
    fig.suptitle(f"GEMM targets on {summ.get('device', '?')}, {summ.get('date', '')} (torch {summ.get('torch', '?')})",
                 fontsize=10)
    fig.tight_layout()
    _save_small(fig, path)
    plt.close(fig)
    return "matplotlib"


def _save_small(fig, path: Path) -> None:
    """The figure as a PNG of a 96-colour palette where Pillow is there (a third of the RGBA size)."""
    import io

    buf = io.BytesIO()
    fig.savefig(buf, dpi=72, format="png")
    try:
        from PIL import Image
    except ImportError:
        Path(path).write_bytes(buf.getvalue())
        return
    img = Image.open(io.BytesIO(buf.getvalue())).convert("RGB")
    img.quantize(96, method=Image.Quantize.FASTOCTREE).save(path, optimize=True)


# --- the run --------------------------------------------------------------------------------------
GROUP_NAMES = ("fp8_block", "grouped_fp8", "fp8_row", "grouped_bf16", "bf16")  # the longest last


def plan(quick: bool, ms) -> dict:
    """What each group measures (``quick``: a subsample for a dry run; the table is the full one)."""
    import bench_fp8
    import bench_grouped
    from bench_offgrid import REPORT, family_shapes

    bf16 = family_shapes(REPORT, tuple(ms))
    row = [(m, n, k) for n, k in bench_fp8.ROW_NK for m in bench_fp8.ROW_M]
    block = list(dict.fromkeys(bench_fp8.BLOCK_SHAPES))  # 4096x7168x16384 first: the TFLOP/s target's row
    grouped = [(model, proj, E, N, K, M) for model, (E, projs) in bench_grouped.MODELS.items()
               for proj, N, K in projs for M in bench_grouped.ROUTED]
    if quick:
        bf16, row, block, grouped = bf16[::9], row[::7], block[:3], grouped[::5]
    return {"bf16": bf16, "fp8_row": row, "fp8_block": block, "grouped_bf16": grouped}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bundle")
    p.add_argument("--out", default=default_out("bench_gemm_targets"))
    p.add_argument("--quick", action="store_true", help="a subsample of every group (a dry run, not the table)")
    p.add_argument("--groups", nargs="+", default=list(GROUP_NAMES), choices=GROUP_NAMES)
    p.add_argument("--m", nargs="+", type=int, default=list(M_REPORT), help="M values of the bf16 report half")
    p.add_argument("--budget-s", type=float, default=1e9, help="start no bf16 shape after this many seconds")
    p.add_argument("--replot", default=None, metavar="JSON", help="no GPU: OUT.png from a summary, or OUT.summary.json "
                   "and OUT.png from a raw OUT.json (its measured rows)")
    a = p.parse_args(argv)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if a.replot:
        summ = json.loads(Path(a.replot).read_text())
        if "groups" in summ:  # a raw file: the table and summary again from its rows
            summ = summary(summ, summ["groups"], target_table(summ["groups"]))
            Path(str(out) + ".summary.json").write_text(compact_json(summ) + "\n")
        print(chart(summ, Path(str(out) + ".png")))
        return 0
    if not a.bundle:
        p.error("--bundle is required")
    import torch

    from factory.runtime import Bundle

    t0 = time.time()
    torch.manual_seed(int(t0))
    bundle = Bundle.open(a.bundle)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    gen = torch.Generator().manual_seed(1234)  # bench_grouped's routing draws
    todo = plan(a.quick, a.m)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "selection": "tuning table" if bundle.tuning is not None else f"cost model ({bundle._tuning[1]})",
            "command": "python3 scripts/bench_gemm_targets.py " + " ".join(sys.argv[1:] if argv is None else argv)}
    log = lambda s: print(s, flush=True)  # noqa: E731
    groups, errors = {}, {}
    for g in a.groups:
        try:
            if g == "bf16":
                groups["bf16_8192"] = measure_bf16(bundle, l2, [("extra", "", 8192, 8192, 8192)], log)
                groups["bf16"] = measure_bf16(bundle, l2, todo["bf16"], log, t0 + a.budget_s)
            elif g in ("fp8_row", "fp8_block"):
                groups[g] = measure_fp8(bundle, l2, g[4:], todo[g], log)
                if g == "fp8_block":
                    groups["fp8_block_4096"] = [r for r in groups[g] if r["shape"] == "4096x7168x16384"]
            elif g == "grouped_bf16":
                groups[g] = measure_grouped(bundle, todo[g], gen, log)
            else:
                groups[g] = measure_grouped_fp8(bundle, gen, log)
        except Exception as e:  # noqa: BLE001 - one group's failure leaves the others' rows
            errors[g] = f"{type(e).__name__}: {str(e)[:300]}"
            log(f"{g}: FAILED {errors[g]}")
        torch.cuda.empty_cache()
        Path(str(out) + ".partial.json").write_text(json.dumps({**meta, "groups": groups, "errors": errors}))
    meta["seconds"] = round(time.time() - t0, 1)
    table = target_table(groups)
    summ = summary(meta, groups, table)
    if errors:
        summ["errors"] = errors
    Path(str(out) + ".json").write_text(json.dumps({**meta, "errors": errors, "targets": table, "groups": groups},
                                                   indent=1))
    Path(str(out) + ".summary.json").write_text(compact_json(summ) + "\n")
    how = chart(summ, Path(str(out) + ".png"))
    for t in table:
        log(f"{t['key']:<22} ours {t['ours']} ref {t['reference']} ratio {t['ratio']} value {t['value']} "
            f"target {t['target']}: {t['verdict']} (rows {t['shapes']}, outputs ok {t['outputs_ok']})")
    log(f"bench_gemm_targets: {meta['seconds']} s, chart by {how}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
