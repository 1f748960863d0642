#!/usr/bin/env python3
"""Probe: does the persistent grid's cluster cap (the ``max_clusters`` launch argument) matter
beyond SMs // cluster size?  Times chosen sm90a variants with several caps, interleaved
(bench.time_interleaved), ours only.  Usage: probe_cluster_cap.py BUNDLE [OUT.json]"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench import _sets_for, gemm_bytes, time_interleaved  # noqa: E402

from factory import testing  # noqa: E402
from factory.runtime import Bundle  # noqa: E402
from factory.runtime.gemm import rkl_spec  # noqa: E402

CASES = [  # (variant suffix, M, N, K)
    ("bf16_obf16_ak_bk_t64x64x64_c1x1_ws_rm_sw1_swap_sk2_pdl", 64, 4096, 14336),
    ("bf16_obf16_ak_bk_t16x64x64_c1x1_ws_rm_sw1_swap_sk2_pdl", 16, 4096, 4096),
    ("bf16_obf16_ak_bk_t128x256x64_c2x1_coop_rm_sw1_sk1", 2048, 28672, 4096),
    ("bf16_obf16_ak_bk_t128x256x64_c2x1_coop_rm_sw8_sk1", 8192, 8192, 8192),
    ("bf16_obf16_ak_bk_t128x128x64_c1x2_pp_rm_sw1_sk1", 512, 4096, 14336),
]


def main() -> int:
    import torch

    bundle = Bundle.open(sys.argv[1])
    sms = bundle.device_info()["sm_count"]
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows = []
    for suffix, M, N, K in CASES:
        name = "gemm_sm90a_" + suffix
        e = bundle.manifest["variants"][name]
        per = e["persistent"]["cluster_ctas"]
        n_sets = _sets_for(gemm_bytes(M, N, K, "bf16"), l2)
        A = [testing.gemm_operand(M, K, 1, "k", "bf16")[0] for _ in range(n_sets)]
        B = [testing.gemm_operand(N, K, 1, "k", "bf16")[0] for _ in range(n_sets)]
        C = [torch.empty((M, N), dtype=torch.bfloat16, device="cuda") for _ in range(n_sets)]
        caps = sorted({sms // per, sms // per - 1, sms // per - 2, sms // per - 4, sms // per - 8}, reverse=True)
        calls = {cap: (lambda i, cap=cap: bundle.launch(name, [rkl_spec(A[i], "a"), rkl_spec(B[i], "b"),
                                                              rkl_spec(C[i], "c"), cap])) for cap in caps}
        t = time_interleaved(calls, n_sets, rounds=6, budget_s=0.03, max_reps=8)
        print(f"{suffix} {M}x{N}x{K}: " + ", ".join(f"cap {c}: {t[c] * 1e6:.1f} us" for c in caps), flush=True)
        rows.append({"variant": name, "shape": [M, N, K], "us_by_cap": {str(c): t[c] * 1e6 for c in caps}})
        A = B = C = None
        torch.cuda.empty_cache()
    if len(sys.argv) > 2:
        Path(sys.argv[2]).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
