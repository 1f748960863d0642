#!/usr/bin/env python3
"""fp8 GEMM variants by name for a profiler: each named variant launched once on one problem
(after a warm-up outside the profiled range) between ``torch.cuda.profiler.start()`` and
``stop()``, so that ``ncu --profile-from-start off python3 scripts/ncu_block_scaled.py ...`` sees
only these launches, in the order given.  Block-scaled variants get DeepSeek-V3 1x128 / 128x128
scales, row-scaled ones row scales, per-tensor ones scales of one (factory.testing).  The names
``torch-row`` / ``torch-row-fast`` launch ``torch._scaled_mm`` row-wise (without / with fast
accumulation) on the row problem, so its kernel can be profiled beside ours.

    ncu --profile-from-start off --clock-control none --section WarpStateStats ... \\
        python3 scripts/ncu_block_scaled.py --bundle B --shape 4096 7168 16384 NAME [OTHER_BUNDLE:NAME ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    import torch

    from factory import testing
    from factory.runtime import Bundle

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--shape", nargs=3, type=int, default=[4096, 7168, 16384], metavar=("M", "N", "K"))
    ap.add_argument("names", nargs="+")
    args = ap.parse_args()
    bundles = {args.bundle: Bundle.open(args.bundle)}
    M, N, K = args.shape
    out = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
    calls = []
    for spec in args.names:
        if spec.startswith("torch-row"):
            a, w, scales, _ = testing.fp8_scaled_problem("row", M, N, K)
            fast = spec == "torch-row-fast"
            sa, sb, wt = scales["scale_a"][:, None], scales["scale_b"][None, :], w.t()

            def torch_row(a=a, wt=wt, sa=sa, sb=sb, fast=fast):
                torch._scaled_mm(a, wt, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16, use_fast_accum=fast)

            torch_row()
            calls.append((None, spec, torch_row, None, None))
            continue
        path, _, name = spec.rpartition(":")
        if (path or args.bundle) not in bundles:
            bundles[path] = Bundle.open(path)
        b = bundles[path or args.bundle]
        mode = b.manifest["variants"][name].get("scale_mode") or "tensor"
        a, w, scales, _ = testing.fp8_scaled_problem("row" if mode == "tensor" else mode, M, N, K)
        if mode == "tensor":
            one = torch.ones(1, device="cuda")
            scales = {"scale_a": one, "scale_b": one}
        calls.append((b, name, a, w, scales))
        b.gemm(a, w, out, variant=name, **scales)  # module load and warm-up, not profiled
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for b, name, a, w, scales in calls:
        if b is None:
            a()
        else:
            b.gemm(a, w, out, variant=name, **scales)
        print(name, flush=True)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
