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
# Quad exchange (V pre-transposed, keys in natural order): per row half, for quad threads 0-1 and
# 2-3 (whose first source arrives by the second shuffle).
P_EXCHANGE = {False: (0x5410, 0x7632), True: (0x1054, 0x3276)}  # key: t >= 2
# 4x4-byte transpose: interleave two rows' bytes (0,1 | 2,3), then join the pairs into columns.
TRANSPOSE_PAIR = (0x5140, 0x7362)
TRANSPOSE_JOIN = (0x5410, 0x7632)
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


def transpose_block(lane: int, trip: int, key_blocks: int) -> tuple[int, int]:
    """(key block nn, column block dd) a transposing lane moves on a trip: dd = lane, nn = (lane +
    trip) mod key_blocks (the order that puts every warp access on 32 banks)."""
    return (lane + trip) % key_blocks, lane


__all__ = ["KEY_OFFSETS", "P_EXCHANGE", "P_LOCAL", "TRANSPOSE_JOIN", "TRANSPOSE_PAIR", "exchange_sources",
           "transpose_block", "transposed_key"]
