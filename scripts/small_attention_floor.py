#!/usr/bin/env python3
"""The floor of a small attention call under CUDA-graph replay, beside what runs it: the
reference problem B1 H8 S512 D64 bf16 (non-causal and causal; ``--shape`` for others, ``--mask``),
per call, in one process, interleaved (``factory.benchmark.time_interleaved``: one graph per callable,
passes in alternating order, medians), for graphs of 1 call and of 20 calls:

* an empty kernel (``torch.cuda._sleep(0)``): the replay floor of one kernel node on this GPU;
* every variant of the bundle whose name matches ``--candidates`` and implements the problem
  (one launch, no workspace), launched by name (its output NaN-poisoned and checked against
  float32 first);
* ``bundle.attention`` (the loader's choice) and each torch SDPA backend that takes the problem.

``--json PATH`` writes every figure."""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def floor_rows(bundle, pattern: str, shape, rounds: int = 6, masks=(False, True)) -> list[dict]:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from factory import testing
    from factory.benchmark import time_interleaved

    b, h, s, d = shape[:4]
    sk = shape[4] if len(shape) > 4 else s
    rx = re.compile(pattern)
    rows = []
    for causal in masks:
        g = torch.Generator(device="cuda").manual_seed(7)
        q = torch.randn(b, s, h, d, device="cuda", generator=g).bfloat16()
        k, v = (torch.randn(b, sk, h, d, device="cuda", generator=g).bfloat16() for _ in range(2))
        ref = testing.attention_reference(q, k, v, causal, d ** -0.5)[0]
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        calls, errs = {"empty kernel": lambda _i: torch.cuda._sleep(0)}, {}
        for e in bundle.candidates("attention"):
            n = e["name"]
            if not (rx.search(n) and e.get("dtype") == "bf16" and e.get("head_dim") == d
                    and bool(e.get("causal")) == causal and not e.get("varlen") and e.get("splits", 1) == 1
                    and s >= e.get("min_seqlen_q", 0)):
                continue
            o = torch.full_like(q, math.nan)
            args = [q, k, v, o, torch.empty(b, h, s, device="cuda"), d ** -0.5]
            bundle.launch(n, args)
            torch.cuda.synchronize()
            errs[n] = float("nan") if o.isnan().any() else testing.rel_error(o, ref)
            calls[n] = lambda _i, n=n, a=args: bundle.launch(n, a)
        calls["bundle.attention"] = lambda _i: bundle.attention(q, k, v, causal=causal)
        for label, be in (("sdpa flash", SDPBackend.FLASH_ATTENTION), ("sdpa cudnn", SDPBackend.CUDNN_ATTENTION),
                          ("sdpa efficient", SDPBackend.EFFICIENT_ATTENTION)):
            def fn(_i, be=be):
                with sdpa_kernel([be]):
                    return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
            if causal and s != sk:  # (SDPA's causal mask is top-left aligned: another problem)
                continue
            try:
                o = fn(0).transpose(1, 2)
                torch.cuda.synchronize()
                errs[label] = testing.rel_error(o, ref)
            except RuntimeError:  # (a backend that does not take the problem here)
                continue
            calls[label] = fn
        times = {n_calls: {k_: t * 1e6 for k_, t in time_interleaved(calls, n_calls, rounds=rounds, budget_s=0.05,
                                                                       max_reps=10).items()}
                 for n_calls in (1, 20)}
        for name in calls:
            rows.append({"shape": [b, h, s, d, sk], "causal": causal, "name": name,
                         "us_graph_of_1": round(times[1][name], 3), "us_graph_of_20": round(times[20][name], 3),
                         "rel_err": errs.get(name)})
        print(f"B{b} H{h} S{s}{'' if sk == s else f'x{sk}'} D{d} {'causal' if causal else 'non-causal'} "
              f"(µs per call: graphs of 1 / of 20 calls)")
        for name in sorted(calls, key=lambda n: times[20][n]):
            print(f"  {name:58s} {times[1][name]:7.2f} {times[20][name]:7.2f}  err {errs.get(name)}", flush=True)
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--bundle", default="artifacts/default")
    p.add_argument("--candidates", default=r"sm90a_bf16_d64_m|sm90_bf16_d64_q16_.*_kv[124](_cl)?$",
                   help="regex over variant names (default: the sm90 family's head_dim 64 tiles, the decode "
                        "family's 16-row CTAs, causal only, unsplit or split in a cluster)")
    p.add_argument("--shape", nargs="+", default=["1,8,512,64"], help="B,H,S,D[,Sk] each (Sk: keys, default S)")
    p.add_argument("--mask", choices=("both", "none", "causal"), default="both")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--json")
    a = p.parse_args()
    import torch

    from factory.runtime import Bundle

    masks = {"both": (False, True), "none": (False,), "causal": (True,)}[a.mask]
    bundle = Bundle.open(a.bundle)
    rows = [r for sh in a.shape
            for r in floor_rows(bundle, a.candidates, tuple(int(x) for x in sh.split(",")), a.rounds, masks)]
    if a.json:
        Path(a.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                            "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
