#!/usr/bin/env python3
"""Host µs per fx_gemm call (through ctypes) of two builds of a bundle's host library, interleaved
in one process on one problem (16x256x512 bf16: less GPU time per launch than host time, so the
launch queue never fills):

    python3 notes/probes/c_api_host_cost.py BEFORE.so AFTER.so

Both libraries are loaded side by side (each holds its own static cudart); per round each runs
``--calls`` launches back to back, then the device is synchronized.  Prints the median µs per call
of each over the rounds and their paired difference, as JSON.  Answer for the device check of
fx_gemm / fx_attention (H200 host, 2026-11-26): 3.90 -> 4.65 us, paired +0.71 us.
notes/multi-gpu.md."""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
import c_selection as cs  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("libs", nargs=2)
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--rounds", type=int, default=21)
    a = p.parse_args()
    libs = [cs.CLib(x) for x in a.libs]
    M, N, K = 16, 256, 512
    x = torch.randn(M, K, device="cuda").bfloat16()
    w = torch.randn(N, K, device="cuda").bfloat16()
    c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    prob = cs.GemmProblem(1, 1, M, N, K, 1, x.data_ptr(), cs.I64x3(K, 1, 0), w.data_ptr(), cs.I64x3(K, 1, 0),
                          c.data_ptr(), cs.I64x3(N, 1, 0), None, None, 0)
    dev = cs.Device()
    assert libs[0].lib.fx_device_query(torch.cuda.current_device(), ctypes.byref(dev)) == 0
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    args = (ctypes.byref(dev), ctypes.byref(prob), None, ctypes.c_uint64(0), stream, None)
    for lib in libs:  # load the variant, check the result
        assert lib.lib.fx_gemm(*args) == 0, lib.lib.fx_last_error_message()
        torch.cuda.synchronize()
        ref = x.float() @ w.float().T
        assert float((c.float() - ref).norm() / ref.norm()) < 1e-2
    per = [[], []]
    for _ in range(a.rounds):
        for i, lib in enumerate(libs):
            fn = lib.lib.fx_gemm
            t0 = time.perf_counter()
            for _ in range(a.calls):
                fn(*args)
            per[i].append((time.perf_counter() - t0) / a.calls * 1e6)
            torch.cuda.synchronize()
    diffs = [b - a_ for a_, b in zip(*per)]
    print(json.dumps({"problem": [M, N, K], "calls_per_round": a.calls, "rounds": a.rounds,
                      "before_us": round(statistics.median(per[0]), 3), "after_us": round(statistics.median(per[1]), 3),
                      "paired_diff_us": round(statistics.median(diffs), 3),
                      "rounds_us": {"before": [round(v, 3) for v in per[0]], "after": [round(v, 3) for v in per[1]]},
                      "device": torch.cuda.get_device_name()}))


if __name__ == "__main__":
    main()
