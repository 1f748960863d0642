#!/usr/bin/env python3
"""Probe: the intermittent whole-shape slowdown seen in the H100 bench runs of 2026-11-22 (one shape
of a run at ~1.4-1.7x its usual time, sometimes for ours and cuBLAS alike).  For a few decode shapes it
allocates fresh input sets several times (as bench.py does per shape) and, for each allocation,
samples ours and the reference alternately for a while, each sample a burst of graph replays
timed with CUDA events (bench.py's timer), while ``nvidia-smi`` logs SM/memory clocks,
temperature, power and throttle reasons every 50 ms.  Writes OUT.json (the samples, with host
timestamps) and OUT_smi.csv, to tell a GPU state (clocks, power) from an allocation effect.

Answer (H100 SXM, 2026-11-22, results committed in c06c497 17:02 UTC; notes/gemm-sm90.md, "The
intermittent slowdown: not the clocks"): SM and memory clocks stayed at 1980 / 2619 MHz with no
throttle reason; 0-2.4% of samples ran 1.2-4.6x slow in runs of up to ~35 samples (~10-20 ms), ~70%
of them hitting ours and cuBLAS in the same sample: a GPU-wide state, not a kernel's. bench.py since
times every shape in two allocation epochs and keeps each side's faster one.

  python3 notes/probes/probe_slowdown.py BUNDLE OUT [--seconds S] [--allocs N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from factory import testing  # noqa: E402
from factory.benchmark import burst_for, capture, gemm_bytes, one_replay_s, sets_for, timed_replays  # noqa: E402
from factory.runtime import Bundle  # noqa: E402

SHAPES = [("bf16", 16, 8192, 8192), ("e4m3", 1, 10240, 8192), ("bf16", 1, 10240, 8192), ("e4m3", 16, 4096, 4096)]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bundle")
    p.add_argument("out")
    p.add_argument("--seconds", type=float, default=2.0, help="sampling time per allocation")
    p.add_argument("--allocs", type=int, default=4, help="fresh allocations per shape")
    a = p.parse_args()
    import torch

    bundle = Bundle.open(a.bundle)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    smi = subprocess.Popen(
        ["nvidia-smi", "--query-gpu=timestamp,clocks.sm,clocks.mem,temperature.gpu,power.draw,"
         "clocks_throttle_reasons.active", "--format=csv,noheader", "-lms", "50"],
        stdout=open(a.out + "_smi.csv", "w"), stderr=subprocess.DEVNULL)
    t0 = time.time()
    rows = []
    one = torch.ones(1, device="cuda")
    try:
        for dt, M, N, K in SHAPES:
            n_sets = sets_for(gemm_bytes(M, N, K, dt), l2)
            for alloc in range(a.allocs):
                A, B, C = testing.gemm_input_sets(n_sets, M, N, K, dt, poison=False)
                if dt == "e4m3":
                    calls = {"ours": lambda i: bundle.gemm(A[i], B[i], C[i], scale_a=one, scale_b=one),
                             "ref": lambda i: torch._scaled_mm(A[i], B[i].t(), scale_a=one, scale_b=one,
                                                               out_dtype=torch.bfloat16)}
                else:
                    calls = {"ours": lambda i: bundle.gemm(A[i], B[i], C[i]),
                             "ref": lambda i: torch.mm(A[i], B[i].t(), out=C[i])}
                s = torch.cuda.Stream()
                graphs = {name: capture(fn, n_sets, s) for name, fn in calls.items()}
                bursts = {name: burst_for(one_replay_s(g)) for name, g in graphs.items()}
                samples = []
                t_end = time.time() + a.seconds
                while time.time() < t_end:
                    rec = {"t": round(time.time() - t0, 4)}
                    for name, g in graphs.items():
                        rec[name] = statistics.median(timed_replays(g, 3, bursts[name], n_sets)) * 1e6
                    samples.append(rec)
                med = {k: statistics.median(r[k] for r in samples) for k in calls}
                hi = {k: max(r[k] for r in samples) / med[k] for k in calls}
                print(f"{dt} {M}x{N}x{K} alloc {alloc}: {len(samples)} samples, median ours {med['ours']:.1f} "
                      f"ref {med['ref']:.1f} us, max/median ours {hi['ours']:.2f} ref {hi['ref']:.2f}", flush=True)
                rows.append({"dtype": dt, "M": M, "N": N, "K": K, "alloc": alloc, "input_sets": n_sets,
                             "samples": samples})
                del graphs
                A = B = C = None
                torch.cuda.empty_cache()
    finally:
        smi.terminate()
    Path(a.out + ".json").write_text(json.dumps({"device": torch.cuda.get_device_name(), "t0": t0,
                                                 "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
