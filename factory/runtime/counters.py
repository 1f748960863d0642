"""Zeroed int32 counters on the device, shared by the kernels that count in them: int32 words that
are zero whenever no such kernel runs (each kernel sets the words it counts in back to 0 before it
ends: the last split or CTA to arrive does it).  Users: the decode variants whose last split merges
the others (``kvcache.counters``) and the dynamic persistent attention variants' tile counters
(``attention.tile_counters``).

Eager launches count in their stream's words: per device and stream one buffer, zeroed once when
allocated, grown (a new, larger buffer) when a problem needs more, never freed (a hot plan keeps its
pointer), so kernels running at the same time on two streams never share a word.

A launch captured into a CUDA graph counts in words of that capture: a slice of the device's arena
(a buffer made on the eager path, outside any capture and outside every graph's memory pool), zeroed
by a fill node captured before the launch (so at the start of every replay), one slice per capture
and stream, shared by that capture's later launches on that stream (they run one after another).  So
two graphs replayed at the same time on two streams count in words of their own, and so do a graph
and eager launches; and no tensor of the runtime's stays alive in a graph's pool after its capture
(torch.compile's CUDA graphs, ``mode="reduce-overhead"``, refuse such tensors).  Slices are never
reused (a graph may be replayed at any later time): when an arena is half used, the next eager call
starts a new one (the old ones are kept).  The capture is told apart by the driver's capture id
(``cuStreamGetCaptureInfo``); where the driver cannot say, where no arena was made yet (a capture
before any eager call) or the arena is full, a captured launch takes words of its own from the
graph's pool (one fill node per launch), held only until that launch is queued."""

from __future__ import annotations

import ctypes
import sys

import torch
from torch import Tensor

from . import devmem

_BUFFERS: dict = {}  # (device, stream handle) -> eager buffers, the newest last
_CAPTURED: dict = {}  # (device, stream handle) -> (capture id, its arena slice)
_ARENAS: dict = {}  # device -> [arena, words handed out]
_OLD_ARENAS: list = []  # earlier arenas (graphs may still count in their slices)
MIN_WORDS = 4096
ARENA_WORDS = 1 << 20  # 4 MiB of words per arena
_SLICE_ALIGN = 32  # words (128 bytes)
_CAPTURE_INFO = None  # the driver's cuStreamGetCaptureInfo (False: not available), bound on first use


def raw_stream(bundle, dev):
    """The raw handle of the current stream, as the launch will take it (None for a stand-in
    bundle without a device API, and for a device that is not CUDA's: one buffer then)."""
    api = getattr(bundle, "device_api", None)
    if api is None or dev.type != "cuda":
        return None
    cur, raw = api()
    return raw(cur())


_capturing = devmem.capturing  # (a module name of its own: tests simulate a capture through it)


def _bind_capture_info():
    """The driver's ``cuStreamGetCaptureInfo_v2`` (CUDA >= 11.3; optional outputs NULL) as a
    function ``stream -> capture id`` (None when the stream is not capturing), or False."""
    try:
        lib = ctypes.CDLL("nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1")
        fn = lib.cuStreamGetCaptureInfo_v2
    except (OSError, AttributeError):
        return False
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_uint64),
                   ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]

    def capture_id(stream):
        status, cid = ctypes.c_int(0), ctypes.c_uint64(0)
        if fn(stream or None, ctypes.byref(status), ctypes.byref(cid), None, None, None) != 0:
            return None
        return int(cid.value) if status.value == 1 else None  # CU_STREAM_CAPTURE_STATUS_ACTIVE

    return capture_id


def capture_id(stream) -> int | None:
    """The driver's id of the capture ``stream`` (a raw handle) is in, or None (not capturing, or
    a driver that cannot say)."""
    global _CAPTURE_INFO
    if _CAPTURE_INFO is None:
        _CAPTURE_INFO = _bind_capture_info()
    return _CAPTURE_INFO(stream) if _CAPTURE_INFO else None


def _new(dev, n: int, size: int | None = None) -> Tensor:
    """Zeroed words kept for the process (runtime/devmem.py: outside torch's pools; zeroed on the
    current stream, the one whose launches use them first)."""
    return devmem.full(max(n, size or 0), 0, torch.int32, dev)


def _arena(dev) -> None:
    """On the eager path (never inside a capture): make sure ``dev`` has an arena with room."""
    a = _ARENAS.get(dev)
    if a is None or a[1] > ARENA_WORDS // 2:
        if a is not None:
            _OLD_ARENAS.append(a[0])
        _ARENAS[dev] = [_new(dev, ARENA_WORDS), 0]


def _slice(dev, n: int) -> Tensor | None:
    """Inside a capture: ``n`` fresh words of the device's arena, zeroed by a captured fill, or None."""
    a = _ARENAS.get(dev)
    m = -(-n // _SLICE_ALIGN) * _SLICE_ALIGN
    if a is None or a[1] + m > a[0].numel():
        return None
    t = a[0][a[1]:a[1] + m]
    a[1] += m
    t.zero_()
    return t


def _captured(dev, n: int, stream) -> Tensor:
    """``n`` zeroed words of the capture ``stream`` is in (see the module's text)."""
    cid = capture_id(stream)
    if cid is not None:
        held = _CAPTURED.get((dev, stream))
        if held is not None and held[0] == cid and held[1].numel() >= n:
            return held[1]
        t = _slice(dev, n)
        if t is not None:
            _CAPTURED[(dev, stream)] = (cid, t)
            return t
    return torch.zeros(n, dtype=torch.int32, device=dev)  # words of this launch alone, from the graph's pool


def zeroed(dev, n: int, stream=None) -> tuple[Tensor, bool]:
    """The first ``n`` words (1-D int32) of the buffer of ``stream`` (a raw stream handle) on
    ``dev`` — while a CUDA graph is being captured, of that capture's words — and whether they are
    a capture's.  (A capture's words may be a launch's own: keep the tensor until it is queued.)"""
    if _capturing(dev):
        return _captured(dev, n, stream)[:n], True
    _arena(dev)
    kept = _BUFFERS.get((dev, stream))
    if kept is None or kept[-1].numel() < n:
        size = max(n, MIN_WORDS, 2 * kept[-1].numel() if kept else 0)
        _BUFFERS.setdefault((dev, stream), []).append(_new(dev, size))
        kept = _BUFFERS[(dev, stream)]
    return kept[-1][:n], False


def _is_capturing():
    f = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None)
    return f if f is not None else torch.cuda.is_current_stream_capturing


class StreamWords(dict):
    """stream handle -> the data pointer of ``n`` zeroed words of that stream on ``dev`` (a hot
    plan's lookup: ``words.ptr(stream)``, one capture query and one dict hit per call).  A miss finds
    them with :func:`zeroed`; eager streams' pointers are kept (buffers are never freed, and a
    newer, larger one leaves these valid); inside a capture each call asks :func:`zeroed` for the
    capture's words (never kept), whatever the stream did before."""

    def __init__(self, dev, n: int):
        super().__init__()
        self.dev, self.n = dev, n
        self.capturing = _is_capturing() if dev.type == "cuda" else (lambda: False)

    def ptr(self, stream) -> int:
        if self.capturing():
            self.keep = zeroed(self.dev, self.n, stream)[0]  # (a launch's own words: alive until queued)
            return self.keep.data_ptr()
        a = _ARENAS.get(self.dev)  # (room for the next capture's words, made while not capturing)
        if a is None or a[1] > ARENA_WORDS // 2:
            _arena(self.dev)
        return self[stream]

    def __missing__(self, stream) -> int:
        t, _ = zeroed(self.dev, self.n, stream if self.dev.type == "cuda" else None)
        self[stream] = t.data_ptr()
        return t.data_ptr()


def buffers(dev) -> list[Tensor]:
    """Every eager counter buffer of ``dev`` (each stream's, old ones included) and its arenas (the
    captures' words)."""
    out = [t for (d, _), kept in _BUFFERS.items() if d == dev for t in kept]
    return out + [a[0] for d, a in _ARENAS.items() if d == dev] + [t for t in _OLD_ARENAS if t.device == dev]


def buffer(dev, stream=None) -> Tensor | None:
    """The current buffer of ``stream`` on ``dev`` (None before the first kernel that counts in it)."""
    kept = _BUFFERS.get((dev, stream))
    return None if kept is None else kept[-1]
