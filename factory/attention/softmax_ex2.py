"""The online softmax (softmax.online_softmax, ``corr`` form) with its exponentials taken off the
MUFU pipe in part, for kernels whose key tiles are bound by MUFU.EX2 (16 per SM and clock):

* ``fma_per_16`` > 0: that many of every 16 consecutive columns of a thread's row take the
  polynomial exp2 on the FMA pipe (atoms/exp2_poly.py, degree ``degree``), the rest MUFU.EX2;
* ``bf16_pairs``: every pair of adjacent columns through one ``ex2.approx.ftz.bf16x2`` (inputs and
  P rounded to bf16; the row sum adds the same bf16 values P·V multiplies).

The rows' O correction factors stay on MUFU.EX2 (two per thread and key tile).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

from ..atoms.common import quad_allreduce
from ..atoms.exp2_poly import ex2_bf16x2, ex2_poly


def fma_column(c: int, per_16: int) -> bool:
    """Whether column ``c`` of a thread's row (accumulator order) takes the polynomial exp2:
    ``per_16`` of every 16 consecutive columns, spread evenly."""
    return (c % 16 + 1) * per_16 // 16 > (c % 16) * per_16 // 16


@cute.jit
def online_softmax_ex2(s_mn: cute.Tensor, row_max: cute.Tensor, row_sum: cute.Tensor, scale_log2,
                       corr: cute.Tensor, fma_per_16: cutlass.Constexpr[int], degree: cutlass.Constexpr[int],
                       bf16_pairs: cutlass.Constexpr[bool]):
    """One key tile: ``s_mn`` <- P = 2^(S·scale_log2 - max·scale_log2), running max and sum
    updated, each row's O factor in ``corr`` (as softmax.online_softmax with ``corr``)."""
    n_cols = cute.size(s_mn, mode=[1])
    for r in cutlass.range_constexpr(cute.size(row_max)):
        s = s_mn[r, None].load()
        m_new = quad_allreduce(s.reduce(cute.ReductionOp.MAX, -cutlass.Float32.inf, 0), cute.arch.fmax)
        m_new = cute.arch.fmax(m_new, row_max[r])
        # a row with nothing visible yet keeps max = -inf; subtract 0 then, not -inf (NaN)
        m_scaled = (0.0 if m_new == -cutlass.Float32.inf else m_new) * scale_log2
        s_mn[r, None] = s * scale_log2 - m_scaled
        if cutlass.const_expr(bf16_pairs):
            for c in cutlass.range_constexpr(0, n_cols, 2):
                s_mn[r, c], s_mn[r, c + 1] = ex2_bf16x2(s_mn[r, c], s_mn[r, c + 1])
        else:
            for c in cutlass.range_constexpr(n_cols):
                if cutlass.const_expr(fma_column(c, fma_per_16)):
                    s_mn[r, c] = ex2_poly(s_mn[r, c], degree)
                else:
                    s_mn[r, c] = cute.math.exp2(s_mn[r, c], fastmath=True)
        corr[r] = cute.math.exp2(row_max[r] * scale_log2 - m_scaled, fastmath=True)
        row_sum[r] = row_sum[r] * corr[r] + s_mn[r, None].load().reduce(cute.ReductionOp.ADD,
                                                                        cutlass.Float32.zero, 0)
        row_max[r] = m_new


__all__ = ["fma_column", "online_softmax_ex2"]
