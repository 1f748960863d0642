#!/usr/bin/env python3
"""Our kernels beside the reference, in the same run, on the same inputs, against a roofline.

gemm: ours (the loader's selected variant, or one forced with --variant) vs torch.matmul (cuBLAS),
and for fp8 e4m3 vs ``torch._scaled_mm`` (with the same accumulation mode as our variant).
Timing: CUDA events around bursts of back-to-back CUDA-graph replays (each graph holds one call
per input set, rotating among enough fresh random input sets to exceed twice the L2; the queue is
kept full so no host launch latency is timed), ours and the reference in 4 alternating passes
after a 50 ms warm-up (time_interleaved), median of the per-pass medians; also eager calls.  Each
shape runs in ``--epochs`` (2) epochs of freshly allocated random inputs and each side keeps its
faster epoch: the H100's GPU-wide slow episodes (notes/gemm-sm90.md, "The intermittent slowdown")
then have to hit both epochs of one side to show (every epoch's times are in the JSON).
Outputs are NaN-poisoned before timing and checked after; values are checked against a float32
reference on a slice of rows.  Where ``bundle.gemm(..., b_constant=True)`` would run another
variant (an ``early_b`` decode tile: B streamed before the previous call ends), that call is timed
in the same passes too (``ours_bconst_us``), and for fp8 with M <= 16 ours on weights packed once
by ``bundle.pack_b`` (a decode variant: ``ours_packed_plain_us``, and with ``b_constant=True``:
``ours_packed_us``) where one takes the shape.

Roofline floor per shape, measured in the same run: max(bytes moved once (A, B, C) / device-to-
device copy bandwidth of a 1 GiB copy, FLOPs / the reference's own rate at 8192³ of that dtype);
also that floor plus the time per call of a one-element kernel timed the same way (graphs of as
many calls as the row has input sets: ``launch_us``), which no kernel avoids and which is a third
of the floor of a 16-32 MB decode GEMM.

Writes ``OUT.json`` (raw: every field, every epoch), ``OUT.png`` (ratio per shape, one panel per
dtype) and ``OUT.summary.json`` (per shape ours, the reference, ratio, TFLOP/s, floor: what a note
keeps in notes/results/).  ``--out`` defaults to ``$FACTORY_RESULTS/bench_gemm`` (else under the
system's temporary folder): raw output stays out of the tree.
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
from factory.benchmark import (LLM_M, LLM_NK, SQUARE, copy_bandwidth, default_out, dump_summary,  # noqa: E402
                               gemm_bytes, launch_latency, read_bandwidth, sets_for, summarise,
                               time_eager, time_interleaved)
from factory.runtime import Bundle, NoVariantError  # noqa: E402

CEILING_SHAPE = (8192, 8192, 8192)


def shape_grid(which: str) -> list[tuple[int, int, int]]:
    llm = [(m, n, k) for n, k in LLM_NK for m in LLM_M]
    return {"square": SQUARE, "llm": llm, "all": SQUARE + llm,
            "quick": [(8192, 8192, 8192), (4096, 4096, 4096), (16, 4096, 4096), (1, 8192, 28672)]}[which]


def _packed_name(bundle, a, p, c, one) -> str:
    """The decode variant ``bundle.gemm(a, p, c, b_constant=True)`` runs."""
    from factory.runtime.packed import launch_specs, select_packed

    specs = launch_specs(a, p, c, [(one.data_ptr(), (1,), (1,))] * 2)
    return select_packed(bundle, specs, a.shape[0], p.n, p.k, True)


def _fast_accum(bundle, variant: str) -> bool:
    """Whether our fp8 variant accumulates fast (then the reference does too)."""
    return bundle.manifest["variants"][variant]["fp8_accumulation"] == "fast"


def bench_gemm_shape(bundle, M, N, K, dtype: str, variant: str | None, l2: int, epochs: int = 2) -> dict:
    """One shape: ``epochs`` times fresh random inputs, each timed with ``time_interleaved`` (ours,
    the reference, and ours with ``b_constant=True`` where that runs another variant); per side the
    faster epoch counts.  The H100 has GPU-wide slow episodes (10-20 ms, sometimes a whole shape's
    measurement, hitting cuBLAS and ours alike: notes/gemm-sm90.md, "The intermittent slowdown")
    that a second allocation epoch on both sides filters evenly.  Eager times, errors and NaN checks: every epoch."""
    import torch

    from factory.runtime.gemm import rkl_spec, select

    n_sets = sets_for(gemm_bytes(M, N, K, dtype), l2)
    out_dt = torch.bfloat16
    one = torch.ones(1, device="cuda")
    fp8 = dtype == "e4m3"
    scales = [(one.data_ptr(), (1,), (1,))] * 2 if fp8 else []
    sc = dict(scale_a=one, scale_b=one) if fp8 else {}
    name = const = fast = packed = None  # packed: the decode variant on packed weights, or False
    per = []  # per epoch: (times, eager ours, eager ref, nan count, rel err)
    for _ in range(epochs):
        A, B, C_ours = testing.gemm_input_sets(n_sets, M, N, K, dtype)
        C_ref = [torch.empty((M, N), dtype=out_dt, device="cuda") for _ in range(n_sets)]
        if name is None:
            specs = (rkl_spec(A[0], "a"), rkl_spec(B[0], "b"), rkl_spec(C_ours[0], "c"))
            name = variant or select(bundle, *specs, dtype, "bf16", scales)
            # Where b_constant=True picks another variant (an early_b one: B, the weights, is
            # never written here, so it may stream B before the previous call has finished).
            const = name if variant else select(bundle, *specs, dtype, "bf16", scales, b_constant=True)
            fast = fp8 and _fast_accum(bundle, name)
        ours = lambda i: bundle.gemm(A[i], B[i], C_ours[i], variant=variant, **sc)  # noqa: E731
        if fp8:
            ref = lambda i: torch._scaled_mm(A[i], B[i].t(), scale_a=one, scale_b=one, out_dtype=out_dt,  # noqa: E731
                                             use_fast_accum=fast)
        else:
            ref = lambda i: torch.mm(A[i], B[i].t(), out=C_ref[i])  # noqa: E731
        try:
            ref(0)
        except RuntimeError as e:  # e.g. a shape the reference refuses
            print(f"  reference failed on {M}x{N}x{K}: {e}", flush=True)
            ref = None
        calls = {"ours": ours, **({"ref": ref} if ref else {})}
        if const != name:
            calls["ours_bconst"] = lambda i: bundle.gemm(A[i], B[i], C_ours[i], b_constant=True, **sc)  # noqa: E731
        P = None
        if fp8 and M <= 16 and variant is None and packed is not False:
            try:  # a decode variant on packed weights (packed once, outside the timing)
                P = [bundle.pack_b(b) for b in B]
                packed = _packed_name(bundle, A[0], P[0], C_ours[0], one)
            except (NoVariantError, ValueError):  # no decode variant takes this shape
                P, packed = None, False
            else:
                calls["ours_packed"] = lambda i: bundle.gemm(A[i], P[i], C_ours[i], b_constant=True, **sc)  # noqa: E731
                calls["ours_packed_plain"] = lambda i: bundle.gemm(A[i], P[i], C_ours[i], **sc)  # noqa: E731
        # Ours and the reference in alternating passes over the same inputs (time_interleaved).
        t = time_interleaved(calls, n_sets, rounds=4, budget_s=0.1, max_reps=10, warm_s=0.05)
        e_ours = time_eager(ours, n_sets)
        e_ref = time_eager(ref, n_sets) if ref else float("nan")
        nan = sum(int(torch.isnan(c).sum()) for c in C_ours)
        rows = min(M, 256)
        err = testing.rel_error(C_ours[0][:rows], A[0][:rows].float() @ B[0].float().t())
        for key in ("ours_packed_plain", "ours_packed") if P is not None else ():
            for c in C_ours:  # the packed calls write C_ours too: check each alone
                c.fill_(float("nan"))
            for i in range(n_sets):
                calls[key](i)
            torch.cuda.synchronize()
            nan += sum(int(torch.isnan(c).sum()) for c in C_ours)
            err = max(err, testing.rel_error(C_ours[0], A[0].float() @ B[0].float().t()))
        per.append((t, e_ours, e_ref, nan, err))
        A = B = C_ours = C_ref = P = None  # free before the next epoch (the lambdas hold the names)
        torch.cuda.empty_cache()
    best = {k: min(p[0].get(k, float("nan")) for p in per) for k in per[0][0]}
    t_ours, t_ref = best["ours"], best.get("ref", float("nan"))
    e_ours, e_ref = min(p[1] for p in per), min(p[2] for p in per)
    flops = 2 * M * N * K
    extra = {}
    if "ours_bconst" in best:
        extra = {"variant_bconst": const, "ours_bconst_us": best["ours_bconst"] * 1e6}
    if "ours_packed" in best:
        extra.update(variant_packed=packed, ours_packed_us=best["ours_packed"] * 1e6,
                     ours_packed_plain_us=best["ours_packed_plain"] * 1e6)
    return {**extra, "M": M, "N": N, "K": K, "dtype": dtype, "variant": name, "input_sets": n_sets,
            "ref_fast_accum": fast if fp8 else None,
            "ours_us": t_ours * 1e6, "ref_us": t_ref * 1e6, "ours_eager_us": e_ours * 1e6,
            "ref_eager_us": e_ref * 1e6, "ours_tflops": flops / t_ours / 1e12,
            "ref_tflops": flops / t_ref / 1e12, "ratio": t_ref / t_ours, "eager_ratio": e_ref / e_ours,
            "rel_err": max(p[4] for p in per), "nan": sum(p[3] for p in per),
            "epochs_us": [{k: round(v * 1e6, 2) for k, v in p[0].items()} for p in per]}


def bench_gemm(bundle, shapes, dtype: str, variant: str | None, copy_bw: float, log=print,
               partial=lambda rows: None, read_bw: float | None = None,
               launch_s: dict[int, float] | None = None, epochs: int = 2) -> dict:
    """Every shape for one dtype; the matmul ceiling (reference at 8192³) is measured first."""
    import torch

    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    shapes = [CEILING_SHAPE] + [s for s in shapes if s != CEILING_SHAPE]
    rows = []
    ceiling = None
    log(f"{'M':>6} {'N':>6} {'K':>6}  {'ours':>9} {'ref':>9} {'floor':>8}  {'TF/s':>6} {'ref':>6}  {'ratio':>5} "
        f"{'/floor':>6}  {'eager':>8} {'ref':>8}  err nan  variant")
    for M, N, K in shapes:
        r = bench_gemm_shape(bundle, M, N, K, dtype, variant, l2, epochs)
        if ceiling is None:
            ceiling = r["ref_tflops"] * 1e12
        t_mem = gemm_bytes(M, N, K, dtype) / copy_bw
        t_flop = 2 * M * N * K / ceiling
        r.update({"floor_us": max(t_mem, t_flop) * 1e6, "floor_bound": "memory" if t_mem > t_flop else "compute"})
        r["ours_over_floor"] = r["ours_us"] / r["floor_us"]
        r["ours_bconst_over_floor"] = r.get("ours_bconst_us", r["ours_us"]) / r["floor_us"]
        if "ours_packed_us" in r:
            r["ours_packed_over_floor"] = r["ours_packed_us"] / r["floor_us"]
            r["ours_packed_plain_over_floor"] = r["ours_packed_plain_us"] / r["floor_us"]
        r["ref_over_floor"] = r["ref_us"] / r["floor_us"]
        if launch_s is not None:  # the floor plus one launch: what a kernel of any speed needs
            r["launch_us"] = launch_s[r["input_sets"]] * 1e6
            r["floor_launch_us"] = r["floor_us"] + r["launch_us"]
            r["ours_over_floor_launch"] = r["ours_us"] / r["floor_launch_us"]
            r["ref_over_floor_launch"] = r["ref_us"] / r["floor_launch_us"]
        if read_bw:  # the stricter memory floor: bytes at the read-only stream's bandwidth
            r["floor_read_us"] = max(gemm_bytes(M, N, K, dtype) / read_bw, t_flop) * 1e6
            r["ours_over_read_floor"] = r["ours_us"] / r["floor_read_us"]
        rows.append(r)
        partial(rows)
        log(f"{M:>6} {N:>6} {K:>6}  {r['ours_us']:>9.1f} {r['ref_us']:>9.1f} {r['floor_us']:>8.1f}  "
            f"{r['ours_tflops']:>6.0f} {r['ref_tflops']:>6.0f}  {r['ratio']:>5.2f} {r['ours_over_floor']:>6.2f}  "
            f"{r['ours_eager_us']:>8.1f} {r['ref_eager_us']:>8.1f}  {r['rel_err']:.1e} {r['nan']}  "
            f"{r['variant'].replace('gemm_', '')}"
            + (f"  [b_constant: {r['ours_bconst_us']:.1f} = {r['ours_bconst_over_floor']:.2f}x floor]"
               if "ours_bconst_us" in r else "")
            + (f"  [packed: {r['ours_packed_plain_us']:.1f} = {r['ours_packed_plain_over_floor']:.2f}x, "
               f"packed+b_constant: {r['ours_packed_us']:.1f} = {r['ours_packed_over_floor']:.2f}x floor]"
               if "ours_packed_us" in r else ""))
    ok = [r for r in rows if r["ratio"] == r["ratio"]]  # NaN where the reference failed
    ratios = [r["ratio"] for r in ok]
    # Decode shapes (M <= 16) within 10 % of the floor, and of the floor plus one launch.
    dec = [r for r in rows if r["M"] <= 16]
    within = {who: {"floor": sum(r[f"{who}_over_floor"] <= 1.1 for r in dec),
                    "floor_plus_launch": sum(r.get(f"{who}_over_floor_launch", 9) <= 1.1 for r in dec)}
              for who in ("ours", "ref")}
    # Ours called with b_constant=True (the early_b twins where the pick has one).
    within["ours_b_constant"] = {"floor": sum(r["ours_bconst_over_floor"] <= 1.1 for r in dec)}
    # Packed weights with b_constant=True where a decode variant takes the shape, else as above.
    within["ours_packed_b_constant"] = {"floor": sum(
        r.get("ours_packed_over_floor", r["ours_bconst_over_floor"]) <= 1.1 for r in dec)}
    within["ours_packed"] = {"floor": sum(r.get("ours_packed_plain_over_floor", r["ours_over_floor"]) <= 1.1 for r in dec)}
    return {"dtype": dtype, "ceiling_tflops": ceiling / 1e12, "geomean_ratio": statistics.geometric_mean(ratios),
            "min_ratio": min(ratios), "geomean_eager_ratio": statistics.geometric_mean([r["eager_ratio"] for r in ok]),
            "decode_shapes": len(dec), "decode_within_10pct": within, "rows": rows}


def chart(tables: list[dict], path: Path, title: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib missing: no chart)")
        return
    n = max(len(t["rows"]) for t in tables)
    fig, axes = plt.subplots(len(tables), 1, figsize=(max(8, n * 0.22), 3.6 * len(tables)), squeeze=False)
    for ax, t in zip(axes[:, 0], tables):
        rows = t["rows"]
        x = range(len(rows))
        ax.bar(x, [r["ratio"] for r in rows], label="reference time / ours")
        ax.plot(x, [r["floor_us"] / r["ours_us"] for r in rows], "k.", ms=4, label="floor / ours")
        ax.axhline(1.0, color="k", lw=0.8)
        ax.axhline(0.85, color="r", lw=0.5, ls="--")
        ax.set_xticks(list(x), [f"{r['M']}x{r['N']}x{r['K']}" for r in rows], rotation=80, fontsize=6)
        ax.set_title(f"{t['dtype']}: geomean {t['geomean_ratio']:.3f}, min {t['min_ratio']:.2f} "
                     f"(ceiling {t['ceiling_tflops']:.0f} TFLOP/s)", fontsize=9)
        ax.legend(fontsize=7, loc="upper right")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "attention":
        from bench_attention import main as attention_main

        return attention_main(sys.argv[2:])
    if len(sys.argv) > 1 and sys.argv[1] == "gemm-targets":  # the targets table (bench_gemm_targets.py)
        from bench_gemm_targets import main as targets_main

        return targets_main(sys.argv[2:])
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("op", choices=["gemm", "attention"], help="attention takes bench_attention.py's options")
    p.add_argument("--bundle", default="artifacts/default")
    p.add_argument("--dtypes", nargs="+", default=["bf16", "e4m3"], choices=["bf16", "f16", "e4m3"])
    p.add_argument("--variant", default=None, help="force one variant (default: the loader's choice)")
    p.add_argument("--shapes", default="all", choices=["all", "square", "llm", "quick"])
    p.add_argument("--heuristic", action="store_true", help="ignore the bundle's tuning.json")
    p.add_argument("--epochs", type=int, default=2, help="fresh-input epochs per shape; per side the faster counts")
    p.add_argument("--out", default=default_out("bench_gemm"), help="path stem of the output files (default: %(default)s)")
    a = p.parse_args()
    import torch

    t0 = time.time()
    torch.manual_seed(int(time.time()))
    bundle = Bundle.open(a.bundle)
    if a.heuristic:
        bundle._tuning = (None, "tuning.json ignored (--heuristic)")
    tuned = bundle.tuning
    bw = copy_bandwidth()
    rbw = read_bandwidth()
    lat = launch_latency()
    dev = torch.cuda.get_device_name()
    selection = "tuning.json" if tuned is not None else f"heuristic ({bundle._tuning[1]})"
    print(f"device {dev}, torch {torch.__version__}; selection: {selection}; copy bandwidth "
          f"{bw / 1e12:.2f} TB/s, read {rbw / 1e12:.2f} TB/s, empty-kernel time per call {lat[1] * 1e6:.1f} µs "
          f"(1 per graph) to {lat[8] * 1e6:.1f} µs (8 per graph); "
          f"times in µs (graph replay medians)", flush=True)
    tables = []
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for dt in a.dtypes:
        print(f"\n== {dt}", flush=True)

        def partial(rows, dt=dt):  # what has been measured so far survives a time-out
            Path(str(out) + ".partial.json").write_text(json.dumps({"done": tables, dt: rows}))

        t = bench_gemm(bundle, shape_grid(a.shapes), dt, a.variant, bw, log=lambda s: print(s, flush=True),
                       partial=partial, read_bw=rbw, launch_s=lat, epochs=a.epochs)
        w = t["decode_within_10pct"]
        print(f"{dt}: geomean ratio (ref time / ours) {t['geomean_ratio']:.3f} over {len(t['rows'])} shapes, "
              f"min {t['min_ratio']:.3f}; eager geomean {t['geomean_eager_ratio']:.3f}; decode shapes within "
              f"10 % of the floor: ours {w['ours']['floor']}/{t['decode_shapes']} (ref {w['ref']['floor']}), "
              f"of floor + launch: ours {w['ours']['floor_plus_launch']} (ref {w['ref']['floor_plus_launch']}); "
              f"ours with b_constant=True: {w['ours_b_constant']['floor']}, with packed weights where a "
              f"decode variant fits: {w['ours_packed']['floor']} (with b_constant=True: "
              f"{w['ours_packed_b_constant']['floor']})",
              flush=True)
        tables.append(t)
    meta = {"device": dev, "torch": torch.__version__, "cuda": torch.version.cuda, "date": time.strftime("%Y-%m-%d"),
            "bundle_versions": bundle.manifest["versions"], "copy_bandwidth_tbs": bw / 1e12,
            "read_bandwidth_tbs": rbw / 1e12, "launch_us_by_input_sets": {n: t * 1e6 for n, t in lat.items()},
            "selection": selection, "epochs": a.epochs,
            "seconds": round(time.time() - t0, 1), "tables": tables}
    Path(str(out) + ".json").write_text(json.dumps(meta, indent=1))
    Path(str(out) + ".summary.json").write_text(dump_summary(summarise(meta, command=" ".join(sys.argv))))
    chart(tables, Path(str(out) + ".png"), f"{a.op} vs torch on {dev} ({selection[:40]})")
    print(f"bench: {meta['seconds']} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
