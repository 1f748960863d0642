"""The bundle's host library through ctypes, and the binding of torch tensors to a variant's
calling convention.  Imports the standard library and torch only; never the DSL."""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path

from ..abi import ScalarArg, Signature, TensorArg

_CTYPES = {"int32_t": ctypes.c_int32, "int64_t": ctypes.c_int64, "float": ctypes.c_float,
           "double": ctypes.c_double}
_SCALAR_CTYPES = {"f32": ctypes.c_float, "i32": ctypes.c_int32}
_INT32_MAX = 2**31 - 1


class LaunchError(RuntimeError):
    pass


class HostLibrary:
    def __init__(self, path: Path):
        self.path = path
        self.lib = ctypes.CDLL(str(path))
        self.lib.fx_error_string.restype = ctypes.c_char_p
        self.lib.fx_error_string.argtypes = [ctypes.c_int32]
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
                if err:
                    raise LaunchError(f"loading {name}: {self.error(err)}")
                fn = getattr(self.lib, f"fx_launch_{name}")
                fn.restype = ctypes.c_int32
                fn.argtypes = [ctypes.c_void_p]
                self._launchers[name] = fn
        return fn


class Binder:
    """Turns a variant's arguments (torch tensors, numbers) into the C argument array.

    Built once per variant from its manifest entry: which modes are runtime sizes, the struct
    layouts read from the exported header, the divisibility contracts.
    """

    def __init__(self, entry: dict):
        self.name = entry["name"]
        self.sig = Signature.from_json(entry["signature"])
        params = entry["abi"]["params"][1:]  # [0] is the module
        structs = entry["abi"]["structs"]
        if len(params) != len(self.sig.args) + 1:
            raise LaunchError(f"{self.name}: header has {len(params)} parameters, signature {len(self.sig.args)}+stream")
        self.plan = []
        for a, (ctype, _pname) in zip(self.sig.args, params):
            if isinstance(a, TensorArg):
                st = structs[ctype.rstrip(" *")]
                dyn_shape = [i for i, d in enumerate(a.shape) if isinstance(d, str)]
                dyn_stride = [i for i, d in enumerate(a.stride) if isinstance(d, str)]
                if (len(dyn_shape), len(dyn_stride)) != (st["n_shapes"], st["n_strides"]):
                    raise LaunchError(f"{self.name}.{a.name}: header struct {st} does not match signature")
                fields = [("data", ctypes.c_void_p)]
                if st["n_shapes"]:
                    fields.append(("shapes", _CTYPES[st["shape_ctype"]] * st["n_shapes"]))
                if st["n_strides"]:
                    fields.append(("strides", _CTYPES[st["stride_ctype"]] * st["n_strides"]))
                cls = type(f"{self.name}_{a.name}", (ctypes.Structure,), {"_fields_": fields})
                self.plan.append((a, cls, dyn_shape, dyn_stride, st["shape_ctype"] == "int32_t"))
            else:
                self.plan.append((a, _SCALAR_CTYPES[a.dtype], None, None, None))

    def bind(self, values: list, stream: int):
        """Returns (argument array, objects to keep alive); raises ValueError on any mismatch."""
        syms: dict[str, int] = {}
        keep = []
        for (a, cls, dyn_shape, dyn_stride, shape32), val in zip(self.plan, values):
            if isinstance(a, ScalarArg):
                keep.append(cls(val))
                continue
            shape, stride = tuple(val.shape), tuple(val.stride())
            if len(shape) != len(a.shape):
                raise ValueError(f"{self.name}: {a.name} has rank {len(shape)}, expected {len(a.shape)}")
            for want_list, got_list, what in ((a.shape, shape, "size"), (a.stride, stride, "stride")):
                for mode, (want, got) in enumerate(zip(want_list, got_list)):
                    if isinstance(want, str):
                        if syms.setdefault(want, got) != got:
                            raise ValueError(f"{self.name}: {want} is {syms[want]} elsewhere but {a.name} has {got}")
                        d = self.sig.divisor(want)
                        if got % d:
                            raise ValueError(f"{self.name}: {a.name} {what} {got} (mode {mode}) must be a multiple of {d} "
                                             f"(16-byte alignment)")
                    elif want != got and not (what == "stride" and shape[mode] == 1):
                        raise ValueError(f"{self.name}: {a.name} {what} of mode {mode} is {got}, kernel needs {want}")
            ptr = val.data_ptr()
            if ptr % a.align:
                raise ValueError(f"{self.name}: {a.name} data pointer is not {a.align}-byte aligned")
            s = cls()
            s.data = ptr
            if dyn_shape:
                if shape32 and any(shape[i] > _INT32_MAX for i in dyn_shape):
                    raise ValueError(f"{self.name}: {a.name} sizes {shape} exceed the kernel's 32-bit size slots")
                s.shapes[:] = [shape[i] for i in dyn_shape]
            if dyn_stride:
                s.strides[:] = [stride[i] for i in dyn_stride]
            keep.append(s)
        keep.append(ctypes.c_void_p(stream))
        argv = (ctypes.c_void_p * len(keep))(*[ctypes.addressof(k) for k in keep])
        return argv, keep
