#!/usr/bin/env python3
"""Chunked prefill over a paged KV cache beside our dense varlen attention on the same tokens.

Per shape (B sequences, each a chunk of Sq new queries against L cached keys, the chunk's own
keys included, bottom-right causal): an ``attention_kvcache`` variant launched by name on a
paged cache (page size PS, pages shuffled) and each dense varlen ``attention`` variant named on
the command line, on packed q (B·Sq tokens) and contiguous packed K/V (B·L tokens) holding the
same values.  CUDA events over graph replay (time_interleaved: the candidates alternate), medians;
TFLOP/s count the visible (causal) score entries.  One result row per shape, checked against
each other (max |Δo|) before timing.  Writes ``OUT.json``.

  python3 scripts/bench_kvcache_prefill.py --kv-bundle B1 --dense-bundle B2 \
      --kv NAME --dense NAME [NAME ...] [--base-bundle B3 --base NAME ...] [--out OUT]

``--base``: kvcache variants of a second bundle (e.g. the same variant built from an earlier
commit), timed in the same interleaved run under the label ``base:NAME``.  ``--shapes``: the shape sets (``d128``, the default; ``d256``: head_dim 256, 16 q heads over 8 kv
heads; ``fp8``: head_dim 128 with K/V rounded to e4m3 values, so that the e4m3-cache variants and
the dense bf16 path see the same numbers; ``fp8tma``: the same over pages of 64-256 rows,
``fp8small`` of 16 and 32; ``ragged``: cached lengths on and off the key tiles). Each variant runs
the shapes of its head_dim; variants with an e4m3 cache get the e4m3 copy of the pages and unit
descales; variants with e4m3 q (fp8 WGMMAs) get q rounded to e4m3 and a unit q_descale. Packed-q kvcache variants run through ``bundle.attention_kvcache`` (``cu_seqlens_q``, by name). ``--dense``
may also name an fp8 varlen forward (``attention_fp8``, V as K): it runs on the e4m3 copies, and the
speedups stay against the fastest 16-bit dense build.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from factory.benchmark import default_out, time_interleaved  # noqa: E402
from factory.testing import kvcache_descale_args  # noqa: E402

# (B, Sq, L, Hq, Hkv, D, PS)
SHAPES = [
    (8, 128, 1024, 32, 8, 128, 16),
    (4, 512, 4096, 32, 8, 128, 16),
    (2, 2048, 8192, 32, 8, 128, 16),
    (1, 2048, 32768, 32, 8, 128, 16),
    (4, 512, 4096, 32, 8, 128, 128),
    (1, 2048, 32768, 32, 8, 128, 128),
    (4, 512, 4096, 32, 8, 128, 1),
    (4, 512, 4096, 32, 8, 128, 64),
    (8, 128, 1024, 32, 8, 128, 64),
    (4, 512, 4096, 32, 8, 128, 32),
    (1, 2048, 32768, 32, 8, 128, 32),
    (4, 512, 4096, 32, 8, 128, 8),
]
SHAPE_SETS = {
    "d128": SHAPES,
    "d256": [(8, 128, 1024, 16, 8, 256, 16), (4, 512, 4096, 16, 8, 256, 16), (2, 2048, 8192, 16, 8, 256, 16),
             (4, 512, 4096, 16, 8, 256, 64), (1, 2048, 32768, 16, 8, 256, 64), (4, 512, 4096, 16, 8, 256, 32)],
    "fp8": [(8, 128, 1024, 32, 8, 128, 16), (4, 512, 4096, 32, 8, 128, 16), (1, 2048, 32768, 32, 8, 128, 16),
            (4, 512, 4096, 32, 8, 128, 64)],
    # fp8 caches in pages the TMA page boxes take (64-256 rows)
    "fp8tma": [(8, 128, 1024, 32, 8, 128, 64), (4, 512, 4096, 32, 8, 128, 64), (2, 2048, 8192, 32, 8, 128, 128),
               (1, 2048, 32768, 32, 8, 128, 64), (4, 512, 4096, 32, 8, 128, 256),
               # cached lengths off the 128-key tiles (a partly filled last tile)
               (8, 128, 1000, 32, 8, 128, 64), (4, 512, 4000, 32, 8, 128, 64)],
    # fp8 caches in pages of 16 and 32 rows (vLLM's default 16), lengths on and off the key tiles
    "fp8small": [(8, 128, 1000, 32, 8, 128, 16), (4, 512, 4096, 32, 8, 128, 16), (4, 512, 4000, 32, 8, 128, 16),
                 (2, 2048, 8192, 32, 8, 128, 16), (1, 2048, 32768, 32, 8, 128, 16), (4, 512, 4096, 32, 8, 128, 32)],
    # cached lengths on and off the 128-key tiles (off: the last key tile partly filled)
    "ragged": [(8, 128, 1024, 32, 8, 128, 16), (8, 128, 1000, 32, 8, 128, 16), (4, 512, 4096, 32, 8, 128, 16),
               (4, 512, 4000, 32, 8, 128, 16), (4, 512, 4000, 32, 8, 128, 64), (1, 2048, 32000, 32, 8, 128, 16)],
    # the last key tile partly filled, pages of 16 and 64 rows, beside the same shapes on the tiles
    "tail": [(8, 128, 1000, 32, 8, 128, 16), (4, 512, 4000, 32, 8, 128, 16), (4, 512, 4096, 32, 8, 128, 16),
             (8, 128, 1000, 32, 8, 128, 64), (4, 512, 4000, 32, 8, 128, 64), (4, 512, 4096, 32, 8, 128, 64),
             (1, 2048, 32000, 32, 8, 128, 64)],
    # pages of 16 rows (vLLM's default), lengths on and off the key tiles
    "page16": [(8, 128, 1000, 32, 8, 128, 16), (4, 512, 4096, 32, 8, 128, 16), (4, 512, 4000, 32, 8, 128, 16),
               (1, 2048, 32768, 32, 8, 128, 16)],
    # the TMA page boxes' producer: pages of 16/32/64 rows, head_dim 128 and 256
    "boxes": [(8, 128, 1000, 32, 8, 128, 16), (4, 512, 4000, 32, 8, 128, 16), (4, 512, 4096, 32, 8, 128, 16),
              (2, 2048, 8192, 32, 8, 128, 16), (1, 2048, 32768, 32, 8, 128, 16), (4, 512, 4096, 32, 8, 128, 32),
              (8, 128, 1024, 32, 8, 128, 64), (4, 512, 4000, 32, 8, 128, 64), (4, 512, 4096, 32, 8, 128, 64),
              (1, 2048, 32768, 32, 8, 128, 64), (4, 512, 4096, 16, 8, 256, 64), (1, 2048, 32768, 16, 8, 256, 64)],
}


def visible_pairs(sq: int, L: int) -> int:
    """Score entries a bottom-right causal chunk of sq queries over L keys computes."""
    return sum(min(L, L - sq + s + 1) for s in range(sq))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kv-bundle", required=True)
    p.add_argument("--dense-bundle", required=True)
    p.add_argument("--kv", nargs="+", required=True,
                   help="attention_kvcache variants (paged, causal, dense q); each runs the page sizes it takes")
    p.add_argument("--dense", nargs="+", required=True, help="attention varlen causal variants")
    p.add_argument("--base-bundle", help="a second kvcache bundle (e.g. an earlier build)")
    p.add_argument("--base", nargs="*", default=[], help="its variants, labelled base:NAME")
    p.add_argument("--sequential-pages", action="store_true",
                   help="each sequence's pages in order, one after the other (default: shuffled)")
    p.add_argument("--shapes", nargs="+", default=["d128"], choices=sorted(SHAPE_SETS))
    p.add_argument("--out", default=default_out("bench_kvcache_prefill"))
    args = p.parse_args()

    import torch

    from factory.runtime import Bundle
    from factory.runtime.attention import dense_workspace

    kvb, db = Bundle.open(args.kv_bundle), Bundle.open(args.dense_bundle)
    bases = {}
    if args.base:
        bb = Bundle.open(args.base_bundle)
        bases = {f"base:{n}": (bb, n) for n in args.base}
    rows = []
    f8 = torch.float8_e4m3fn
    for (b, sq, L, hq, hkv, d, ps), set_name in [(s, n) for n in args.shapes for s in SHAPE_SETS[n]]:
        g = torch.Generator(device="cuda").manual_seed(b * sq + L)
        dt = torch.bfloat16
        q = torch.randn(b, sq, hq, d, device="cuda", generator=g).to(dt)
        k = torch.randn(b, L, hkv, d, device="cuda", generator=g).to(dt)
        v = torch.randn(b, L, hkv, d, device="cuda", generator=g).to(dt)
        if set_name.startswith("fp8"):
            k, v = k.to(f8).to(dt), v.to(f8).to(dt)
        npages = -(-L // ps)
        perm = torch.randperm(b * npages, device="cuda", generator=g).to(torch.int32)
        if args.sequential_pages:
            perm = torch.arange(b * npages, device="cuda", dtype=torch.int32)
        table = perm.reshape(b, npages).contiguous()
        kc = torch.empty(b * npages, ps, hkv, d, device="cuda", dtype=dt)
        vc = torch.empty_like(kc)
        pad = npages * ps - L
        kp = torch.nn.functional.pad(k, (0, 0, 0, 0, 0, pad)).reshape(b * npages, ps, hkv, d)
        vp = torch.nn.functional.pad(v, (0, 0, 0, 0, 0, pad)).reshape(b * npages, ps, hkv, d)
        kc[table.reshape(-1).long()] = kp
        vc[table.reshape(-1).long()] = vp
        seqlens = torch.full((b,), L, dtype=torch.int32, device="cuda")
        sinks = torch.zeros(hq, device="cuda")
        desc = torch.ones(2, hkv, device="cuda")
        scale = 1.0 / math.sqrt(d)
        o_kv = torch.empty_like(q)
        lse_kv = torch.empty(b, hq, sq, device="cuda")
        qp = q.reshape(b * sq, hq, d)
        kp_, vp_ = k.reshape(b * L, hkv, d), v.reshape(b * L, hkv, d)
        cu_q = torch.arange(0, b * sq + 1, sq, dtype=torch.int32, device="cuda")
        cu_k = torch.arange(0, b * L + 1, L, dtype=torch.int32, device="cuda")
        o_d = torch.empty_like(qp)
        lse_d = torch.empty(hq, b * sq, device="cuda")

        kv = {n: (kvb, n) for n in args.kv}
        kv.update(bases)
        meta = {n: bd.manifest["variants"][v] for n, (bd, v) in kv.items()}
        kv_names = [n for n in kv if ps in meta[n]["page_sizes"] and meta[n]["head_dim"] == d]
        dense_names = [n for n in args.dense if db.manifest["variants"][n]["head_dim"] == d]
        if not kv_names or not dense_names:
            continue
        kc8, vc8 = kc.to(f8), vc.to(f8)
        # f16 builds: q and the output in f16 (a bf16 cache converted; e4m3 caches as they are)
        q16, kc16, vc16, o16 = q.half(), kc.half(), vc.half(), torch.empty_like(q, dtype=torch.float16)
        calls = {}
        outs = {}
        # e4m3 q (the fp8-WGMMA builds): q rounded to e4m3, unit q_descale (B, Hkv)
        q8, qdesc = q.to(f8), torch.ones(b, hkv, device="cuda")
        qp8, kp8, vp8 = qp.to(f8), kp_.to(f8), vp_.to(f8)
        qdesc_d, kdesc_d = torch.ones(b, hkv, device="cuda"), torch.ones(b, hkv, device="cuda")
        for name in kv_names:
            f16 = meta[name]["dtype"] == "f16"
            kcn, vcn = ((kc8, vc8) if meta[name]["kv_dtype"] == "e4m3" else (kc16, vc16) if f16 else (kc, vc))
            qn, on = (q16, o16) if f16 else (q, o_kv)
            extra = []
            if meta[name]["dtype"] == "e4m3":
                qn, extra = q8, [qdesc]
            if meta[name].get("varlen"):  # packed q (B·Sq tokens): through the API, by name
                on = torch.empty_like(qp)
                outs[name] = on
                calls[name] = (lambda bd, n, on: lambda _i: bd.attention_kvcache(
                    qp, kc, vc, seqlens, block_table=table, cu_seqlens_q=cu_q, max_seqlen_q=sq, variant=n,
                    out=on, softmax_scale=scale))(*kv[name], on)
                continue
            outs[name] = on
            extra = extra + kvcache_descale_args(meta[name], desc)
            calls[name] = (lambda bd, n, qn, kcn, vcn, on, extra: lambda _i: bd.launch(
                n, [qn, kcn, vcn, on, lse_kv, table, seqlens, sinks, *extra, scale, 0.0, -1, -1]))(
                    *kv[name], qn, kcn, vcn, on, extra)
        for name in dense_names:
            if db.manifest["variants"][name]["dtype"] == "e4m3":  # the dense fp8 varlen forward
                calls[name] = (lambda n: lambda _i: db.launch(
                    n, [qp8, kp8, vp8, o_d, lse_d, cu_q, cu_k, qdesc_d, kdesc_d, kdesc_d, scale, sq]))(name)
            else:  # (a dynamic build's tile counters after lse: the stream's or the capture's words)
                calls[name] = (lambda n, e: lambda _i: db.launch(
                    n, [qp, kp_, vp_, o_d, lse_d, *dense_workspace(torch, e, qp), cu_q, cu_k, scale, sq]))(
                        name, db.manifest["variants"][name])
        # every candidate against the first dense one (an unwritten output shows as NaN)
        o_d.fill_(math.nan)
        calls[dense_names[0]](0)
        ref = o_d.reshape(b, sq, hq, d).float().clone()
        diffs = {}
        for name in calls:
            out = outs[name] if name in kv_names else o_d
            out.fill_(math.nan)
            calls[name](0)
            torch.cuda.synchronize()
            diffs[name] = (out.reshape(b, sq, hq, d).float() - ref).abs().max().item()
        t = time_interleaved(calls, 1)
        flops = 4 * b * hq * d * visible_pairs(sq, L)
        row = {"set": set_name, "shape": {"B": b, "Sq": sq, "L": L, "Hq": hq, "Hkv": hkv, "D": d, "PS": ps},
               "us": {n: round(s * 1e6, 2) for n, s in t.items()},
               "tflops": {n: round(flops / s / 1e12, 1) for n, s in t.items()},
               "max_abs_diff_vs_first_dense": diffs}
        # (the target's denominator: the 16-bit dense varlen builds; an fp8 dense build is a candidate)
        best_dense = min(t[n] for n in dense_names if db.manifest["variants"][n]["dtype"] != "e4m3")
        row["speedup_vs_best_dense"] = {n: round(best_dense / t[n], 3) for n in kv_names}
        rows.append(row)
        print(json.dumps(row), flush=True)
        del kc, vc, kc8, vc8, kp, vp, k, v
        torch.cuda.empty_cache()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    dev = torch.cuda.get_device_name()
    pages = "sequential" if args.sequential_pages else "shuffled"
    out.with_suffix(".json").write_text(json.dumps({"device": dev, "kv": args.kv, "base": args.base, "pages": pages,
                                                    "dense": args.dense, "rows": rows}, indent=1))
    print("wrote", out.with_suffix(".json"))


if __name__ == "__main__":
    main()
