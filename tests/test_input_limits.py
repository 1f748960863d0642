"""Sizes, products, aliasing and flags at the edges, on this GPU-less machine: the C entry points
(fx_gemm_select / fx_attention_select, and fx_gemm / fx_attention up to their first CUDA call)
through ctypes against the test bundle's host library, and the Python ops on a simulated bundle.
Every refusal is FX_ERR_INPUT / InputError with a message naming what is wrong; nothing returns
success without the work it was asked for (docs/errors.md, "C API")."""

from __future__ import annotations

import ctypes

import pytest
import torch

import c_selection as cs
from conftest import Recorder
from factory.runtime import Bundle, InputError

H100 = {"name": "planned H100", "sm_count": 132}
GOOD = 1 << 44  # well-separated fake device addresses (16-byte aligned); selection reads no memory


@pytest.fixture(scope="module")
def lib(test_bundle):
    return cs.CLib(test_bundle / "lib" / "libfactory_bundle.so")


def dev(cc=(9, 0), sms=132):
    return cs.Device(cc[0], cc[1], sms, b"")


def gemm_problem(M=1024, N=1024, K=1024, L=1, **kw) -> cs.GemmProblem:
    p = cs.GemmProblem(cs.DTYPE["bf16"], cs.DTYPE["bf16"], M, N, K, L, GOOD, cs.I64x3(K, 1, 0),
                       2 * GOOD, cs.I64x3(K, 1, 0), 3 * GOOD, cs.I64x3(N, 1, 0), None, None, 0)
    for k, v in kw.items():
        setattr(p, k, v)
    return p


def attention_problem(B=2, Sq=128, Sk=128, Hq=8, Hkv=8, D=128, **kw) -> cs.AttentionProblem:
    s3q, s3k = cs.I64x3(Sq * Hq * D, Hq * D, D), cs.I64x3(Sk * Hkv * D, Hkv * D, D)
    p = cs.AttentionProblem(cs.DTYPE["bf16"], 0, B, Sq, Sk, Hq, Hkv, D, GOOD, 2 * GOOD, 3 * GOOD, 4 * GOOD,
                            s3q, s3k, s3k, cs.I64x3(*s3q), 5 * GOOD, (ctypes.c_int64 * 2)(Hq * Sq, Sq), None, None,
                            0, 1, 0.0)
    for k, v in kw.items():
        setattr(p, k, v)
    return p


def run(lib, fn, d, p):
    """(rc, selection, message) of fx_{gemm,attention}_select, the selection pre-filled with junk."""
    sel = cs.Selection(variant=77, name=None, workspace_bytes=12345, max_clusters=9, splits=7)
    rc = getattr(lib.lib, fn)(ctypes.byref(d), ctypes.byref(p), ctypes.byref(sel))
    return rc, sel, lib.message()


def refused(lib, fn, p, match, d=None):
    rc, sel, msg = run(lib, fn, d or dev(), p)
    assert rc == cs.FX_ERR_INPUT, (rc, msg)
    assert match in msg, msg
    # the selection holds nothing of an earlier call
    assert (sel.variant, sel.name, sel.workspace_bytes, sel.max_clusters, sel.splits) == (-1, None, 0, 0, 0)
    return msg


def test_the_reference_problems_select(lib):
    rc, sel, msg = run(lib, "fx_gemm_select", dev(), gemm_problem())
    assert rc == 0 and sel.variant >= 0 and msg == ""
    rc, sel, msg = run(lib, "fx_attention_select", dev(), attention_problem(causal=1))
    assert rc == 0 and sel.variant >= 0 and msg == ""


# --- checked arithmetic ------------------------------------------------------------------------------
def test_attention_element_count_past_int64_is_refused(lib):
    """B=1, Sq=2^55, Hq=32, D=128: B·Sq·Hq·D = 2^67 used to wrap to 0 and return success with
    nothing to launch."""
    p = attention_problem(B=1, Sq=2**55, Sk=128, Hq=32, Hkv=8)
    refused(lib, "fx_attention_select", p, "q's element count")
    sel = cs.Selection()
    rc = lib.lib.fx_attention(ctypes.byref(dev()), ctypes.byref(p), None, ctypes.c_uint64(0), None, ctypes.byref(sel))
    assert rc == cs.FX_ERR_INPUT and sel.variant == -1


def test_attention_workspace_past_64_bits_is_refused(lib):
    """B = Hq = 65535, Sq = 2^31 - 1: the lse / split workspace byte count used to wrap in uint64."""
    p = attention_problem(B=65535, Sq=2**31 - 1, Sk=128, Hq=65535, Hkv=65535, lse=None)
    msg = refused(lib, "fx_attention_select", p, "overflows")
    assert "q's element count" in msg


@pytest.mark.parametrize("field,value", [("m", 2**62), ("k", 2**62), ("l", 2**40)])
def test_gemm_extent_past_int64_is_refused(lib, field, value):
    p = gemm_problem(**{field: value})
    if field == "k":  # row-major a and b of K = 2^62 columns: 1024 rows span 2^72 elements
        p.a_stride, p.b_stride = cs.I64x3(value, 1, 0), cs.I64x3(value, 1, 0)
    if field == "l":
        p.a_stride, p.b_stride, p.c_stride = cs.I64x3(1024, 1, 2**30), cs.I64x3(1024, 1, 2**30), cs.I64x3(1024, 1, 2**30)
    refused(lib, "fx_gemm_select", p, "overflows int64")


def test_sizes_past_the_32_bit_slots_are_refused_not_wrapped(lib):
    # M = 2^31: fits int64, not the kernels' 32-bit size slots: no variant takes it (named)
    rc, sel, msg = run(lib, "fx_gemm_select", dev(), gemm_problem(M=2**31))
    assert rc == cs.FX_ERR_NO_VARIANT and "32-bit" in msg and sel.variant == -1


# --- field names in messages -------------------------------------------------------------------------
@pytest.mark.parametrize("field", ["m", "n", "k", "l"])
def test_gemm_negative_size_names_the_field(lib, field):
    refused(lib, "fx_gemm_select", gemm_problem(**{field: -3}), f"{field} must not be negative, got -3")


@pytest.mark.parametrize("field", ["batch", "seqlen_q", "seqlen_k", "heads_q", "heads_kv"])
def test_attention_negative_size_names_the_field(lib, field):
    refused(lib, "fx_attention_select", attention_problem(**{field: -1}), f"{field} must not be negative")


def test_negative_stride_names_the_field(lib):
    p = gemm_problem()
    p.b_stride[1] = -1
    refused(lib, "fx_gemm_select", p, "b_stride[1] must not be negative")
    p = attention_problem()
    p.o_stride[2] = -8
    refused(lib, "fx_attention_select", p, "o_stride[2] must not be negative")


# --- output aliasing --------------------------------------------------------------------------------
@pytest.mark.parametrize("c_stride", [(0, 1, 0), (512, 1, 0), (1024, 0, 0)])
def test_gemm_c_with_overlapping_elements_is_refused(lib, c_stride):
    refused(lib, "fx_gemm_select", gemm_problem(c_stride=cs.I64x3(*c_stride)), "c: stride")


def test_gemm_c_overlapping_an_input_is_refused(lib):
    refused(lib, "fx_gemm_select", gemm_problem(c=GOOD + 1024 * 2 * 512), "c overlaps a")
    refused(lib, "fx_gemm_select", gemm_problem(c=2 * GOOD), "c overlaps b")


def test_attention_outputs_with_zero_strides_are_refused(lib):
    refused(lib, "fx_attention_select", attention_problem(o_stride=cs.I64x3(0, 0, 0)), "o: stride")
    refused(lib, "fx_attention_select", attention_problem(lse_stride=(ctypes.c_int64 * 2)(0, 0)), "lse: stride")


def test_attention_outputs_overlapping_inputs_are_refused(lib):
    refused(lib, "fx_attention_select", attention_problem(o=GOOD), "o overlaps q")
    refused(lib, "fx_attention_select", attention_problem(lse=4 * GOOD + 64), "overlaps")


def test_varlen_max_seqlen_must_cover_the_tokens(lib):
    for m in (0, -5):
        p = attention_problem(B=3, Sq=300, Sk=300, Hq=4, Hkv=4, D=128, varlen=1, causal=1, max_seqlen_q=m,
                              cu_seqlens_q=6 * GOOD, cu_seqlens_k=7 * GOOD)
        p.dtype = cs.DTYPE["f16"]
        p.q_stride[1], p.q_stride[2] = 4 * 128, 128
        p.k_stride[1], p.k_stride[2] = 4 * 128, 128
        p.v_stride[1], p.v_stride[2] = 4 * 128, 128
        p.o_stride[1], p.o_stride[2] = 4 * 128, 128
        p.lse_stride[1] = 300
        refused(lib, "fx_attention_select", p, "max_seqlen_q")
        p.max_seqlen_q = 100
        assert run(lib, "fx_attention_select", dev(), p)[0] == 0


# --- flags and devices -------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [2, 255, -1])
def test_flags_are_exactly_0_or_1(lib, value):
    refused(lib, "fx_attention_select", attention_problem(causal=value), f"causal must be 0 or 1, got {value}")
    refused(lib, "fx_attention_select", attention_problem(varlen=value), f"varlen must be 0 or 1, got {value}")
    refused(lib, "fx_gemm_select", gemm_problem(b_constant=value), f"b_constant must be 0 or 1, got {value}")


@pytest.mark.parametrize("cc", [(8, 100), (9, 1), (9, -1), (0, 0), (13, 0)])
def test_unknown_capabilities_are_refused(lib, cc):
    refused(lib, "fx_gemm_select", gemm_problem(), f"compute capability {cc[0]}.{cc[1]}", dev(cc))
    refused(lib, "fx_attention_select", attention_problem(), "compute capability", dev(cc))


def test_error_message_cleared_on_success(lib):
    refused(lib, "fx_gemm_select", gemm_problem(m=-1), "m must not be negative")
    rc, _, msg = run(lib, "fx_gemm_select", dev(), gemm_problem())
    assert rc == 0 and msg == ""
    refused(lib, "fx_attention_select", attention_problem(causal=3), "causal")
    rc, _, msg = run(lib, "fx_attention_select", dev(), attention_problem())
    assert rc == 0 and msg == ""


# --- Python ------------------------------------------------------------------------------------------
@pytest.fixture
def sim(test_bundle):
    b = Bundle.open(test_bundle, capability=(9, 0), device=H100)
    b.rec = Recorder()
    b.simulate(b.rec)
    return b


def bf(*shape):
    return torch.randn(*shape, dtype=torch.bfloat16)


def test_python_refuses_an_expanded_out(sim):
    a, w = bf(16, 64), bf(64, 64)
    with pytest.raises(InputError, match="overlapping elements"):
        sim.gemm(a, w, bf(1, 64).expand(16, 64))
    assert sim.rec.launched == []


def test_python_refuses_an_out_that_aliases_an_input(sim):
    a, w, out = bf(64, 64), bf(64, 64), bf(64, 64)
    sim.gemm(a, w, out)
    sim.gemm(a, w, out)  # the hot path
    assert len(sim.rec.launched) == 2
    for alias in (a, w, a.view(-1)[: 64 * 64].view(64, 64)):
        with pytest.raises(InputError, match="out overlaps"):
            sim.gemm(a, w, alias)  # same key as the hot path's: refused there too
    assert len(sim.rec.launched) == 2


def test_python_refuses_varlen_without_a_positive_max_seqlen(sim):
    q, cu = torch.randn(5, 4, 128, dtype=torch.float16), torch.tensor([0, 3, 5], dtype=torch.int32)
    for m in (0, -1):
        with pytest.raises(InputError, match="max_seqlen_q"):
            sim.attention(q, q, q, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=m, causal=True)
    assert sim.rec.launched == []


@pytest.mark.parametrize("cc", [(9, 1), (8, 100)])
def test_python_refuses_unknown_capabilities(test_bundle, cc):
    with pytest.raises(InputError, match="is not one an NVIDIA device has"):
        Bundle.open(test_bundle, capability=cc, device=H100)


def test_python_attention_uses_the_devices_sm_count(test_bundle, lib):
    """Decode B8 H32/8 Sk4096: 64 groups split 4 ways on 132 SMs, not at all on 48 (notes/
    attention-decode.md); the device given to Bundle.open decides, as in C."""
    q, kv = bf(8, 1, 32, 128), bf(8, 4096, 8, 128)
    picks = {}
    for sms in (48, 108, 114, 132):
        b = Bundle.open(test_bundle, capability=(9, 0), device={"name": "planned", "sm_count": sms})
        b.rec = Recorder()
        b.simulate(b.rec)
        b.attention(q, kv, kv, causal=True)
        picks[sms] = b.rec.launched[-1]
        p = attention_problem(B=8, Sq=1, Sk=4096, Hq=32, Hkv=8, causal=1)
        rc, sel, _ = run(lib, "fx_attention_select", dev(sms=sms), p)
        assert rc == 0 and sel.name.decode() == picks[sms]
    assert picks[48] != picks[132]


# --- the packed and block-scaled entry points ------------------------------------------------------------
def packed_problem(M=16, N=4096, K=4096, **kw):
    from factory.runtime import selector as rs

    p = rs.PackedProblem(M, N, K, GOOD, rs._I64x2(K, 1), 2 * GOOD, rs._I64x4((K // 64) * 512, 512, 16, 1),
                         3 * GOOD, rs._I64x2(N, 1), 4 * GOOD, 4 * GOOD + 64, 0)
    for k, v in kw.items():
        setattr(p, k, v)
    return p


def blockscaled_problem(M=256, N=256, K=256, fmt=3, **kw):
    from factory.runtime import selector as rs

    p = rs.BlockScaledProblem(fmt, 1, M, N, K, 1, GOOD, rs._I64x3(K, 1, 0), 2 * GOOD, rs._I64x3(K, 1, 0),
                              3 * GOOD, rs._I64x3(N, 1, 0), 4 * GOOD, 5 * GOOD, 6 * GOOD, 6 * GOOD + 64)
    for k, v in kw.items():
        setattr(p, k, v)
    return p


def test_packed_selection_and_refusals(lib):
    rc, sel, msg = run(lib, "fx_gemm_packed_select", dev(), packed_problem())
    assert rc == 0 and sel.name.decode().startswith("gemm_sm90_e4m3") and msg == ""
    rc, sel2, _ = run(lib, "fx_gemm_packed_select", dev(), packed_problem(b_constant=1))
    assert rc == 0 and sel2.name.decode() == sel.name.decode() + "_eb"  # one wave: the early_b twin
    refused(lib, "fx_gemm_packed_select", packed_problem(b_constant=2), "b_constant must be 0 or 1")
    refused(lib, "fx_gemm_packed_select", packed_problem(N=100), "N % 8 == 0")
    refused(lib, "fx_gemm_packed_select", packed_problem(m=-1), "m must not be negative")
    refused(lib, "fx_gemm_packed_select", packed_problem(c=GOOD), "c overlaps a")
    refused(lib, "fx_gemm_packed_select", packed_problem(c_stride=(ctypes.c_int64 * 2)(0, 1)), "c: stride")
    refused(lib, "fx_gemm_packed_select", packed_problem(), "compute capability 9.1", dev((9, 1)))
    rc, sel, msg = run(lib, "fx_gemm_packed_select", dev(), packed_problem(M=17))  # decode variants: M <= 16
    assert rc == cs.FX_ERR_NO_VARIANT and "use the unpacked weights" in msg and sel.variant == -1
    rc, sel, _ = run(lib, "fx_gemm_packed_select", dev(), packed_problem(M=0))
    assert rc == 0 and sel.variant == -1  # nothing to launch


def test_blockscaled_selection_and_refusals(lib):
    rc, sel, msg = run(lib, "fx_gemm_blockscaled_select", dev((10, 0), 148), blockscaled_problem())
    assert rc == 0 and "nvf4" in sel.name.decode() and sel.max_clusters > 0 and msg == ""
    rc, sel, msg = run(lib, "fx_gemm_blockscaled_select", dev((9, 0)), blockscaled_problem())
    assert rc == cs.FX_ERR_NO_VARIANT and "gemm_blockscaled" in msg  # built for sm_100f only
    refused(lib, "fx_gemm_blockscaled_select", blockscaled_problem(fmt=7), "unknown block-scaled format 7",
            dev((10, 0), 148))
    refused(lib, "fx_gemm_blockscaled_select", blockscaled_problem(K=48), "multiple of 32", dev((10, 0), 148))
    refused(lib, "fx_gemm_blockscaled_select", blockscaled_problem(c=2 * GOOD), "c overlaps b", dev((10, 0), 148))
    refused(lib, "fx_gemm_blockscaled_select", blockscaled_problem(fmt=1), "has no global scale", dev((10, 0), 148))
    refused(lib, "fx_gemm_blockscaled_select", blockscaled_problem(m=2**62, a_stride=cs.I64x3(2**62, 1, 0)),
            "overflows", dev((10, 0), 148))
