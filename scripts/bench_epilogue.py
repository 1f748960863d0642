#!/usr/bin/env python3
"""Fused GEMM epilogues beside what they replace, on a Llama-3-8B layer's projections, same run:

- ``residual`` (o_proj: M x 4096 x 4096, down_proj: M x 4096 x 14336): ``bundle.gemm(x, w,
  residual=h)`` vs ``bundle.gemm(x, w)`` then ``torch.add(y, h)``, and vs cuBLAS (``x @ w.T``) then
  the same add; and the in-place form ``bundle.gemm(x, w, h, residual=h)`` vs ``h += x @ w.T`` by
  our plain GEMM.
- ``silu_mul`` (gate_up: M x 28672 x 4096 -> M x 14336): ``bundle.gemm(x, pack_gate_up(w),
  activation="silu_mul")`` vs ``bundle.gemm(x, w)`` then torch's silu_and_mul
  (``F.silu(y[:, :I]) * y[:, I:]``), and vs cuBLAS then the same.
- ``silu_mul`` + ``fp8_groups`` (the same gate_up, its output e4m3 with a scale per row and 128
  columns, the down projection's block-scaled input): ``bundle.gemm(x, pack_gate_up(w),
  activation="silu_mul", out_dtype=torch.float8_e4m3fn)`` vs the bf16 silu_mul epilogue then
  torch's per-group quantisation (``ours+torch``), and vs cuBLAS + silu_and_mul + the same
  quantisation.
- ``silu_mul`` + e4m3 with one scale per row (``row_scales=True``: the group epilogue, then
  ``fp8_rows`` in place; torch._scaled_mm's row-wise ``scale_a``): vs the bf16 silu_mul epilogue
  then torch's row-wise quantisation, and vs cuBLAS + silu_and_mul + the same quantisation.

Timing as scripts/bench.py: CUDA-graph replays of one call per input set (enough fresh random
sets to exceed twice the L2), all sides of a row interleaved in alternating passes
(factory.benchmark.time_interleaved), medians; also eager calls of the fused and unfused forms.
Outputs are NaN-poisoned before timing and every side's values are checked against a float32
reference afterwards.  Writes ``OUT.json`` (every row) and ``OUT.summary.json`` (per row: µs of
each side and fused / unfused speed-up); ``--out`` defaults to ``$FACTORY_RESULTS/bench_epilogue``
(outside the tree).

    python3 scripts/bench_epilogue.py --bundle BUNDLE [--m 1 16 64 512 2048 8192] [--out STEM]
        [--variants NAME ...]   # also the fused call on each named variant (column fused@<tile>)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from factory import testing  # noqa: E402
from factory.benchmark import default_out, sets_for, time_eager, time_interleaved  # noqa: E402
from factory.runtime import Bundle, NoVariantError  # noqa: E402
from factory.runtime.epilogue import pack_gate_up  # noqa: E402

HIDDEN, INTER = 4096, 14336
OPS = {  # name -> (fields, N_out, K)
    "o_proj+residual": ("residual", HIDDEN, HIDDEN),
    "down_proj+residual": ("residual", HIDDEN, INTER),
    "gate_up+silu_mul": ("silu_mul", INTER, HIDDEN),
    "gate_up+silu_mul+fp8": ("silu_fp8", INTER, HIDDEN),
    "gate_up+silu_mul+fp8rows": ("silu_fp8rows", INTER, HIDDEN),
}


def torch_group_quant(y, q, s):
    """torch's e4m3 quantisation of y (M, I) per row and 128 columns into q (M, I) and s (M, I/128)."""
    import torch

    from factory.runtime.epilogue import FP8_MAX, FP8_MIN_SCALE

    M, n = y.shape
    g = y.float().view(M, n // 128, 128)
    sc = (g.abs().amax(dim=2) / FP8_MAX).clamp_min(FP8_MIN_SCALE)
    q.copy_((g / sc[:, :, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).view(M, n))
    s.copy_(sc)


def torch_row_quant(y, q, s):
    """torch's e4m3 quantisation of y (M, I) with one scale per row into q (M, I) and s (M, 1)."""
    import torch

    from factory.runtime.epilogue import FP8_MAX, FP8_MIN_SCALE

    yf = y.float()
    s.copy_((yf.abs().amax(dim=1, keepdim=True) / FP8_MAX).clamp_min(FP8_MIN_SCALE))
    q.copy_((yf / s).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn))


def _l2() -> int:
    import torch

    return int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20))


def _fields_of(name: str) -> str:
    """The epilogue fields a variant name ends with ("silumul", "res", "bias_res", ...)."""
    tail = name.rsplit("_pdl", 1)[-1].strip("_")
    return tail


def _tile_of(name: str) -> str:
    """The tile and cluster part of a variant name ("t256x128x64_c1x2"), and its raster swizzle
    and split-K where those are not 1 ("t256x128x64_c1x2_sw8", "t64x128x64_c1x1_sk2")."""
    parts = name.split("_")
    t = next(i for i, x in enumerate(parts) if x.startswith("t") and "x" in x)
    sw = [x for x in parts[t + 2:] if x.startswith("sw") and x[2:].isdigit() and x != "sw1"]
    sk = [x for x in parts[t + 2:] if x.startswith("sk") and x[2:].isdigit() and x != "sk1"]
    return "_".join(parts[t:t + 2] + sw[:1] + sk[:1])


def bench_row(bundle, op: str, M: int, variants=()) -> dict:
    import torch
    import torch.nn.functional as F

    field, n_out, K = OPS[op]
    bf = dict(device="cuda", dtype=torch.bfloat16)
    N = 2 * n_out if field.startswith("silu") else n_out
    per_set = 2 * (M * K + N * K + 2 * M * n_out)
    n = sets_for(per_set, _l2())
    xs = [torch.randn(M, K, **bf) for _ in range(n)]
    ws = [torch.randn(N, K, **bf) / K ** 0.5 for _ in range(n)]
    hs = [torch.randn(M, n_out, **bf) for _ in range(n)]
    outs = {k: [torch.full((M, n_out), float("nan"), **bf) for _ in range(n)] for k in ("fused", "ours", "cublas")}
    tmp = [torch.empty(M, N, **bf) for _ in range(n)]
    if field == "silu_fp8":
        from factory.runtime.epilogue import new_scale_out

        packed = [pack_gate_up(w) for w in ws]
        e4 = torch.float8_e4m3fn
        qs = {k: [torch.empty(M, n_out, device="cuda", dtype=e4) for _ in range(n)] for k in ("fused", "ours", "cublas")}
        ss = {k: [new_scale_out(xs[0], M, n_out) for _ in range(n)] for k in ("fused", "ours", "cublas")}
        act = [torch.empty(M, n_out, **bf) for _ in range(n)]

        def fused(i):
            bundle.gemm(xs[i], packed[i], qs["fused"][i], activation="silu_mul", scale_out=ss["fused"][i])

        def unfused_ours(i):
            bundle.gemm(xs[i], packed[i], act[i], activation="silu_mul")
            torch_group_quant(act[i], qs["ours"][i], ss["ours"][i])

        def unfused_cublas(i):
            torch.matmul(xs[i], ws[i].t(), out=tmp[i])
            torch.mul(F.silu(tmp[i][:, :n_out]), tmp[i][:, n_out:], out=act[i])
            torch_group_quant(act[i], qs["cublas"][i], ss["cublas"][i])

        def ref(i):
            y = xs[i].float() @ ws[i].float().t()
            return F.silu(y[:, :n_out]) * y[:, n_out:]
    elif field == "silu_fp8rows":
        packed = [pack_gate_up(w) for w in ws]
        e4 = torch.float8_e4m3fn
        qs = {k: [torch.empty(M, n_out, device="cuda", dtype=e4) for _ in range(n)] for k in ("fused", "ours", "cublas")}
        ss = {k: [torch.empty(M, 1, device="cuda") for _ in range(n)] for k in ("fused", "ours", "cublas")}
        act = [torch.empty(M, n_out, **bf) for _ in range(n)]

        def fused(i):  # (the row scales are a new tensor per call: kept for the check)
            ss["fused"][i] = bundle.gemm(xs[i], packed[i], qs["fused"][i], activation="silu_mul", row_scales=True)[1]

        def unfused_ours(i):
            bundle.gemm(xs[i], packed[i], act[i], activation="silu_mul")
            torch_row_quant(act[i], qs["ours"][i], ss["ours"][i])

        def unfused_cublas(i):
            torch.matmul(xs[i], ws[i].t(), out=tmp[i])
            torch.mul(F.silu(tmp[i][:, :n_out]), tmp[i][:, n_out:], out=act[i])
            torch_row_quant(act[i], qs["cublas"][i], ss["cublas"][i])

        def ref(i):
            y = xs[i].float() @ ws[i].float().t()
            return F.silu(y[:, :n_out]) * y[:, n_out:]
    elif field == "silu_mul":
        packed = [pack_gate_up(w) for w in ws]

        def fused(i):
            bundle.gemm(xs[i], packed[i], outs["fused"][i], activation="silu_mul")

        def unfused_ours(i):
            bundle.gemm(xs[i], ws[i], tmp[i])
            torch.mul(F.silu(tmp[i][:, :n_out]), tmp[i][:, n_out:], out=outs["ours"][i])

        def unfused_cublas(i):
            torch.matmul(xs[i], ws[i].t(), out=tmp[i])
            torch.mul(F.silu(tmp[i][:, :n_out]), tmp[i][:, n_out:], out=outs["cublas"][i])

        def ref(i):
            y = xs[i].float() @ ws[i].float().t()
            return F.silu(y[:, :n_out]) * y[:, n_out:]
    else:
        def fused(i):
            bundle.gemm(xs[i], ws[i], outs["fused"][i], residual=hs[i])

        def unfused_ours(i):
            bundle.gemm(xs[i], ws[i], tmp[i])
            torch.add(tmp[i], hs[i], out=outs["ours"][i])

        def unfused_cublas(i):
            torch.matmul(xs[i], ws[i].t(), out=tmp[i])
            torch.add(tmp[i], hs[i], out=outs["cublas"][i])

        def ref(i):
            return xs[i].float() @ ws[i].float().t() + hs[i].float()

    calls = {"fused": fused, "ours+torch": unfused_ours, "cublas+torch": unfused_cublas}
    want = {"silu_mul": "silumul", "residual": "res"}.get(field)
    named = [v for v in variants if want and _fields_of(v) == want]
    for v in named:  # the fused call on a named variant (same inputs, its own NaN-poisoned outputs)
        key = "fused@" + _tile_of(v)
        outs[key] = [torch.full((M, n_out), float("nan"), **bf) for _ in range(n)]
        if field == "silu_mul":
            calls[key] = (lambda v, o: lambda i: bundle.gemm(xs[i], packed[i], o[i], activation="silu_mul",
                                                             variant=v))(v, outs[key])
        else:
            calls[key] = (lambda v, o: lambda i: bundle.gemm(xs[i], ws[i], o[i], residual=hs[i], variant=v))(
                v, outs[key])
    try:
        unfused_ours(0)
    except NoVariantError:  # a bundle of epilogue variants only: no plain GEMM to compare with
        del calls["ours+torch"]
    times = time_interleaved(calls, n, warm_s=0.05)
    eager = {k: time_eager(calls[k], n) for k in ("fused", "ours+torch") if k in calls}
    if field == "silu_fp8":  # the decoded e4m3 outputs are what gets checked
        for k in ("fused", "ours", "cublas"):
            for i in range(n):
                outs[k][i].copy_(testing.decode_fp8_groups(qs[k][i], ss[k][i]))
    if field == "silu_fp8rows":
        for k in ("fused", "ours", "cublas"):
            for i in range(n):
                outs[k][i].copy_(qs[k][i].float() * ss[k][i])
    errs = {}
    for k in ("fused", "ours", "cublas", *("fused@" + _tile_of(v) for v in named)):
        if k == "ours" and "ours+torch" not in calls:
            continue
        errs[k] = max(testing.rel_error(outs[k][i], ref(i)) for i in range(min(n, 2)))
        assert not any(torch.isnan(o).any() for o in outs[k]), (op, M, k)
    row = {"op": op, "M": M, "N": N, "N_out": n_out, "K": K, "sets": n,
           "us": {k: v * 1e6 for k, v in times.items()}, "eager_us": {k: v * 1e6 for k, v in eager.items()},
           "rel_err": errs,
           "speedup_vs_ours_unfused": times["ours+torch"] / times["fused"] if "ours+torch" in times else None,
           "speedup_vs_cublas_unfused": times["cublas+torch"] / times["fused"]}
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bundle", default="artifacts/default")
    p.add_argument("--m", type=int, nargs="+", default=[1, 16, 64, 512, 2048, 8192])
    p.add_argument("--ops", nargs="+", default=list(OPS), choices=list(OPS))
    p.add_argument("--out", default=default_out("bench_epilogue"))
    p.add_argument("--variants", nargs="*", default=[],
                   help="also time the fused call on each named variant whose epilogue fits the op "
                        "(column fused@<tile>_<cluster>)")
    a = p.parse_args(argv)
    import torch

    torch.manual_seed(0)
    bundle = Bundle.open(a.bundle)
    rows = []
    print(f"device {torch.cuda.get_device_name()}; µs per call, graph-replay medians", flush=True)
    print(f"{'op':22s} {'M':>5s} {'fused':>9s} {'ours+torch':>11s} {'cublas+torch':>13s} {'x ours':>7s} "
          f"{'x cublas':>8s}  variant", flush=True)
    for op in a.ops:
        for M in a.m:
            r = bench_row(bundle, op, M, a.variants)
            r["variant"] = _last_variant(bundle)
            rows.append(r)
            u = r["us"]
            ours = u.get("ours+torch", float("nan"))
            x_ours = r["speedup_vs_ours_unfused"] or float("nan")
            print(f"{op:22s} {M:5d} {u['fused']:9.1f} {ours:11.1f} {u['cublas+torch']:13.1f} "
                  f"{x_ours:7.2f} {r['speedup_vs_cublas_unfused']:8.2f}  {r['variant']}", flush=True)
            for k in sorted(u):
                if k.startswith("fused@"):
                    x = u.get("ours+torch", float("nan")) / u[k]
                    print(f"{'':22s} {'':5s} {u[k]:9.1f}  {k}  x ours {x:.2f}  x fused {u['fused'] / u[k]:.2f}",
                          flush=True)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    Path(str(out) + ".json").write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    summary = [{k: r[k] for k in ("op", "M", "us", "speedup_vs_ours_unfused", "speedup_vs_cublas_unfused",
                                   "variant")} for r in rows]
    Path(str(out) + ".summary.json").write_text(json.dumps(summary, indent=1))
    print(f"wrote {out}.json and {out}.summary.json")
    return 0


def _last_variant(bundle) -> str:
    """The variant of the most recent fused selection (the selection cache keeps insertion order)."""
    names = [v for k, v in bundle.selections.items() if isinstance(k, tuple) and k and k[0] == "epi"]
    return names[-1] if names else "?"


if __name__ == "__main__":
    sys.exit(main())
