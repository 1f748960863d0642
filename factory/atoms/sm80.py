"""Ampere/Ada atoms (sm_80, sm_86, sm_89, sm_120a and the sm_90 portability build): mma.sync, cp.async,
ldmatrix and the swizzled shared-memory layouts that make ldmatrix conflict-free.

Everything here is trace-time (host) code that returns CuTe objects; kernels call it from their
``@cute.jit`` host side.
"""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute

VECTOR_BYTES = 16  # one cp.async / ldmatrix row / st.global.v4


def vector_elems(dtype) -> int:
    return VECTOR_BYTES * 8 // dtype.width


def mma_op(ab_dtype, acc_dtype=cutlass.Float32):
    """The warp MMA for this operand type: m16n8k16 for 16-bit, m16n8k32 for fp8 (sm_89, sm_120a; emulated on sm_90)."""
    if ab_dtype.width == 8:
        return cute.nvgpu.warp.MmaFP8Op(ab_dtype, acc_dtype, (16, 8, 32))
    return cute.nvgpu.warp.MmaF16BF16Op(ab_dtype, acc_dtype, (16, 8, 16))


def tiled_mma(ab_dtype, warps_mn: tuple[int, int], acc_dtype=cutlass.Float32):
    """Warps tiled (wm, wn); each warp's N is doubled to 16 so one ldmatrix.x4 feeds two n8 MMAs."""
    op = mma_op(ab_dtype, acc_dtype)
    m, n, k = op.shape_mnk
    wm, wn = warps_mn
    return cute.make_tiled_mma(op, cute.make_layout((wm, wn, 1)), permutation_mnk=(wm * m, wn * n * 2, k))


def smem_layout(dtype, contiguous_mode: int, tile: tuple[int, int], stages: int | None = None):
    """Swizzled shared-memory layout for a (rows, cols[, stages]) operand tile.

    ``contiguous_mode`` 1: cols contiguous (a K-major operand stored (MN, K)); 0: rows contiguous.
    Atom: 8 lines of up to 128 bytes along the contiguous mode; the swizzle XORs the line index
    into the 16-byte chunk index so the 8 rows one ldmatrix reads land in distinct banks.
    """
    vec = vector_elems(dtype)
    line = min(tile[contiguous_mode], 128 * 8 // dtype.width)
    chunks = line // vec
    bits = min(int(math.log2(chunks)), 3)
    sw = cute.make_swizzle(bits, int(math.log2(vec)), 3)
    if contiguous_mode == 1:
        outer = cute.make_layout((8, line), stride=(line, 1))
    else:
        outer = cute.make_layout((line, 8), stride=(1, line))
    atom = cute.make_composed_layout(sw, 0, outer)
    shape = tile if stages is None else (*tile, stages)
    return cute.tile_to_shape(atom, shape, (0, 1, 2) if stages is not None else (0, 1))


def g2s_tiled_copy(dtype, contiguous_mode: int, tile: tuple[int, int], threads: int):
    """cp.async tiled copy, 16 bytes per thread per copy, threads laid along the contiguous mode."""
    vec = vector_elems(dtype)
    atom = cute.make_copy_atom(
        cute.nvgpu.cpasync.CopyG2SOp(cache_mode=cute.nvgpu.LoadCacheMode.GLOBAL), dtype,
        num_bits_per_copy=VECTOR_BYTES * 8,
    )
    return cute.make_tiled_copy_tv(atom, *_thread_value_layouts(vec, contiguous_mode, tile, threads))


def vector_tiled_copy(dtype, contiguous_mode: int, tile: tuple[int, int], threads: int, bits: int = 128):
    """Synchronous vectorised tiled copy (smem <-> gmem, smem <-> rmem)."""
    vec = bits // dtype.width
    atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dtype, num_bits_per_copy=bits)
    return cute.make_tiled_copy_tv(atom, *_thread_value_layouts(vec, contiguous_mode, tile, threads))


def _thread_value_layouts(vec: int, contiguous_mode: int, tile: tuple[int, int], threads: int):
    along = min(tile[contiguous_mode] // vec, threads)
    across = threads // along
    if contiguous_mode == 1:
        return cute.make_layout((across, along), stride=(along, 1)), cute.make_layout((1, vec))
    return cute.make_layout((along, across), stride=(1, along)), cute.make_layout((vec, 1))


def s2r_atom(dtype, contiguous_mode: int):
    """ldmatrix for an MMA operand: plain for K-major tiles, transposed for MN-major (16-bit only)."""
    if dtype.width == 8:
        if contiguous_mode != 1:
            raise ValueError("fp8 mma.sync operands must be K-major")
        return cute.make_copy_atom(cute.nvgpu.warp.LdMatrix8x16x8bOp(False, 4), dtype)
    return cute.make_copy_atom(cute.nvgpu.warp.LdMatrix8x8x16bOp(contiguous_mode != 1, 4), dtype)


def acc_mn_view(t):
    """An m16n8 accumulator partition ``((2, 2), M, N)`` (or an identity tensor partitioned like
    one) viewed as ``(rows, cols) = ((2, M), (2, N))``: per thread two rows (lane/4 and lane/4 + 8
    of each 16-row block), two adjacent columns of each 8-column block."""
    shape = t.layout.shape
    flat = cute.make_layout(shape)
    mn = cute.make_layout(
        ((shape[0][1], shape[1]), (shape[0][0], shape[2])),
        stride=((flat.stride[0][1], flat.stride[1]), (flat.stride[0][0], flat.stride[2])),
    )
    return cute.make_tensor(t.iterator, cute.composition(t.layout, mn))


def acc_as_a_layout(layout):
    """An m16n8k16 accumulator layout ``((2, 2), M, N)`` as the A operand of the next MMA,
    ``((4, 2), M, N/2)``: two n8 C tiles hold the registers of one k16 A tile, in order, so a
    converted accumulator feeds P·V without shuffles."""
    split = cute.logical_divide(layout, (None, None, 2))
    return cute.make_layout(
        ((split.shape[0], split.shape[2][0]), split.shape[1], split.shape[2][1]),
        stride=((split.stride[0], split.stride[2][0]), split.stride[1], split.stride[2][1]),
    )
