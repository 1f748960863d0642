"""``Bundle``: open a built bundle, pick the variant for the device and problem, launch it.

No DSL, no MLIR: the standard library, torch, and the bundle's host library via ctypes.
"""

from __future__ import annotations

import threading
from pathlib import Path

from ..atoms.targets import get_target, targets_for_capability
from .loader import Binder, HostLibrary, LaunchError
from .manifest import BundleError, file_ok, load_manifest
from .packed import PackedB


class NoVariantError(LookupError):
    pass


_OPS: dict = {}  # op name -> its entry point in runtime/<op>.py (bound on first use)
_RAW_STREAM = None  # () -> torch's current raw stream (bound on first use)


def current_stream() -> int:
    """torch's current CUDA stream on the current device, as its raw ``cudaStream_t``.
    ``torch.cuda.current_stream()`` builds a Stream object per call (7.6-8.0 µs on the H100's
    host, session 4: most of a launch's Python cost); torch's own launchers (Inductor's, Triton's) read the
    raw handle as done here, which torch versions without it fall back from."""
    global _RAW_STREAM
    if _RAW_STREAM is None:
        import torch

        raw, dev = (getattr(torch._C, n, None) for n in ("_cuda_getCurrentRawStream", "_cuda_getDevice"))
        if raw is None or dev is None:
            _RAW_STREAM = lambda: torch.cuda.current_stream().cuda_stream  # noqa: E731
        else:
            _RAW_STREAM = lambda: raw(dev())  # noqa: E731
    return _RAW_STREAM()


def _op(name: str):
    """``runtime/<name>.py``'s entry point.  Those modules import this one, so they are bound on
    first use, then found in a dict (an import statement per launch costs about a microsecond)."""
    fn = _OPS.get(name)
    if fn is None:
        import importlib

        module = "packed" if name == "gemm_packed" else name
        fn = _OPS[name] = getattr(importlib.import_module(f".{module}", __package__), name)
    return fn


class Bundle:
    def __init__(self, path: Path, manifest: dict, capability: tuple[int, int] | None,
                 device: dict | None = None):
        self.path = path
        self.manifest = manifest
        self._capability = capability
        self._device = device
        self._tuning = None  # (tuning.Tuning | None, why), read on the first selection
        self._lib: HostLibrary | None = None
        self._binders: dict[str, Binder] = {}
        self._select_cache: dict[tuple, str] = {}
        self._max_clusters: dict[str, int] = {}  # persistent grid caps (runtime/gemm.py)
        self._early_b: dict[str, str] = {}  # variant -> its early_b twin (runtime/gemm.py)
        self._unit_scales: dict = {}  # device -> float32 [1.0], fp8's default scale (runtime/gemm.py)
        self._lock = threading.Lock()

    @classmethod
    def open(cls, path: str | Path, capability: tuple[int, int] | None = None,
             device: dict | None = None) -> "Bundle":
        """Open and check a bundle.  ``capability`` overrides the current device's (for tests and
        for planning on a machine without the GPU); so does ``device`` ({"name", "sm_count"}),
        which decides whether the bundle's tuning.json applies."""
        path = Path(path)
        m = load_manifest(path)
        if not file_ok(path, m["host_library"]):
            raise BundleError(f"{path}: host library {m['host_library']['path']} is missing or its sha256 "
                              f"does not match the manifest")
        return cls(path, m, capability, device)

    # --- device -----------------------------------------------------------------------------------
    @property
    def capability(self) -> tuple[int, int]:
        if self._capability is None:
            import torch

            if not torch.cuda.is_available():
                raise NoVariantError("no CUDA device is visible")
            self._capability = tuple(torch.cuda.get_device_capability())
        return self._capability

    def device_info(self) -> dict:
        """{"name", "sm_count"} of the device selection is for (without a GPU and without an
        override: unknown name, an H100 SXM's 132 SMs)."""
        if self._device is None:
            try:
                import torch

                p = torch.cuda.get_device_properties(torch.cuda.current_device())
                self._device = {"name": p.name, "sm_count": p.multi_processor_count}
            except Exception:  # noqa: BLE001 - no device: plan for an H100 SXM, never use tuning
                self._device = {"name": None, "sm_count": 132}
        return self._device

    @property
    def tuning(self):
        """The bundle's GEMM tuning table for this device, or None (see runtime/tuning.py)."""
        if self._tuning is None:
            from . import tuning

            self._tuning = tuning.load(self.path, self.device_info())
        return self._tuning[0]

    def device_name(self) -> str:
        return f"compute capability {self.capability[0]}.{self.capability[1]}"

    def candidates(self, op: str) -> list[dict]:
        """Manifest entries of ``op`` runnable on this device, best target first."""
        order = {t.name: i for i, t in enumerate(targets_for_capability(self.capability))}
        fit = [v for v in self.manifest["variants"].values() if v["op"] == op and v["target"] in order]
        return sorted(fit, key=lambda v: order[v["target"]])

    def describe_contents(self, op: str | None = None) -> str:
        by_target: dict[str, int] = {}
        for v in self.manifest["variants"].values():
            if op is None or v["op"] == op:
                by_target[v["target"]] = by_target.get(v["target"], 0) + 1
        have = ", ".join(f"{n} for {t}" for t, n in sorted(by_target.items())) or "nothing"
        return f"the bundle has {op or 'variants'}: {have}"

    # --- launching --------------------------------------------------------------------------------
    @property
    def lib(self) -> HostLibrary:
        if self._lib is None:
            with self._lock:
                if self._lib is None:
                    self._lib = HostLibrary(self.path / self.manifest["host_library"]["path"])
        return self._lib

    def binder(self, name: str) -> Binder:
        b = self._binders.get(name)
        if b is None:
            b = self._binders[name] = Binder(self.manifest["variants"][name])
        return b

    def launch(self, name: str, args: list, stream: int | None = None, *, checked: bool = False) -> None:
        """Launch variant ``name`` with ``args`` (torch tensors, ``(data_ptr, shape, stride)`` specs
        or numbers, in its signature order) on ``stream`` (default: torch's current stream).

        ``checked=True`` skips validation: only for specs that selection has just validated."""
        binder = self._binders.get(name)
        if binder is None:
            entry = self.manifest["variants"].get(name)
            if entry is None:
                raise NoVariantError(f"no variant {name!r}; {self.describe_contents()}")
            if not get_target(entry["target"]).runs_on(self.capability):
                raise NoVariantError(f"{name} is built for {entry['target']}, which cannot run on {self.device_name()}")
            binder = self.binder(name)
        if stream is None:
            stream = current_stream()
        argv, _buf = binder.pack(args, stream) if checked else binder.bind(args, stream)
        err = self.lib.launcher(name)(argv)
        if err:
            raise LaunchError(f"{name}: launch failed: {self.lib.error(err)}")

    # --- ops --------------------------------------------------------------------------------------
    def gemm(self, a, b, out=None, *, out_dtype=None, scale_a=None, scale_b=None, variant: str | None = None,
             b_constant: bool = False):
        """``out = a @ b.T`` (see runtime/gemm.py).  ``b_constant=True`` promises that no kernel
        that may still be running in the stream writes ``b`` (model weights): decode variants
        launched with programmatic dependent launch then start streaming ``b`` before the
        previous kernel has finished."""
        op = _op("gemm_packed" if isinstance(b, PackedB) else "gemm")
        return op(self, a, b, out, out_dtype=out_dtype, scale_a=scale_a, scale_b=scale_b,
                  variant=variant, b_constant=b_constant)

    def pack_b(self, b) -> PackedB:
        """(N, K) e4m3 weights packed once for the decode kernels (runtime/packed.py):
        ``bundle.gemm(a, bundle.pack_b(w), ...)`` with M ≤ 16 then runs one of them."""
        from .packed import pack_b

        return pack_b(b)

    def attention(self, q, k, v, **kwargs):
        return _op("attention")(self, q, k, v, **kwargs)


__all__ = ["Bundle", "BundleError", "LaunchError", "NoVariantError", "PackedB"]
