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
  the A operand's: atoms/sm80.py ``acc_as_a_layout``) and V by ldmatrix.trans;
* :func:`mainloop` — all of it: the ring prologue, Q into registers, then per key tile S, the
  mask where the tile needs it (mask.py), the online softmax (softmax.py) and P·V; returns the
  rows' running max and sum for the family's epilogue (over a KV cache also the softcap, the
  window's lower tiles and fp8 rings, :func:`convert_slot`).

``kv`` is (tKgK, tVgV, tKVsKV, tKVcKV): the g2s partitions of the key-tiled K and V, of the ring,
and of a (tile_n, D) identity tensor (row coordinates) (:func:`kv_partitions`); :func:`operands`
gives a thread's MMA operands.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import warp

from ..atoms.sm80 import acc_as_a_layout, acc_mn_view
from . import mask, softmax


def kv_partitions(g2s, tid, seqK, seqV, sKV, tile_n: int, head_dim: int):
    """``kv``: thread ``tid``'s cp.async partitions of the key-tiled K and V of one sequence
    ((keys, D) views), of the ring ``sKV`` and of a (tile_n, D) identity tensor."""
    thr_g2s = g2s.get_slice(tid)
    gK = cute.local_tile(seqK, (tile_n, head_dim), (None, 0))
    gV = cute.local_tile(seqV, (tile_n, head_dim), (None, 0))
    return (thr_g2s.partition_S(gK), thr_g2s.partition_S(gV), thr_g2s.partition_D(sKV),
            thr_g2s.partition_S(cute.make_identity_tensor((tile_n, head_dim))))


def operands(tiled_mma, tid, dtype, sQ, sK, sVt, o_tile):
    """Thread ``tid``'s MMA slice and operands: ``q_regs`` (s2r_Q, sQ, tSrQ), ``frags`` (tSrK,
    tSsK, tSrK_v, s2r_K, tOsV, tOrV, tOrV_v, s2r_V: K by ldmatrix, V by ldmatrix.trans from the
    (D, keys, slots) view ``sVt``) and the zeroed O accumulator of ``o_tile`` (rows, D)."""
    thr_mma = tiled_mma.get_slice(tid)
    tSrQ = thr_mma.make_fragment_A(thr_mma.partition_A(sQ))
    tSrK = thr_mma.make_fragment_B(thr_mma.partition_B(sK[None, None, 0]))
    tOrV = thr_mma.make_fragment_B(thr_mma.partition_B(sVt[None, None, 1]))
    acc_O = cute.make_rmem_tensor(thr_mma.partition_shape_C(o_tile), cutlass.Float32)
    acc_O.fill(0.0)
    ldsm = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4), dtype)
    ldsm_t = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=True, num_matrices=4), dtype)
    s2r_Q = cute.make_tiled_copy_A(ldsm, tiled_mma).get_slice(tid)
    s2r_K = cute.make_tiled_copy_B(ldsm, tiled_mma)
    s2r_V = cute.make_tiled_copy_B(ldsm_t, tiled_mma)
    thr_s2r_K = s2r_K.get_slice(tid)
    thr_s2r_V = s2r_V.get_slice(tid)
    tSsK = thr_s2r_K.partition_S(sK)      # (CPY, keys/16, D/16, 2S)
    tSrK_v = thr_s2r_K.retile(tSrK)
    tOsV = thr_s2r_V.partition_S(sVt)     # (CPY, D/16, keys/16, 2S)
    tOrV_v = thr_s2r_V.retile(tOrV)
    return thr_mma, (s2r_Q, sQ, tSrQ), (tSrK, tSsK, tSrK_v, s2r_K, tOsV, tOrV, tOrV_v, s2r_V), acc_O


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


@cute.jit
def convert_slot(thr_copy, ring8, ring, slot, dtype: cutlass.Constexpr):
    """fp8 K and V of ``ring8``'s slot -> ``dtype`` into ``ring``'s slot 0 (exact: every e4m3 value
    is a bf16 and an f16 value); ``thr_copy``: the thread's slice of the fp8 ring's copy."""
    for i in cutlass.range_constexpr(2):
        src = thr_copy.partition_S(ring8[None, None, 2 * slot + i])
        dst = thr_copy.partition_D(ring[None, None, i])
        r8 = cute.make_fragment_like(src)
        cute.autovec_copy(src, r8)
        dst.store(r8.load().to(dtype))


@cute.jit
def _mask_tile(spec: cutlass.Constexpr, acc_S, thr_mma, s_tile: cutlass.Constexpr, tile_n: cutlass.Constexpr,
               n_block, row0, q_len, k_len, group, key_slice, win):
    cS = thr_mma.partition_C(cute.make_identity_tensor(s_tile))  # (row, col)
    n0 = n_block * tile_n
    if cutlass.const_expr(key_slice is not None):
        n0 = n_block * tile_n + key_slice[0] * key_slice[1]
    mask.apply_mask(spec, acc_mn_view(acc_S), acc_mn_view(cS), row0, n0, q_len, k_len, group=group, win=win)


@cute.jit
def mainloop(spec: cutlass.Constexpr, dtype: cutlass.Constexpr, tile_n: cutlass.Constexpr,
             stages: cutlass.Constexpr, s_tile: cutlass.Constexpr, g2s, kv, n_lo, n_hi, n_mask, q_len,
             k_len, tiled_mma, thr_mma, q_regs, frags, acc_O, scale_log2, row0, group=None,
             key_slice=None, ilp: cutlass.Constexpr = False, cache=None, win=(None, None),
             mask_lo=None, softcap=None, fp8_ring=None):
    """Key tiles [n_lo, n_hi) (``tile_n`` keys, a ring of ``stages`` slots) walked from the top
    against the Q tile; tiles >= n_mask masked.  Call after Q's cp.async group is committed.
    ``s_tile``: (rows, keys) of S this thread's MMA covers; ``q_regs``: (s2r_Q, sQ, tSrQ);
    ``frags``: (tSrK, tSsK, tSrK_v, s2r_K, tOsV, tOrV, tOrV_v, s2r_V); fragment row r is query
    ``row0 + r`` (``// group`` if given); ``key_slice`` (index, keys): this warp's keys start
    ``index·keys`` into each tile; ``ilp``: S in two accumulator chains.  A KV cache: ``cache``
    (:func:`load_kv_rows`), the window ``win`` (mask.window) with tiles < ``mask_lo`` masked too,
    ``softcap`` (factor, on) (softmax.softcap_scores), ``fp8_ring`` (thr_copy, ring8, ring): the
    ring holds fp8 tiles, each converted into the dtype ring's slot 0 before the MMAs
    (:func:`convert_slot`).  Returns (row_max, row_sum)."""
    s2r_Q, sQ, tSrQ = q_regs
    tSrK, tSsK, tSrK_v, s2r_K, tOsV, tOrV, tOrV_v, s2r_V = frags
    ring_prologue(g2s, kv, n_lo, n_hi, k_len, tile_n, stages, cache)
    cute.copy(s2r_Q, s2r_Q.partition_S(sQ), s2r_Q.retile(tSrQ))
    row_max, row_sum = softmax.row_state(acc_O.shape[0][1] * acc_O.shape[1])

    for it in cutlass.range(n_hi - n_lo, unroll=1):
        n_block, slot = ring_step(it, g2s, kv, n_lo, n_hi, k_len, tile_n, stages, cache)
        if cutlass.const_expr(fp8_ring is not None):
            # (the slot's previous readers passed ring_step's barrier; this one publishes it)
            convert_slot(fp8_ring[0], fp8_ring[1], fp8_ring[2], slot, dtype)
            cute.arch.barrier()
            slot = 0

        acc_S = cute.make_rmem_tensor(thr_mma.partition_shape_C(s_tile), cutlass.Float32)
        acc_S.fill(0.0)
        acc_S1 = None
        if cutlass.const_expr(ilp):
            acc_S1 = cute.make_rmem_tensor(thr_mma.partition_shape_C(s_tile), cutlass.Float32)
            acc_S1.fill(0.0)
        gemm_qk(tiled_mma, acc_S, tSrQ, tSrK, tSsK, tSrK_v, s2r_K, slot, acc_S1)

        if cutlass.const_expr(softcap is not None):
            softmax.softcap_scores(acc_S, softcap[0], softcap[1])
        if cutlass.const_expr(mask_lo is None):
            if n_block >= n_mask:
                _mask_tile(spec, acc_S, thr_mma, s_tile, tile_n, n_block, row0, q_len, k_len, group,
                           key_slice, win)
        else:
            if n_block >= n_mask or n_block < mask_lo:
                _mask_tile(spec, acc_S, thr_mma, s_tile, tile_n, n_block, row0, q_len, k_len, group,
                           key_slice, win)
        softmax.online_softmax(acc_mn_view(acc_S), row_max, row_sum, scale_log2, o_mn=acc_mn_view(acc_O))

        gemm_pv(tiled_mma, acc_O, acc_S, dtype, tOsV, tOrV, tOrV_v, s2r_V, slot)
    return row_max, row_sum


__all__ = ["convert_slot", "gemm_pv", "gemm_qk", "kv_partitions", "load_kv", "load_kv_rows", "mainloop", "operands",
           "ring_prologue", "ring_step"]
