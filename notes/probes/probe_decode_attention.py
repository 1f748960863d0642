#!/usr/bin/env python3
"""Probe: the decode-attention family (factory/attention/decode.py) on the GPU present, before its
selection rule exists: (1) every decode variant of the bundle against float32 (GQA, MHA, MQA,
ragged contexts incl. 1, Sq 1..16, rows with no key, a KV cache with NaN rows past the context,
NaN-poisoned o/lse/workspace), (2) each variant timed by name beside every SDPA backend and the
loader's current choice over the decode grid and a few Sq 4/16 rows, with the KV floor of this
run's copy bandwidth.  Answers "which split count / tile / merge for which (batch, heads,
context)", from which runtime/attention.py's decode rule was written.

Answer (H100 SXM, torch 2.11.0+cu130, 2026-11-25, branch attn-decode runs 1-3;
notes/attention-decode.md, notes/results/decode-attention-family-2026-11-25.json): every variant
correct (47 on 11 shapes, 0 failures); the best split gives ~64 CTAs for 8-32 kv-head groups,
~128 for 64 groups, none from ~100 groups; 32 splits (combine kernel) only where K/V sit in L2;
16-CTA clusters 2x slower than 8; PDL -0.6 to -0.9 µs on grids leaving half the SMs idle, up to
+18 % on ~128-CTA grids; 64-key tiles in a 3-stage ring (two CTAs per SM) best overall.

  python3 notes/probes/probe_decode_attention.py BUNDLE OUT.json [--quick]"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from factory import testing  # noqa: E402
from factory.benchmark import copy_bandwidth, time_graph  # noqa: E402

CHECKS = [  # (B, Hq, Hkv, Sq, Sk, causal)
    (2, 32, 8, 1, 1, True), (2, 32, 8, 1, 777, False), (3, 32, 8, 1, 4109, True),
    (2, 32, 32, 1, 300, True), (1, 8, 1, 1, 2000, True), (2, 32, 8, 4, 999, True),
    (1, 32, 8, 16, 513, True), (2, 16, 16, 16, 100, True), (1, 32, 8, 3, 2, True),
    (2, 8, 2, 5, 65, True), (1, 64, 8, 2, 1500, True),
]


def decode_entries(bundle):
    return [e for e in bundle.candidates("attention") if e.get("decode_rows")]


def run_variant(bundle, e, q, k, v, scale, poison=True):
    import torch

    from factory.runtime.attention import split_workspace

    o = torch.full_like(q, float("nan")) if poison else torch.empty_like(q)
    lse = torch.full((q.shape[0], q.shape[2], q.shape[1]), float("nan"), device=q.device)
    ws = []
    if e.get("splits", 1) > 1:
        ws = list(split_workspace(torch, q, e["splits"]))
        if poison:
            for w in ws:
                w.fill_(float("nan"))
    bundle.launch(e["name"], [q, k, v, o, lse, *ws, scale])
    return o, lse


def check(bundle, out: dict) -> int:
    import torch

    fails = 0
    rows = []
    for e in decode_entries(bundle):
        dt = testing.torch_dtype(e["dtype"])
        d = e["head_dim"]
        worst, worst_lse = 0.0, 0.0
        for B, hq, hkv, sq, sk, causal in CHECKS:
            if not e["causal"] and sq > 1:
                continue
            torch.manual_seed(hash((B, hq, sq, sk)) % 1000)
            q = torch.randn(B, sq, hq, d, device="cuda").to(dt)
            # A KV cache of 64 more rows than the context, NaN past it: never read.
            kc = torch.full((B, sk + 64, hkv, d), float("nan"), device="cuda").to(dt)
            vc = torch.full((B, sk + 64, hkv, d), float("nan"), device="cuda").to(dt)
            kc[:, :sk] = torch.randn(B, sk, hkv, d, device="cuda").to(dt)
            vc[:, :sk] = torch.randn(B, sk, hkv, d, device="cuda").to(dt)
            k, v = kc[:, :sk], vc[:, :sk]
            scale = d ** -0.5
            try:
                o, lse = run_variant(bundle, e, q, k, v, scale)
                torch.cuda.synchronize()
            except Exception as ex:  # noqa: BLE001 - a launch that fails is a failure, reported
                fails += 1
                print(f"FAIL {e['name']} B{B} H{hq}/{hkv} Sq{sq} Sk{sk}: {type(ex).__name__}: {ex}", flush=True)
                if "CUDA" in str(ex) or "cuda" in str(ex):
                    raise
                continue
            ref_o, ref_l = testing.attention_reference(q, k, v, causal or sq == 1, scale)
            err = testing.rel_error(o, ref_o) if ref_o.abs().sum() > 0 else float(o.float().abs().max())
            fin = torch.isfinite(ref_l)
            lerr = float((lse[fin] - ref_l[fin]).abs().max()) if fin.any() else 0.0
            bad = (not math.isfinite(err) or err > (2e-2 if e["dtype"] == "bf16" else 4e-3)
                   or not math.isfinite(lerr) or lerr > 1e-3
                   or not torch.equal(torch.isinf(lse[~fin]), torch.ones_like(lse[~fin], dtype=torch.bool))
                   or bool(torch.isnan(o).any()))
            if bad:
                fails += 1
                print(f"FAIL {e['name']} B{B} H{hq}/{hkv} Sq{sq} Sk{sk}: err {err:.2e} lse {lerr:.2e}", flush=True)
            worst, worst_lse = max(worst, err if math.isfinite(err) else 9.0), max(worst_lse, lerr if math.isfinite(lerr) else 9.0)
        rows.append((e["name"], worst, worst_lse))
        print(f"check {e['name']:52s} max rel err {worst:.2e}  lse {worst_lse:.2e}", flush=True)
    out["checks"] = rows
    out["check_failures"] = fails
    return fails


GRID = (
    [(b, 32, 8, 1, sk) for b, sks in ((1, (512, 4096, 32768)), (16, (512, 4096, 32768)),
                                      (64, (512, 2048, 8192)), (256, (512, 2048, 4096))) for sk in sks]
    + [(b, 32, 32, 1, sk) for b, sk in ((1, 4096), (16, 4096), (64, 2048), (256, 512))]
    + [(16, 32, 8, 1, 4096, 64), (64, 16, 2, 1, 2048)]
    + [(1, 32, 8, 1, 1024), (4, 32, 8, 1, 2048), (8, 32, 8, 1, 4096), (32, 32, 8, 1, 1024),
       (2, 32, 32, 1, 1024), (4, 32, 32, 1, 8192)]
    + [(4, 32, 8, 4, 8192), (16, 32, 8, 4, 4096), (4, 32, 8, 16, 4096), (64, 32, 8, 4, 2048),
       (1, 32, 8, 16, 16384), (16, 32, 32, 4, 4096)]
)


# Second pass: the 8-64 kv-head-group range where the split count changes, D64, Sq 2-16.
GRID2 = (
    [(b, 32, 8, 1, sk) for b in (2, 4, 8, 32) for sk in (1024, 4096, 16384)]
    + [(1, 32, 8, 1, 1024), (1, 32, 8, 1, 2048), (1, 32, 8, 1, 8192), (1, 32, 8, 1, 16384)]
    + [(2, 32, 32, 1, 1024), (2, 32, 32, 1, 8192), (4, 32, 32, 1, 1024), (4, 32, 32, 1, 8192)]
    + [(16, 32, 8, 1, 4096, 64), (1, 32, 8, 1, 16384, 64), (64, 16, 2, 1, 2048), (8, 16, 2, 1, 8192)]
    + [(4, 32, 8, 4, 8192), (16, 32, 8, 4, 4096), (64, 32, 8, 4, 2048), (1, 32, 8, 4, 16384),
       (4, 32, 8, 16, 4096), (1, 32, 8, 16, 16384), (8, 32, 8, 8, 4096), (16, 32, 32, 4, 4096),
       (2, 32, 32, 16, 4096)]
)


def sweep(bundle, out: dict, quick: bool, grid=GRID, configs=None) -> None:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    bw = copy_bandwidth()
    out["copy_bandwidth"] = bw
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s", flush=True)
    rows = []
    for shape in grid:
        B, hq, hkv, sq, sk = shape[:5]
        d = shape[5] if len(shape) > 5 else 128
        q = torch.randn(B, sq, hq, d, device="cuda").to(torch.bfloat16)
        k = torch.randn(B, sk, hkv, d, device="cuda").to(torch.bfloat16)
        v = torch.randn(B, sk, hkv, d, device="cuda").to(torch.bfloat16)
        scale = d ** -0.5
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        row = {"shape": [B, hq, hkv, sq, sk, d]}
        kvb = (2 * B * sk * hkv * d + 2 * B * sq * hq * d) * 2
        row["floor_us"] = kvb / bw * 1e6

        def t(fn):
            try:
                return time_graph(fn, 5, replays=12) * 1e6
            except Exception as ex:  # noqa: BLE001
                return f"{type(ex).__name__}: {str(ex)[:60]}"

        for label, be in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                          ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
            def f(_i, be=be):
                with sdpa_kernel([be]):
                    torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, enable_gqa=hq != hkv)
            row[label] = t(f)
        row["today"] = t(lambda _i: bundle.attention(q, k, v, causal=True))
        var = {}
        for e in decode_entries(bundle):
            if e["dtype"] != "bf16" or e["head_dim"] != d:
                continue
            if quick and e["kv_splits"] not in (1, 4, 16):
                continue
            if configs and not any(f"_{c}_" in e["name"] for c in configs):
                continue
            if e["kv_splits"] > 1 and -(-sk // e["tile"][1]) < e["kv_splits"]:
                continue
            from factory.runtime.attention import split_workspace
            o = torch.empty_like(q)
            lse = torch.empty(B, hq, sq, device="cuda")
            ws = list(split_workspace(torch, q, e["splits"])) if e.get("splits", 1) > 1 else []
            args = [q, k, v, o, lse, *ws, scale]
            var[e["name"]] = t(lambda _i, n=e["name"], a=args: bundle.launch(n, a))
        row["variants"] = var
        sd = [x for x in (row["flash"], row["cudnn"], row["efficient"]) if isinstance(x, float)]
        best_sdpa = min(sd)
        ok = {n: x for n, x in var.items() if isinstance(x, float)}
        best = min(ok, key=ok.get) if ok else None
        row["best_variant"] = best
        r1 = lambda x: x[:40] if isinstance(x, str) else round(x, 1)  # noqa: E731
        print(f"B{B} H{hq}/{hkv} Sq{sq} Sk{sk} D{d}: floor {row['floor_us']:.1f}  sdpa {best_sdpa:.1f} "
              f"(flash {r1(row['flash'])}, cudnn {r1(row['cudnn'])}, efficient {r1(row['efficient'])})  "
              f"today {r1(row['today'])}  best {best} {ok.get(best, float('nan')):.1f}", flush=True)
        for n, x in sorted(ok.items(), key=lambda kv: kv[1])[:6]:
            print(f"    {x:8.1f}  {n}", flush=True)
        rows.append(row)
        out["sweep"] = rows
        if out.get("_path"):
            Path(out["_path"]).write_text(json.dumps(out))
        q = k = v = qt = kt = vt = None
        torch.cuda.empty_cache()
    out["sweep"] = rows


PROFILE = [(16, 32, 8, 1, 512), (1, 32, 8, 1, 4096), (64, 32, 8, 1, 512)]


def profile(bundle, names: list[str]) -> None:
    """Under ``ncu --profile-from-start off``: per shape, one call of the loader's choice, of each
    SDPA backend and of the named decode variants, after an unprofiled warm-up."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from factory.runtime.attention import split_workspace

    ents = {e["name"]: e for e in decode_entries(bundle)}
    for B, hq, hkv, sq, sk in PROFILE:
        q = torch.randn(B, sq, hq, 128, device="cuda").to(torch.bfloat16)
        k = torch.randn(B, sk, hkv, 128, device="cuda").to(torch.bfloat16)
        v = torch.randn(B, sk, hkv, 128, device="cuda").to(torch.bfloat16)
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        calls = [lambda: bundle.attention(q, k, v, causal=True)]
        for be in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION):
            calls.append(lambda be=be: _sdpa(torch, sdpa_kernel, be, qt, kt, vt, hq != hkv))
        for n in names:
            e = ents[n]
            o, lse = torch.empty_like(q), torch.empty(B, hq, sq, device="cuda")
            ws = list(split_workspace(torch, q, e["splits"])) if e.get("splits", 1) > 1 else []
            calls.append(lambda n=n, a=[q, k, v, o, lse, *ws, 128 ** -0.5]: bundle.launch(n, a))
        for c in calls:
            c()
            c()
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        for c in calls:
            c()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()


def _sdpa(torch, sdpa_kernel, be, qt, kt, vt, gqa):
    with sdpa_kernel([be]):
        return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, enable_gqa=gqa)


def main() -> int:
    import torch

    from factory.runtime import Bundle

    bundle = Bundle.open(sys.argv[1])
    if "--profile" in sys.argv:
        profile(bundle, [a for a in sys.argv[3:] if not a.startswith("--")])
        return 0
    quick = "--quick" in sys.argv
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
           "_path": sys.argv[2]}
    fails = check(bundle, out) if "--no-check" not in sys.argv else 0
    Path(sys.argv[2]).write_text(json.dumps(out))
    if "--check-only" not in sys.argv:
        cfg = next((a.split("=", 1)[1].split(",") for a in sys.argv if a.startswith("--configs=")), None)
        sweep(bundle, out, quick, GRID2 if "--grid2" in sys.argv else GRID, cfg)
    Path(sys.argv[2]).write_text(json.dumps(out))
    print(f"check failures: {fails}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
