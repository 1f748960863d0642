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
