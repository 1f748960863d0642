"""GEMM on the GPU through the bundle (skipped without a GPU): the loader's own selection on
assorted shapes and layouts, fp8 scales, streams and CUDA-graph capture."""

import pytest

from conftest import needs_gpu

pytestmark = [needs_gpu, pytest.mark.gpu]


@pytest.fixture(scope="module")
def bundle(gpu_bundle):
    from factory.runtime import Bundle

    b = Bundle.open(gpu_bundle)
    if not b.candidates("gemm"):
        pytest.skip(f"bundle has no gemm for this GPU ({b.describe_contents('gemm')})")
    return b


@pytest.mark.parametrize("M,N,K", [(1, 8, 8), (7, 24, 40), (129, 200, 264), (300, 4096, 1024), (4096, 1024, 512)])
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_selected_variant_matches_float32(bundle, M, N, K, dtype):
    import torch

    from factory import testing

    a = testing.gemm_operand(M, K, 1, "k", dtype)[0]
    b = testing.gemm_operand(N, K, 1, "k", dtype)[0]
    out = torch.full((M, N), float("nan"), dtype=a.dtype, device="cuda")
    bundle.gemm(a, b, out)
    torch.cuda.synchronize()
    assert not torch.isnan(out).any()
    assert testing.rel_error(out, a.float() @ b.float().t()) < testing.TOLERANCE[dtype]


def test_batched_and_f32_output(bundle):
    import torch

    from factory import testing

    a = testing.gemm_operand(100, 72, 4, "k", "bf16")
    b = testing.gemm_operand(56, 72, 4, "k", "bf16")
    out = bundle.gemm(a, b, out_dtype=torch.float32)
    assert out.dtype == torch.float32 and out.shape == (4, 100, 56)
    assert testing.rel_error(out, a.float() @ b.float().transpose(1, 2)) < 1e-2


def test_other_majorness(bundle):
    import torch

    from factory import testing

    names = {(v["layout"]["a"], v["layout"]["b"]) for v in bundle.candidates("gemm")}
    for am, bm in sorted(names - {("k", "k")}):
        a = testing.gemm_operand(136, 96, 2, am, "bf16")
        b = testing.gemm_operand(80, 96, 2, bm, "bf16")
        out = bundle.gemm(a, b)
        torch.cuda.synchronize()
        assert testing.rel_error(out, a.float() @ b.float().transpose(1, 2)) < 1e-2, (am, bm)


def test_fp8_with_device_scales(bundle):
    import torch

    from factory import testing

    if not any(v["dtypes"]["a"] == "e4m3" for v in bundle.candidates("gemm")):
        pytest.skip("no fp8 gemm for this GPU in the bundle")
    a = testing.gemm_operand(192, 256, 1, "k", "e4m3")[0]
    b = testing.gemm_operand(128, 256, 1, "k", "e4m3")[0]
    sa, sb = torch.tensor([0.5], device="cuda"), torch.tensor([3.0], device="cuda")
    out = bundle.gemm(a, b, scale_a=sa, scale_b=sb)
    assert out.dtype == torch.bfloat16
    assert testing.rel_error(out, 1.5 * (a.float() @ b.float().t())) < testing.TOLERANCE["e4m3"]


def test_runs_on_the_callers_stream_and_in_a_graph(bundle):
    import torch

    from factory import testing

    s = torch.cuda.Stream()
    a = testing.gemm_operand(256, 512, 1, "k", "bf16")[0]
    b = testing.gemm_operand(384, 512, 1, "k", "bf16")[0]
    with torch.cuda.stream(s):
        out = bundle.gemm(a, b)
    s.synchronize()
    assert testing.rel_error(out, a.float() @ b.float().t()) < 1e-2
    entry = next(v for v in bundle.candidates("gemm") if v["dtypes"]["a"] == "bf16")
    r = testing.check_graph_capture(bundle, entry)
    assert r["ok"], r


def test_split_k_variants_by_name_and_in_a_graph(bundle):
    from factory import testing

    entries = [v for v in bundle.candidates("gemm") if "workspace" in v]
    if not entries:
        pytest.skip("no split-K gemm for this GPU in the bundle")
    for e in entries:
        for r in testing.smoke_gemm(bundle, e):
            assert r["ok"], r
    r = testing.check_graph_capture(bundle, entries[0])
    assert r["ok"], r


def test_persistent_grid_of_any_size_covers_every_tile(bundle):
    """Persistent (sm90a) variants take their grid cap at launch: capped at 1 or 3 clusters, each
    CTA loops over many tiles (and k-slices) and the result is the same as with the full grid."""
    import torch

    from factory import testing
    from factory.runtime.gemm import launch_scalars, rkl_spec
    from factory.runtime.occupancy import max_active_clusters

    entries = [v for v in bundle.candidates("gemm") if "persistent" in v
               and (v["layout"]["a"], v["layout"]["b"]) == ("k", "k")
               and v.get("scale_mode") in (None, "tensor")  # row / block scales: tests/test_gemm_fp8_gpu.py
               and "workspace" not in v]  # split over the grid (a workspace argument): tests/test_gemm_splitk_gpu.py
    if not entries:
        pytest.skip("no persistent (sm90a) gemm for this GPU in the bundle")
    picks = {}  # one of each kind: split-K, swap-AB, 2-CTA cluster, ping-pong, fp8, plain
    for e in entries:
        kind = ("split" if e.get("split_k", 1) > 1 else "swap" if e.get("swap_ab") else
                "cluster" if e["cluster"] != [1, 1] else e["schedule"]) + e["dtypes"]["a"]
        picks.setdefault(kind, e)
    M, N, K = 300, 712, 1008  # tails in M, N and K; 16-byte rows for every dtype
    for e in picks.values():
        ab, c = e["dtypes"]["a"], e["dtypes"]["c"]
        a = testing.gemm_operand(M, K, 1, "k", ab)[0]
        b = testing.gemm_operand(N, K, 1, "k", ab)[0]
        ref = a.float() @ b.float().t()
        scales = []
        if ab == "e4m3":
            one = torch.ones(1, device="cuda")
            scales = [(one.data_ptr(), (1,), (1,))] * 2
        full = launch_scalars(bundle, e)
        # The driver's count of resident clusters for this kernel, bounded by SMs // cluster.
        sms = bundle.device_info()["sm_count"]
        asked = max_active_clusters(bundle.path, e)
        assert asked is not None and 0 < asked, e["name"]
        assert full == [min(asked, sms // e["persistent"]["cluster_ctas"])], (e["name"], full, asked)
        for cap in (1, 3, full[0]):
            out = torch.full((M, N), float("nan"), dtype=testing.torch_dtype(c), device="cuda")
            specs = [rkl_spec(a, "a"), rkl_spec(b, "b"), rkl_spec(out, "c"), *scales]
            bundle.launch(e["name"], [*specs, cap])
            torch.cuda.synchronize()
            assert not torch.isnan(out).any(), (e["name"], cap)
            err = testing.rel_error(out, ref)
            assert err < testing.TOLERANCE[ab], (e["name"], cap, err)


def test_chained_gemms_see_each_others_results(bundle):
    """Dependent persistent GEMMs back to back on one stream — the second reads the first's
    output, the third overwrites the first's input — eager and in a CUDA graph (outputs
    NaN-poisoned before every replay).  Guards programmatic dependent launch (the decode tiles
    launch with it: the next call is scheduled while one runs and waits before touching memory;
    their ``early_b`` twins load B, constant here, before that wait)."""
    import torch

    from factory import testing

    entries = [v for v in bundle.candidates("gemm") if "persistent" in v
               and v["dtypes"]["a"] == v["dtypes"]["c"] == "bf16"
               and (v["layout"]["a"], v["layout"]["b"]) == ("k", "k")]
    if not entries:
        pytest.skip("no persistent bf16 (sm90a) gemm for this GPU in the bundle")
    picks = {}
    for e in entries:
        kind = "split" if e.get("split_k", 1) > 1 else "swap" if e.get("swap_ab") else e["schedule"]
        picks.setdefault((kind, e["cluster"] != [1, 1], bool(e["config"].get("pdl")),
                          bool(e["config"].get("early_b"))), e)
    M, N, K = 96, 1024, 1536
    for e in picks.values():
        name = e["name"]
        x = testing.gemm_operand(M, K, 1, "k", "bf16")[0]
        w1 = testing.gemm_operand(N, K, 1, "k", "bf16")[0]
        w2 = testing.gemm_operand(K, N, 1, "k", "bf16")[0]
        y1 = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
        y2 = torch.full((M, K), float("nan"), dtype=torch.bfloat16, device="cuda")

        def chain():
            bundle.gemm(x, w1, y1, variant=name)   # y1 = x w1ᵀ
            bundle.gemm(y1, w2, y2, variant=name)  # reads y1
            bundle.gemm(y2, w1, y1, variant=name)  # overwrites y1, reads y2

        x0 = x.clone()
        chain()
        torch.cuda.synchronize()
        y1_first = (x0.float() @ w1.float().t()).to(torch.bfloat16)
        ref_y2 = y1_first.float() @ w2.float().t()
        assert testing.rel_error(y2, ref_y2) < 2e-2, name
        assert testing.rel_error(y1, y2.float() @ w1.float().t()) < 1e-2, name
        g = testing.capture_on_side_stream(chain)
        for _ in range(3):
            x.copy_(testing.gemm_operand(M, K, 1, "k", "bf16")[0])
            y1.fill_(float("nan"))
            y2.fill_(float("nan"))
            x0 = x.clone()
            g.replay()
            torch.cuda.synchronize()
            y1_first = (x0.float() @ w1.float().t()).to(torch.bfloat16)
            assert testing.rel_error(y2, y1_first.float() @ w2.float().t()) < 2e-2, name
            assert testing.rel_error(y1, y2.float() @ w1.float().t()) < 1e-2, name
