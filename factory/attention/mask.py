"""The attention mask of every family: scores of keys a query row does not see become -inf.

What a row sees is keyrange.py's (key tail, bottom-right causal, sliding window); here it is
applied to a key tile's scores in registers, one select per score.  (An ``if`` per score makes
the DSL yield the whole fragment through each branch: ~15x the instructions on sm_90a, 8002 SEL
and a stack frame on sm_100a; notes/attention-sm90.md, notes/blackwell.md.)

* :class:`MaskSpec` — the compile-time switches: ``causal``, ``local`` (window); a family keeps
  one per kernel and passes it to every call.
* :func:`apply_mask` — a fragment viewed as ``(rows, cols)`` with a matching view of its (row,
  col) tile coordinates (atoms/sm80.py ``acc_mn_view`` for mma.sync, atoms/sm90.py's for WGMMA);
  ``group`` maps fragment rows to queries when several rows share one query (packed GQA decode:
  row // group).
* :func:`mask_keys` — one row of scores with its coordinates and its bounds (kernels with one row
  per thread, which compute a row's bounds once: keyrange.key_limit / key_start).
* :data:`DSL` — keyrange.Ops for kernels (``cute.ceil_div``); ``DSL._replace(ceil_div=...)`` for a
  family that divides otherwise.

Runtime window values reach these through ``win`` (keyrange.window's result); with ``local`` off
the window arguments are never read and the code is that of the plain mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute

from . import keyrange
from .keyrange import KeyTiles, Ops

DSL = Ops(cutlass.min, cutlass.max, cute.ceil_div, cutlass.select_)


@dataclass(frozen=True)
class MaskSpec:
    """Compile-time mask switches (hashable: a kernel object may hold it)."""

    causal: bool = False
    local: bool = False


def key_tiles(spec: MaskSpec, row_first, row_end, q_len, k_len, bn: int, ops: Ops = DSL,
              win=(None, None)) -> KeyTiles:
    """keyrange.key_tiles under ``spec`` (DSL arithmetic by default)."""
    return keyrange.key_tiles(row_first, row_end, q_len, k_len, bn, spec.causal, ops, spec.local, win)


def window(spec: MaskSpec, window_left, window_right, q_len, k_len):
    """keyrange.window in the kernel; (None, None) when ``spec.local`` is off."""
    if cutlass.const_expr(spec.local):
        return keyrange.window(window_left, window_right, q_len, k_len, DSL)
    return (None, None)


@cute.jit
def mask_keys(s: cute.Tensor, c: cute.Tensor, hi, lo=None):
    """``s[i] = -inf`` unless ``lo <= c[i][1] < hi``: ``s`` a row of scores, ``c`` their (row, key)
    coordinates in the same order (``lo`` None: no lower bound)."""
    for i in cutlass.range_constexpr(cute.size(s)):
        s[i] = -cutlass.Float32.inf if c[i][1] >= hi else s[i]
        if cutlass.const_expr(lo is not None):
            s[i] = -cutlass.Float32.inf if c[i][1] < lo else s[i]


@cute.jit
def apply_mask(spec: cutlass.Constexpr, s_mn: cute.Tensor, c_mn: cute.Tensor, row0, n0, q_len, k_len,
               group=None, win=(None, None)):
    """-inf where the key is past the sequence, after the query's diagonal (causal) or outside
    its window (local).  ``s_mn``: one key tile's scores as (rows, cols); ``c_mn``: their tile
    coordinates; query of row r: ``row0 + c_mn[r, 0][0]`` (``// group`` if given); ``n0``: the
    tile's first key."""
    for r in cutlass.range_constexpr(cute.size(s_mn, mode=[0])):
        q = row0 + c_mn[r, 0][0]
        if cutlass.const_expr(group is not None):
            q = q // group
        lo, hi = keyrange.tile_key_bounds(q, n0, q_len, k_len, spec.causal, DSL, spec.local, win)
        mask_keys(s_mn[r, None], c_mn[r, None], hi, lo)


__all__ = ["DSL", "MaskSpec", "apply_mask", "key_tiles", "mask_keys", "window"]
