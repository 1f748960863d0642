"""The parts of the Blackwell attention kernel (attention/sm100_fa4.py) that do not depend on the
MMA, written once in plain Python so that the kernel traces them and the CPU tests run them:

* the exp2 emulation: Cody-Waite range reduction (x = j + f, j = floor(x), f in [0, 1)), a minimax
  polynomial p(f) ~ 2^f with p(0) = 1 exactly, and 2^j put in by adding j to the exponent field;
  its float32 coefficients, its clamp, and which elements of a row the kernel emulates;
* the rescale threshold of the online softmax (O is rescaled only when a row's max grows by more
  than 2^8: otherwise P stays <= 2^8 with the old max, and the correction warps skip the rescale).

The key tiles, masks, walk order and varlen offsets the kernel shares with the other families are
keyrange.py's.  Nothing here imports the DSL; numpy is imported only by :func:`ex2_emulated`.
"""

from __future__ import annotations

# --- exp2 emulation --------------------------------------------------------------------------------
# p(f) = 1 + c1 f + ... + cn f^n ~ 2^f on [0, 1], minimax in relative error with p(0) = 1 fixed
# (Remez exchange, computed for this project; the values are exactly representable in float32).
# Max relative error of p itself on [0, 1] (exact arithmetic, these float32 coefficients; the
# unrounded minimax levels are 8.559e-5 and 8.23e-8, degree 4 would give 2.90e-6).
# p(0) = 1 exactly makes the clamp below return exactly 0 for x <= -127 (masked scores, -inf):
# bits(1.0) - (127 << 23) = 0.
EX2_POLY = {
    3: (1.0, 0.6951167583465576, 0.22764499485492706, 0.07706703990697861),
    5: (1.0, 0.6931512951850891, 0.24016444385051727, 0.05579991266131401,
        0.009017030708491802, 0.0018671300495043397),
}
EX2_POLY_REL_ERR = {3: 8.561e-5, 5: 9.378e-8}
# floor(x) = (x + 1.5 * 2^23 rounded toward -inf) - 1.5 * 2^23, exact for |x| < 2^22; the low
# mantissa bits of the rounded sum hold floor(x) in two's complement, so shifting the sum's bits
# left by 23 gives floor(x) << 23 (the magic number's own bits shift out).
EX2_ROUND_MAGIC = 12582912.0
EX2_CLAMP = -127.0
# The polynomial degree per P dtype: bf16 keeps 8 significant bits (half an ulp: 2e-3 >> 8.6e-5),
# fp16 keeps 11 (half an ulp 2.4e-4), for which degree 3 is too close: degree 5.
EX2_DEGREE = {"bf16": 3, "f16": 5}
# Of every EX2_EMU_GROUP consecutive scores of a row, the last EX2_EMU_COUNT go through the
# polynomial (FMA pipe) and the rest through MUFU.EX2: 1/4 of them.  MUFU.EX2 issues at 16 per
# SM per clock, FFMA at 128: with ~4 FMA-pipe instructions per score besides exp2 and ~9 for an
# emulated exp2 (3 packed), a quarter balances the two pipes (FA4's choice is close: 1/5 to 1/4).
EX2_EMU_GROUP = 8
EX2_EMU_COUNT = 2


def ex2_emulated_index(i: int) -> bool:
    """Whether element ``i`` (column order) of a row's scores takes the polynomial."""
    return i % EX2_EMU_GROUP >= EX2_EMU_GROUP - EX2_EMU_COUNT


def ex2_emulated(x, degree: int):
    """numpy float32 model of the kernel's emulated exp2, operation by operation (FMAs modelled as
    float64 products rounded once to float32: exact products, one rounding of the sum, barring the
    rare double rounding)."""
    import numpy as np

    f32 = np.float32
    x = np.asarray(x, dtype=f32)
    xc = np.maximum(x, f32(EX2_CLAMP))
    # add.rm: x + magic rounded toward -inf.  Both are float32; the exact sum is representable in
    # float64, and for |x| < 2^22 rounding it down to the float32 grid (ulp 1 there) is floor.
    rounded = (np.floor(xc.astype(np.float64)) + EX2_ROUND_MAGIC).astype(f32)
    back = (rounded - f32(EX2_ROUND_MAGIC)).astype(f32)
    frac = (xc - back).astype(f32)
    c = [f32(v) for v in EX2_POLY[degree]]
    p = np.full_like(frac, c[-1])
    for ck in reversed(c[:-1]):
        p = (p.astype(np.float64) * frac.astype(np.float64) + np.float64(ck)).astype(f32)
    bits = p.view(np.uint32).astype(np.uint64) + (rounded.view(np.uint32).astype(np.uint64) << 23)
    return (bits & 0xFFFFFFFF).astype(np.uint32).view(f32)


# --- the online softmax ------------------------------------------------------------------------------
# log2 units: the running max grows past this before O is rescaled (FA4's conditional rescale).
RESCALE_THRESHOLD = 8.0
