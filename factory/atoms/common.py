"""DSL helpers no generation owns: the cutlass element type of a dtype name, and the reduction
over the four threads of a quad that hold one row of an MMA accumulator (mma.sync m16n8 on
sm_80..sm_120a and WGMMA on sm_90a lay rows out the same way: lane/4 picks the row, lane%4 the
column pair).

Imported only by kernel modules (it needs the DSL), never by the runtime.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

# dtype names of the calling convention (factory/abi.py) -> cutlass element types.
CUTLASS_DTYPES = {
    "bf16": cutlass.BFloat16, "f16": cutlass.Float16, "f32": cutlass.Float32,
    "e4m3": cutlass.Float8E4M3FN,
}


def cutlass_dtype(name: str):
    return CUTLASS_DTYPES[name]


@cute.jit
def quad_allreduce(x, op):
    """Reduce over the 4 threads of a quad (they hold one accumulator row between them)."""
    x = op(x, cute.arch.shuffle_sync_bfly(x, offset=2, mask=-1, mask_and_clamp=31))
    return op(x, cute.arch.shuffle_sync_bfly(x, offset=1, mask=-1, mask_and_clamp=31))


def add(a, b):
    return a + b


__all__ = ["CUTLASS_DTYPES", "add", "cutlass_dtype", "quad_allreduce"]
