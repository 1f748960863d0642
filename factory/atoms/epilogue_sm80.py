"""Epilogue building blocks of the mma.sync GEMM (sm_80/86/89; sm_90 portability build): the
fields ``bias``, ``silu_mul`` and ``residual`` applied per output vector to fp32 accumulators
staged in shared memory."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

_LOG2_E = 1.4426950408889634


@cute.jit
def silu(x: cutlass.Float32) -> cutlass.Float32:
    """x·sigmoid(x), sigmoid as 1 / (1 + 2^(-x·log2 e))."""
    return x * cute.arch.rcp_approx(1.0 + cute.math.exp2(-x * _LOG2_E, fastmath=True))


@cute.jit
def epilogue_vector(sC: cute.Tensor, coords: cute.Tensor, vals: cute.Tensor, mBias, col0, block: cutlass.Constexpr,
                    bias: cutlass.Constexpr, silu_mul: cutlass.Constexpr):
    """One output vector into ``vals`` (fp32), each element at tile coordinate (row, col) of
    ``coords``: ``sC[row, col] (+ bias[col0 + col])``.  With ``silu_mul`` the kernel tile holds
    gate and up columns in blocks of ``block`` ([gate 0; up 0; gate 1; up 1; ...]): output column
    ``col`` of the tile is gate column ``g = (col // block)·2·block + col % block`` and up column
    ``g + block``, and the result is ``silu(gate) · up`` (a vector never crosses a block)."""
    for v in cutlass.range_constexpr(cute.size(vals)):
        r, c = coords[v]
        if cutlass.const_expr(silu_mul):
            c = (c // block) * (2 * block) + c % block
        x = sC[r, c]
        if cutlass.const_expr(bias):
            x = x + mBias[col0 + c].to(cutlass.Float32)
        if cutlass.const_expr(silu_mul):
            u = sC[r, c + block]
            if cutlass.const_expr(bias):
                u = u + mBias[col0 + c + block].to(cutlass.Float32)
            x = silu(x) * u
        vals[v] = x


__all__ = ["epilogue_vector", "silu"]
