"""The fused glue ops without a GPU: the variants each tier builds, the argument contract, and
every refusal of ``bundle.rms_norm`` / ``bundle.rope_kvcache`` through a simulated bundle (CPU
tensors, launches recorded, not run): dtypes, shapes, sizes, strides, alignment, switches, a
variant the bundle lacks; the torch ops' fakes run the same checks.  The test-tier variants are
compiled (and SASS-checked, Blackwell included) by the test-tier bundle of conftest.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from conftest import TEST_TARGETS, Recorder  # noqa: E402

from factory.registry import enumerate_variants  # noqa: E402
from factory.runtime import Bundle  # noqa: E402
from factory.runtime.errors import InputError, NoVariantError  # noqa: E402

H100 = {"name": "planned H100", "sm_count": 132}
OPS = ["rms_norm", "rope_kvcache"]
bf16 = torch.bfloat16


def test_tiers():
    default = enumerate_variants(TEST_TARGETS, OPS, tier="default")
    assert len(default) <= 15
    names = {v.name for v in default}
    for t in ("sm89", "sm90", "sm100f"):  # fp8 caches: the conversions need 8.9
        assert f"rope_kvcache_{t}_bf16_t128_neox_ce4m3" in names
    assert "rope_kvcache_sm80_bf16_t128_neox_ce4m3" not in names
    for t in ("sm80", "sm90", "sm100f"):
        assert f"rms_norm_{t}_bf16_t256_c8_res" in names and f"rope_kvcache_{t}_bf16_t128_neox" in names
    assert "rms_norm_sm89_bf16_t256_c8_res_q8" in names  # fp8 conversions need 8.9
    assert not any(v.quant for v in default if v.op == "rms_norm" and v.target == "sm_80")
    full = enumerate_variants(TEST_TARGETS, OPS, tier="full")
    assert {v.dtype for v in full} == {"bf16", "f16"} and {v.target for v in full} >= {"sm_120a", "sm_100f"}
    assert all(v.max_n >= 16384 for v in default if v.op == "rms_norm")


def test_contract():
    v = next(v for v in enumerate_variants(["sm_90"], ["rms_norm"], tier="full")
             if v.residual and v.quant and v.chunks == 8)
    sig = v.signature()
    assert [a.name for a in sig.args] == ["x", "weight", "residual", "out", "scale", "eps"]
    assert sig.divisor("N") == 8 and sig.divisor("sXm") == 8
    r = enumerate_variants(["sm_90"], ["rope_kvcache"], tier="test")[0].signature()
    assert [a.name for a in r.args] == ["q", "k", "v", "positions", "cos_sin_cache", "k_cache", "v_cache",
                                       "slot_mapping"]
    assert r.divisor("R") == 16 and r.divisor("D") == 8


@pytest.fixture(scope="module")
def sim(test_bundle):
    b = Bundle.open(test_bundle, capability=(9, 0), device=H100)
    if not b.candidates("rms_norm") or not b.candidates("rope_kvcache"):
        pytest.skip("the test bundle has no fused ops")
    b.rec = Recorder()
    b.simulate(b.rec)
    return b


def test_rms_norm_launches_and_refusals(sim):
    x, w, r = torch.randn(6, 4096, dtype=bf16), torch.ones(4096, dtype=bf16), torch.randn(6, 4096, dtype=bf16)
    y = sim.rms_norm(x, w, 1e-6)
    assert y.shape == x.shape and y.dtype == bf16 and sim.rec.launched[-1] == "rms_norm_sm90_bf16_t256_c8"
    q, s = sim.rms_norm(x.view(2, 3, 4096), w, 1e-6, residual=r.view(2, 3, 4096), quantize=torch.float8_e4m3fn)
    assert q.shape == (2, 3, 4096) and q.dtype == torch.float8_e4m3fn and s.shape == (2, 3, 1)
    assert sim.rec.launched[-1] == "rms_norm_sm90_bf16_t256_c8_res_q8"
    bad = [
        (lambda: sim.rms_norm(x.float(), w, 1e-6), "bfloat16 or float16"),
        (lambda: sim.rms_norm(x, w.half(), 1e-6), "weight must be"),
        (lambda: sim.rms_norm(x, w[:8], 1e-6), "shape"),
        (lambda: sim.rms_norm(x[:, :4092], w[:4092], 1e-6), "multiple of 8"),
        (lambda: sim.rms_norm(x, w, float("inf")), "eps"),
        (lambda: sim.rms_norm(x, w, "1e-6"), "eps"),
        (lambda: sim.rms_norm(x, w, 1e-6, residual=r[:3]), "residual must match"),
        (lambda: sim.rms_norm(x, w, 1e-6, quantize=torch.float8_e5m2), "quantize"),
        (lambda: sim.rms_norm(x, w, 1e-6, out=torch.empty(6, 4096)), "out must be"),
        (lambda: sim.rms_norm(x[:, 4:4092], w[:4088], 1e-6), "aligned"),
        (lambda: sim.rms_norm(x.t(), w[:6], 1e-6), "contiguous|multiple"),
    ]
    for f, msg in bad:
        with pytest.raises(InputError, match=msg):
            f()
    with pytest.raises(NoVariantError):  # rows past 16384
        sim.rms_norm(torch.randn(2, 16392, dtype=bf16), torch.ones(16392, dtype=bf16), 1e-6)
    with pytest.raises(NoVariantError):  # the test tier has no f16 variant
        sim.rms_norm(x.half(), w.half(), 1e-6)


def test_rms_norm_no_fp8_on_ampere(test_bundle):
    b = Bundle.open(test_bundle, capability=(8, 0))
    b.simulate(Recorder())
    x, w = torch.randn(2, 4096, dtype=bf16), torch.ones(4096, dtype=bf16)
    b.rms_norm(x, w, 1e-6, residual=torch.randn_like(x))
    with pytest.raises(NoVariantError, match="rms_norm"):
        b.rms_norm(x, w, 1e-6, residual=torch.randn_like(x), quantize=torch.float8_e4m3fn)


def rope_args(t=5, hq=8, hkv=2, d=128, r=128):
    return dict(q=torch.randn(t, hq, d, dtype=bf16), k=torch.randn(t, hkv, d, dtype=bf16),
                v=torch.randn(t, hkv, d, dtype=bf16), positions=torch.arange(t),
                cos_sin_cache=torch.randn(32, r), k_cache=torch.zeros(3, 16, hkv, d, dtype=bf16),
                v_cache=torch.zeros(3, 16, hkv, d, dtype=bf16), slot_mapping=torch.arange(t))


def test_rope_kvcache_launches_and_refusals(sim):
    a = rope_args()
    sim.rope_kvcache(**a)
    assert sim.rec.launched[-1] == "rope_kvcache_sm90_bf16_t128_neox"
    sim.rope_kvcache(**a, neox=False)
    assert sim.rec.launched[-1] == "rope_kvcache_sm90_bf16_t128"
    flat = dict(a, q=a["q"].view(5, -1), k=a["k"].view(5, -1), v=a["v"].view(5, -1))
    sim.rope_kvcache(**flat)
    sim.rope_kvcache(**rope_args(r=64))  # partial rotary
    n0 = len(sim.rec.launched)
    sim.rope_kvcache(**dict(a, q=a["q"][:, :0]))  # q of zero heads: k only (attention rotates q)
    assert sim.rec.launched[n0:] == ["rope_kvcache_sm90_bf16_t128_neox"]
    cases = [
        (dict(positions=torch.arange(5, dtype=torch.int32)), "positions must be int64"),
        (dict(slot_mapping=torch.arange(4)), "slot_mapping must be int64"),
        (dict(cos_sin_cache=torch.randn(32, 128, dtype=bf16)), "float32"),
        (dict(cos_sin_cache=torch.randn(32, 40)), "multiple of 16"),
        (dict(cos_sin_cache=torch.randn(32, 256)), "at most head_dim"),
        (dict(k=torch.randn(5, 3, 128, dtype=bf16), v=torch.randn(5, 3, 128, dtype=bf16)), "heads"),
        (dict(k_cache=torch.zeros(3, 16, 2, 128, dtype=torch.float16)), "k_cache must be"),
        (dict(v_cache=torch.zeros(2, 16, 2, 128, dtype=bf16)), "k_cache and v_cache"),
        (dict(q=torch.randn(5, 8, 64, dtype=bf16)), "head_dim"),
        (dict(q=torch.randn(5, 1000, dtype=bf16)), "multiple of head_dim"),
        (dict(k_cache=torch.zeros(3, 16, 2, 128, dtype=bf16)[:, :, :, :], q=torch.randn(5, 8, 128)), "q must be"),
        (dict(q=torch.randn(5, 8, 136, dtype=bf16)[..., 4:132]), "aligned"),
    ]
    for change, msg in cases:
        with pytest.raises(InputError, match=msg):
            sim.rope_kvcache(**{**a, **change})
    b, sq = 2, 3
    tab = dict(a, q=torch.randn(b, sq, 8, 128, dtype=bf16), k=torch.randn(b, sq, 2, 128, dtype=bf16),
               v=torch.randn(b, sq, 2, 128, dtype=bf16), positions=None, slot_mapping=None,
               block_table=torch.zeros(b, 3, dtype=torch.int32), cache_seqlens=torch.zeros(b, dtype=torch.int32))
    sim.rope_kvcache(**tab)
    assert sim.rec.launched[-1] == "rope_kvcache_sm90_bf16_t128_neox_bt"
    tcases = [
        (dict(positions=torch.arange(6)), "either"),
        (dict(cache_seqlens=None), "go together"),
        (dict(block_table=torch.zeros(b, 3, dtype=torch.int64)), "block_table must be int32"),
        (dict(cache_seqlens=torch.zeros(3, dtype=torch.int32)), "cache_seqlens must be"),
        (dict(q=torch.randn(3, sq, 8, 128, dtype=bf16)), "batch"),
        (dict(q=tab["q"].view(6, 8, 128)), "with block_table"),
    ]
    for change, msg in tcases:
        with pytest.raises(InputError, match=msg):
            sim.rope_kvcache(**{**tab, **change})
    with pytest.raises(InputError, match="4-dimensional"):
        sim.rope_kvcache(**dict(a, q=tab["q"]))
    sim.rope_kvcache(**dict(a, positions=None, cos_sin_cache=torch.randn(5, 128)))  # per-token cos/sin rows
    assert sim.rec.launched[-1] == "rope_kvcache_sm90_bf16_t128_neox"
    with pytest.raises(InputError, match="one row per token"):
        sim.rope_kvcache(**dict(a, positions=None))
    with pytest.raises(InputError, match="slot_mapping is needed"):
        sim.rope_kvcache(**dict(a, slot_mapping=None))
    with pytest.raises(InputError, match="rotary_dim"):
        sim.rope_kvcache(**a, rotary_dim=64)
    with pytest.raises(InputError, match="neox"):
        sim.rope_kvcache(**a, neox="yes")


def test_rope_kvcache_fp8_caches(sim):
    """e4m3 caches: the ce4m3 build (per-tensor and per-head scales), and every refusal of the
    scales and cache dtypes."""
    f8 = torch.float8_e4m3fn
    a = dict(rope_args(), k_cache=torch.zeros(3, 16, 2, 128, dtype=f8), v_cache=torch.zeros(3, 16, 2, 128, dtype=f8))
    ks, vs = torch.tensor([0.5]), torch.tensor([0.25, 2.0])
    sim.rope_kvcache(**a, k_scale=ks, v_scale=vs)
    assert sim.rec.launched[-1] == "rope_kvcache_sm90_bf16_t128_neox_ce4m3"
    cases = [
        (dict(k_scale=None, v_scale=vs), "needs k_scale and v_scale"),
        (dict(k_scale=ks, v_scale=torch.ones(3)), "v_scale must be a contiguous float32 tensor of 1"),
        (dict(k_scale=ks.double(), v_scale=vs), "k_scale must be a contiguous float32"),
        (dict(k_scale=torch.ones(2, 2)[:, 0], v_scale=vs), "k_scale must be a contiguous"),
        (dict(k_scale=ks, v_scale=vs, v_cache=torch.zeros(3, 16, 2, 128, dtype=bf16)), "v_cache must be"),
    ]
    for change, msg in cases:
        with pytest.raises(InputError, match=msg):
            sim.rope_kvcache(**{**a, **change})
    with pytest.raises(InputError, match="k_scale applies to float8_e4m3fn caches only"):
        sim.rope_kvcache(**rope_args(), k_scale=ks, v_scale=vs)
    with pytest.raises(NoVariantError, match="into e4m3 caches"):
        sim.rope_kvcache(**a, k_scale=ks, v_scale=vs, neox=False)


def test_fakes_check(sim):
    from torch._subclasses.fake_tensor import FakeTensorMode

    ops = sim.torch_ops()
    with FakeTensorMode() as mode:
        x = mode.from_tensor(torch.randn(3, 4096, dtype=bf16))
        w = mode.from_tensor(torch.ones(4096, dtype=bf16))
        y = ops.rms_norm(x, w, 1e-6)
        assert y.shape == (3, 4096) and y.dtype == bf16
        r = mode.from_tensor(torch.randn(3, 4096, dtype=bf16))
        q, s = ops.rms_norm_fp8(x, w, 1e-6, r)
        assert q.dtype == torch.float8_e4m3fn and s.shape == (3, 1)
        with pytest.raises(InputError):
            ops.rms_norm(x, mode.from_tensor(torch.ones(4000, dtype=bf16)), 1e-6)
        with pytest.raises(NoVariantError):  # the test tier has no plain fp8 variant for sm_90
            ops.rms_norm_fp8(x, w, 1e-6, None)
        a = {k: mode.from_tensor(v) for k, v in rope_args().items()}
        ops.rope_kvcache(a["q"], a["k"], a["v"], a["positions"], a["cos_sin_cache"], a["k_cache"], a["v_cache"],
                         a["slot_mapping"], True)
        b, sq = 2, 3
        qt, kt, vt = (mode.from_tensor(torch.randn(b, sq, h, 128, dtype=bf16)) for h in (8, 2, 2))
        ops.rope_kvcache(qt, kt, vt, None, a["cos_sin_cache"], a["k_cache"], a["v_cache"], None, True,
                         mode.from_tensor(torch.zeros(b, 3, dtype=torch.int32)),
                         mode.from_tensor(torch.zeros(b, dtype=torch.int32)))
        with pytest.raises(NoVariantError):  # the test tier has no interleaved block-table variant
            ops.rope_kvcache(qt, kt, vt, None, a["cos_sin_cache"], a["k_cache"], a["v_cache"], None, False,
                             mode.from_tensor(torch.zeros(b, 3, dtype=torch.int32)),
                             mode.from_tensor(torch.zeros(b, dtype=torch.int32)))
        with pytest.raises(InputError):
            ops.rope_kvcache(a["q"], a["k"], a["v"], a["positions"].int(), a["cos_sin_cache"], a["k_cache"],
                             a["v_cache"], a["slot_mapping"], True)


def test_hot_path(sim):
    """A repeated layout launches through the packed arguments of its first call; what the key
    does not fix (types, alignment, autograd) is still refused."""
    x, w = torch.randn(4, 2048, dtype=bf16), torch.ones(2048, dtype=bf16)
    r = torch.randn(4, 2048, dtype=bf16)
    n0 = len(sim.rec.launched)
    for _ in range(3):
        q, s = sim.rms_norm(x, w, 1e-6, residual=r, quantize=torch.float8_e4m3fn)
        assert q.shape == (4, 2048) and s.shape == (4, 1)
    assert len(sim.rec.launched) == n0 + 3
    assert any(k[:2] == ("hot", "rms_norm") for k in sim.selections if isinstance(k, tuple))
    buf = torch.randn(4 * 2048 + 4, dtype=bf16)
    with pytest.raises(InputError, match="aligned"):
        sim.rms_norm(buf[4:].view(4, 2048), w, 1e-6, residual=r, quantize=torch.float8_e4m3fn)
    with pytest.raises(InputError, match="grad"):
        sim.rms_norm(x, w.clone().requires_grad_(), 1e-6, residual=r, quantize=torch.float8_e4m3fn)
    a = rope_args()
    n0 = len(sim.rec.launched)
    for _ in range(3):
        sim.rope_kvcache(**a)
    assert len(sim.rec.launched) == n0 + 3
    with pytest.raises(InputError):
        sim.rope_kvcache(**dict(a, neox=1))


def test_opcheck(sim):
    from test_torch_ops import CPU_CHECKS, FP8_CPU_CHECKS

    kf = sim.torch_ops()
    x, w, r = torch.randn(3, 4096, dtype=bf16), torch.ones(4096, dtype=bf16), torch.randn(3, 4096, dtype=bf16)
    torch.library.opcheck(kf.rms_norm, (x, w, 1e-6), test_utils=CPU_CHECKS)
    torch.library.opcheck(kf.rms_norm_fp8, (x, w, 1e-6, r), test_utils=FP8_CPU_CHECKS)
    a = rope_args()
    torch.library.opcheck(kf.rope_kvcache, (a["q"], a["k"], a["v"], a["positions"], a["cos_sin_cache"], a["k_cache"],
                                            a["v_cache"], a["slot_mapping"]), test_utils=CPU_CHECKS)


def test_traced_calls_go_through_the_ops(sim):
    """``bundle.rms_norm`` / ``bundle.rope_kvcache`` inside torch.compile trace as the torch ops
    (one graph, no break; Dynamo only: ``backend="eager"``)."""
    x, w, r = torch.randn(3, 4096, dtype=bf16), torch.ones(4096, dtype=bf16), torch.randn(3, 4096, dtype=bf16)
    a = rope_args()
    n0 = len(sim.rec.launched)

    def step(x, w, r, q, k, v, pos, cs, kc, vc, sl):
        y, s = sim.rms_norm(x, w, 1e-6, residual=r, quantize=torch.float8_e4m3fn)
        sim.rope_kvcache(q, k, v, pos, cs, kc, vc, sl)
        return y, s

    torch._dynamo.reset()
    y, s = torch.compile(step, fullgraph=True, backend="eager")(x, w, r, *a.values())
    assert y.dtype == torch.float8_e4m3fn and s.shape == (3, 1)
    assert sim.rec.launched[n0:] == ["rms_norm_sm90_bf16_t256_c8_res_q8", "rope_kvcache_sm90_bf16_t128_neox"]
