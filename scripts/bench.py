#!/usr/bin/env python3
"""Our kernels beside the reference, in the same run, on the same inputs.

gemm: ours (the loader's selected variant, or every variant with --all) vs torch.matmul (cuBLAS).
Timing: CUDA events around CUDA-graph replays (each graph holds one call per input set, rotating
among enough fresh random input sets to exceed twice the L2), medians of many replays; also eager
calls.  Outputs are NaN-poisoned before timing and checked after.  Writes JSON and a PNG chart.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from factory import testing  # noqa: E402
from factory.runtime import Bundle  # noqa: E402

SQUARE = [(n, n, n) for n in (2048, 4096, 8192)]
# Llama-3-8B projections (N, K): qkv, o, gate+up, down; M from decode to prefill.
LLM_NK = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]
LLM_M = [1, 16, 128, 2048, 8192]


def _sets_for(bytes_per_set: int, l2: int) -> int:
    return max(1, min(8, -(-2 * l2 // max(1, bytes_per_set))))


def time_graph(fn_per_set, n_sets: int, replays: int = 30) -> float:
    """Median seconds per call, from replays of a graph holding one call per input set."""
    import torch

    for i in range(n_sets):
        fn_per_set(i)  # warm-up (module load, cuBLAS heuristics) outside capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        with torch.cuda.graph(g, stream=s):
            for i in range(n_sets):
                fn_per_set(i)
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) / 1e3 / n_sets)
    return statistics.median(times)


def time_eager(fn_per_set, n_sets: int, iters: int = 20) -> float:
    import torch

    for i in range(n_sets):
        fn_per_set(i)
    torch.cuda.synchronize()
    times = []
    for r in range(iters):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn_per_set(r % n_sets)
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) / 1e3)
    return statistics.median(times)


def bench_gemm(bundle, shapes, dtype: str, variant: str | None = None) -> list[dict]:
    import torch

    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows = []
    for M, N, K in shapes:
        esize = 1 if dtype == "e4m3" else 2
        n_sets = _sets_for((M * K + N * K) * esize + M * N * 2, l2)
        A = [testing.gemm_operand(M, K, 1, "k", dtype)[0] for _ in range(n_sets)]
        B = [testing.gemm_operand(N, K, 1, "k", dtype)[0] for _ in range(n_sets)]
        out_dt = torch.bfloat16
        C_ours = [torch.full((M, N), float("nan"), dtype=out_dt, device="cuda") for _ in range(n_sets)]
        C_ref = [torch.empty((M, N), dtype=out_dt, device="cuda") for _ in range(n_sets)]
        one = torch.ones(1, device="cuda")
        if dtype == "e4m3":
            ours = lambda i: bundle.gemm(A[i], B[i], C_ours[i], scale_a=one, scale_b=one, variant=variant)  # noqa: E731
            ref = lambda i: torch._scaled_mm(A[i], B[i].t(), scale_a=one, scale_b=one, out_dtype=out_dt)  # noqa: E731
        else:
            ours = lambda i: bundle.gemm(A[i], B[i], C_ours[i], variant=variant)  # noqa: E731
            ref = lambda i: torch.mm(A[i], B[i].t(), out=C_ref[i])  # noqa: E731
        t_ours = time_graph(ours, n_sets)
        t_ref = time_graph(ref, n_sets)
        e_ours = time_eager(ours, n_sets)
        e_ref = time_eager(ref, n_sets)
        nan = sum(int(torch.isnan(c).sum()) for c in C_ours)
        err = testing.rel_error(C_ours[0], A[0].float() @ B[0].float().t())
        from factory.runtime.gemm import _as_rkl, select

        name = variant or select(bundle, _as_rkl(A[0], "a"), _as_rkl(B[0], "b"), _as_rkl(C_ours[0], "c"),
                                 dtype, "bf16", [one, one] if dtype == "e4m3" else [])
        flops = 2 * M * N * K
        rows.append({
            "M": M, "N": N, "K": K, "dtype": dtype, "variant": name, "input_sets": n_sets,
            "ours_us": t_ours * 1e6, "ref_us": t_ref * 1e6, "ours_eager_us": e_ours * 1e6,
            "ref_eager_us": e_ref * 1e6, "ours_tflops": flops / t_ours / 1e12, "ref_tflops": flops / t_ref / 1e12,
            "ratio": t_ref / t_ours, "rel_err": err, "nan": nan,
        })
        r = rows[-1]
        print(f"{M:>6} {N:>6} {K:>6}  {r['ours_us']:>9.1f} {r['ref_us']:>9.1f}  {r['ours_tflops']:>7.1f} "
              f"{r['ref_tflops']:>7.1f}  {r['ratio']:>5.2f}  {r['ours_eager_us']:>8.1f} {r['ref_eager_us']:>8.1f}  "
              f"{err:.1e} {nan}  {name}", flush=True)
        del A, B, C_ours, C_ref
        torch.cuda.empty_cache()
    return rows


def chart(rows: list[dict], path: Path, title: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib missing: no chart)")
        return
    labels = [f"{r['M']}x{r['N']}x{r['K']}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(6, len(rows) * 0.45), 4))
    ax.bar(range(len(rows)), [r["ratio"] for r in rows])
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(range(len(rows)), labels, rotation=70, fontsize=7)
    ax.set_ylabel("reference time / our time")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("op", choices=["gemm"])
    p.add_argument("--bundle", default="artifacts/default")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "e4m3"])
    p.add_argument("--variant", default=None, help="force one variant (default: the loader's choice)")
    p.add_argument("--shapes", default="all", choices=["all", "square", "llm", "quick"])
    p.add_argument("--out", default="bench")
    a = p.parse_args()
    import torch

    torch.manual_seed(int(time.time()))
    bundle = Bundle.open(a.bundle)
    shapes = {"square": SQUARE, "llm": [(m, n, k) for n, k in LLM_NK for m in LLM_M],
              "quick": [(4096, 4096, 4096), (16, 4096, 4096)]}.get(a.shapes)
    if shapes is None:
        shapes = SQUARE + [(m, n, k) for n, k in LLM_NK for m in LLM_M]
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}; times in µs (graph replay medians)")
    print(f"{'M':>6} {'N':>6} {'K':>6}  {'ours':>9} {'cuBLAS':>9}  {'TF/s':>7} {'ref':>7}  {'ratio':>5}  "
          f"{'eager':>8} {'ref':>8}  err nan  variant")
    rows = bench_gemm(bundle, shapes, a.dtype, a.variant)
    geo = statistics.geometric_mean([r["ratio"] for r in rows])
    print(f"geomean ratio (ref time / ours) over {len(rows)} shapes: {geo:.3f}")
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
            "bundle_versions": bundle.manifest["versions"], "geomean_ratio": geo, "rows": rows}
    Path(str(out) + ".json").write_text(json.dumps(meta, indent=1))
    chart(rows, Path(str(out) + ".png"), f"{a.op} {a.dtype} vs torch on {meta['device']} (geomean {geo:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
