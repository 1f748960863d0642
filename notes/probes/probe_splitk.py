#!/usr/bin/env python3
"""Where the time of the split-K-over-the-grid GEMM goes (factory/gemm/sm90_splitk.py, both the
every-tile split and the tail split), on the GPU.

Per shape, in the same interleaved passes of CUDA-graph replays (factory.benchmark.time_interleaved,
fresh input sets rotated past twice the L2): cuBLAS; the bundle's own pick; each split variant
through ``bundle.gemm`` (a per-call workspace whose semaphores are zeroed by a fill kernel before
the GEMM: what a caller gets); and the same variant launched directly on one persistent workspace
zeroed once (the kernel alone: its semaphores must come back to zero after every launch, which the
final float32 check of that path proves after all the replays).  The difference of the last two
is the zeroing's share; the direct time against the unsplit pick is the fix-up's.

    python3 notes/probes/probe_splitk.py BUNDLE --json OUT.json [--shapes 512x3072x5120 ...]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

SHAPES = ["512x3072x5120", "2048x2112x7168", "512x1280x8192", "128x5120x2048", "2048x5376x21504", "64x2112x7168"]


def main() -> int:
    import torch

    from factory import testing
    from factory.benchmark import gemm_bytes, sets_for, time_interleaved
    from factory.runtime import Bundle
    from factory.runtime import gemm as rt

    p = argparse.ArgumentParser()
    p.add_argument("bundle")
    p.add_argument("--shapes", nargs="+", default=SHAPES)
    p.add_argument("--json", required=True)
    p.add_argument("--only", default=None, help="only split variants whose name holds this")
    a = p.parse_args()
    bundle = Bundle.open(a.bundle)
    splits = [v for v in bundle.candidates("gemm") if v.get("workspace", {}).get("form") in ("tiles", "tail")
              and (a.only is None or a.only in v["name"])]
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    out = {"device": torch.cuda.get_device_name(0), "rows": []}
    for s in a.shapes:
        M, N, K = map(int, s.split("x"))
        n_sets = sets_for(gemm_bytes(M, N, K, "bf16"), l2)
        sets = [(testing.gemm_operand(M, K, 1, "k", "bf16")[0], testing.gemm_operand(N, K, 1, "k", "bf16")[0],
                 torch.empty(M, N, dtype=torch.bfloat16, device="cuda")) for _ in range(n_sets)]
        calls = {"cublas": lambda i: torch.mm(sets[i][0], sets[i][1].t(), out=sets[i][2]),
                 "pick": lambda i: bundle.gemm(sets[i][0], sets[i][1], sets[i][2])}
        direct = {}
        for v in splits:
            name = v["name"]
            calls[name] = lambda i, name=name: bundle.gemm(sets[i][0], sets[i][1], sets[i][2], variant=name)
            spec = rt._workspace_spec(v, M, N, 0, 1)[0]
            ws = torch.zeros(spec[1][0], dtype=torch.float32, device="cuda")
            scal = rt.launch_scalars(bundle, v, 0)

            def go(i, name=name, ws=ws, scal=scal):
                specs = [rt.rkl_spec(t, w) for t, w in zip(sets[i], ("a", "b", "out"))]
                bundle.launch(name, [*specs, (ws.data_ptr(), (ws.numel(),), (1,)), *scal], checked=True, device=0)
            calls[name + " [direct]"] = direct[name] = go
        for fn in calls.values():  # load every variant outside the captures
            fn(0)
        torch.cuda.synchronize()
        t = time_interleaved(calls, n_sets, rounds=3, warm_s=0.05)
        row = {"shape": [M, N, K], "us": {k.replace("gemm_sm90a_bf16_obf16_ak_bk_", ""): round(v * 1e6, 2)
                                          for k, v in t.items()}}
        ref = sets[0][0].float() @ sets[0][1].float().t()
        for name, go in direct.items():  # after every replay: the semaphores are zero again
            sets[0][2].fill_(float("nan"))
            go(0)
            torch.cuda.synchronize()
            err = testing.rel_error(sets[0][2], ref)
            row.setdefault("direct_rel_err", {})[name.split("_bk_")[1]] = err
            assert err < testing.TOLERANCE["bf16"], (name, s, err)
        out["rows"].append(row)
        print(json.dumps(row))
    Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
