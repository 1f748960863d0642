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
