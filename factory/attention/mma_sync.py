"""What the two mma.sync attention families (sm80: one row block per warp; decode: warps split the
keys) share: the K/V ring in shared memory filled by cp.async, and the two GEMMs of a key tile on
ldmatrix-fed m16n8k16 MMAs.

The ring has ``stages`` slots; its mode 2 is (K of slot 0, V of slot 0, K of slot 1, ...).  Key
tiles [n_lo, n_hi) are walked from the top, one cp.async commit group per tile, the tile
``stages - 1`` ahead in flight while the current one is consumed:

* :func:`ring_prologue` — the first ``stages - 1`` tiles, then waits for the first (and whatever
  the caller committed before, e.g. Q) and syncs the CTA;
* :func:`ring_step` — step ``it``: waits for its tile, syncs (the slot consumed last step is free),
  issues the tile ``stages - 1`` ahead; returns (key tile, slot);
* :func:`load_kv` — one tile into one slot, rows past the sequence zeroed instead of loaded (a
  stale or garbage V row times P = 0 would still make NaN);
* :func:`load_kv_rows` — the same from a KV cache, row by row (the page loader): key j from page
  block_table[b][j // PS], row j % PS of a paged cache (any page size), or row j of sequence b of
  a dense one; the ring functions take it with ``cache``;
* :func:`gemm_qk` — S = Q·Kᵀ (Q in registers, K by ldmatrix one k16 step ahead); ``acc_S1``: odd
  k-steps into a second accumulator (two independent chains), summed at the end;
* :func:`gemm_pv` — O += P·V with P converted from the S accumulator in registers (its layout is
  the A operand's: atoms/sm80.py ``acc_as_a_layout``) and V by ldmatrix.trans.

``kv`` is (tKgK, tVgV, tKVsKV, tKVcKV): the g2s partitions of the key-tiled K and V, of the ring,
and of a (tile_n, D) identity tensor (row coordinates).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

from ..atoms.sm80 import acc_as_a_layout


@cute.jit
def load_kv(g2s, tKgK, tVgV, tKVsKV, tKVcKV, n_block, slot, k_len, tile_n: cutlass.Constexpr):
    """cp.async K and V tile ``n_block`` (``tile_n`` keys) into ``slot``; rows past k_len zeroed."""
    row0 = n_block * tile_n
    for r in cutlass.range_constexpr(cute.size(tKVsKV.shape[1])):
        if row0 + tKVcKV[0, r, 0][0] < k_len:
            cute.copy(g2s, tKgK[None, r, None, n_block], tKVsKV[None, r, None, 2 * slot])
            cute.copy(g2s, tVgV[None, r, None, n_block], tKVsKV[None, r, None, 2 * slot + 1])
        else:
            tKVsKV[None, r, None, 2 * slot].fill(0)
            tKVsKV[None, r, None, 2 * slot + 1].fill(0)


@cute.jit
def load_kv_rows(g2s, tKgK, tVgV, tKVsKV, tKVcKV, n_block, slot, cache, tile_n: cutlass.Constexpr):
    """cp.async K and V tile ``n_block`` of a KV cache into ``slot``, one key row at a time;
    rows past the sequence zeroed.  ``cache`` = (k_cache, v_cache, block_table, batch, k_len,
    paged): the caches (P, PS, Hkv, D) (dense: (B, Sk, Hkv, D)); ``tKgK``/``tVgV`` are the g2s
    partitions of a (tile_n, D) view of the kv head's row 0 with row stride 0 (this thread's
    column offsets), to which each row adds its page's offset."""
    mK, mV, mTable, batch, k_len, paged = cache
    row0 = n_block * tile_n
    for r in cutlass.range_constexpr(cute.size(tKVsKV.shape[1])):
        j = row0 + tKVcKV[0, r, 0][0]
        if j < k_len:
            page = batch
            row = j
            if cutlass.const_expr(paged):
                page_size = mK.shape[1]
                page = mTable[batch, j // page_size]
                row = j % page_size
            k_row = tKgK[None, r, None]
            v_row = tVgV[None, r, None]
            src_k = cute.make_tensor(
                k_row.iterator + (cutlass.Int64(page) * mK.stride[0] + cutlass.Int64(row) * mK.stride[1]),
                k_row.layout)
            src_v = cute.make_tensor(
                v_row.iterator + (cutlass.Int64(page) * mV.stride[0] + cutlass.Int64(row) * mV.stride[1]),
                v_row.layout)
            cute.copy(g2s, src_k, tKVsKV[None, r, None, 2 * slot])
            cute.copy(g2s, src_v, tKVsKV[None, r, None, 2 * slot + 1])
        else:
            tKVsKV[None, r, None, 2 * slot].fill(0)
            tKVsKV[None, r, None, 2 * slot + 1].fill(0)


@cute.jit
def ring_prologue(g2s, kv, n_lo, n_hi, k_len, tile_n: cutlass.Constexpr, stages: cutlass.Constexpr,
                  cache=None):
    """Tiles n_hi-1 .. n_hi-stages+1 (those >= n_lo) into slots 0.., one commit group each; then
    the oldest group has landed and the CTA is in sync.  ``cache``: from a KV cache
    (:func:`load_kv_rows`)."""
    tKgK, tVgV, tKVsKV, tKVcKV = kv
    for s in cutlass.range_constexpr(stages - 1):
        if n_hi - 1 - s >= n_lo:
            if cutlass.const_expr(cache is not None):
                load_kv_rows(g2s, tKgK, tVgV, tKVsKV, tKVcKV, n_hi - 1 - s, s, cache, tile_n)
            else:
                load_kv(g2s, tKgK, tVgV, tKVsKV, tKVcKV, n_hi - 1 - s, s, k_len, tile_n)
        cute.arch.cp_async_commit_group()
    cute.arch.cp_async_wait_group(stages - 1)
    cute.arch.barrier()


@cute.jit
def ring_step(it, g2s, kv, n_lo, n_hi, k_len, tile_n: cutlass.Constexpr, stages: cutlass.Constexpr,
              cache=None):
    """Step ``it`` of the walk: its key tile (n_hi - 1 - it) is visible in its slot once this
    returns (key tile, slot); the tile ``stages - 1`` further down is issued into the slot that
    step it - 1 consumed.  ``cache``: from a KV cache (:func:`load_kv_rows`)."""
    tKgK, tVgV, tKVsKV, tKVcKV = kv
    S = stages
    n_block = n_hi - 1 - it
    slot = it % S
    cute.arch.cp_async_wait_group(S - 2)
    cute.arch.barrier()  # tile n_block visible; slot (it-1)%S free for reuse
    if n_block - (S - 1) >= n_lo:
        if cutlass.const_expr(cache is not None):
            load_kv_rows(g2s, tKgK, tVgV, tKVsKV, tKVcKV, n_block - (S - 1), (it + S - 1) % S, cache, tile_n)
        else:
            load_kv(g2s, tKgK, tVgV, tKVsKV, tKVcKV, n_block - (S - 1), (it + S - 1) % S, k_len, tile_n)
    cute.arch.cp_async_commit_group()
    return n_block, slot


@cute.jit
def gemm_qk(tiled_mma, acc_S, tSrQ, tSrK, tSsK, tSrK_v, s2r_K, slot, acc_S1=None):
    """acc_S (zeroed by the caller) += Q·Kᵀ of the tile in ``slot``; with ``acc_S1`` (zeroed) the
    odd k16 steps accumulate there and the sum lands in acc_S."""
    nk = cute.size(tSsK.shape[2])
    cute.copy(s2r_K, tSsK[None, None, 0, 2 * slot], tSrK_v[None, None, 0])
    for kk in cutlass.range_constexpr(nk):
        if cutlass.const_expr(kk + 1 < nk):
            cute.copy(s2r_K, tSsK[None, None, kk + 1, 2 * slot], tSrK_v[None, None, kk + 1])
        if cutlass.const_expr(acc_S1 is not None and kk % 2 == 1):
            cute.gemm(tiled_mma, acc_S1, tSrQ[None, None, kk], tSrK[None, None, kk], acc_S1)
        else:
            cute.gemm(tiled_mma, acc_S, tSrQ[None, None, kk], tSrK[None, None, kk], acc_S)
    if cutlass.const_expr(acc_S1 is not None):
        acc_S.store(acc_S.load() + acc_S1.load())


@cute.jit
def gemm_pv(tiled_mma, acc_O, acc_S, dtype: cutlass.Constexpr, tOsV, tOrV, tOrV_v, s2r_V, slot):
    """acc_O += P·V: P = acc_S (fp32 C fragments) -> ``dtype`` A fragments (two n8 C tiles make
    one k16 A tile), V of the tile in ``slot``."""
    rP = cute.make_fragment_like(acc_S, dtype)
    rP.store(acc_S.load().to(dtype))
    tOrP = cute.make_tensor(rP.iterator, acc_as_a_layout(rP.layout))
    nv = cute.size(tOsV.shape[2])
    cute.copy(s2r_V, tOsV[None, None, 0, 2 * slot + 1], tOrV_v[None, None, 0])
    for kk in cutlass.range_constexpr(nv):
        if cutlass.const_expr(kk + 1 < nv):
            cute.copy(s2r_V, tOsV[None, None, kk + 1, 2 * slot + 1], tOrV_v[None, None, kk + 1])
        cute.gemm(tiled_mma, acc_O, tOrP[None, None, kk], tOrV[None, None, kk], acc_O)


__all__ = ["gemm_pv", "gemm_qk", "load_kv", "load_kv_rows", "ring_prologue", "ring_step"]
