#!/usr/bin/env python3
"""Host cost of one launch through the bundle (selection-cache hit) beside torch.mm, on a problem
so small that the GPU never holds the host back: the number an eager inference server pays."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from factory.runtime import Bundle  # noqa: E402


def per_call_us(fn, calls: int = 2000, repeats: int = 7) -> float:
    import torch

    fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(samples)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--bundle", default="artifacts/default")
    a = p.parse_args()
    import torch

    b = Bundle.open(a.bundle)
    x = torch.randn(16, 64, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(16, 64, device="cuda", dtype=torch.bfloat16)
    ours = per_call_us(lambda: b.gemm(x, w, out))
    ours_alloc = per_call_us(lambda: b.gemm(x, w))
    ref = per_call_us(lambda: torch.mm(x, w.t(), out=out))
    print(f"host µs per call: bundle.gemm(out=) {ours:.1f}, bundle.gemm() {ours_alloc:.1f}, torch.mm(out=) {ref:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
