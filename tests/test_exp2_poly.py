"""exp2 on the FMA pipe (atoms/exp2_poly.py) and how the fp8 attention forward uses it
(attention/sm90_fp8.py ``ex2_poly``): the float32 model of the kernel's instruction sequence
against float64 2^x, the PTX the kernel inlines, which scores take the polynomial, and the names
of the variants that use it."""

from __future__ import annotations

import re

import numpy as np
import pytest

from factory.atoms import exp2_poly as ep
from factory.attention.sm90_fp8 import AttentionFp8Sm90, ex2_emulated_column, fp8_config


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


@pytest.mark.parametrize("per_16", range(17))
def test_columns_taking_the_polynomial(per_16):
    cols = [c for c in range(64) if ex2_emulated_column(c, per_16)]
    assert len(cols) == 4 * per_16
    # spread: at most one more in any half of a 16-column group than in the other
    for g in range(4):
        lo = sum(1 for c in cols if 16 * g <= c < 16 * g + 8)
        assert abs(2 * lo - per_16) <= 1


def test_names_and_limits():
    cfg = fp8_config(128, False)
    v = AttentionFp8Sm90(target="sm_90a", head_dim=128, causal=False, **cfg)
    assert not re.search(r"_pe\d|_pd\d", v.name)
    p = AttentionFp8Sm90(target="sm_90a", head_dim=128, causal=False, **{**cfg, "ex2_poly": 4})
    assert p.name == v.name + "_pe4" and p.can_implement() is None
    assert p.describe()["ex2_emulation"] == {"per_16": 4, "degree": 3}
    p2 = AttentionFp8Sm90(target="sm_90a", head_dim=128, causal=False, **{**cfg, "ex2_poly": 4, "ex2_degree": 2})
    assert p2.name == v.name + "_pe4_pd2"
    assert AttentionFp8Sm90(target="sm_90a", head_dim=128, causal=False,
                            **{**cfg, "ex2_poly": 17}).can_implement() is not None
    assert AttentionFp8Sm90(target="sm_90a", head_dim=128, causal=False,
                            **{**cfg, "ex2_poly": 4, "overlap": False, "early_rescale": False}).can_implement()
