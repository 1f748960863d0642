#!/usr/bin/env python3
"""The GEMM off the tuning grid: projection shapes of public model families, split into a half the
cost model may be fitted on and a half it is only reported on.

Per shape, in one run on the GPU present: every variant of the bundle that takes the problem
(an every-tile sweep, as scripts/tune.py times a bucket) and the reference (``torch.mm``, cuBLAS;
fp8 row-wise: ``torch._scaled_mm`` with (M, 1) and (1, N) scales) in the same interleaved passes
of CUDA-graph replays over fresh random input sets rotated past twice the L2 (factory.benchmark
``time_interleaved``: screen every candidate, then the ones within 1.2x of the best screen, the
selection's pick and the reference in round-robin passes; medians of per-pass medians).  Then
eager calls of the selection's pick and of the reference.  The pick's NaN-poisoned outputs are
checked for NaN and its error against float32 on a slice of rows.

Per shape that gives: ours as the selection picks (cost model, no tuning table) / the reference,
graph and eager, and the cost model's regret: the pick's time / the fastest variant's time.  The
sweep of the tune half is written as a tuning table (``OUT.table.json``, scripts/tune.py's schema:
per shape every screened time) that ``scripts/fit_cost_model.py`` fits the model on; the report
half's sweep is only scored.

    python3 scripts/bench_offgrid.py --bundle B --half report --out OUT   # OUT.json, OUT.png
    python3 scripts/bench_offgrid.py --bundle B --half tune --out OUT2    # + OUT2.table.json
    python3 scripts/bench_offgrid.py --bundle B --fp8-row --out OUT3       # row-wise fp8, M >= 512
    python3 scripts/bench_offgrid.py --bundle B --pick-only --out OUT4     # the selection alone, no sweep

Raw output goes to ``--out`` (outside the tree); a partial file is rewritten after every shape.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from factory import testing  # noqa: E402
from factory.benchmark import default_out, gemm_bytes, sets_for, time_eager, time_interleaved  # noqa: E402
from factory.runtime import Bundle, InputError, NoVariantError, tuning  # noqa: E402

# (projection, N, K) per model family: the weights' (out_features, in_features) as a server fuses
# them (q/k/v into one, gate/up into one), with the tensor-parallel split where one is common.
FAMILIES = {
    "llama3": [  # Llama 3 8B, 70B, and 70B split over 8 GPUs
        ("8b.qkv", 6144, 4096), ("8b.o", 4096, 4096), ("8b.gate_up", 28672, 4096), ("8b.down", 4096, 14336),
        ("70b.qkv", 10240, 8192), ("70b.o", 8192, 8192), ("70b.gate_up", 57344, 8192), ("70b.down", 8192, 28672),
        ("70b-tp8.qkv", 1280, 8192), ("70b-tp8.o", 8192, 1024), ("70b-tp8.gate_up", 7168, 8192),
        ("70b-tp8.down", 8192, 3584)],
    "qwen": [  # Qwen2.5-7B, Qwen3-32B, Qwen2.5-72B split over 4 GPUs
        ("2.5-7b.qkv", 4608, 3584), ("2.5-7b.o", 3584, 3584), ("2.5-7b.gate_up", 37888, 3584),
        ("2.5-7b.down", 3584, 18944), ("3-32b.qkv", 10240, 5120), ("3-32b.o", 5120, 8192),
        ("3-32b.gate_up", 51200, 5120), ("3-32b.down", 5120, 25600), ("2.5-72b-tp4.qkv", 2560, 8192),
        ("2.5-72b-tp4.down", 8192, 7392)],
    "moe_expert": [  # one routed expert: Qwen3-30B-A3B, Qwen3-235B-A22B (few tokens per expert)
        ("q3-30b-a3b.gate_up", 1536, 2048), ("q3-30b-a3b.down", 2048, 768),
        ("q3-235b-a22b.gate_up", 3072, 4096), ("q3-235b-a22b.down", 4096, 1536)],
    "mistral": [  # Mistral NeMo 12B, Mistral Small 24B split over 2 GPUs, Mixtral 8x22B (attention, expert)
        ("nemo-12b.qkv", 6144, 5120), ("nemo-12b.o", 5120, 4096), ("nemo-12b.gate_up", 28672, 5120),
        ("nemo-12b.down", 5120, 14336), ("small-24b-tp2.qkv", 3072, 5120), ("small-24b-tp2.o", 5120, 2048),
        ("small-24b-tp2.gate_up", 32768, 5120), ("small-24b-tp2.down", 5120, 16384),
        ("8x22b.qkv", 8192, 6144), ("8x22b.o", 6144, 6144), ("8x22b.expert.gate_up", 32768, 6144),
        ("8x22b.expert.down", 6144, 16384)],
    "gemma": [  # Gemma 2 9B, Gemma 3 27B
        ("2-9b.qkv", 8192, 3584), ("2-9b.o", 3584, 4096), ("2-9b.gate_up", 28672, 3584), ("2-9b.down", 3584, 14336),
        ("3-27b.qkv", 8192, 5376), ("3-27b.o", 5376, 4096), ("3-27b.gate_up", 43008, 5376),
        ("3-27b.down", 5376, 21504)],
    "deepseek_v3": [  # q_a + kv_a, q_b, kv_b, o, expert gate_up, expert down
        ("q_a+kv_a", 2112, 7168), ("q_b", 24576, 1536), ("kv_b", 32768, 512), ("o", 7168, 16384),
        ("expert.gate_up", 4096, 7168), ("expert.down", 7168, 2048)],
}
# Fixed before anything was measured: the cost model may be fitted on TUNE only; REPORT is scored.
TUNE = ("qwen", "moe_expert", "llama3")
REPORT = ("deepseek_v3", "gemma", "mistral")
M_DENSE = (1, 16, 128, 512, 2048, 8192, 16384)
M_EXPERT = (1, 16, 64, 128, 512)
# Problems beside the families: grids of too few tiles for the SMs, N and K off the tile, and 8192^3.
EXTRA = [(64, 2112, 7168), (2048, 2112, 7168), (3000, 5000, 7000), (8192, 8192, 8192)]
MAX_FLOP = 2 * 16384 * 28672 * 8192  # bigger problems are left out (a sweep of them takes seconds)
# fp8 row-wise: scripts/bench_fp8.py's row shapes from M = 512 (the swap tiles win below).
FP8_ROW = [(m, n, k) for n, k in ((4096, 4096), (14336, 4096), (4096, 14336), (2112, 7168), (7168, 2048),
                                  (24576, 1536)) for m in (512, 2048, 8192)]
SCREEN_KEEP = 1.2
MODEL_CUT = 5.0  # as scripts/tune.py: variants the cost model puts 5x behind its best are not timed


def family_shapes(families, ms_dense=M_DENSE) -> list[tuple[str, str, int, int, int]]:
    out = []
    for fam in families:
        for proj, n, k in FAMILIES[fam]:
            for m in (M_EXPERT if fam == "moe_expert" else ms_dense):
                if 2 * m * n * k <= MAX_FLOP:
                    out.append((fam, proj, m, n, k))
    return out


def sweep(bundle, M, N, K, dtype: str, l2: int, among: set | None = None, everything: bool = False,
          pick_only: bool = False) -> dict:
    """Every fitting variant and the reference on one problem (module docstring).  ``among``: a
    subset of the bundle's variants (e.g. its default tier) whose own cost-model pick is also
    always timed (``pick_among``).  ``pick_only``: only the pick(s) and the reference (the
    selection end to end; no regret)."""
    import torch

    from factory.runtime.gemm import fitting_variants, rkl_spec, select

    fp8_row = dtype == "e4m3-row"
    n_sets = sets_for(gemm_bytes(M, N, K, "e4m3" if fp8_row else dtype), l2)
    if fp8_row:
        probs = [testing.fp8_scaled_problem("row", M, N, K) for _ in range(n_sets)]
        A, B = [p[0] for p in probs], [p[1] for p in probs]
        SA, SB = [p[2]["scale_a"] for p in probs], [p[2]["scale_b"] for p in probs]
        C = [torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda") for _ in range(n_sets)]
        bundle.gemm(A[0], B[0], C[0], scale_a=SA[0], scale_b=SB[0])
        pick = list(bundle.selections.values())[-1]
        fits = [v for v in bundle.candidates("gemm") if v.get("scale_mode") == "row"
                and not v.get("config", {}).get("early_b") and not v.get("epilogue")]
        kw = lambda i: dict(scale_a=SA[i], scale_b=SB[i])  # noqa: E731
        ref_of = lambda fast: (lambda i: torch._scaled_mm(  # noqa: E731
            A[i], B[i].t(), scale_a=SA[i][:, None], scale_b=SB[i][None, :], out_dtype=torch.bfloat16,
            use_fast_accum=fast))
        ref = ref_of(bundle.manifest["variants"][pick]["fp8_accumulation"] == "fast")
        f32 = lambda rows: probs[0][3][:rows]  # noqa: E731
    else:
        A, B, C = testing.gemm_input_sets(n_sets, M, N, K, dtype)
        specs = (rkl_spec(A[0], "a"), rkl_spec(B[0], "b"), rkl_spec(C[0], "c"))
        fits = fitting_variants(bundle, *specs, dtype, "bf16", [])[0]
        pick = select(bundle, *specs, dtype, "bf16", [])
        kw = lambda i: {}  # noqa: E731
        C_ref = [torch.empty((M, N), dtype=torch.bfloat16, device="cuda") for _ in range(n_sets)]
        ref = lambda i: torch.mm(A[i], B[i].t(), out=C_ref[i])  # noqa: E731
        f32 = lambda rows: A[0][:rows].float() @ B[0].float().t()  # noqa: E731
    sel = bundle.selector
    model = {}
    for v in fits:
        try:
            model[v["name"]] = sel.estimate_us(v["name"], M, N, K, 1)
        except InputError:
            pass
    if model and not everything:
        lo = min(model.values())
        fits = [v for v in fits if model.get(v["name"], 0) <= MODEL_CUT * lo or v["name"] == pick]
    sub = [n for n in model if among and n in among]
    pick_among = min(sub, key=lambda n: (model[n], n)) if sub else pick
    if pick_only:
        fits = [v for v in fits if v["name"] in (pick, pick_among)]
    calls = {}
    for v in fits:
        name = v["name"]
        fn = (lambda i, n=name: bundle.gemm(A[i], B[i], C[i], variant=n, **kw(i)))
        try:
            fn(0)
        except (InputError, NoVariantError):
            continue
        calls[name] = fn
    torch.cuda.synchronize()
    for c in C:
        c.fill_(float("nan"))
    screen = time_interleaved(calls, n_sets, rounds=1, budget_s=0.01, max_reps=5)
    best = min(screen.values())
    keep = [n for n in calls if screen[n] <= SCREEN_KEEP * best or n in (pick, pick_among)]
    timed = time_interleaved({**{n: calls[n] for n in keep}, "_ref": ref}, n_sets, rounds=4, budget_s=0.05,
                             max_reps=8, warm_s=0.03)
    t_ref = timed.pop("_ref")
    # the pick's output, NaN-poisoned before its own calls: every element written, close to float32
    for c in C:
        c.fill_(float("nan"))
    for i in range(n_sets):
        calls[pick](i)
    torch.cuda.synchronize()
    nan = sum(int(torch.isnan(c).sum()) for c in C)
    rows = min(M, 256)
    err = testing.rel_error(C[0][:rows], f32(rows))
    e_ours = time_eager(lambda i: bundle.gemm(A[i], B[i], C[i], **kw(i)), n_sets)
    e_ref = time_eager(ref, n_sets)
    fastest = min(timed, key=timed.get)
    A = B = C = calls = None
    torch.cuda.empty_cache()
    return {"M": M, "N": N, "K": K, "dtype": dtype, "pick": pick, "fastest": fastest, "input_sets": n_sets,
            "ours_us": timed[pick] * 1e6, "best_us": timed[fastest] * 1e6, "ref_us": t_ref * 1e6,
            "ratio": t_ref / timed[pick], "ratio_best": t_ref / timed[fastest], "regret": timed[pick] / timed[fastest],
            "ours_eager_us": e_ours * 1e6, "ref_eager_us": e_ref * 1e6, "eager_ratio": e_ref / e_ours,
            "tflops": 2 * M * N * K / timed[pick] / 1e12, "nan": nan, "rel_err": err,
            "timings_us": {n: round(t * 1e6, 2) for n, t in timed.items()},
            "screen_us": {n: round(t * 1e6, 2) for n, t in screen.items()},
            "model_us": {n: round(t, 2) for n, t in model.items()}, "pick_among": pick_among,
            "ratio_among": t_ref / timed[pick_among] if pick_among in timed else float("nan")}


def geo(xs) -> float:
    xs = [x for x in xs if x == x]
    return math.exp(statistics.mean(math.log(x) for x in xs)) if xs else float("nan")


def summary(rows: list[dict]) -> dict:
    if not rows:
        return {}
    lo = min(rows, key=lambda r: r["ratio"])
    return {"shapes": len(rows), "geomean_ratio": round(geo(r["ratio"] for r in rows), 4),
            "min_ratio": round(lo["ratio"], 3), "min_shape": [lo["M"], lo["N"], lo["K"]],
            "below_0.95": sum(r["ratio"] < 0.95 for r in rows),
            "geomean_eager_ratio": round(geo(r["eager_ratio"] for r in rows), 4),
            "geomean_best_variant_ratio": round(geo(r["ratio_best"] for r in rows), 4),
            "regret_geomean": round(geo(r["regret"] for r in rows), 4),
            "regret_max": round(max(r["regret"] for r in rows), 3),
            "regret_over_1.1": sum(r["regret"] > 1.1 for r in rows),
            "nan": sum(r["nan"] for r in rows), "max_rel_err": max(r["rel_err"] for r in rows)}


def as_table(rows: list[dict], device: dict, manifest_sha: str) -> dict:
    """The sweep in scripts/tune.py's tuning-table schema (one entry per problem, keyed by its
    exact shape), for scripts/fit_cost_model.py."""
    return {"schema": tuning.SCHEMA, "device": device, "manifest_sha256": manifest_sha,
            "method": {"source": "scripts/bench_offgrid.py sweep"},
            "buckets": {f"{r['dtype']}:m{r['M']}_n{r['N']}_k{r['K']}": {
                "shape": [r["M"], r["N"], r["K"], 1], "winner": r["fastest"], "model_pick": r["pick"],
                "timings_us": r["timings_us"], "screen_us": r["screen_us"]} for r in rows}}


def rescore(raw_paths: list[str], bundle_path: str, among: set | None, model: dict | None = None) -> dict:
    """Without a GPU: the measured sweeps of ``raw_paths`` scored for the selection of the host
    library of ``bundle_path``: with ``among`` None its own choice (``fx_gemm_select``, bf16
    rows; a problem whose choice was not measured is counted, not scored), else the least
    estimate of its cost model (``model``: tuning.MODEL-keyed constants instead) among the
    measured variants named in ``among``: per problem the variant picked, that
    variant's measured time (the round-robin median where it was timed, else its screen), the
    reference's time from the same passes, and the regret against the fastest measured variant of
    the same set."""
    from factory.runtime.manifest import load_manifest
    from factory.runtime.selector import Selector

    m = load_manifest(Path(bundle_path))
    sel = Selector(Path(bundle_path) / m["host_library"]["path"], (9, 0), {"name": None, "sm_count": 132})
    if model:
        sel.set_cost_model(sm90={**tuning.MODEL, **model})
    out = {}
    for raw in raw_paths:
        rows, skipped = [], []
        for r in json.loads(Path(raw).read_text())["rows"]:
            t = {**r["screen_us"], **r["timings_us"]}
            names = [n for n in t if n in m["variants"] and (among is None or n in among)]
            if not names:
                continue
            if among is None and r["dtype"] == "bf16":  # the host library's own selection
                M, N, K = r["M"], r["N"], r["K"]
                pick = sel.select("gemm", sel.gemm_problem(
                    (1 << 20, (M, K, 1), (K, 1, 0)), (2 << 40, (N, K, 1), (K, 1, 0)),
                    (3 << 40, (M, N, 1), (N, 1, 0)), "bf16", "bf16", [], False)).name.decode()
                if pick not in t:
                    skipped.append((M, N, K, pick))
                    continue
            else:
                pick = min(names, key=lambda n: (sel.estimate_us(n, r["M"], r["N"], r["K"], 1), n))
            best = min(names, key=t.get)
            rows.append({**{k: r[k] for k in ("family", "proj", "M", "N", "K", "dtype", "ref_us", "eager_ratio",
                                               "nan", "rel_err")},
                         "pick": pick, "fastest": best, "ours_us": t[pick], "pick_timed": pick in r["timings_us"],
                         "ratio": r["ref_us"] / t[pick], "ratio_best": r["ref_us"] / t[best],
                         "regret": t[pick] / t[best]})
        out[raw] = {"summary": {**summary(rows), "not_measured_picks": len(skipped)}, "rows": rows,
                    "not_measured_picks": skipped}
    return out


def chart(rows: list[dict], path: Path, title: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib missing: no chart)")
        return
    fig, ax = plt.subplots(figsize=(max(8, len(rows) * 0.16), 4.2))
    x = range(len(rows))
    ax.bar(x, [r["ratio"] for r in rows], label="cuBLAS / ours (selection's pick)")
    ax.plot(x, [r["ratio_best"] for r in rows], "k.", ms=3, label="cuBLAS / our fastest variant")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhline(0.95, color="r", lw=0.5, ls="--")
    ax.set_xticks(list(x), [f"{r.get('family', '')[:4]} {r['M']}x{r['N']}x{r['K']}" for r in rows],
                  rotation=90, fontsize=4)
    ax.legend(fontsize=7)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bundle", required=True)
    p.add_argument("--half", choices=["tune", "report", "extra", "none"], default="report")
    p.add_argument("--fp8-row", action="store_true", help="also row-wise fp8 (FP8_ROW shapes)")
    p.add_argument("--m", nargs="+", type=int, default=None, help="M values of the dense families")
    p.add_argument("--budget-s", type=float, default=1e9, help="start no shape after this long")
    p.add_argument("--among", default=None, help="a JSON list of variant names (e.g. the default tier): "
                   "their own cost-model pick is timed too")
    p.add_argument("--all", action="store_true", help=f"time even variants the model puts {MODEL_CUT}x behind")
    p.add_argument("--pick-only", action="store_true", help="time only the selection's pick beside the reference "
                   "(no sweep: the regret columns then read 1)")
    p.add_argument("--rescore", nargs="+", default=None, metavar="RAW.json",
                   help="no GPU: score these sweeps for the selection of --bundle's host library (with --among)")
    p.add_argument("--model", default=None, help="with --rescore: a JSON object of cost-model constants")
    p.add_argument("--out", default=default_out("bench_offgrid"))
    a = p.parse_args()
    if a.rescore:
        among = set(json.loads(Path(a.among).read_text())) if a.among else None
        got = rescore(a.rescore, a.bundle, among, json.loads(a.model) if a.model else None)
        for raw, g in got.items():
            print(raw, json.dumps(g["summary"]))
        Path(str(a.out) + ".rescore.json").write_text(json.dumps(got, indent=1))
        return 0
    import torch

    t0 = time.time()
    torch.manual_seed(int(t0))
    bundle = Bundle.open(a.bundle)
    bundle._tuning = (None, "the cost model only (no tuning table)")
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    among = set(json.loads(Path(a.among).read_text())) if a.among else None
    todo = []
    if a.half in ("report", "extra"):
        todo += [("extra", "", m, n, k, "bf16") for m, n, k in EXTRA]
    if a.half in ("tune", "report"):
        todo += [(f, pj, m, n, k, "bf16") for f, pj, m, n, k in
                 family_shapes(TUNE if a.half == "tune" else REPORT, tuple(a.m or M_DENSE))]
    if a.fp8_row:
        todo += [("fp8_row", "", m, n, k, "e4m3-row") for m, n, k in FP8_ROW]
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    dev = bundle.device_info()
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "half": a.half, "tune_families": TUNE,
            "report_families": REPORT, "selection": "cost model (no tuning table)",
            "command": "python3 scripts/bench_offgrid.py " + " ".join(sys.argv[1:])}
    rows = []
    print(f"{len(todo)} problems on {meta['device']}", flush=True)
    for fam, proj, M, N, K, dt in todo:
        if time.time() - t0 > a.budget_s:
            print(f"budget spent: stopping before {fam} {M}x{N}x{K}", flush=True)
            break
        try:
            r = sweep(bundle, M, N, K, dt, l2, among, a.all, a.pick_only)
        except (InputError, NoVariantError, RuntimeError) as e:
            print(f"{fam} {M}x{N}x{K} {dt}: skipped ({type(e).__name__}: {str(e)[:200]})", flush=True)
            continue
        r.update(family=fam, proj=proj)
        rows.append(r)
        print(f"{fam:>11} {proj:>22} {dt:>8} {M:>6} {N:>6} {K:>6}  ours {r['ours_us']:9.1f} ref {r['ref_us']:9.1f} "
              f"x{r['ratio']:.3f} (best x{r['ratio_best']:.3f}, regret {r['regret']:.3f}) eager x{r['eager_ratio']:.2f} "
              f"nan {r['nan']} err {r['rel_err']:.1e}  {r['pick'].split('_ak_bk_')[-1]} | "
              f"{r['fastest'].split('_ak_bk_')[-1]}", flush=True)
        Path(str(out) + ".partial.json").write_text(json.dumps({**meta, "rows": rows}))
    groups = {}
    for r in rows:
        groups.setdefault("fp8_row" if r["dtype"] == "e4m3-row" else
                          ("extra" if r["family"] == "extra" else "families"), []).append(r)
    meta["summary"] = {g: summary(rs) for g, rs in groups.items()}
    meta["summary"].update({f"family:{f}": summary([r for r in rows if r["family"] == f])
                            for f in dict.fromkeys(r["family"] for r in rows)})
    meta["seconds"] = round(time.time() - t0, 1)
    meta["rows"] = rows
    Path(str(out) + ".json").write_text(json.dumps(meta, indent=1))
    fam_rows = [r for r in rows if r["dtype"] == "bf16"]
    if fam_rows:
        Path(str(out) + ".table.json").write_text(json.dumps(as_table(
            fam_rows, {"name": dev["name"], "sm_count": dev["sm_count"]}, tuning.manifest_sha256(bundle.path))))
        chart(fam_rows, Path(str(out) + ".png"), f"bf16 off the tuning grid ({a.half} half), {meta['device']}")
    print(json.dumps(meta["summary"], indent=1), flush=True)
    print(f"bench_offgrid: {meta['seconds']} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
