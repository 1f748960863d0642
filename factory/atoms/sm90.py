"""Hopper (sm_90a) building blocks shared by kernels: WGMMA accumulator views, register budgets.

Imported only by kernel modules (it needs the DSL), never by the runtime.

WGMMA accumulator fragments (m64nNk16, fp32, one warpgroup) have the value mode ``(2, 2, N/8)``:
(column pair, row +8, 8-column block), per thread two rows (lane/4 and lane/4 + 8 of its warp's
16) and N/4 columns; the four threads of a quad hold one row between them, as in mma.sync.  The
register A operand of the next WGMMA (16-bit, k16) has the value mode ``(2, 2, 2)`` per k-block
with exactly the registers of the accumulator's 16 columns in the same order, so a converted
accumulator *is* the A fragment of the next GEMM: no shuffles (see :func:`acc_as_a_operand`).
"""

from __future__ import annotations

import struct

import cutlass
import cutlass.cute as cute
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

# setmaxnreg budgets (registers per thread) by consumer warpgroup count: the producer warpgroup
# gives registers back, the consumers take them.  The sum over the CTA must stay within the 64K
# register file: 2 consumers: 24·128 + 2·240·128 = 64512; 3 consumers: 32·128 + 3·160·128 = 65536.
PRODUCER_REGS = {1: 56, 2: 24, 3: 32}
CONSUMER_REGS = {1: 256, 2: 240, 3: 160}


def acc_mn_view(t: cute.Tensor) -> cute.Tensor:
    """A WGMMA accumulator partition ``((2, 2, V), M, N)`` (or an identity tensor partitioned
    like one) viewed as ``(rows, cols) = ((2, M), ((2, V), N))``."""
    shape = t.layout.shape
    flat = cute.make_layout(shape)
    mn = cute.make_layout(
        ((shape[0][1], shape[1]), ((shape[0][0], shape[0][2]), shape[2])),
        stride=((flat.stride[0][1], flat.stride[1]),
                ((flat.stride[0][0], flat.stride[0][2]), flat.stride[2])),
    )
    return cute.make_tensor(t.iterator, cute.composition(t.layout, mn))


def acc_as_a_operand(acc_layout: cute.Layout, a_fragment: cute.Tensor) -> cute.Tensor:
    """The register A fragment ``a_fragment`` (``((2, 2, 2), M, K/16)``, 16-bit) viewed with the
    accumulator's layout: storing converted accumulator values through this view fills the A
    operand.  Both are compact in the same value order (module docstring); checked here."""
    if cute.cosize(acc_layout) != cute.cosize(a_fragment.layout):
        raise ValueError(f"accumulator {acc_layout} and A fragment {a_fragment.layout} differ in size")
    return cute.make_tensor(a_fragment.iterator, acc_layout)


@cute.jit
def schedule_fence(x):
    """Returns ``x`` (a Float32 that is >= 0 or NaN, e.g. a partial row sum of exponentials)
    through a loop that never runs: a basic-block boundary ptxas can neither if-convert nor
    schedule across.  ptxas schedules within basic blocks and hoists ``WARPGROUP.DEPBAR`` (a
    ``wgmma.wait_group``) to the top of its block; a wait placed after this fence stays below
    everything before it (SASS of the attention mainloop: notes/attention-sm90.md).  Cost: one
    FSETP and one branch.  (The loop ends for every finite x: t < 0 halves toward 2.)"""
    t = x
    while t < 0.0:
        t = t * 0.5 + 1.0
    return t


# 2^f on f in [-1/2, 1/2], degree 3, fitted for relative error (max 7.5e-5 in float32: far below
# the bf16/fp16 rounding of P).
_EXP2_POLY = (0.9999280571937561, 0.6932609677314758, 0.24261115491390228, 0.0551716685295105)


@dsl_user_op
def exp2_poly(x, *, loc=None, ip=None):
    """2^x for finite x <= 0 on the FMA/ALU pipes instead of the MUFU (16 results per clock per
    SM on Hopper): x clamped to >= -126, j = round(x) by the 1.5·2^23 trick (its bits carry j),
    2^(x-j) by a cubic, j added into the exponent bits.  Nine instructions, no MUFU.  Not for
    x = -inf (returns 2^-126, not 0): callers use it only where no score is masked."""
    c0, c1, c2, c3 = (f"0f{struct.unpack('>I', struct.pack('>f', c))[0]:08X}" for c in _EXP2_POLY)
    return cutlass.Float32(llvm.inline_asm(
        T.f32(), [cutlass.Float32(x).ir_value(loc=loc, ip=ip)],
        "{\n\t.reg .f32 a, t, r, f, p;\n\t.reg .b32 ti, pi;\n\t"
        "max.f32 a, $1, 0fC2FC0000;\n\t"            # -126
        "add.rn.f32 t, a, 0f4B400000;\n\t"           # + 1.5·2^23: low bits = round(a)
        "sub.rn.f32 r, t, 0f4B400000;\n\t"
        "sub.rn.f32 f, a, r;\n\t"
        f"fma.rn.f32 p, {c3}, f, {c2};\n\t"
        f"fma.rn.f32 p, p, f, {c1};\n\t"
        f"fma.rn.f32 p, p, f, {c0};\n\t"
        "mov.b32 ti, t;\n\tmov.b32 pi, p;\n\t"
        "shl.b32 ti, ti, 23;\n\t"
        "add.s32 pi, pi, ti;\n\t"
        "mov.b32 $0, pi;\n\t}",
        "=f,f", has_side_effects=False, is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip))


@cute.jit
def quad_allreduce(x, op):
    """Reduce over the 4 threads of a quad (they hold one accumulator row between them)."""
    x = op(x, cute.arch.shuffle_sync_bfly(x, offset=2, mask=-1, mask_and_clamp=31))
    return op(x, cute.arch.shuffle_sync_bfly(x, offset=1, mask=-1, mask_and_clamp=31))


def add(a, b):
    return a + b


__all__ = ["CONSUMER_REGS", "PRODUCER_REGS", "acc_as_a_operand", "acc_mn_view", "add",
           "exp2_poly", "quad_allreduce", "schedule_fence"]
