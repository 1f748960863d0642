"""Split-K workspaces kept per stream, so that an eager launch neither allocates nor zeroes one.

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

Eager launches use their stream's buffer (driver memory outside torch's pools, runtime/devmem.py;
zeroed once when allocated; replaced by one at least twice as large when a problem needs more
scratch: the old one is kept, launches queued before may still use it, until :func:`release`).
A launch captured into a CUDA graph takes a workspace of its own from the graph's memory pool, its
semaphores zeroed by a fill node captured before it, held only until the launch is queued: a buffer
kept across a capture would be a live tensor in the graph's pool, which torch.compile's CUDA graphs
(``mode="reduce-overhead"``) refuse, and the partial tiles are too large for a never-reused slice
per capture (``counters.py`` does that for its few words).  So do problems of more than
``ZERO_WORDS`` semaphores.  :func:`release` gives the eager buffers back."""

from __future__ import annotations

import torch
from torch import Tensor

from . import counters, devmem

ZERO_WORDS = 16384  # the zero region: the semaphores of up to this many output tiles (64 KB)
_GRANULE = 1 << 18  # eager scratch grows in steps of this many words (1 MiB)
_EAGER: dict = {}  # (device, stream handle) -> the stream's buffer
_RETIRED: list = []  # buffers replaced by larger ones (launches queued before may still use them)


def _fresh(dev, words: int, sem: int) -> Tensor:
    t = torch.empty(words, dtype=torch.float32, device=dev)
    t[:sem].zero_()
    return t


def flat(dev, stream, words: int, sem: int) -> tuple[int, Tensor]:
    """The data pointer of a flat split-K workspace of ``words`` float32 words whose first ``sem``
    are zero (the semaphores), for a launch on ``stream`` (a raw handle) of ``dev``, and the tensor
    that holds it (keep it until the launch is queued)."""
    if sem > ZERO_WORDS or dev.type != "cuda" or devmem.capturing(dev):
        t = _fresh(dev, words, sem)
        return t.data_ptr(), t
    need = ZERO_WORDS + words - sem
    t = _EAGER.get((dev, stream))
    if t is None or t.numel() < need:
        if t is not None:
            _RETIRED.append(t)
        size = -(-max(need, 2 * t.numel() if t is not None else 0) // _GRANULE) * _GRANULE
        t = _EAGER[(dev, stream)] = devmem.full(size, 0, torch.float32, dev)  # (outside torch's pools)
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
    """Give the eager buffers (of ``device``, or of every device) back, after the device finished what
    was queued on them; the next split launch on a stream allocates its buffer again."""
    dev = None if device is None else torch.device(device)
    gone = [_EAGER.pop(k) for k in [k for k in _EAGER if dev is None or k[0] == dev]]
    gone += [t for t in _RETIRED if dev is None or t.device == dev]
    _RETIRED[:] = [t for t in _RETIRED if not (dev is None or t.device == dev)]
    devmem.free(gone)


def held(dev=None) -> list[Tensor]:
    """The eager buffers the runtime holds."""
    return [t for (d, _), t in _EAGER.items() if dev is None or d == dev]
