"""torch.ops.kernel_factory on this GPU-less machine, through a simulated bundle (CPU tensors, a
launcher that records): schemas, fake implementations, autograd registration (torch.library.opcheck),
and torch.compile(fullgraph=True) tracing them with dynamic batch sizes and no recompiles.
Values are checked on the GPU (tests/test_torch_ops_gpu.py)."""

from __future__ import annotations

import pytest
import torch

from conftest import Recorder
from factory.runtime import Bundle, InputError

H100 = {"name": "planned H100", "sm_count": 132}
CPU_CHECKS = ("test_schema", "test_autograd_registration", "test_faketensor")
FP8_CPU_CHECKS = CPU_CHECKS[1:]  # test_schema multiplies inputs, which torch's CPU fp8 cannot




@pytest.fixture
def ops(test_bundle):
    b = Bundle.open(test_bundle, capability=(9, 0), device=H100)
    b.rec = Recorder()
    b.simulate(b.rec)
    return b, b.torch_ops()


def bf(*s):
    return torch.randn(*s, dtype=torch.bfloat16)


def e4m3(*s):
    return torch.randn(*s).to(torch.float8_e4m3fn)


def test_opcheck_every_op(ops):
    b, kf = ops
    torch.library.opcheck(kf.gemm, (bf(16, 64), bf(32, 64)), test_utils=CPU_CHECKS)
    torch.library.opcheck(kf.gemm, (bf(2, 16, 64), bf(2, 32, 64)), {"out_dtype": torch.bfloat16}, test_utils=CPU_CHECKS)
    torch.library.opcheck(kf.gemm, (e4m3(16, 64), e4m3(32, 64)), {"scale_a": torch.ones(1), "scale_b": torch.ones(1)},
                          test_utils=FP8_CPU_CHECKS)
    torch.library.opcheck(kf.gemm_out, (bf(16, 64), bf(32, 64), torch.empty(16, 32, dtype=torch.bfloat16)),
                          test_utils=CPU_CHECKS)
    packed = b.pack_b(e4m3(256, 2048)).data
    torch.library.opcheck(kf.gemm_packed, (e4m3(8, 2048), packed), test_utils=FP8_CPU_CHECKS)
    q = bf(1, 8, 2, 64)
    torch.library.opcheck(kf.attention, (q, q, q), {"causal": False}, test_utils=CPU_CHECKS)
    t = torch.randn(5, 4, 128, dtype=torch.float16)
    cu = torch.tensor([0, 3, 5], dtype=torch.int32)
    torch.library.opcheck(kf.attention, (t, t, t), {"causal": True, "cu_seqlens_q": cu, "cu_seqlens_k": cu,
                                                     "max_seqlen_q": 3}, test_utils=CPU_CHECKS)
    assert len(b.rec.launched) >= 7


def test_ops_run_the_bundles_checks(ops):
    b, kf = ops
    with pytest.raises(InputError, match="out must have shape"):
        kf.gemm_out(bf(16, 64), bf(32, 64), torch.empty(32, 16, dtype=torch.bfloat16))
    with pytest.raises(InputError, match="dtypes differ"):
        kf.gemm(bf(16, 64), torch.randn(32, 64))
    out = kf.gemm(bf(16, 64), bf(32, 64))
    assert out.shape == (16, 32) and b.rec.launched


def test_fake_outputs_match_the_real_ones(ops):
    b, kf = ops
    from torch._subclasses.fake_tensor import FakeTensorMode

    q = bf(2, 8, 4, 64).transpose(1, 2).contiguous().transpose(1, 2)  # non-contiguous q: o keeps its strides
    cases = [(kf.gemm, (bf(3, 16, 64), bf(3, 32, 64)), {}),
             (kf.gemm, (e4m3(16, 64), e4m3(32, 64)), {}),
             (kf.gemm_packed, (e4m3(4, 2048), b.pack_b(e4m3(256, 2048)).data), {}),
             (kf.attention, (q, bf(2, 8, 2, 64), bf(2, 8, 2, 64)), {"causal": False})]
    for op, args, kw in cases:
        real = op(*args, **kw)
        with FakeTensorMode() as mode:
            fake = op(*(mode.from_tensor(a) for a in args), **kw)
        for r, f in zip(real if isinstance(real, tuple) else (real,), fake if isinstance(fake, tuple) else (fake,)):
            assert (r.shape, r.dtype, r.stride()) == (f.shape, f.dtype, f.stride()), op


def test_compile_fullgraph_dynamic_batch_no_recompiles(ops):
    b, kf = ops
    import torch._dynamo

    torch._dynamo.reset()
    w1, w2 = bf(128, 64), bf(64, 128)

    def block(x):
        h = kf.gemm(x, w1)
        o, lse = kf.attention(h.view(x.shape[0], 1, 2, 64), h.view(x.shape[0], 1, 2, 64), h.view(x.shape[0], 1, 2, 64))
        out = torch.empty(x.shape[0], 64, dtype=torch.bfloat16)
        kf.gemm_out(o.reshape(x.shape[0], 128), w2, out)
        return out

    compiled = torch.compile(block, fullgraph=True, backend="aot_eager", dynamic=True)
    from torch._dynamo.utils import counters

    counters.clear()
    for m in (16, 24, 40, 64):
        assert compiled(bf(m, 64)).shape == (m, 64)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert not counters["graph_break"], dict(counters["graph_break"])


def _outcome(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the exception is what is compared
        return type(e).__name__, str(e)
    return None


def f16(*s):
    return torch.randn(*s, dtype=torch.float16)


def test_fakes_refuse_what_the_real_ops_refuse(ops):
    """Each bad call raises the same exception, word for word, from the real op (CPU tensors on the
    simulated bundle) and from its fake (FakeTensors: metadata only, as under torch.compile)."""
    b, kf = ops
    from torch._subclasses.fake_tensor import FakeTensorMode

    packed = b.pack_b(e4m3(256, 2048)).data
    q = bf(1, 8, 2, 64)
    cases = [
        ("K mismatch", kf.gemm, (bf(16, 64), bf(32, 32)), {}),
        ("3-D x 2-D", kf.gemm, (bf(2, 16, 64), bf(32, 64)), {}),
        ("dtypes differ", kf.gemm, (bf(16, 64), torch.randn(32, 64)), {}),
        ("no f16 gemm built", kf.gemm, (f16(16, 64), f16(32, 64)), {}),
        ("K not a multiple of 8", kf.gemm, (bf(16, 60), bf(32, 60)), {}),
        ("out dtype not written", kf.gemm, (bf(16, 64), bf(32, 64)), {"out_dtype": torch.int32}),
        ("scales on bf16", kf.gemm, (bf(16, 64), bf(32, 64)), {"scale_a": torch.ones(1)}),
        ("fp8 scale of 2 elements", kf.gemm, (e4m3(16, 64), e4m3(32, 64)), {"scale_a": torch.ones(2)}),
        ("out shape", kf.gemm_out, (bf(16, 64), bf(32, 64), torch.empty(32, 16, dtype=torch.bfloat16)), {}),
        ("packed K mismatch", kf.gemm_packed, (e4m3(8, 1024), packed), {}),
        ("packed a bf16", kf.gemm_packed, (bf(8, 2048), packed), {}),
        ("head_dim 96", kf.attention, (bf(1, 8, 2, 96),) * 3, {}),
        ("head_dim 256 not built", kf.attention, (bf(1, 8, 2, 256),) * 3, {}),
        ("q k dtypes differ", kf.attention, (q, f16(1, 8, 2, 64), f16(1, 8, 2, 64)), {}),
        ("GQA heads", kf.attention, (bf(1, 8, 3, 64), bf(1, 8, 2, 64), bf(1, 8, 2, 64)), {}),
        ("batch differs", kf.attention, (q, bf(2, 8, 2, 64), bf(2, 8, 2, 64)), {}),
        ("3-D q dense", kf.attention, (bf(8, 2, 64), q, q), {}),
        ("negative scale", kf.attention, (q, q, q), {"softmax_scale": -1.0}),
        ("head_dim strided", kf.attention, (bf(1, 8, 2, 128)[..., ::2], q, q), {}),
        ("no dense f16 kernel", kf.attention, (f16(1, 8, 2, 128),) * 3, {"causal": True}),
        ("varlen without cu_seqlens_k", kf.attention, (bf(5, 2, 128),) * 3,
         {"cu_seqlens_q": torch.tensor([0, 5], dtype=torch.int32)}),
    ]
    for what, op, args, kw in cases:
        real = _outcome(lambda: op(*args, **kw))
        assert real is not None and real[0] in ("InputError", "NoVariantError"), (what, real)
        with FakeTensorMode() as mode:
            fargs = [mode.from_tensor(a) for a in args]
            fkw = {k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
            fake = _outcome(lambda: op(*fargs, **fkw))
        assert fake == real, (what, real, fake)


def test_each_bundle_has_its_own_op_set(test_bundle, ops):
    b1, kf1 = ops
    b2 = Bundle.open(test_bundle, capability=(9, 0), device=H100)
    b2.rec = Recorder()
    b2.simulate(b2.rec)
    kf2 = b2.torch_ops()
    assert kf2 is not kf1 and b1.torch_ops() is kf1 and b2.torch_ops() is kf2
    kf1.gemm(bf(16, 64), bf(32, 64))
    assert b1.rec.launched and not b2.rec.launched
    kf2.gemm(bf(16, 64), bf(32, 64))
    assert len(b2.rec.launched) == 1 and len(b1.rec.launched) == 1


def test_plain_calls_compile_fullgraph(ops):
    """bundle.gemm / bundle.attention themselves under torch.compile(fullgraph=True): traced as
    the bundle's torch ops (no graph break), and a bad call refused at trace time."""
    b, _ = ops
    import torch._dynamo

    torch._dynamo.reset()
    w = bf(128, 64)

    def layer(x):
        h = b.gemm(x, w)
        hv = h.view(x.shape[0], 1, 2, 64)
        o = b.attention(hv, hv, hv)
        out = torch.empty(x.shape[0], 128, dtype=torch.bfloat16)
        b.gemm(o.reshape(x.shape[0], 128), bf(128, 128), out)
        return out

    compiled = torch.compile(layer, fullgraph=True, backend="eager")
    n = len(b.rec.launched)
    assert compiled(bf(16, 64)).shape == (16, 128)
    assert len(b.rec.launched) == n + 3
    bad = torch.compile(lambda x: b.gemm(x, bf(32, 48)), fullgraph=True, backend="eager")
    with pytest.raises(Exception) as e:  # Dynamo wraps what the fake raised at trace time
        bad(bf(16, 64))
    assert "shapes do not match for a·bᵀ" in str(e.value)
    assert len(b.rec.launched) == n + 3


def test_attention_with_switches_compiles_fullgraph(ops):
    """bundle.attention with a window / softcap / sinks under torch.compile(fullgraph=True): the
    page views and tables are traced torch ops and the kernel the attention_kvcache op."""
    b, _ = ops
    if not any(e.get("sinks") for e in b.candidates("attention_kvcache")):
        pytest.skip("the test bundle has no window/softcap/sinks attention_kvcache build")
    import torch._dynamo

    torch._dynamo.reset()
    sinks = torch.zeros(32)

    def step(q, k, v):
        return b.attention(q, k, v, True, None, window_size=(64, 0), softcap=20.0, sinks=sinks)

    compiled = torch.compile(step, fullgraph=True, backend="eager")
    n = len(b.rec.launched)
    q, k, v = bf(2, 1, 32, 128), bf(2, 1024, 8, 128), bf(2, 1024, 8, 128)
    assert compiled(q, k, v).shape == q.shape
    assert len(b.rec.launched) == n + 1 and b.rec.launched[-1].endswith("_win_cap_sink")
