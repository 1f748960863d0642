"""Which keys a query row sees, and which key tiles a block of rows must visit and mask: written
once in plain Python, so that every attention family traces the same arithmetic and the CPU
tests run it (tests/test_attention_keyrange.py).

Visibility (``sq`` = q_len, ``sk`` = k_len, ``shift = sk - sq``: the bottom-right alignment of
FlashAttention-2 for sq != sk):

* always: key j < sk;
* ``causal``: j <= q + shift (query q sees up to its diagonal);
* ``local`` (sliding window, compile-time switch; runtime ``window_left``/``window_right`` Int32,
  -1 = unbounded): q + shift - window_left <= j <= q + shift + window_right.  With ``causal`` as
  well, both right bounds hold.  :func:`window` turns -1 into a bound no row reaches, so the
  formulas below need no case for it.

API (integers in, integers out; every helper only divides non-negative values, so ``//`` means
the same on the CPU and in a kernel):

* :func:`key_tiles` — the key tiles ``[lo, hi)`` rows ``[row_first, row_end)`` visit and which of
  them need the mask (tile t needs it iff ``t >= mask_hi or t < mask_lo``);
* :func:`tile_key_bounds` — one row's visible keys ``[lo, hi)`` relative to a tile's first key
  (what the fragment masks of mask.py compare column coordinates with);
* :func:`key_limit` — one row's absolute ``hi`` (for kernels with one row per thread that hoist
  it out of the key loop);
* :func:`tile_at`, :func:`needs_mask` — the walk order (last tile first: the masked tail and
  diagonal tiles come first, the rest run without mask code);
* :func:`varlen_bounds`, :func:`cta_has_rows` — a CTA's sequence in packed (cu_seqlens) tensors.

Arithmetic comes in through ``ops`` (:data:`PY` here; mask.py's ``DSL`` in a kernel, which a
family may rebuild with its own ``ceil_div``); nothing here imports the DSL.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple


class Ops(NamedTuple):
    """The integer operations the helpers use: Python's on the CPU, the DSL's in a kernel."""

    min: Callable[[Any, Any], Any]
    max: Callable[[Any, Any], Any]
    ceil_div: Callable[[Any, int], Any]
    select: Callable[[Any, Any, Any], Any]


PY = Ops(min, max, lambda a, b: (a + b - 1) // b, lambda c, a, b: a if c else b)


class KeyTiles(NamedTuple):
    """Key tiles ``[lo, hi)`` to visit; tile t needs the mask iff ``t >= mask_hi or t < mask_lo``
    (``lo`` and ``mask_lo`` are the Python int 0 unless the window is on)."""

    lo: Any
    hi: Any
    mask_lo: Any
    mask_hi: Any


def window(window_left, window_right, q_len, k_len, ops: Ops = PY):
    """The window with -1 (unbounded) replaced by ``q_len + k_len``: no row of the sequence then
    has a key bound on that side."""
    unbounded = q_len + k_len
    return (ops.select(window_left < 0, unbounded, window_left),
            ops.select(window_right < 0, unbounded, window_right))


def key_tiles(row_first, row_end, q_len, k_len, bn: int, causal: bool, ops: Ops = PY,
              local: bool = False, win=(None, None)) -> KeyTiles:
    """The key tiles that rows ``[row_first, row_end)`` see (``win``: :func:`window`'s result,
    with ``local``).  Visibility bounds grow with the row, so the first row gives the lowest
    bounds and the last the highest; ``row_end`` may pass q_len (a partial last block: its extra
    rows only widen the range).  ``hi`` may be below ``lo`` (nothing visible): loops of
    ``hi - lo`` steps then run none."""
    n_hi = ops.ceil_div(k_len, bn)
    n_mask = k_len // bn
    if causal:
        # bottom-right: row r sees keys < r + 1 + (k_len - q_len); clamp before dividing
        shift = k_len - q_len
        n_hi = ops.min(n_hi, ops.ceil_div(ops.max(0, row_end + shift), bn))
        n_mask = ops.min(n_mask, ops.max(0, row_first + shift + 1) // bn)
    n_lo, mask_lo = 0, 0
    if local:
        wl, wr = win
        shift = k_len - q_len
        n_hi = ops.min(n_hi, ops.ceil_div(ops.max(0, row_end + shift + wr), bn))
        n_mask = ops.min(n_mask, ops.max(0, row_first + shift + wr + 1) // bn)
        # the first key of the first row / of the last row
        n_lo = ops.min(ops.max(0, row_first + shift - wl) // bn, n_hi)
        mask_lo = ops.ceil_div(ops.max(0, row_end - 1 + shift - wl), bn)
    return KeyTiles(n_lo, n_hi, mask_lo, n_mask)


def tile_key_bounds(q, n0, q_len, k_len, causal: bool, ops: Ops = PY, local: bool = False,
                    win=(None, None)):
    """Keys ``[lo, hi)`` that query ``q`` sees, relative to ``n0`` (a tile's first key): column c
    of the tile is visible iff ``lo <= c < hi``.  ``lo`` is None without ``local``."""
    hi = k_len - n0
    if causal:
        hi = ops.min(hi, q + 1 + k_len - q_len - n0)
    lo = None
    if local:
        wl, wr = win
        hi = ops.min(hi, q + 1 + k_len - q_len + wr - n0)
        lo = q + k_len - q_len - wl - n0
    return lo, hi


def key_limit(row, q_len, k_len, causal: bool, mn=min, mx=max):
    """One past the last key ``row`` sees (keys >= it are masked to -inf), in [0, k_len]."""
    if causal:
        return mn(k_len, mx(row + 1 + k_len - q_len, 0))
    return k_len


def key_start(row, q_len, k_len, win, mx=max):
    """The first key ``row`` sees under the window (``win``: :func:`window`'s result), >= 0."""
    return mx(row + k_len - q_len - win[0], 0)


def tile_at(j, n_hi):
    """The key tile of the kernel's ``j``-th step: the last tile first, so the masked tiles (the
    key tail and the causal diagonal) come first and the rest run without mask code."""
    return n_hi - 1 - j


def needs_mask(tile, n_mask):
    return tile >= n_mask


def varlen_bounds(cu_seqlens_q, cu_seqlens_k, batch):
    """(q_start, q_len, k_start, k_len) of sequence ``batch``: its rows of the packed tensors."""
    q_start = cu_seqlens_q[batch]
    q_len = cu_seqlens_q[batch + 1] - q_start
    k_start = cu_seqlens_k[batch]
    return q_start, q_len, k_start, cu_seqlens_k[batch + 1] - k_start


def cta_has_rows(m_block, cta_m: int, q_len):
    """A CTA of a grid sized by max_seqlen_q whose first row is past its sequence does nothing."""
    return m_block * cta_m < q_len
