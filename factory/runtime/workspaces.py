"""Split-K workspaces kept per stream, so that a launch neither allocates nor zeroes one.

The in-kernel fix-ups (``gemm/sm90_splitk.py``, the "tiles" and "tail" forms) take one flat float32
workspace: one int32 semaphore per output tile (rounded up to 32 words), then the partial tiles.
The semaphores must be zero when a launch starts, and every launch leaves them zero (the last part
of a tile sets its semaphore back); the partial tiles are scratch.  Each split kernel waits for the
grid before it (``griddepcontrol.wait``) before its first memory access, so launches on one stream
never overlap in these words.

So each stream keeps one buffer: ``ZERO_WORDS`` words that are zero whenever no split kernel runs,
then scratch.  A launch whose problem has ``sem`` semaphore words gets the pointer ``ZERO_WORDS - sem``
words into the buffer: its semaphores are the last ``sem`` words of the zero region and its partial
tiles start right after it, so no launch ever writes a partial tile where a later, larger problem
expects a zero semaphore.

Eager launches use their stream's buffer (zeroed once when allocated; replaced by a larger one when a
problem needs more scratch: the old one is freed on its own stream, after the launches queued on it).
A launch captured into a CUDA graph uses a buffer of that capture (from the graph's memory pool, its
zero region filled at the start of every replay: one fill node per capture and stream instead of one
per launch), told apart by the driver's capture id as ``counters.py`` does; where the driver cannot
say, and for a problem of more than ``ZERO_WORDS`` semaphores, a launch gets a workspace of its own
(allocated and its semaphores zeroed on the launch stream).  :func:`release` gives the eager buffers
back to torch's allocator."""

from __future__ import annotations

import torch
from torch import Tensor

from . import counters

ZERO_WORDS = 16384  # the zero region: the semaphores of up to this many output tiles (64 KB)
_GRANULE = 1 << 18  # eager scratch grows in steps of this many words (1 MiB)
_EAGER: dict = {}  # (device, stream handle) -> the stream's buffer
_CAPTURED: dict = {}  # (device, stream handle) -> (capture id, its buffers, the newest last)


def _fresh(dev, words: int, sem: int) -> Tensor:
    t = torch.empty(words, dtype=torch.float32, device=dev)
    t[:sem].zero_()
    return t


def _captured(dev, stream, need: int) -> Tensor | None:
    cid = counters.capture_id(stream)
    if cid is None:
        return None
    held = _CAPTURED.get((dev, stream))
    if held is None or held[0] != cid:  # that stream's earlier capture ended: its graph keeps the memory
        held = _CAPTURED[(dev, stream)] = (cid, [])
    kept = held[1]
    if not kept or kept[-1].numel() < need:
        kept.append(_fresh(dev, need, ZERO_WORDS))
    return kept[-1]


def flat(dev, stream, words: int, sem: int) -> tuple[int, Tensor]:
    """The data pointer of a flat split-K workspace of ``words`` float32 words whose first ``sem``
    are zero (the semaphores), for a launch on ``stream`` (a raw handle) of ``dev``, and the tensor
    that holds it (keep it until the launch is queued)."""
    if sem > ZERO_WORDS or dev.type != "cuda":
        t = _fresh(dev, words, sem)
        return t.data_ptr(), t
    need = ZERO_WORDS + words - sem
    if torch.cuda.is_current_stream_capturing():
        t = _captured(dev, stream, need)
        if t is None:  # the driver cannot tell captures apart: a workspace of this launch alone
            t = _fresh(dev, words, sem)
            return t.data_ptr(), t
    else:
        t = _EAGER.get((dev, stream))
        if t is None or t.numel() < need:
            t = _EAGER[(dev, stream)] = torch.zeros(-(-need // _GRANULE) * _GRANULE, dtype=torch.float32,
                                                   device=dev)
    return t.data_ptr() + 4 * (ZERO_WORDS - sem), t


class StreamFlat:
    """A hot plan's workspace of one problem: ``get(stream)`` -> (data pointer, the tensor to keep
    until the launch is queued, or None): one capture query and one dict hit per call on the eager
    path (a stream's buffer is replaced only by a later, larger problem's call on that stream)."""

    def __init__(self, dev, words: int, sem: int):
        self.dev, self.words, self.sem = dev, words, sem
        self.need = ZERO_WORDS + words - sem
        self.offset = 4 * (ZERO_WORDS - sem)
        self.capturing = counters._is_capturing() if dev.type == "cuda" else (lambda: True)  # (CPU: per launch)

    def get(self, stream) -> tuple[int, Tensor | None]:
        if self.sem <= ZERO_WORDS and not self.capturing():
            t = _EAGER.get((self.dev, stream))
            if t is not None and t.numel() >= self.need:
                return t.data_ptr() + self.offset, None
        return flat(self.dev, stream, self.words, self.sem)


def release(device=None) -> None:
    """Drop the eager buffers (of ``device``, or of every device) and the runtime's hold on the latest
    captures' buffers; the next split launch on a stream allocates its buffer again."""
    for pool in (_EAGER, _CAPTURED):
        for key in [k for k in pool if device is None or k[0] == torch.device(device)]:
            del pool[key]


def held(dev=None) -> list[Tensor]:
    """The buffers the runtime holds (eager, and each stream's latest capture's)."""
    out = [t for (d, _), t in _EAGER.items() if dev is None or d == dev]
    return out + [t for (d, _), (_, kept) in _CAPTURED.items() if dev is None or d == dev for t in kept]
