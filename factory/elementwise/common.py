"""What the memory-bound row-wise families share (RMSNorm, rotary embedding + cache write): the
targets they build for, their proof ceiling and manifest fields.  Imports no DSL.

These kernels use nothing generation-specific (16-byte loads and stores, warp shuffles, one
shared-memory exchange), so one source builds for the Ampere/Ada family (sm_80: its cubins run on
8.0, 8.6 and 8.9; fp8 output needs sm_89), for Hopper as the plain sm_90 (an H100 runs it) and for
Blackwell (sm_100f, sm_120a).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..atoms.targets import Target
from ..variant import Variant

# Targets these families build for; sm_89 only for what sm_80 cannot (fp8 conversions).
BUILD_TARGETS = ("sm_80", "sm_89", "sm_90", "sm_100f", "sm_120a")
# Tier "default" builds these targets (Blackwell's cubins only in "full": the default bundle's
# budget; a Blackwell device then gets NoVariantError from these ops with a default bundle).
DEFAULT_TARGETS = ("sm_80", "sm_89", "sm_90", "sm_100f")
FP8_MAX = 448.0  # largest finite e4m3 value
# Smallest per-row fp8 scale (an all-zero row quantizes to zeros, never divides by zero).
FP8_MIN_SCALE = 1.0 / (FP8_MAX * 512.0)


def builds_for(t: Target, needs_fp8: bool = False) -> bool:
    if t.name not in BUILD_TARGETS:
        return False
    if t.name == "sm_89":
        return needs_fp8
    return t.fp8 or not needs_fp8


@dataclass(frozen=True, kw_only=True)
class RowwiseVariant(Variant):
    """A memory-bound kernel: ``threads`` per CTA, no dynamic shared memory."""

    dtype: str = field(default="bf16", metadata={"tag": ""})
    threads: int = field(default=256, metadata={"tag": "t"})

    def proof_level(self) -> str:
        t = self.tgt
        if t.name == "sm_90":
            return "executed"
        return "portability-build" if t.capability < (9, 0) else "sass-only"

    def smem_bytes(self) -> int:
        return 0

    def describe(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "threads": self.threads}

    def can_implement(self) -> str | None:
        if self.dtype not in ("bf16", "f16"):
            return "bf16 or f16 only"
        if self.threads not in (128, 256, 512):
            return "128, 256 or 512 threads"
        return None

    sources: ClassVar[tuple[str, ...]] = ()
