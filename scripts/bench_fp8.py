"""Benchmark the fp8 GEMM's row-wise and block-scaled forms (runtime/fp8.py) beside torch, same run.

Row-wise: ``bundle.gemm(a, b, scale_a=(M,), scale_b=(N,))`` against ``torch._scaled_mm`` row-wise
(scale_a (M, 1), scale_b (1, N); ``use_fast_accum`` as our chosen variant accumulates).
Block-scaled (1x128 a, 128x128 b): against ``torch._scaled_mm`` with block scales where this torch
takes them, else a bf16 ``torch.mm`` of the dequantized operands (dequantization not timed).
CUDA-graph replay medians (factory.benchmark.time_interleaved, ours and torch interleaved), fresh
random inputs rotated to defeat the L2, NaN-poisoned outputs checked, errors against float32 of the
dequantized operands.

    python3 scripts/bench_fp8.py --bundle BUNDLE --out RESULTS.json [--quick]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from factory import testing  # noqa: E402
from factory.benchmark import sets_for, time_interleaved  # noqa: E402
from factory.runtime import Bundle  # noqa: E402

ROW_M = (16, 128, 512, 2048, 8192)
ROW_NK = ((4096, 4096), (14336, 4096), (4096, 14336), (2112, 7168), (7168, 2048), (24576, 1536))
BLOCK_SHAPES = [(4096, 7168, 16384)] + [(m, n, k) for m in (128, 2048, 4096)
                                         for n, k in ((2112, 7168), (24576, 1536), (7168, 16384), (4096, 7168),
                                                      (7168, 2048))]


def _problem_sets(mode, M, N, K, n_sets):
    sets = [testing.fp8_scaled_problem(mode, M, N, K) for _ in range(n_sets)]
    return sets


def bench_row(bundle, M, N, K, l2):
    import torch

    n = sets_for(M * K + N * K + 2 * M * N, l2)
    sets = _problem_sets("row", M, N, K, n)
    outs = [torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda") for _ in range(n)]
    A = [s[0] for s in sets]
    B = [s[1] for s in sets]
    SA = [s[2]["scale_a"] for s in sets]
    SB = [s[2]["scale_b"] for s in sets]
    # a shape timed before in this process keeps its cache entry's place (_chosen reads the newest)
    bundle.selections.clear()
    bundle.hot_gemm.clear()
    bundle.gemm(A[0], B[0], outs[0], scale_a=SA[0], scale_b=SB[0])
    from factory.runtime.gemm import select  # noqa: F401  (the choice: read back from the hot cache)

    name = _chosen(bundle)
    fast = bundle.manifest["variants"][name]["fp8_accumulation"] == "fast"
    SA2 = [s[:, None] for s in SA]
    SB2 = [s[None, :] for s in SB]
    Bt = [b.t() for b in B]
    calls = {
        "ours": lambda i: bundle.gemm(A[i], B[i], outs[i], scale_a=SA[i], scale_b=SB[i]),
        "ref": lambda i: torch._scaled_mm(A[i], Bt[i], scale_a=SA2[i], scale_b=SB2[i], out_dtype=torch.bfloat16,
                                          use_fast_accum=fast),
    }
    t = time_interleaved(calls, n, rounds=3, budget_s=0.05, max_reps=10, warm_s=0.03)
    torch.cuda.synchronize()
    nan = sum(int(torch.isnan(o).sum()) for o in outs)
    rows = min(M, 512)
    err = testing.rel_error(outs[0][:rows], sets[0][3][:rows])
    ref_out = calls["ref"](0)
    err_torch = testing.rel_error(ref_out[:rows], sets[0][3][:rows])
    return _row("row", M, N, K, name, t, nan, err, {"ref": "torch._scaled_mm row-wise", "ref_fast_accum": fast,
                                                     "ref_rel_err": err_torch})


def bench_block(bundle, M, N, K, l2):
    import torch

    from factory.runtime import fp8

    n = sets_for(M * K + N * K + 2 * M * N, l2)
    sets = _problem_sets("block", M, N, K, n)
    outs = [torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda") for _ in range(n)]
    A = [s[0] for s in sets]
    B = [s[1] for s in sets]
    SA = [s[2]["scale_a"] for s in sets]
    SB = [s[2]["scale_b"] for s in sets]
    bundle.selections.clear()
    bundle.hot_gemm.clear()
    bundle.gemm(A[0], B[0], outs[0], scale_a=SA[0], scale_b=SB[0])
    name = _chosen(bundle)
    calls = {"ours": lambda i: bundle.gemm(A[i], B[i], outs[i], scale_a=SA[i], scale_b=SB[i])}
    # torch's block-scaled _scaled_mm where it exists (scale_a (M, K/128) outer-dim-major, scale_b
    # (K/128, N/128) for b (K, N)), checked against the reference before it is timed.
    Bt = [b.t() for b in B]
    SBt = [s.t() for s in SB]
    ref_kind, ref_err = None, None
    rows = min(M, 512)
    try:
        r = torch._scaled_mm(A[0], Bt[0], scale_a=SA[0], scale_b=SBt[0], out_dtype=torch.bfloat16)
        ref_err = testing.rel_error(r[:rows], sets[0][3][:rows])
        if ref_err < 2e-2:
            ref_kind = "torch._scaled_mm block-scaled"
            calls["ref"] = lambda i: torch._scaled_mm(A[i], Bt[i], scale_a=SA[i], scale_b=SBt[i],
                                                      out_dtype=torch.bfloat16)
    except (RuntimeError, ValueError, TypeError) as e:
        print(f"  torch._scaled_mm block-scaled: {type(e).__name__}: {str(e)[:160]}", flush=True)
    if ref_kind is None:
        ref_kind = "torch.mm bf16 of the dequantized operands (dequantization not timed)"
        DA = [fp8.dequantize_blockwise(a, s).to(torch.bfloat16) for a, s in zip(A, SA)]
        DB = [fp8.dequantize_blockwise(b, s).to(torch.bfloat16) for b, s in zip(B, SB)]
        C = [torch.empty((M, N), dtype=torch.bfloat16, device="cuda") for _ in range(n)]
        calls["ref"] = lambda i: torch.mm(DA[i], DB[i].t(), out=C[i])
    t = time_interleaved(calls, n, rounds=3, budget_s=0.05, max_reps=10, warm_s=0.03)
    torch.cuda.synchronize()
    nan = sum(int(torch.isnan(o).sum()) for o in outs)
    err = testing.rel_error(outs[0][:rows], sets[0][3][:rows])
    return _row("block", M, N, K, name, t, nan, err, {"ref": ref_kind, "ref_rel_err": ref_err})


def by_name(bundle, M, N, K, l2, names):
    """Every named fp8 variant (row, block or per-tensor scales) on one shape, interleaved, with the
    selection's choice of each form: what each tile costs (rows of {variant, us, tflops})."""
    import torch

    n = sets_for(M * K + N * K + 2 * M * N, l2)
    sets = {m: _problem_sets(m, M, N, K, n) for m in ("row", "block")}
    outs = [torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda") for _ in range(n)]
    one = torch.ones(1, device="cuda")
    calls = {}
    for name in names:
        mode = bundle.manifest["variants"][name].get("scale_mode") or "tensor"
        if mode == "tensor":
            S = sets["row"]
            calls[name] = (lambda S, name: lambda i: bundle.gemm(S[i][0], S[i][1], outs[i], scale_a=one, scale_b=one,
                                                                 variant=name))(S, name)
        else:
            S = sets[mode]
            calls[name] = (lambda S, name: lambda i: bundle.gemm(S[i][0], S[i][1], outs[i], variant=name,
                                                                 **S[i][2]))(S, name)
    if any((bundle.manifest["variants"][nm].get("scale_mode") or "tensor") == "row" for nm in names):
        # torch's row-wise kernels on the same row problems: the reference each row tile is judged by
        S = sets["row"]
        for fast in (True, False):
            calls[f"torch._scaled_mm row fast_accum={fast}"] = (
                lambda fast: lambda i: torch._scaled_mm(S[i][0], S[i][1].t(), scale_a=S[i][2]["scale_a"][:, None],
                                                        scale_b=S[i][2]["scale_b"][None, :],
                                                        out_dtype=torch.bfloat16, use_fast_accum=fast))(fast)
    t = time_interleaved(calls, n, rounds=3, budget_s=0.05, max_reps=10, warm_s=0.03)
    flops = 2 * M * N * K
    return [{"M": M, "N": N, "K": K, "variant": k, "us": v * 1e6, "tflops": flops / v / 1e12} for k, v in t.items()]


def _chosen(bundle) -> str:
    """The variant the last gemm call selected (the loader's selection cache, newest entry: the
    callers clear it first, since a key already cached keeps its place)."""
    return list(bundle.selections.values())[-1]


def _row(mode, M, N, K, name, t, nan, err, extra):
    flops = 2 * M * N * K
    return {"mode": mode, "M": M, "N": N, "K": K, "variant": name, "ours_us": t["ours"] * 1e6,
            "ref_us": t["ref"] * 1e6, "ours_tflops": flops / t["ours"] / 1e12, "ref_tflops": flops / t["ref"] / 1e12,
            "ratio": t["ref"] / t["ours"], "nan": nan, "rel_err": err, **extra}


def main() -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true", help="a few shapes of each form")
    ap.add_argument("--forms", nargs="+", default=["row", "block"])
    ap.add_argument("--by-name", nargs=3, type=int, action="append", metavar=("M", "N", "K"),
                    help="time every fp8 variant of the bundle (or --variants) on this shape instead")
    ap.add_argument("--variants", nargs="*", help="glob patterns of variant names for --by-name")
    ap.add_argument("--with-swap", action="store_true", help="--by-name also times swapped-operand tiles")
    ap.add_argument("--with-tail", action="store_true",
                    help="--by-name also times the tail-split tiles (a flat workspace per stream)")
    args = ap.parse_args()
    bundle = Bundle.open(args.bundle)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    if args.by_name:
        import fnmatch

        names = [v["name"] for v in bundle.candidates("gemm") if v["dtypes"]["a"] == "e4m3"
                 and ("workspace" not in v or (args.with_tail and v["workspace"].get("form") == "tail"))
                 and (args.with_swap or not v.get("config", {}).get("swap_ab"))
                 and (not args.variants or any(fnmatch.fnmatch(v["name"], p) for p in args.variants))]
        rows = []
        for M, N, K in args.by_name:
            for r in sorted(by_name(bundle, M, N, K, l2, names), key=lambda r: r["us"]):
                rows.append(r)
                print(f"{M}x{N}x{K} {r['us']:9.2f} us {r['tflops']:7.1f} TF  {r['variant']}", flush=True)
            torch.cuda.empty_cache()
            Path(args.out + ".partial").write_text(json.dumps({"rows": rows}))  # what a time limit leaves
        Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(0), "rows": rows,
                                              "command": "python3 scripts/bench_fp8.py " + " ".join(sys.argv[1:])},
                                             indent=1))
        return 0
    rows = []
    shapes = {"row": [(m, n, k) for n, k in ROW_NK for m in ROW_M], "block": BLOCK_SHAPES}
    if args.quick:
        shapes = {"row": shapes["row"][::7], "block": BLOCK_SHAPES[:3]}
    for form in args.forms:
        for M, N, K in shapes[form]:
            r = (bench_row if form == "row" else bench_block)(bundle, M, N, K, l2)
            rows.append(r)
            print(f"{form:5} {M:5}x{N:5}x{K:5} ours {r['ours_us']:9.2f} us {r['ours_tflops']:7.1f} TF | ref "
                  f"{r['ref_us']:9.2f} us | x{r['ratio']:.3f} err {r['rel_err']:.2e} nan {r['nan']} {r['variant']}",
                  flush=True)
            torch.cuda.empty_cache()
    summary = {}
    for form in args.forms:
        rs = [r for r in rows if r["mode"] == form]
        if rs:
            summary[form] = {"geomean_ratio": math.exp(statistics.mean(math.log(r["ratio"]) for r in rs)),
                             "min_ratio": min(r["ratio"] for r in rs), "shapes": len(rs),
                             "max_rel_err": max(r["rel_err"] for r in rs), "nan": sum(r["nan"] for r in rs)}
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "summary": summary, "rows": rows,
           "command": "python3 scripts/bench_fp8.py " + " ".join(sys.argv[1:])}
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
