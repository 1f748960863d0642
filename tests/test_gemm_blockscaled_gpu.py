"""Block-scaled GEMM (MXFP8 / NVFP4) on a GPU.  The kernels are sm_100a cubins: the tests that launch
them run only on a compute capability 10.0 device (B200, GB200) and skip everywhere else, the
H100 included; nothing here has run on one yet.  The other tests (packing on the GPU, the refusal
on other devices) run on any GPU.  The reference is ``blockscaled.reference_gemm``: the float32
product of the decoded operands."""

from __future__ import annotations

import pytest

from conftest import gpu_marks

pytestmark = gpu_marks()


def _capability():
    import torch

    return tuple(torch.cuda.get_device_capability())


@pytest.fixture(scope="module")
def blackwell():
    """Skips unless the GPU is compute capability 10.0 (the block-scaled kernels are sm_100a)."""
    if _capability() != (10, 0):
        pytest.skip(f"needs a compute capability 10.0 GPU (B200, GB200); this one is {_capability()}")


@pytest.fixture(scope="module")
def bundle(gpu_bundle):
    from factory.runtime import Bundle

    return Bundle.open(gpu_bundle)


@pytest.fixture(scope="module")
def entries(bundle):
    found = bundle.candidates("gemm_blockscaled")
    if not found:
        pytest.skip(f"no gemm_blockscaled variant for this GPU ({bundle.describe_contents('gemm_blockscaled')})")
    return found


def test_every_variant_matches_the_decoded_reference(blackwell, bundle, entries):
    from factory import testing

    results = [r for e in entries for r in testing.smoke_gemm_blockscaled(bundle, e)]
    bad = [r for r in results if not r["ok"]]
    assert not bad, bad


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8_e4m3", "mxfp8_e5m2"])
@pytest.mark.parametrize("M,N,K", [(1, 128, 64), (16, 4096, 4096), (300, 520, 800), (4096, 4096, 4096)])
def test_selected_variant(blackwell, bundle, entries, fmt, M, N, K):
    import torch

    from factory import testing
    from factory.runtime import blockscaled as bs

    key = testing.BLOCKSCALED_FORMATS
    if not any(key[e["format"]] == fmt for e in entries):
        pytest.skip(f"no {fmt} variant in the bundle")
    a = bs.pack(torch.randn(M, K, device="cuda"), fmt)
    b = bs.pack(torch.randn(N, K, device="cuda"), fmt)
    out = bundle.gemm(a, b)
    torch.cuda.synchronize()
    assert not torch.isnan(out).any()
    assert testing.rel_error(out, bs.reference_gemm(a, b)) < testing.TOLERANCE["bf16"]


def test_cuda_graph_replay(blackwell, bundle, entries):
    import torch

    from factory import testing
    from factory.runtime import blockscaled as bs

    a = bs.pack(torch.randn(512, 1024, device="cuda"), "nvfp4")
    b = bs.pack(torch.randn(768, 1024, device="cuda"), "nvfp4")
    out = torch.empty(512, 768, dtype=torch.bfloat16, device="cuda")
    bundle.gemm(a, b, out)  # module load outside the capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        bundle.gemm(a, b, out)
    fresh = bs.pack(torch.randn(512, 1024, device="cuda"), "nvfp4", global_scale=float(a.global_scale))
    a.data.copy_(fresh.data)
    a.scale.copy_(fresh.scale)
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert testing.rel_error(out, bs.reference_gemm(a, b)) < testing.TOLERANCE["bf16"]


def test_pack_on_the_gpu_equals_pack_on_the_cpu():
    import torch

    from factory.runtime import blockscaled as bs

    x = torch.randn(3, 200, 320)
    for fmt in ("nvfp4", "mxfp8_e4m3", "mxfp8_e5m2"):
        c, g = bs.pack(x, fmt), bs.pack(x.cuda(), fmt)
        assert torch.equal(c.data.view(torch.uint8), g.data.view(torch.uint8).cpu()), fmt
        assert torch.equal(c.scale.view(torch.uint8), g.scale.view(torch.uint8).cpu()), fmt
        assert torch.equal(bs.dequantize(c), bs.dequantize(g).cpu()), fmt


def test_other_devices_refuse_with_the_reason(bundle):
    import torch

    from factory.runtime import NoVariantError
    from factory.runtime import blockscaled as bs

    if _capability() == (10, 0):
        pytest.skip("this is a 10.0 device")
    if not any(v["op"] == "gemm_blockscaled" for v in bundle.manifest["variants"].values()):
        pytest.skip("the bundle has no gemm_blockscaled variant")
    a = bs.pack(torch.randn(64, 128, device="cuda"), "nvfp4")
    with pytest.raises(NoVariantError, match="compute capability 10.0"):
        bundle.gemm(a, a)
