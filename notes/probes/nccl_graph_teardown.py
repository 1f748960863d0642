#!/usr/bin/env python3
"""Does destroy_process_group() return after a CUDA graph captured an NCCL all-reduce?  Plain
torch, no bundle.  One process per GPU:

    torchrun --nproc-per-node 2 notes/probes/nccl_graph_teardown.py           # graph alive
    torchrun --nproc-per-node 2 notes/probes/nccl_graph_teardown.py --free    # reset first

Each rank prints when the teardown returns; run it under a timeout.  Answer on two H200s (torch
2.11.0+cu130, NCCL 2.28.9, 2026-11-26): with the graph reset first, 0.47 / 0.49 s; with it alive,
still running after 25 s (killed).  notes/multi-gpu.md."""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--free", action="store_true", help="reset the graph and synchronize before the teardown")
    a = p.parse_args()
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    x = torch.ones(1 << 20, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        dist.all_reduce(x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        dist.all_reduce(x)
    x.fill_(1.0)
    g.replay()
    torch.cuda.synchronize()
    ok = float(x[0]) == dist.get_world_size()
    if a.free:
        g.reset()
        del g
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    dist.destroy_process_group()
    print(f"rank {local}: replayed sum right: {ok}; destroy_process_group returned after "
          f"{time.perf_counter() - t0:.2f} s (graph {'freed' if a.free else 'alive'})", flush=True)


if __name__ == "__main__":
    main()
