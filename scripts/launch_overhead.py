#!/usr/bin/env python3
"""Host cost of one launch through the bundle (hot-path hit) beside torch, on problems so small
that the GPU never holds the host back: the number an eager inference server pays.

``--host-only`` (no GPU needed): the loader's own Python cost per ``bundle.gemm`` /
``bundle.attention`` / ``bundle.attention_kvcache`` (where the bundle has it) — hot-path hit, checks, argument packing, output allocation — with CPU
tensors, a planned H100 and every launcher replaced by a C function that returns at once (built
with the system C compiler); the native launcher's own cost (the CUDA launch) is not in it.

On a GPU: host µs per call of each op beside torch's, and the design's reference attention
problem (B1 H8 S512 D64 bf16) as an eager call beside torch SDPA: wall time per call of 1000
back-to-back calls by CUDA events (host time included: nothing is queued ahead, so the GPU waits
for each launch when the host is the slower), the host's time per call over the same loop, and
each kernel's time per call under CUDA-graph replay.

``--baseline DIR``: DIR holds another copy of the package (``DIR/factory``, e.g. ``git worktree
add DIR <commit>``), imported beside this one as ``factory_baseline``; every row of ours is then
timed for both, alternately in one process (host figures on a shared machine drift by a third
between processes; the paired difference holds).  Each figure is the median of ``--repeats``
timings of 2000 calls (1000 for the reference attention), with the least beside it on the host-
only rows.  ``--json PATH`` writes every figure."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from factory.runtime import Bundle  # noqa: E402


def baseline_bundle_class(root: str):
    """``Bundle`` of the package copy at ``root/factory``, imported as ``factory_baseline``."""
    pkg = Path(root) / "factory"
    spec = importlib.util.spec_from_file_location("factory_baseline", pkg / "__init__.py",
                                                  submodule_search_locations=[str(pkg)])
    mod = importlib.util.module_from_spec(spec)
    sys.modules["factory_baseline"] = mod
    spec.loader.exec_module(mod)
    return importlib.import_module("factory_baseline.runtime").Bundle


def timed(rows: dict, calls: int = 2000, repeats: int = 7, sync: bool = True) -> dict:
    """Host µs per call of each callable in ``rows`` ({name: fn}): ``repeats`` rounds, each
    timing ``calls`` calls of every row in turn (so paired rows see the same machine state).
    Returns {name: (median, least)}."""
    import torch

    for fn in rows.values():
        fn()
    if sync:
        torch.cuda.synchronize()
    samples = {k: [] for k in rows}
    for _ in range(repeats):
        for name, fn in rows.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            samples[name].append((time.perf_counter() - t0) / calls * 1e6)
            if sync:
                torch.cuda.synchronize()
    return {k: (statistics.median(v), min(v)) for k, v in samples.items()}


def per_call_us(fn, calls: int = 2000, repeats: int = 7, sync: bool = True) -> float:
    return timed({"fn": fn}, calls, repeats, sync)["fn"][0]


def _pairs(ours: dict, base: dict | None) -> dict:
    """{row: fn} -> {row: fn, row + " [baseline]": its twin} (alternating) when a baseline is given."""
    out = {}
    for k, fn in ours.items():
        out[k] = fn
        if base is not None and k in base:
            out[k + " [baseline]"] = base[k]
    return out


def host_only(bundle_path: str, repeats: int, baseline: str | None, baseline_bundle: str | None = None) -> dict:
    import ctypes
    import subprocess
    import tempfile

    import torch

    d = Path(tempfile.mkdtemp(prefix="launch_overhead_"))
    (d / "noop.c").write_text("int fx_noop(void *argv) { (void)argv; return 0; }\n")
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(d / "noop.so"), str(d / "noop.c")], check=True)
    noop = ctypes.CDLL(str(d / "noop.so")).fx_noop
    noop.restype, noop.argtypes = ctypes.c_int32, [ctypes.c_void_p]

    class NoLaunch:
        def launcher(self, name):
            return noop

    x = torch.randn(16, 64, dtype=torch.bfloat16)
    w = torch.randn(64, 64, dtype=torch.bfloat16)
    out = torch.empty(16, 64, dtype=torch.bfloat16)
    x8, w8 = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
    one = torch.ones(1)
    w16 = torch.randn(256, 1024).to(torch.float8_e4m3fn)
    a16, o16 = torch.randn(16, 1024).to(torch.float8_e4m3fn), torch.empty(16, 256, dtype=torch.bfloat16)
    q = torch.randn(1, 128, 8, 64, dtype=torch.bfloat16)
    r = [torch.randn(1, 512, 8, 64, dtype=torch.bfloat16) for _ in range(3)]
    kv = kvcache_inputs(torch, "cpu")

    def rows(cls, path=bundle_path):
        b = cls.open(path, capability=(9, 0), device={"name": "planned H100", "sm_count": 132})
        b.simulate(NoLaunch())  # CPU tensors as device -1, stream 0
        out_rows = {}
        if b.candidates("gemm"):  # (a bundle of some ops only: their rows)
            p = b.pack_b(w16)
            out_rows = {"bf16 gemm(out=)": lambda: b.gemm(x, w, out),
                        "bf16 gemm()": lambda: b.gemm(x, w),
                        "fp8 gemm(out=, scales)": lambda: b.gemm(x8, w8, out, scale_a=one, scale_b=one),
                        "fp8 gemm(out=)": lambda: b.gemm(x8, w8, out),
                        "packed fp8 gemm(out=, scales)": lambda: b.gemm(a16, p, o16, scale_a=one, scale_b=one)}
        rows_att = {"attention B1 S128 H8 D64 causal": lambda: b.attention(q, q, q, causal=True),
                    "attention B1 H8 S512 D64": lambda: b.attention(*r)}
        if takes_out(cls):
            o512 = torch.empty_like(r[0])
            rows_att["attention B1 H8 S512 D64 (out=)"] = lambda: b.attention(*r, out=o512)
        for k, fn in rows_att.items():
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - (either package's NoVariantError: not in this bundle)
                if type(e).__name__ != "NoVariantError":
                    raise
                continue
            out_rows[k] = fn
        if b.candidates("attention_kvcache"):
            out_rows.update(kvcache_rows(b, kv))
        return out_rows

    fns = _pairs(rows(Bundle), rows(baseline_bundle_class(baseline), baseline_bundle or bundle_path)
                 if baseline else None)
    fns["ctypes call of the no-op launcher"] = lambda: noop(0)
    res = {}
    for name, (med, least) in timed(fns, repeats=repeats, sync=False).items():
        res[name] = {"median_us": round(med, 2), "least_us": round(least, 2)}
        print(f"loader host µs per call, {name}: {med:.1f} (least {least:.1f})")
    return res


def takes_out(cls) -> bool:
    """Whether this package's ``Bundle.attention`` takes ``out=`` (a baseline may not)."""
    import inspect

    return "out" in inspect.signature(cls.attention).parameters


def kvcache_inputs(torch, device) -> dict:
    """A decode step of B8, 32 q heads over 8 kv heads, head_dim 128, 1024-key capacity: a paged
    bf16 cache (page 16), the same over fp8 e4m3 pages with per-kv-head descales, a dense cache."""
    b, hq, hkv, d, ps, mp = 8, 32, 8, 128, 16, 64
    g = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(b, 1, hq, d, dtype=torch.bfloat16, device=device, generator=g)
    kc = torch.randn(b * mp, ps, hkv, d, dtype=torch.bfloat16, device=device, generator=g)
    dense = torch.randn(b, mp * ps, hkv, d, dtype=torch.bfloat16, device=device, generator=g)
    q64 = torch.randn(b, 64, hq, d, dtype=torch.bfloat16, device=device, generator=g)
    return {"q": q, "q64": q64, "q64_8": q64.to(torch.float8_e4m3fn), "qd": torch.ones(hkv, device=device),
            "kc": kc, "vc": kc.clone(), "k8": kc.to(torch.float8_e4m3fn), "v8": kc.to(torch.float8_e4m3fn),
            "dense": dense, "bt": torch.randperm(b * mp, device=device, generator=g).to(torch.int32).view(b, mp),
            "lens": torch.randint(1, mp * ps, (b,), device=device, generator=g).to(torch.int32),
            "desc": torch.rand(hkv, device=device, generator=g) + 0.5}


def kvcache_rows(b, kv: dict) -> dict:
    """bundle.attention_kvcache rows over ``kvcache_inputs`` (the fp8 row only where the bundle
    has an fp8 variant; the chunked-prefill rows, bf16 q and e4m3 q, where it has e4m3-q builds)."""
    rows = {"attention_kvcache B8 H32/8 D128 paged 16": lambda: b.attention_kvcache(
                kv["q"], kv["kc"], kv["vc"], kv["lens"], block_table=kv["bt"]),
            "attention_kvcache B8 H32/8 D128 paged 16, return_lse": lambda: b.attention_kvcache(
                kv["q"], kv["kc"], kv["vc"], kv["lens"], block_table=kv["bt"], return_lse=True)[0],
            "attention_kvcache B8 H32/8 D128 dense cache": lambda: b.attention_kvcache(
                kv["q"], kv["dense"], kv["dense"], kv["lens"])}
    if any(e.get("kv_dtype") == "e4m3" for e in b.candidates("attention_kvcache")):
        rows["attention_kvcache B8 H32/8 D128 paged 16 fp8 (descales)"] = lambda: b.attention_kvcache(
            kv["q"], kv["k8"], kv["v8"], kv["lens"], block_table=kv["bt"], k_descale=kv["desc"],
            v_descale=kv["desc"])
    if any(e.get("dtype") == "e4m3" for e in b.candidates("attention_kvcache")):  # chunked prefill, Sq 64
        rows["attention_kvcache B8 Sq64 H32/8 D128 paged 16 bf16 q"] = lambda: b.attention_kvcache(
            kv["q64"], kv["kc"], kv["vc"], kv["lens"], block_table=kv["bt"])
        import inspect

        if "q_descale" in inspect.signature(type(b).attention_kvcache).parameters:  # (a baseline may not)
            rows["attention_kvcache B8 Sq64 H32/8 D128 paged 16 e4m3 q (q/k/v descales)"] = lambda: b.attention_kvcache(
                kv["q64_8"], kv["k8"], kv["v8"], kv["lens"], block_table=kv["bt"], q_descale=kv["qd"],
                k_descale=kv["desc"], v_descale=kv["desc"])
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--bundle", default="artifacts/default")
    p.add_argument("--host-only", action="store_true", help="the loader's Python cost, no GPU")
    p.add_argument("--quick", action="store_true", help="the per-op figures only, no breakdown")
    p.add_argument("--kvcache-only", action="store_true", help="on a GPU: bundle.attention_kvcache's rows only "
                   "(host µs per call; eager wall time of a long decode beside its graph replay)")
    p.add_argument("--attention-only", action="store_true", help="on a GPU: the reference attention problem "
                   "only (eager wall, host and graph replay beside SDPA; its hot path's breakdown): a bundle "
                   "without GEMM variants will do")
    p.add_argument("--split-only", action="store_true", help="on a GPU: the GEMM shapes the selection splits "
                   "along K (split-K workspaces): eager wall and graph replay per call, ours and the baseline's")
    p.add_argument("--baseline", help="a directory holding another copy of the package, timed alongside")
    p.add_argument("--baseline-bundle", help="the bundle the baseline package opens (default: --bundle; "
                   "--host-only and --kvcache-only), e.g. one built by that package where the kernels' "
                   "arguments differ")
    p.add_argument("--repeats", type=int, default=7, help="timings per row")
    p.add_argument("--json", help="write the figures here")
    a = p.parse_args()
    if a.host_only:
        res = host_only(a.bundle, a.repeats, a.baseline, a.baseline_bundle)
    elif a.kvcache_only:
        res = kvcache_gpu(a.bundle, a.baseline, a.repeats, a.baseline_bundle)
    elif a.split_only:
        res = split_gpu(a.bundle, a.baseline, a.repeats)
    elif a.attention_only:
        import torch

        b = Bundle.open(a.bundle)
        b0 = baseline_bundle_class(a.baseline).open(a.bundle) if a.baseline else None
        res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "attention_B1_H8_S512_D64": reference_attention(b, b0, repeats=max(a.repeats, 9)),
               "breakdown_us": attention_breakdown(b)}
    else:
        res = on_gpu(a.bundle, a.quick, a.baseline, a.repeats)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1) + "\n")
    return 0


SPLIT_SHAPES = [(64, 2112, 7168), (128, 2048, 768), (512, 3072, 5120), (2048, 2112, 7168), (3000, 5000, 7000),
                (1, 264, 1032)]


def _events_per_call(fn, calls: int, repeats: int, replay=None) -> float:
    """Median over ``repeats`` of the µs per call of ``calls`` back-to-back calls (CUDA events)."""
    import torch

    times = []
    for _ in range(repeats):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        e0.record()
        for _ in range(calls):
            fn()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) * 1e3 / calls * (replay or 1))
    return statistics.median(times)


def split_gpu(bundle: str, baseline: str | None = None, repeats: int = 7) -> dict:
    """bf16 GEMMs the selection runs as a split along K (the in-kernel fix-ups' workspaces), ours
    and the baseline package's (alternately, same cubins) and cuBLAS: host µs per call (no wait),
    eager wall per call of 50 back-to-back calls, and per call under graph replay (a graph of 10
    calls, replayed 10 times a timing)."""
    import torch

    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": {}}
    b = Bundle.open(bundle)
    b0 = baseline_bundle_class(baseline).open(bundle) if baseline else None
    for M, N, K in SPLIT_SHAPES:
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        calls = {"ours": lambda b=b: b.gemm(x, w, out), "cublas": lambda: torch.mm(x, w.t(), out=out)}
        if b0 is not None:
            calls["baseline"] = lambda: b0.gemm(x, w, out)
        for fn in calls.values():
            for _ in range(5):
                fn()
        torch.cuda.synchronize()
        err = (out.float() - x.float() @ w.float().t()).norm() / (x.float() @ w.float().t()).norm()
        name = next((v for k, v in b.selections.items() if k[2:5] == (M, N, K)), "")
        graphs = {}
        for n, fn in calls.items():
            g = torch.cuda.CUDAGraph()
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s), torch.cuda.graph(g, stream=s):
                for _ in range(10):
                    fn()
            torch.cuda.current_stream().wait_stream(s)
            graphs[n] = g
        row = {"variant": name, "rel_err": float(err)}
        for rnd in range(2):
            for n, fn in calls.items():
                row.setdefault(f"{n}_host_us", []).append(timed({n: fn}, calls=200, repeats=3, sync=True)[n][0])
                row.setdefault(f"{n}_eager_us", []).append(_events_per_call(fn, 50, repeats))
                row.setdefault(f"{n}_graph_us", []).append(
                    _events_per_call(graphs[n].replay, 10, repeats, replay=1 / 10))
        row = {k: (round(statistics.median(v), 2) if isinstance(v, list) else v) for k, v in row.items()}
        res["rows"][f"{M}x{N}x{K}"] = row
        print(f"{M}x{N}x{K}", row, flush=True)
    return res


def kvcache_gpu(bundle: str, baseline: str | None = None, repeats: int = 7, baseline_bundle: str | None = None) -> dict:
    """Host µs per call of the kvcache rows (ours and the baseline's, alternately), and for B1
    H32/8 D128 at a 32k context, page 16: eager wall time per call of 200 back-to-back calls by
    CUDA events (host time included where it exceeds the kernel's) beside graph replay."""
    import torch

    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    kv = kvcache_inputs(torch, "cuda")
    b = Bundle.open(bundle)
    b0 = baseline_bundle_class(baseline).open(baseline_bundle or bundle) if baseline else None
    fns = _pairs(kvcache_rows(b, kv), kvcache_rows(b0, kv) if b0 is not None else None)
    host = timed(fns, repeats=repeats)
    res["host_us_per_call"] = {k: round(v[0], 2) for k, v in host.items()}
    for k, v in res["host_us_per_call"].items():
        print(f"host µs per call, {k}: {v:.1f}")
    g = torch.Generator(device="cuda").manual_seed(1)
    ps, ctx, hq, hkv, d = 16, 32768, 32, 8, 128
    q = torch.randn(1, 1, hq, d, device="cuda", dtype=torch.bfloat16, generator=g)
    kc = torch.randn(ctx // ps, ps, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
    vc = torch.randn_like(kc)
    bt = torch.randperm(ctx // ps, device="cuda", generator=g).to(torch.int32).view(1, -1)
    lens = torch.full((1,), ctx, dtype=torch.int32, device="cuda")
    calls = {"ours": lambda: b.attention_kvcache(q, kc, vc, lens, block_table=bt)}
    if b0 is not None:
        calls["baseline"] = lambda: b0.attention_kvcache(q, kc, vc, lens, block_table=bt)
    for fn in calls.values():
        for _ in range(20):
            fn()
    torch.cuda.synchronize()
    wall = {n: [] for n in calls}
    for _ in range(repeats):
        for name, fn in calls.items():
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            e0.record()
            for _ in range(200):
                fn()
            e1.record()
            e1.synchronize()
            wall[name].append(e0.elapsed_time(e1) * 1e3 / 200)
    graph = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        calls["ours"]()
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(graph):
        for _ in range(20):
            calls["ours"]()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(10):
            graph.replay()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) * 1e3 / 200)
    res["B1_H32_8_D128_32k_page16"] = {**{f"{n}_eager_wall_us": round(statistics.median(v), 2)
                                          for n, v in wall.items()},
                                       "ours_graph_replay_us": round(statistics.median(times), 2)}
    print("B1 H32/8 D128 32k page 16, µs per call:", res["B1_H32_8_D128_32k_page16"])
    fp8 = "attention_kvcache B8 H32/8 D128 paged 16 fp8 (descales)"
    if fp8 in fns:  # the fp8 decode step of kvcache_inputs: eager wall per call and per call in a graph
        row = {}
        for name in [fp8] + ([fp8 + " [baseline]"] if fp8 + " [baseline]" in fns else []):
            graph = torch.cuda.CUDAGraph()
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                fns[name]()
            torch.cuda.current_stream().wait_stream(s)
            with torch.cuda.graph(graph):
                for _ in range(20):
                    fns[name]()
            tag = "baseline" if name.endswith("[baseline]") else "ours"
            row[f"{tag}_eager_wall_us"] = round(_events_per_call(fns[name], 200, repeats), 2)
            row[f"{tag}_graph_replay_us"] = round(_events_per_call(graph.replay, 10, repeats, replay=1 / 20), 2)
        res["B8_H32_8_D128_fp8_page16"] = row
        print("B8 H32/8 D128 fp8 page 16 (descales), µs per call:", row)
    return res


def on_gpu(bundle: str, quick: bool, baseline: str | None = None, repeats: int = 7) -> dict:
    import torch

    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    x = torch.randn(16, 64, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(16, 64, device="cuda", dtype=torch.bfloat16)
    x8, w8 = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
    one = torch.ones(1, device="cuda")
    w16 = torch.randn(256, 1024, device="cuda").to(torch.float8_e4m3fn)
    a16 = torch.randn(16, 1024, device="cuda").to(torch.float8_e4m3fn)
    o16 = torch.empty(16, 256, device="cuda", dtype=torch.bfloat16)
    q = torch.randn(1, 128, 8, 64, device="cuda", dtype=torch.bfloat16)
    sdpa_q = q.transpose(1, 2)
    F = torch.nn.functional
    kv = kvcache_inputs(torch, "cuda")

    def rows(b):
        p = b.pack_b(w16)
        return {"bundle.gemm(out=) bf16": lambda: b.gemm(x, w, out),
                "bundle.gemm() bf16": lambda: b.gemm(x, w),
                "bundle.gemm(out=, scales) fp8": lambda: b.gemm(x8, w8, out, scale_a=one, scale_b=one),
                "bundle.gemm(out=) fp8": lambda: b.gemm(x8, w8, out),
                "bundle.gemm packed fp8 (out=, scales)": lambda: b.gemm(a16, p, o16, scale_a=one, scale_b=one),
                "bundle.attention B1 S128 H8 D64 causal": lambda: b.attention(q, q, q, causal=True),
                **({("bundle." + k): f for k, f in kvcache_rows(b, kv).items()} if b.candidates("attention_kvcache")
                   else {})}

    b = Bundle.open(bundle)
    b0 = baseline_bundle_class(baseline).open(bundle) if baseline else None
    fns = _pairs(rows(b), rows(b0) if b0 is not None else None)
    fns.update({"torch.mm(out=) bf16": lambda: torch.mm(x, w.t(), out=out),
                "torch._scaled_mm fp8": lambda: torch._scaled_mm(x8, w8.t(), scale_a=one, scale_b=one,
                                                                 out_dtype=torch.bfloat16),
                "torch SDPA B1 S128 H8 D64 causal": lambda: F.scaled_dot_product_attention(sdpa_q, sdpa_q, sdpa_q,
                                                                                           is_causal=True)})
    host = timed(fns, repeats=repeats)
    res["host_us_per_call"] = {k: round(v[0], 2) for k, v in host.items()}
    for k, v in res["host_us_per_call"].items():
        print(f"host µs per call, {k}: {v:.1f}")
    res["attention_B1_H8_S512_D64"] = reference_attention(b, b0, repeats=max(repeats, 9))
    res["torch_ops_host_us_per_call"] = torch_ops_cost(b, x, w, out)
    if not quick:
        res["breakdown_us"] = breakdown(b, x, w, out)
    return res


def reference_attention(b, b0=None, calls: int = 1000, repeats: int = 9) -> dict:
    """The design's reference attention problem, B1 H8 S512 D64 bf16 (non-causal), ours (and the
    baseline's) beside torch SDPA (its default backend, on (B, H, S, D) views of the same
    tensors): eager wall time per call of ``calls`` back-to-back calls (CUDA events around them:
    host time included), the host's time per call (perf_counter over the same loop, without its
    final synchronisation), and the kernel's time per call under CUDA-graph replay (``calls``
    replays of a graph of 20 calls).  Medians of ``repeats``, the eager rows timed in turn."""
    import torch

    F = torch.nn.functional
    g = torch.Generator(device="cuda").manual_seed(1234)
    q, k, v = (torch.randn(1, 512, 8, 64, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, S, D) views for SDPA
    fns = {"ours": lambda: b.attention(q, k, v)}
    if b0 is not None:
        fns["baseline"] = lambda: b0.attention(q, k, v)
    fns["ours, return_lse=True"] = lambda: b.attention(q, k, v, return_lse=True)[0]
    if takes_out(type(b)):
        out = torch.empty_like(q)
        fns["ours, out="] = lambda: b.attention(q, k, v, out=out)
    fns["sdpa"] = lambda: F.scaled_dot_product_attention(qt, kt, vt)
    ref = F.scaled_dot_product_attention(qt.double(), kt.double(), vt.double()).transpose(1, 2)
    errs = {}
    for name, fn in fns.items():
        o = fn()
        o = o.transpose(1, 2) if name == "sdpa" else o
        errs[name] = float((o.double() - ref).norm() / ref.norm())
        assert errs[name] < 1e-2, (name, errs[name])

    for fn in fns.values():
        for _ in range(100):
            fn()
    torch.cuda.synchronize()
    wall = {n: [] for n in fns}
    host = {n: [] for n in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            e0.record()
            for _ in range(calls):
                fn()
            e1.record()
            host[name].append((time.perf_counter() - t0) / calls * 1e6)
            e1.synchronize()
            wall[name].append(e0.elapsed_time(e1) * 1e3 / calls)

    def replay(fn, per_graph: int = 20):
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(per_graph):
                fn()
        graph.replay()
        torch.cuda.synchronize()
        times = []
        for _ in range(repeats):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(calls // per_graph):
                graph.replay()
            e1.record()
            e1.synchronize()
            times.append(e0.elapsed_time(e1) * 1e3 / (calls // per_graph * per_graph))
        return statistics.median(times)

    from factory.benchmark import time_eager

    res = {}
    for name, fn in fns.items():
        res[name] = {"eager_wall_us": round(statistics.median(wall[name]), 2),
                     "host_us": round(statistics.median(host[name]), 2),
                     "graph_replay_us": round(replay(fn), 2), "rel_err_vs_f64": float(f"{errs[name]:.3g}")}
    for name, fn in fns.items():  # (the bench's eager column: events around one call, then a sync)
        res[name]["synchronised_call_us"] = round(time_eager(lambda _i, fn=fn: fn(), 1, iters=400) * 1e6, 2)
    print("attention B1 H8 S512 D64 bf16, µs per call (eager wall by CUDA events / host issue / graph replay / "
          "one synchronised call): "
          + "; ".join(f"{n} {r['eager_wall_us']:.1f} / {r['host_us']:.1f} / {r['graph_replay_us']:.2f} / "
                      f"{r['synchronised_call_us']:.1f}" for n, r in res.items()))
    return res


def torch_ops_cost(b, x, w, out) -> dict:
    """torch.ops.kernel_factory.gemm_out (torch.library define + impl) beside the same call
    registered with the @torch.library.custom_op decorator, bundle.gemm and torch.mm."""
    import torch

    kf = b.torch_ops()

    @torch.library.custom_op("kf_overhead::gemm_out", mutates_args=("out",),
                             schema="(Tensor a, Tensor w, Tensor(a!) out) -> ()")
    def deco(a, w, out):
        b.gemm(a, w, out)

    rows = {"torch.ops.kernel_factory.gemm_out (define+impl)": lambda: kf.gemm_out(x, w, out),
            "the same through @custom_op": lambda: deco(x, w, out),
            "bundle.gemm(out=)": lambda: b.gemm(x, w, out),
            "torch.mm(out=)": lambda: torch.mm(x, w.t(), out=out)}
    res = {k: round(v[0], 2) for k, v in timed(rows).items()}
    print("; ".join(f"{k} {v:.1f}" for k, v in res.items()) + " (host µs per call)")
    return res


def breakdown(b, x, w, out) -> dict:
    """Where an eager launch's host time goes: :func:`attention_breakdown`; for a GEMM, the
    native launcher alone and through ``Bundle.launch``, for the variant the loader picks (sm_90a:
    TMA descriptors are encoded by the launcher on every call) and for an sm_90 (mma.sync, no
    TMA) variant."""
    import torch

    from factory.runtime.bundle import current_stream
    from factory.runtime.gemm import fitting_variants, launch_scalars, rkl_spec, select

    res = attention_breakdown(b)
    stream = current_stream()
    specs = [rkl_spec(t, n) for t, n in ((x, "a"), (w, "b"), (out, "c"))]
    picks = {"picked": select(b, *specs, "bf16", "bf16", [])}
    fits = [v for v in b.candidates("gemm") if v["target"] == "sm_90"]
    if fits:
        b.candidates = lambda op: fits  # noqa: E731 - the sm_90 (portability) variants only
        try:
            picks["sm_90 mma.sync"] = fitting_variants(b, *specs, "bf16", "bf16", [])[0][0]["name"]
        except Exception:  # noqa: BLE001 - none fits: skip the row
            pass
        finally:
            del b.candidates  # the class's method again
    assert stream == torch.cuda.current_stream().cuda_stream
    for what, name in picks.items():
        entry = b.manifest["variants"][name]
        args = [*specs, *launch_scalars(b, entry)]
        fn = b.lib.launcher(name)
        argv, _buf = b.binder(name).bind(args, stream, torch.cuda.current_device())
        native = per_call_us(lambda: fn(argv))
        via = per_call_us(lambda: b.launch(name, args, checked=True))
        res[f"gemm {what} {name}"] = {"native launcher": round(native, 2), "Bundle.launch": round(via, 2)}
        print(f"gemm {what} ({name}): native launcher {native:.1f} µs, Bundle.launch {via:.1f} µs")
    return res


def attention_breakdown(b) -> dict:
    """For the reference attention problem, each step of the hot path alone (the problem key and
    its lookup, the output allocations, the device and stream queries, the pointer writes plus
    the native launch, the native launcher alone on arguments packed once) beside the whole
    call (with and without ``return_lse``)."""
    import torch

    from factory.runtime.bundle import current_stream

    res = {}
    q, k, v = (torch.randn(1, 512, 8, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    b.hot_attention.clear()
    o, lse = b.attention(q, k, v, return_lse=True)
    ((cached, plan),) = b.hot_attention.items()  # (the launch plans of this key)

    def key():  # (api.Bundle.attention's key; checked equal to the cached one below)
        return (type(q), type(k), type(v), q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(),
                q.dtype, k.dtype, v.dtype, q.get_device(), k.get_device(), v.get_device(), False, None, None)

    assert key() == cached, "the breakdown's key is not Bundle.attention's"
    go = plan[1].fixed.go
    lproto = torch.empty(1, device="cuda").expand(lse.shape)
    stream = current_stream()
    name = plan[1].fixed.name
    argv, _buf = b.binder(name).bind([q, k, v, o, lse, 0.125], stream, 0)
    native = b.lib.launcher(name)
    out = torch.empty_like(q)
    steps = {"whole bundle.attention": lambda: b.attention(q, k, v),
             "whole bundle.attention(out=)": lambda: b.attention(q, k, v, out=out),
             "whole bundle.attention(return_lse=True)": lambda: b.attention(q, k, v, return_lse=True),
             "the plan alone (o allocated, LSE to scratch)": lambda: plan[0](q, k, v, None),
             "key + lookup": lambda: b.hot_attention.get(key()),
             "empty_like(q) + empty_like(lse view)": lambda: (torch.empty_like(q), torch.empty_like(lproto)),
             "empty_like(q)": lambda: torch.empty_like(q),
             "torch.empty((1, 8, 512), float32, device)": lambda: torch.empty((1, 8, 512), dtype=torch.float32,
                                                                             device=q.device),
             "current device + raw stream": lambda: b._raw(b._cur()),
             "5 data_ptr() calls": lambda: (q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr()),
             "go: pointers written + native launch": lambda: go(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(),
                                                                lse.data_ptr(), stream),
             "native launcher alone": lambda: native(argv)}
    # (200 calls between synchronisations: launches queue up without the host waiting for the GPU,
    # which runs each kernel for longer than the native launcher alone takes to issue it)
    t = timed(steps, calls=200, repeats=25)
    res["attention B1 H8 S512 D64 " + name] = {k: round(m, 2) for k, (m, _) in t.items()}
    for k_, (m, _) in t.items():
        print(f"attention hot path, {k_}: {m:.2f} µs")
    return res


if __name__ == "__main__":
    sys.exit(main())
