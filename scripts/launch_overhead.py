#!/usr/bin/env python3
"""Host cost of one launch through the bundle (selection-cache hit) beside torch.mm, on a problem
so small that the GPU never holds the host back: the number an eager inference server pays.

``--host-only`` (no GPU needed): the loader's own Python cost per ``bundle.gemm`` /
``bundle.attention`` — hot-path hit, checks, argument packing, output allocation — with CPU
tensors, a planned H100 and every launcher replaced by a C function that returns at once (built
with the system C compiler); the native launcher's own cost (the CUDA launch) is not in it.  Each
row: the median and the least of ``--repeats`` timings of 2000 calls (the least is the steadier
figure on a shared machine).

On a GPU, also the design's reference attention problem (B1 H8 S512 D64 bf16) as an eager call
beside torch SDPA in the same run: wall time per call of back-to-back calls (CUDA events around
1000 calls, host time included: the queue is never filled ahead), the host's time per call alone,
and each kernel's time under CUDA-graph replay.  ``--json PATH`` writes every figure."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from factory.runtime import Bundle  # noqa: E402


def per_call_us(fn, calls: int = 2000, repeats: int = 7, sync: bool = True, least: bool = False) -> float:
    import torch

    fn()
    if sync:
        torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - t0) / calls * 1e6)
        if sync:
            torch.cuda.synchronize()
    return (statistics.median(samples), min(samples)) if least else statistics.median(samples)


def host_only(bundle_path: str, repeats: int) -> dict:
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

    b = Bundle.open(bundle_path, capability=(9, 0), device={"name": "planned H100", "sm_count": 132})
    b.simulate(NoLaunch())  # CPU tensors as device -1, stream 0
    x = torch.randn(16, 64, dtype=torch.bfloat16)
    w = torch.randn(64, 64, dtype=torch.bfloat16)
    out = torch.empty(16, 64, dtype=torch.bfloat16)
    x8, w8 = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
    one = torch.ones(1)
    p = b.pack_b(torch.randn(256, 1024).to(torch.float8_e4m3fn))
    a16, o16 = torch.randn(16, 1024).to(torch.float8_e4m3fn), torch.empty(16, 256, dtype=torch.bfloat16)
    q = torch.randn(1, 128, 8, 64, dtype=torch.bfloat16)
    r = [torch.randn(1, 512, 8, 64, dtype=torch.bfloat16) for _ in range(3)]
    rows = {"bf16 gemm(out=)": lambda: b.gemm(x, w, out),
            "bf16 gemm()": lambda: b.gemm(x, w),
            "fp8 gemm(out=, scales)": lambda: b.gemm(x8, w8, out, scale_a=one, scale_b=one),
            "fp8 gemm(out=)": lambda: b.gemm(x8, w8, out),
            "packed fp8 gemm(out=, scales)": lambda: b.gemm(a16, p, o16, scale_a=one, scale_b=one),
            "attention B1 S128 H8 D64 causal": lambda: b.attention(q, q, q, causal=True),
            "attention B1 H8 S512 D64": lambda: b.attention(*r),
            "ctypes call of the no-op launcher": lambda: noop(0)}
    res = {}
    for name, fn in rows.items():
        med, least = per_call_us(fn, sync=False, repeats=repeats, least=True)
        res[name] = {"median_us": round(med, 2), "least_us": round(least, 2)}
        print(f"loader host µs per call, {name}: {med:.1f} (least {least:.1f})")
    return res


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--bundle", default="artifacts/default")
    p.add_argument("--host-only", action="store_true", help="the loader's Python cost, no GPU")
    p.add_argument("--quick", action="store_true", help="the per-op figures only, no breakdown")
    p.add_argument("--repeats", type=int, default=7, help="timings per host-only row")
    p.add_argument("--json", help="write the figures here")
    a = p.parse_args()
    res = host_only(a.bundle, a.repeats) if a.host_only else on_gpu(a.bundle, a.quick)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1) + "\n")
    return 0


def on_gpu(bundle: str, quick: bool) -> dict:
    import torch

    b = Bundle.open(bundle)
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    x = torch.randn(16, 64, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(16, 64, device="cuda", dtype=torch.bfloat16)
    ours = per_call_us(lambda: b.gemm(x, w, out))
    ours_alloc = per_call_us(lambda: b.gemm(x, w))
    ref = per_call_us(lambda: torch.mm(x, w.t(), out=out))
    print(f"host µs per call: bundle.gemm(out=) {ours:.1f}, bundle.gemm() {ours_alloc:.1f}, torch.mm(out=) {ref:.1f}")
    x8, w8 = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
    one = torch.ones(1, device="cuda")
    f8 = per_call_us(lambda: b.gemm(x8, w8, out, scale_a=one, scale_b=one))
    f8_unit = per_call_us(lambda: b.gemm(x8, w8, out))
    f8_ref = per_call_us(lambda: torch._scaled_mm(x8, w8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
    print(f"fp8: bundle.gemm(out=, scales) {f8:.1f}, bundle.gemm(out=) {f8_unit:.1f}, "
          f"torch._scaled_mm {f8_ref:.1f}")
    p = b.pack_b(torch.randn(256, 1024, device="cuda").to(torch.float8_e4m3fn))
    a16 = torch.randn(16, 1024, device="cuda").to(torch.float8_e4m3fn)
    o16 = torch.empty(16, 256, device="cuda", dtype=torch.bfloat16)
    packed = per_call_us(lambda: b.gemm(a16, p, o16, scale_a=one, scale_b=one))
    q = torch.randn(1, 128, 8, 64, device="cuda", dtype=torch.bfloat16)
    att = per_call_us(lambda: b.attention(q, q, q, causal=True))
    sdpa_q = q.transpose(1, 2)
    sdpa = per_call_us(lambda: torch.nn.functional.scaled_dot_product_attention(sdpa_q, sdpa_q, sdpa_q, is_causal=True))
    print(f"packed fp8 decode bundle.gemm(out=, scales) {packed:.1f}; bundle.attention B1 S128 H8 D64 causal {att:.1f}, "
          f"torch SDPA {sdpa:.1f}")
    res["host_us_per_call"] = {k: round(v, 2) for k, v in (
        ("bundle.gemm(out=) bf16", ours), ("bundle.gemm() bf16", ours_alloc), ("torch.mm(out=) bf16", ref),
        ("bundle.gemm(out=, scales) fp8", f8), ("bundle.gemm(out=) fp8", f8_unit), ("torch._scaled_mm fp8", f8_ref),
        ("bundle.gemm packed fp8 (out=, scales)", packed), ("bundle.attention B1 S128 H8 D64 causal", att),
        ("torch SDPA B1 S128 H8 D64 causal", sdpa))}
    res["attention_B1_H8_S512_D64"] = reference_attention(b)
    res["torch_ops_host_us_per_call"] = torch_ops_cost(b, x, w, out)
    if not quick:
        breakdown(b, x, w, out)
    return res


def reference_attention(b, calls: int = 1000, repeats: int = 9) -> dict:
    """The design's reference attention problem, B1 H8 S512 D64 bf16 (non-causal), ours beside
    torch SDPA (its default backend, on (B, H, S, D) views of the same tensors): eager wall time
    per call of ``calls`` back-to-back calls (CUDA events around them: host time included, as
    the GPU waits for each launch), the host's time per call (perf_counter over the same loop,
    without its final synchronisation), and the kernel's time per call under CUDA-graph replay
    (``calls`` replays of a graph of 20 calls).  Medians of ``repeats``."""
    import torch

    F = torch.nn.functional
    g = torch.Generator(device="cuda").manual_seed(1234)
    q, k, v = (torch.randn(1, 512, 8, 64, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, S, D) views for SDPA
    ours = lambda: b.attention(q, k, v)  # noqa: E731
    sdpa = lambda: F.scaled_dot_product_attention(qt, kt, vt)  # noqa: E731
    o = ours()
    ref = F.scaled_dot_product_attention(qt.double(), kt.double(), vt.double()).transpose(1, 2)
    err = float((o.double() - ref).norm() / ref.norm())
    assert err < 1e-2, err

    def eager(fn):
        for _ in range(100):
            fn()
        torch.cuda.synchronize()
        wall, host = [], []
        for _ in range(repeats):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            e0.record()
            for _ in range(calls):
                fn()
            e1.record()
            host.append((time.perf_counter() - t0) / calls * 1e6)
            e1.synchronize()
            wall.append(e0.elapsed_time(e1) * 1e3 / calls)
        return statistics.median(wall), statistics.median(host)

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

    res = {"rel_err_vs_f64": float(f"{err:.3g}")}
    for name, fn in (("ours", ours), ("sdpa", sdpa), ("ours_again", ours), ("sdpa_again", sdpa)):
        wall, host = eager(fn)
        res[name] = {"eager_wall_us": round(wall, 2), "host_us": round(host, 2)}
    for name, fn in (("ours", ours), ("sdpa", sdpa)):
        res[name]["graph_replay_us"] = round(replay(fn), 2)
    print(f"attention B1 H8 S512 D64 bf16, µs per call (eager wall by CUDA events / host issue / graph replay): "
          + "; ".join(f"{n} {r['eager_wall_us']:.1f} / {r['host_us']:.1f}" + (f" / {r['graph_replay_us']:.2f}"
                                                                         if "graph_replay_us" in r else "")
                      for n, r in res.items() if isinstance(r, dict)) + f"; rel. error {err:.2e}")
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
    res = {k: round(per_call_us(fn), 2) for k, fn in rows.items()}
    print("; ".join(f"{k} {v:.1f}" for k, v in res.items()) + " (host µs per call)")
    return res


def breakdown(b, x, w, out) -> None:
    """Where an eager launch's host time goes: the native launcher alone (an argument array
    packed once, called again and again), the same through ``Bundle.launch``, for the variant the
    loader picks (sm_90a: TMA descriptors are encoded by the launcher on every call) and for an
    sm_90 (mma.sync, no TMA) variant of the same problem."""
    import torch

    from factory.runtime.gemm import fitting_variants, launch_scalars, rkl_spec, select

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
    from factory.runtime.bundle import current_stream

    stream = current_stream()
    assert stream == torch.cuda.current_stream().cuda_stream
    old = per_call_us(lambda: torch.cuda.current_stream().cuda_stream)
    new = per_call_us(lambda: current_stream())
    print(f"current stream: torch.cuda.current_stream().cuda_stream {old:.2f} µs, the raw handle {new:.2f} µs")
    shape = (x.shape[0], w.shape[0])
    e1 = per_call_us(lambda: torch.empty(shape, dtype=x.dtype, device=x.device))
    e2 = per_call_us(lambda: x.new_empty(shape))
    print(f"output allocation: torch.empty(device=a.device) {e1:.2f} µs, a.new_empty {e2:.2f} µs")
    for what, name in picks.items():
        entry = b.manifest["variants"][name]
        args = [*specs, *launch_scalars(b, entry)]
        fn = b.lib.launcher(name)
        argv, _buf = b.binder(name).bind(args, stream, torch.cuda.current_device())
        native = per_call_us(lambda: fn(argv))
        via = per_call_us(lambda: b.launch(name, args, checked=True))
        print(f"{what} ({name}): native launcher {native:.1f} µs, Bundle.launch {via:.1f} µs")


if __name__ == "__main__":
    sys.exit(main())
