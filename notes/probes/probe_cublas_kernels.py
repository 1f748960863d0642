#!/usr/bin/env python3
"""Probe: which kernel does the reference (torch.mm / torch._scaled_mm) run for given shapes?
Prints the kernel names torch.profiler records (cuBLAS's nvjet kernels encode tile, stages and
cluster shape in them).

Answer (H100 SXM, torch 2.11.0+cu130, 2026-11-22, committed in 3f75b85 14:31 UTC;
notes/gemm-sm90.md, "v9: what cuBLAS runs, and multicast swap tiles";
notes/results/probe_cublas_kernels_h100.json): fp8 128x4096x{4096,14336} runs 64x64 tiles with 13
stages in 2-CTA clusters, fp8 128x6144x4096 96x64 (10 stages, 1x2), fp8 1x10240x8192 128x8 (12
stages, 4x1), bf16 16x4096x4096 128x16 split-K with a separate reduce kernel, bf16 16384x6144x4096
192x192, bf16 512x28672x4096 176x128. That led to the multicast 64x64 swap tiles with 13 stages in
factory/gemm/sm90.py.

  python3 notes/probes/probe_cublas_kernels.py [OUT.json]"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from factory import testing  # noqa: E402

SHAPES = [("e4m3", 128, 6144, 4096), ("e4m3", 128, 4096, 14336), ("e4m3", 128, 4096, 4096),
          ("e4m3", 64, 4096, 14336), ("e4m3", 16384, 6144, 4096), ("e4m3", 1, 10240, 8192),
          ("e4m3", 16, 4096, 4096), ("e4m3", 512, 4096, 14336), ("bf16", 128, 4096, 4096),
          ("bf16", 16384, 6144, 4096), ("bf16", 512, 28672, 4096), ("bf16", 16, 4096, 4096)]


def main() -> int:
    import torch
    from torch.profiler import ProfilerActivity, profile

    rows = []
    one = torch.ones(1, device="cuda")
    for dt, M, N, K in SHAPES:
        a = testing.gemm_operand(M, K, 1, "k", dt)[0]
        b = testing.gemm_operand(N, K, 1, "k", dt)[0]
        if dt == "e4m3":
            fn = lambda: torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)  # noqa: E731
        else:
            fn = lambda: torch.mm(a, b.t())  # noqa: E731
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        names = [e.name for e in prof.events() if e.device_type.name == "CUDA"]
        print(f"{dt} {M}x{N}x{K}: {names}", flush=True)
        rows.append({"dtype": dt, "shape": [M, N, K], "kernels": names})
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
