"""Fused GEMM epilogue steps on Hopper WGMMA accumulators (used by ``gemm/sm90.py``) beyond the
ones in ``atoms/sm90.py``: the residual read two columns per load, SiLU(gate)·up over gate/up
blocks of any width, and fp8 quantisation of each output row with one scale per tile.

Each takes the accumulators and ``coords`` (an identity tensor over the CTA tile partitioned like
them).  A thread holds its columns in adjacent pairs every 8 (:func:`acc_mn_view` columns ``2j``,
``2j + 1``) and a row's columns are spread over the 4 threads of a quad (module docstring of
``atoms/sm90.py``).  Imported only by kernel modules (it needs the DSL), never by the runtime.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

from .sm90 import acc_mn_view

_LOG2_E = 1.4426950408889634


@cute.jit
def add_residual(acc: cute.Tensor, coords: cute.Tensor, res: cute.Tensor, row0, col0, l,
                 cols: cutlass.Constexpr, pairs: cutlass.Constexpr = False):
    """``acc[r, c] += res[row0 + r, col0 + c, l]`` over this thread's first ``cols`` columns
    (:func:`acc_mn_view` indices).  Each tile reads its residual before any store of its own
    outputs, so ``res`` may be the output tensor itself (an in-place add).  Coordinates past the
    end read the last row / column (those outputs are never stored): no load needs a predicate.

    ``pairs``: ``res`` is contiguous along its columns with an even column count, a base aligned
    to two elements and even strides, so each pair of adjacent columns is one load (4 bytes for
    16-bit residuals).  Without it (swapped operands: the residual's columns are the kernel's
    rows, one per thread) one load per element."""
    acc_mn = acc_mn_view(acc)
    c_mn = acc_mn_view(coords)
    last_r = cute.size(res, mode=[0]) - 1
    last_c = cute.size(res, mode=[1]) - 1
    if cutlass.const_expr(pairs):
        duo = cute.make_rmem_tensor((2,), res.element_type)
        for r in cutlass.range_constexpr(cute.size(acc_mn, mode=[0])):
            row = cutlass.min(row0 + c_mn[r, 0][0], last_r)
            res_row = cute.zipped_divide(res[row, None, l], (2,))
            for j in cutlass.range_constexpr(cols // 2):
                # The pair's first column is even; the last pair starts at last_c - 1.
                col = cutlass.min(col0 + c_mn[0, 2 * j][1], last_c - 1)
                cute.autovec_copy(res_row[None, col // 2], duo)
                acc_mn[r, 2 * j] = acc_mn[r, 2 * j] + duo[0].to(cutlass.Float32)
                acc_mn[r, 2 * j + 1] = acc_mn[r, 2 * j + 1] + duo[1].to(cutlass.Float32)
    else:
        for r in cutlass.range_constexpr(cute.size(acc_mn, mode=[0])):
            row = cutlass.min(row0 + c_mn[r, 0][0], last_r)
            for c in cutlass.range_constexpr(cols):
                col = cutlass.min(col0 + c_mn[0, c][1], last_c)
                acc_mn[r, c] = acc_mn[r, c] + res[row, col, l].to(cutlass.Float32)


@cute.jit
def silu_mul_blocks(acc: cute.Tensor, block: cutlass.Constexpr):
    """Gate/up in one tile: its columns alternate ``block`` gate columns and the matching ``block``
    up columns (a 128-column tile with blocks of 64: the first half gate, the last half up).
    Column j and j + block sit at :func:`acc_mn_view` indices c and c + block/4 of the same
    thread, so ``acc[r, c] = silu(acc[r, c]) * acc[r, c + block/4]`` needs no data exchange; the
    results sit at the gate columns' indices (:func:`result_columns`)."""
    acc_mn = acc_mn_view(acc)
    per = block // 4
    for r in cutlass.range_constexpr(cute.size(acc_mn, mode=[0])):
        for q in cutlass.range_constexpr(cute.size(acc_mn, mode=[1]) // (2 * per)):
            for c in cutlass.range_constexpr(per):
                i = 2 * per * q + c
                g = acc_mn[r, i]
                sig = cute.arch.rcp_approx(1.0 + cute.math.exp2(-g * _LOG2_E, fastmath=True))
                acc_mn[r, i] = g * sig * acc_mn[r, i + per]


def result_columns(cols: int, block: int) -> list[int]:
    """The :func:`acc_mn_view` column indices that hold outputs: all ``cols``, or after
    :func:`silu_mul_blocks` with gate/up blocks of ``block`` columns (``block`` > 0) the gate
    columns' indices."""
    if not block:
        return list(range(cols))
    per = block // 4
    return [2 * per * q + c for q in range(cols // (2 * per)) for c in range(per)]


@cute.jit
def quantize_row_groups(acc: cute.Tensor, coords: cute.Tensor, scale_out: cute.Tensor, row0, group,
                        fp8_max: cutlass.Constexpr, min_scale: cutlass.Constexpr, block: cutlass.Constexpr):
    """fp8 quantisation of a tile's output rows, one group per row and tile: ``scale =
    max(amax / fp8_max, min_scale)`` over the row's outputs in this tile (two shuffles across the
    quad), ``acc *= 1 / scale``, and the quad's first thread (the one holding column 0) writes
    ``scale_out[row0 + r, group]``; rows past the end write nothing.  ``block``: the outputs are
    the gate columns of :func:`silu_mul_blocks` with that block (0: every column)."""
    acc_mn = acc_mn_view(acc)
    c_mn = acc_mn_view(coords)
    idx = result_columns(cute.size(acc_mn, mode=[1]), block)
    last_r = cute.size(scale_out, mode=[0]) - 1
    for r in cutlass.range_constexpr(cute.size(acc_mn, mode=[0])):
        amax = cutlass.Float32(0.0)
        for i in cutlass.range_constexpr(len(idx)):
            x = acc_mn[r, idx[i]]
            amax = cute.arch.fmax(amax, cute.arch.fmax(x, -x))
        amax = cute.arch.fmax(amax, cute.arch.shuffle_sync_bfly(amax, offset=1, mask=-1, mask_and_clamp=31))
        amax = cute.arch.fmax(amax, cute.arch.shuffle_sync_bfly(amax, offset=2, mask=-1, mask_and_clamp=31))
        scale = cute.arch.fmax(amax / cutlass.Float32(fp8_max), cutlass.Float32(min_scale))
        inv = cutlass.Float32(1.0) / scale
        for i in cutlass.range_constexpr(len(idx)):
            acc_mn[r, idx[i]] = acc_mn[r, idx[i]] * inv
        row = row0 + c_mn[r, 0][0]
        if c_mn[0, 0][1] == 0:
            if row <= last_r:
                scale_out[row, group] = scale


__all__ = ["add_residual", "quantize_row_groups", "result_columns", "silu_mul_blocks"]
