#!/usr/bin/env python3
"""Grouped 128x256 forms by name beside torch._grouped_mm and the dense 128x256 GEMM (same run).

usage: probe_grouped_cluster.py GROUPED_BUNDLE DENSE_BUNDLE OUT.json        (timing, graph replay)
       probe_grouped_cluster.py GROUPED_BUNDLE DENSE_BUNDLE --launch-once      (one launch each, for ncu)
Rows: Mixtral gate_up / down, DeepSeek down, Qwen gate_up (skewed routing as scripts/bench_grouped.py);
dense: the same total problem as one (M_total, N, K) GEMM (one weight matrix)."""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import torch  # noqa: E402

from bench_grouped import routing  # noqa: E402
from factory.benchmark import time_interleaved  # noqa: E402
from factory.runtime import Bundle  # noqa: E402

ROWS = [("mixtral gate_up", 8, 28672, 4096, 65536), ("mixtral gate_up", 8, 28672, 4096, 8192),
        ("mixtral down", 8, 4096, 14336, 8192), ("mixtral down", 8, 4096, 14336, 65536),
        ("deepseek down", 256, 7168, 2048, 65536), ("qwen gate_up", 128, 3072, 4096, 65536)]


def main():
    gb, db = Bundle.open(sys.argv[1]), Bundle.open(sys.argv[2])
    gnames = [v["name"] for v in gb.candidates("gemm_grouped") if v.get("grouped") == "contig"]
    dnames = [v["name"] for v in db.candidates("gemm") if "sw8" in v["name"] or "c1x1" in v["name"]]
    once = "--launch-once" in sys.argv
    gen = torch.Generator().manual_seed(1234)
    results = []
    for label, E, N, K, M in (ROWS[:1] if once else ROWS):
        if once:  # uniform: 8 x 8192 rows
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
        for n in gnames:
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
            print("launched", list(calls))
            return
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
