#!/usr/bin/env python3
"""bf16/f16 GEMM variants by name on given shapes beside ``torch.mm`` (cuBLAS), same run: CUDA-graph
replay medians interleaved (factory.benchmark.time_interleaved), fresh random inputs rotated to
defeat the L2, NaN-poisoned outputs checked after the timing.  (fp8 forms: bench_fp8.py --by-name.)

    python3 scripts/bench_gemm_by_name.py --bundle B --shape 8192 8192 8192 [--shape ...] \\
        [--variants GLOB ...] --out RESULTS.json
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    import torch

    from factory.benchmark import sets_for, time_interleaved
    from factory.runtime import Bundle

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--shape", nargs=3, type=int, action="append", required=True, metavar=("M", "N", "K"))
    ap.add_argument("--variants", nargs="*", help="glob patterns of variant names (default: every bf16 one)")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f16"])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    bundle = Bundle.open(args.bundle)
    dt = {"bf16": torch.bfloat16, "f16": torch.float16}[args.dtype]
    names = [v["name"] for v in bundle.candidates("gemm") if v["dtypes"]["a"] == args.dtype
             and v["dtypes"]["c"] == args.dtype and "workspace" not in v
             and (not args.variants or any(fnmatch.fnmatch(v["name"], p) for p in args.variants))]
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows = []
    for M, N, K in args.shape:
        n = sets_for(2 * (M * K + N * K + M * N), l2)
        A = [torch.randn(M, K, device="cuda").to(dt) for _ in range(n)]
        B = [torch.randn(N, K, device="cuda").to(dt) for _ in range(n)]
        outs = {nm: [torch.full((M, N), float("nan"), dtype=dt, device="cuda") for _ in range(n)] for nm in names}
        ref = [torch.empty((M, N), dtype=dt, device="cuda") for _ in range(n)]
        calls = {nm: (lambda nm: lambda i: bundle.gemm(A[i], B[i], outs[nm][i], variant=nm))(nm) for nm in names}
        calls["torch.mm"] = lambda i: torch.mm(A[i], B[i].t(), out=ref[i])
        t = time_interleaved(calls, n, rounds=3, budget_s=0.05, max_reps=10, warm_s=0.03)
        torch.cuda.synchronize()
        f32 = A[0][:256].float() @ B[0].float().t()
        for nm, sec in sorted(t.items(), key=lambda kv: kv[1]):
            o = outs[nm][0] if nm in outs else ref[0]
            err = float((o[:256].float() - f32).norm() / f32.norm())
            nan = sum(int(torch.isnan(x).sum()) for x in outs[nm]) if nm in outs else 0
            r = {"M": M, "N": N, "K": K, "variant": nm, "us": sec * 1e6, "tflops": 2 * M * N * K / sec / 1e12,
                 "vs_torch": t["torch.mm"] / sec, "rel_err": err, "nan": nan}
            rows.append(r)
            print(f"{M}x{N}x{K} {r['us']:9.2f} us {r['tflops']:7.1f} TF x{r['vs_torch']:.3f} err {err:.1e} "
                  f"nan {nan} {nm}", flush=True)
        del A, B, outs, ref
        torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(0), "rows": rows,
                                          "command": "python3 scripts/bench_gemm_by_name.py " + " ".join(sys.argv[1:])},
                                         indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
