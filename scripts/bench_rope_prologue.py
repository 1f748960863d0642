"""Two forms of a decode step's rotary embedding, same run, CUDA-graph replays
(``factory.benchmark.time_interleaved``: several input sets, medians over passes):

* separate: ``rope_kvcache`` rotates q and k and writes k, v into the paged cache; then
  ``attention_kvcache`` over the rotated q;
* prologue: ``rope_kvcache`` with q of zero heads (rotates k, writes k, v); then
  ``attention_kvcache(..., rotary_cos_sin=)``, which rotates q in its prologue.

Llama-3-8B attention shapes (32 q heads, 8 kv heads, head_dim 128, pages of 16), batch 1 / 16 / 64
at a context of ``--context`` keys; each kernel alone and both steps.

    python3 scripts/bench_rope_prologue.py --bundle BUNDLE [--context 4096] [--out DIR]

Writes ``rope_prologue.json`` under ``--out`` and prints the table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from factory import benchmark  # noqa: E402
from factory.runtime import Bundle  # noqa: E402

HQ, HKV, D, PS = 32, 8, 128, 16


def step_inputs(b: int, ctx: int, sets: int, gen):
    """Per input set: q, k, v of one new token per sequence, a cache of b sequences of ctx keys
    (the new one last) in shuffled pages, positions, slots, lengths, the block table."""
    pages = b * (-(-ctx // PS))
    out = []
    for _ in range(sets):
        kc = torch.randn(pages, PS, HKV, D, device="cuda", generator=gen).to(torch.bfloat16)
        vc = torch.randn(pages, PS, HKV, D, device="cuda", generator=gen).to(torch.bfloat16)
        bt = torch.randperm(pages, device="cuda", generator=gen).to(torch.int32).view(b, -1)
        lens = torch.full((b,), ctx, dtype=torch.int32, device="cuda")
        pos = (lens - 1).long()
        slot = bt.gather(1, (pos // PS)[:, None].int()).long()[:, 0] * PS + pos % PS
        q = torch.randn(b, HQ, D, device="cuda", generator=gen).to(torch.bfloat16)
        k = torch.randn(b, HKV, D, device="cuda", generator=gen).to(torch.bfloat16)
        v = torch.randn(b, HKV, D, device="cuda", generator=gen).to(torch.bfloat16)
        out.append(dict(q=q, k=k, v=v, kc=kc, vc=vc, bt=bt, lens=lens, pos=pos, slot=slot,
                        o=torch.empty(b, 1, HQ, D, dtype=torch.bfloat16, device="cuda")))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--sets", type=int, default=4)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    bundle = Bundle.open(a.bundle)
    gen = torch.Generator(device="cuda").manual_seed(0)
    cs = torch.randn(8192, D, device="cuda", generator=gen)  # (any values: timing only)
    rows = []
    for b in a.batches:
        sets = step_inputs(b, a.context, a.sets, gen)
        neox = bundle.plan_kvcache(batch=b, seqlen_q=1, heads_q=HQ, heads_kv=HKV, head_dim=D, page_size=PS,
                                   max_pages=sets[0]["bt"].shape[1])

        def rope_full(i):
            s = sets[i]
            bundle.rope_kvcache(s["q"], s["k"], s["v"], s["pos"], cs, s["kc"], s["vc"], s["slot"])

        def rope_k(i):
            s = sets[i]
            bundle.rope_kvcache(s["q"][:, :0], s["k"], s["v"], s["pos"], cs, s["kc"], s["vc"], s["slot"])

        def attn(i):
            s = sets[i]
            bundle.attention_kvcache(s["q"].view(b, 1, HQ, D), s["kc"], s["vc"], s["lens"], block_table=s["bt"],
                                     out=s["o"], plan=neox)

        def attn_rope(i):
            s = sets[i]
            bundle.attention_kvcache(s["q"].view(b, 1, HQ, D), s["kc"], s["vc"], s["lens"], block_table=s["bt"],
                                     out=s["o"], plan=neox, rotary_cos_sin=cs)

        def separate(i):
            rope_full(i)
            attn(i)

        def prologue(i):
            rope_k(i)
            attn_rope(i)

        calls = {"rope_kvcache q+k": rope_full, "rope_kvcache k only": rope_k, "attention": attn,
                 "attention + rotary prologue": attn_rope, "step: separate": separate, "step: prologue": prologue}
        t = benchmark.time_interleaved(calls, a.sets, rounds=9, budget_s=0.05, warm_s=0.05)
        row = {"batch": b, "context": a.context, "variant": neox.variant, **{k: round(v * 1e6, 2) for k, v in t.items()}}
        row["prologue / separate"] = round(t["step: prologue"] / t["step: separate"], 3)
        rows.append(row)
        print(json.dumps(row), flush=True)
    print("\n| batch | rope q+k | rope k | attention | attention + rope | separate | prologue | separate / prologue |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['batch']} | {r['rope_kvcache q+k']} | {r['rope_kvcache k only']} | {r['attention']} | "
              f"{r['attention + rotary prologue']} | {r['step: separate']} | {r['step: prologue']} | "
              f"{round(r['step: separate'] / r['step: prologue'], 3)} |")
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "rope_prologue.json").write_text(json.dumps(
            {"device": torch.cuda.get_device_name(), "command": " ".join(sys.argv), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
