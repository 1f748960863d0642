#!/usr/bin/env python3
"""Decode steps over a KV cache for a profiler: each problem once (after a warm-up outside the
profiled range), between ``torch.cuda.profiler.start()`` and ``stop()``, so that
``ncu --profile-from-start off python3 scripts/ncu_kvcache.py --bundle B`` sees only these
kernels, in the order printed.  Problems: paged page 16 vs the dense cache vs our dense
attention path (B8 H64/8 D64 8k: the paged path's worst ratio to the dense one), MQA (B8 H16/1
D128 4k) paged and dense, and B8 H32/8 D128 8k over a bf16 and an fp8 e4m3 cache.  ``--fp8 NAME ...``:
instead MQA B8 H16/1 4k, B8 H32/8 8k and B64 H32/8 2k (page 16) over a bf16 cache (the selection)
and over e4m3 caches by each named fp8 variant that takes the shape, looked up in the bundles
given (``--bundle B [B2 ...]``).  ``--d64-variants NAME ...``: B8 H64/8 D64 8k by each named variant at the
``--pages`` sizes, then the dense cache by the selection."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


FP8_SHAPES = [(8, 4096, 16, 1), (8, 8192, 32, 8), (64, 2048, 32, 8)]


def problems(torch, b, only_mqa=(), variants=(), pages=(16,), fp8_variants=(), bundles=(), d64_variants=()):
    def paged(B, ctx, hq, hkv, d, ps, fp8=False, variant=None, bd=None):
        g = torch.Generator(device="cuda").manual_seed(B + ctx)
        per = ctx // ps
        q = torch.randn(B, 1, hq, d, device="cuda", generator=g).bfloat16()
        kc = torch.randn(B * per, ps, hkv, d, device="cuda", generator=g).bfloat16()
        vc = torch.randn_like(kc)
        bt = torch.randperm(B * per, device="cuda", generator=g).to(torch.int32).view(B, per)
        lens = torch.full((B,), ctx, dtype=torch.int32, device="cuda")
        kw = {}
        if fp8:
            kc, vc = kc.to(torch.float8_e4m3fn), vc.to(torch.float8_e4m3fn)
            kw = dict(k_descale=torch.ones(hkv, device="cuda"), v_descale=torch.ones(1, device="cuda"))
        return lambda: (bd or b).attention_kvcache(q, kc, vc, lens, block_table=bt, variant=variant, **kw)

    def dense(B, ctx, hq, hkv, d, via_attention=False):
        g = torch.Generator(device="cuda").manual_seed(B + ctx + 1)
        q = torch.randn(B, 1, hq, d, device="cuda", generator=g).bfloat16()
        k = torch.randn(B, ctx, hkv, d, device="cuda", generator=g).bfloat16()
        v = torch.randn_like(k)
        lens = torch.full((B,), ctx, dtype=torch.int32, device="cuda")
        if via_attention:
            return lambda: b.attention(q, k, v, causal=True)
        return lambda: b.attention_kvcache(q, k, v, lens)

    if fp8_variants:  # each shape over a bf16 cache, then over e4m3 caches by each named variant
        out = {}
        for i, (B, ctx, hq, hkv) in enumerate(FP8_SHAPES):
            out[f"B{B} {ctx} H{hq}/{hkv} p16 bf16"] = paged(B, ctx, hq, hkv, 128, 16)
            # "I:NAME": only on FP8_SHAPES[I]
            for n in [x.split(":", 1)[-1] for x in fp8_variants if ":" not in x or x.split(":", 1)[0] == str(i)]:
                bd = next((x for x in bundles if any(e["name"] == n for e in x.candidates("attention_kvcache"))), None)
                if bd is not None:
                    out[f"B{B} {ctx} H{hq}/{hkv} p16 fp8 {n}"] = paged(B, ctx, hq, hkv, 128, 16, True, n, bd)
        return out
    if d64_variants:  # B8 H64/8 D64 8k by each named variant (from any bundle) at each page size, then the dense cache
        out = {}
        for ps in pages:
            for n in d64_variants:
                bd = next((x for x in bundles if any(e["name"] == n for e in x.candidates("attention_kvcache"))), None)
                if bd is not None:
                    out[f"B8 H64/8 D64 8k paged {ps} {n}"] = paged(8, 8192, 64, 8, 64, ps, variant=n, bd=bd)
        out["B8 H64/8 D64 8k dense cache"] = dense(8, 8192, 64, 8, 64)
        return out
    if only_mqa:  # the MQA problem by each named variant, at each page size
        return {f"MQA B8 H16/1 D128 4k paged {ps} {n}": paged(8, 4096, 16, 1, 128, ps, variant=n)
                for ps in pages for n in variants}
    return {
        "B8 H64/8 D64 8k paged 16": paged(8, 8192, 64, 8, 64, 16),
        "B8 H64/8 D64 8k paged 64": paged(8, 8192, 64, 8, 64, 64),
        "B8 H64/8 D64 8k dense cache": dense(8, 8192, 64, 8, 64),
        "B8 H64/8 D64 8k bundle.attention": dense(8, 8192, 64, 8, 64, True),
        "MQA B8 H16/1 D128 4k paged 16": paged(8, 4096, 16, 1, 128, 16),
        "MQA B8 H16/1 D128 4k dense cache": dense(8, 4096, 16, 1, 128),
        "B8 H32/8 D128 8k paged 16 bf16": paged(8, 8192, 32, 8, 128, 16),
        "B8 H32/8 D128 8k paged 16 fp8": paged(8, 8192, 32, 8, 128, 16, fp8=True),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--bundle", required=True, nargs="+", help="the first answers the selection's calls")
    p.add_argument("--mqa-variants", nargs="+", default=(),
                   help="profile only MQA B8 H16/1 D128 4k, once by each of these variant names")
    p.add_argument("--d64-variants", nargs="+", default=(),
                   help="profile only B8 H64/8 D64 8k, once by each of these variant names (from any --bundle), "
                        "and the dense cache by the selection")
    p.add_argument("--pages", nargs="+", type=int, default=[16], help="with --mqa-variants / --d64-variants: the page sizes")
    p.add_argument("--fp8", nargs="+", default=(), metavar="NAME",
                   help="fp8 decode variants (by name, from any --bundle; I:NAME only on shape I) beside the bf16 cache")
    a = p.parse_args()
    import torch

    from factory.runtime import Bundle

    bundles = [Bundle.open(x) for x in a.bundle]
    b = bundles[0]
    fns = {}
    for name, fn in problems(torch, b, bool(a.mqa_variants), a.mqa_variants, a.pages, a.fp8, bundles,
                             a.d64_variants).items():
        try:
            fn()
            fns[name] = fn
        except Exception as e:  # noqa: BLE001 - a problem the bundle lacks: left out
            print(f"skip {name}: {type(e).__name__}: {str(e)[:100]}")
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for name, fn in fns.items():
        print(f"profiled: {name}", flush=True)
        fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
