"""The ops' hot path on a GPU (runtime/loader.py ``FixedLaunch``): repeated calls of one problem
key launch without the binder, on fresh data each time, and compute what the reference computes;
the stream handle is the caller's at each call (a launch on another stream would read stale
data here); a captured hot call replays on new data.  (Decode shapes, split and packed-GQA, go
through the hot path in tests/test_attention_gpu.py::test_decode.)"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from conftest import GPU_BUNDLE, gpu_marks  # noqa: E402

pytestmark = gpu_marks()


@pytest.fixture(scope="module")
def bundle():
    from factory.runtime import Bundle

    return Bundle.open(GPU_BUNDLE)


@pytest.fixture
def binds(monkeypatch):
    from factory.runtime.loader import Binder

    seen = []  # every argument packing of the checked paths (bind: checked and packed; pack: packed)
    bind, pack = Binder.bind, Binder.pack
    monkeypatch.setattr(Binder, "bind", lambda self, *a, **k: (seen.append(self.name), bind(self, *a, **k))[1])
    monkeypatch.setattr(Binder, "pack", lambda self, *a, **k: (seen.append(self.name), pack(self, *a, **k))[1])
    return seen


def rel(x, ref) -> float:
    return float((x.float() - ref).norm() / ref.norm())


def ref_attention(q, k, v, causal):
    from factory.testing import attention_reference

    return attention_reference(q, k, v, causal, 1.0 / math.sqrt(q.shape[-1]))


@pytest.mark.parametrize("shape,causal", [((1, 512, 512, 8, 8, 64), False), ((1, 512, 512, 8, 8, 64), True),
                                          ((2, 300, 300, 8, 2, 128), True), ((1, 1, 4096, 32, 8, 128), False),
                                          ((1, 1, 4096, 8, 8, 64), True)])
def test_attention_hot_calls_on_fresh_data(bundle, binds, shape, causal):
    """Dense and decode problems (split-KV and packed-GQA where the bundle has them), four hot
    calls after the first, with and without LSE."""
    b, sq, sk, hq, hkv, d = shape
    for i in range(5):
        q = torch.randn(b, sq, hq, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        if i == 0:
            bundle.hot_attention.clear()
            binds.clear()
        if i % 2:  # (without LSE)
            o, lse = bundle.attention(q, k, v, causal=causal), None
        else:
            o, lse = bundle.attention(q, k, v, causal=causal, return_lse=True)
        if i == 0:
            first = len(binds)
        ro, rl = ref_attention(q, k, v, causal)
        assert rel(o, ro) < 1e-2 and (lse is None or float((lse - rl).abs().max()) < 2e-2), i
    assert first and len(binds) == first  # the first call only


def test_gemm_hot_calls_on_fresh_data(bundle, binds):
    from factory.runtime.packed import unpack_b

    e4 = torch.float8_e4m3fn
    one = torch.tensor([0.5], device="cuda")
    p = bundle.pack_b(torch.randn(256, 2048, device="cuda").to(e4))
    cases = {"bf16 out=": lambda a, w: bundle.gemm(a, w, torch.empty(64, 384, device="cuda", dtype=torch.bfloat16)),
             "bf16": lambda a, w: bundle.gemm(a, w),
             "fp8 scales": lambda a, w: bundle.gemm(a.to(e4), w.to(e4), scale_a=one, scale_b=one),
             "fp8": lambda a, w: bundle.gemm(a.to(e4), w.to(e4))}
    bundle.hot_gemm.clear()
    for what, fn in cases.items():
        binds.clear()
        for i in range(3):
            a, w = torch.randn(64, 512, device="cuda"), torch.randn(384, 512, device="cuda")
            c = fn(a.bfloat16(), w.bfloat16())
            if i == 0:
                first = len(binds)
            if what.startswith("fp8"):
                s = 0.25 if "scales" in what else 1.0
                ref = a.bfloat16().to(e4).float() @ w.bfloat16().to(e4).float().T * s
            else:
                ref = a.bfloat16().float() @ w.bfloat16().float().T
            assert rel(c, ref) < 1e-2, (what, i)
        assert first and len(binds) == first, what  # the first call only
    binds.clear()
    for i in range(3):
        a = torch.randn(8, 2048, device="cuda").to(e4)
        c = bundle.gemm(a, p, scale_a=one)
        if i == 0:
            first = len(binds)
        assert rel(c, a.float() @ unpack_b(p).float().T * 0.5) < 1e-2, i
    assert first and len(binds) == first


def test_hot_call_runs_on_the_callers_stream(bundle):
    q, k, v = (torch.randn(1, 512, 8, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    bundle.attention(q, k, v)  # cached
    new = torch.randn_like(q)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.cuda._sleep(20_000_000)  # the copy below lands well after a launch elsewhere would run
        q.copy_(new)
        o = bundle.attention(q, k, v)
    s.synchronize()
    assert rel(o, ref_attention(new, k, v, False)[0]) < 1e-2


def test_captured_hot_call_replays_on_new_data(bundle):
    q, k, v = (torch.randn(1, 512, 8, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    bundle.attention(q, k, v)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        bundle.attention(q, k, v)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        o = bundle.attention(q, k, v)
    for _ in range(2):
        for t in (q, k, v):
            t.copy_(torch.randn_like(t))
        g.replay()
        torch.cuda.synchronize()
        assert rel(o, ref_attention(q, k, v, False)[0]) < 1e-2


@pytest.mark.parametrize("causal", [False, True])
def test_attention_out_on_fresh_data_and_in_a_graph(bundle, binds, causal):
    """``out=``: o lands in the given tensor (NaN-poisoned before each call), checked path first,
    then the key's plan on fresh data; an ``out`` over k is refused; a captured call with ``out``
    replays into it on new inputs."""
    out = torch.empty(1, 512, 8, 64, device="cuda", dtype=torch.bfloat16)
    bundle.hot_attention.clear()
    binds.clear()
    for i in range(4):
        q, k, v = (torch.randn(1, 512, 8, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        out.fill_(math.nan)
        if i % 2:
            o, lse = bundle.attention(q, k, v, causal=causal, out=out, return_lse=True)
        else:
            o, lse = bundle.attention(q, k, v, causal=causal, out=out), None
        if i == 0:
            first = len(binds)
        ro, rl = ref_attention(q, k, v, causal)
        assert o is out and rel(o, ro) < 1e-2 and (lse is None or float((lse - rl).abs().max()) < 2e-2), i
    assert first and len(binds) == first
    from factory.runtime import InputError

    with pytest.raises(InputError, match="out overlaps k"):
        bundle.attention(q, out, v, causal=causal, out=out)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        bundle.attention(q, k, v, causal=causal, out=out)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        bundle.attention(q, k, v, causal=causal, out=out)
    for t in (q, k, v):
        t.copy_(torch.randn_like(t))
    out.fill_(math.nan)
    g.replay()
    torch.cuda.synchronize()
    assert rel(out, ref_attention(q, k, v, causal)[0]) < 1e-2
