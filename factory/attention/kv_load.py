"""K/V tile loads of the mma.sync families (sm80, decode): one key tile of K and of V by cp.async
into a slot of the shared-memory ring, whose mode 2 is (K of slot 0, V of slot 0, K of slot 1,
...).  Rows past the sequence are zeroed instead of loaded: a stale or garbage V row times P = 0
would still make NaN."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute


@cute.jit
def load_kv(g2s, tKgK, tVgV, tKVsKV, tKVcKV, n_block, slot, k_len, tile_n: cutlass.Constexpr):
    """cp.async K and V tile ``n_block`` (``tile_n`` keys) into ``slot``; rows past k_len zeroed.
    ``tKgK``/``tVgV``: the g2s partitions of the key-tiled K and V, ``tKVsKV``: of the ring,
    ``tKVcKV``: of a (tile_n, D) identity tensor (row coordinates)."""
    row0 = n_block * tile_n
    for r in cutlass.range_constexpr(cute.size(tKVsKV.shape[1])):
        if row0 + tKVcKV[0, r, 0][0] < k_len:
            cute.copy(g2s, tKgK[None, r, None, n_block], tKVsKV[None, r, None, 2 * slot])
            cute.copy(g2s, tVgV[None, r, None, n_block], tKVsKV[None, r, None, 2 * slot + 1])
        else:
            tKVsKV[None, r, None, 2 * slot].fill(0)
            tKVsKV[None, r, None, 2 * slot + 1].fill(0)


__all__ = ["load_kv"]
