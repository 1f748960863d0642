#!/usr/bin/env python3
"""Cold start: from ``Bundle.open`` to the first correct GEMM and the first correct attention, in a
fresh process with torch imported and its CUDA context already up (not counted), split into parts:
open (manifest + host-library sha256), the first call's selection, module load and launch.
Each measurement runs in its own fresh process (``--runs`` of them; medians).

``--jit`` (on a machine with the DSL, no GPU needed): the time the DSL takes to compile the same
GEMM variant, for comparison with loading it.

    python3 scripts/cold_start.py --bundle artifacts/default [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time
import torch
torch.cuda.init(); torch.empty(1, device="cuda"); torch.cuda.synchronize()   # context up: not counted
a = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16)
w = torch.randn(768, 1024, device="cuda", dtype=torch.bfloat16)
q = torch.randn(1, 512, 8, 64, device="cuda", dtype=torch.bfloat16)
ref_c = a.float() @ w.float().T
ref_o = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2).float(), q.transpose(1, 2).float(),
                                                         q.transpose(1, 2).float(), is_causal=True).transpose(1, 2)
torch.cuda.synchronize()
t = {}
t0 = time.perf_counter()
import factory.runtime as rt
t["import factory.runtime"] = time.perf_counter() - t0
s = time.perf_counter()
b = rt.Bundle.open(sys.argv[1])
t["Bundle.open"] = time.perf_counter() - s
s = time.perf_counter()
b.lib
t["host library dlopen"] = time.perf_counter() - s
s = time.perf_counter()
c = b.gemm(a, w); torch.cuda.synchronize()
t["first gemm"] = time.perf_counter() - s
t["open to first gemm"] = time.perf_counter() - t0
s = time.perf_counter()
o = b.attention(q, q, q, causal=True); torch.cuda.synchronize()
t["first attention"] = time.perf_counter() - s
t["open to first attention"] = time.perf_counter() - t0
err_c = float((c.float() - ref_c).norm() / ref_c.norm())
err_o = float((o.float() - ref_o).norm() / ref_o.norm())
assert err_c < 1e-2 and err_o < 2e-2, (err_c, err_o)
print(json.dumps({k: round(v * 1e3, 2) for k, v in t.items()}))
"""


# The first call of each op taken apart (same problems as CHILD): the host library's selection,
# the variant's file checks (sizes, sha256), its module load (fx_load_<name>: the cubin onto the
# device), the first launch (with a synchronisation), then a second call.  With ``--profile``, a
# cProfile of the first attention call goes to stderr.
BREAKDOWN = r"""
import hashlib, json, os, sys, time
import torch
torch.cuda.init(); torch.empty(1, device="cuda"); torch.cuda.synchronize()
a = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16)
w = torch.randn(768, 1024, device="cuda", dtype=torch.bfloat16)
q = torch.randn(1, 512, 8, 64, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
t = {}
def clock(key, fn):
    s = time.perf_counter(); r = fn(); t[key] = time.perf_counter() - s; return r
t0 = time.perf_counter()
import factory.runtime as rt
from factory.runtime import attention as att, gemm as gm
from factory.runtime.manifest import variant_problems
t["import"] = time.perf_counter() - t0
b = clock("Bundle.open", lambda: rt.Bundle.open(sys.argv[1]))
clock("host library dlopen", lambda: b.lib)
clock("selector (library tables)", lambda: b.selector)
clock("first gemm", lambda: (b.gemm(a, w), torch.cuda.synchronize()))
name, splits = clock("attention: select", lambda: att._choose(b, "bf16", 64, True, False, 8 * 512, (1, 8, 8, 512, 512)))
e = b.manifest["variants"][name]
t["attention variant"] = name
t["attention cubin bytes"] = e["files"]["cubin"]["bytes"]
clock("attention: file checks", lambda: variant_problems(b.path, name, e))
clock("attention: module load", lambda: b.lib.launcher(name))
if os.environ.get("PROFILE_FIRST_ATTENTION"):
    import cProfile, pstats, io
    pr = cProfile.Profile(); pr.enable()
clock("attention: first call (loaded)", lambda: (b.attention(q, q, q, causal=True), torch.cuda.synchronize()))
if os.environ.get("PROFILE_FIRST_ATTENTION"):
    pr.disable(); st = io.StringIO(); pstats.Stats(pr, stream=st).sort_stats("cumulative").print_stats(18)
    print(st.getvalue(), file=sys.stderr)
clock("attention: second call", lambda: (b.attention(q, q, q, causal=True), torch.cuda.synchronize()))
print(json.dumps({k: (round(v * 1e3, 2) if isinstance(v, float) else v) for k, v in t.items()}))
"""


def jit_compile_ms(bundle: Path) -> dict:
    """The DSL compiling the GEMM variant the first GEMM above selects on an H100 (cute.compile +
    export), timed here."""
    import time

    from factory.compiler.compile import compile_variant, init_worker
    from factory.registry import enumerate_variants

    m = json.loads((bundle / "manifest.json").read_text())
    name = next(n for n, v in m["variants"].items() if v["op"] == "gemm" and v["target"] == "sm_90a")
    s = time.perf_counter()
    init_worker("sm_90a")  # imports the DSL
    imported = time.perf_counter() - s
    v = next(x for x in enumerate_variants(["sm_90a"], ["gemm"]) if x.name == name)
    import tempfile

    s = time.perf_counter()
    compile_variant(v, Path(tempfile.mkdtemp()))
    return {"variant": name, "DSL import ms": round(imported * 1e3, 1),
            "DSL compile + export ms": round((time.perf_counter() - s) * 1e3, 1)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--bundle", default=str(ROOT / "artifacts" / "default"))
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--jit", action="store_true")
    p.add_argument("--breakdown", action="store_true", help="the first attention taken apart (see BREAKDOWN)")
    p.add_argument("--installed", action="store_true",
                   help="run the installed kernel-factory (no PYTHONPATH to this checkout)")
    a = p.parse_args()
    if a.jit:
        print(json.dumps(jit_compile_ms(Path(a.bundle))))
        return 0
    env = {**os.environ} if a.installed else {**os.environ, "PYTHONPATH": str(ROOT)}
    runs = []
    for _ in range(a.runs):
        r = subprocess.run([sys.executable, "-c", BREAKDOWN if a.breakdown else CHILD, a.bundle], env=env,
                           capture_output=True, text=True, cwd="/" if a.installed else ROOT)
        if r.returncode:
            print(r.stdout, r.stderr, file=sys.stderr)
            return 1
        if r.stderr.strip():
            print(r.stderr, file=sys.stderr)
        runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
    for k in [k for k, v in runs[0].items() if not isinstance(v, (int, float))]:
        print(f"  {k}: {runs[0][k]}")
    med = {k: statistics.median(r[k] for r in runs) for k, v in runs[0].items() if isinstance(v, (int, float))}
    print("cold start, ms (median of %d fresh processes; torch and its CUDA context already up):" % a.runs)
    for k, v in med.items():
        print(f"  {k:28s} {v:8.1f}   (runs: {', '.join(f'{r[k]:.1f}' for r in runs)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
