"""What every GEMM family shares: the problem (C = A·Bᵀ, batched), its calling convention and the
manifest fields the loader selects on.  Imports no DSL.

Shapes: A is (M, K, L), B is (N, K, L), C is (M, N, L), C[m, n, l] = Σ_k A[m, k, l]·B[n, k, l].
Majorness names the contiguous mode: ``a_major`` "k" (row-major A, the "T" of "TN") or "m";
``b_major`` "k" (the "N") or "n".  C is always row-major (N contiguous).
fp8 variants take per-tensor scales as two 1-element float32 device tensors: C = (sa·sb)·A·Bᵀ.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..abi import DTYPE_BYTES, Signature, TensorArg
from ..variant import Variant

FP8 = ("e4m3", "e5m2")


@dataclass(frozen=True, kw_only=True)
class GemmVariant(Variant):
    op: ClassVar[str] = "gemm"

    ab: str = field(default="bf16", metadata={"tag": ""})
    c: str = field(default="bf16", metadata={"tag": "o"})
    a_major: str = field(default="k", metadata={"tag": "a"})
    b_major: str = field(default="k", metadata={"tag": "b"})

    @property
    def is_fp8(self) -> bool:
        return self.ab in FP8

    def vector(self, dtype: str) -> int:
        """Elements in one 16-byte access: the divisibility every contiguous extent must have."""
        return 16 // DTYPE_BYTES[dtype]

    def signature(self) -> Signature:
        va, vc = self.vector(self.ab), self.vector(self.c)
        a_stride = ("sAm", 1, "sAl") if self.a_major == "k" else (1, "sAk", "sAl")
        b_stride = ("sBn", 1, "sBl") if self.b_major == "k" else (1, "sBk", "sBl")
        args = [
            TensorArg("a", self.ab, ("M", "K", "L"), a_stride),
            TensorArg("b", self.ab, ("N", "K", "L"), b_stride),
            TensorArg("c", self.c, ("M", "N", "L"), ("sCm", 1, "sCl")),
        ]
        if self.is_fp8:
            args += [TensorArg("scale_a", "f32", (1,), (1,), align=4),
                     TensorArg("scale_b", "f32", (1,), (1,), align=4)]
        div = {s: va for s in ("sAm", "sAk", "sAl", "sBn", "sBk", "sBl")}
        div.update({"sCm": vc, "sCl": vc})
        # The contiguous extent of each operand must be whole 16-byte vectors.
        if self.a_major == "k" or self.b_major == "k":
            div["K"] = va
        if self.a_major == "m":
            div["M"] = va
        if self.b_major == "n":
            div["N"] = va
        div["N"] = max(div.get("N", 1), vc)
        return Signature(tuple(args), tuple(sorted(div.items())))

    def describe(self) -> dict[str, Any]:
        return {
            "dtypes": {"a": self.ab, "b": self.ab, "c": self.c, "acc": "f32"},
            "layout": {"a": self.a_major, "b": self.b_major, "c": "n"},
        }
