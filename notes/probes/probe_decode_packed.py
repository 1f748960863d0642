#!/usr/bin/env python3
"""Probe: which shape of the packed-weight decode kernel (factory/gemm/decode.py) is fastest, and
does it meet 1.1x the copy floor at fp8 1/16x4096x4096 where the TMA kernels could not?

Every decode variant of a bundle on the GPU: the clusters the driver fits at once, correctness
against float32, then time per call in graphs of 8 consecutive calls beside our sm_90a pick (plain
and ``b_constant``) and ``torch._scaled_mm``, fp8 decode shapes.

Answer (H100 SXM, 2026-11-22, commits e64a681 18:29 UTC and c7803fe 18:39 UTC; notes/gemm-sm90.md,
"The packed-weight decode kernel"): 4-CTA clusters of 256-thread CTAs fit only 62 at once (64
needed), so CTAs split K in two over 2-CTA clusters; 32 weight rows x K/2 per 256-thread CTA is
fastest at N = 4096, 64-row CTAs at N = 6144 and 8192; with the weights loaded without L1 allocation
fp8 16x4096^2 takes 7.43-7.44 us and 1x4096^2 6.87-6.91 (line 7.68 / 7.60): both under it.

  python3 notes/probes/probe_decode_packed.py DEC_BUNDLE [SM90_BUNDLE]
  (--one NAME M N K: three calls of one variant, for ncu; PROBE_SHAPES=M:N:K,...,
  PROBE_VARIANTS=substring,... narrow the run)"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from factory import testing  # noqa: E402
from factory.benchmark import copy_bandwidth, gemm_bytes, time_interleaved  # noqa: E402
from factory.runtime import Bundle  # noqa: E402
from factory.runtime.occupancy import max_active_clusters  # noqa: E402
from factory.runtime.packed import pack_b  # noqa: E402


def main() -> int:
    import torch

    args = [x for x in sys.argv[1:] if not x.startswith("--")]
    dec = Bundle.open(args[0])
    ours = Bundle.open(args[1]) if len(args) > 1 and "--one" not in sys.argv else None
    if "--one" in sys.argv:  # --one NAME M N K: two warm-up calls and one more (for ncu --launch-skip 2)
        i = sys.argv.index("--one")
        name, (M, N, K) = sys.argv[i + 1], map(int, sys.argv[i + 2:i + 5])
        A, B, C = testing.gemm_inputs(M, N, K, "e4m3", poison=False)
        P = pack_b(B)
        one = torch.ones(1, device="cuda")
        for _ in range(3):
            dec.gemm(A, P, C, scale_a=one, scale_b=one, variant=name)
        torch.cuda.synchronize()
        return 0
    names = sorted(n for n, e in dec.manifest["variants"].items() if e.get("family") == "decode")
    torch.zeros(1, device="cuda")
    for n in names:
        e = dec.manifest["variants"][n]
        ck = e["cluster"][0] * e["cluster"][1]
        print(f"{n}: regs {e['resources']['registers']}, threads {e['threads']}, rows {e['rows_per_cta']}, "
              f"max active clusters {max_active_clusters(dec.path, e, ck)}", flush=True)
    one = torch.ones(1, device="cuda")
    bw = copy_bandwidth()
    shapes = ((16, 4096, 4096), (1, 4096, 4096), (5, 2048, 8192), (16, 6144, 4096), (1, 6144, 4096),
              (16, 4096, 14336), (16, 8192, 8192), (16, 10240, 8192))
    if os.environ.get("PROBE_SHAPES"):  # e.g. "1:4096:4096,16:4096:4096"
        shapes = [tuple(map(int, x.split(":"))) for x in os.environ["PROBE_SHAPES"].split(",")]
    if os.environ.get("PROBE_VARIANTS"):  # substrings of the names to keep
        names = [n for n in names if any(x in n for x in os.environ["PROBE_VARIANTS"].split(","))]
    for M, N, K in shapes:
        A, B, C = testing.gemm_input_sets(8, M, N, K, "e4m3")
        P = [pack_b(b) for b in B]
        ref = A[0].float() @ B[0].float().t()
        calls = {}
        for n in names:
            e = dec.manifest["variants"][n]
            if K % e["k_multiple"] or N % e["rows_per_cta"]:
                continue
            C[0].fill_(float("nan"))
            dec.gemm(A[0], P[0], C[0], scale_a=one, scale_b=one, variant=n)
            torch.cuda.synchronize()
            err = testing.rel_error(C[0], ref)
            print(f"{n} {M}x{N}x{K}: rel err {err:.2e} nan {int(torch.isnan(C[0]).sum())}", flush=True)
            calls[n.replace("gemm_sm90_e4m3_obf16_ak_bk_", "")] = (
                lambda i, n=n: dec.gemm(A[i], P[i], C[i], scale_a=one, scale_b=one, variant=n))
        if ours is not None:
            calls["ours_sm90a"] = lambda i: ours.gemm(A[i], B[i], C[i], scale_a=one, scale_b=one)
            calls["ours_sm90a_bconst"] = lambda i: ours.gemm(A[i], B[i], C[i], scale_a=one, scale_b=one,
                                                             b_constant=True)
        calls["cublas"] = lambda i: torch._scaled_mm(A[i], B[i].t(), scale_a=one, scale_b=one,
                                                     out_dtype=torch.bfloat16)
        t = time_interleaved(calls, 8, rounds=3, warm_s=0.02)
        floor = gemm_bytes(M, N, K, "e4m3") / bw * 1e6
        print(f"{M}x{N}x{K}: floor {floor:.2f} line {1.1 * floor:.2f}; " + ", ".join(
            f"{k}={v * 1e6:.2f}" for k, v in sorted(t.items(), key=lambda x: x[1])), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
