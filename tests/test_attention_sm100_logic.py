"""CPU tests of what the Blackwell FA4-class attention kernel (attention/sm100_fa4.py) does that does
not depend on the tensor cores, run with the very constants and helpers the kernel traces
(attention/sm100_logic.py, attention/keyrange.py): the emulated exp2 (its float32 coefficients, clamp and range reduction),
the key tiles a CTA sees and which need the mask, the tile order, the varlen offsets, and a model of
the whole per-row algorithm (reverse tile order, masks, the conditional rescale with its
threshold, 1/4 of the exponentials emulated, P rounded to 16 bits, O / row sum, LSE) against
float64 attention.  No DSL and no GPU: nothing here shows that the kernel runs, only that the
logic it is built on is right.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from factory.attention import keyrange as kr
from factory.attention import sm100_logic as logic
from factory.testing import attention_reference

F32_EPS = 2.0 ** -23
BN = 128
CTA_M = 256


# --- exp2 emulation ---------------------------------------------------------------------------------
def _x_samples() -> np.ndarray:
    """The float32 inputs that matter: the kernel feeds exp2 x = s·scale - max <= RESCALE_THRESHOLD
    (8), and results below 2^-126 are zero for any purpose (for x in (-127, -126) the emulation
    returns a value below 2^-126 that is not 2^x: floor(x) = -127 leaves the exponent field 0,
    a subnormal).  A dense grid, the float32 values of
    [-1, 1) at a stride of 4099 bit patterns (all exponents, ~0.5 M values), and the neighbours of
    every integer."""
    grid = np.linspace(-126.0, logic.RESCALE_THRESHOLD, 4_000_001, dtype=np.float32)
    lo, hi = np.float32(-1.0).view(np.uint32), np.float32(1.0).view(np.uint32)
    neg = np.arange(np.float32(-0.0).view(np.uint32), lo, 4099, dtype=np.uint32).view(np.float32)
    pos = np.arange(0, hi, 4099, dtype=np.uint32).view(np.float32)
    ints = np.arange(-126, 9, dtype=np.float32)
    near = np.concatenate([np.nextafter(ints[1:], np.float32(-np.inf)), ints,
                           np.nextafter(ints, np.float32(np.inf))])
    return np.concatenate([grid, neg, pos, near])


@pytest.mark.parametrize("degree", sorted(logic.EX2_POLY))
def test_ex2_emulation_error(degree):
    """Max relative error over the inputs that matter, with the kernel's float32 operation
    sequence: the polynomial's own minimax error plus a few float32 roundings (three per Horner
    step at most)."""
    x = _x_samples()
    got = logic.ex2_emulated(x, degree).astype(np.float64)
    ref = np.exp2(x.astype(np.float64))
    rel = np.abs(got - ref) / ref
    bound = logic.EX2_POLY_REL_ERR[degree] * 1.01 + 3 * F32_EPS
    assert float(rel.max()) <= bound, (degree, float(rel.max()), bound)
    # and it is a minimax fit, not merely a good one: the error reaches its bound
    assert float(rel.max()) >= logic.EX2_POLY_REL_ERR[degree] * 0.95


@pytest.mark.parametrize("degree", sorted(logic.EX2_POLY))
def test_ex2_emulation_coefficients_and_special_values(degree):
    c = logic.EX2_POLY[degree]
    assert len(c) == degree + 1 and c[0] == 1.0
    assert all(float(np.float32(v)) == v for v in c), "coefficients must be float32-exact"
    # Masked scores (-inf) and anything at or below the clamp give exactly 0, so a row with no
    # visible key keeps a row sum of exactly 0 (O = 0, LSE = -inf).
    zero = logic.ex2_emulated(np.float32([-np.inf, -127.0, -128.5, -1e30]), degree)
    assert np.all(zero == 0.0) and not np.any(np.signbit(zero))
    # Integers are exact powers of two (f = 0, p(0) = 1): the row max's own P is exactly 1.
    ints = np.arange(-126, 9, dtype=np.float32)
    assert np.array_equal(logic.ex2_emulated(ints, degree), np.exp2(ints))
    # Just below an integer (f rounds to nearly 1, or to 1 itself): still within the bound.
    below = np.nextafter(ints[1:], np.float32(-np.inf))
    np.testing.assert_allclose(logic.ex2_emulated(below, degree), np.exp2(below.astype(np.float64)),
                               rtol=logic.EX2_POLY_REL_ERR[degree] * 1.01 + 3 * F32_EPS)


def test_ex2_polynomial_is_minimax():
    """The stored error bounds are the polynomials' (Remez) equioscillation levels on [0, 1]."""
    f = np.linspace(0.0, 1.0, 200_001)
    for degree, c in logic.EX2_POLY.items():
        p = sum(ck * f ** k for k, ck in enumerate(c))
        err = p / np.exp2(f) - 1
        assert abs(np.abs(err).max() - logic.EX2_POLY_REL_ERR[degree]) < 0.01 * logic.EX2_POLY_REL_ERR[degree]
        # equioscillation: degree + 1 alternating extrema of (nearly) the same size after f = 0
        s = np.sign(err[1:])
        assert np.count_nonzero(np.diff(s)) >= degree


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_ex2_emulation_after_rounding_to_p_dtype(dtype):
    """What the MMA sees is P in 16 bits: with the degree the kernel uses per dtype, the emulated
    exponentials round to the same 16-bit value as the exact ones almost always, and are never more
    than one 16-bit ulp away (over the dtype's normal range: fp16 is subnormal below 2^-14)."""
    tdt = {"bf16": torch.bfloat16, "f16": torch.float16}[dtype]
    lo = {"bf16": -60.0, "f16": -14.0}[dtype]
    x = np.linspace(lo, logic.RESCALE_THRESHOLD, 1_000_001, dtype=np.float32)
    got = torch.from_numpy(logic.ex2_emulated(x, logic.EX2_DEGREE[dtype])).to(tdt).float()
    ref = torch.from_numpy(np.exp2(x)).to(tdt).float()
    ulp = {"bf16": 2.0 ** -7, "f16": 2.0 ** -10}[dtype]
    rel = ((got - ref).abs() / ref).numpy()
    assert rel.max() <= ulp * 1.0001
    assert np.mean(rel > 0) < {"bf16": 0.02, "f16": 0.01}[dtype]


def test_ex2_emulated_share():
    """1/4 of a row's 128 exponentials take the polynomial, in pairs (the packed f32x2 form): the
    kernel issues 96 MUFU.EX2 per row and key tile (its SASS test checks the count)."""
    emu = [i for i in range(BN) if logic.ex2_emulated_index(i)]
    assert len(emu) == BN * logic.EX2_EMU_COUNT // logic.EX2_EMU_GROUP == 32
    assert all(logic.ex2_emulated_index(i) == logic.ex2_emulated_index(i ^ 1) for i in range(BN))


# --- key tiles, masks, order ---------------------------------------------------------------------------
def _visible(rows: np.ndarray, k_len: int, q_len: int, causal: bool) -> np.ndarray:
    keys = np.arange(k_len)[None, :]
    if causal:
        return keys <= rows[:, None] + (k_len - q_len)
    return np.ones((len(rows), k_len), dtype=bool)


@pytest.mark.parametrize("causal", [False, True])
def test_key_tiles_and_mask(causal):
    """For every CTA of many (q_len, k_len): the tiles [0, n_hi) hold every key a row of the CTA
    sees and the last of them holds one (no tile is loaded for nothing); tiles < n_mask are seen
    whole by every row of the CTA; and the per-row key limit reproduces the mask exactly."""
    lens = [1, 2, 127, 128, 129, 255, 256, 257, 300, 513]
    for q_len, k_len in itertools.product(lens, lens):
        for m_blk in range(-(-q_len // CTA_M)):
            m0 = m_blk * CTA_M
            rows = np.arange(m0, min(m0 + CTA_M, q_len))
            vis = _visible(rows, k_len, q_len, causal)
            _, n_hi, _, n_mask = kr.key_tiles(m0, m0 + CTA_M, q_len, k_len, BN, causal)
            seen = np.nonzero(vis.any(axis=0))[0]
            if len(seen):
                assert n_hi == seen.max() // BN + 1, (q_len, k_len, m_blk)
            else:
                assert n_hi == 0, (q_len, k_len, m_blk)
            assert 0 <= n_mask <= max(n_hi, 0) or n_mask <= k_len // BN
            for t in range(min(n_mask, n_hi)):
                assert vis[:, t * BN:(t + 1) * BN].all(), (q_len, k_len, m_blk, t)
            limits = np.array([kr.key_limit(int(r), q_len, k_len, causal) for r in rows])
            assert np.array_equal(np.arange(k_len)[None, :] < limits[:, None], vis)


def test_tile_order():
    """The kernel's steps visit every tile once, the last first, so the masked tiles (key tail,
    causal diagonal) come first."""
    for n_hi in range(0, 9):
        order = [kr.tile_at(j, n_hi) for j in range(n_hi)]
        assert order == list(range(n_hi - 1, -1, -1))
    assert kr.needs_mask(3, 3) and not kr.needs_mask(2, 3)


def test_varlen_bounds():
    lens_q, lens_k = [5, 0, 300, 1, 257], [7, 3, 300, 0, 1000]
    cu_q = [0, *itertools.accumulate(lens_q)]
    cu_k = [0, *itertools.accumulate(lens_k)]
    for b in range(len(lens_q)):
        q_start, q_len, k_start, k_len = kr.varlen_bounds(cu_q, cu_k, b)
        assert (q_start, q_len, k_start, k_len) == (sum(lens_q[:b]), lens_q[b], sum(lens_k[:b]), lens_k[b])
        ctas = -(-max(lens_q) // CTA_M)
        assert [m for m in range(ctas) if kr.cta_has_rows(m, CTA_M, q_len)] == list(range(-(-q_len // CTA_M)))


# --- the whole algorithm, modelled per row ---------------------------------------------------------------
def _kernel_model(q, k, v, causal: bool, scale: float, dtype: str):
    """What the kernel computes for one (q head, batch): q (Sq, D), k/v (Sk, D) float32 holding 16-bit
    values; returns o (Sq, D) float32 and lse (Sq,), following the kernel step by step: per CTA of
    256 rows the key tiles from key_tiles(), last first; S in float32; the mask where needs_mask();
    the running max in log2 units with the rescale threshold; exp2 on MUFU (float32 exp2 here) or
    the polynomial by index; P rounded to the 16-bit dtype for P·V; O rescaled by alpha; the row
    sum of the float32 P; O / row sum and LSE = (max + log2 sum)·ln 2, 0 and -inf without a key."""
    tdt = {"bf16": torch.bfloat16, "f16": torch.float16}[dtype]
    q_len, k_len, d = q.shape[0], k.shape[0], q.shape[1]
    c = np.float32(scale * math.log2(math.e))
    emu = np.array([logic.ex2_emulated_index(i) for i in range(BN)])
    o = np.zeros((q_len, d), np.float32)
    lse = np.zeros(q_len, np.float32)
    for m_blk in range(-(-q_len // CTA_M)):
        m0 = m_blk * CTA_M
        _, n_hi, _, n_mask = kr.key_tiles(m0, m0 + CTA_M, q_len, k_len, BN, causal)
        rows = np.arange(m0, min(m0 + CTA_M, q_len))
        limit = np.array([kr.key_limit(int(r), q_len, k_len, causal) for r in rows])
        row_max = np.full(len(rows), -np.inf, np.float32)
        row_sum = np.zeros(len(rows), np.float32)
        acc = np.zeros((len(rows), d), np.float32)
        for j in range(n_hi):
            tile = kr.tile_at(j, n_hi)
            kt = np.zeros((BN, d), np.float32)
            vt = np.zeros((BN, d), np.float32)
            n = min(BN, k_len - tile * BN)
            kt[:n], vt[:n] = k[tile * BN:tile * BN + n], v[tile * BN:tile * BN + n]
            s = (q[rows].astype(np.float64) @ kt.T.astype(np.float64)).astype(np.float32)
            if kr.needs_mask(tile, n_mask):
                s = np.where(np.arange(BN)[None, :] >= (limit - tile * BN)[:, None], -np.inf, s)
            new_max = np.maximum(row_max, s.max(axis=1) * c)
            alpha = np.ones(len(rows), np.float32)
            if j == 0:
                row_max = new_max
            else:
                grow = new_max > row_max + np.float32(logic.RESCALE_THRESHOLD)
                with np.errstate(invalid="ignore"):
                    alpha = np.where(grow, np.exp2(row_max - new_max), np.float32(1)).astype(np.float32)
                row_max = np.where(grow, new_max, row_max)
            neg = np.where(row_max == -np.inf, np.float32(0), -row_max).astype(np.float32)
            x = (s * c + neg[:, None]).astype(np.float32)
            p = np.where(emu[None, :], logic.ex2_emulated(x, logic.EX2_DEGREE[dtype]),
                         np.exp2(x)).astype(np.float32)
            p16 = torch.from_numpy(p).to(tdt).float().numpy()
            acc = acc * alpha[:, None] + (p16.astype(np.float64) @ vt.astype(np.float64)).astype(np.float32)
            row_sum = row_sum * alpha + p.sum(axis=1, dtype=np.float32)
        ok = row_sum > 0
        with np.errstate(divide="ignore", invalid="ignore"):
            o[rows] = np.where(ok[:, None], acc / row_sum[:, None], 0)
            lse[rows] = np.where(ok, (row_max + np.log2(row_sum)) * math.log(2), -np.inf)
    return o, lse


def _problem(dtype: str, q_len: int, k_len: int, seed: int, d: int = 64):
    """q, k, v (1, S, 1, d) in the 16-bit dtype; k's rows grow from 0.2x to 3x towards key 0, so
    that the kernel's walk (last tile first) meets growing row maxima: some steps grow a row's max
    by more than the rescale threshold (O is rescaled), others by less (the old max is kept)."""
    tdt = {"bf16": torch.bfloat16, "f16": torch.float16}[dtype]
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(1, q_len, 1, d, generator=g) * 2).to(tdt)
    k = (torch.randn(1, k_len, 1, d, generator=g)
         * torch.linspace(3.0, 0.2, k_len)[None, :, None, None]).to(tdt)
    v = torch.randn(1, k_len, 1, d, generator=g).to(tdt)
    return q, k, v


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("q_len,k_len", [(300, 300), (77, 700), (520, 130), (1, 257), (256, 129)])
def test_algorithm_model_matches_attention(dtype, causal, q_len, k_len):
    """The kernel's algorithm (model above) against float32 attention of the same 16-bit inputs:
    within a few rounding steps of P's 16-bit type (measured 4e-4..1.1e-3 for bf16, 5e-5..1.5e-4
    for fp16; the bundle's tolerance is 1e-2); fully masked rows (causal, k_len < q_len) give
    exactly 0 and -inf."""
    q, k, v = _problem(dtype, q_len, k_len, q_len * 1000 + k_len + causal)
    d = q.shape[-1]
    scale = d ** -0.5
    ref_o, ref_lse = attention_reference(q, k, v, causal, scale)
    o, lse = _kernel_model(q[0, :, 0].float().numpy(), k[0, :, 0].float().numpy(),
                           v[0, :, 0].float().numpy(), causal, scale, dtype)
    ref_o, ref_lse = ref_o[0, :, 0].numpy(), ref_lse[0, 0].numpy()
    empty = ~np.isfinite(ref_lse)
    assert np.array_equal(~np.isfinite(lse), empty)
    assert np.all(o[empty] == 0)
    err = np.linalg.norm(o - ref_o) / max(np.linalg.norm(ref_o), 1e-30)
    assert err < {"bf16": 3e-3, "f16": 5e-4}[dtype], err
    if (~empty).any():
        assert np.abs(lse[~empty] - ref_lse[~empty]).max() < 3e-4


def test_model_exercises_the_rescale_threshold():
    """The problems above hit both branches of the conditional rescale: per row and step, the
    running max (log2 units) grows by more than the threshold (rescale) and by less (kept)."""
    q, k, _ = _problem("bf16", 300, 700, 300 * 1000 + 700)
    q, k = q[0, :, 0].float().numpy(), k[0, :, 0].float().numpy()
    c = q.shape[1] ** -0.5 * math.log2(math.e)
    n_hi = kr.key_tiles(0, CTA_M, 300, 700, BN, False).hi
    maxes = np.stack([(q @ k[t * BN:(t + 1) * BN].T).max(axis=1) * c
                      for t in (kr.tile_at(j, n_hi) for j in range(n_hi))])
    growth = np.diff(np.maximum.accumulate(maxes, axis=0), axis=0)
    assert (growth > logic.RESCALE_THRESHOLD).sum() > 10
    assert ((growth > 0) & (growth <= logic.RESCALE_THRESHOLD)).sum() > 10
