#!/usr/bin/env python3
"""Launch attention variants by name for a profiler: each one once as a warm-up, then once
between ``torch.cuda.profiler.start()`` and ``stop()``, so that
``ncu --profile-from-start off python3 scripts/ncu_attention.py --bundle B NAME...`` sees only the
profiled launches, in the order printed.  One dense problem for all (``--shape B,H,S,D``: Hq = Hkv,
Sq = Sk; default the long-sequence point 1,16,16384,128); causal variants run it causal by their
name.  Names: 16-bit variants (``attention``), fp8 e4m3 variants (``attention_fp8``: N(0,1) data
in e4m3, unit descales, V as K or pre-transposed by the name's ``vbshd`` / ``vbhds``), and
``sdpa:cudnn`` / ``sdpa:flash`` (torch SDPA with that backend alone, bf16, non-causal; append
``:causal`` for causal) for the library's kernels beside ours.  Each output is checked against NaN
(outputs are NaN-poisoned first)."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--bundle", required=True)
    p.add_argument("--shape", default="1,16,16384,128", help="B,H,S,D (default: %(default)s)")
    p.add_argument("names", nargs="+")
    a = p.parse_args()
    import torch

    from factory.runtime import Bundle
    from factory.runtime.attention import dense_workspace

    b = Bundle.open(a.bundle)
    B, H, S, D = (int(x) for x in a.shape.split(","))
    entries = {e["name"]: e for op in ("attention", "attention_fp8") for e in b.candidates(op)}
    runs = []
    for name in a.names:
        g = torch.Generator(device="cuda").manual_seed(S + D)
        if name.startswith("sdpa:"):
            from torch.nn.attention import SDPBackend, sdpa_kernel

            be = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[name.split(":")[1]]
            causal = name.endswith(":causal")
            q, k, v = (torch.randn(B, H, S, D, device="cuda", generator=g).to(torch.bfloat16) for _ in range(3))

            def call(q=q, k=k, v=v, be=be, causal=causal):
                with sdpa_kernel([be]):
                    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

            if call().isnan().any():
                raise SystemExit(f"{name}: NaN in the output")
            runs.append((name, call))
            continue
        e = entries[name]
        if e["dtype"] == "e4m3":
            q, k, v = (torch.randn(B, S, H, D, device="cuda", generator=g).to(torch.float8_e4m3fn) for _ in range(3))
            if "_vbhds" in name:
                v = v.permute(0, 2, 3, 1).contiguous()  # (B, Hkv, D, Sk)
            o = torch.full((B, S, H, D), math.nan, device="cuda", dtype=torch.bfloat16)
            ones = torch.ones(B, H, device="cuda")
            args = [q, k, v, o, torch.empty(B, H, S, device="cuda"), ones, ones, ones, D ** -0.5]
        else:
            dt = torch.bfloat16 if e["dtype"] == "bf16" else torch.float16
            q, k, v = (torch.randn(B, S, H, D, device="cuda", generator=g).to(dt) for _ in range(3))
            o = torch.full_like(q, math.nan)
            args = [q, k, v, o, torch.empty(B, H, S, device="cuda"), *dense_workspace(torch, e, q), D ** -0.5]
        b.launch(name, args)
        torch.cuda.synchronize()
        if o.isnan().any():
            raise SystemExit(f"{name}: NaN in the output")
        runs.append((name, lambda name=name, args=args: b.launch(name, args)))
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for name, call in runs:
        print(f"profiled: {name}", flush=True)
        call()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
