"""The bundle's host library through ctypes, and the binding of torch tensors to a variant's
calling convention.  Imports the standard library and torch only; never the DSL."""

from __future__ import annotations

import ctypes
import struct
import threading
from pathlib import Path

from ..abi import ScalarArg, Signature, TensorArg

from .errors import InputError, LaunchError

_FMT = {"int32_t": "i", "int64_t": "q"}
_SCALAR_FMT = {"f32": "f", "i32": "i"}
_INT32_MAX = 2**31 - 1


class HostLibrary:
    def __init__(self, path: Path):
        self.path = path
        self.lib = ctypes.CDLL(str(path))
        self.lib.fx_error_string.restype = ctypes.c_char_p
        self.lib.fx_error_string.argtypes = [ctypes.c_int32]
        self.lib.fx_last_error_message.restype = ctypes.c_char_p
        self._lock = threading.Lock()
        self._launchers: dict[str, object] = {}

    def error(self, code: int) -> str:
        return f"{self.lib.fx_error_string(code).decode()} ({code})"

    def launcher(self, name: str):
        """The variant's launch function, loading its module (on every device) the first time."""
        fn = self._launchers.get(name)
        if fn is not None:
            return fn
        with self._lock:
            fn = self._launchers.get(name)
            if fn is None:
                load = getattr(self.lib, f"fx_load_{name}")
                load.restype = ctypes.c_int32
                err = load()
                if err:  # (the load names its error: no usable driver or device, or the driver's refusal)
                    why = self.lib.fx_last_error_message().decode(errors="replace")
                    raise LaunchError(f"{why or f'loading {name}: ' + self.error(err)} ({err})")
                fn = getattr(self.lib, f"fx_launch_{name}")
                fn.restype = ctypes.c_int32
                fn.argtypes = [ctypes.c_void_p]
                self._launchers[name] = fn
        return fn


class Binder:
    """Turns a variant's arguments into the C argument array, fast.

    Built once per variant from its manifest entry: which modes are runtime sizes, the struct
    layouts read from the exported header, the divisibility contracts.  Every tensor argument is a
    *spec* ``(data_ptr, shape, stride)`` (or a torch tensor).  A spec set is validated in full the
    first time its (shapes, strides, pointer alignment) key is seen; after that a launch only packs
    bytes into a per-thread buffer whose argument array was built once.
    """

    def __init__(self, entry: dict):
        self.name = entry["name"]
        self.sig = Signature.from_json(entry["signature"])
        # a paged variant that takes its page size at launch addresses pages by shifts: only the
        # sizes it was built for (the manifest's page_sizes) give right answers
        self.page_sizes = tuple(entry.get("page_sizes") or ())
        params = entry["abi"]["params"][1:]  # [0] is the module
        structs = entry["abi"]["structs"]
        if len(params) != len(self.sig.args) + 1:
            raise LaunchError(f"{self.name}: header has {len(params)} parameters, signature {len(self.sig.args)}+stream")
        self.plan = []  # per argument: (arg, struct format or scalar format, dyn shape modes, dyn stride modes)
        offset = 0
        offsets = []
        for a, (ctype, _pname) in zip(self.sig.args, params):
            if isinstance(a, TensorArg):
                st = structs[ctype.rstrip(" *")]
                dyn_shape = tuple(i for i, d in enumerate(a.shape) if isinstance(d, str))
                dyn_stride = tuple(i for i, d in enumerate(a.stride) if isinstance(d, str))
                if (len(dyn_shape), len(dyn_stride)) != (st["n_shapes"], st["n_strides"]):
                    raise LaunchError(f"{self.name}.{a.name}: header struct {st} does not match signature")
                fmt = "=Q" + _FMT[st["shape_ctype"]] * st["n_shapes"]
                if st["n_strides"]:  # natural C alignment of the stride array
                    pad = -struct.calcsize(fmt) % struct.calcsize(_FMT[st["stride_ctype"]])
                    fmt += "x" * pad + _FMT[st["stride_ctype"]] * st["n_strides"]
                fmt += "x" * (-struct.calcsize(fmt) % 8)
                self.plan.append((a, fmt, dyn_shape, dyn_stride, st["shape_ctype"] == "int32_t"))
            else:
                fmt = "=" + _SCALAR_FMT[a.dtype] + "xxxx"
                self.plan.append((a, fmt, None, None, None))
            offsets.append(offset)
            offset += struct.calcsize(fmt)
        self.offsets = offsets
        self.stream_offset = offset
        self.size = offset + 8
        self._checked: set = set()
        self._tls = threading.local()
        self.pack_into = self._make_packer()

    def _make_packer(self):
        """One generated ``struct.pack_into`` call that writes every argument and the stream (the
        hot path of a launch: no loops, no per-argument Python work)."""
        fmt, items = "=", []
        for i, (a, afmt, dyn_shape, dyn_stride, _) in enumerate(self.plan):
            fmt += afmt[1:]
            if dyn_shape is None:
                items.append(f"s[{i}]")
            else:
                items += [f"s[{i}][0]"] + [f"s[{i}][1][{m}]" for m in dyn_shape] + [f"s[{i}][2][{m}]" for m in dyn_stride]
        fmt += "Q"
        assert struct.calcsize(fmt) == self.size
        src = f"def pack(buf, s, stream):\n    _pack({fmt!r}, buf, 0, {', '.join(items)}, stream)\n"
        ns = {"_pack": struct.pack_into}
        exec(src, ns)  # noqa: S102 - source built above from the manifest's struct layouts
        return ns["pack"]

    def _buffers(self):
        bufs = getattr(self._tls, "bufs", None)
        if bufs is None:
            buf = ctypes.create_string_buffer(self.size)
            base = ctypes.addressof(buf)
            argv = (ctypes.c_void_p * (len(self.plan) + 1))(*[base + o for o in self.offsets], base + self.stream_offset)
            bufs = self._tls.bufs = (buf, argv)
        return bufs

    @staticmethod
    def spec(t) -> tuple[int, tuple, tuple]:
        return t.data_ptr(), tuple(t.shape), tuple(t.stride())

    def bind(self, values: list, stream: int, device: int | None, host_ok: bool = False):
        """The argument array for ``values`` (specs, tensors or numbers); raises InputError on any
        mismatch with the kernel's contract, and when a tensor is not on CUDA device ``device``
        (None: the caller has checked; a CPU tensor is accepted only with ``host_ok``: simulated
        launches).  Valid until this thread's next bind of this variant."""
        if len(values) != len(self.plan):
            raise InputError(f"{self.name} takes {len(self.plan)} arguments ({', '.join(a.name for a, *_ in self.plan)}), "
                             f"got {len(values)}")
        specs = []
        for (a, *_), v in zip(self.plan, values):
            if isinstance(v, (tuple, int, float)):
                specs.append(v)
                continue
            d = device if device is None else v.get_device()
            if d != device or (d is not None and d < 0 and not host_ok):
                where = f"cuda:{d}" if d >= 0 else "the CPU"
                raise InputError(f"{self.name}: {a.name} is on {where}; every tensor must be on the current "
                                 f"CUDA device (cuda:{device})")
            specs.append(self.spec(v))
        key = tuple((s[0] % 16, s[1], s[2]) if isinstance(s, tuple) else None for s in specs)
        if key not in self._checked:
            self.check(specs)
            if len(self._checked) > 4096:
                self._checked.clear()
            self._checked.add(key)
        return self.pack(specs, stream)

    def pack(self, specs: list, stream: int):
        """Pack already-validated specs (see ``bind``) into this thread's argument buffer."""
        buf, argv = self._buffers()
        self.pack_into(buf, specs, stream)
        return argv, buf

    def check(self, specs: list) -> None:
        syms: dict[str, int] = {}
        for (a, _fmt, dyn_shape, _ds, shape32), s in zip(self.plan, specs):
            if isinstance(a, ScalarArg):
                if isinstance(s, bool) or not isinstance(s, (int, float)):
                    raise InputError(f"{self.name}: {a.name} must be a number, got {type(s).__name__}")
                continue
            if not (isinstance(s, tuple) and len(s) == 3):
                raise InputError(f"{self.name}: {a.name} must be a tensor or a (data_ptr, shape, stride) spec, "
                                 f"got {type(s).__name__}")
            ptr, shape, stride = s
            if len(shape) != len(a.shape):
                raise InputError(f"{self.name}: {a.name} has rank {len(shape)}, expected {len(a.shape)}")
            for want_list, got_list, what in ((a.shape, shape, "size"), (a.stride, stride, "stride")):
                for mode, (want, got) in enumerate(zip(want_list, got_list)):
                    if isinstance(want, str):
                        if syms.setdefault(want, got) != got:
                            raise InputError(f"{self.name}: {want} is {syms[want]} elsewhere but {a.name} has {got}")
                        d = self.sig.divisor(want)
                        if got % d:
                            raise InputError(f"{self.name}: {a.name} {what} {got} (mode {mode}) must be a multiple of {d} "
                                             f"(16-byte alignment)")
                    elif want != got and not (what == "stride" and shape[mode] == 1):
                        raise InputError(f"{self.name}: {a.name} {what} of mode {mode} is {got}, kernel needs {want}")
            if ptr % a.align:
                raise InputError(f"{self.name}: {a.name} data pointer is not {a.align}-byte aligned")
            if shape32 and any(shape[i] > _INT32_MAX for i in dyn_shape):
                raise InputError(f"{self.name}: {a.name} sizes {shape} exceed the kernel's 32-bit size slots")
        if self.page_sizes and "PS" in syms and syms["PS"] not in self.page_sizes:
            raise InputError(f"{self.name}: page size {syms['PS']} is not one this variant was built for "
                             f"({', '.join(map(str, self.page_sizes))})")

    def fixed(self, fn, specs: list) -> "FixedLaunch":
        """``fn`` (the variant's launcher) bound to these specs' sizes, strides and scalars, which
        are checked here, in full: see :class:`FixedLaunch`."""
        return FixedLaunch(self, fn, specs)


class FixedLaunch:
    """One variant's launch for one problem whose sizes, strides and scalars are fixed and were
    checked once (``Binder.check``): a call writes only the data pointers and the stream into
    this thread's copy of the packed arguments, and calls the launcher.  The ops keep one per
    problem key (the hot path of an eager call).

    ``go(p0, p1, ..., stream)`` takes the data pointers of the tensor arguments in signature
    order and returns the launcher's code (0: launched), or None without launching when a
    pointer breaks its argument's alignment contract (the caller then takes its checked path,
    which names the argument)."""

    def __init__(self, binder: Binder, fn, specs: list):
        binder.check(specs)
        self.name = binder.name
        tensors = [i for i, (a, *_) in enumerate(binder.plan) if isinstance(a, TensorArg)]
        template = ctypes.create_string_buffer(binder.size)
        binder.pack_into(template, [(0, *s[1:]) if i in tensors else s for i, s in enumerate(specs)], 0)
        slots = [binder.offsets[i] for i in tensors] + [binder.stream_offset]
        assert all(o % 8 == 0 for o in slots) and binder.size % 8 == 0  # every pointer is a whole u64
        offsets = [*binder.offsets, binder.stream_offset]
        n = len(tensors)
        by_align: dict[int, list[str]] = {}
        for j, i in enumerate(tensors):
            if binder.plan[i][0].align > 1:
                by_align.setdefault(binder.plan[i][0].align, []).append(f"p{j}")
        test = " or ".join(f"({' | '.join(ps)}) & {al - 1}" for al, ps in sorted(by_align.items()))
        ptrs = ", ".join(f"p{j}" for j in range(n))
        src = (f"def go({ptrs}, stream):\n"
               + (f"    if {test}:\n        return None\n" if test else "")
               + "    try:\n        mv, argv = tls.b\n    except AttributeError:\n        mv, argv = new()\n"
               + "".join(f"    mv[{o // 8}] = p{j}\n" for j, o in enumerate(slots[:-1]))
               + f"    mv[{slots[-1] // 8}] = stream\n    return fn(argv)\n")
        raw, size, tls = template.raw, binder.size, threading.local()

        def new():
            buf = ctypes.create_string_buffer(raw, size)
            base = ctypes.addressof(buf)
            argv = (ctypes.c_void_p * len(offsets))(*[base + o for o in offsets])
            argv._buf = buf  # (the array keeps the buffer alive)
            tls.b = (memoryview(buf).cast("B").cast("Q"), argv)
            return tls.b

        ns = {"tls": tls, "new": new, "fn": fn}
        exec(src, ns)  # noqa: S102 - source built above from the variant's argument layout
        self.go = ns["go"]
        self.source = src
        self._parts = (ns, slots, test)

    def inline(self, params: str, setup: str, ptrs: list[str], result: str, names: dict, stream: str = "raw(here)",
               checks: str = ""):
        """One function ``def f(<params>)`` that runs a whole hot-path call in one Python frame:
        ``setup`` (source lines indented by four spaces, run first: allocations, the device
        check), then the tensor arguments' data pointers ``ptrs`` (one expression each, in
        signature order, bound to ``p0``, ``p1`` ...), their alignment test and ``checks`` (lines
        that may ``return None`` too; None means nothing was launched: the caller's checked path
        then names what is wrong), the writes of the pointers and of ``stream`` into this thread's copy of
        the packed arguments, the launch, and ``return <result>``; a launch that fails raises
        LaunchError.  ``names``: what the lines use besides the launch's own (``empty_like``,
        ``cur``, ``raw``, ``error`` (code -> text) ...).  (``go`` does the same work for callers
        that compute the pointers themselves; this saves its frame and argument passing.)"""
        ns0, slots, test = self._parts
        if len(ptrs) != len(slots) - 1:
            raise ValueError(f"{self.name}: {len(slots) - 1} tensor arguments, {len(ptrs)} pointers given")
        src = (f"def f({params}):\n{setup}"
               + "".join(f"    p{j} = {e}\n" for j, e in enumerate(ptrs))
               + (f"    if {test}:\n        return None\n" if test else "") + checks
               + "    try:\n        mv, argv = tls.b\n    except AttributeError:\n        mv, argv = new()\n"
               + "".join(f"    mv[{o // 8}] = p{j}\n" for j, o in enumerate(slots[:-1]))
               + f"    mv[{slots[-1] // 8}] = {stream}\n    err = fn(argv)\n"
               + "    if err:\n        raise LaunchError(name + ': launch failed: ' + error(err))\n"
               + f"    return {result}\n")
        ns = {**names, **ns0, "LaunchError": LaunchError, "name": self.name}
        exec(src, ns)  # noqa: S102 - source built from the variant's argument layout and the op's lines
        f = ns["f"]
        f.source, f.fixed = src, self
        return f
