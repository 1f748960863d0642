"""RMSNorm of the rows of a (M, N) activation, optionally fused with the residual add and with
per-row fp8 quantization of the output.

    y[m, :] = x[m, :] / sqrt(mean(x[m, :]^2) + eps) * w            (f32 arithmetic)

``residual``: first ``x = x + residual`` (rounded to the activation dtype), written back into
``residual`` (the running residual stream of a decoder layer, updated in place), then the norm of
that sum.  ``quant``: ``y`` is rounded to the activation dtype, then ``scale[m] = max(amax(|y|) / 448,
FP8_MIN_SCALE)`` and ``out[m, :] = e4m3(y / scale[m])`` (saturating), so ``out * scale`` decodes it.

One row per CTA: ``threads`` threads, each holding up to ``chunks`` 16-byte vectors of the row in
registers (columns ``8 (c·threads + t) .. +8`` of chunk c), so x is read from global memory once;
N is a launch-time size (a multiple of 8) up to ``8 · threads · chunks``.  The sum of squares (and
the fp8 amax) goes over the CTA by warp shuffles and one shared-memory exchange.  The weight is
read once per row (it stays in L2/L1: every CTA reads the same N elements).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute

from ..abi import Signature, ScalarArg, TensorArg
from ..atoms.common import cutlass_dtype
from ..atoms.rowwise import block_allreduce, fadd, fmax
from ..atoms.targets import Target
from ..registry import register
from .common import DEFAULT_TARGETS, FP8_MAX, FP8_MIN_SCALE, RowwiseVariant, builds_for

VEC = 8  # elements per 16-byte vector of a 16-bit dtype


@dataclass(frozen=True, kw_only=True)
class RmsNormVariant(RowwiseVariant):
    op: ClassVar[str] = "rms_norm"
    family: ClassVar[str] = "rowwise"
    sources: ClassVar[tuple[str, ...]] = ("elementwise/rmsnorm.py", "elementwise/common.py", "atoms/rowwise.py",
                                          "atoms/common.py", "abi.py")

    chunks: int = field(default=8, metadata={"tag": "c"})
    residual: bool = field(default=False, metadata={"tag": "res"})
    quant: bool = field(default=False, metadata={"tag": "q8"})

    @property
    def max_n(self) -> int:
        return VEC * self.threads * self.chunks

    @property
    def is_fp8(self) -> bool:
        """fp8 output (an sm_89 build is kept beside the sm_86 code for it)."""
        return self.quant

    @property
    def out_dtype(self) -> str:
        return "e4m3" if self.quant else self.dtype

    def can_implement(self) -> str | None:
        why = super().can_implement()
        if why:
            return why
        if self.chunks not in (1, 2, 4, 8):
            return "chunks must be 1, 2, 4 or 8"
        if not builds_for(self.tgt, self.quant):
            return f"rms_norm{' with fp8 output' if self.quant else ''} is not built for {self.target}"
        return None

    def sass_requirements(self) -> tuple[str, ...]:
        req = (r"\bLDG\.E\.128\b", r"\bSHFL\.BFLY\b")
        if not self.quant:
            req += (r"\bSTG\.E\.128\b",)
        else:
            req += (r"\bSTG\.E\.64\b", r"\bF2FP\.SATFINITE\.E4M3\.F32\.PACK_AB")
        return req

    def smem_bytes(self) -> int:
        return 2 * 4 * (self.threads // 32)  # the two all-reduces' per-warp partials

    def signature(self) -> Signature:
        args = [TensorArg("x", self.dtype, ("M", "N"), ("sXm", 1)),
                TensorArg("weight", self.dtype, ("N",), (1,))]
        div = {"N": VEC, "sXm": VEC}
        if self.residual:
            args.append(TensorArg("residual", self.dtype, ("M", "N"), ("sRm", 1)))
            div["sRm"] = VEC
        args.append(TensorArg("out", self.out_dtype, ("M", "N"), ("sOm", 1)))
        div["sOm"] = VEC
        if self.quant:
            args.append(TensorArg("scale", "f32", ("M",), (1,), align=4))
        args.append(ScalarArg("eps", "f32"))
        return Signature(tuple(args), tuple(sorted(div.items())))

    def make_kernel(self):
        return RmsNormKernel(self).launch()

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "out_dtype": self.out_dtype, "residual": self.residual, "quant": self.quant,
                "max_n": self.max_n, "n_multiple": VEC}


# Hidden sizes are served by the variant with the fewest chunks that holds the row: 4 (up to 8192
# with 256 threads) and 8 (up to 16384).
CHUNKS = (4, 8)


# The test tier (the CPU suite compiles it): one variant per code path and generation.
TEST_SET = {"sm_80": ((True, False),), "sm_90": ((False, False), (True, True)), "sm_100f": ((True, True),)}


@register("rms_norm")
def enumerate_rmsnorm(target: Target, tier: str) -> list[RmsNormVariant]:
    """default: bf16 with 8 chunks (rows up to 16384) plain, with residual, with residual and fp8
    output; full: f16 too, 4 chunks too, fp8 output without residual too."""
    if tier == "default" and target.name not in DEFAULT_TARGETS:
        return []
    if tier == "test":
        combos = TEST_SET.get(target.name, ())
    else:
        combos = [(False, False), (True, False), (True, True)] + ([(False, True)] if tier == "full" else [])
    dtypes = ("bf16", "f16") if tier == "full" else ("bf16",)
    chunks = CHUNKS if tier == "full" else (8,)
    out = []
    for dt in dtypes:
        for res, q in combos:
            for c in chunks:
                v = RmsNormVariant(target=target.name, dtype=dt, chunks=c, residual=res, quant=q)
                if v.can_implement() is None:
                    out.append(v)
    return out


class RmsNormKernel:
    def __init__(self, v: RmsNormVariant):
        self.v = v
        self.dt = cutlass_dtype(v.dtype)
        self.warps = v.threads // 32

    def launch(self):
        """The @cute.jit entry for this variant's signature (x, weight, [residual], out, [scale],
        eps, stream)."""
        return {(False, False): self.plain, (True, False): self.res, (False, True): self.quant,
                (True, True): self.res_quant}[(self.v.residual, self.v.quant)]

    @cute.jit
    def plain(self, mX: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor, eps: cutlass.Float32,
              stream: cuda.CUstream):
        self._go(mX, mW, mX, mO, mW, eps, stream)

    @cute.jit
    def res(self, mX: cute.Tensor, mW: cute.Tensor, mR: cute.Tensor, mO: cute.Tensor, eps: cutlass.Float32,
            stream: cuda.CUstream):
        self._go(mX, mW, mR, mO, mW, eps, stream)

    @cute.jit
    def quant(self, mX: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor, mS: cute.Tensor, eps: cutlass.Float32,
              stream: cuda.CUstream):
        self._go(mX, mW, mX, mO, mS, eps, stream)

    @cute.jit
    def res_quant(self, mX: cute.Tensor, mW: cute.Tensor, mR: cute.Tensor, mO: cute.Tensor, mS: cute.Tensor,
                  eps: cutlass.Float32, stream: cuda.CUstream):
        self._go(mX, mW, mR, mO, mS, eps, stream)

    @cute.jit
    def _go(self, mX, mW, mR, mO, mS, eps, stream):
        M = cute.size(mX, mode=[0])
        self.kernel(mX, mW, mR, mO, mS, eps).launch(grid=(M, 1, 1), block=(self.v.threads, 1, 1), stream=stream)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mW: cute.Tensor, mR: cute.Tensor, mO: cute.Tensor, mS: cute.Tensor,
               eps: cutlass.Float32):
        T, C = self.v.threads, self.v.chunks
        tidx, _, _ = cute.arch.thread_idx()
        row, _, _ = cute.arch.block_idx()
        warp = cute.arch.make_warp_uniform(tidx // 32)
        lane = tidx % 32
        N = cute.size(mX, mode=[1])
        nv = N // VEC

        smem = cutlass.utils.SmemAllocator()
        red = smem.allocate_tensor(cutlass.Float32, cute.make_layout(self.warps), 16)
        red2 = smem.allocate_tensor(cutlass.Float32, cute.make_layout(self.warps), 16)

        gX = cute.zipped_divide(mX[row, None], (VEC,))  # ((VEC), (N / VEC))
        gW = cute.zipped_divide(mW, (VEC,))
        gO = cute.zipped_divide(mO[row, None], (VEC,))

        rX = cute.make_rmem_tensor(cute.make_layout((VEC, C)), self.dt)
        rX.fill(0.0)
        for c in cutlass.range_constexpr(C):
            j = c * T + tidx
            if j < nv:
                cute.autovec_copy(gX[None, j], rX[None, c])
        if cutlass.const_expr(self.v.residual):
            gR = cute.zipped_divide(mR[row, None], (VEC,))
            rR = cute.make_rmem_tensor(cute.make_layout((VEC, C)), self.dt)
            rR.fill(0.0)
            for c in cutlass.range_constexpr(C):
                j = c * T + tidx
                if j < nv:
                    cute.autovec_copy(gR[None, j], rR[None, c])
            for c in cutlass.range_constexpr(C):
                s = rX[None, c].load().to(cutlass.Float32) + rR[None, c].load().to(cutlass.Float32)
                rX[None, c].store(s.to(self.dt))
            for c in cutlass.range_constexpr(C):
                j = c * T + tidx
                if j < nv:
                    cute.autovec_copy(rX[None, c], gR[None, j])

        ss = cutlass.Float32(0.0)
        for c in cutlass.range_constexpr(C):
            xf = rX[None, c].load().to(cutlass.Float32)
            ss = ss + (xf * xf).reduce(cute.ReductionOp.ADD, cutlass.Float32(0.0), 0)
        ss = block_allreduce(ss, fadd, red, self.warps, warp, lane)
        rstd = cute.math.rsqrt(ss / cutlass.Float32(N) + eps)

        rW = cute.make_rmem_tensor(cute.make_layout(VEC), self.dt)
        if cutlass.const_expr(not self.v.quant):
            rY = cute.make_rmem_tensor(cute.make_layout(VEC), self.dt)
            for c in cutlass.range_constexpr(C):
                j = c * T + tidx
                if j < nv:
                    cute.autovec_copy(gW[None, j], rW)
                    y = rX[None, c].load().to(cutlass.Float32) * rstd * rW.load().to(cutlass.Float32)
                    rY.store(y.to(self.dt))
                    cute.autovec_copy(rY, gO[None, j])
        else:
            # y in the activation dtype (as the unfused sequence has it), kept in rX; its amax.
            amax = cutlass.Float32(0.0)
            for c in cutlass.range_constexpr(C):
                j = c * T + tidx
                if j < nv:
                    cute.autovec_copy(gW[None, j], rW)
                    y = (rX[None, c].load().to(cutlass.Float32) * rstd * rW.load().to(cutlass.Float32)).to(self.dt)
                    rX[None, c].store(y)
                    for i in cutlass.range_constexpr(VEC):
                        a = rX[i, c].to(cutlass.Float32)
                        amax = cute.arch.fmax(amax, cute.arch.fmax(a, -a))
            amax = block_allreduce(amax, fmax, red2, self.warps, warp, lane)
            scale = cute.arch.fmax(amax / cutlass.Float32(FP8_MAX), cutlass.Float32(FP8_MIN_SCALE))
            inv = cutlass.Float32(1.0) / scale
            if tidx == 0:
                mS[row] = scale
            rQ = cute.make_rmem_tensor(cute.make_layout(VEC), cutlass.Float8E4M3FN)
            for c in cutlass.range_constexpr(C):
                j = c * T + tidx
                if j < nv:
                    q = rX[None, c].load().to(cutlass.Float32) * inv
                    rQ.store(q.to(cutlass.Float8E4M3FN))
                    cute.autovec_copy(rQ, gO[None, j])
