"""e4m3 operands of f16 ``mma.sync`` read straight from a shared tile of raw fp8 bytes, as 32-bit
words (sm_89+: ``cvt.rn.f16x2.e4m3x2``).

* ``ldsm_x4`` (``atoms/sm90_matrix.py``: ``ldmatrix ... .x4.b16``, not transposed) on an e4m3 tile
  of 8 keys x 16 head_dim bytes gives lane l key l//4, head_dim bytes 4t..4t+3 (t = l%4).
* ``e4m3x4_to_f16x2x2``: one word of four e4m3 values [b0 b1 b2 b3] -> two f16x2 words (b0, b1)
  and (b2, b3) (exact: every e4m3 value is an f16 value).  For an m16n8k16 B fragment (registers
  k = 2t, 2t+1 and 2t+8, 2t+9 of column l//4) the ldsm_x4 word of K gives head_dim 4t..4t+1 and
  4t+2..4t+3: the MMA's k order is the head_dim order permuted within each 16-column group
  (``e4m3_order.k_order``), which the A operand (Q) takes by being stored in that order.
* ``e4m3_join_to_f16x2x2``: ``prmt.b32`` of two words by a selector, then the same conversion
  (V by ``ldmatrix.trans``: see attention/decode.py).

No side effects on the conversions (the compiler may schedule them among the MMAs); the ldmatrix
has them, so it never moves across a barrier.
"""

from __future__ import annotations

import cutlass
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op


_CVT2 = ("{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, %s;\n"
         "cvt.rn.f16x2.e4m3x2 $0, lo;\ncvt.rn.f16x2.e4m3x2 $1, hi;\n}")


@dsl_user_op
def e4m3x4_to_f16x2x2(w, *, loc=None, ip=None):
    """[b0 b1 b2 b3] (e4m3) -> (f16x2 of b0, b1; f16x2 of b2, b3) as two 32-bit words."""
    res = llvm.inline_asm(
        llvm.StructType.get_literal([T.i32(), T.i32()]),
        [cutlass.Int32(w).ir_value(loc=loc, ip=ip)],
        _CVT2 % "$2",
        "=r,=r,r",
        has_side_effects=False,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
        loc=loc, ip=ip,
    )
    return tuple(cutlass.Int32(llvm.extractvalue(T.i32(), res, [i], loc=loc, ip=ip)) for i in range(2))


@dsl_user_op
def e4m3_join_to_f16x2x2(a, b, sel: int, *, loc=None, ip=None):
    """``prmt.b32`` of (a, b) by the constant selector ``sel`` (nibble k: source byte of result
    byte k, 0-3 from a, 4-7 from b), then e4m3x4_to_f16x2x2 of the result."""
    res = llvm.inline_asm(
        llvm.StructType.get_literal([T.i32(), T.i32()]),
        [cutlass.Int32(a).ir_value(loc=loc, ip=ip), cutlass.Int32(b).ir_value(loc=loc, ip=ip)],
        "{\n.reg .b32 p;\nprmt.b32 p, $2, $3, %d;\n" % sel + (_CVT2 % "p")[2:],
        "=r,=r,r,r",
        has_side_effects=False,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
        loc=loc, ip=ip,
    )
    return tuple(cutlass.Int32(llvm.extractvalue(T.i32(), res, [i], loc=loc, ip=ip)) for i in range(2))


__all__ = ["e4m3_join_to_f16x2x2", "e4m3x4_to_f16x2x2"]
