"""exp2 on the FMA pipe (atoms/exp2_poly.py): the float32 model of the inlined instruction
sequence against float64 2^x (the stated error bound, exact zeros below the clamp, -inf and NaN),
and the PTX a kernel inlines."""

from __future__ import annotations

import re

import numpy as np
import pytest

from factory.atoms import exp2_poly as ep


@pytest.mark.parametrize("degree", [2, 3])
def test_model_within_the_stated_relative_error(degree):
    x = np.concatenate([np.linspace(-126.0, 0.0, 400_001), -np.abs(np.random.default_rng(0).normal(0, 20, 100_000)),
                        np.array([0.0, -1e-30, 1e-7, -0.5, -1.0, -125.999])]).astype(np.float32)
    x = x[x > -126.0]
    got = ep.ex2_poly_model(x, degree).astype(np.float64)
    want = np.exp2(x.astype(np.float64))
    rel = np.abs(got / want - 1.0)
    assert rel.max() <= ep.EX2_POLY_REL_ERR[degree] * 1.01
    # and far below half an e4m3 ulp (2^-4), the rounding P gets next
    assert rel.max() < 2.0 ** -4 / 25


@pytest.mark.parametrize("degree", [2, 3])
def test_model_clamps_to_exact_zero(degree):
    x = np.array([-127.0, -127.5, -200.0, -3e38, -np.inf, np.nan], dtype=np.float32)
    got = ep.ex2_poly_model(x, degree)
    assert (got == 0.0).all() and not np.signbit(got).any()
    # just above the clamp: a tiny non-negative number, never a wrapped exponent
    y = ep.ex2_poly_model(np.array([-126.9, -126.0], dtype=np.float32), degree)
    assert (y >= 0).all() and (y < 2.0 ** -125).all()


def test_ptx_is_the_modelled_sequence():
    for degree in (2, 3):
        ptx = ep.ex2_poly_ptx(degree)
        ops = re.findall(r"^(max|add|sub|fma|shl|mov)\.(\w+)", ptx, re.M)
        assert [o for o in ops if o[0] != "mov"] == [("max", "f32"), ("add", "rm"), ("sub", "rn"), ("sub", "rn"),
                                                    *[("fma", "rn")] * degree, ("shl", "b32"), ("add", "s32")]
        assert "0f4B400000" in ptx and "0fC2FE0000" in ptx  # 1.5·2^23 and -127


def test_bf16_pair_ptx_and_model():
    """ex2.approx.ftz.bf16x2 on a pair of float32 scores: packed (first score in the low half),
    exponentiated, each half widened back to float32; the model's error against float64 2^x is the
    bf16 rounding (unit roundoff 2^-8) of the input (|x|·2^-8·ln 2) and of the result (2^-8), nothing else."""
    ptx = ep.ex2_bf16x2_ptx()
    ops = re.findall(r"^(cvt|ex2|shl|and|mov)\.([\w.]+)", ptx, re.M)
    assert ops == [("cvt", "rn.bf16x2.f32"), ("ex2", "approx.ftz.bf16x2"), ("shl", "b32"), ("and", "b32"),
                   ("mov", "b32"), ("mov", "b32")]
    assert "cvt.rn.bf16x2.f32 fx_x, $3, $2;" in ptx  # $2 (the first score) in the low half
    x = -np.abs(np.random.default_rng(1).normal(0, 4, 50_000)).astype(np.float32)
    lo, hi = ep.ex2_bf16x2_model(x, x[::-1])
    for got, src in ((lo, x), (hi, x[::-1])):
        want = np.exp2(src.astype(np.float64))
        bound = np.expm1(np.abs(src.astype(np.float64)) * 2.0 ** -8 * np.log(2.0)) + 2.0 ** -8
        rel = np.abs(got / want - 1.0)
        assert (rel <= bound * 1.01).all() and rel.max() > bound.max() / 8  # (the bound is not vacuous)
        assert (got.view(np.uint32) & 0xFFFF == 0).all()  # bf16 values
    z = ep.ex2_bf16x2_model(np.array([-np.inf], dtype=np.float32), np.array([0.0], dtype=np.float32))
    assert z[0][0] == 0.0 and z[1][0] == 1.0
