#!/usr/bin/env python3
"""Launch attention variants by name, once each, on one dense problem: a target for Nsight
Compute (``ncu -k regex:FlashFwd ...``: the i-th profiled kernel is the i-th name given).

  python3 scripts/probes/probe_attention_launch.py BUNDLE B HQ HKV SQ SK D CAUSAL NAME [NAME ...]
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main(argv) -> int:
    import torch

    from factory.runtime import Bundle

    bundle = Bundle.open(argv[0])
    b, hq, hkv, sq, sk, d, causal = (int(x) for x in argv[1:8])
    q = torch.randn(b, sq, hq, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16)
    for name in argv[8:]:
        e = bundle.entry(name) if hasattr(bundle, "entry") else None
        if e is not None and bool(e["causal"]) != bool(causal):
            raise SystemExit(f"{name} is {'' if e['causal'] else 'not '}causal")
        o = torch.full_like(q, math.nan)
        lse = torch.empty(b, hq, sq, device="cuda")
        bundle.launch(name, [q, k, v, o, lse, d ** -0.5])
        torch.cuda.synchronize()
        print(name, "NaN in o" if o.isnan().any() else "ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
