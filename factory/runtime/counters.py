"""Zeroed int32 counters on the device, shared by the kernels that count in them: per device and
per stream, one buffer of int32 words that are zero whenever no such kernel runs (each kernel sets
the words it counts in back to 0 before it ends: the last split or CTA to arrive does it).  Zeroed
once when allocated, outside any CUDA-graph capture; grown (a new, larger buffer) when a problem
needs more; never freed, so that graphs captured with an older buffer keep valid pointers.  Users:
the decode variants whose last split merges the others (``kvcache.counters``) and the dynamic
persistent attention variants' tile counters (``attention.tile_counters``).

Streams: launches on different streams count in different words (each stream its own buffer), so
kernels running at the same time on two streams never share one.  A launch captured into a CUDA
graph counts in the device's graph words (allocated beside every stream's, since nothing can be
allocated and zeroed inside a capture), so graphs replayed at the same time on two streams share
them: replay such graphs on one stream at a time.  (A hot plan that already ran eagerly on the
capturing stream keeps that stream's words in the graph.)"""

from __future__ import annotations

import torch
from torch import Tensor

from .errors import LaunchError

_BUFFERS: dict = {}  # (device, stream handle or GRAPH) -> buffers, the newest last
GRAPH = "graph"
MIN_WORDS = 4096


def raw_stream(bundle, dev):
    """The raw handle of the current stream, as the launch will take it (None for a stand-in
    bundle without a device API, and for a device that is not CUDA's: one buffer then)."""
    api = getattr(bundle, "device_api", None)
    if api is None or dev.type != "cuda":
        return None
    cur, raw = api()
    return raw(cur())


def _capturing(dev) -> bool:
    return dev.type == "cuda" and torch.cuda.is_current_stream_capturing()


def _grow(dev, slot, n: int) -> None:
    kept = _BUFFERS.get((dev, slot))
    if kept is None or kept[-1].numel() < n:
        size = max(n, MIN_WORDS, 2 * kept[-1].numel() if kept else 0)
        _BUFFERS.setdefault((dev, slot), []).append(torch.zeros(size, dtype=torch.int32, device=dev))


def zeroed(dev, n: int, what: str, stream=None) -> tuple[Tensor, bool]:
    """The first ``n`` words (1-D int32) of the buffer of ``stream`` (a raw stream handle) on
    ``dev`` — of the device's graph words while a CUDA graph is being captured — and whether they
    are the graph words.  Allocated or grown here, never inside a capture (``what`` names the
    kernel in the error); every allocation outside a capture also grows the graph words to ``n``."""
    graph = _capturing(dev)
    slot = GRAPH if graph else stream
    kept = _BUFFERS.get((dev, slot))
    if kept is None or kept[-1].numel() < n:
        if graph:
            raise LaunchError(f"{what} needs {n} zeroed int32 counters on {dev} that the runtime has not "
                              f"allocated yet, and a CUDA graph is being captured (an allocation and its zeroing "
                              f"cannot be captured): run the same call once before capturing")
        _grow(dev, slot, n)
        _grow(dev, GRAPH, n)
        kept = _BUFFERS[(dev, slot)]
    return kept[-1][:n], graph


class StreamWords(dict):
    """stream handle -> the data pointer of ``n`` zeroed words of that stream on ``dev`` (a hot
    plan's lookup: one dict hit per call).  A miss finds them with :func:`zeroed`; eager streams'
    pointers are kept (buffers are never freed, and a newer, larger one leaves these valid), the
    graph words taken inside a capture are not (a later eager call on that stream gets its own)."""

    def __init__(self, dev, n: int, what: str):
        super().__init__()
        self.dev, self.n, self.what = dev, n, what

    def __missing__(self, stream) -> int:
        t, graph = zeroed(self.dev, self.n, self.what, stream if self.dev.type == "cuda" else None)
        if not graph:
            self[stream] = t.data_ptr()
        return t.data_ptr()


def buffers(dev) -> list[Tensor]:
    """Every counter buffer of ``dev`` (each stream's and the graph words, old ones included)."""
    return [t for (d, _), kept in _BUFFERS.items() if d == dev for t in kept]


def buffer(dev, stream=None) -> Tensor | None:
    """The current buffer of ``stream`` on ``dev`` (None before the first kernel that counts in it)."""
    kept = _BUFFERS.get((dev, stream))
    return None if kept is None else kept[-1]
