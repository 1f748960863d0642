#!/usr/bin/env python3
"""Probe: the DSL's TVM-FFI entry point against our C ABI, on one sm_90a GEMM variant.

Question (issue 15): what would exporting variants with ``--enable-tvm-ffi`` buy or cost against the
bundle's C ABI (``fx_launch_<name>`` through ctypes): host cost per call, cold start, dependencies,
code we could delete?
Answer (H100, 2026-11-25; notes/runtime.md, "TVM-FFI"): per call 4.1-4.3 µs with the argument
views made once (our native launcher 4.1-4.9, bundle.gemm(out=) 11.1-13.0, torch.mm 13.2-14.3);
18-21 µs when the (M, K, L) views are made per call; cold: 3.3 ms to dlopen the DSL runtime, 0.5 ms
load_module, 0.7 ms first call. Its C-side checks name the argument (a CPU tensor, bad strides).
But the export needs ``CuteDSLRT_TVMFFISetRaisedCudaError`` from the DSL's 43.6 MB shared runtime
and ``libtvm_ffi.so`` at run time. The decision is in the note.

    python3 notes/probes/probe_tvm_ffi.py build OUT_DIR     # here (DSL + apache-tvm-ffi installed)
    python3 notes/probes/probe_tvm_ffi.py measure OUT_DIR   # on the GPU (apache-tvm-ffi installed)

OUT_DIR then holds libg_tvm.so, a copy of libcute_dsl_runtime.so and a one-variant bundle ``b``.
"""

from __future__ import annotations

import ctypes
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

NAME = "gemm_sm90a_bf16_obf16_ak_bk_t128x128x64_c1x1_coop_rm_sw1_sk1_pdl"


def build(out: Path) -> None:
    import shutil

    from factory.compiler import toolchain
    from factory.compiler.builder import build as build_bundle
    from factory.compiler.compile import fake_args, init_worker
    from factory.registry import enumerate_variants

    out.mkdir(parents=True, exist_ok=True)
    init_worker("sm_90a")
    import cuda.bindings.driver as cuda
    import cutlass.cute as cute
    import tvm_ffi

    v = next(x for x in enumerate_variants(["sm_90a"], ["gemm"]) if x.name == NAME)
    compiled = cute.compile(v.make_kernel(), *fake_args(v.signature()), cuda.CUstream(0),
                            options="--gpu-arch sm_90a --enable-tvm-ffi")
    compiled.export_to_c(str(out / "g.o"), function_name="g", export_only_tvm_ffi_symbols=True)
    cu, tdir = toolchain.cuda_root(), Path(tvm_ffi.__file__).parent
    subprocess.run([toolchain.cc(), "-O2", "-fPIC", "-shared", "-o", str(out / "libg_tvm.so"), str(out / "g.o"),
                    "-Wl,--exclude-libs,ALL", "-Wl,--whole-archive", str(toolchain.dsl_runtime_static()),
                    "-Wl,--no-whole-archive", str(cu / "lib" / "libcudart_static.a"), f"-L{tdir / 'lib'}",
                    "-ltvm_ffi", "-lpthread", "-ldl", "-lrt"], check=True)
    shutil.copy(toolchain.dsl_runtime_static().parent / "libcute_dsl_runtime.so", out)
    build_bundle(out / "b", ["sm_90a"], ["gemm"], name_filter=NAME)


def per_call_us(fn, n: int = 3000, reps: int = 7) -> float:
    import torch

    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        out.append((time.perf_counter() - t0) / n * 1e6)
        torch.cuda.synchronize()
    return statistics.median(out)


def measure(here: Path) -> None:
    t0 = time.perf_counter()
    ctypes.CDLL(str(here / "libcute_dsl_runtime.so"), mode=ctypes.RTLD_GLOBAL)  # CuteDSLRT_TVMFFI* lives here
    t_rt = time.perf_counter() - t0
    import torch

    torch.empty(1, device="cuda")
    torch.cuda.synchronize()
    import tvm_ffi

    from factory.runtime import Bundle
    from factory.runtime.gemm import launch_scalars, rkl_spec

    a = torch.randn(16, 64, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(16, 64, device="cuda", dtype=torch.bfloat16)
    ref = a.float() @ w.float().T

    def rkl(t):
        return t.unsqueeze(0).permute(1, 2, 0)

    t0 = time.perf_counter()
    f = tvm_ffi.load_module(str(here / "libg_tvm.so"))["g"]
    t_load = time.perf_counter() - t0
    stream = torch.cuda.current_stream().cuda_stream
    t0 = time.perf_counter()
    f(rkl(a), rkl(w), rkl(c), 132, stream)
    torch.cuda.synchronize()
    t_first = time.perf_counter() - t0
    print(f"tvm-ffi rel err {float((c.float() - ref).norm() / ref.norm()):.2e}; DSL runtime dlopen {t_rt * 1e3:.1f} ms, "
          f"load_module {t_load * 1e3:.1f} ms, first call {t_first * 1e3:.1f} ms")
    for what, bad in (("a bad out", (rkl(a), rkl(w), rkl(c.t().contiguous().t()))),
                      ("a CPU tensor", (rkl(a.cpu()), rkl(w), rkl(c)))):
        try:
            f(*bad, 132, stream)
        except Exception as e:  # noqa: BLE001 - what it says is the finding
            print(f"tvm-ffi on {what}: {type(e).__name__}: {str(e)[:160]}")
    t0 = time.perf_counter()
    b = Bundle.open(here / "b")
    b.gemm(a, w, c)
    torch.cuda.synchronize()
    print(f"ours: open + first call {(time.perf_counter() - t0) * 1e3:.1f} ms")
    argv, _buf = b.binder(NAME).bind([rkl_spec(t, "x") for t in (a, w, c)] + launch_scalars(b, b.manifest["variants"][NAME]),
                                      stream, 0)
    native = b.lib.launcher(NAME)
    A, W, C = rkl(a), rkl(w), rkl(c)
    rows = {"ours bundle.gemm(out=)": lambda: b.gemm(a, w, c),
            "ours native launcher (args packed once)": lambda: native(argv),
            "torch.mm(out=)": lambda: torch.mm(a, w.t(), out=c),
            "tvm-ffi, views made once": lambda: f(A, W, C, 132, stream),
            "tvm-ffi, views made per call": lambda: f(rkl(a), rkl(w), rkl(c), 132, stream)}
    for _ in range(2):
        print("; ".join(f"{k} {per_call_us(fn):.2f}" for k, fn in rows.items()), "(host µs per call)")


if __name__ == "__main__":
    {"build": build, "measure": measure}[sys.argv[1]](Path(sys.argv[2]))
