"""Zeroed int32 counters on the device, shared by the kernels that count in them: per device, one
buffer of int32 words that are zero whenever no such kernel runs (each kernel sets the words it
counts in back to 0 before it ends: the last split or CTA to arrive does it).  Zeroed once when
allocated, outside any CUDA-graph capture; grown (a new, larger buffer) when a problem needs more;
never freed, so that graphs captured with an older buffer keep valid pointers.  Users: the decode
variants whose last split merges the others (``kvcache.counters``) and the dynamic persistent
attention variants' tile counters (``attention.tile_counters``).

One stream: launches that may run at the same time (on two streams) must not share the words,
and the buffers are per device for the whole process (every bundle's launches count in them): a
server that runs such kernels on two streams at once gives each stream its own process."""

from __future__ import annotations

import torch
from torch import Tensor

from .errors import LaunchError

_BUFFERS: dict = {}
MIN_WORDS = 4096


def zeroed(dev, n: int, what: str) -> Tensor:
    """The first ``n`` words of ``dev``'s buffer (1-D int32), allocated or grown here, never inside a
    capture (``what`` names the kernel in the error)."""
    kept = _BUFFERS.get(dev)
    if kept is None or kept[-1].numel() < n:
        if dev.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise LaunchError(f"{what} needs {n} zeroed int32 counters on {dev} that the runtime has not "
                              f"allocated yet, and a CUDA graph is being captured (an allocation and its zeroing "
                              f"cannot be captured): run the same call once before capturing")
        size = max(n, MIN_WORDS, 2 * kept[-1].numel() if kept else 0)
        kept = _BUFFERS.setdefault(dev, [])
        kept.append(torch.zeros(size, dtype=torch.int32, device=dev))
    return kept[-1][:n]


def buffer(dev) -> Tensor | None:
    """``dev``'s current counter buffer (None before the first kernel that counts in it)."""
    kept = _BUFFERS.get(dev)
    return None if kept is None else kept[-1]
