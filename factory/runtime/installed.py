"""Bundles installed as Python packages (kernel wheels, ``factory/wheels.py``), and the choice of
``Bundle.default()``.

A kernels package (e.g. ``kernel-factory-kernels-sm90``) declares an entry point in the group
``kernel_factory.bundles`` whose value is its module; the module holds ``BUNDLE`` (the bundle
directory inside the package) and ``TARGETS`` (the targets it has variants for).  Reading them
imports that small module only; the manifest is read by ``Bundle.open``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..atoms.targets import targets_for_capability
from .errors import BundleError

GROUP = "kernel_factory.bundles"
ENV = "KERNEL_FACTORY_BUNDLE"  # a bundle directory that overrides the installed packages

# The kernels package that serves each target (what to install when none does).
PACKAGE_FOR_TARGET = {"sm_80": "sm80", "sm_86": "sm80", "sm_89": "sm80", "sm_90": "sm90", "sm_90a": "sm90",
                      "sm_100a": "sm100", "sm_100f": "sm100", "sm_120a": "sm120"}
DIST_PREFIX = "kernel-factory-kernels-"


@dataclass(frozen=True)
class Installed:
    dist: str  # the distribution (pip) name
    version: str
    path: Path  # the bundle directory
    targets: tuple[str, ...]


def installed() -> list[Installed]:
    """Every installed kernels package, by distribution name."""
    from importlib import import_module
    from importlib.metadata import entry_points

    out = []
    for ep in entry_points(group=GROUP):
        try:
            mod = import_module(ep.value.split(":")[0])
            path, targets = Path(mod.BUNDLE), tuple(mod.TARGETS)
        except Exception as e:  # noqa: BLE001 - a broken package is named, not fatal to the others
            raise BundleError(f"the installed kernels package {ep.name!r} ({ep.value}) cannot be read: {e}") from None
        dist = ep.dist.name if ep.dist is not None else ep.name
        version = ep.dist.version if ep.dist is not None else "?"
        out.append(Installed(dist, version, path, targets))
    return sorted(out, key=lambda i: i.dist)


def choose(capability: tuple[int, int], found: list[Installed]) -> Installed:
    """The installed bundle that serves ``capability`` best: the one with the best target this
    device runs (targets_for_capability's order), then the most targets, then by name.
    BundleError saying what to install when none does."""
    order = [t.name for t in targets_for_capability(capability)]
    best, rank = None, None
    for i in found:
        have = [order.index(t) for t in i.targets if t in order]
        if not have:
            continue
        r = (min(have), -len(i.targets), i.dist)
        if rank is None or r < rank:
            best, rank = i, r
    if best is not None:
        return best
    cc = f"{capability[0]}.{capability[1]}"
    want = sorted({DIST_PREFIX + PACKAGE_FOR_TARGET[t] for t in order if t in PACKAGE_FOR_TARGET})
    listed = "; ".join(f"{i.dist} {i.version} ({', '.join(i.targets)})" for i in found) or "none"
    hint = f"pip install {' or '.join(want)}" if want else "no kernels package serves this device"
    raise BundleError(f"no installed kernels package serves compute capability {cc}: {hint} (installed: {listed}); "
                      f"or set {ENV} to a bundle directory")


def default_path(capability: tuple[int, int] | None) -> Path:
    """The bundle ``Bundle.default()`` opens: ``$KERNEL_FACTORY_BUNDLE`` when set, else the
    installed kernels package that serves ``capability`` (None: the current CUDA device's)."""
    env = os.environ.get(ENV)
    if env:
        return Path(env)
    if capability is None:
        import torch

        if not torch.cuda.is_available():
            from .errors import NoVariantError

            raise NoVariantError(f"no CUDA device is visible to choose an installed bundle for: pass "
                                 f"capability=(major, minor) or set {ENV}")
        capability = tuple(torch.cuda.get_device_capability())
    return choose(capability, installed()).path
