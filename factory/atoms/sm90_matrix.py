"""Warp-wide shared-memory matrix moves for sm_90 (``ldmatrix`` / ``stmatrix``), as 32-bit words.

Each instruction moves four 8x8 matrices of 16-bit elements (8 rows of 16 bytes each); lanes
8i..8i+7 give the shared addresses of the rows of matrix i (any 16-byte aligned addresses), and
each lane holds one 32-bit word of each matrix:

* ``ldsm_x4`` (``ldmatrix ... .x4.b16``, not transposed): lane l receives, of matrix i, the word of
  row l//4, bytes 4(l%4)..4(l%4)+3.
* ``ldsm_x4_trans`` (``ldmatrix ... .x4.trans.b16``): lane l receives, of matrix i, the 16-bit
  elements (row 2(l%4), column l//4) in its low half and (row 2(l%4)+1, column l//4) in its high
  half.  On byte data: bytes 2(l//4), 2(l//4)+1 of rows 2(l%4) and 2(l%4)+1.
* ``stsm_x4`` (``stmatrix ... .x4.b16``, not transposed): lane l's word i goes to row l//4 of
  matrix i, bytes 4(l%4)..4(l%4)+3.

Addresses are 32-bit shared-window addresses (``Pointer.toint()`` of a shared-memory pointer plus
byte offsets).  Both are emitted as inline PTX with side effects, so neither moves across the
barrier waits and arrives around them.
"""

from __future__ import annotations

import cutlass
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op


def _ldsm_x4(addr, trans: bool, loc, ip):
    res = llvm.inline_asm(
        llvm.StructType.get_literal([T.i32(), T.i32(), T.i32(), T.i32()]),
        [cutlass.Int32(addr).ir_value(loc=loc, ip=ip)],
        f"ldmatrix.sync.aligned.m8n8.x4{'.trans' if trans else ''}.shared.b16 {{$0, $1, $2, $3}}, [$4];",
        "=r,=r,=r,=r,r",
        has_side_effects=True,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
        loc=loc, ip=ip,
    )
    return tuple(cutlass.Int32(llvm.extractvalue(T.i32(), res, [i], loc=loc, ip=ip)) for i in range(4))


@dsl_user_op
def ldsm_x4(addr, *, loc=None, ip=None):
    """Four 8x8 b16 matrices -> four 32-bit words of this lane (see the module)."""
    return _ldsm_x4(addr, False, loc, ip)


@dsl_user_op
def ldsm_x4_trans(addr, *, loc=None, ip=None):
    """Four transposed 8x8 b16 matrices -> four 32-bit words of this lane (see the module)."""
    return _ldsm_x4(addr, True, loc, ip)


@dsl_user_op
def stsm_x4(addr, w0, w1, w2, w3, *, loc=None, ip=None):
    """Four 32-bit words of this lane -> rows of four 8x8 b16 matrices (see the module)."""
    llvm.inline_asm(
        None,
        [cutlass.Int32(x).ir_value(loc=loc, ip=ip) for x in (addr, w0, w1, w2, w3)],
        "stmatrix.sync.aligned.m8n8.x4.shared.b16 [$0], {$1, $2, $3, $4};",
        "r,r,r,r,r",
        has_side_effects=True,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
        loc=loc, ip=ip,
    )


__all__ = ["ldsm_x4", "ldsm_x4_trans", "stsm_x4"]
