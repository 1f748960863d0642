"""Which kernel families exist, and enumeration of their variants per target.

A family module registers an enumerator ``fn(target, tier) -> list[Variant]`` with
``@register(op)``.  Family modules import the DSL, so they are imported only when enumerating (on
the build machine), never by the runtime.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import importlib
from typing import Callable, Iterable

from .atoms.targets import Target, get_target
from .variant import Variant

# Modules that hold families; imported lazily by enumerate_variants().
FAMILY_MODULES = (
    "factory.gemm.sm80",
    "factory.gemm.sm90",
    "factory.gemm.sm100",
    "factory.gemm.sm100_blockscaled",
    "factory.gemm.decode",
    "factory.gemm.sm90_grouped",
    "factory.gemm.sm90_splitk",
    "factory.gemm.sm100_grouped",
    "factory.gemm.sm100_block128",
    "factory.attention.sm80",
    "factory.attention.sm90",
    "factory.attention.sm90_fp8",
    "factory.attention.sm90_kvcache_fp8",
    "factory.attention.decode",
    "factory.attention.sm100_fa4",
    "factory.elementwise.rmsnorm",
    "factory.elementwise.rope_cache",
    "factory.elementwise.fp8_rows",
)
TIERS = ("test", "default", "full")

Enumerator = Callable[[Target, str], list[Variant]]
_ENUMERATORS: dict[str, list[Enumerator]] = {}


def register(op: str):
    def deco(fn: Enumerator) -> Enumerator:
        _ENUMERATORS.setdefault(op, []).append(fn)
        return fn

    return deco


def _load_families() -> None:
    for mod in FAMILY_MODULES:
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as e:
            # A family not written yet is fine; a family that fails to import for another reason
            # is not.
            if e.name != mod:
                raise


def ops() -> list[str]:
    _load_families()
    return sorted(_ENUMERATORS)


def enumerate_variants(
    targets: Iterable[str], ops_: Iterable[str] | None = None, tier: str = "default",
    name_filter: str | None = None,
) -> list[Variant]:
    """All valid variants for these targets and ops; ``name_filter`` is a glob over names."""
    if tier not in TIERS:
        raise ValueError(f"tier must be one of {TIERS}")
    _load_families()
    wanted = list(ops_) if ops_ else sorted(_ENUMERATORS)
    unknown = [o for o in wanted if o not in _ENUMERATORS]
    if unknown:
        raise ValueError(f"unknown op(s) {unknown}; known: {sorted(_ENUMERATORS)}")
    targets = list(targets)
    out: dict[str, Variant] = {}
    for tname in targets:
        target = get_target(tname)
        for op in wanted:
            for fn in _ENUMERATORS[op]:
                for v in fn(target, tier):
                    if v.can_implement() is not None:
                        continue
                    if name_filter and not fnmatch.fnmatch(v.name, name_filter):
                        continue
                    if v.name in out and out[v.name] != v:
                        raise RuntimeError(f"two different variants share the name {v.name}")
                    out[v.name] = v
    # A target whose code is another's (Target.same_code_as: sm_89 = sm_86 + fp8) keeps, when that
    # other target is built too, only the variants the other lacks.
    for name, v in list(out.items()):
        same = get_target(v.target).same_code_as
        if same in targets and dataclasses.replace(v, target=same).name in out:
            del out[name]
    return list(out.values())
