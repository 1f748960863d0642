"""e4m3 codes with one scale per row and 128 columns (what the GEMM epilogue ``fp8_groups``
writes) re-expressed with one scale per row (``torch._scaled_mm``'s row-wise ``scale_a``):

    scale[m]  = max(max_g group_scale[m, g], FP8_MIN_SCALE)
    out[m, n] = e4m3(e4m3_to_f32(codes[m, n]) · (group_scale[m, n // 128] / scale[m]))   (saturating)

The second pass of the row-wise fp8 output: a row's amax spans every N tile of the GEMM, so the
GEMM writes per-(row, 128-column) codes and scales, and this pass rescales each group onto the
row's largest scale.  Every factor is <= 1, so no code saturates; the result is within one e4m3
step of quantizing the unrounded values with the row scale directly (the first rounding is at
most half a step of the finer group grid).  ``out`` may be ``codes`` itself (each thread reads its
16 codes before it writes them).

One row per CTA: ``threads`` threads, each up to ``chunks`` 16-byte vectors of codes (a vector's
16 codes lie in one 128-column group); N a launch-time size, a multiple of 16, up to
``16 · threads · chunks``.  The row scale goes over the CTA by warp shuffles and one shared
exchange.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute

from ..abi import Signature, TensorArg
from ..atoms.rowwise import block_allreduce, fmax
from ..atoms.targets import Target
from ..registry import register
from .common import DEFAULT_TARGETS, FP8_MIN_SCALE, RowwiseVariant, builds_for

VEC = 16  # e4m3 codes per 16-byte vector
GROUP = 128  # columns per group scale


@dataclass(frozen=True, kw_only=True)
class Fp8RowsVariant(RowwiseVariant):
    op: ClassVar[str] = "fp8_rows"
    family: ClassVar[str] = "rowwise"
    sources: ClassVar[tuple[str, ...]] = ("elementwise/fp8_rows.py", "elementwise/common.py", "atoms/rowwise.py",
                                          "abi.py")

    dtype: str = field(default="e4m3", metadata={"tag": ""})
    threads: int = field(default=128, metadata={"tag": "t"})
    chunks: int = field(default=8, metadata={"tag": "c"})

    @property
    def max_n(self) -> int:
        return VEC * self.threads * self.chunks

    @property
    def is_fp8(self) -> bool:
        return True

    def can_implement(self) -> str | None:
        if self.dtype != "e4m3":
            return "e4m3 codes only"
        if self.threads not in (128, 256):
            return "128 or 256 threads"
        if self.chunks not in (1, 2, 4, 8):
            return "chunks must be 1, 2, 4 or 8"
        if not builds_for(self.tgt, True):
            return f"fp8_rows is not built for {self.target}"
        return None

    def sass_requirements(self) -> tuple[str, ...]:
        return (r"\bLDG\.E\.128\b", r"\bSTG\.E\.128\b", r"\bSHFL\.BFLY\b", r"\bF2FP\.SATFINITE\.E4M3\.F32\.PACK_AB")

    def smem_bytes(self) -> int:
        return 4 * (self.threads // 32)

    def signature(self) -> Signature:
        args = (TensorArg("codes", "e4m3", ("M", "N"), ("sQm", 1)),
                TensorArg("group_scale", "f32", ("M", "G"), (1, "sGg"), align=4),
                TensorArg("out", "e4m3", ("M", "N"), ("sOm", 1)),
                TensorArg("scale", "f32", ("M",), (1,), align=4))
        return Signature(args, (("N", VEC), ("sOm", VEC), ("sQm", VEC)))

    def make_kernel(self):
        return Fp8RowsKernel(self).launch

    def describe(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "threads": self.threads, "max_n": self.max_n, "n_multiple": VEC,
                "group": GROUP}


@register("fp8_rows")
def enumerate_fp8_rows(target: Target, tier: str) -> list[Fp8RowsVariant]:
    """One variant per target that has fp8 conversions (rows up to 16384 codes); the default tier
    on the default rowwise targets, test on sm_90 only."""
    if tier == "default" and target.name not in DEFAULT_TARGETS + ("sm_89",):
        return []
    if tier == "test" and target.name != "sm_90":
        return []
    v = Fp8RowsVariant(target=target.name)
    return [v] if v.can_implement() is None else []


class Fp8RowsKernel:
    def __init__(self, v: Fp8RowsVariant):
        self.v = v
        self.warps = v.threads // 32

    @cute.jit
    def launch(self, mQ: cute.Tensor, mG: cute.Tensor, mO: cute.Tensor, mS: cute.Tensor, stream: cuda.CUstream):
        M = cute.size(mQ, mode=[0])
        self.kernel(mQ, mG, mO, mS).launch(grid=(M, 1, 1), block=(self.v.threads, 1, 1), stream=stream)

    @cute.kernel
    def kernel(self, mQ: cute.Tensor, mG: cute.Tensor, mO: cute.Tensor, mS: cute.Tensor):
        T, C = self.v.threads, self.v.chunks
        tidx, _, _ = cute.arch.thread_idx()
        row, _, _ = cute.arch.block_idx()
        warp = cute.arch.make_warp_uniform(tidx // 32)
        lane = tidx % 32
        nv = cute.size(mQ, mode=[1]) // VEC
        ng = cute.size(mG, mode=[1])

        smem = cutlass.utils.SmemAllocator()
        red = smem.allocate_tensor(cutlass.Float32, cute.make_layout(self.warps), 16)

        s = cutlass.Float32(FP8_MIN_SCALE)
        for g in cutlass.range(tidx, ng, T):
            s = cute.arch.fmax(s, mG[row, g])
        s = block_allreduce(s, fmax, red, self.warps, warp, lane)
        if tidx == 0:
            mS[row] = s
        inv = cutlass.Float32(1.0) / s

        gQ = cute.zipped_divide(mQ[row, None], (VEC,))
        gO = cute.zipped_divide(mO[row, None], (VEC,))
        rQ = cute.make_rmem_tensor(cute.make_layout((VEC, C)), cutlass.Float8E4M3FN)
        # All loads first (in place: every code is read before any is written back).
        for c in cutlass.range_constexpr(C):
            j = c * T + tidx
            if j < nv:
                cute.autovec_copy(gQ[None, j], rQ[None, c])
        for c in cutlass.range_constexpr(C):
            j = c * T + tidx
            if j < nv:
                f = mG[row, j // (GROUP // VEC)] * inv
                y = rQ[None, c].load().to(cutlass.Float32) * f
                rQ[None, c].store(y.to(cutlass.Float8E4M3FN))
                cute.autovec_copy(rQ[None, c], gO[None, j])


__all__ = ["Fp8RowsVariant", "enumerate_fp8_rows"]
