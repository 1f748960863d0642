#!/usr/bin/env python3
"""Chunked-prefill kernels over a paged cache for a profiler: each named variant once on one shape
(B4, Sq 512 against 4096 cached keys (``--cached``), 32 q heads over 8 kv heads, head_dim 128, pages shuffled),
after a warm-up outside the profiled range, between ``torch.cuda.profiler.start()`` and ``stop()``:

  ncu --profile-from-start off --section SpeedOfLight --section WarpStateStats ... \\
      python3 scripts/ncu_kvcache_prefill.py --bundle B NAME:PS [NAME:PS ...]

NAME:PS = a kvcache variant (dense q, causal) and the page size to run it on; ``--dense NAME ...``: our
dense varlen attention variants on the same tokens (packed q, contiguous K/V), profiled after them.  e4m3-cache variants
get the e4m3 copy of the pages, e4m3-q variants q rounded to e4m3 and unit descales.  Prints the
launch order (the profiler's kernel order)."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bundle", action="append", required=True, help="bundle(s) holding the variants")
    p.add_argument("--cached", type=int, default=4096, help="cached keys per sequence (default 4096)")
    p.add_argument("--dense", nargs="*", default=[], help="dense varlen attention variants on the same tokens")
    p.add_argument("runs", nargs="+", help="NAME:PS")
    args = p.parse_args()
    import torch

    from factory.runtime import Bundle
    from factory.runtime.attention import dense_workspace

    bundles = [Bundle.open(b) for b in args.bundle]
    b, sq, L, hq, hkv, d = 4, 512, args.cached, 32, 8, 128
    f8 = torch.float8_e4m3fn
    g = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(b, sq, hq, d, device="cuda", generator=g).bfloat16()
    k = torch.randn(b, L, hkv, d, device="cuda", generator=g).to(f8).bfloat16()
    v = torch.randn(b, L, hkv, d, device="cuda", generator=g).to(f8).bfloat16()
    seqlens = torch.full((b,), L, dtype=torch.int32, device="cuda")
    from factory.testing import kvcache_descale_args

    calls = []
    for run in args.runs:
        name, ps = run.rsplit(":", 1)
        ps = int(ps)
        bd = next(x for x in bundles if name in x.manifest["variants"])
        meta = bd.manifest["variants"][name]
        n = -(-L // ps)
        table = torch.randperm(b * n, device="cuda", generator=g).to(torch.int32).view(b, n)
        kc = torch.zeros(b * n, ps, hkv, d, device="cuda", dtype=torch.bfloat16)
        vc = torch.zeros_like(kc)
        pad = (0, 0, 0, 0, 0, n * ps - L)
        kc[table.reshape(-1).long()] = torch.nn.functional.pad(k, pad).reshape(b * n, ps, hkv, d)
        vc[table.reshape(-1).long()] = torch.nn.functional.pad(v, pad).reshape(b * n, ps, hkv, d)
        if meta["kv_dtype"] == "e4m3":
            kc, vc = kc.to(f8), vc.to(f8)
        qn, extra = q, []
        if meta["dtype"] == "e4m3":
            qn, extra = q.to(f8), [torch.ones(b, hkv, device="cuda")]
        o = torch.empty(b, sq, hq, d, device="cuda", dtype=torch.bfloat16)
        lse = torch.empty(b, hq, sq, device="cuda")
        argv = [qn, kc, vc, o, lse, table, seqlens, torch.zeros(hq, device="cuda"), *extra,
                *kvcache_descale_args(meta, torch.ones(2, hkv, device="cuda")), 1 / math.sqrt(d), 0.0, -1, -1]
        calls.append((run, (lambda bd, name, argv: lambda: bd.launch(name, argv))(bd, name, argv)))
    qp, kp, vp = q.reshape(b * sq, hq, d), k.reshape(b * L, hkv, d), v.reshape(b * L, hkv, d)
    cu_q = torch.arange(0, b * sq + 1, sq, dtype=torch.int32, device="cuda")
    cu_k = torch.arange(0, b * L + 1, L, dtype=torch.int32, device="cuda")
    o_d, lse_d = torch.empty_like(qp), torch.empty(hq, b * sq, device="cuda")
    for name in args.dense:  # (packed q, contiguous packed K/V holding the same values)
        bd = next(x for x in bundles if name in x.manifest["variants"])
        # (a dynamic build's tile counters after lse)
        argv = [qp, kp, vp, o_d, lse_d, *dense_workspace(torch, bd.manifest["variants"][name], qp), cu_q, cu_k,
                1 / math.sqrt(d), sq]
        calls.append((f"{name}:dense", (lambda bd, name, argv: lambda: bd.launch(name, argv))(bd, name, argv)))
    for _, c in calls:
        c()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for i, (run, c) in enumerate(calls):
        c()
        print(i, run, flush=True)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
