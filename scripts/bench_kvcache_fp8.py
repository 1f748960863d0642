#!/usr/bin/env python3
"""fp8 e4m3 KV-cache decode beside the bf16-cache decode on the same pages: per shape and page size,
CUDA-graph replay (3 calls per graph), interleaved medians (``time_interleaved``) of

* ``bf16``: the bf16 cache through ``--base``'s selection,
* ``fp8``: the same pages as e4m3 (per-kv-head descales) through ``--base``'s selection,
* every fp8 decode variant of ``--new`` by name (``new:NAME``), and ``new`` through its selection,
* ``--extra LABEL=BUNDLE``: that bundle's fp8 decode variants of the names ``--new`` has, by name
  (``LABEL:NAME``; e.g. the same variants built from other code),
* ``--more LABEL=BUNDLE``: every fp8 decode variant of that bundle by name (``LABEL:NAME``; e.g.
  the current builds beside new ones),

each fp8 output checked against the float32 reference on the dequantised cache (first 4
sequences).  Writes ``OUT.json``: per row the times, the bf16/fp8 ratios and the errors.

    python3 scripts/bench_kvcache_fp8.py --base B --new N --out OUT
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from factory.benchmark import default_out, time_interleaved  # noqa: E402

# (B, context, Hq, Hkv)
SHAPES = [(64, 2048, 32, 8), (16, 4096, 32, 8), (8, 8192, 32, 8), (4, 4096, 32, 8), (8, 4096, 16, 1),
          (32, 1024, 32, 32), (1, 32768, 32, 8)]
PAGES = (16, 64)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", required=True, help="bundle with the bf16 and the reference fp8 decode")
    p.add_argument("--new", required=True, help="bundle with the fp8 decode variants to compare")
    p.add_argument("--extra", action="append", default=[], metavar="LABEL=BUNDLE")
    p.add_argument("--more", action="append", default=[], metavar="LABEL=BUNDLE")
    p.add_argument("--shapes", nargs="+", type=int, default=None, metavar="I", help="rows of SHAPES (default: all)")
    p.add_argument("--pages", nargs="+", type=int, default=list(PAGES))
    p.add_argument("--no-descale", action="store_true",
                   help="also time --new's selection without descales (new-nodesc: the cached unit descales; "
                        "its output is left unchecked)")
    p.add_argument("--names", default="*", help="glob over --new's fp8 variant names timed by name")
    p.add_argument("--budget", type=float, default=0.02, help="GPU seconds per pass and candidate")
    p.add_argument("--out", default=default_out("bench_kvcache_fp8"))
    a = p.parse_args(argv)

    import torch

    from factory import testing
    from factory.runtime import Bundle

    base, new = Bundle.open(a.base), Bundle.open(a.new)
    names = [e["name"] for e in new.candidates("attention_kvcache")
             if e.get("kv_dtype") == "e4m3" and e.get("family") == "sm90_decode" and e["paged"]]
    extra = {lab: Bundle.open(path) for lab, path in (x.split("=", 1) for x in a.extra)}
    more = {lab: Bundle.open(path) for lab, path in (x.split("=", 1) for x in a.more)}
    f8 = torch.float8_e4m3fn
    rows = []
    for B, ctx, hq, hkv in [SHAPES[i] for i in a.shapes] if a.shapes is not None else SHAPES:
        for ps in a.pages:
            gen = torch.Generator(device="cuda").manual_seed(B * 7 + ctx + ps)
            d = 128
            q = torch.randn(B, 1, hq, d, device="cuda", generator=gen).to(torch.bfloat16)
            per = -(-ctx // ps)
            kc = torch.randn(B * per, ps, hkv, d, device="cuda", generator=gen).to(torch.bfloat16)
            vc = torch.randn(B * per, ps, hkv, d, device="cuda", generator=gen).to(torch.bfloat16)
            bt = torch.randperm(B * per, generator=gen, device="cuda").view(B, per).to(torch.int32)
            lens = torch.full((B,), ctx, device="cuda", dtype=torch.int32)
            desc = torch.rand(hkv, device="cuda", generator=gen) + 0.5
            k8, v8 = kc.to(f8), vc.to(f8)
            ref, _ = testing.attention_kvcache_reference(q[:4], k8, v8, lens[:4], bt[:4], k_descale=desc,
                                                         v_descale=desc)

            def fp8_call(bd, variant=None):
                kw = {"variant": variant} if variant else {}
                return lambda _i: bd.attention_kvcache(q, k8, v8, lens, block_table=bt, k_descale=desc,
                                                       v_descale=desc, **kw)

            calls = {"bf16": lambda _i: base.attention_kvcache(q, kc, vc, lens, block_table=bt),
                     "fp8": fp8_call(base), "new": fp8_call(new)}
            calls.update({f"new:{n}": fp8_call(new, n) for n in names if fnmatch.fnmatch(n, a.names)})
            if a.no_descale:
                calls["new-nodesc"] = lambda _i: new.attention_kvcache(q, k8, v8, lens, block_table=bt)
            for lab, bd in extra.items():
                have = {e["name"] for e in bd.candidates("attention_kvcache")}
                calls.update({f"{lab}:{n}": fp8_call(bd, n) for n in names if n in have})
            for lab, bd in more.items():
                calls.update({f"{lab}:{e['name']}": fp8_call(bd, e["name"]) for e in bd.candidates("attention_kvcache")
                              if e.get("kv_dtype") == "e4m3" and e.get("family") == "sm90_decode" and e["paged"]})
            errs, picks = {}, {}
            for lab, fn in list(calls.items()):
                if lab in ("bf16", "new-nodesc"):
                    continue
                try:
                    out = fn(0)
                    errs[lab] = testing.rel_error(out[:4], ref)
                except Exception as e:  # noqa: BLE001 - a variant that refuses the shape is left out
                    errs[lab] = f"{type(e).__name__}: {str(e)[:100]}"
                    del calls[lab]
            for lab, bd in (("fp8", base), ("new", new)):
                picks[lab] = bd.plan_kvcache(batch=B, seqlen_q=1, heads_q=hq, heads_kv=hkv, head_dim=d,
                                             dtype=torch.bfloat16, kv_dtype=f8, page_size=ps,
                                             max_pages=per).variant
            picks["bf16"] = base.plan_kvcache(batch=B, seqlen_q=1, heads_q=hq, heads_kv=hkv, head_dim=d,
                                              dtype=torch.bfloat16, page_size=ps, max_pages=per).variant
            t = time_interleaved(calls, 3, rounds=3, budget_s=a.budget)
            us = {k: round(v * 1e6, 2) for k, v in t.items()}
            best = min((k for k in us if k.startswith("new:")), key=us.get, default=None)
            row = {"B": B, "ctx": ctx, "Hq": hq, "Hkv": hkv, "page": ps, "us": us, "picks": picks,
                   "rel_err": {k: (round(v, 6) if isinstance(v, float) else v) for k, v in errs.items()},
                   "bf16_over_fp8": round(us["bf16"] / us["fp8"], 3),
                   "bf16_over_new": round(us["bf16"] / us["new"], 3) if "new" in us else None,
                   "bf16_over_best_new": round(us["bf16"] / us[best], 3) if best else None, "best_new": best}
            rows.append(row)
            print(f"B{B} {ctx} H{hq}/{hkv} p{ps}: bf16 {us['bf16']:.1f}  fp8 {us['fp8']:.1f} "
                  f"({row['bf16_over_fp8']:.2f}x)  new {us.get('new', float('nan')):.1f} "
                  f"({row['bf16_over_new'] or float('nan'):.2f}x)  best {best} {us.get(best, float('nan')):.1f} "
                  f"({row['bf16_over_best_new'] or float('nan'):.2f}x)", flush=True)
            print("   " + ", ".join(f"{k.replace('attention_kvcache_sm90_bf16_d128_q16_', '')}: {v}"
                                    for k, v in us.items() if ":" in k), flush=True)
            bad = {k: v for k, v in errs.items() if not isinstance(v, float) or v > 1e-2}
            if bad:
                print("   ERRORS:", bad, flush=True)
            del kc, vc, k8, v8
            torch.cuda.empty_cache()
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    print("wrote", out.with_suffix(".json"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
