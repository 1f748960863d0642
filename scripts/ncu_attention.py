#!/usr/bin/env python3
"""Launch 16-bit attention variants by name for a profiler: each one once as a warm-up, then once
between ``torch.cuda.profiler.start()`` and ``stop()``, so that
``ncu --profile-from-start off python3 scripts/ncu_attention.py --bundle B NAME...`` sees only the
profiled launches, in the order printed.  One dense problem for all (``--shape B,H,S,D``: Hq = Hkv,
Sq = Sk; default the long-sequence point 1,16,16384,128); causal variants run it causal by their
name.  Each output is checked against NaN (outputs are NaN-poisoned first)."""

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

    b = Bundle.open(a.bundle)
    B, H, S, D = (int(x) for x in a.shape.split(","))
    entries = {e["name"]: e for e in b.candidates("attention")}
    runs = []
    for name in a.names:
        e = entries[name]
        dt = torch.bfloat16 if e["dtype"] == "bf16" else torch.float16
        g = torch.Generator(device="cuda").manual_seed(S + D)
        q, k, v = (torch.randn(B, S, H, D, device="cuda", generator=g).to(dt) for _ in range(3))
        o = torch.full_like(q, math.nan)
        lse = torch.empty(B, H, S, device="cuda")
        args = [q, k, v, o, lse, D ** -0.5]
        b.launch(name, args)
        torch.cuda.synchronize()
        if o.isnan().any():
            raise SystemExit(f"{name}: NaN in the output")
        runs.append((name, args))
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for name, args in runs:
        print(f"profiled: {name}", flush=True)
        b.launch(name, args)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
