"""What every kernel variant is: a frozen config whose name is its identity.

A family (say ``gemm/sm80``) subclasses :class:`Variant` with its tuning knobs as fields, and
registers an enumerator with :func:`factory.registry.family`.  The name is built from the fields
(never by hand), and is the manifest key, the file name and part of the cache key.

This module must stay importable without the DSL: the runtime reads variants back from the
manifest, never by importing kernel code.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from .abi import Signature
from .atoms.targets import Target, get_target


@dataclass(frozen=True)
class Variant:
    op: ClassVar[str]  # "gemm", "attention"
    family: ClassVar[str]  # "sm80", "sm90", "sm100"
    # Regexes over the disassembly that *must* match for this variant's cubin (verify checks).
    required_sass: ClassVar[tuple[str, ...]] = ()
    # Python modules (relative to the package root) whose source defines the kernel: the cache key
    # hashes their text.
    sources: ClassVar[tuple[str, ...]] = ()

    target: str

    # --- identity -------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        """Deterministic: op, target, then every field in declaration order as ``<tag><value>``.

        A field's tag is ``field(metadata={"tag": ...})`` (default: its name); a true bool field
        contributes its tag alone and a false one nothing.
        """
        parts = [self.op, self.target.replace("_", "")]
        for f in dataclasses.fields(self):
            if f.name == "target":
                continue
            tag = f.metadata.get("tag", f.name)
            v = getattr(self, f.name)
            if isinstance(v, bool):
                if v:
                    parts.append(tag)
            else:
                parts.append(tag + _short(v))
        return "_".join(parts)

    @property
    def tgt(self) -> Target:
        return get_target(self.target)

    def config(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    # --- what a family implements ----------------------------------------------------------------
    def sass_requirements(self) -> tuple[str, ...]:
        """Regexes the disassembly must match (``verify``); families refine per dtype."""
        return self.required_sass

    def can_implement(self) -> str | None:
        """None if this config is valid for its target, else the reason it is not."""
        return None

    def signature(self) -> Signature:
        raise NotImplementedError

    def make_kernel(self):
        """The @cute.jit callable to compile; positional args follow signature(), then a stream."""
        raise NotImplementedError

    def smem_bytes(self) -> int:
        """Dynamic shared memory one CTA uses (bytes); checked against the target's capacity."""
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        """Manifest fields the loader selects on: dtypes, layouts, tile, constraints."""
        raise NotImplementedError


def _short(v: Any) -> str:
    if isinstance(v, (tuple, list)):
        return "x".join(_short(x) for x in v)
    return str(v)
