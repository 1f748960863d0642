#!/usr/bin/env python3
"""The tail split's fixed cost per launch (gemm/sm90_splitk.py GemmSm90TailKernel) on the GPU.

Its plan follows the ``max_clusters`` scalar G (T cluster tiles, the last T mod G split), so one
shape launched directly on a once-zeroed workspace gives a ladder: G = T (no split), G = T - 1 (one
tile in S parts), ...; ideal = t(G = T) x (longest unit chain's k-tiles) / k-tiles.  Beside them,
in the same interleaved graph replays: the plain tile, the tail through ``bundle.gemm`` (with the
semaphore zeroing) and cuBLAS.  Every direct plan is then checked against float32.

    python3 notes/probes/probe_tail_cost.py BUNDLE --json OUT.json
    ncu --profile-from-start off ... python3 notes/probes/probe_tail_cost.py BUNDLE --profile
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

TAIL = "gemm_sm90a_bf16_obf16_ak_bk_t128x192x64_c2x1_coop_rm_sw1_sk1_pdl_skw16_tail"
PLAIN = "gemm_sm90a_bf16_obf16_ak_bk_t128x192x64_c2x1_coop_rm_sw1_sk1_pdl"
LADDER = [(1536, 2112, 4096, [66, 65, 60, 44]), (128, 2048, 768, [66]), (2048, 2112, 7168, [66])]


def main() -> int:
    import torch

    from factory import testing
    from factory.benchmark import gemm_bytes, sets_for, time_interleaved
    from factory.runtime import Bundle
    from factory.runtime import gemm as rt

    p = argparse.ArgumentParser()
    p.add_argument("bundle")
    p.add_argument("--json", default=None)
    p.add_argument("--profile", action="store_true")
    a = p.parse_args()
    bundle = Bundle.open(a.bundle)
    entry = bundle.manifest["variants"][TAIL]
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    out = {"device": torch.cuda.get_device_name(0), "max_clusters": rt.launch_scalars(bundle, entry, 0)[0], "rows": []}
    prof = []
    for M, N, K, gs in LADDER:
        if a.profile:
            gs = gs[:2]
        n_sets = 1 if a.profile else sets_for(gemm_bytes(M, N, K, "bf16"), l2)
        sets = [(testing.gemm_operand(M, K, 1, "k", "bf16")[0], testing.gemm_operand(N, K, 1, "k", "bf16")[0],
                 torch.empty(M, N, dtype=torch.bfloat16, device="cuda")) for _ in range(n_sets)]
        calls = {"cublas": lambda i, s=sets: torch.mm(s[i][0], s[i][1].t(), out=s[i][2]),
                 "plain": lambda i, s=sets: bundle.gemm(*s[i], variant=PLAIN),
                 "tail_gemm": lambda i, s=sets: bundle.gemm(*s[i], variant=TAIL)}
        spec = rt._workspace_spec(entry, M, N, 0, 1)[0]
        direct = {}
        for g in gs:
            ws = torch.zeros(spec[1][0], dtype=torch.float32, device="cuda")

            def go(i, ws=ws, g=g, sets=sets):
                specs = [rt.rkl_spec(t, w) for t, w in zip(sets[i], ("a", "b", "out"))]
                bundle.launch(TAIL, [*specs, (ws.data_ptr(), (ws.numel(),), (1,)), g], checked=True, device=0)
            calls[f"tail_G{g}"] = direct[g] = go
        for fn in calls.values():
            fn(0)
        torch.cuda.synchronize()
        if a.profile:
            prof.append(calls)
            continue
        t = time_interleaved(calls, n_sets, rounds=3, warm_s=0.05)
        row = {"shape": [M, N, K], "us": {k: round(v * 1e6, 2) for k, v in t.items()}}
        ref = sets[0][0].float() @ sets[0][1].float().t()
        for g, go in direct.items():
            sets[0][2].fill_(float("nan"))
            go(0)
            torch.cuda.synchronize()
            err = testing.rel_error(sets[0][2], ref)
            assert err < testing.TOLERANCE["bf16"], (g, M, N, K)
        out["rows"].append(row)
        print(json.dumps(row), flush=True)
        del sets
        torch.cuda.empty_cache()
    if a.profile:
        torch.cuda.profiler.start()
        for calls in prof:
            for name, fn in calls.items():
                if name != "cublas":
                    fn(0)
                    torch.cuda.synchronize()
        torch.cuda.profiler.stop()
    if a.json:
        Path(a.json).write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
