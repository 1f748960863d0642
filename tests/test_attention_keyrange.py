"""CPU tests of the key ranges every attention family traces (attention/keyrange.py), against a
brute-force visibility matrix: bottom-right causal, sliding window (window_left / window_right,
-1 unbounded) and both, for row blocks of the sizes the families use, with partial last blocks,
q_len > k_len and empty windows.  Checked: the visited key tiles hold every visible key (and the
last one holds one), the tiles declared unmasked are seen whole by every row of the block, and
the per-row bounds (tile-relative and absolute) reproduce the visibility exactly.  No DSL, no GPU:
this shows the arithmetic is right, not that a kernel runs it.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from factory.attention import keyrange as kr

LENS = [1, 5, 63, 64, 65, 128, 200, 257]
WINDOWS = [-1, 0, 1, 7, 64, 130]


def _visible(rows, q_len, k_len, causal, local=False, wl=-1, wr=-1) -> np.ndarray:
    q = np.asarray(rows)[:, None]
    j = np.arange(k_len)[None, :]
    shift = k_len - q_len
    vis = np.ones((len(rows), k_len), dtype=bool)
    if causal:
        vis &= j <= q + shift
    if local and wr >= 0:
        vis &= j <= q + shift + wr
    if local and wl >= 0:
        vis &= j >= q + shift - wl
    return vis


def _cases():
    for q_len, k_len in itertools.product(LENS, LENS):
        for causal in (False, True):
            yield q_len, k_len, causal, False, -1, -1
            for wl, wr in itertools.product(WINDOWS, WINDOWS):
                yield q_len, k_len, causal, True, wl, wr


def _check_block(q_len, k_len, causal, local, wl, wr, row_first, row_end, real_rows, bn):
    """real_rows: the queries of the block (the others are padding a kernel never stores)."""
    win = kr.window(wl, wr, q_len, k_len)
    kt = kr.key_tiles(row_first, row_end, q_len, k_len, bn, causal, kr.PY, local, win)
    vis = _visible(real_rows, q_len, k_len, causal, local, wl, wr)
    seen = np.nonzero(vis.any(axis=0))[0]
    ctx = (q_len, k_len, causal, local, wl, wr, row_first, bn)
    if len(seen):
        assert kt.lo * bn <= seen.min() and seen.max() < kt.hi * bn, (ctx, kt)
        assert kt.hi == seen.max() // bn + 1, (ctx, kt)  # no tile past the last visible key
        assert kt.lo <= seen.min() // bn, (ctx, kt)
    assert kt.lo >= 0
    for t in range(max(kt.lo, kt.mask_lo), min(kt.hi, kt.mask_hi)):  # declared unmasked
        assert vis[:, t * bn:(t + 1) * bn].all() and (t + 1) * bn <= k_len, (ctx, kt, t)
    if not local:
        assert kt.lo == 0 and kt.mask_lo == 0
    # per-row bounds, relative to each visited tile's first key, give the mask exactly (rows at
    # the block's edges and a few between: where the bounds change)
    picks = sorted({0, 1, len(real_rows) // 2, len(real_rows) - 2, len(real_rows) - 1} - {-1})
    for i, q in ((i, real_rows[i]) for i in picks if 0 <= i < len(real_rows)):
        for t in range(kt.lo, kt.hi):
            lo, hi = kr.tile_key_bounds(q, t * bn, q_len, k_len, causal, kr.PY, local, win)
            cols = np.arange(bn)
            want = np.zeros(bn, dtype=bool)
            keys = t * bn + cols
            inside = keys < k_len
            want[inside] = vis[i, keys[inside]]
            got = (cols < hi) & (cols >= (0 if lo is None else lo))
            assert np.array_equal(got, want), (ctx, q, t, lo, hi)


@pytest.mark.parametrize("bn,bm", [(64, 64), (128, 128), (128, 256)])
def test_key_tiles_for_row_blocks(bn, bm):
    """Row blocks of bm queries (sm80/sm90: 64-192 rows, sm100: 256) over bn-key tiles."""
    for q_len, k_len, causal, local, wl, wr in _cases():
        for m0 in range(0, q_len, bm):
            rows = list(range(m0, min(m0 + bm, q_len)))
            _check_block(q_len, k_len, causal, local, wl, wr, m0, m0 + bm, rows, bn)


def test_key_tiles_for_packed_gqa_rows():
    """Decode: a 16-row block holds (query, q head) pairs, row r -> query (row0 + r) // group; the
    block's queries run from row0 // group to its last row's (at most q_len - 1)."""
    for (q_len, k_len, causal, local, wl, wr), group in itertools.product(
            [c for c in _cases() if c[0] <= 16 and c[1] in (5, 64, 200)], (1, 4, 8)):
        for row0 in range(0, group * q_len, 16):
            last = min(q_len - 1, (row0 + 15) // group)
            queries = sorted({r // group for r in range(row0, min(row0 + 16, group * q_len))})
            _check_block(q_len, k_len, causal, local, wl, wr, row0 // group, last + 1, queries, 64)


def test_unbounded_window_is_no_window():
    """window (-1, -1) sees what no window sees (the -1 sides get a bound no row reaches)."""
    for q_len, k_len, causal in itertools.product(LENS, LENS, (False, True)):
        win = kr.window(-1, -1, q_len, k_len)
        for m0 in range(0, q_len, 128):
            a = kr.key_tiles(m0, m0 + 128, q_len, k_len, 128, causal)
            b = kr.key_tiles(m0, m0 + 128, q_len, k_len, 128, causal, kr.PY, True, win)
            assert (b.lo, b.hi, b.mask_hi) == (0, a.hi, a.mask_hi), (q_len, k_len, causal, a, b)


def test_absolute_row_bounds():
    """key_limit / key_start (one row per thread, hoisted out of the key loop) reproduce the
    visibility of every row: keys [key_start, key_limit)."""
    for q_len, k_len, causal, local, wl, wr in _cases():
        rows = np.arange(q_len)
        win = kr.window(wl, wr, q_len, k_len)
        vis = _visible(rows, q_len, k_len, causal, local, wl, wr)
        hi = np.array([kr.key_limit(int(r), q_len, k_len, causal) for r in rows])
        if local:  # the window's right side, as tile_key_bounds takes it (n0 = 0)
            hi = np.minimum(hi, [kr.tile_key_bounds(int(r), 0, q_len, k_len, causal, kr.PY, True, win)[1]
                                 for r in rows])
        lo = np.array([kr.key_start(int(r), q_len, k_len, win) if local else 0 for r in rows])
        j = np.arange(k_len)[None, :]
        assert np.array_equal((j < hi[:, None]) & (j >= lo[:, None]), vis), (q_len, k_len, causal, wl, wr)
        assert (hi <= k_len).all() and (lo >= 0).all()


def test_tile_order_and_varlen():
    for n_hi in range(9):
        assert [kr.tile_at(j, n_hi) for j in range(n_hi)] == list(range(n_hi - 1, -1, -1))
    assert kr.needs_mask(3, 3) and not kr.needs_mask(2, 3)
    lens_q, lens_k = [5, 0, 300, 1], [7, 3, 300, 0]
    cu_q, cu_k = [0, *itertools.accumulate(lens_q)], [0, *itertools.accumulate(lens_k)]
    for b in range(4):
        assert kr.varlen_bounds(cu_q, cu_k, b) == (cu_q[b], lens_q[b], cu_k[b], lens_k[b])
        assert [m for m in range(3) if kr.cta_has_rows(m, 128, lens_q[b])] == list(range(-(-lens_q[b] // 128)))
