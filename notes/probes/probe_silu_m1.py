"""gate_up (M x 28672 x 4096, bf16) + SiLU(gate)·up at decode M: the plain GEMM's decode tiles
beside the silu_mul epilogue's tiles, each by name, same run (graph replays, interleaved passes).

    python3 notes/probes/probe_silu_m1.py build OUT              # CPU: a bundle of just these variants
    python3 notes/probes/probe_silu_m1.py run BUNDLE [--m 1 16]  # GPU: the table (JSON lines)
    ncu --profile-from-start off --clock-control none --metrics M \\
        python3 notes/probes/probe_silu_m1.py run BUNDLE --ncu    # one call of each at M = 1

``build`` compiles variants that no tier lists (the silu_mul candidates for M = 1) by handing the
builder this list instead of a tier's enumeration.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

BF = dict(ab="bf16", c="bf16", pdl=True)
PLAIN = (dict(tile=(16, 64, 128), schedule="ws", swap_ab=True, deep=True),
         dict(tile=(16, 64, 128), schedule="ws", swap_ab=True),
         dict(tile=(64, 128, 64), schedule="ws"))
SILU = (dict(tile=(64, 128, 64), schedule="ws"), dict(tile=(64, 128, 64), schedule="pp"),
        dict(tile=(64, 256, 64), schedule="ws"), dict(tile=(64, 256, 64), schedule="pp"),
        dict(tile=(128, 128, 64), schedule="ws"), dict(tile=(128, 128, 64)))
K, N_OUT = 4096, 14336


def variants():
    from factory.gemm.sm90 import GemmSm90

    out = [GemmSm90(target="sm_90a", **BF, **d) for d in PLAIN]
    out += [GemmSm90(target="sm_90a", **BF, **d, silu_mul=True) for d in SILU]
    return [v for v in out if v.can_implement() is None]


def build(out: str) -> None:
    from factory.compiler import builder

    vs = variants()
    builder.enumerate_variants = lambda *a, **k: vs
    print(builder.build(out, ["sm_90a"], ["gemm"], jobs=1))


def run(bundle_dir: str, ms, ncu: bool) -> None:
    import torch
    import torch.nn.functional as F

    from factory.benchmark import time_interleaved
    from factory.runtime import Bundle
    from factory.runtime.epilogue import pack_gate_up

    b = Bundle.open(bundle_dir)
    names = sorted(n for n, e in b.manifest["variants"].items() if e.get("op") == "gemm")
    plain = [n for n in names if "silumul" not in n]
    silu = [n for n in names if "silumul" in n]
    bf = dict(device="cuda", dtype=torch.bfloat16)
    n_sets = 2  # 2 x 235 MB of weights: no L2 reuse between calls
    ws = [torch.randn(2 * N_OUT, K, **bf) / K ** 0.5 for _ in range(n_sets)]
    wp = [pack_gate_up(w) for w in ws]
    for M in ([1] if ncu else ms):
        xs = [torch.randn(M, K, **bf) for _ in range(n_sets)]
        ys = [torch.empty(M, 2 * N_OUT, **bf) for _ in range(n_sets)]
        os_ = [torch.full((M, N_OUT), float("nan"), **bf) for _ in range(n_sets)]
        calls = {}
        for n in plain:
            calls["plain@" + n] = lambda i, n=n: b.gemm(xs[i], ws[i], ys[i], variant=n)

            def plus(i, n=n):
                b.gemm(xs[i], ws[i], ys[i], variant=n)
                torch.mul(F.silu(ys[i][:, :N_OUT]), ys[i][:, N_OUT:], out=os_[i])
            calls["plain+silu@" + n] = plus
        for n in silu:
            calls["silu@" + n] = lambda i, n=n: b.gemm(xs[i], wp[i], os_[i], activation="silu_mul", variant=n)
        # correctness of every silu tile against float32 first
        ref = [F.silu((xs[i].float() @ ws[i].float().t())[:, :N_OUT]) * (xs[i].float() @ ws[i].float().t())[:, N_OUT:]
               for i in range(n_sets)]
        for n in silu:
            for i in range(n_sets):
                os_[i].fill_(float("nan"))
                calls["silu@" + n](i)
                err = ((os_[i].float() - ref[i]).norm() / ref[i].norm()).item()
                assert err < 1e-2, (n, M, err)
        if ncu:
            torch.cuda.synchronize()
            torch.cuda.profiler.start()
            for k, fn in calls.items():
                if not k.startswith("plain+"):
                    fn(0)
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
            print("profiled, in order:", [k for k in calls if not k.startswith("plain+")])
            return
        t = time_interleaved(calls, n_sets, rounds=5, budget_s=0.05, warm_s=0.1)
        row = {"M": M, **{k: round(v * 1e6, 2) for k, v in t.items()}}
        print(json.dumps(row), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", choices=("build", "run"))
    ap.add_argument("path")
    ap.add_argument("--m", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--ncu", action="store_true")
    a = ap.parse_args()
    build(a.path) if a.cmd == "build" else run(a.path, a.m, a.ncu)


if __name__ == "__main__":
    main()
