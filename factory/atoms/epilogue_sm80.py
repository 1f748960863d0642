"""Epilogue building blocks of the mma.sync GEMM (sm_80/86/89, sm_120a; sm_90 portability build):
the fields ``bias``, ``silu_mul`` and ``residual`` applied per output vector to fp32 accumulators
staged in shared memory, and fp8's row-wise scales applied to the accumulators in registers."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

from .sm80 import acc_mn_view

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



@cute.jit
def apply_row_col_scales(acc: cute.Tensor, coords: cute.Tensor, row_scale: cute.Tensor, col_scale: cute.Tensor):
    """fp8 row-wise scales on m16n8 accumulators: ``acc[i] *= row_scale[m]·col_scale[n]`` at each
    accumulator's output coordinate (m, n) (``coords``: an identity tensor over the output,
    partitioned like ``acc``).  Each thread reads its rows' scales once, then each of its columns'
    once; coordinates past the end read the last scale (those outputs are never stored)."""
    acc_mn = acc_mn_view(acc)
    c_mn = acc_mn_view(coords)
    rows = cute.size(acc_mn, mode=[0])
    last_r = cute.size(row_scale) - 1
    last_c = cute.size(col_scale) - 1
    sr = cute.make_rmem_tensor(rows, cutlass.Float32)
    for r in cutlass.range_constexpr(rows):
        sr[r] = row_scale[cutlass.min(c_mn[r, 0][0], last_r)]
    for c in cutlass.range_constexpr(cute.size(acc_mn, mode=[1])):
        sc = col_scale[cutlass.min(c_mn[0, c][1], last_c)]
        for r in cutlass.range_constexpr(rows):
            acc_mn[r, c] = acc_mn[r, c] * (sr[r] * sc)


__all__ = ["apply_row_col_scales", "epilogue_vector", "silu"]
