#!/usr/bin/env python3
"""``scripts/bench.py attention`` (or this file): ours beside torch SDPA (flash and cuDNN backends,
and SDPA's own choice) on the same inputs: CUDA events over graph replay and over eager calls,
medians, TFLOP/s.  Outputs are checked against float32 where the reference fits in memory.
Writes ``OUT.json`` (a few KB: small enough for a note to keep whole); ``--out`` defaults to
``$FACTORY_RESULTS/bench_attention`` (else under the system's temporary folder)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from factory.benchmark import copy_bandwidth, default_out, time_eager, time_graph  # noqa: E402  (the GEMM bench's)

# (B, Hq, Hkv, Sq, Sk, D, causal)
SHAPES = [
    (1, 8, 8, 512, 512, 64, False),
    (1, 8, 8, 512, 512, 64, True),
    (4, 16, 16, 1024, 1024, 64, False),
    (4, 16, 16, 1024, 1024, 64, True),
    (2, 16, 16, 4096, 4096, 128, False),
    (2, 16, 16, 4096, 4096, 128, True),
    (1, 16, 16, 16384, 16384, 128, False),
    (1, 16, 16, 16384, 16384, 128, True),
    (4, 32, 8, 2048, 2048, 128, True),  # GQA 4 prefill
    (8, 32, 8, 1, 4096, 128, True),  # GQA decode step
    (1, 32, 8, 1, 16384, 128, True),  # one long-context decode step (8 kv heads: 32 CTAs unsplit)
    (8, 32, 32, 1, 4096, 128, True),  # MHA decode (256 CTAs unsplit: no split by the rule)
    (4, 32, 8, 4, 8192, 128, True),  # speculative decode, 4 query rows
]


# Decode steps (seqlen_q = 1, causal: bottom-right, so every key is visible): batch 1-256, context
# 512-32k, GQA 32/8 and MHA, D128 (+ D64 and fp16 spot checks); batch x context <= 1M tokens.
DECODE_SHAPES = (
    [(b, 32, 8, 1, sk, 128, True) for b, sks in ((1, (512, 4096, 32768)), (16, (512, 4096, 32768)),
                                                   (64, (512, 2048, 8192)), (256, (512, 2048, 4096)))
     for sk in sks]
    + [(b, 32, 32, 1, sk, 128, True) for b, sk in ((1, 4096), (16, 4096), (64, 2048), (256, 512))]
    + [(16, 32, 8, 1, 4096, 64, True), (64, 16, 2, 1, 2048, 128, True)]
    # speculative decoding: 4 and 16 queries (bottom-right causal; SDPA runs them unmasked)
    + [(4, 32, 8, 4, 8192, 128, True), (16, 32, 8, 4, 4096, 128, True), (64, 32, 8, 4, 2048, 128, True),
       (4, 32, 8, 16, 4096, 128, True), (1, 32, 8, 16, 16384, 128, True), (16, 32, 32, 4, 4096, 128, True)]
)


def kv_bytes(B, hq, hkv, sq, sk, d, elem=2) -> int:
    """Bytes a decode step must move at least: K and V once, q read and o written."""
    return (2 * B * sk * hkv * d + 2 * B * sq * hq * d) * elem


def _decode_variants(bundle, B, hq, hkv, sq, sk, d, causal, dtype) -> dict[str, dict]:
    """For decode shapes (Sq <= 16): the unsplit variant the loader used before split-KV, every
    split-KV / packed-GQA variant that applies, and the decode family's preferred variants
    (``dec<splits>``, ``c``: merged in a cluster, ``p``: PDL), to time side by side by name."""
    from factory.runtime.attention import select

    cands = bundle.candidates("attention")
    out = {"unsplit": select(cands, dtype=dtype, head_dim=d, causal=causal, varlen=False,
                             rows=B * hq * sq)}
    top = out["unsplit"]["target"]
    for e in cands:
        if e["dtype"] != dtype or e["head_dim"] != d or e["varlen"]:
            continue
        if e.get("decode_rows"):
            if e.get("preferred") and e["causal"] and (causal or sq == 1):
                out[f"dec{e['kv_splits']}{'c' if e['cluster'][0] > 1 else ''}{'p' if e.get('pdl') else ''}"] = e
        elif e["target"] == top and e.get("splits", 1) > 1:
            if e.get("pack_gqa") and sq == 1 and hq > hkv:
                out[f"pack{e['splits']}"] = e
            elif not e.get("pack_gqa") and e["causal"] == causal:
                out[f"split{e['splits']}"] = e
    return out


def _flops(b, hq, sq, sk, d, causal) -> float:
    pairs = sq * sk
    if causal:  # bottom-right: query i sees i + sk - sq + 1 keys
        pairs = sum(min(sk, max(0, i + sk - sq + 1)) for i in range(sq)) if sq < 4096 else sq * sk - sq * (sq - 1) / 2
    return 4.0 * b * hq * pairs * d


def bench_attention(bundle, dtype="bf16", shapes=None, copy_bw=None, budget_s=0.4) -> list[dict]:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from factory import testing

    dt = testing.torch_dtype(dtype)
    rows = []
    for B, hq, hkv, sq, sk, d, causal in sorted(shapes or SHAPES, key=lambda s: s[3] > 4):  # decode first
        q = torch.randn(B, sq, hq, d, device="cuda").to(dt)
        k = torch.randn(B, sk, hkv, d, device="cuda").to(dt)
        v = torch.randn(B, sk, hkv, d, device="cuda").to(dt)
        out = bundle.attention(q, k, v, causal=causal)
        ref_o, _ = testing.attention_reference(q, k, v, causal, d ** -0.5) if sq * sk <= 4096 * 4096 else (None, None)
        err = testing.rel_error(out, ref_o) if ref_o is not None else float("nan")
        fl = _flops(B, hq, sq, sk, d, causal)

        def ours(_i):
            bundle.attention(q, k, v, causal=causal)

        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        # SDPA's causal mask is top-left aligned: it equals ours only when sq == sk; decode (sq=1)
        # needs no mask at all under bottom-right alignment.
        sdpa_causal = causal and sq == sk

        def sdpa(backend):
            def fn(_i):
                if backend is None:
                    return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=sdpa_causal, enable_gqa=hq != hkv)
                with sdpa_kernel([backend]):
                    return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=sdpa_causal, enable_gqa=hq != hkv)
            return fn

        row = {"B": B, "Hq": hq, "Hkv": hkv, "Sq": sq, "Sk": sk, "D": d, "causal": causal, "dtype": dtype,
               "rel_err": err, "flops": fl}
        for label, fn in (("ours", ours), ("flash", sdpa(SDPBackend.FLASH_ATTENTION)),
                          ("cudnn", sdpa(SDPBackend.CUDNN_ATTENTION)),
                          ("efficient", sdpa(SDPBackend.EFFICIENT_ATTENTION)), ("sdpa", sdpa(None))):
            try:
                row[f"{label}_us"] = time_graph(fn, 5, budget_s=budget_s) * 1e6  # 5 calls per graph: launch gaps amortised
                row[f"{label}_eager_us"] = time_eager(fn, 1) * 1e6
            except Exception as e:  # noqa: BLE001 - a backend that refuses a shape is reported, not fatal
                row[f"{label}_us"] = row[f"{label}_eager_us"] = None
                row[f"{label}_error"] = f"{type(e).__name__}: {str(e)[:80]}"
        if sq <= 16:
            from factory.runtime.attention import split_workspace

            row["variants_us"] = {}
            for label, e in _decode_variants(bundle, B, hq, hkv, sq, sk, d, causal, dtype).items():
                o_, l_ = torch.empty_like(q), torch.empty(B, hq, sq, device="cuda")
                ws = split_workspace(torch, q, e["splits"]) if e.get("splits", 1) > 1 else []
                args = [q, k, v, o_, l_, *ws, d ** -0.5]
                try:
                    row["variants_us"][label] = (e["name"], time_graph(
                        lambda _i, n=e["name"], a=args: bundle.launch(n, a), 5, budget_s=budget_s) * 1e6)
                    if ref_o is not None:
                        row["variants_us"][label] += (testing.rel_error(o_, ref_o),)
                except Exception as ex:  # noqa: BLE001 - reported, not fatal
                    row["variants_us"][label] = (e["name"], None, f"{type(ex).__name__}: {str(ex)[:80]}")
            row["chosen"] = _chosen(bundle, q, k, v, causal)
        best = min(x for x in (row["flash_us"], row["cudnn_us"], row["efficient_us"], row["sdpa_us"]) if x is not None)
        row["ratio_vs_best_sdpa"] = best / row["ours_us"]
        if copy_bw and sq <= 16:  # decode: the KV-read floor of this run's copy bandwidth
            row["floor_us"] = kv_bytes(B, hq, hkv, sq, sk, d) / copy_bw * 1e6
            row["floor_over_ours"] = row["floor_us"] / row["ours_us"]
            row["floor_over_best_sdpa"] = row["floor_us"] / best
            print(f"    KV floor {row['floor_us']:.1f} µs: ours at {row['floor_over_ours']:.0%} of it, "
                  f"best SDPA at {row['floor_over_best_sdpa']:.0%}", flush=True)
        rows.append(row)
        f = lambda x: "-" if x is None else f"{x:8.1f}"  # noqa: E731
        print(f"B{B} H{hq}/{hkv} S{sq}x{sk} D{d} {'causal' if causal else 'full  '}  ours {f(row['ours_us'])} "
              f"({fl / row['ours_us'] / 1e6:6.1f} TF/s)  flash {f(row['flash_us'])}  cudnn {f(row['cudnn_us'])}  "
              f"efficient {f(row['efficient_us'])}  sdpa {f(row['sdpa_us'])}  | eager ours {f(row['ours_eager_us'])} sdpa {f(row['sdpa_eager_us'])}  "
              f"ratio {row['ratio_vs_best_sdpa']:.2f}  err {err:.1e}", flush=True)
        for label, t in row.get("variants_us", {}).items():
            print(f"    {label:8s} {t[0]:48s} {f(t[1])} µs" + (f"  err {t[2]:.1e}" if len(t) > 2 and
                                                               isinstance(t[2], float) else
                                                               (f"  {t[2]}" if len(t) > 2 else "")),
                  flush=True)
        if "chosen" in row:
            print(f"    loader's choice: {row['chosen']}", flush=True)
        q = k = v = out = None  # free before the next shape (the closures hold the names)
        torch.cuda.empty_cache()
    return rows


def _chosen(bundle, q, k, v, causal) -> str:
    from factory.runtime.attention import _choose

    dtype = {"torch.bfloat16": "bf16", "torch.float16": "f16"}[str(q.dtype)]
    b, sq, hq, d = q.shape
    return _choose(bundle, dtype, d, causal, False, b * hq * sq, (b, hq, k.shape[2], sq, k.shape[1]))[0]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--bundle", default="artifacts/default")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "f16"])
    p.add_argument("--out", default=default_out("bench_attention"),
                   help="path stem of the output, OUT.json (default: %(default)s)")
    p.add_argument("--decode", action="store_true", help="the decode grid (batch 1-256, context 512-32k) "
                   "with the KV-read floor of this run's copy bandwidth")
    p.add_argument("--budget", type=float, default=0.4, help="GPU seconds per timed graph (default: %(default)s)")
    a = p.parse_args(argv)
    import torch

    from factory.runtime import Bundle

    torch.manual_seed(int(time.time()))
    bundle = Bundle.open(a.bundle)
    dev = torch.cuda.get_device_name()
    print(f"device {dev}, torch {torch.__version__}; µs: graph-replay medians (eager medians after |)", flush=True)
    copy_bw = copy_bandwidth() if a.decode else None
    if copy_bw:
        print(f"device-to-device copy bandwidth {copy_bw / 1e12:.2f} TB/s (read + write)", flush=True)
    rows = bench_attention(bundle, a.dtype, DECODE_SHAPES if a.decode else None, copy_bw, a.budget)
    geo = statistics.geometric_mean([r["ratio_vs_best_sdpa"] for r in rows])
    print(f"geomean (best SDPA backend time / ours): {geo:.3f} over {len(rows)} shapes")
    if copy_bw:
        one = [r for r in rows if r["Sq"] == 1]
        print(f"seqlen_q 1 ({len(one)} shapes): geomean {statistics.geometric_mean([r['ratio_vs_best_sdpa'] for r in one]):.3f}, "
              f"ours >= 90% of the KV floor on {sum(r['floor_over_ours'] >= 0.9 for r in one)}/{len(one)}, "
              f"not slower than SDPA on {sum(r['ratio_vs_best_sdpa'] >= 1.0 for r in one)}/{len(one)}, "
              f"within 2 % on {sum(r['ratio_vs_best_sdpa'] >= 0.98 for r in one)}/{len(one)}")
        print(f"decode: ours >= 90% of the KV floor on {sum(r['floor_over_ours'] >= 0.9 for r in rows)}/{len(rows)}, "
              f"not slower than SDPA on {sum(r['ratio_vs_best_sdpa'] >= 1.0 for r in rows)}/{len(rows)}; lowest "
              f"floor share {min(r['floor_over_ours'] for r in rows):.0%}, lowest ratio "
              f"{min(r['ratio_vs_best_sdpa'] for r in rows):.2f}")
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    Path(str(out) + ".json").write_text(json.dumps({
        "device": dev, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
        "copy_bandwidth": copy_bw, "geomean_ratio_vs_best_sdpa": geo, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
