"""What every attention variant and kernel object has: its element type and head dimension (the first fields of
every family's name), the dtypes the families take, the checks and manifest fields that follow
from the calling convention (contract.py), and the field definitions of the problem switches.

``causal`` and ``varlen`` come from :func:`causal_field` / :func:`varlen_field` and are declared
by each family at its place in the name (a dataclass puts a base's fields first: declared here,
``..._d128_m128_n64_w8_s2_causal`` would become ``..._d128_causal_m128_...``).  A new switch whose
default adds nothing to the name (a bool that is False) may be declared here instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..abi import Signature
from ..atoms.common import cutlass_dtype
from ..variant import Variant
from . import contract
from .mask import MaskSpec

DTYPES = ("bf16", "f16")
# The toolkit modules every family's kernel is traced through (a family's ``sources``, hashed into
# the compile cache key, lists them after its own files).
TOOLKIT_SOURCES = ("attention/contract.py", "attention/base.py", "attention/mask.py", "attention/keyrange.py",
                   "attention/softmax.py", "atoms/common.py")


def causal_field(default: bool = False):
    """Bottom-right causal mask (contract.py ``causal_alignment``)."""
    return field(default=default, metadata={"tag": "causal"})


def varlen_field():
    """Packed sequences with cu_seqlens (contract.py's varlen arguments)."""
    return field(default=False, metadata={"tag": "varlen"})


@dataclass(frozen=True, kw_only=True)
class AttentionVariant(Variant):
    op: ClassVar[str] = "attention"
    # What a family compiles: its DTYPES / HEAD_DIMS (checked by check_problem).
    DTYPES: ClassVar[tuple[str, ...]] = DTYPES
    HEAD_DIMS: ClassVar[tuple[int, ...]] = (64, 128)

    dtype: str = field(default="bf16", metadata={"tag": ""})
    head_dim: int = field(default=128, metadata={"tag": "d"})

    @property
    def cutlass_dtype(self):
        return cutlass_dtype(self.dtype)

    def check_problem(self) -> str | None:
        """The dtype and head_dim checks every family's can_implement starts with."""
        if self.dtype not in self.DTYPES:
            return f"dtype {self.dtype} not in {self.DTYPES}"
        if self.head_dim not in self.HEAD_DIMS:
            return f"head_dim {self.head_dim} not in {self.HEAD_DIMS}"
        return None

    def smem_problem(self, static: int = 0) -> str | None:
        """None if ``smem_bytes()`` (+ ``static``: the DSL's static smem, counted by the TMA-era
        families) fits the target, else the reason."""
        cap = self.tgt.smem_per_cta
        if static and self.smem_bytes() + static > cap:
            return f"needs {self.smem_bytes()} + {static} B smem > {cap}"
        if not static and self.smem_bytes() > cap:
            return f"needs {self.smem_bytes()} B of shared memory, {self.target} has {cap}"
        return None

    def workspace_splits(self) -> int:
        """Splits of the contract's split-KV workspace arguments (1: none)."""
        return getattr(self, "splits", 1)

    def signature(self) -> Signature:
        return contract.signature(self.dtype, self.head_dim, getattr(self, "varlen", False),
                                  self.workspace_splits())

    def contract_fields(self) -> dict[str, Any]:
        """The manifest fields every attention variant has (the family adds its tile, ...)."""
        return contract.manifest_fields(self.dtype, self.head_dim, getattr(self, "causal", False),
                                        getattr(self, "varlen", False))


class AttentionKernel:
    """What every family's kernel object holds: the element type (a cutlass type), the head
    dimension and the mask switches (``mask``: mask.MaskSpec, passed to the toolkit's calls)."""

    def __init__(self, *, dtype, head_dim: int, causal: bool, local: bool = False):
        self.dtype = dtype
        self.head_dim = head_dim
        self.causal = causal
        self.mask = MaskSpec(causal=causal, local=local)


__all__ = ["DTYPES", "TOOLKIT_SOURCES", "AttentionKernel", "AttentionVariant", "causal_field", "varlen_field"]
