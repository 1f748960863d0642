"""Tensor views of the attention calling convention (contract.py) that the TMA families (sm90,
sm100) build on, written once:

* :func:`dense_views` / :func:`packed_views` — the contract's (B, S, H, D) / (T, H, D) tensors
  permuted so that every head's rows are a row-major (rows, D) matrix, the TMA's box order: q, k,
  o as (S, D, H, B) / (T, D, H), v as (D, S, H, B) / (D, T, H) (the B operand of P·V, N = D
  contiguous);
* :func:`sequence_views` — one (q head, batch) problem of those views: the sequence lengths, its
  (rows, D) views of q/k/o, (D, rows) of v and its LSE row; varlen offsets the packed views to
  the sequence's first token (keyrange.varlen_bounds), GQA reads kv head h // (Hq / Hkv);
* :func:`cache_views` — the same over a KV cache (contract.signature_kvcache): the cache
  (P, PS, Hkv, D) through :func:`dense_views` is (PS, D, Hkv, P) (v: (D, PS, Hkv, P)); a problem
  gets its kv head's (PS, D, P) / (D, PS, P) views (its pages are found through the block table
  by the family's loader) and its key count from cache_seqlens;
* :class:`TmaViewsKernel` — the contract's two entry points (``dense``, ``packed``) of a kernel
  object that launches on these views: they permute and call the family's ``_launch(mQ, mK, mVt,
  mO, lse, cu_seqlens_q, cu_seqlens_k, softmax_scale, grid, stream)`` with a grid of (blocks of
  ``cta_rows`` query rows, q heads, batch) (``dense_grid`` may reshape the dense one).
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute

from . import keyrange
from .base import AttentionKernel


def _permute(t: cute.Tensor, modes) -> cute.Tensor:
    return cute.make_tensor(t.iterator, cute.select(t.layout, mode=modes))


def dense_views(q: cute.Tensor, k: cute.Tensor, v: cute.Tensor, o: cute.Tensor):
    """(B, S, H, D) -> (S, D, H, B) for q, k, o; v -> (D, S, H, B)."""
    return (_permute(q, [1, 3, 2, 0]), _permute(k, [1, 3, 2, 0]), _permute(v, [3, 1, 2, 0]),
            _permute(o, [1, 3, 2, 0]))


def packed_views(q: cute.Tensor, k: cute.Tensor, v: cute.Tensor, o: cute.Tensor):
    """(T, H, D) -> (T, D, H) for q, k, o; v -> (D, T, H)."""
    return _permute(q, [0, 2, 1]), _permute(k, [0, 2, 1]), _permute(v, [2, 0, 1]), _permute(o, [0, 2, 1])


def sequence_views(mQ, mK, mVt, mO, mLSE, mCuQ, mCuK, head, batch):
    """(q_len, k_len, seqQ, seqK, seqVt, seqO, seqL) of q head ``head`` of batch (varlen:
    sequence) ``batch`` over :func:`dense_views` / :func:`packed_views` (``mCuQ`` None: dense)."""
    kv_head = head // (mQ.shape[2] // mK.shape[2])
    if cutlass.const_expr(mCuQ is None):
        q_len = mQ.shape[0]
        k_len = mK.shape[0]
        seqQ = mQ[None, None, head, batch]
        seqK = mK[None, None, kv_head, batch]
        seqVt = mVt[None, None, kv_head, batch]
        seqO = mO[None, None, head, batch]
        seqL = mLSE[batch, head, None]
    else:
        q_start, q_len, k_start, k_len = keyrange.varlen_bounds(mCuQ, mCuK, batch)
        seqQ = cute.domain_offset((q_start, 0), mQ[None, None, head])
        seqK = cute.domain_offset((k_start, 0), mK[None, None, kv_head])
        seqVt = cute.domain_offset((0, k_start), mVt[None, None, kv_head])
        seqO = cute.domain_offset((q_start, 0), mO[None, None, head])
        seqL = cute.domain_offset((q_start,), mLSE[head, None])
    return q_len, k_len, seqQ, seqK, seqVt, seqO, seqL


def cache_views(mQ, mK, mVt, mO, mLSE, mCuQ, mSeqlens, head, batch):
    """(q_len, k_len, seqQ, seqK, seqVt, seqO, seqL) of q head ``head`` of sequence ``batch`` over
    a KV cache: q/o/LSE as in :func:`sequence_views` (``mCuQ`` None: dense q), k_len =
    cache_seqlens[batch], seqK (PS, D, pages) and seqVt (D, PS, pages) of the kv head."""
    kv_head = head // (mQ.shape[2] // mK.shape[2])
    k_len = mSeqlens[batch]
    seqK = mK[None, None, kv_head, None]
    seqVt = mVt[None, None, kv_head, None]
    if cutlass.const_expr(mCuQ is None):
        q_len = mQ.shape[0]
        seqQ = mQ[None, None, head, batch]
        seqO = mO[None, None, head, batch]
        seqL = mLSE[batch, head, None]
    else:
        q_start = mCuQ[batch]
        q_len = mCuQ[batch + 1] - q_start
        seqQ = cute.domain_offset((q_start, 0), mQ[None, None, head])
        seqO = cute.domain_offset((q_start, 0), mO[None, None, head])
        seqL = cute.domain_offset((q_start,), mLSE[head, None])
    return q_len, k_len, seqQ, seqK, seqVt, seqO, seqL


class TmaViewsKernel(AttentionKernel):
    """Entry points of the TMA families' kernel objects (they set ``cta_rows`` and ``_launch``)."""

    cta_rows: int

    def dense_grid(self, grid):
        """The dense launch grid from (row blocks, q heads, batch); a persistent family reshapes."""
        return grid

    @cute.jit
    def dense(self, q: cute.Tensor, k: cute.Tensor, v: cute.Tensor, o: cute.Tensor,
              lse: cute.Tensor, softmax_scale: cutlass.Float32, stream: cuda.CUstream):
        mQ, mK, mVt, mO = dense_views(q, k, v, o)  # (S, D, H, B); V (D, S, H, B)
        grid = self.dense_grid((cute.ceil_div(q.shape[1], self.cta_rows), q.shape[2], q.shape[0]))
        self._launch(mQ, mK, mVt, mO, lse, None, None, softmax_scale, grid, stream)

    @cute.jit
    def packed(self, q: cute.Tensor, k: cute.Tensor, v: cute.Tensor, o: cute.Tensor,
               lse: cute.Tensor, cu_seqlens_q: cute.Tensor, cu_seqlens_k: cute.Tensor,
               softmax_scale: cutlass.Float32, max_seqlen_q: cutlass.Int32, stream: cuda.CUstream):
        # (T, D, H); V (D, T, H).  A CTA offsets these by its sequence's start.
        mQ, mK, mVt, mO = packed_views(q, k, v, o)
        grid = (cute.ceil_div(max_seqlen_q, self.cta_rows), q.shape[1], cu_seqlens_q.shape[0] - 1)
        self._launch(mQ, mK, mVt, mO, lse, cu_seqlens_q, cu_seqlens_k, softmax_scale, grid, stream)


__all__ = ["TmaViewsKernel", "cache_views", "dense_views", "packed_views", "sequence_views"]
