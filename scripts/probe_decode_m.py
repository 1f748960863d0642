#!/usr/bin/env python3
"""Probe: is a decode GEMM slower at M=1 than at M=16 on the same swap-AB variant (same run,
back to back)?  Graph-replay medians (bench.time_graph / time_interleaved); ``--profile``: one
call per case for ncu."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench import time_graph, time_interleaved  # noqa: E402

from factory import testing  # noqa: E402
from factory.runtime import Bundle  # noqa: E402


def profile(bundle) -> int:
    """One call per case between cudaProfilerStart/Stop, for ``ncu --profile-from-start off``:
    the same variant at M = 1, 2 and 16 (and M = 1 as a stride-0 M = 2)."""
    import torch

    pre = "gemm_sm90a_"
    cases = [("e4m3", "e4m3_obf16_ak_bk_t32x64x128_c1x1_ws_rm_sw1_swap_sk1_pdl", 57344, 8192),
             ("bf16", "bf16_obf16_ak_bk_t16x64x64_c1x1_ws_rm_sw1_swap_sk1_pdl", 8192, 8192)]
    for dt, v, N, K in cases:
        B = testing.gemm_operand(N, K, 1, "k", dt)[0]
        one = torch.ones(1, device="cuda")
        kw = {"scale_a": one, "scale_b": one} if dt == "e4m3" else {}
        for M in (1, 2, 16, "1s0"):
            if M == "1s0":
                A = testing.gemm_operand(1, K, 1, "k", dt)[0].expand(2, K)
                C = torch.empty((1, N), dtype=torch.bfloat16, device="cuda").expand(2, N)
            else:
                A = testing.gemm_operand(M, K, 1, "k", dt)[0]
                C = torch.empty((M, N), dtype=torch.bfloat16, device="cuda")
            for _ in range(3):
                bundle.gemm(A, B, C, variant=pre + v, **kw)
            torch.cuda.synchronize()
            print(f"profiled: {dt} M={M} N={N} K={K} {v}", flush=True)
            torch.cuda.profiler.start()
            bundle.gemm(A, B, C, variant=pre + v, **kw)
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
    return 0


def main() -> int:
    """Is M = 1 slower than M = 16 on the same variant, or is whatever is timed first after a
    new weight tensor slow?  Sequential graph timings in the order M=1, M=16, M=1, M=16 (ours),
    then the reference's, then all four interleaved (bench.time_interleaved)."""
    import torch

    bundle = Bundle.open(sys.argv[1])
    if "--profile" in sys.argv[2:]:
        return profile(bundle)
    pre = "gemm_sm90a_"
    cases = [("bf16", "bf16_obf16_ak_bk_t16x64x64_c1x1_ws_rm_sw1_swap_sk1_pdl", 8192, 8192),
             ("e4m3", "e4m3_obf16_ak_bk_t32x64x128_c1x1_ws_rm_sw1_swap_sk1_pdl", 8192, 28672),
             ("e4m3", "e4m3_obf16_ak_bk_t32x64x128_c1x1_ws_rm_sw1_swap_sk1_pdl", 57344, 8192)]
    rows = []
    for dt, v, N, K in cases:
        B = testing.gemm_operand(N, K, 1, "k", dt)[0]
        one = torch.ones(1, device="cuda")
        A = {M: testing.gemm_operand(M, K, 1, "k", dt)[0] for M in (1, 16)}
        C = {M: torch.empty((M, N), dtype=torch.bfloat16, device="cuda") for M in (1, 16)}
        if dt == "e4m3":
            ours = {M: (lambda i, M=M: bundle.gemm(A[M], B, C[M], variant=pre + v, scale_a=one, scale_b=one))
                    for M in (1, 16)}
            ref = {M: (lambda i, M=M: torch._scaled_mm(A[M], B.t(), scale_a=one, scale_b=one,
                                                       out_dtype=torch.bfloat16)) for M in (1, 16)}
        else:
            ours = {M: (lambda i, M=M: bundle.gemm(A[M], B, C[M], variant=pre + v)) for M in (1, 16)}
            ref = {M: (lambda i, M=M: torch.mm(A[M], B.t(), out=C[M])) for M in (1, 16)}
        seq = []
        for who, fns in (("ours", ours), ("ref", ref)):
            for M in (1, 16, 1, 16):
                seq.append((f"{who} M={M}", time_graph(fns[M], 1, replays=30) * 1e6))
        inter = time_interleaved({f"{w} M={M}": f for w, fns in (("ours", ours), ("ref", ref))
                                  for M, f in fns.items()}, 1, rounds=4, budget_s=0.02)
        row = {"dt": dt, "variant": v, "N": N, "K": K, "sequential_us": seq,
               "interleaved_us": {k: t * 1e6 for k, t in inter.items()}}
        rows.append(row)
        print(f"{dt} {N}x{K} {v[-30:]}", flush=True)
        print("  sequential: " + ", ".join(f"{k} {t:.1f}" for k, t in seq), flush=True)
        print("  interleaved: " + ", ".join(f"{k} {t:.1f}" for k, t in row["interleaved_us"].items()), flush=True)
        A = B = C = ours = ref = None
        torch.cuda.empty_cache()
    if len(sys.argv) > 2 and not sys.argv[2].startswith("--"):
        Path(sys.argv[2]).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
