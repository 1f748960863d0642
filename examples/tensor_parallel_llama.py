#!/usr/bin/env python3
"""One Llama-3-8B decoder layer (hidden 4096, 32 query / 8 kv heads of 128, MLP 14336) split over
the GPUs of one host with torch.distributed (NCCL), its projections and attention from the bundle:
Megatron-style tensor parallelism.  Each rank holds 32/world query heads and 8/world kv heads (its
slice of the QKV projection, the matching columns of the O projection and its part of the KV
cache) and FFN/world of the MLP (gate/up rows, down columns); the O and down projections end in an
all-reduce each.  One process per GPU:

    torchrun --nproc-per-node 2 examples/tensor_parallel_llama.py --bundle artifacts/default
    torchrun --nproc-per-node 2 examples/tensor_parallel_llama.py --bundle ... --check   # small, correctness

Every rank builds the same full weights and inputs from one seed and keeps its shard.  Per case,
rank 0 checks the split layer against the unsplit layer on one GPU (the bundle's ops) and against
the same layer from torch ops, then prints one JSON row: tokens/s of the unsplit layer on one GPU
and of the split layer on ``world`` GPUs side by side (CUDA-graph replay, prefill and decode), the
split layer without its all-reduces, the two all-reduces alone, and their share of the step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import llama_block as lb  # noqa: E402
from factory.runtime import Bundle  # noqa: E402
from tp_common import capture, finish, gpu_contexts, release, start  # noqa: E402


class Shard:
    """Rank ``rank``'s slice of ``w`` (an ``lb.Weights``) for ``world``-way tensor parallelism."""

    def __init__(self, w, rank: int, world: int):
        if w.hkv % world or (w.wgu.shape[0] // 2) % world:
            raise SystemExit(f"{w.hkv} kv heads / FFN {w.wgu.shape[0] // 2} do not split over {world} ranks")
        self.hq, self.hkv, self.hd = w.hq // world, w.hkv // world, w.hd
        q, kv = self.hq * w.hd, self.hkv * w.hd
        q0, k0, v0 = rank * q, w.hq * w.hd + rank * kv, (w.hq + w.hkv) * w.hd + rank * kv
        self.wqkv = torch.cat([w.wqkv[q0:q0 + q], w.wqkv[k0:k0 + kv], w.wqkv[v0:v0 + kv]]).contiguous()
        self.wo = w.wo[:, q0:q0 + q].contiguous()
        ffn = w.wgu.shape[0] // 2
        per = ffn // world
        self.wgu = torch.cat([w.wgu[rank * per:(rank + 1) * per], w.wgu[ffn + rank * per:ffn + (rank + 1) * per]])
        self.wdown = w.wdown[:, rank * per:(rank + 1) * per].contiguous()
        self.n1, self.n2 = w.n1, w.n2
        self.kv_heads = slice(rank * self.hkv, (rank + 1) * self.hkv)


class SplitLayer(lb.Layer):
    """``lb.Layer`` on a shard: the O and down projections' partial sums go through ``reduce``
    (an in-place all-reduce, or nothing to time the layer without it)."""

    def __init__(self, shard, mm, attend, reduce):
        super().__init__(shard, mm, attend)
        self.reduce = reduce

    def _rest(self, x, o):
        a = self.mm(o.reshape(x.shape[0], -1), "wo")
        self.reduce(a)
        h = x + a
        g, u = self.mm(lb.rms_norm(h, self.w.n2), "wgu").chunk(2, dim=-1)
        d = self.mm(F.silu(g) * u, "wdown")
        self.reduce(d)
        return h + d


def all_reduce(t):
    dist.all_reduce(t)


def no_reduce(t):
    pass


def prefill_case(lengths, hidden, gen):
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    pos = torch.cat([torch.arange(n, device="cuda") for n in lengths])
    x = torch.randn(sum(lengths), hidden, device="cuda", generator=gen).bfloat16()
    return x, pos, cu, max(lengths)


def decode_case(B, context, hidden, hkv, hd, gen):
    x = torch.randn(B, hidden, device="cuda", generator=gen).bfloat16()
    ck = torch.randn(B, context + 1, hkv, hd, device="cuda", generator=gen).bfloat16()
    cv = torch.randn(B, context + 1, hkv, hd, device="cuda", generator=gen).bfloat16()
    return x, ck, cv, torch.full((B,), context, device="cuda", dtype=torch.long)


def time_graph(g, reps: int = 5, inner: int = 10, world: int = 1) -> float:
    """Median over ``reps`` of the mean ms of ``inner`` back-to-back replays; with several ranks
    all start together (barrier) and the slowest rank's figure counts."""
    g.replay()
    ts = []
    for _ in range(reps):
        if world > 1:
            dist.barrier()
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(inner):
            g.replay()
        e1.record()
        torch.cuda.synchronize()
        ts.append(e0.elapsed_time(e1) / inner)
    ms = statistics.median(ts)
    if world > 1:
        t = torch.tensor([ms], device="cuda")
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        ms = float(t)
    return ms


def run_case(bundle, wts, shard, rank, world, phase, spec, gen, timed: bool, graphs: list) -> dict:
    """One prefill (``spec``: sequence lengths) or decode (``spec``: (batch, context)) case."""
    split = SplitLayer(shard, *_ours_fns(bundle, shard), all_reduce if world > 1 else no_reduce)
    if phase == "prefill":
        x, pos, cu, mx = prefill_case(spec, shard.wqkv.shape[1], gen)
        call = (lambda L: L.prefill(x, pos, cu, mx))
        row = {"phase": "prefill", "tokens": sum(spec), "sequences": len(spec)}
        caches = {}
    else:
        B, context = spec
        x, ck, cv, lens = decode_case(B, context, shard.wqkv.shape[1], wts.hkv, wts.hd, gen)
        caches = {"split": (ck[:, :, shard.kv_heads].contiguous(), cv[:, :, shard.kv_heads].contiguous())}
        if rank == 0:
            caches.update({"full": (ck.clone(), cv.clone()), "torch": (ck.clone(), cv.clone())})
        del ck, cv
        call = (lambda L, c: L.decode(x, *c, lens))
        row = {"phase": "decode", "batch": B, "context": context}
    row["world"] = world

    def fn(layer, which):
        return (lambda: call(layer)) if phase == "prefill" else (lambda: call(layer, caches[which]))

    y = fn(split, "split")()
    if rank == 0:  # the unsplit layer, ours and torch's, on this GPU alone
        full, ref = lb.ours(bundle, wts), lb.reference(wts)
        y_full, y_ref = fn(full, "full")(), fn(ref, "torch")()
        row["rel_err_vs_unsplit"] = lb.rel(y, y_full)
        row["rel_err_vs_torch"] = lb.rel(y, y_ref)
        row["unsplit_rel_err_vs_torch"] = lb.rel(y_full, y_ref)
    g, y_graph = capture(fn(split, "split"), graphs)
    g.replay()
    row["graph_vs_eager"] = lb.rel(y_graph, y)
    if timed:
        n = row.get("tokens", row.get("batch"))
        row["split_ms"] = time_graph(g, world=world)
        if world > 1:
            bare = SplitLayer(shard, split.mm, split.attend, no_reduce)
            row["split_no_allreduce_ms"] = time_graph(capture(fn(bare, "split"), graphs)[0], world=world)
            a, d = torch.empty_like(x), torch.empty_like(x)
            row["allreduce_ms"] = time_graph(capture(lambda: (all_reduce(a), all_reduce(d)), graphs)[0],
                                           world=world)
            row["allreduce_share"] = row["allreduce_ms"] / row["split_ms"]
        if rank == 0:
            full = lb.ours(bundle, wts)
            row["unsplit_ms"] = time_graph(capture(fn(full, "full"), graphs)[0])
            row["unsplit_tok_s"] = n / row["unsplit_ms"] * 1e3
        row["split_tok_s"] = n / row["split_ms"] * 1e3
        if rank == 0:
            row["speedup"] = row["unsplit_ms"] / row["split_ms"]
    release(graphs)
    if world > 1:
        dist.barrier()
    return row


def _ours_fns(bundle, shard):
    layer = lb.ours(bundle, shard)
    return layer.mm, layer.attend


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bundle", default=str(HERE.parent / "artifacts" / "default"))
    p.add_argument("--check", action="store_true", help="a small layer (hidden 1024, 8/2 heads of 128), "
                   "correctness only")
    p.add_argument("--out", default=None, help="rank 0 writes the rows here as JSON")
    a = p.parse_args()
    rank, world, local = start()
    bundle = Bundle.open(a.bundle)
    if a.check:
        dims = dict(hidden=1024, hq=8, hkv=2, hd=128, ffn=2048)
        prefill, decode = [[37, 128, 1, 90]], [(4, 300)]
    else:
        dims = dict(hidden=lb.HIDDEN, hq=lb.HQ, hkv=lb.HKV, hd=lb.HD, ffn=lb.FFN)
        prefill, decode = [[2048], [1024] * 4, [512, 1536, 3000, 3100]], [(1, 4096), (16, 4096), (64, 2048)]
    wts = lb.Weights(**dims, seed=0)
    shard = Shard(wts, rank, world)
    if rank != 0:
        del wts.wqkv, wts.wo, wts.wgu, wts.wdown
    gen = torch.Generator(device="cuda").manual_seed(1)
    if not a.check:
        lb.warm_gpu()
    rows, graphs = [], []
    tol = 2e-2
    with torch.inference_mode():
        for phase, specs in (("prefill", prefill), ("decode", decode)):
            for spec in specs:
                row = run_case(bundle, wts, shard, rank, world, phase, spec, gen, not a.check, graphs)
                if rank == 0:
                    print(json.dumps(row), flush=True)
                    rows.append(row)
                    bad = [k for k in ("rel_err_vs_unsplit", "rel_err_vs_torch") if not row[k] < tol]
                    if bad or not row["graph_vs_eager"] < 1e-3:
                        raise SystemExit(f"{phase} {spec}: {bad or 'graph_vs_eager'} over tolerance: {row}")
    if rank == 0:
        if rows and "split_ms" in rows[0]:
            print(table(rows, world), flush=True)
        if a.out:
            Path(a.out).write_text(json.dumps(rows, indent=1))
    print(f"rank {rank} cuda:{local} contexts after the run: {gpu_contexts()}", flush=True)
    finish(graphs)
    if rank == 0:
        print(f"world {world}: all {len(rows)} cases match the unsplit layer; process group destroyed", flush=True)
    return 0


def table(rows: list[dict], world: int) -> str:
    """Tokens/s of the unsplit layer on one GPU and of the split layer on ``world``, side by side."""
    lines = [f"{'case':<34} {'1 GPU tok/s':>12} {f'{world} GPUs tok/s':>13} {'speedup':>8} {'all-reduce share':>17}"]
    for r in rows:
        case = (f"prefill {r['tokens']} tokens / {r['sequences']} seqs" if r["phase"] == "prefill"
                else f"decode batch {r['batch']} context {r['context']}")
        share = f"{r['allreduce_share']:.1%}" if "allreduce_share" in r else "-"
        lines.append(f"{case:<34} {r['unsplit_tok_s']:>12,.0f} {r['split_tok_s']:>13,.0f} {r['speedup']:>7.2f}x "
                     f"{share:>17}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
