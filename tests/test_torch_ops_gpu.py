"""torch.ops.kernel_factory on the GPU: opcheck with every check, a small block compiled with
torch.compile(fullgraph=True) (inductor), with mode="reduce-overhead" (CUDA graphs) and under a
manual torch.cuda.graph capture, each against a float32 reference and equal to eager; dynamic batch sizes without recompiles; a
first call inside a capture without preload raises a clear error and leaves the process usable."""

from __future__ import annotations


import pytest

torch = pytest.importorskip("torch")

from conftest import GPU_BUNDLE as BUNDLE
from conftest import gpu_marks

pytestmark = gpu_marks()


@pytest.fixture(scope="module")
def kf():
    from factory.runtime import Bundle

    b = Bundle.open(BUNDLE)
    return b, b.torch_ops()


def bf(*s):
    return torch.randn(*s, dtype=torch.bfloat16, device="cuda")


def test_opcheck_on_the_gpu(kf):
    b, ops = kf
    one = torch.ones(1, device="cuda")
    e4 = lambda *s: torch.randn(*s, device="cuda").to(torch.float8_e4m3fn)  # noqa: E731
    torch.library.opcheck(ops.gemm, (bf(64, 256), bf(128, 256)))
    torch.library.opcheck(ops.gemm, (bf(2, 64, 256), bf(2, 128, 256)), {"out_dtype": torch.float32})
    fp8_checks = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")  # test_schema
    # multiplies the inputs, which torch cannot do in fp8
    torch.library.opcheck(ops.gemm, (e4(64, 256), e4(128, 256)), {"scale_a": one, "scale_b": one * 0.5},
                          test_utils=fp8_checks)
    torch.library.opcheck(ops.gemm_out, (bf(64, 256), bf(128, 256), torch.empty(64, 128, dtype=torch.bfloat16, device="cuda")))
    torch.library.opcheck(ops.gemm_packed, (e4(16, 2048), b.pack_b(e4(256, 2048)).data), {"scale_a": one},
                          test_utils=fp8_checks)
    q = bf(2, 128, 8, 64)
    torch.library.opcheck(ops.attention, (q, bf(2, 128, 2, 64), bf(2, 128, 2, 64)), {"causal": True})
    t, cu = bf(300, 4, 128), torch.tensor([0, 100, 300], dtype=torch.int32, device="cuda")
    torch.library.opcheck(ops.attention, (t, t, t), {"cu_seqlens_q": cu, "cu_seqlens_k": cu, "max_seqlen_q": 200})


class Block(torch.nn.Module):
    """QKV projection, causal GQA attention, output projection: bundle ops only."""

    def __init__(self, ops, d=512, hq=8, hkv=2, hd=64):
        super().__init__()
        self.ops, self.hq, self.hkv, self.hd = ops, hq, hkv, hd
        self.wqkv = torch.nn.Parameter(torch.randn((hq + 2 * hkv) * hd, d, dtype=torch.bfloat16, device="cuda") / d ** 0.5,
                                       requires_grad=False)
        self.wo = torch.nn.Parameter(torch.randn(d, hq * hd, dtype=torch.bfloat16, device="cuda") / d ** 0.5,
                                     requires_grad=False)

    def forward(self, x):  # x (B, S, d)
        B, S, d = x.shape
        qkv = self.ops.gemm(x.reshape(B * S, d), self.wqkv).view(B, S, self.hq + 2 * self.hkv, self.hd)
        q, k, v = qkv.split([self.hq, self.hkv, self.hkv], dim=2)
        o, _ = self.ops.attention(q.contiguous(), k.contiguous(), v.contiguous(), causal=True)
        out = torch.empty(B * S, d, dtype=torch.bfloat16, device=x.device)
        self.ops.gemm_out(o.reshape(B * S, -1), self.wo, out)
        return out.view(B, S, d) + x


def block_reference(block, x):
    """The block in float32 from plain torch (matmuls, factory.testing.attention_reference), rounded
    to bf16 where the block's ops return bf16: an independent reference for every mode below."""
    from factory.testing import attention_reference

    B, S, d = x.shape
    qkv = (x.reshape(B * S, d).float() @ block.wqkv.float().T).bfloat16().view(B, S, -1, block.hd)
    q, k, v = qkv.split([block.hq, block.hkv, block.hkv], dim=2)
    o = attention_reference(q, k, v, True, block.hd ** -0.5)[0].bfloat16()
    return (o.reshape(B * S, -1).float() @ block.wo.float().T).bfloat16().view(B, S, d) + x


def assert_matches_float32(y, block, x, what):
    from factory.testing import rel_error

    err = rel_error(y, block_reference(block, x))
    assert err < 1e-2, f"{what}: relative error {err:.2e} against float32"


def test_compile_graphs_and_eager_agree(kf):
    b, ops = kf
    import torch._dynamo
    from torch._dynamo.utils import counters

    block = Block(ops)
    x = bf(2, 128, 512)
    with torch.inference_mode():
        ref = block(x)
        assert_matches_float32(ref, block, x, "eager")
        torch._dynamo.reset()
        counters.clear()
        full = torch.compile(block, fullgraph=True)
        y = full(x)
        assert_matches_float32(y, block, x, "torch.compile")
        torch.testing.assert_close(y, ref, rtol=2e-2, atol=2e-2)
        for bsz in (3, 4, 6):  # dynamic batch: one recompile at most (the first size change)
            xb = bf(bsz, 128, 512)
            torch._dynamo.mark_dynamic(xb, 0)
            yb = full(xb)
            assert_matches_float32(yb, block, xb, f"torch.compile, batch {bsz}")
            torch.testing.assert_close(yb, block(xb), rtol=2e-2, atol=2e-2)
        assert not counters["graph_break"], dict(counters["graph_break"])
        assert counters["stats"]["unique_graphs"] <= 2, dict(counters["stats"])
        torch._dynamo.reset()
        ro = torch.compile(block, mode="reduce-overhead", fullgraph=True)
        for _ in range(3):  # warm-up runs, then graph replays
            y = ro(x)
        assert_matches_float32(y.clone(), block, x, "reduce-overhead")
        torch.testing.assert_close(y.clone(), ref, rtol=2e-2, atol=2e-2)
        b.preload()
        static_x = x.clone()
        block(static_x)  # warm on the side stream as torch.cuda.graph expects
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            block(static_x)
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g):
            static_y = block(static_x)
        x2 = bf(2, 128, 512)
        static_x.copy_(x2)
        static_y.fill_(float("nan"))
        g.replay()
        assert_matches_float32(static_y, block, x2, "graph replay")
        torch.testing.assert_close(static_y, block(x2), rtol=2e-2, atol=2e-2)


class Plain:
    """The bundle's plain calls with the op set's signatures (for Block)."""

    def __init__(self, b):
        self.b = b

    def gemm(self, a, w):
        return self.b.gemm(a, w)

    def gemm_out(self, a, w, out):
        self.b.gemm(a, w, out)

    def attention(self, q, k, v, causal):
        return self.b.attention(q, k, v, causal=causal, return_lse=True)


def test_plain_calls_compile_fullgraph_on_the_gpu(kf):
    """bundle.gemm / bundle.attention themselves under torch.compile(fullgraph=True) (inductor):
    no graph break, the float32 reference matched; a call the op refuses fails while tracing."""
    b, _ = kf
    import torch._dynamo
    from torch._dynamo.utils import counters

    block = Block(Plain(b))
    x = bf(2, 128, 512)
    with torch.inference_mode():
        torch._dynamo.reset()
        counters.clear()
        y = torch.compile(block, fullgraph=True)(x)
        assert_matches_float32(y, block, x, "plain calls under torch.compile")
        assert not counters["graph_break"], dict(counters["graph_break"])
        bad = torch.compile(lambda t: b.gemm(t, bf(64, 384)), fullgraph=True)
        with pytest.raises(Exception, match="shapes do not match"):
            bad(bf(32, 512))


def test_first_load_inside_a_capture_is_a_clear_error():
    from test_validation_gpu import run_case

    call = ("g = torch.cuda.CUDAGraph(); s = torch.cuda.Stream(); x = torch.randn(64, 256, **bf)\n"
            "            try:\n"
            "                with torch.cuda.stream(s), torch.cuda.graph(g, stream=s):\n"
            "                    b.gemm(x, w)\n"
            "            finally:\n"
            "                torch.cuda.synchronize()")
    r = run_case(call)
    assert "LaunchError" in r.stdout and "call bundle.preload()" in r.stdout, r.stdout + r.stderr
    assert r.returncode == 0 and "CONTEXT OK" in r.stdout, r.stdout + r.stderr


def test_reduce_overhead_with_counting_and_split_kernels(kf):
    """torch.compile(mode="reduce-overhead") (torch's CUDA-graph trees, which refuse any tensor left
    alive in their pool that is not an output) of the kernels that take runtime-kept words: GEMMs the
    selection may split along K (2048x2112x7168; a few-tile 64x2112x7168), causal attention over many
    short sequences (the dynamic-schedule twins count tiles: B32 H32 S512 D64) and MQA decode over a
    paged cache (the last-arrival merge counts splits: B8 H16/1 4k, page 16).  Recorded after eager
    warm-up runs, replayed with new data: every output matches float32."""
    import torch._dynamo

    from factory.testing import TOLERANCE, attention_kvcache_reference, attention_reference, rel_error

    b, ops = kf
    w1 = bf(2112, 7168)
    gen = torch.Generator(device="cuda").manual_seed(11)
    pages, ps = 8 * 256, 16
    kc = torch.randn(pages, ps, 1, 128, device="cuda", generator=gen).to(torch.bfloat16)
    vc = torch.randn(pages, ps, 1, 128, device="cuda", generator=gen).to(torch.bfloat16)
    bt = torch.randperm(pages, device="cuda", generator=gen).to(torch.int32).view(8, 256)
    lens = torch.tensor([4096, 4000, 1, 3000, 4096, 17, 2048, 4095], dtype=torch.int32, device="cuda")

    def g(x, y, q, kv, qd):
        o, _ = ops.attention(q, kv, kv, causal=True)
        od, _ = ops.attention_kvcache(qd, kc, vc, lens, block_table=bt)
        return ops.gemm(x, w1), ops.gemm(y, w1), o, od

    torch._dynamo.reset()
    ro = torch.compile(g, mode="reduce-overhead", fullgraph=True)
    for _ in range(4):  # warm-up runs, then graph replays with new data
        x, y = bf(2048, 7168), bf(64, 7168)
        q, kv, qd = bf(32, 512, 32, 64), bf(32, 512, 32, 64), bf(8, 1, 16, 128)
        ox, oy, o, od = (t.clone() for t in ro(x, y, q, kv, qd))
        for out, a in ((ox, x), (oy, y)):
            err = rel_error(out, a.float() @ w1.float().t())
            assert err < TOLERANCE["bf16"], err
        err = rel_error(o, attention_reference(q, kv, kv, True, 64 ** -0.5)[0])
        assert err < TOLERANCE["bf16"], err
        ref = attention_kvcache_reference(qd, kc, vc, lens, block_table=bt)
        err = rel_error(od, ref[0] if isinstance(ref, tuple) else ref)
        assert err < TOLERANCE["bf16"], err
    print("picks:", sorted({str(v)[:120] for v in b.selections.values()}))
