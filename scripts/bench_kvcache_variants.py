#!/usr/bin/env python3
"""Decode over a KV cache, every decode-family variant of a bundle by name beside the selection's
pick, our dense path (``bundle.attention``) and torch SDPA, timed interleaved in one process
(``factory.benchmark.time_interleaved``: graph replay, passes in alternating order), each
variant's output checked against float32.  For split-rule and tile-config decisions: the numbers
of one call on one device compare; across calls the same cubin moves several percent.

  python3 scripts/bench_kvcache_variants.py --bundle B --out OUT.json [--shapes mqa d64 ...]
      [--base-bundle B0] [--names GLOB ...]

``--sequential-pages``: each sequence's pages in order (default: shuffled).  ``--base-bundle``: the same variant names from a second bundle (e.g. built from an earlier commit),
timed in the same interleaved run under ``base:NAME``; ``--names``: only variants matching a glob
(the rule's pick is always timed).  Each row carries the KV-read floor (K+V bytes the lengths cover,
plus q and o, over this run's copy bandwidth).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# name -> (B, context, Hq, Hkv, D, page size or None for the dense-cache form[, "mixed"])
SHAPES = {
    "mqa": [(8, 4096, 16, 1, 128, 16), (8, 4096, 16, 1, 128, 64), (8, 4096, 16, 1, 128, 1),
            (8, 4096, 16, 1, 128, None)],
    "d64": [(8, 8192, 64, 8, 64, 16), (8, 8192, 64, 8, 64, 64), (64, 1024, 32, 8, 64, 16),
            (128, 2048, 16, 1, 64, 16, "mixed")],
    "p16": [(16, 4096, 32, 8, 128, 16), (8, 8192, 32, 8, 128, 16)],
    "long": [(1, 32768, 32, 8, 128, 16), (4, 32768, 64, 8, 128, 16)],
    "d64more": [(16, 4096, 32, 8, 64, 16), (128, 2048, 16, 1, 64, 16), (256, 512, 32, 8, 64, 16),
                (32, 1024, 32, 32, 64, 16), (2, 8192, 16, 1, 64, 16)],
    "mqalast": [(4, 4096, 16, 1, 128, 16), (16, 4096, 16, 1, 128, 16), (8, 8192, 16, 1, 128, 16),
                (8, 16384, 16, 1, 128, 16), (2, 16384, 16, 1, 128, 16), (8, 1024, 16, 1, 128, 16),
                (4, 8192, 16, 2, 128, 16), (8, 4096, 16, 1, 128, 64, "mixed")],
    # the paged prologue / block-table questions: MQA 4k/8k pages 16/64, D64 page 16/64, GQA 32/8 B64 4k
    "prologue": [(8, 4096, 16, 1, 128, 16), (8, 4096, 16, 1, 128, 64), (8, 8192, 16, 1, 128, 16),
                 (8, 8192, 16, 1, 128, 64), (8, 8192, 64, 8, 64, 16), (8, 8192, 64, 8, 64, 64),
                 (8, 8192, 64, 8, 64, None), (64, 4096, 32, 8, 128, 16), (64, 4096, 32, 8, 128, 64)],
    # head_dim 64 paged vs dense cache, the same builds by name
    "d64gap": [(8, 8192, 64, 8, 64, 16), (8, 8192, 64, 8, 64, None)],
    # paged (page 16, 64, 1) beside the dense cache on the same lengths: head_dim 64 and 128, GQA and MQA
    "pagerun": [(8, 8192, 64, 8, 64, 16), (8, 8192, 64, 8, 64, 64), (8, 8192, 64, 8, 64, 1), (8, 8192, 64, 8, 64, None),
                (64, 1024, 32, 8, 64, 16), (64, 1024, 32, 8, 64, None), (16, 4096, 32, 8, 64, 16),
                (16, 4096, 32, 8, 64, None), (16, 4096, 32, 8, 128, 16), (16, 4096, 32, 8, 128, None),
                (8, 4096, 16, 1, 128, 16), (8, 4096, 16, 1, 128, None)],
    "mqamore": [(2, 4096, 16, 1, 128, 16), (1, 16384, 16, 1, 128, 16), (8, 2048, 16, 1, 128, 16),
                (4, 8192, 32, 8, 128, 16), (1, 4096, 32, 8, 128, 16)],
}
# bundle.attention (dense q, k, v) decode: (B, context, Hq, Hkv, D, Sq): the decode-family variants
# of the attention op by name (cluster and workspace splits), the rule's pick, SDPA
DENSE_SHAPES = [(8, 4096, 16, 1, 128, 1), (1, 4096, 32, 8, 128, 1), (1, 4096, 64, 8, 128, 1),
                (2, 4096, 16, 1, 128, 1), (1, 8192, 16, 1, 128, 1), (1, 4096, 32, 8, 128, 4)]


def run_dense(bundle, torch, shape, dtype, rounds, budget_s):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from factory import testing
    from factory.benchmark import time_interleaved
    from factory.runtime.attention import split_workspace

    B, sk, hq, hkv, d, sq = shape
    dt = testing.torch_dtype(dtype)
    q = torch.randn(B, sq, hq, d, device="cuda").to(dt)
    k = torch.randn(B, sk, hkv, d, device="cuda").to(dt)
    v = torch.randn(B, sk, hkv, d, device="cuda").to(dt)
    ref = testing.attention_reference(q, k, v, True, d ** -0.5)[0]
    calls, errs = {}, {}
    for e in bundle.candidates("attention"):
        if not (e.get("decode_rows") and e.get("preferred") and e["dtype"] == dtype and e["head_dim"] == d
                and e["causal"] and not e["varlen"]):
            continue
        o = torch.full_like(q, float("nan"))
        lse = torch.empty(B, hq, sq, device="cuda")
        ws = list(split_workspace(torch, q, e["splits"])) if e["splits"] > 1 else []
        args = [q, k, v, o, lse, *ws, d ** -0.5]
        bundle.launch(e["name"], args)
        torch.cuda.synchronize()
        errs[e["name"]] = testing.rel_error(o, ref)
        calls[e["name"]] = lambda _i, n=e["name"], a=args: bundle.launch(n, a)
    calls["rule"] = lambda _i: bundle.attention(q, k, v, causal=True)
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    for label, be in (("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
        def fn(_i, be=be):
            with sdpa_kernel([be]):
                return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, enable_gqa=hq != hkv)
        try:
            fn(0)
            calls[label] = fn
        except Exception:  # noqa: BLE001
            pass
    us = {k: v * 1e6 for k, v in time_interleaved(calls, 3, rounds=rounds, budget_s=budget_s).items()}
    return {"dense_shape": list(shape), "us": us, "rel_err": errs}


def run_shape(bundle, torch, shape, dtype, rounds, budget_s, base=None, globs=None, copy_bw=None, sequential=False):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from factory import testing
    from factory.benchmark import time_interleaved

    B, ctx, hq, hkv, d, ps = shape[:6]
    mixed = "mixed" in shape[6:]
    dt = testing.torch_dtype(dtype)
    gen = torch.Generator(device="cuda").manual_seed(B * 7 + ctx)
    lens = (torch.randint(ctx // 16, ctx + 1, (B,), generator=gen, device="cuda") if mixed
            else torch.full((B,), ctx, device="cuda"))
    lens[0] = ctx
    lens = lens.to(torch.int32)
    q = torch.randn(B, 1, hq, d, device="cuda", generator=gen).to(dt)
    kd = torch.randn(B, ctx, hkv, d, device="cuda", generator=gen).to(dt)
    vd = torch.randn(B, ctx, hkv, d, device="cuda", generator=gen).to(dt)
    if ps is None:
        kc, vc, bt = kd, vd, None
    else:  # pages dealt out in a shuffled order
        per = -(-ctx // ps)
        perm = torch.randperm(B * per, generator=gen, device="cuda")
        if sequential:  # each sequence's pages in order, one after the other
            perm = torch.arange(B * per, device="cuda")
        kc = torch.empty(B * per, ps, hkv, d, device="cuda", dtype=dt)
        vc = torch.empty_like(kc)
        pad = per * ps - ctx
        kc[perm] = F.pad(kd, (0, 0, 0, 0, 0, pad)).view(B * per, ps, hkv, d)
        vc[perm] = F.pad(vd, (0, 0, 0, 0, 0, pad)).view(B * per, ps, hkv, d)
        bt = perm.view(B, per).to(torch.int32)
    nref = min(B, 4)
    ref, _ = testing.attention_kvcache_reference(q[:nref], kc if ps else kc[:nref], vc if ps else vc[:nref],
                                                 lens[:nref], bt[:nref] if bt is not None else None)
    calls, errs = {}, {}
    names = [e["name"] for e in bundle.candidates("attention_kvcache")
             if e["family"] == "sm90_decode" and e["dtype"] == dtype and e["head_dim"] == d
             and e.get("kv_dtype", dtype) == dtype and bool(e["paged"]) == (ps is not None) and not e.get("sinks")]
    rule = bundle.plan_kvcache(batch=B, seqlen_q=1, heads_q=hq, heads_kv=hkv, head_dim=d, dtype=dt,
                               **({"max_seqlen_k": ctx} if ps is None else
                                  {"page_size": ps, "max_pages": bt.shape[1]})).variant
    if globs:
        names = [n for n in names if n == rule or any(fnmatch.fnmatch(n, g) for g in globs)]
    runs = [(n, n, bundle) for n in names]
    if base is not None:
        have = {e["name"] for e in base.candidates("attention_kvcache")}
        runs += [(f"base:{n}", n, base) for n in names if n in have]
    for label, n, bd in runs:
        o = torch.full_like(q, float("nan"))
        bd.attention_kvcache(q, kc, vc, lens, block_table=bt, variant=n, out=o)
        errs[label] = testing.rel_error(o[:nref], ref)
        calls[label] = lambda _i, n=n, bd=bd: bd.attention_kvcache(q, kc, vc, lens, block_table=bt, variant=n)
    calls["rule"] = lambda _i: bundle.attention_kvcache(q, kc, vc, lens, block_table=bt)
    dense_b = bundle if bundle.candidates("attention") else base if base is not None and base.candidates("attention") else None
    if not mixed and dense_b is not None:  # (bundles of attention_kvcache variants only: none)
        calls["dense_path"] = lambda _i: dense_b.attention(q, kd, vd, causal=True)
    qt, kt, vt = (x.transpose(1, 2) for x in (q, kd, vd))
    mask = ((torch.arange(ctx, device="cuda")[None, :] < lens[:, None].long())[:, None, None, :] if mixed else None)
    for label, backend in (("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
        def fn(_i, backend=backend):
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, enable_gqa=hq != hkv)
        try:
            fn(0)
            calls[label] = fn
        except Exception:  # noqa: BLE001 - a backend that refuses the shape is left out
            pass
    us = {k: v * 1e6 for k, v in time_interleaved(calls, 3, rounds=rounds, budget_s=budget_s).items()}
    keys = int(lens.sum())
    floor = ((2 * keys * hkv * d + 2 * B * hq * d) * kd.element_size() / copy_bw * 1e6) if copy_bw else None
    return {"shape": list(shape[:6]), "mixed": mixed, "rule": rule, "us": us, "rel_err": errs, "floor_us": floor}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bundle", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--dense", action="store_true", help="also bundle.attention's decode variants by name (DENSE_SHAPES)")
    p.add_argument("--base-bundle", help="a second bundle: the same names timed as base:NAME")
    p.add_argument("--names", nargs="*", default=None, help="globs: only these variants (and the rule's pick)")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--sequential-pages", action="store_true", help="pages in order (default: shuffled)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--budget", type=float, default=0.02, help="GPU seconds per variant and pass")
    a = p.parse_args()
    import torch

    from factory.runtime import Bundle

    from factory.benchmark import copy_bandwidth

    b = Bundle.open(a.bundle)
    base = Bundle.open(a.base_bundle) if a.base_bundle else None
    copy_bw = copy_bandwidth()
    rows = []
    for key in a.shapes:
        for shape in SHAPES[key]:
            row = run_shape(b, torch, shape, a.dtype, a.rounds, a.budget, base, a.names, copy_bw, a.sequential_pages)
            rows.append(row)
            best = min((v for k, v in row["us"].items() if k.startswith("sdpa")), default=float("nan"))
            print(f"{shape}: rule {row['rule']} {row['us']['rule']:.1f} µs, dense path "
                  f"{row['us'].get('dense_path', float('nan')):.1f}, best SDPA {best:.1f}, "
                  f"floor {row['floor_us'] or float('nan'):.1f}", flush=True)
            for k, v in sorted(row["us"].items(), key=lambda kv: kv[1]):
                if k.startswith(("attention_kvcache", "base:")):
                    short = k.replace("attention_kvcache_sm90_", "").replace("_causal", "")
                    print(f"    {v:7.1f} µs  {short}  err {row['rel_err'][k]:.1e}", flush=True)
            torch.cuda.empty_cache()
    if a.dense:
        for shape in DENSE_SHAPES:
            row = run_dense(b, torch, shape, a.dtype, a.rounds, a.budget)
            rows.append(row)
            base = min((v for k, v in row["us"].items() if k.startswith("sdpa")), default=float("nan"))
            print(f"dense {shape}: rule {row['us']['rule']:.1f} µs, best SDPA {base:.1f}", flush=True)
            for k, v in sorted(row["us"].items(), key=lambda kv: kv[1]):
                if k.startswith("attention_"):
                    print(f"    {v:7.1f} µs  {k.removeprefix('attention_sm90_')}  err {row['rel_err'][k]:.1e}", flush=True)
    Path(a.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "copy_bw": copy_bw, "rows": rows},
                                      indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
