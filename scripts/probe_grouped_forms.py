#!/usr/bin/env python3
"""Grouped GEMM variants by name beside torch._grouped_mm and the dense GEMM (same run).

usage: probe_grouped_forms.py GROUPED_BUNDLE DENSE_BUNDLE OUT.json [--sustained]  (timing, graph replay)
       probe_grouped_forms.py GROUPED_BUNDLE DENSE_BUNDLE --launch-once 0,5     (one launch each, for ncu)
Every contiguous bf16 variant of GROUPED_BUNDLE (less those matching the regex $GRP_SKIP), checked
against torch._grouped_mm on NaN-poisoned outputs, then timed; DENSE_BUNDLE's swizzle-8 variants on
the Mixtral rows.  $GRP_ROWS: the rows of ROWS to run (comma-separated indices; default all).
--sustained: first, per variant on the first row, ~1 s of back-to-back replays with the SM clock and
board power read by nvidia-smi in the middle (the clock the 700 W cap leaves each variant).
Rows: Mixtral gate_up / down, DeepSeek down, Qwen gate_up (skewed routing as scripts/bench_grouped.py);
dense: the same total problem as one (M_total, N, K) GEMM (one weight matrix)."""
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402

from bench_grouped import routing  # noqa: E402
from factory.benchmark import time_interleaved  # noqa: E402
from factory.runtime import Bundle  # noqa: E402

ROWS = [("mixtral gate_up", 8, 28672, 4096, 65536), ("deepseek gate_up", 256, 4096, 7168, 65536),
        ("mixtral gate_up", 8, 28672, 4096, 8192),
        ("mixtral down", 8, 4096, 14336, 8192), ("mixtral down", 8, 4096, 14336, 65536),
        ("deepseek down", 256, 7168, 2048, 65536), ("qwen gate_up", 128, 3072, 4096, 65536),
        ("qwen gate_up", 128, 3072, 4096, 8192)]


def sustained(calls, seconds=1.0):
    """Per callable: graph replays back to back for ~``seconds``; nvidia-smi reads the SM clock and
    the board power half-way through; returns {name: [MHz, W, us per call]}."""
    out = {}
    for name, fn in calls.items():
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            fn(0)
            torch.cuda.synchronize()
            with torch.cuda.graph(g, stream=s):
                fn(0)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        g.replay()
        torch.cuda.synchronize()
        one = time.perf_counter() - t0
        n = max(4, int(seconds / max(one, 1e-4)))
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(n):
            g.replay()
        e1.record()
        time.sleep(seconds * 0.6)
        q = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True).stdout.strip()
        e1.synchronize()
        out[name] = [q, round(e0.elapsed_time(e1) * 1e3 / n, 1)]
        del g
    return out


def main():
    gb, db = Bundle.open(sys.argv[1]), Bundle.open(sys.argv[2])
    skip = re.compile(os.environ.get("GRP_SKIP", "^$"))
    gnames = [v["name"] for v in gb.candidates("gemm_grouped") if v.get("grouped") == "contig"
              and not skip.search(v["name"])]
    dnames = [v["name"] for v in db.candidates("gemm") if "sw8" in v["name"]]
    once = "--launch-once" in sys.argv
    rows = [ROWS[int(i)] for i in os.environ["GRP_ROWS"].split(",")] if os.environ.get("GRP_ROWS") else ROWS
    if once:  # --launch-once ROWS: those rows of ROWS, comma-separated (Mixtral: uniform routing)
        rows = [ROWS[int(i)] for i in sys.argv[sys.argv.index("--launch-once") + 1].split(",")]
    gen = torch.Generator().manual_seed(1234)
    results = []
    for label, E, N, K, M in rows:
        if once and E == 8:  # uniform: 8 x 8192 rows
            counts = torch.full((E,), M // E, dtype=torch.int64)
        else:
            counts = routing(E, M, gen, 16)
        Mt = int(counts.sum())
        a = torch.randn(Mt, K, device="cuda", dtype=torch.bfloat16)
        b = (torch.randn(E, N, K, device="cuda", dtype=torch.bfloat16) * 0.05).transpose(1, 2)
        offs = counts.cumsum(0).to(torch.int32).cuda()
        ref = torch._grouped_mm(a, b, offs=offs)
        out = torch.full((Mt, N), float("nan"), dtype=torch.bfloat16, device="cuda")
        calls = {n: (lambda i, n=n: gb.grouped_gemm(a, b, offs=offs, out=out, variant=n)) for n in gnames}
        calls["torch_grouped_mm"] = lambda i: torch._grouped_mm(a, b, offs=offs)
        row = {"row": label, "E": E, "N": N, "K": K, "M_total": Mt}
        errs = {}
        for n in ([] if once else gnames):
            out.fill_(float("nan"))
            calls[n](0)
            torch.cuda.synchronize()
            errs[n] = round(float((out.float() - ref.float()).abs().max()), 4) if not torch.isnan(out).any() else "nan"
        row["max_abs_err_vs_torch"] = errs
        row["ref_absmax"] = round(float(ref.float().abs().max()), 3)
        bd = b[0].t().contiguous() if N * K * 2 < 2**31 else None
        if label.startswith("mixtral") and bd is not None:
            outd = torch.empty(Mt, N, dtype=torch.bfloat16, device="cuda")
            for n in dnames:
                calls["dense " + n] = lambda i, n=n: db.gemm(a, bd, out=outd, variant=n)
            calls["dense torch.mm"] = lambda i: torch.mm(a, bd.t())
        if once:
            for n, f in calls.items():
                f(0)
            torch.cuda.synchronize()
            print("launched", label, M, list(calls))
            del a, b, out, ref, calls
            torch.cuda.empty_cache()
            continue
        if "--sustained" in sys.argv and not results:
            row["sustained"] = sustained(calls)
            print(json.dumps(row["sustained"]), flush=True)
        t = time_interleaved(calls, 1, rounds=4, budget_s=0.06)
        fl = 2.0 * Mt * N * K
        row["us"] = {n: round(v * 1e6, 1) for n, v in t.items()}
        row["tflops"] = {n: round(fl / v / 1e12, 1) for n, v in t.items()}
        row["x_vs_torch"] = {n: round(t["torch_grouped_mm"] / v, 3) for n, v in t.items()}
        print(json.dumps(row), flush=True)
        results.append(row)
        del a, b, out, ref, calls
        torch.cuda.empty_cache()
        Path(sys.argv[3]).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
