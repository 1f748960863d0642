"""The register and shared-memory orders of the fp8 attention forward (attention/sm90_fp8.py), in
plain Python: the kernel takes its constants from here, and tests replay them (no DSL needed).

Byte permute selectors are ``prmt.b32`` selectors: nibble k names the source byte of result byte
k, 0-3 from the first operand, 4-7 from the second.

* Accumulator word ``W_j`` of quad thread t (after the e4m3 conversion of S's 8-key block j): keys
  8j + 2t, 8j + 2t + 1 of row r, then the same keys of row r + 8.
* fp8 A-fragment word (row half h, 16-key half kh) of a 32-key block: four keys of row r + 8h.
"""

from __future__ import annotations

# Thread-local P (V transposed in the kernel): A words of row halves 0 and 1 from W_{2i}, W_{2i+1}.
P_LOCAL = (0x5410, 0x7632)


def p_local_source(e: int) -> int:
    """The accumulator element (register order) whose e4m3 value byte ``e`` of the thread-local P
    A fragment holds: word m = e // 4 (16-key group m // 2, row half m % 2), byte c = e % 4 ->
    element c % 2 of the row half's pair in the group's 8-key block c // 2 (the bytes ``P_LOCAL``
    picks from the converted words; converting the elements in this order fills the A words with
    no byte permute)."""
    m, c = divmod(e, 4)
    i, h = divmod(m, 2)
    return 4 * (2 * i + c // 2) + 2 * h + c % 2


# Quad exchange (V pre-transposed, keys in natural order): per row half, for quad threads 0-1 and
# 2-3 (whose first source arrives by the second shuffle).
P_EXCHANGE = {False: (0x5410, 0x7632), True: (0x1054, 0x3276)}  # key: t >= 2
# In-kernel V transpose (ldmatrix.trans / stmatrix): the words of keys 0-7 and 8-15 of one 16-byte
# head_dim chunk -> the words of head_dim columns 2p (first selector) and 2p + 1 (second), each
# holding keys [2q, 2q+1, 8+2q, 9+2q] (lane l = 4p + q).
LDSM_JOIN = (0x6420, 0x7531)
# The key stored at column 4t + c of a 16-key group of the transposed V slot is 2t + KEY_OFFSETS[c]:
# exactly the keys thread t's own P registers hold there after ``P_LOCAL``.
KEY_OFFSETS = (0, 1, 8, 9)


def exchange_sources(t: int) -> tuple[int, int]:
    """Quad lanes quad thread t reads by the first and the second shuffle (each source sends
    W_{s%2} first and W_{1-s%2} second)."""
    first = (t % 2) * 2 + t // 2
    return first, first ^ 1


def transposed_key(col: int) -> int:
    """The key (within its 16-key group) at column ``col`` (0-15) of a transposed V slot."""
    t, c = divmod(col, 4)
    return 2 * t + KEY_OFFSETS[c]


# One transpose unit: 16 keys x 32 head_dim bytes of a staging slot, one ldmatrix.x4.trans (four
# 8x8 b16 matrices: keys 0-7 / 8-15 of head_dim bytes 0-15, then of bytes 16-31) and one
# stmatrix.x4 (four matrices of 8 head_dim rows x the group's 16 key bytes).
def ldsm_row(lane: int) -> tuple[int, int]:
    """(key within the 16-key group, head_dim byte within the 32-byte block) of the staging row
    whose address this lane gives the ldmatrix (matrix lane // 8, row lane % 8)."""
    i, j = divmod(lane, 8)
    return 8 * (i % 2) + j, 16 * (i // 2)


def stsm_swap(lane: int) -> bool:
    """Whether this lane stores its odd head_dim column's word as the even matrix's: lanes 16-31
    (p = lane // 4 >= 4) do, so each stored matrix holds rows of 8 distinct residues mod 8 (the
    128-byte swizzle then puts its 8 rows on 8 distinct 16-byte bank groups)."""
    return lane // 4 >= 4


def stsm_row(lane: int) -> int:
    """The head_dim row (within the 32-row block) of the V slot row whose 16 key bytes of the group
    this lane addresses for the stmatrix (matrix i = lane // 8, row j = lane % 8)."""
    i, j = divmod(lane, 8)
    return 16 * (i // 2) + 2 * j + ((i % 2) ^ int(j >= 4))


__all__ = ["KEY_OFFSETS", "LDSM_JOIN", "P_EXCHANGE", "P_LOCAL", "exchange_sources", "ldsm_row", "p_local_source",
           "stsm_row",
           "stsm_swap", "transposed_key"]
