"""What the tensor-parallel examples share: process-group start and a teardown that cannot hang.

A CUDA graph that captured an NCCL collective keeps the communicator in use: while such a graph is
alive, ``destroy_process_group()`` (``ncclCommDestroy``) waits forever, on every rank.  So the
examples keep every graph they capture in one list and ``finish`` resets them all, synchronizes the
device, meets the other ranks at a barrier and only then destroys the group; a watchdog ends the
process with exit code 3 (and says so on stderr) if the teardown still takes longer than its limit,
so a hang becomes a visible failure instead of a process that never exits.
"""

from __future__ import annotations

import gc
import os
import sys
import threading

import torch
import torch.distributed as dist

import llama_block as lb

TEARDOWN_HUNG = 3


def start() -> tuple[int, int, int]:
    """Join the NCCL process group torchrun describes; returns (rank, world size, local rank) and
    makes the local rank's GPU the current device."""
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    return rank, world, local


def capture(fn, graphs: list):
    """``llama_block.capture``: ``fn`` run once on a side stream (modules loaded, NCCL's first-call
    setup done), then captured; returns (graph, the captured call's output).  The graph is also
    appended to ``graphs`` for ``finish``."""
    g, out = lb.capture(fn)
    graphs.append(g)
    return g, out


def release(graphs: list) -> None:
    """Reset (free) every graph in ``graphs`` and empty the list (after their replays have run)."""
    torch.cuda.synchronize()
    for g in graphs:
        g.reset()
    graphs.clear()
    gc.collect()


def finish(graphs: list, limit_s: float = 60.0) -> None:
    """Free the graphs, synchronize, barrier, destroy the process group; if that has not returned
    within ``limit_s`` seconds, exit with code ``TEARDOWN_HUNG`` (nothing is left to flush: the
    results were printed before)."""
    def hung():
        print(f"rank {dist.get_rank()}: process-group teardown still running after {limit_s:.0f} s; exiting",
              file=sys.stderr, flush=True)
        os._exit(TEARDOWN_HUNG)

    release(graphs)
    torch.cuda.synchronize()
    dog = threading.Timer(limit_s, hung)
    dog.daemon = True
    dog.start()
    dist.barrier()
    dist.destroy_process_group()
    dog.cancel()


def gpu_contexts() -> str:
    """This process's CUDA contexts as nvidia-smi lists them (bus id and MiB per GPU), or why not."""
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,gpu_bus_id,used_memory",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return f"nvidia-smi: {e}"
    mine = [line.split(", ")[1:] for line in out.splitlines() if line.split(", ")[0] == str(os.getpid())]
    return "; ".join(f"{bus} {mib} MiB" for bus, mib in mine) or "none listed"
