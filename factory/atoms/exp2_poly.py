"""exp2 on the FMA pipe (no MUFU) for softmax exponentials, one float32 at a time (any sm_80+
target: scalar FADD/FFMA and integer ops only), and a float32 numpy model of it for tests.

x = j + f with j = floor(x) (Cody-Waite: x + 1.5·2^23 rounded toward -inf leaves j in the low
mantissa bits), 2^f ~ p(f) = 1 + c1·f + ... + cn·f^n on [0, 1) (minimax in relative error with
p(0) = 1 fixed), and 2^j put in by adding j to p's exponent field (an integer add of j << 23 to
p's bits).  x is clamped to >= -127 first: then the result is exactly 0 for x <= -127 (masked
scores, -inf; NaN too), and the exponent field never underflows into the sign bit.  x must be
< 128 (a softmax's x = s·scale - max·scale is <= 0 up to the rounding of max·scale).

Per exponential: one FMNMX, three FADDs, n FFMAs and a shift-add (ptxas: one LEA): 7 instructions
at degree 2, 8 at degree 3, against one MUFU.EX2 (MUFU issues 16 lanes per SM and clock, the FMA
pipe 128: a warp's MUFU.EX2 holds its sub-partition's MUFU for 8 clocks).  Measured on an H100 in
the fp8 attention forward with 1/16 to 3/8 of the mainloop's exponentials taken this way: no
faster (the same cycles per tile at a quarter; notes/attention-fp8.md); the sm90 kernels take it
as an option (AttentionSm90.ex2_fma) that no enumerated variant turns on.

Also here: two exponentials through ``ex2.approx.ftz.bf16x2`` (:func:`ex2_bf16x2`, sm_90+): ptxas
issues it as two MUFU.EX2.BF16 at MUFU.EX2's rate (H100: 16 per SM and clock for either), so it
saves no MUFU time on sm_90; inputs and results are rounded to bf16 (unit roundoff 2^-8).

Accuracy (relative, of p on [0, 1], these float32 coefficients; tests/test_exp2_poly.py checks
the model against float64 2^x): degree 2 2.06e-3, degree 3 8.57e-5.  An e4m3 P keeps 3
mantissa bits (relative rounding up to 6.25 %), bf16 8 (0.39 %), fp16 11 (0.05 %).
"""

from __future__ import annotations

# p(f) coefficients c0 = 1, c1, ..., cn (float32 values; minimax of p(f)/2^f - 1 on [0, 1] with
# c0 = 1 fixed, by linear programming on a 4,001-point grid; degree 3 equals the Blackwell
# kernel's table in attention/sm100_logic.py).
EX2_POLY = {
    2: (1.0, 0.665960967540741, 0.32993242144584656),
    3: (1.0, 0.6951167583465576, 0.22764499485492706, 0.07706703990697861),
}
EX2_POLY_REL_ERR = {2: 2.06e-3, 3: 8.57e-5}
EX2_ROUND_MAGIC = 12582912.0  # 1.5 * 2^23: x + this, rounded toward -inf, holds floor(x) in its low bits
EX2_CLAMP = -127.0


def _f32_hex(v: float) -> str:
    import struct
    return "0f%08X" % struct.unpack("<I", struct.pack("<f", v))[0]


def ex2_poly_ptx(degree: int) -> str:
    """The inline PTX of one emulated exp2: ``$0`` <- 2^``$1`` (float32 registers)."""
    c = EX2_POLY[degree]
    lines = [
        "{",
        ".reg .f32 fx_x, fx_r, fx_b, fx_f, fx_p;",
        ".reg .b32 fx_ri, fx_pi;",
        f"max.f32 fx_x, $1, {_f32_hex(EX2_CLAMP)};",
        f"add.rm.f32 fx_r, fx_x, {_f32_hex(EX2_ROUND_MAGIC)};",
        f"sub.rn.f32 fx_b, fx_r, {_f32_hex(EX2_ROUND_MAGIC)};",
        "sub.rn.f32 fx_f, fx_x, fx_b;",
        f"mov.f32 fx_p, {_f32_hex(c[degree])};",
    ]
    for k in range(degree - 1, -1, -1):
        lines.append(f"fma.rn.f32 fx_p, fx_p, fx_f, {_f32_hex(c[k])};")
    lines += [
        "mov.b32 fx_ri, fx_r;",
        "mov.b32 fx_pi, fx_p;",
        "shl.b32 fx_ri, fx_ri, 23;",
        "add.s32 fx_pi, fx_pi, fx_ri;",
        "mov.b32 $0, fx_pi;",
        "}",
    ]
    return "\n".join(lines)


def ex2_poly_model(x, degree: int):
    """numpy float32 model of :func:`ex2_poly`, operation by operation (each FFMA as a float64
    product-sum rounded once to float32: the products of float32 values are exact in float64)."""
    import numpy as np

    f32 = np.float32
    x = np.asarray(x, dtype=f32)
    xc = np.fmax(x, f32(EX2_CLAMP))  # max.f32: the non-NaN operand
    # add.rm: for |x| < 2^22 the float32 grid near 1.5·2^23 has ulp 1, so rounding down is floor
    rounded = (np.floor(xc.astype(np.float64)) + EX2_ROUND_MAGIC).astype(f32)
    back = (rounded - f32(EX2_ROUND_MAGIC)).astype(f32)
    frac = (xc - back).astype(f32)
    c = [f32(v) for v in EX2_POLY[degree]]
    p = np.full_like(frac, c[-1])
    for ck in reversed(c[:-1]):
        p = (p.astype(np.float64) * frac.astype(np.float64) + np.float64(ck)).astype(f32)
    bits = p.view(np.uint32).astype(np.uint64) + (rounded.view(np.uint32).astype(np.uint64) << 23)
    return (bits & 0xFFFFFFFF).astype(np.uint32).view(f32)


def ex2_poly(x, degree: int = 3):
    """2^x of a Float32 on the FMA pipe (traced by the DSL: one inline PTX block, no side effects,
    so ptxas schedules its instructions among the others)."""
    import cutlass
    from cutlass._mlir.dialects import llvm
    from cutlass.cutlass_dsl import T

    res = llvm.inline_asm(
        T.f32(), [cutlass.Float32(x).ir_value()], ex2_poly_ptx(degree), "=f,f",
        has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
    )
    return cutlass.Float32(res)


def ex2_bf16x2_ptx() -> str:
    """The inline PTX of two exponentials through ``ex2.approx.ftz.bf16x2`` (sm_90+): ``$2``, ``$3``
    (float32) rounded to a bf16 pair, 2^x of both, and each result back as a float32 (``$0`` from
    ``$2``, ``$1`` from ``$3``; exact: bf16 values are float32 values)."""
    return "\n".join([
        "{",
        ".reg .b32 fx_x, fx_e, fx_lo, fx_hi;",
        "cvt.rn.bf16x2.f32 fx_x, $3, $2;",
        "ex2.approx.ftz.bf16x2 fx_e, fx_x;",
        "shl.b32 fx_lo, fx_e, 16;",
        "and.b32 fx_hi, fx_e, -65536;",
        "mov.b32 $0, fx_lo;",
        "mov.b32 $1, fx_hi;",
        "}",
    ])


def ex2_bf16x2_model(x0, x1):
    """numpy model of :func:`ex2_bf16x2`: each input rounded to bf16 (nearest even), 2^x in float64,
    rounded to bf16 (the hardware's approximation is within an ulp of that; tests bound it by the
    round-off), as float32."""
    import numpy as np

    def to_bf16(v):
        b = np.asarray(v, dtype=np.float32).view(np.uint32).astype(np.uint64)
        b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16 << 16
        return (b & 0xFFFFFFFF).astype(np.uint32).view(np.float32)

    return tuple(to_bf16(np.exp2(to_bf16(x).astype(np.float64)).astype(np.float32)) for x in (x0, x1))


def ex2_bf16x2(x0, x1):
    """(2^x0, 2^x1) of two Float32 through one ``ex2.approx.ftz.bf16x2`` (inputs and results
    rounded to bf16; ptxas issues it as two MUFU.EX2.BF16 on sm_90).  One inline PTX block, no side
    effects."""
    import cutlass
    from cutlass._mlir.dialects import llvm
    from cutlass.cutlass_dsl import T

    res = llvm.inline_asm(
        llvm.StructType.get_literal([T.f32(), T.f32()]),
        [cutlass.Float32(x0).ir_value(), cutlass.Float32(x1).ir_value()], ex2_bf16x2_ptx(), "=f,=f,f,f",
        has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
    )
    return tuple(cutlass.Float32(llvm.extractvalue(T.f32(), res, [i])) for i in range(2))


__all__ = ["EX2_CLAMP", "EX2_POLY", "EX2_POLY_REL_ERR", "EX2_ROUND_MAGIC", "ex2_poly", "ex2_poly_model",
           "ex2_poly_ptx", "ex2_bf16x2", "ex2_bf16x2_model", "ex2_bf16x2_ptx"]
