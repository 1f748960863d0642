"""Time block-scaled fp8 variants by name, from one or more bundles, interleaved in the same passes.

Two problems (DeepSeek-V3 1x128 / 128x128 scales, runtime/fp8.py quantizers):
- dense ``bundle.gemm`` at ``--dense M N K`` (default 4096 7168 16384); row-scaled and per-tensor
  fp8 variants matched by the glob are timed beside the block-scaled ones (same tile, other scales);
- contiguous grouped ``bundle.grouped_gemm`` at ``--grouped E ROWS N K`` (default 8 groups of
  8192 rows, N 4096, K 7168).
Every variant is first checked against float32 of the dequantized operands (NaN-poisoned output),
then timed by CUDA-graph replay (factory.benchmark.time_interleaved), all candidates of a problem in
the same passes.  Bundles are named ``LABEL=PATH`` so that builds of one variant name from
different sources can be compared side by side.

    python3 scripts/bench_block_scaled.py --bundle new=B1 --bundle old=B2 --out OUT.json \
        [--dense-variants '*blksc*'] [--grouped-variants '*contig*blksc*'] [--passes 2]

Dense: torch's block-scaled ``torch._scaled_mm`` (where this torch has it) is timed in the same
passes as ``torch:_scaled_mm_block``.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from factory import testing  # noqa: E402
from factory.benchmark import sets_for, time_interleaved  # noqa: E402
from factory.runtime import Bundle  # noqa: E402


SKIP: list[str] = []  # globs of variant names left out (--skip)


def _names(bundle, op, pattern, grouped=None, modes=("block",)):
    return [v["name"] for v in bundle.candidates(op) if v["dtypes"]["a"] == "e4m3"
            and (v.get("scale_mode") or "tensor") in modes
            and (grouped is None or v.get("grouped") == grouped) and fnmatch.fnmatch(v["name"], pattern)
            and not any(fnmatch.fnmatch(v["name"], s) for s in SKIP)]


def dense(bundles, M, N, K, pattern, l2) -> list[dict]:
    import torch

    n = sets_for(M * K + N * K + 2 * M * N, l2)
    sets = {m: [testing.fp8_scaled_problem(m, M, N, K) for _ in range(n)] for m in ("block", "row")}
    one = torch.ones(1, device="cuda")
    # Per-tensor variants (a baseline for the scale forms' cost) run on the row problem's data with
    # scales of one: judged against its reference without the row scales.
    sets["tensor"] = [(a, b, {"scale_a": one, "scale_b": one}, a.float() @ b.float().t()) for a, b, _, _ in sets["row"]]
    outs = [torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda") for _ in range(n)]
    calls, checks = {}, {}
    for label, b in bundles.items():
        for name in _names(b, "gemm", pattern, modes=("block", "row", "tensor")):
            S = sets[b.manifest["variants"][name].get("scale_mode") or "tensor"]
            outs[0].fill_(float("nan"))
            b.gemm(S[0][0], S[0][1], outs[0], variant=name, **S[0][2])
            torch.cuda.synchronize()
            checks[f"{label}:{name}"] = {"rel_err": testing.rel_error(outs[0], S[0][3]),
                                         "nan": int(torch.isnan(outs[0]).sum())}
            calls[f"{label}:{name}"] = (lambda b, name, S: lambda i: b.gemm(S[i][0], S[i][1], outs[i], variant=name,
                                                                            **S[i][2]))(b, name, S)
    # torch's block-scaled _scaled_mm (scale_a (M, K/128) outer-dim-major, scale_b (K/128, N/128)
    # for b (K, N)) in the same passes, where this torch has it and it matches the reference.
    try:
        A, Bt = [s[0] for s in sets["block"]], [s[1].t() for s in sets["block"]]
        SA, SBt = [s[2]["scale_a"] for s in sets["block"]], [s[2]["scale_b"].t() for s in sets["block"]]
        r = torch._scaled_mm(A[0], Bt[0], scale_a=SA[0], scale_b=SBt[0], out_dtype=torch.bfloat16)
        torch.cuda.synchronize()
        checks["torch:_scaled_mm_block"] = {"rel_err": testing.rel_error(r, sets["block"][0][3]),
                                            "nan": int(torch.isnan(r).sum())}
        if checks["torch:_scaled_mm_block"]["rel_err"] < 2e-2:
            calls["torch:_scaled_mm_block"] = lambda i: torch._scaled_mm(A[i], Bt[i], scale_a=SA[i], scale_b=SBt[i],
                                                                         out_dtype=torch.bfloat16)
    except (RuntimeError, ValueError, TypeError) as e:
        print(f"torch._scaled_mm block-scaled: {type(e).__name__}: {str(e)[:160]}", flush=True)
    t = time_interleaved(calls, n, rounds=3, budget_s=0.05, max_reps=10, warm_s=0.03)
    flops = 2.0 * M * N * K
    return [{"problem": "dense", "M": M, "N": N, "K": K, "variant": k, "us": v * 1e6, "tflops": flops / v / 1e12,
             **checks[k]} for k, v in sorted(t.items(), key=lambda kv: kv[1])]


def grouped_rows(bundles, E, rows, N, K, pattern) -> list[dict]:
    import torch

    from factory.runtime import fp8, grouped

    counts = torch.full((E,), rows, dtype=torch.int64)
    Mt = int(counts.sum())
    w = torch.randn(E, N, K, device="cuda", dtype=torch.bfloat16) * 0.05
    x = torch.randn(Mt, K, device="cuda", dtype=torch.bfloat16)
    offs = counts.cumsum(0).to(torch.int32).cuda()
    qa, sa = fp8.quantize_grouped_a(x, "block")
    qb, sb = fp8.quantize_grouped_b(w, "block")
    del w, x
    b = qb.transpose(1, 2)
    out = torch.full((Mt, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    ref = grouped.reference(qa, b, offs=offs, scale_a=sa, scale_b=sb)
    scale = ref.abs().max().item()
    calls, checks = {}, {}
    for label, bd in bundles.items():
        for name in _names(bd, "gemm_grouped", pattern, "contig"):
            out.fill_(float("nan"))
            bd.grouped_gemm(qa, b, offs=offs, out=out, scale_a=sa, scale_b=sb, variant=name)
            torch.cuda.synchronize()
            checks[f"{label}:{name}"] = {"max_abs_err_rel": (out.float() - ref).abs().max().item() / scale,
                                         "nan": int(torch.isnan(out).sum())}
            calls[f"{label}:{name}"] = (lambda bd, name: lambda i: bd.grouped_gemm(
                qa, b, offs=offs, out=out, scale_a=sa, scale_b=sb, variant=name))(bd, name)
    del ref
    t = time_interleaved(calls, 1, rounds=3, budget_s=0.05, max_reps=10, warm_s=0.03)
    flops = 2.0 * Mt * N * K
    return [{"problem": "grouped", "E": E, "rows": rows, "N": N, "K": K, "variant": k, "us": v * 1e6,
             "tflops": flops / v / 1e12, **checks[k]} for k, v in sorted(t.items(), key=lambda kv: kv[1])]


def main() -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", action="append", required=True, help="LABEL=PATH (repeatable)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--dense", nargs=3, type=int, default=[4096, 7168, 16384], metavar=("M", "N", "K"))
    ap.add_argument("--grouped", nargs=4, type=int, default=[8, 8192, 4096, 7168], metavar=("E", "ROWS", "N", "K"))
    ap.add_argument("--dense-variants", default="*", help="glob over the block-scaled gemm variants")
    ap.add_argument("--grouped-variants", default="*", help="glob over the contiguous block-scaled grouped variants")
    ap.add_argument("--passes", type=int, default=1, help="repeat the timed passes (each pass: all candidates)")
    ap.add_argument("--skip", action="append", default=[], help="glob of variant names to leave out (repeatable)")
    args = ap.parse_args()
    SKIP.extend(args.skip)
    bundles = {}
    for spec in args.bundle:
        label, _, path = spec.partition("=")
        bundles[label] = Bundle.open(path)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows, g = [], []
    for p in range(args.passes):
        for r in dense(bundles, *args.dense, args.dense_variants, l2):
            rows.append(dict(r, run=p))
            print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in rows[-1].items()}),
                  flush=True)
        torch.cuda.empty_cache()
        for r in grouped_rows(bundles, *args.grouped, args.grouped_variants):
            g.append(dict(r, run=p))
            print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in g[-1].items()}), flush=True)
        torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(0), "rows": rows + g}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
