#!/usr/bin/env python3
"""A Llama-3-8B MLP block (hidden 4096, FFN 14336, SiLU-gated) split over the GPUs of one host with
torch.distributed (NCCL): the gate/up projection column-split, the down projection row-split, one
all-reduce; the bundle's GEMMs do the matmuls. One process per GPU:

    torchrun --nproc-per-node 2 examples/tensor_parallel_mlp.py --bundle artifacts/default
    torchrun --nproc-per-node 1 examples/tensor_parallel_mlp.py ...      # the single-GPU path

Every rank builds the same full weights from one seed and keeps its shard; rank 0 checks the result
against the unsplit block (torch's matmuls in float32) and prints tokens per second for
``--tokens`` tokens (graph-replay medians of the whole block, all-reduce included).  The graph
that captured the all-reduce is freed before the process group is destroyed (``tp_common.finish``):
with it alive, ``destroy_process_group()`` waits forever.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(Path(__file__).resolve().parent))

from factory.runtime import Bundle  # noqa: E402
from tp_common import capture, finish, start  # noqa: E402

HIDDEN, FFN = 4096, 14336


def shard(wgu, wdown, rank: int, world: int):
    """Rank's gate rows, up rows (column split of the first projection) and down columns (row split
    of the second): the block is then local up to one all-reduce of the down projection."""
    per = FFN // world
    g, u = wgu[:FFN], wgu[FFN:]
    gu = torch.cat([g[rank * per:(rank + 1) * per], u[rank * per:(rank + 1) * per]]).contiguous()
    return gu, wdown[:, rank * per:(rank + 1) * per].contiguous()


def block(bundle, x, gu, down, group=None):
    g, u = bundle.gemm(x, gu).chunk(2, dim=-1)
    y = bundle.gemm((F.silu(g) * u).contiguous(), down)
    if group is not None and dist.get_world_size(group) > 1:
        dist.all_reduce(y, group=group)
    return y


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--bundle", default=str(ROOT / "artifacts" / "default"))
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--iters", type=int, default=20)
    a = p.parse_args()
    rank, world, _local = start()
    if FFN % world:
        raise SystemExit(f"FFN {FFN} does not split over {world} ranks")
    bundle = Bundle.open(a.bundle)
    gen = torch.Generator(device="cuda").manual_seed(0)
    wgu = (torch.randn(2 * FFN, HIDDEN, device="cuda", generator=gen) / HIDDEN ** 0.5).bfloat16()
    wdown = (torch.randn(HIDDEN, FFN, device="cuda", generator=gen) / FFN ** 0.5).bfloat16()
    x = torch.randn(a.tokens, HIDDEN, device="cuda", generator=gen).bfloat16()
    gu, down = shard(wgu, wdown, rank, world)
    with torch.inference_mode():
        y = block(bundle, x, gu, down, dist.group.WORLD)
        if rank == 0:
            g, u = (x.float() @ wgu.float().T).chunk(2, dim=-1)
            ref = (F.silu(g) * u) @ wdown.float().T
            err = float((y.float() - ref).norm() / ref.norm())
            print(f"world {world}: rel err vs the unsplit block {err:.2e}", flush=True)
            assert err < 2e-2, err
        del wgu, wdown
        bundle.preload(("gemm",))
        graphs: list = []
        g, _ = capture(lambda: block(bundle, x, gu, down, dist.group.WORLD), graphs)
        ts = []
        for _ in range(a.iters):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            dist.barrier()
            e0.record()
            g.replay()
            e1.record()
            torch.cuda.synchronize()
            ts.append(e0.elapsed_time(e1))
    if rank == 0:
        ms = statistics.median(ts)
        print(f"world {world}: {ms:.3f} ms per block of {a.tokens} tokens, {a.tokens / ms * 1e3:,.0f} tokens/s", flush=True)
    del g
    finish(graphs)
    if rank == 0:
        print(f"world {world}: process group destroyed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
