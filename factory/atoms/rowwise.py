"""Row-wise building blocks of the memory-bound kernels (norms, rotary embedding, cache writes):
16-byte vector moves between global memory and registers, and the reduction of one value over a
whole CTA.  Nothing here is generation-specific (plain loads and stores, warp shuffles, one
shared-memory exchange): every target from sm_80 to sm_120a compiles it unchanged.

Imported only by kernel modules (it needs the DSL), never by the runtime.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

VEC_BYTES = 16  # one vector access: LDG.E.128 / STG.E.128


def vec_elems(dtype) -> int:
    """Elements of ``dtype`` (a cutlass numeric type) in one 16-byte access."""
    return VEC_BYTES * 8 // dtype.width


@cute.jit
def load_vec(src: cute.Tensor, dst: cute.Tensor):
    """Copy a statically shaped slice of global memory (one vector) into registers."""
    cute.autovec_copy(src, dst)


@cute.jit
def block_allreduce(val, op, red: cute.Tensor, warps: cutlass.Constexpr[int], warp, lane):
    """``op`` over ``val`` of every thread of the CTA, returned to every thread.  ``red``: a
    shared-memory tensor of ``warps`` Float32 that no thread is still reading (the caller syncs
    between two uses)."""
    for i in cutlass.range_constexpr(5):
        val = op(val, cute.arch.shuffle_sync_bfly(val, offset=16 >> i, mask=-1, mask_and_clamp=31))
    if lane == 0:
        red[warp] = val
    cute.arch.sync_threads()
    total = red[0]
    for w in cutlass.range_constexpr(1, warps):
        total = op(total, red[w])
    return total


def fadd(a, b):
    return a + b


def fmax(a, b):
    return cute.arch.fmax(a, b)


__all__ = ["VEC_BYTES", "block_allreduce", "fadd", "fmax", "load_vec", "vec_elems"]
