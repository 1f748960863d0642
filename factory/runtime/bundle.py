"""``BundleCore``: a built bundle's files, the device it serves, and the launch of its variants.

No DSL, no MLIR: the standard library, torch, and the bundle's host library via ctypes.  The op
modules (``gemm``, ``packed``, ``attention``, ``blockscaled``) build on this; it knows nothing of
them.  What they use of it is public and listed here (tests/test_runtime.py checks that they
touch nothing private):

* the device: ``capability``, ``device_info()``, ``planned`` (a device given to ``open``),
  ``device_api()`` (the current device index and its raw stream), ``simulated`` and
  ``lowest_device`` (the lowest device index whose tensors are taken: -1 when simulated);
* the variants: ``manifest``, ``selector`` (the host library's selection, runtime/selector.py),
  ``candidates``, ``binder``, ``fitting``, ``tuning``, ``describe_contents``, ``device_name``;
* launching: ``launch``, ``fixed``, ``lib``;
* per-bundle caches the op modules own and bound themselves (the core never reads them):
  ``selections`` (problem key -> choice), ``hot_gemm`` / ``hot_attention`` / ``hot_kvcache``
  (problem key -> the hot path's launch), ``variant_facts`` ((fact, variant) -> value: grid caps, early_b twins) and
  ``unit_scales`` (device -> fp8's default scale), ``scratch`` (device -> a buffer the kernels
  write and nobody reads: the LSE of a call without ``return_lse``; never freed while the bundle
  lives, so a CUDA graph that captured its address stays valid).
"""

from __future__ import annotations

import threading
from pathlib import Path

from ..atoms.targets import KNOWN_CAPABILITIES, get_target, targets_for_capability
from .errors import BundleError, InputError, NoVariantError
from .loader import Binder, HostLibrary, LaunchError
from . import open_cache
from .manifest import open_manifest, variant_problems

_TORCH_DEVICE = None  # (current_device() -> int, raw_stream(index) -> int), bound on first use


def _device_api():
    """torch's current CUDA device index and a device's current raw ``cudaStream_t``.
    ``torch.cuda.current_stream()`` builds a Stream object per call (7.6-8.0 µs on the H100's
    host, 2026-11-22): torch's own launchers (Inductor's, Triton's) read the raw handle as done
    here; torch versions without it fall back to the public calls."""
    global _TORCH_DEVICE
    if _TORCH_DEVICE is None:
        import torch

        raw, dev = (getattr(torch._C, n, None) for n in ("_cuda_getCurrentRawStream", "_cuda_getDevice"))
        if raw is None or dev is None:
            _TORCH_DEVICE = (torch.cuda.current_device, lambda i: torch.cuda.current_stream(i).cuda_stream)
        else:
            _TORCH_DEVICE = (dev, raw)
    return _TORCH_DEVICE


def current_stream() -> int:
    """torch's current CUDA stream on the current device, as its raw handle."""
    dev, raw = _device_api()
    return raw(dev())


def not_current(device: int, here: int):
    """The InputError of tensors on ``device`` while ``here`` is the current device."""
    raise InputError(f"the tensors are on cuda:{device} but the current device is cuda:{here}: "
                     f"call under `with torch.cuda.device({device}):` (kernels run on the current "
                     f"device's stream)")


class BundleCore:
    """A bundle opened for one kind of device: its manifest, host library, argument binders and
    per-device caches.  ``launch`` is the one way a kernel runs."""

    def __init__(self, path: Path, manifest: dict, capability: tuple[int, int] | None,
                 device: dict | None = None):
        self.path = path
        self.manifest = manifest
        self._capability = capability
        self._device = device
        self._tuning = None  # (tuning.Tuning | None, why), read on the first selection
        self.planned = device is not None  # a device given for planning (no driver to ask)
        self._lib: HostLibrary | None = None
        self._selector = None  # selector.Selector: the host library's fx_*_select for this device
        self._binders: dict[str, Binder] = {}
        self._launchers: dict[str, object] = {}  # variant -> its native launch function
        # The op modules' caches (module docstring): theirs to fill and bound.
        self.selections: dict[tuple, object] = {}
        self.hot_attention: dict[tuple, object] = {}
        self.hot_gemm: dict[tuple, object] = {}
        self.hot_kvcache: dict[tuple, object] = {}
        self.variant_facts: dict[tuple, object] = {}
        self.unit_scales: dict = {}
        self.scratch: dict = {}
        self._lock = threading.Lock()
        self._cur = None  # () -> the current CUDA device index (bound on the first launch)
        self._raw = None  # (index) -> that device's current raw stream
        self.simulated = False  # see simulate()
        self.lowest_device = 0  # tensors on a lower device index (the CPU's -1) are refused; -1 when simulated
        self.remembered = False  # opened from what an earlier open remembered (runtime/open_cache.py)

    @classmethod
    def open(cls, path: str | Path, capability: tuple[int, int] | None = None,
             device: dict | None = None):
        """Open and check a bundle: the manifest (runtime/manifest.py: its schema, every file path
        inside the bundle; each variant's entry is checked when first read) and the host library's
        size and sha256, remembered between processes for an unchanged file (runtime/open_cache.py;
        each variant's files are checked before its first load).  ``capability`` overrides the current
        device's (for tests and for planning on a machine without the GPU); so does ``device``
        ({"name", "sm_count"}), which decides whether the bundle's tuning.json applies."""
        if capability is not None:
            capability = tuple(capability)
            if capability not in KNOWN_CAPABILITIES:
                raise InputError(f"compute capability {'.'.join(map(str, capability))} is not one an NVIDIA device has "
                                 f"(known: {', '.join(f'{a}.{b}' for a, b in KNOWN_CAPABILITIES)})")
        if device is not None and not (isinstance(device.get("sm_count"), int) and device["sm_count"] > 0):
            raise InputError(f"device['sm_count'] must be a positive int, got {device.get('sm_count')!r}")
        path = Path(path)
        m, problem, remembered = open_manifest(path, open_cache.default())
        if problem:
            raise BundleError(f"{problem}; nothing was loaded")
        b = cls(path, m, capability, device)
        b.remembered = remembered
        return b

    def simulate(self, lib) -> None:
        """For tests and host-cost timing without a GPU: launch through ``lib`` (anything with
        ``launcher(name)``) on CPU tensors, as device -1 with stream 0."""
        self._lib, self.simulated, self.lowest_device = lib, True, -1
        # (builtins, like torch's: () -> -1 and (index) -> 0 without a Python frame)
        self._cur, self._raw = (-1).__index__, (0).__mul__

    def device_api(self):
        """(current_device() -> index, raw_stream(index) -> cudaStream_t as an int): torch's, or
        the simulated device's (bound on first use).  The ops' hot paths call them per launch."""
        if self._cur is None:
            self._cur, self._raw = _device_api()
        return self._cur, self._raw

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
    def selector(self):
        """The host library's selection (runtime/selector.py) for this device: its capability, SM
        count and name (which decides whether the tuning table compiled into the library
        applies).  Loaded on first use, also on a simulated bundle (it needs no GPU)."""
        if self._selector is None:
            from .selector import Selector

            lib = self.manifest["host_library"]
            sel = Selector(self.path / lib["path"], self.capability, self.device_info(), lib.get("sha256"))
            # The library chooses among the variants linked into it: they must be the manifest's
            # (a library of another manifest would choose variants this bundle does not describe).
            if set(sel.variant_names()) != set(self.manifest["variants"]):
                raise BundleError(f"{self.path}: the host library's variants are not the manifest's: "
                                  f"relink the bundle (python -m factory link {self.path})")
            self._selector = sel
        return self._selector

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
        variants = self.manifest["variants"]
        light = getattr(variants, "light", None)
        if light is None:
            fit = [v for v in variants.values() if v["op"] == op and v["target"] in order]
        else:  # (only the entries that fit are read and checked)
            fit = [variants[n] for n in variants if (lambda o, t: o == op and t in order)(*light(n))]
        return sorted(fit, key=lambda v: order[v["target"]])

    def describe_contents(self, op: str | None = None) -> str:
        by_target: dict[str, int] = {}
        variants = self.manifest["variants"]
        light = getattr(variants, "light", None)
        for o, t in (map(light, variants) if light is not None else ((v["op"], v["target"]) for v in variants.values())):
            if t is not None and (op is None or o == op):
                by_target[t] = by_target.get(t, 0) + 1
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

    def fitting(self, op: str, specs: list, keep=None) -> tuple[list[dict], list[str]]:
        """The variants of ``op`` that ``keep(entry)`` admits (all when None) and whose argument
        contract takes ``specs``, and why each admitted variant that does not take them refuses."""
        fits, reasons = [], []
        for v in self.candidates(op):
            if keep is not None and not keep(v):
                continue
            try:
                self.binder(v["name"]).check(specs)
            except InputError as e:
                reasons.append(f"{v['name']}: {e}")
                continue
            fits.append(v)
        return fits, reasons

    def launch(self, name: str, args: list, stream: int | None = None, *, checked: bool = False,
               device: int | None = None) -> None:
        """Launch variant ``name`` with ``args`` (torch tensors, ``(data_ptr, shape, stride)`` specs
        or numbers, in its signature order) on ``stream`` (default: torch's current stream).

        Tensors are checked against the kernel's contract, their device included; bare specs are
        pointers this cannot check (they must be on the current device).  The ops pass ``device``,
        the index of the device they have checked their tensors are all on, which must be the
        current one; ``checked=True`` also skips the contract checks: only for specs the op has
        just validated."""
        cur = self._cur
        if cur is None:
            self._cur, self._raw = _device_api()
            cur = self._cur
        here = cur()
        if device is not None and device != here:
            not_current(device, here)
        if stream is None:
            stream = self._raw(here)
        fn = self._launchers.get(name)
        if fn is None:
            fn = self._first_load(name)
        if checked:
            argv, _buf = self._binders[name].pack(args, stream)
        else:  # (with ``device`` given, the op has checked its tensors' devices)
            argv, _buf = self._binders[name].bind(args, stream, here if device is None else None, self.simulated)
        err = fn(argv)
        if err:
            raise LaunchError(f"{name}: launch failed: {self.lib.error(err)}")

    def fixed(self, name: str, specs: list):
        """A :class:`~.loader.FixedLaunch` of variant ``name`` for these specs, checked here in
        full, or None when the variant is not loaded (by a launch); the ops' hot paths call its
        ``go`` with the data pointers and the stream, after checking the device themselves
        (:func:`not_current`)."""
        fn = self._launchers.get(name)
        return None if fn is None else self._binders[name].fixed(fn, specs)

    def preload(self, ops=("gemm", "gemm_blockscaled", "attention")) -> int:
        """Load every variant of ``ops`` that this device runs, now: module loading cannot be
        captured in a CUDA graph, so call this (or run each call once) before capturing.  Returns
        the number of modules loaded."""
        n = 0
        for op in ops:
            for v in self.candidates(op):
                if v["name"] not in self._launchers:
                    self._first_load(v["name"])
                    n += 1
        return n

    def _first_load(self, name: str):
        """Check the variant runs here and its files are intact, then load its module (never
        while a CUDA graph is being captured)."""
        entry = self.manifest["variants"].get(name)
        if entry is None:
            raise NoVariantError(f"no variant {name!r}; {self.describe_contents()}")
        if not self.simulated:
            import torch

            if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                raise LaunchError(f"{name} is not loaded yet and a CUDA graph is being captured: module loading "
                                  f"cannot be captured; call bundle.preload() (or run the same call once) before "
                                  f"capturing")
        if not get_target(entry["target"]).runs_on(self.capability):
            raise NoVariantError(f"{name} is built for {entry['target']}, which cannot run on {self.device_name()}")
        problems = variant_problems(self.path, name, entry)
        if problems:
            raise BundleError(f"{problems[0]}; nothing was loaded")
        self.binder(name)
        fn = self._launchers[name] = self.lib.launcher(name)
        return fn
