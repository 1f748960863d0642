"""The online softmax of every attention family that keeps S in MMA accumulator registers (sm80,
decode, sm90), its finalisation, the split-KV combine, and the score transform (softcap).

Units: scores stay raw in registers; ``scale_log2`` = softmax_scale·log2(e) is folded into one
FFMA per score, so the running max is in raw-score units and ``max·scale_log2`` in log2 units;
LSE leaves in natural-log units.  A row that has seen no key keeps max = -inf and sum = 0; its O
is 0 and its LSE -inf (with sinks: the sink's).

* :func:`log2_scale` (host side of a launch) — ``scale_log2`` and, with softcap, the factor the
  transform multiplies scores by.
* :func:`softcap_scores` — score -> tanh(score·softmax_scale/softcap) (compile-time switch,
  runtime Float32 softcap; with :func:`log2_scale`'s ``scale_log2`` = softcap·log2(e) the
  softmax then sees softcap·tanh(score·softmax_scale/softcap)).  Apply before the mask.
* :func:`row_state` — the running max and sum, before the first key tile.
* :func:`online_softmax` — one key tile: row max over the quad, P = exp2(S·scale_log2 -
  max·scale_log2) in place, running sum; the rows' O correction either applied to ``o_mn`` at
  once or written to ``corr`` (:func:`rescale` later).  :func:`online_softmax_lazy`: the same
  with a reference max a warp moves only when a row's max passes it by a threshold.
* :func:`finalize` — O /= row sum (0 without a key), LSE to global by one thread of the quad;
  ``sink`` (compile-time presence, runtime fp32 logit of the row's q head in natural units) adds
  exp(sink - max) to the denominator: attention sinks.
* :func:`combine_splits` — split-KV merge of per-split O and LSE, one warp per row (with ``sink``:
  the sink enters here once, not in the splits).

Fragments are seen as (rows, cols) views (atoms/sm80.py ``acc_mn_view`` for mma.sync m16n8,
atoms/sm90.py ``acc_mn_view`` for WGMMA): the four threads of a quad hold one row.
"""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute

from ..atoms.common import add, quad_allreduce

LOG2_E = math.log2(math.e)
LN_2 = math.log(2.0)


def log2_scale(softmax_scale, softcap=None):
    """(scale_log2, softcap factor): ``softmax_scale·log2(e)`` and None; with a softcap
    ``softcap·log2(e)`` and ``softmax_scale / softcap`` (what :func:`softcap_scores` takes)."""
    if softcap is None:
        return softmax_scale * LOG2_E, None
    return softcap * LOG2_E, softmax_scale / softcap


@cute.jit
def softcap_scores(s: cute.Tensor, factor, on=None):
    """``s <- tanh(s·factor)`` in place (``factor`` from :func:`log2_scale`).  ``on``: a runtime
    Boolean; where false the scores stay as they are (a select per score: a kernel built with the
    softcap switch then also serves calls without a softcap)."""
    for i in cutlass.range_constexpr(cute.size(s)):
        if cutlass.const_expr(on is None):
            s[i] = cute.math.tanh(s[i] * factor, fastmath=True)
        else:
            capped = cute.math.tanh(s[i] * factor, fastmath=True)
            s[i] = capped if on else s[i]


@cute.jit
def online_softmax(s_mn: cute.Tensor, row_max: cute.Tensor, row_sum: cute.Tensor, scale_log2,
                   o_mn=None, corr=None):
    """One key tile of the online softmax: ``s_mn`` <- P = exp2(S·scale_log2 - max·scale_log2)
    with the rows' running max and sum updated.  Each row's O correction (exp2 of the old max
    minus the new) multiplies ``o_mn``'s row here, or goes to ``corr`` for :func:`rescale`."""
    for r in cutlass.range_constexpr(cute.size(row_max)):
        s = s_mn[r, None].load()
        m_new = quad_allreduce(s.reduce(cute.ReductionOp.MAX, -cutlass.Float32.inf, 0),
                               cute.arch.fmax)
        m_new = cute.arch.fmax(m_new, row_max[r])
        # A row with nothing visible yet keeps max = -inf; subtract 0 then, not -inf (NaN).
        m_scaled = (0.0 if m_new == -cutlass.Float32.inf else m_new) * scale_log2
        p = cute.math.exp2(s * scale_log2 - m_scaled, fastmath=True)
        c = cute.math.exp2(row_max[r] * scale_log2 - m_scaled, fastmath=True)
        if cutlass.const_expr(corr is not None):
            corr[r] = c
            row_sum[r] = row_sum[r] * corr[r] + p.reduce(cute.ReductionOp.ADD, cutlass.Float32.zero, 0)
        else:
            row_sum[r] = row_sum[r] * c + p.reduce(cute.ReductionOp.ADD, cutlass.Float32.zero, 0)
        if cutlass.const_expr(o_mn is not None):
            o_mn[r, None] = o_mn[r, None].load() * c
        row_max[r] = m_new
        s_mn[r, None] = p


@cute.jit
def online_softmax_lazy(s_mn: cute.Tensor, row_max: cute.Tensor, row_sum: cute.Tensor, scale_log2,
                        corr: cute.Tensor, threshold: cutlass.Constexpr):
    """:func:`online_softmax` with a lazy reference max (``row_max``) per warp: where no row of
    the warp has a max more than ``threshold`` log2 units above its reference, the references
    stay, every ``corr`` is exactly 1 and P = exp2(S·scale - reference) <= 2^threshold; otherwise
    every row of the warp moves its reference to its max (``corr`` = its O factor, its sum
    rescaled), as :func:`online_softmax` does.  Sum and O refer to the same reference, so O / sum
    and the LSE (reference + log2 sum) are those of the true max; a 16-bit P keeps its relative
    precision up to 2^threshold.  :func:`rescale` with ``skip_ones`` then skips O's multiplies."""
    n_rows = cute.size(row_max)
    m_tile = cute.make_rmem_tensor(n_rows, cutlass.Float32)
    grow = cutlass.Boolean(False)
    for r in cutlass.range_constexpr(n_rows):
        s = s_mn[r, None].load()
        m = quad_allreduce(s.reduce(cute.ReductionOp.MAX, -cutlass.Float32.inf, 0), cute.arch.fmax)
        m_tile[r] = cute.arch.fmax(m, row_max[r])
        # (a row with no visible key yet has reference -inf: a finite max always moves it; -inf
        # against -inf is NaN: no move, the row stays empty)
        grow = grow | ((m_tile[r] - row_max[r]) * scale_log2 > threshold)
    for r in cutlass.range_constexpr(n_rows):
        corr[r] = 1.0
    if cute.arch.vote_any_sync(grow):
        for r in cutlass.range_constexpr(n_rows):
            m_scaled = (0.0 if m_tile[r] == -cutlass.Float32.inf else m_tile[r]) * scale_log2
            corr[r] = cute.math.exp2(row_max[r] * scale_log2 - m_scaled, fastmath=True)
            row_sum[r] = row_sum[r] * corr[r]
            row_max[r] = m_tile[r]
    for r in cutlass.range_constexpr(n_rows):
        s = s_mn[r, None].load()
        m_scaled = (0.0 if row_max[r] == -cutlass.Float32.inf else row_max[r]) * scale_log2
        p = cute.math.exp2(s * scale_log2 - m_scaled, fastmath=True)
        row_sum[r] = row_sum[r] + p.reduce(cute.ReductionOp.ADD, cutlass.Float32.zero, 0)
        s_mn[r, None] = p


@cute.jit
def rescale(o_mn: cute.Tensor, corr: cute.Tensor, skip_ones: cutlass.Constexpr = False):
    """O's rows times their correction factors (:func:`online_softmax` ``corr``).  ``skip_ones``:
    a warp whose factors are all exactly 1 skips the multiplies (the same result)."""
    if cutlass.const_expr(skip_ones):
        moved = cutlass.Boolean(False)
        for r in cutlass.range_constexpr(cute.size(corr)):
            moved = moved | (corr[r] != 1.0)
        if cute.arch.vote_any_sync(moved):
            for r in cutlass.range_constexpr(cute.size(corr)):
                o_mn[r, None] = o_mn[r, None].load() * corr[r]
    else:
        for r in cutlass.range_constexpr(cute.size(corr)):
            o_mn[r, None] = o_mn[r, None].load() * corr[r]


@cute.jit
def finalize(o_mn: cute.Tensor, c_mn: cute.Tensor, row_max: cute.Tensor, row_sum: cute.Tensor,
             scale_log2, row0, q_len, lse_row: cute.Tensor, tid, sink=None):
    """O /= row sum (0 for rows with no key); LSE = ln(sum) + max·scale (-inf if none) into
    ``lse_row[row0 + c_mn[r, 0][0]]`` by the quad's first thread, rows < q_len.  ``sink``: the
    denominator gains exp(sink - max) (natural units), O and LSE follow; a row without keys then
    gets O = 0 and LSE = sink."""
    for r in cutlass.range_constexpr(cute.size(row_sum)):
        total = quad_allreduce(row_sum[r], add)
        w = 1.0
        m_ref = 0.0
        if cutlass.const_expr(sink is not None):
            # reference max(row max, sink) in log2 units: neither term can overflow
            m_row = row_max[r] * scale_log2
            m_ref = cute.arch.fmax(m_row, sink * LOG2_E)
            m_ref = 0.0 if m_ref == -cutlass.Float32.inf else m_ref
            w = cute.math.exp2(m_row - m_ref, fastmath=True)
            total = total * w + cute.math.exp2(sink * LOG2_E - m_ref, fastmath=True)
        has_keys = total > 0.0
        inv = cute.arch.rcp_approx(total if has_keys else 1.0)
        if cutlass.const_expr(sink is not None):
            inv = inv * w
        o_mn[r, None] = o_mn[r, None].load() * (inv if has_keys else 0.0)
        lse = -cutlass.Float32.inf
        if has_keys:
            if cutlass.const_expr(sink is None):
                lse = (row_max[r] * scale_log2 + cute.math.log2(total, fastmath=True)) * LN_2
            else:
                lse = (m_ref + cute.math.log2(total, fastmath=True)) * LN_2
        row = row0 + c_mn[r, 0][0]
        if tid % 4 == 0 and row < q_len:
            lse_row[row] = lse


@cute.jit
def combine_splits(mOp: cute.Tensor, mLp: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
                   head_dim: cutlass.Constexpr, splits: cutlass.Constexpr, dtype: cutlass.Constexpr,
                   rows_per_cta: cutlass.Constexpr, sink=None):
    """Split-KV combine, one warp per query row of this CTA (grid: (row blocks, q heads, batch)):
    lse = ln Σ_s exp(lse_s), o = Σ_s exp(lse_s - lse)·o_s in fp32, then o -> ``dtype``.  Splits
    with lse_s = -inf weigh 0 (their partial O is 0, never garbage); a row whose splits are all
    -inf gets o = 0, lse = -inf.  ``sink`` (natural units) joins the sum as one more term without
    an O.  Workspace: mOp (splits, B, Hq, Sq, D), mLp (splits, B, Hq, Sq) fp32."""
    D, SP = head_dim, splits
    tidx, _, _ = cute.arch.thread_idx()
    m_block, head, batch = cute.arch.block_idx()
    lane = tidx % 32
    row = m_block * rows_per_cta + tidx // 32
    if row < mO.shape[1]:
        lse_s = cute.make_rmem_tensor(SP, cutlass.Float32)
        lmax = -cutlass.Float32.inf
        for s in cutlass.range_constexpr(SP):
            lse_s[s] = mLp[s, batch, head, row]
            lmax = cute.arch.fmax(lmax, lse_s[s])
        if cutlass.const_expr(sink is not None):
            lmax = cute.arch.fmax(lmax, sink)
        m_ref = 0.0 if lmax == -cutlass.Float32.inf else lmax
        acc = cute.make_rmem_tensor(D // 32, cutlass.Float32)
        acc.fill(0.0)
        total = cutlass.Float32(0.0)
        for s in cutlass.range_constexpr(SP):
            w = cute.math.exp2((lse_s[s] - m_ref) * LOG2_E, fastmath=True)
            total = total + w
            for j in cutlass.range_constexpr(D // 32):
                acc[j] = acc[j] + w * mOp[s, batch, head, row, lane + 32 * j]
        if cutlass.const_expr(sink is not None):
            total = total + cute.math.exp2((sink - m_ref) * LOG2_E, fastmath=True)
        has_keys = total > 0.0
        inv = cute.arch.rcp_approx(total if has_keys else 1.0)
        scale = inv if has_keys else 0.0
        for j in cutlass.range_constexpr(D // 32):
            acc[j] = acc[j] * scale
        out = cute.make_rmem_tensor(D // 32, dtype)
        out.store(acc.load().to(dtype))
        for j in cutlass.range_constexpr(D // 32):
            mO[batch, row, head, lane + 32 * j] = out[j]
        if lane == 0:
            lse = -cutlass.Float32.inf
            if has_keys:
                lse = m_ref + cute.math.log2(total, fastmath=True) * LN_2
            mLSE[batch, head, row] = lse


def row_state(n_rows):
    """The running max (-inf) and sum (0) of ``n_rows`` accumulator rows per thread."""
    row_max = cute.make_rmem_tensor(n_rows, cutlass.Float32)
    row_sum = cute.make_rmem_tensor(n_rows, cutlass.Float32)
    row_max.fill(-cutlass.Float32.inf)
    row_sum.fill(0.0)
    return row_max, row_sum


__all__ = ["LN_2", "LOG2_E", "combine_splits", "finalize", "log2_scale", "online_softmax",
           "online_softmax_lazy", "rescale",
           "row_state", "softcap_scores"]
