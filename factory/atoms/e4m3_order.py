"""The register orders of e4m3 operands read by ``ldmatrix`` from raw fp8 tiles and converted to
f16 in registers (atoms/sm90_e4m3.py), in plain Python: the kernels take them from here and tests
replay them (no DSL needed).

* K (B operand of S = Q·Kᵀ, ``ldmatrix`` not transposed): lane l's word holds key l//4, head_dim
  bytes 4t..4t+3 (t = l%4); its low half becomes registers k = 2t, 2t+1 and its high half
  k = 2t+8, 2t+9, so MMA k index k reads head_dim column ``k_order(k)`` of its 16-column group.
* Q (A operand) is stored in that k order: ``q_pair_slot``.
* V (B operand of O += P·V, ``ldmatrix.trans``): lane l's words of the key halves (keys 0-7, 8-15)
  of a 16-byte chunk c hold bytes 2g, 2g+1 (g = l//4) of keys 2t, 2t+1; the byte permutes
  ``V_JOIN`` give keys (2t, 2t+1, 2t+8, 2t+9) of column 2g and of 2g+1, the B fragments of n8
  blocks 2c and 2c+1: O's accumulator column n holds head_dim column ``v_column(n)``.
"""

from __future__ import annotations


def k_order(col: int) -> int:
    """The head_dim column (within its 16-column group) that MMA k index ``col`` reads when B comes
    from ``ldsm_x4`` words converted by ``e4m3x4_to_f16x2x2``: k = 8h + 2t + j -> 4t + 2h + j."""
    h, r = divmod(col, 8)
    t, j = divmod(r, 2)
    return 4 * t + 2 * h + j


def q_pair_slot(c, m):
    """Where the A operand (Q, one row) keeps head_dim pair m (columns 8c + 2m, 8c + 2m + 1) of its
    8-column chunk c: the pair index (k // 2) of MMA k order, k = 16(c//2) + 8(m%2) + 4(c%2) + 2(m//2)
    (k_order inverted).  Plain arithmetic: ints or DSL integers."""
    return 8 * (c // 2) + 2 * (c % 2) + 4 * (m % 2) + m // 2


def v_column(n):
    """The head_dim column that accumulator column ``n`` of P·V holds when V's B fragments come from
    ``ldmatrix.trans`` words joined by the selectors (0x6420, 0x7531): n8 block j = 2c + e holds
    columns 16c + 2g + e (g = n % 8).  Plain arithmetic: ints or DSL integers."""
    return (n // 16) * 16 + 2 * (n % 8) + (n // 8) % 2


V_JOIN = (0x6420, 0x7531)  # the byte selectors of V's even and odd head_dim columns

__all__ = ["V_JOIN", "k_order", "q_pair_slot", "v_column"]
