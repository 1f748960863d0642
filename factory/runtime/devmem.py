"""Device memory the runtime keeps from one call to the next, taken from the driver, outside torch's
caching allocator.

The runtime keeps a few tensors across calls: per-stream counter words and split-K workspaces, the
arena of captured counter words, the LSE scratch, the stand-ins of arguments a call leaves out (unit
scales, -inf sinks, a one-entry block table), and the one-element prototypes the hot paths allocate
outputs from.  Made by torch's allocator they would land in whatever pool is current when they are
first needed — inside ``torch.compile(mode="reduce-overhead")``'s warm-up runs that is its CUDA-graph
pool, and torch refuses to record a graph while a tensor of that pool it does not track stays alive.
So these come from ``cuMemAlloc`` (the device's primary context) and are wrapped as tensors through
``__cuda_array_interface__``: torch sees them, no pool owns them.  They are made only outside a graph
capture (allocation is not allowed during one) and live as long as the process, except what
:func:`free` gives back (after a device synchronisation).  Where the driver cannot be reached
(no libcuda, a CPU tensor) torch's allocator is used."""

from __future__ import annotations

import ctypes
import sys

import torch
from torch import Tensor

_DRIVER = None  # the bound driver functions (False: not available)
_CTX: dict = {}  # device index -> its primary context
_ANCHORS: dict = {}  # device -> 256 bytes the prototypes view
_PROTOS: dict = {}  # (device, dtype) -> a one-element tensor of the anchor
_LIVE: dict = {}  # data pointer -> (device index, its allocation), until freed


class _Allocation:
    """One driver allocation, seen by torch through ``__cuda_array_interface__`` (torch keeps this
    object alive as long as a tensor of it lives)."""

    def __init__(self, ptr: int, nbytes: int):
        self.ptr, self.nbytes = ptr, nbytes
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False),
                                         "version": 3, "strides": None}


def _bind():
    try:
        lib = ctypes.CDLL("nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1")
        fns = {n: getattr(lib, n) for n in ("cuDeviceGet", "cuDevicePrimaryCtxRetain", "cuCtxPushCurrent_v2",
                                             "cuCtxPopCurrent_v2", "cuMemAlloc_v2", "cuMemFree_v2")}
    except (OSError, AttributeError):
        return False
    for f in fns.values():
        f.restype = ctypes.c_int
    return fns


def _driver_alloc(index: int, nbytes: int) -> int | None:
    global _DRIVER
    if _DRIVER is None:
        _DRIVER = _bind()
    if not _DRIVER:
        return None
    d = _DRIVER
    ctx = _CTX.get(index)
    if ctx is None:
        cudev, c = ctypes.c_int(0), ctypes.c_void_p(0)
        if d["cuDeviceGet"](ctypes.byref(cudev), ctypes.c_int(index)) != 0:
            return None
        if d["cuDevicePrimaryCtxRetain"](ctypes.byref(c), cudev) != 0:
            return None
        ctx = _CTX[index] = c
    if d["cuCtxPushCurrent_v2"](ctx) != 0:
        return None
    ptr = ctypes.c_uint64(0)
    try:
        err = d["cuMemAlloc_v2"](ctypes.byref(ptr), ctypes.c_size_t(max(nbytes, 1)))
    finally:
        d["cuCtxPopCurrent_v2"](ctypes.byref(ctypes.c_void_p(0)))
    return ptr.value if err == 0 else None


def capturing(dev) -> bool:
    return dev.type == "cuda" and torch.cuda.is_current_stream_capturing()


def empty(numel: int, dtype, dev) -> Tensor:
    """A 1-D tensor of ``numel`` elements kept for the process (contents undefined): driver memory on
    a CUDA device outside a capture, else torch's allocator's."""
    nbytes = numel * dtype.itemsize
    if dev.type == "cuda" and not capturing(dev):
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        ptr = _driver_alloc(index, nbytes)
        if ptr is not None:
            a = _Allocation(ptr, nbytes)
            _LIVE[ptr] = (index, a)
            raw = torch.as_tensor(a, device=torch.device("cuda", index))
            return raw.view(dtype)[:numel] if numel else raw[:0].view(dtype)
    return torch.empty(numel, dtype=dtype, device=dev)


def full(numel: int, value, dtype, dev, sync: bool = False) -> Tensor:
    """:func:`empty` filled with ``value`` on the current stream (``sync``: and that stream waited
    for, so that a launch on any stream may read it)."""
    t = empty(numel, dtype, dev)
    t.fill_(value)
    if sync and dev.type == "cuda":
        torch.cuda.current_stream(dev).synchronize()
    return t


def proto(dtype, dev) -> Tensor:
    """A one-element tensor of ``dtype`` on ``dev`` that no pool owns: ``proto.expand(shape)`` is the
    template a hot path's ``empty_like`` makes outputs from (contents never read)."""
    key = (dev, dtype)
    p = _PROTOS.get(key)
    if p is None:
        if capturing(dev):
            return torch.empty(1, dtype=dtype, device=dev)  # (not kept: a capture's pool)
        anchor = _ANCHORS.get(dev)
        if anchor is None:
            anchor = _ANCHORS[dev] = empty(256, torch.uint8, dev)
        size = dtype.itemsize
        p = _PROTOS[key] = anchor[:size].view(dtype)
    return p


def free(tensors) -> None:
    """Give the driver memory of ``tensors`` (made by :func:`empty`) back, after the devices finished
    every queued launch; the caller holds no other view of them.  Others (torch's) are left to torch."""
    got = [_LIVE.pop(t.data_ptr()) for t in tensors if t.data_ptr() in _LIVE]
    for index in {i for i, _ in got}:
        torch.cuda.synchronize(index)
    for index, a in got:
        if _DRIVER and _DRIVER["cuCtxPushCurrent_v2"](_CTX[index]) == 0:
            try:
                _DRIVER["cuMemFree_v2"](ctypes.c_uint64(a.ptr))
            finally:
                _DRIVER["cuCtxPopCurrent_v2"](ctypes.byref(ctypes.c_void_p(0)))
