#!/usr/bin/env python3
"""Probe: programmatic dependent launch on or off, same kernel otherwise (``_nopdl`` variants),
timed like bench.py rows (a graph of one call per input set, bursts of replays, passes
alternating between the two).  Usage: probe_pdl.py BUNDLE [OUT.json]"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench import _sets_for, gemm_bytes, time_interleaved  # noqa: E402

from factory import testing  # noqa: E402
from factory.runtime import Bundle  # noqa: E402

CASES = [("bf16_obf16_ak_bk_t16x64x64_c1x1_ws_rm_sw1_swap_sk1", "bf16", [(1, 4096, 4096), (16, 8192, 8192), (1, 8192, 28672)]),
         ("bf16_obf16_ak_bk_t16x64x64_c1x1_ws_rm_sw1_swap_sk2", "bf16", [(16, 4096, 4096), (1, 4096, 14336)]),
         ("e4m3_obf16_ak_bk_t32x64x128_c1x1_ws_rm_sw1_swap_sk1", "e4m3", [(1, 4096, 4096), (16, 6144, 4096), (1, 8192, 8192), (1, 8192, 28672)]),
         ("e4m3_obf16_ak_bk_t32x64x128_c1x1_ws_rm_sw1_swap_sk2", "e4m3", [(1, 4096, 14336)])]


def main() -> int:
    import torch

    bundle = Bundle.open(sys.argv[1])
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows = []
    for suffix, dt, shapes in CASES:
        for M, N, K in shapes:
            n_sets = _sets_for(gemm_bytes(M, N, K, dt), l2)
            A = [testing.gemm_operand(M, K, 1, "k", dt)[0] for _ in range(n_sets)]
            B = [testing.gemm_operand(N, K, 1, "k", dt)[0] for _ in range(n_sets)]
            C = [torch.empty((M, N), dtype=torch.bfloat16, device="cuda") for _ in range(n_sets)]
            one = torch.ones(1, device="cuda")
            kw = {"scale_a": one, "scale_b": one} if dt == "e4m3" else {}
            calls = {}
            for tag in ("pdl", "nopdl"):
                name = "gemm_sm90a_" + suffix + ("_nopdl" if tag == "nopdl" else "")
                calls[tag] = lambda i, name=name: bundle.gemm(A[i], B[i], C[i], variant=name, **kw)
            t = time_interleaved(calls, n_sets, rounds=6, budget_s=0.05, max_reps=10, warm_s=0.05)
            print(f"{dt} {M}x{N}x{K} {suffix[-22:]} (x{n_sets}): PDL {t['pdl'] * 1e6:.1f} us, "
                  f"no PDL {t['nopdl'] * 1e6:.1f} us", flush=True)
            rows.append({"variant": suffix, "shape": [M, N, K], "input_sets": n_sets,
                         "pdl_us": t["pdl"] * 1e6, "nopdl_us": t["nopdl"] * 1e6})
            A = B = C = None
            torch.cuda.empty_cache()
    if len(sys.argv) > 2:
        Path(sys.argv[2]).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
