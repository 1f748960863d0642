#!/usr/bin/env python3
"""Probe: is a decode GEMM slower at M=1 than at M=16 on the same swap-AB variant (same run,
back to back)?  Graph-replay medians (bench.time_graph)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench import time_graph  # noqa: E402

from factory import testing  # noqa: E402
from factory.runtime import Bundle  # noqa: E402


def main() -> int:
    import torch

    bundle = Bundle.open(sys.argv[1])
    pre = "gemm_sm90a_"
    cases = [("bf16", "bf16_obf16_ak_bk_t16x64x64_c1x1_ws_rm_sw1_swap_sk1"),
             ("bf16", "bf16_obf16_ak_bk_t16x64x64_c1x1_ws_rm_sw1_swap_sk2"),
             ("e4m3", "e4m3_obf16_ak_bk_t32x64x128_c1x1_ws_rm_sw1_swap_sk1")]
    rows = []
    for dt, v in cases:
        for N, K in ((8192, 28672), (57344, 8192), (10240, 8192)):
            B = testing.gemm_operand(N, K, 1, "k", dt)[0]
            one = torch.ones(1, device="cuda")
            kw = {"scale_a": one, "scale_b": one} if dt == "e4m3" else {}
            for M in (1, 2, 16):
                A = testing.gemm_operand(M, K, 1, "k", dt)[0]
                C = torch.empty((M, N), dtype=torch.bfloat16, device="cuda")
                t = time_graph(lambda i: bundle.gemm(A, B, C, variant=pre + v, **kw), 1, replays=30)
                rows.append({"dt": dt, "variant": v, "M": M, "N": N, "K": K, "us": t * 1e6})
                print(f"{dt} {v[-28:]} M={M:>2} N={N} K={K}: {t * 1e6:8.1f} us", flush=True)
                if M == 1:
                    ref = (A.float() @ B.float().t()).squeeze(0)
                    # (a) M=1 presented as M=2 with a row stride of 0 (A and C): same bytes.
                    A2, C2 = A.expand(2, K), torch.empty((1, N), dtype=torch.bfloat16, device="cuda").expand(2, N)
                    try:
                        t = time_graph(lambda i: bundle.gemm(A2, B, C2, variant=pre + v, **kw), 1, replays=30)
                        err = testing.rel_error(C2[0], ref)
                        print(f"{dt} {v[-28:]} M=1 as stride-0 M=2: {t * 1e6:8.1f} us err {err:.2e}", flush=True)
                        rows.append({"dt": dt, "variant": v, "M": "1s0", "N": N, "K": K, "us": t * 1e6, "err": err})
                    except Exception as e:  # noqa: BLE001
                        print(f"{dt} {v[-28:]} M=1 as stride-0 M=2: failed {type(e).__name__}: {e}", flush=True)
                    # (b) M=1 copied into a zero-padded 2-row A (one small copy kernel per call).
                    Ap = torch.zeros((2, K), dtype=A.dtype, device="cuda")
                    Cp = torch.empty((2, N), dtype=torch.bfloat16, device="cuda")

                    def padded(i):
                        Ap[:1].copy_(A)
                        bundle.gemm(Ap, B, Cp, variant=pre + v, **kw)
                    t = time_graph(padded, 1, replays=30)
                    err = testing.rel_error(Cp[0], ref)
                    print(f"{dt} {v[-28:]} M=1 padded copy to 2 rows: {t * 1e6:8.1f} us err {err:.2e}", flush=True)
                    rows.append({"dt": dt, "variant": v, "M": "1pad", "N": N, "K": K, "us": t * 1e6, "err": err})
            del B
            torch.cuda.empty_cache()
    if len(sys.argv) > 2:
        Path(sys.argv[2]).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
