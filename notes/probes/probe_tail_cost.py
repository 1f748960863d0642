#!/usr/bin/env python3
"""Where the tail split's fixed cost per launch goes (factory/gemm/sm90_splitk.py
GemmSm90TailKernel), on the GPU.

The tail kernel's plan depends on its ``max_clusters`` launch scalar (G): T cluster tiles, R = T mod
G split into S = G // R parts (capped).  Launched directly on one persistent, once-zeroed workspace
(no zeroing node) with G chosen, one shape gives a ladder: G = T (no split: the persistent walk
alone), G = T - 1 (one whole round, then one tile in S parts), ... .  With the round's time t1 (G =
T), the ideal time of a plan is t1 x (k-tiles of the longest unit chain) / k_tiles; what is over it
is the fix-up's cost at that S.  Beside them: the plain persistent tile (same tile, no tail code),
the tail through ``bundle.gemm`` (per-call workspace + semaphore zeroing) and cuBLAS, all in the
same interleaved passes of CUDA-graph replays.  Every direct plan is checked against float32 after
all the replays (also proving the semaphores came back to zero).

    python3 notes/probes/probe_tail_cost.py BUNDLE --json OUT.json
    ncu ... python3 notes/probes/probe_tail_cost.py BUNDLE --profile   # each launch once, profiled
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

TAIL = "gemm_sm90a_bf16_obf16_ak_bk_t128x192x64_c2x1_coop_rm_sw1_sk1_pdl_skw16_tail"
PLAIN = "gemm_sm90a_bf16_obf16_ak_bk_t128x192x64_c2x1_coop_rm_sw1_sk1_pdl"
# (M, N, K, [G values]); 1536x2112: 6 x 11 = 66 cluster tiles of 256x192
LADDER = [
    (1536, 2112, 4096, [66, 65, 60, 44]),
    (128, 2048, 768, [66]),
    (2048, 2112, 7168, [66]),
]


def main() -> int:
    import torch

    from factory import testing
    from factory.benchmark import gemm_bytes, sets_for, time_interleaved
    from factory.runtime import Bundle
    from factory.runtime import gemm as rt

    p = argparse.ArgumentParser()
    p.add_argument("bundle")
    p.add_argument("--tail", default=TAIL)
    p.add_argument("--plain", default=PLAIN)
    p.add_argument("--json", default=None)
    p.add_argument("--profile", action="store_true", help="launch each once between profiler start/stop")
    a = p.parse_args()
    bundle = Bundle.open(a.bundle)
    entry = bundle.manifest["variants"][a.tail]
    g_dev = rt.launch_scalars(bundle, entry, 0)[0]
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    out = {"device": torch.cuda.get_device_name(0), "max_clusters": g_dev, "tail": a.tail, "plain": a.plain,
           "rows": []}
    print("device max_clusters", g_dev, flush=True)
    prof = []
    for M, N, K, gs in LADDER:
        if a.profile:
            gs = gs[:2]
        n_sets = 1 if a.profile else sets_for(gemm_bytes(M, N, K, "bf16"), l2)
        sets = [(testing.gemm_operand(M, K, 1, "k", "bf16")[0], testing.gemm_operand(N, K, 1, "k", "bf16")[0],
                 torch.empty(M, N, dtype=torch.bfloat16, device="cuda")) for _ in range(n_sets)]
        def through_gemm(i, sets=sets):
            bundle.gemm(sets[i][0], sets[i][1], sets[i][2], variant=a.tail)

        calls = {"cublas": lambda i, sets=sets: torch.mm(sets[i][0], sets[i][1].t(), out=sets[i][2]),
                 "plain": lambda i, sets=sets: bundle.gemm(sets[i][0], sets[i][1], sets[i][2], variant=a.plain),
                 "tail_gemm": through_gemm}
        spec = rt._workspace_spec(entry, M, N, 0, 1)[0]
        direct = {}
        for g in gs:
            ws = torch.zeros(spec[1][0], dtype=torch.float32, device="cuda")

            def go(i, ws=ws, g=g, sets=sets):
                specs = [rt.rkl_spec(t, w) for t, w in zip(sets[i], ("a", "b", "out"))]
                bundle.launch(a.tail, [*specs, (ws.data_ptr(), (ws.numel(),), (1,)), g], checked=True, device=0)
            calls[f"tail_G{g}"] = direct[g] = go
        for fn in calls.values():
            fn(0)
        torch.cuda.synchronize()
        if a.profile:
            prof.append((f"{M}x{N}x{K}", calls))
            continue
        t = time_interleaved(calls, n_sets, rounds=3, warm_s=0.05)
        row = {"shape": [M, N, K], "us": {k: round(v * 1e6, 2) for k, v in t.items()}}
        best = 1e9  # host time per eager call of the tail through bundle.gemm (300 queued, no sync)
        for _ in range(5):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(300):
                through_gemm(0)
            best = min(best, (time.perf_counter() - t0) / 300)
        torch.cuda.synchronize()
        row["host_us_min_of_5"] = round(best * 1e6, 2)
        ref = sets[0][0].float() @ sets[0][1].float().t()
        for g, go in direct.items():
            sets[0][2].fill_(float("nan"))
            go(0)
            torch.cuda.synchronize()
            err = testing.rel_error(sets[0][2], ref)
            row.setdefault("rel_err", {})[g] = err
            assert err < testing.TOLERANCE["bf16"], (g, M, N, K, err)
        out["rows"].append(row)
        print(json.dumps(row), flush=True)
        del sets
        torch.cuda.empty_cache()
    if a.profile:
        torch.cuda.profiler.start()
        for shape, calls in prof:
            for name, fn in calls.items():
                if name != "cublas":
                    fn(0)
                    torch.cuda.synchronize()
                    print("profiled", shape, name, flush=True)
        torch.cuda.profiler.stop()
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
