"""What every GEMM family shares: the problem (C = A·Bᵀ, batched), its calling convention and the
manifest fields the loader selects on.  Imports no DSL.

Shapes: A is (M, K, L), B is (N, K, L), C is (M, N, L), C[m, n, l] = Σ_k A[m, k, l]·B[n, k, l].
Majorness names the contiguous mode: ``a_major`` "k" (row-major A, the "T" of "TN") or "m";
``b_major`` "k" (the "N") or "n".  C is always row-major (N contiguous).
fp8 variants take two float32 scale tensors in one of three forms (:func:`scale_args`): per tensor,
per row of A and of B, or per 1x128 block of A and 128x128 block of B.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..abi import DTYPE_BYTES, Signature, TensorArg
from ..variant import Variant

FP8 = ("e4m3", "e5m2")
# K elements (and B rows) per block scale of the "block" form.
SCALE_BLOCK = 128


def scale_args(mode: str) -> list:
    """The two float32 scale arguments of an fp8 GEMM, by scale form (all 4-byte aligned):

    - ``"tensor"``: scale_a (1,), scale_b (1,): C = sa·sb·A·Bᵀ.
    - ``"row"`` (torch ``_scaled_mm`` row-wise): scale_a (M,), scale_b (N,), unit stride:
      C[m, n] = sa[m]·sb[n]·Σ_k A[m, k]·B[n, k].
    - ``"block"`` (DeepSeek-V3): scale_a (M, KB) M-major (stride (1, sSAk), sSAk >= M; DeepGEMM's
      TMA-aligned form has sSAk = M rounded up to a multiple of 4), scale_b (NB, KB) K-contiguous
      (stride (sSBn, 1), sSBn >= KB), KB = ceil(K/128), NB = ceil(N/128):
      C[m, n] = Σ_kb sa[m, kb]·sb[n // 128, kb]·Σ_{k in block kb} A[m, k]·B[n, k].
    """
    if mode == "row":
        return [TensorArg("scale_a", "f32", ("M",), (1,), align=4),
                TensorArg("scale_b", "f32", ("N",), (1,), align=4)]
    if mode == "block":
        return [TensorArg("scale_a", "f32", ("M", "KB"), (1, "sSAk"), align=4),
                TensorArg("scale_b", "f32", ("NB", "KB"), ("sSBn", 1), align=4)]
    return [TensorArg("scale_a", "f32", (1,), (1,), align=4),
            TensorArg("scale_b", "f32", (1,), (1,), align=4)]


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
            args += scale_args(getattr(self, "scale_mode", "tensor"))
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
