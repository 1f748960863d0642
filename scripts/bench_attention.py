#!/usr/bin/env python3
"""``scripts/bench.py attention`` (or this file): ours beside torch SDPA (flash and cuDNN backends,
and SDPA's own choice) on the same inputs: CUDA events over graph replay and over eager calls,
medians, TFLOP/s.  Outputs are checked against float32 where the reference fits in memory.
Writes ``OUT.json`` (a few KB: small enough for a note to keep whole) and ``OUT.png`` (per shape
TFLOP/s of ours and of each SDPA backend, and best SDPA / ours); ``--out`` defaults to
``$FACTORY_RESULTS/bench_attention`` (else under the system's temporary folder).

Grids (``--grid``): ``default`` (the notes' shapes), ``decode`` (= ``--decode``), ``d256``
(head_dim 256: FA3's published B1 H16 S16384 point and smaller), ``wide`` (head_dim 64/128/256,
seqlen 512-16384, batch x heads 1x8 to 32x32, causal and not, GQA 32/8, varlen), ``targets`` (the
speed targets' bf16 and fp8 tables beside published figures: ``scripts/attention_targets.py``).  A varlen row
packs B sequences of equal length S (cu_seqlens) for ours; the SDPA backends run the same tokens
as a dense (B, S) batch: the same FLOPs."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from factory.benchmark import copy_bandwidth, default_out, time_eager, time_graph, time_interleaved  # noqa: E402  (the GEMM bench's)

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


# head_dim 256 (the sm_90a family's 128x80 tiles): FA3 publishes 756 / 642 TFLOP/s at B1 H16
# S16384 non-causal / causal on an H100 SXM.
D256_SHAPES = [
    (1, 16, 16, 16384, 16384, 256, False),
    (1, 16, 16, 16384, 16384, 256, True),
    (2, 16, 16, 4096, 4096, 256, False),
    (2, 16, 16, 4096, 4096, 256, True),
    (4, 16, 16, 1024, 1024, 256, False),
    (4, 16, 16, 1024, 1024, 256, True),
    (4, 32, 8, 2048, 2048, 256, True),  # GQA 4
    (1, 8, 8, 512, 512, 256, False),
    (1, 8, 8, 2048, 2048, 256, False),  # 128 query tiles: one wave, one tile per CTA
    (8, 16, 16, 2048, 2048, 256, True, "varlen"),  # 8 packed sequences of 2048
]

# The wide grid: head_dim 64/128/256 x seqlen 512-16384 x batch x heads 1x8 .. 32x32, causal and
# not; GQA 32/8; varlen.  (B, H, S) pairs keep one call under ~0.1 s at D256.
WIDE_SHAPES = (
    [(b, h, h, s, s, d, c) for d in (64, 128, 256) for c in (False, True)
     for b, h, s in ((1, 8, 512), (32, 32, 512), (8, 16, 2048), (4, 32, 4096), (1, 16, 16384))]
    + [(4, 32, 8, 2048, 2048, d, True) for d in (64, 128, 256)]
    + [(8, 16, 16, 2048, 2048, d, c, "varlen") for d in (64, 128, 256) for c in (False, True)]
)

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
    cands = bundle.candidates("attention")
    # the unsplit variant: the preferred tile of the best target's single-pass variants
    plain = [e for e in cands if e["dtype"] == dtype and e["head_dim"] == d and not e["varlen"]
             and bool(e["causal"]) == causal and e.get("splits", 1) == 1 and not e.get("decode_rows")]
    best = [e for e in plain if e["target"] == plain[0]["target"]] if plain else []
    out = {"unsplit": next((e for e in best if e.get("preferred")), best[0] if best else None)}
    if out["unsplit"] is None:
        raise SystemExit(f"no single-pass {dtype} D{d} attention variant in the bundle")
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


def time_sustained(calls: dict, seconds: float, rounds: int) -> tuple[dict, dict, dict]:
    """Steady-state timing under the board's power limit: each callable's graph replayed back to
    back for ``seconds`` (the first half brings clock and power to their steady state, the second
    half is timed between two events), the callables in turn, the order reversed every other
    round.  Returns medians over rounds of µs per call and of the SM clock (MHz) and board power
    (W) sampled while the timed half ran (NVML through torch; None where it is missing)."""
    import torch

    from factory.benchmark import capture, one_replay_s

    st = torch.cuda.Stream()
    graphs = {n: capture(fn, 1, st) for n, fn in calls.items()}
    us, mhz, watts = ({n: [] for n in graphs} for _ in range(3))
    order = list(graphs)
    for r in range(rounds):
        for n in (order if r % 2 == 0 else order[::-1]):
            g = graphs[n]
            k = max(2, int(seconds / 2 / one_replay_s(g)))
            for _ in range(k):
                g.replay()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(k):
                g.replay()
            e1.record()
            while not e0.query():
                time.sleep(0.005)
            clk, pw = [], []
            while not e1.query():
                try:
                    clk.append(torch.cuda.clock_rate())
                    pw.append(torch.cuda.power_draw() / 1e3)
                except Exception:  # noqa: BLE001 - no NVML: times only
                    pass
                time.sleep(0.02)
            e1.synchronize()
            us[n].append(e0.elapsed_time(e1) * 1e3 / k)
            mhz[n].append(statistics.median(clk) if clk else None)
            watts[n].append(statistics.median(pw) if pw else None)
    del graphs
    med = lambda v: statistics.median(v) if v and None not in v else None  # noqa: E731
    return ({n: med(v) for n, v in us.items()}, {n: med(v) for n, v in mhz.items()},
            {n: med(v) for n, v in watts.items()})


def bench_candidates(bundle, pattern: str, dtype="bf16", shapes=None, rounds: int = 4,
                     max_reps: int = 20, sustained: float = 0.0) -> list[dict]:
    """Every dense variant of the bundle whose name matches ``pattern`` (a regex) and implements
    the problem, timed by name beside the flash and cuDNN SDPA backends and ``bundle.attention``
    (the loader's choice): one CUDA graph each, replayed in interleaved passes (the order reversed
    every other pass: clock drift falls on all alike; few replays per pass and many passes
    (``max_reps``, ``rounds``) interleave finer), medians.  Each candidate's output is first
    checked (NaN-poisoned o, relative error against float32 where the reference fits).
    ``sustained`` > 0: :func:`time_sustained` for that many seconds per callable and round
    instead (with the SM clock and board power of each)."""
    import math
    import re

    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from factory import testing
    from factory.runtime.attention import dense_workspace

    dt = testing.torch_dtype(dtype)
    rx = re.compile(pattern)
    rows = []
    for shape in (shapes or [s for s in SHAPES if s[3] > 4]):
        B, hq, hkv, sq, sk, d, causal = shape[:7]
        varlen = "varlen" in shape[7:]  # B packed sequences of sq (= sk) tokens: the variants by name take
        q = torch.randn(B, sq, hq, d, device="cuda").to(dt)  # (tokens, H, D) and cu_seqlens
        k = torch.randn(B, sk, hkv, d, device="cuda").to(dt)
        v = torch.randn(B, sk, hkv, d, device="cuda").to(dt)
        ref_o = testing.attention_reference(q, k, v, causal, d ** -0.5)[0] if sq * sk <= 4096 * 4096 else None
        fl = _flops(B, hq, sq, sk, d, causal)
        names = [e["name"] for e in bundle.candidates("attention")
                 if rx.search(e["name"]) and e["dtype"] == dtype and e["head_dim"] == d
                 and bool(e["causal"]) == causal and bool(e["varlen"]) == varlen and e.get("splits", 1) == 1
                 and sq >= e.get("min_seqlen_q", 0)]
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        calls, errs = {}, {}
        if varlen:
            cu = torch.arange(0, (B + 1) * sq, sq, dtype=torch.int32, device="cuda")
            qp, kp, vp = (t.view(B * sq, t.shape[2], d) for t in (q, k, v))
        for n in names:
            o = torch.full_like(q, math.nan)
            if varlen:
                lse = torch.empty(hq, B * sq, device="cuda")
                args = [qp, kp, vp, o.view(B * sq, hq, d), lse,
                        *dense_workspace(torch, bundle.manifest["variants"][n], q), cu, cu, d ** -0.5, sq]
            else:
                lse = torch.empty(B, hq, sq, device="cuda")
                args = [q, k, v, o, lse, *dense_workspace(torch, bundle.manifest["variants"][n], q), d ** -0.5]
            bundle.launch(n, args)
            torch.cuda.synchronize()
            errs[n] = (float("nan") if o.isnan().any() else
                       testing.rel_error(o, ref_o) if ref_o is not None else None)
            calls[n] = lambda _i, n=n, a=args: bundle.launch(n, a)
        if varlen:
            calls["ours"] = lambda _i: bundle.attention(qp, kp, vp, causal=causal, cu_seqlens_q=cu, cu_seqlens_k=cu,
                                                        max_seqlen_q=sq)
        else:
            calls["ours"] = lambda _i: bundle.attention(q, k, v, causal=causal)
        for label, be in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
            def fn(_i, be=be):
                with sdpa_kernel([be]):
                    return torch.nn.functional.scaled_dot_product_attention(
                        qt, kt, vt, is_causal=causal and sq == sk, enable_gqa=hq != hkv)
            calls[label] = fn
        clocks = power = None
        if sustained > 0:
            t, clocks, power = time_sustained(calls, sustained, rounds)
        else:
            t = {n: s * 1e6 for n, s in time_interleaved(calls, 1, rounds=rounds, budget_s=0.1,
                                                           max_reps=max_reps).items()}
        best = min(t["flash"], t["cudnn"])
        row = {"B": B, "Hq": hq, "Hkv": hkv, "Sq": sq, "Sk": sk, "D": d, "causal": causal, "varlen": varlen,
               "dtype": dtype, "flops": fl, "us": t, "rel_err": errs, "chosen": _chosen(bundle, q, k, v, causal, varlen)}
        if clocks is not None:
            row["sm_mhz"], row["board_w"] = clocks, power
        rows.append(row)
        print(f"B{B} H{hq}/{hkv} S{sq}x{sk} D{d} {'causal' if causal else 'full'}{' varlen' if varlen else ''}: "
              f"flash {t['flash']:.1f} "
              f"cudnn {t['cudnn']:.1f} ours {t['ours']:.1f} ({fl / t['ours'] / 1e6:.1f} TF/s, {row['chosen']})",
              flush=True)
        for n in sorted(names, key=lambda n: t[n]):
            extra = f"  {clocks[n]} MHz {power[n]} W" if clocks is not None else ""
            print(f"    {n:58s} {t[n]:9.1f} µs {fl / t[n] / 1e6:6.1f} TF/s  best SDPA / it {best / t[n]:.3f}"
                  f"  err {errs[n]}{extra}", flush=True)
        q = k = v = ref_o = qt = kt = vt = None
        calls = None
        torch.cuda.empty_cache()
    return rows


def bench_attention(bundle, dtype="bf16", shapes=None, copy_bw=None, budget_s=0.4) -> list[dict]:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from factory import testing

    dt = testing.torch_dtype(dtype)
    rows = []
    for shape in sorted(shapes or SHAPES, key=lambda s: s[3] > 4):  # decode first
        B, hq, hkv, sq, sk, d, causal = shape[:7]
        varlen = "varlen" in shape[7:]
        q = torch.randn(B, sq, hq, d, device="cuda").to(dt)
        k = torch.randn(B, sk, hkv, d, device="cuda").to(dt)
        v = torch.randn(B, sk, hkv, d, device="cuda").to(dt)
        if varlen:  # B sequences of sq (= sk) tokens, packed: ours gets (tokens, H, D) and cu_seqlens
            cu = torch.arange(0, (B + 1) * sq, sq, dtype=torch.int32, device="cuda")
            packed = [t.view(B * sq, t.shape[2], d) for t in (q, k, v)]

            def call():
                return bundle.attention(*packed, causal=causal, cu_seqlens_q=cu, cu_seqlens_k=cu,
                                        max_seqlen_q=sq).view(B, sq, hq, d)
        else:
            def call():
                return bundle.attention(q, k, v, causal=causal)
        out = call()
        ref_o, _ = testing.attention_reference(q, k, v, causal, d ** -0.5) if B * hq * sq * sk <= 2 ** 31 else (None, None)
        err = testing.rel_error(out, ref_o) if ref_o is not None else float("nan")
        ref_o = None
        fl = _flops(B, hq, sq, sk, d, causal)

        def ours(_i):
            call()

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
               "varlen": varlen, "rel_err": err, "flops": fl,
               "chosen": _chosen(bundle, q, k, v, causal, varlen)}
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
        for label in ("ours", "flash", "cudnn", "sdpa"):
            if row[f"{label}_us"] is not None:
                row[f"{label}_tflops"] = fl / row[f"{label}_us"] / 1e6
        print(f"B{B} H{hq}/{hkv} S{sq}x{sk} D{d} {'causal' if causal else 'full  '}{' varlen' if varlen else ''}  "
              f"ours {f(row['ours_us'])} "
              f"({fl / row['ours_us'] / 1e6:6.1f} TF/s)  flash {f(row['flash_us'])}  cudnn {f(row['cudnn_us'])}  "
              f"efficient {f(row['efficient_us'])}  sdpa {f(row['sdpa_us'])}  | eager ours {f(row['ours_eager_us'])} sdpa {f(row['sdpa_eager_us'])}  "
              f"ratio {row['ratio_vs_best_sdpa']:.2f}  err {err:.1e}", flush=True)
        for label, t in row.get("variants_us", {}).items():
            print(f"    {label:8s} {t[0]:48s} {f(t[1])} µs" + (f"  err {t[2]:.1e}" if len(t) > 2 and
                                                               isinstance(t[2], float) else
                                                               (f"  {t[2]}" if len(t) > 2 else "")),
                  flush=True)
        print(f"    loader's choice: {row['chosen']}", flush=True)
        q = k = v = out = None  # free before the next shape (the closures hold the names)
        torch.cuda.empty_cache()
    return rows


def _chosen(bundle, q, k, v, causal, varlen=False) -> str:
    from factory.runtime.attention import _choose

    dtype = {"torch.bfloat16": "bf16", "torch.float16": "f16"}[str(q.dtype)]
    b, sq, hq, d = q.shape
    if varlen:
        return _choose(bundle, dtype, d, causal, True)[0]
    return _choose(bundle, dtype, d, causal, False, b * hq * sq, (b, hq, k.shape[2], sq, k.shape[1]))[0]


BACKENDS = (("ours", "tab:red"), ("flash", "tab:blue"), ("cudnn", "tab:green"), ("sdpa", "tab:gray"))


def _label(r: dict) -> str:
    h = f"H{r['Hq']}" if r["Hq"] == r["Hkv"] else f"H{r['Hq']}/{r['Hkv']}"
    s = f"S{r['Sq']}" if r["Sq"] == r["Sk"] else f"S{r['Sq']}x{r['Sk']}"
    return f"B{r['B']} {h} {s} D{r['D']}{' c' if r['causal'] else ''}{' vl' if r.get('varlen') else ''}"


def chart(rows: list[dict], path: Path, title: str) -> str:
    """``path`` (PNG): per shape the TFLOP/s of ours and of each SDPA backend (grouped bars) and
    best SDPA time / ours (dots, right axis).  matplotlib where installed; otherwise the same
    bars without text by factory.benchmark.bar_chart_png.  Returns which one drew it."""
    series = [[r.get(f"{b}_tflops") or 0.0 for r in rows] for b, _ in BACKENDS]
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        from factory.benchmark import bar_chart_png

        bar_chart_png(path, series, [c for _, c in BACKENDS])
        return "bar_chart_png"
    n = len(rows)
    fig, ax = plt.subplots(figsize=(max(8, n * 0.45), 4.6))
    w = 0.8 / len(BACKENDS)
    for j, ((label, color), ys) in enumerate(zip(BACKENDS, series)):
        ax.bar([i + (j - 1.5) * w for i in range(n)], ys, w, color=color, label=label)
    ax.set_ylabel("TFLOP/s")
    ax.set_xticks(list(range(n)), [_label(r) for r in rows], rotation=75, fontsize=6)
    ax2 = ax.twinx()
    ax2.plot(range(n), [r["ratio_vs_best_sdpa"] for r in rows], "k.", ms=6, label="best SDPA time / ours")
    ax2.axhline(1.0, color="k", lw=0.6, ls="--")
    ax2.set_ylabel("best SDPA time / ours")
    ax2.set_ylim(0, max(1.6, max(r["ratio_vs_best_sdpa"] for r in rows) * 1.1))
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize=7, ncol=5, loc="lower center", bbox_to_anchor=(0.5, 1.0))
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return "matplotlib"


# --- attention over a KV cache (bundle.attention_kvcache) ---------------------------------------------
# (B, context, Hq, Hkv, D, page sizes): decode steps (Sq 1).  "mixed": lengths drawn from
# [context/16, context] (the row's context is their maximum); page None: the dense-cache form.
KV_SHAPES = [
    (1, 32768, 32, 8, 128, (16, 64, 1, None)),
    (8, 8192, 32, 8, 128, (16, 64)),               # fp8 vs bf16 at a long context, 64 CTAs of rows
    (4, 32768, 64, 8, 128, (16, 64, None)),        # few long sequences, GQA 8
    (8, 4096, 16, 1, 128, (16, 64, 1, None)),      # MQA 16
    (16, 4096, 32, 8, 128, (16, 64, None)),
    (64, 2048, 32, 8, 128, (16, 64, 1)),
    (256, 512, 32, 8, 128, (16, 64)),
    (32, 1024, 32, 32, 128, (16, 64, None)),       # MHA
    (8, 8192, 64, 8, 64, (16, 64, None)),          # D64 (gpt-oss-like heads)
    (64, 1024, 32, 8, 64, (16, 64)),
    (32, 8192, 32, 8, 128, (16, 64, 1, None), "mixed"),
    (128, 2048, 16, 1, 64, (16, 64), "mixed"),
    (8, 8192, 32, 8, 256, (16,)),                  # head_dim 256 (bf16 paged caches only)
    (1, 32768, 32, 8, 256, (16,)),
]


def bench_kvcache(bundle, dtype="bf16", shapes=None, copy_bw=None, budget_s=0.15) -> list[dict]:
    """Per shape and page size: ours (``attention_kvcache``, graph replay of 3 calls per graph)
    beside the KV-read floor (the K/V rows the lengths cover, plus q and o, over this run's
    copy bandwidth), torch SDPA (each backend and its own choice) on the gathered dense K/V (a
    key-padding mask where lengths differ), and, for equal lengths, our dense path
    (``bundle.attention`` on the same K/V)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from factory import testing

    dt = testing.torch_dtype(dtype)
    rows = []
    # head_dims with a q-dtype x fp8 e4m3 paged decode variant: their paged rows also time the cache as fp8
    fp8 = {e["head_dim"] for e in bundle.candidates("attention_kvcache")
           if e.get("kv_dtype") == "e4m3" and e["dtype"] == dtype and e.get("family") == "sm90_decode"}
    for shape in shapes or KV_SHAPES:
        B, ctx, hq, hkv, d, pages = shape[:6]
        mixed = "mixed" in shape[6:]
        gen = torch.Generator(device="cuda").manual_seed(B * 7 + ctx)
        if mixed:
            lens = torch.randint(ctx // 16, ctx + 1, (B,), generator=gen, device="cuda")
            lens[0] = ctx
        else:
            lens = torch.full((B,), ctx, device="cuda")
        lens = lens.to(torch.int32)
        keys = int(lens.sum())
        q = torch.randn(B, 1, hq, d, device="cuda", generator=gen).to(dt)
        kd = torch.randn(B, ctx, hkv, d, device="cuda", generator=gen).to(dt)
        vd = torch.randn(B, ctx, hkv, d, device="cuda", generator=gen).to(dt)
        floor = (2 * keys * hkv * d + 2 * B * hq * d) * kd.element_size() / copy_bw * 1e6 if copy_bw else None
        base = {"B": B, "ctx": ctx, "Hq": hq, "Hkv": hkv, "D": d, "mixed": mixed, "dtype": dtype,
                "keys": keys, "floor_us": floor}
        # SDPA on the gathered dense K/V (B, H, S, D); a key-padding mask where lengths differ.
        qt, kt, vt = (x.transpose(1, 2) for x in (q, kd, vd))
        mask = None
        if mixed:
            mask = (torch.arange(ctx, device="cuda")[None, :] < lens[:, None].long())[:, None, None, :]
        sdpa_us = {}
        for label, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                               ("efficient", SDPBackend.EFFICIENT_ATTENTION), ("sdpa", None)):
            def fn(_i, backend=backend):
                if backend is None:
                    return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, enable_gqa=hq != hkv)
                with sdpa_kernel([backend]):
                    return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, enable_gqa=hq != hkv)
            try:
                sdpa_us[label] = time_graph(fn, 3, budget_s=budget_s) * 1e6
            except Exception:  # noqa: BLE001 - a backend that refuses the shape is left out
                sdpa_us[label] = None
        best_sdpa = min(x for x in sdpa_us.values() if x is not None)
        dense_us = None
        if not mixed:
            try:
                dense_us = time_graph(lambda _i: bundle.attention(q, kd, vd, causal=True), 3, budget_s=budget_s) * 1e6
            except Exception:  # noqa: BLE001
                dense_us = None
        for ps in pages:
            row = dict(base, page_size=ps, sdpa_us=sdpa_us, best_sdpa_us=best_sdpa, dense_us=dense_us)
            if ps is None:
                kc, vc, bt = kd, vd, None
            else:  # pages dealt out in a shuffled order
                per = -(-ctx // ps)
                perm = torch.randperm(B * per, generator=gen, device="cuda")
                kc = torch.empty(B * per, ps, hkv, d, device="cuda", dtype=dt)
                vc = torch.empty_like(kc)
                pad = per * ps - ctx
                kc[perm] = F.pad(kd, (0, 0, 0, 0, 0, pad)).view(B * per, ps, hkv, d)
                vc[perm] = F.pad(vd, (0, 0, 0, 0, 0, pad)).view(B * per, ps, hkv, d)
                bt = perm.view(B, per).to(torch.int32)
            try:
                out = bundle.attention_kvcache(q, kc, vc, lens, block_table=bt)
                ref, _ = testing.attention_kvcache_reference(q[:4], kc, vc, lens[:4], bt[:4] if bt is not None else None) \
                    if ps is not None else testing.attention_kvcache_reference(q[:4], kc[:4], vc[:4], lens[:4])
                row["rel_err"] = testing.rel_error(out[:4], ref)
                row["variant"] = bundle.plan_kvcache(
                    batch=B, seqlen_q=1, heads_q=hq, heads_kv=hkv, head_dim=d, dtype=dt,
                    **({"max_seqlen_k": ctx} if ps is None else {"page_size": ps, "max_pages": bt.shape[1]})).variant
                row["ours_us"] = time_graph(lambda _i: bundle.attention_kvcache(q, kc, vc, lens, block_table=bt),
                                            3, budget_s=budget_s) * 1e6
                row["ours_eager_us"] = time_eager(lambda _i: bundle.attention_kvcache(q, kc, vc, lens, block_table=bt), 1) * 1e6
                if B * hkv <= 64 and ps in (16, None):  # few groups: every split count, by name
                    row["splits_us"] = {}
                    for e in bundle.candidates("attention_kvcache"):
                        if (e["family"] == "sm90_decode" and e["dtype"] == dtype and e["head_dim"] == d
                                and e.get("kv_dtype", dtype) == dtype
                                and bool(e["paged"]) == (ps is not None) and not e.get("sinks")):
                            # the preferred config by split count, others (a deeper ring) by split and stages
                            key = str(e["kv_splits"]) if e.get("preferred") else f"{e['kv_splits']}_s{e['stages']}"
                            row["splits_us"][key] = time_graph(
                                lambda _i, n=e["name"]: bundle.attention_kvcache(q, kc, vc, lens, block_table=bt,
                                                                                 variant=n), 3,
                                budget_s=budget_s) * 1e6
                    print("    by split count (µs): " + ", ".join(f"{k}: {v:.1f}" for k, v in
                                                             sorted(row["splits_us"].items(),
                                                                    key=lambda kv: (len(kv[0]), kv[0]))), flush=True)
                if ps is not None and fp8 and d in fp8:  # the same pages as fp8 e4m3, per-kv-head descales
                    desc = torch.rand(hkv, device="cuda", generator=gen) + 0.5
                    k8, v8 = (x.to(torch.float8_e4m3fn) for x in (kc, vc))
                    o8 = bundle.attention_kvcache(q, k8, v8, lens, block_table=bt, k_descale=desc, v_descale=desc)
                    ref8, _ = testing.attention_kvcache_reference(q[:4], k8, v8, lens[:4], bt[:4], k_descale=desc,
                                                                  v_descale=desc)
                    row["fp8_rel_err"] = testing.rel_error(o8[:4], ref8)
                    row["fp8_variant"] = bundle.plan_kvcache(
                        batch=B, seqlen_q=1, heads_q=hq, heads_kv=hkv, head_dim=d, dtype=dt,
                        kv_dtype=torch.float8_e4m3fn, page_size=ps, max_pages=bt.shape[1]).variant
                    row["fp8_us"] = time_graph(lambda _i: bundle.attention_kvcache(
                        q, k8, v8, lens, block_table=bt, k_descale=desc, v_descale=desc), 3, budget_s=budget_s) * 1e6
                    row["fp8_eager_us"] = time_eager(lambda _i: bundle.attention_kvcache(
                        q, k8, v8, lens, block_table=bt, k_descale=desc, v_descale=desc), 1) * 1e6
                    if B * hkv <= 128 and ps == 16:  # every fp8 split count, by name
                        row["fp8_splits_us"] = {}
                        for e in bundle.candidates("attention_kvcache"):
                            if (e["family"] == "sm90_decode" and e["dtype"] == dtype and e["head_dim"] == d
                                    and e.get("kv_dtype") == "e4m3" and e["paged"]):
                                row["fp8_splits_us"][str(e["kv_splits"])] = time_graph(
                                    lambda _i, n=e["name"]: bundle.attention_kvcache(
                                        q, k8, v8, lens, block_table=bt, k_descale=desc, v_descale=desc, variant=n),
                                    3, budget_s=budget_s) * 1e6
                        print("    fp8 by split count (µs): " + ", ".join(
                            f"{k}: {v:.1f}" for k, v in sorted(row["fp8_splits_us"].items(), key=lambda kv: int(kv[0]))),
                            flush=True)
                    row["bf16_over_fp8"] = row["ours_us"] / row["fp8_us"]
                    if floor:  # half the K/V bytes
                        row["fp8_floor_over_ours"] = (floor / 2) / row["fp8_us"]
                    print(f"    fp8 e4m3 cache: {row['fp8_us']:.1f} µs ({row['bf16_over_fp8']:.2f}x bf16), "
                          f"err {row['fp8_rel_err']:.1e}", flush=True)
                    k8 = v8 = None
            except Exception as e:  # noqa: BLE001 - reported, not fatal
                row["ours_us"] = row.get("ours_us")
                row["error"] = f"{type(e).__name__}: {str(e)[:120]}"
            if row["ours_us"]:
                row["ratio_vs_best_sdpa"] = best_sdpa / row["ours_us"]
                if floor:
                    row["floor_over_ours"] = floor / row["ours_us"]
                if dense_us:
                    row["dense_over_ours"] = dense_us / row["ours_us"]
            rows.append(row)
            print(f"B{B} ctx{ctx}{' mixed' if mixed else ''} H{hq}/{hkv} D{d} page {ps}: ours "
                  f"{row['ours_us'] or float('nan'):.1f} µs (floor {floor or float('nan'):.1f}, "
                  f"{row.get('floor_over_ours', float('nan')):.0%}), best SDPA {best_sdpa:.1f} "
                  f"({row.get('ratio_vs_best_sdpa', float('nan')):.2f}x), dense path {dense_us or float('nan'):.1f}, "
                  f"err {row.get('rel_err', float('nan')):.1e} {row.get('error', '')}", flush=True)
            kc = vc = None
        q = kd = vd = qt = kt = vt = mask = None
        torch.cuda.empty_cache()
    return rows


def chart_kvcache(rows: list[dict], path: Path, title: str) -> None:
    """``path`` (PNG): per row the share of the KV-read floor ours reaches, and best SDPA / ours."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r.get("ours_us")]
    n = len(rows)
    fig, ax = plt.subplots(figsize=(max(8, n * 0.35), 4.4))
    ax.bar(range(n), [r.get("floor_over_ours", 0) for r in rows], 0.4, color="tab:red", label="floor / ours")
    ax.bar([i + 0.4 for i in range(n)], [r.get("ratio_vs_best_sdpa", 0) for r in rows], 0.4, color="tab:gray",
           label="best SDPA / ours")
    ax.axhline(0.9, color="k", lw=0.6, ls="--")
    ax.axhline(1.0, color="k", lw=0.4)
    ax.set_xticks(list(range(n)), [f"B{r['B']} {r['ctx']}{'m' if r['mixed'] else ''} H{r['Hq']}/{r['Hkv']} "
                                   f"D{r['D']} p{r['page_size'] if r['page_size'] else 'dense'}" for r in rows],
                  rotation=75, fontsize=6)
    ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main_kvcache(a, bundle) -> int:
    import torch

    dev = torch.cuda.get_device_name()
    copy_bw = copy_bandwidth()
    print(f"{dev}: device-to-device copy bandwidth {copy_bw / 1e12:.2f} TB/s (read + write)", flush=True)
    rows = bench_kvcache(bundle, a.dtype, None, copy_bw, min(a.budget, 0.15))
    ok = [r for r in rows if r.get("ours_us")]
    summary = {
        "rows": len(rows), "ran": len(ok),
        "floor90_page16_64": f"{sum(r['floor_over_ours'] >= 0.9 for r in ok if r['page_size'] in (16, 64))}/"
                             f"{sum(1 for r in ok if r['page_size'] in (16, 64))}",
        "floor75_page1": f"{sum(r['floor_over_ours'] >= 0.75 for r in ok if r['page_size'] == 1)}/"
                         f"{sum(1 for r in ok if r['page_size'] == 1)}",
        "geomean_vs_best_sdpa": statistics.geometric_mean([r["ratio_vs_best_sdpa"] for r in ok]) if ok else None,
        "min_dense_over_ours_page16plus": min((r["dense_over_ours"] for r in ok if r.get("dense_over_ours")
                                               and (r["page_size"] or 0) >= 16), default=None),
        # fp8 e4m3 cache vs the bf16 one on the same pages (graph replay): per row, and the rows of
        # contexts >= 8k (the target's "long contexts")
        "bf16_over_fp8": {f"B{r['B']} {r['ctx']}{' mixed' if r['mixed'] else ''} H{r['Hq']}/{r['Hkv']} D{r['D']} "
                          f"p{r['page_size']}": round(r["bf16_over_fp8"], 3) for r in ok if r.get("bf16_over_fp8")},
        "bf16_over_fp8_ctx8k_plus_min": min((r["bf16_over_fp8"] for r in ok if r.get("bf16_over_fp8")
                                             and r["ctx"] >= 8192), default=None),
    }
    print(json.dumps(summary), flush=True)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    Path(str(out) + ".json").write_text(json.dumps({
        "device": dev, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"), "grid": "kvcache",
        "copy_bandwidth": copy_bw, "summary": summary, "rows": rows}, indent=1))
    try:
        chart_kvcache(rows, Path(str(out) + ".png"), f"attention_kvcache decode {a.dtype} on {dev}")
    except ImportError:
        pass
    print(f"wrote {out}.json", flush=True)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--bundle", default="artifacts/default")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "f16"])
    p.add_argument("--out", default=default_out("bench_attention"),
                   help="path stem of the output, OUT.json (default: %(default)s)")
    p.add_argument("--decode", action="store_true", help="the decode grid (batch 1-256, context 512-32k) "
                   "with the KV-read floor of this run's copy bandwidth (= --grid decode)")
    p.add_argument("--grid", default="default", choices=["default", "decode", "d256", "wide", "kvcache", "targets"],
                   help="kvcache: attention_kvcache decode over paged and dense caches beside the KV-read floor, "
                        "SDPA on the gathered K/V and our dense path; targets: the speed targets' bf16 and fp8 "
                        "tables beside every SDPA backend and published figures (scripts/attention_targets.py)")
    p.add_argument("--tables", nargs="+", default=["bf16", "fp8"], choices=["bf16", "fp8"],
                   help="--grid targets: which tables")
    p.add_argument("--wide", action="store_true", help="--grid targets: also the wide grid's summary (geomean of "
                   "best SDPA / ours, rows under 1.0)")
    p.add_argument("--from-json", nargs="+", metavar="RAW", help="--grid targets: no GPU; draw OUT.png from "
                   "these runs' JSON (the first) and write --summary")
    p.add_argument("--summary", metavar="PATH", help="--grid targets --from-json: the compact summary of the runs")
    p.add_argument("--candidates", metavar="REGEX", help="instead: time every variant whose name matches "
                   "REGEX by name, interleaved with the SDPA backends (the prefill shapes of --grid: default, d256 "
                   "or wide; varlen rows take the varlen variants)")
    p.add_argument("--rounds", type=int, default=4, help="--candidates: interleaved passes")
    p.add_argument("--max-reps", type=int, default=20, help="--candidates: replays per pass at most")
    p.add_argument("--shapes", help="--candidates: only the shapes whose 'B,Hq,Hkv,Sq,Sk,D,causal[,varlen]' "
                   "string (causal 0/1) matches this regex")
    p.add_argument("--sustained", type=float, default=0.0, metavar="S",
                   help="--candidates: steady-state timing instead, each callable S seconds per round back to "
                        "back (the second half timed), with the SM clock and board power")
    p.add_argument("--budget", type=float, default=0.4, help="GPU seconds per timed graph (default: %(default)s)")
    a = p.parse_args(argv)
    if a.grid == "targets":
        import attention_targets

        return attention_targets.main(a, wide_rows=lambda bundle, dtype, budget: bench_attention(
            bundle, dtype, WIDE_SHAPES, None, budget))
    import torch

    from factory.runtime import Bundle

    torch.manual_seed(int(time.time()))
    bundle = Bundle.open(a.bundle)
    dev = torch.cuda.get_device_name()
    if a.grid == "kvcache":
        return main_kvcache(a, bundle)
    if a.candidates:
        import re

        base = {"d256": D256_SHAPES, "wide": WIDE_SHAPES}.get(a.grid, SHAPES)
        shapes = [s for s in base if s[3] > 4 and (not a.shapes or re.search(
            a.shapes, ",".join(str(int(x)) for x in s[:7]) + "".join("," + x for x in s[7:])))]
        rows = bench_candidates(bundle, a.candidates, a.dtype, shapes, a.rounds, a.max_reps, a.sustained)
        out = Path(a.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        Path(str(out) + ".json").write_text(json.dumps({
            "device": dev, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
            "candidates": a.candidates, "rows": rows}, indent=1))
        return 0
    print(f"device {dev}, torch {torch.__version__}; µs: graph-replay medians (eager medians after |)", flush=True)
    a.decode = a.decode or a.grid == "decode"
    copy_bw = copy_bandwidth() if a.decode else None
    if copy_bw:
        print(f"device-to-device copy bandwidth {copy_bw / 1e12:.2f} TB/s (read + write)", flush=True)
    tuned = bundle.tuning
    selection = "tuning.json" if tuned is not None else f"rule ({bundle._tuning[1]})"
    print(f"selection: {selection}", flush=True)
    grid = "decode" if a.decode else a.grid
    shapes = {"default": None, "decode": DECODE_SHAPES, "d256": D256_SHAPES, "wide": WIDE_SHAPES}[grid]
    rows = bench_attention(bundle, a.dtype, shapes, copy_bw, a.budget)
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
        "device": dev, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"), "grid": grid,
        "selection": selection, "copy_bandwidth": copy_bw, "geomean_ratio_vs_best_sdpa": geo, "rows": rows},
        indent=1))
    drawn = chart(rows, Path(str(out) + ".png"),
                  f"attention {a.dtype}, {grid} grid, on {dev} ({selection[:40]}): geomean best SDPA / ours {geo:.3f}")
    print(f"wrote {out}.json and {out}.png ({drawn})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
