"""The register orders of the fp8 KV-cache decode's direct e4m3 operands (attention/decode.py
``gemm_qk_raw`` / ``gemm_pv_raw``, atoms/e4m3_order.py), replayed in plain Python: ldmatrix lane
semantics, the byte permutes and the conversions' halves, against the m16n8k16 fragment layouts.
No DSL, no GPU."""

from __future__ import annotations

from factory.atoms.e4m3_order import V_JOIN, k_order, q_pair_slot, v_column


def prmt(a: list[int], b: list[int], sel: int) -> list[int]:
    """prmt.b32 on byte lists (a: bytes 0-3, b: bytes 4-7)."""
    src = a + b
    return [src[(sel >> (4 * k)) & 0xF] for k in range(4)]


def ldsm(tile, lane: int) -> list[int]:
    """ldmatrix (b16, not transposed) of an 8-row x 16-byte tile: lane l's bytes."""
    return tile[lane // 4][4 * (lane % 4):4 * (lane % 4) + 4]


def ldsm_trans(tile, lane: int) -> list[int]:
    """ldmatrix .trans (b16) of an 8-row x 16-byte tile: element (row 2t, column g) then (2t+1, g)."""
    t, g = lane % 4, lane // 4
    return tile[2 * t][2 * g:2 * g + 2] + tile[2 * t + 1][2 * g:2 * g + 2]


def test_q_slots_follow_the_k_order():
    """Q's pair m of chunk c, stored at k pair q_pair_slot(c, m), meets the K column that the B
    fragment's k index reads (k_order): Q·Kᵀ sums matching head_dim columns."""
    seen = set()
    for c in range(128 // 8):
        for m in range(4):
            for j in range(2):
                k = 2 * q_pair_slot(c, m) + j
                assert 16 * (k // 16) + k_order(k % 16) == 8 * c + 2 * m + j
                seen.add(k)
    assert seen == set(range(128))


def test_k_fragment_order():
    """B fragment of S = Q·Kᵀ from one ldmatrix word of raw K: registers (k 2t, 2t+1) take bytes
    0-1, (k 2t+8, 2t+9) bytes 2-3; column n = g is key g of the matrix."""
    tile = [[(key, col) for col in range(16)] for key in range(8)]
    for lane in range(32):
        t, g = lane % 4, lane // 4
        w = ldsm(tile, lane)
        regs = {2 * t: w[0], 2 * t + 1: w[1], 2 * t + 8: w[2], 2 * t + 9: w[3]}
        for k, (key, col) in regs.items():
            assert key == g and col == k_order(k)


def test_v_fragment_order():
    """B fragments of O += P·V from ldmatrix.trans of raw V (keys 0-7 and 8-15 of one 16-byte
    chunk) joined by V_JOIN: block 2c + e, column g holds keys (2t, 2t+1 | 2t+8, 2t+9) of head_dim
    column v_column(8(2c + e) + g), and v_column is a permutation of the head_dim."""
    c = 3
    lo = [[(key, 16 * c + b) for b in range(16)] for key in range(8)]
    hi = [[(key + 8, 16 * c + b) for b in range(16)] for key in range(8)]
    for lane in range(32):
        t, g = lane % 4, lane // 4
        a, b = ldsm_trans(lo, lane), ldsm_trans(hi, lane)
        for e, sel in enumerate(V_JOIN):
            w = prmt(a, b, sel)  # converted as (bytes 0-1: k 2t, 2t+1), (bytes 2-3: k 2t+8, 2t+9)
            keys = [x[0] for x in w]
            assert keys == [2 * t, 2 * t + 1, 2 * t + 8, 2 * t + 9]
            assert {x[1] for x in w} == {v_column(8 * (2 * c + e) + g)}
    assert sorted(v_column(n) for n in range(128)) == list(range(128))
