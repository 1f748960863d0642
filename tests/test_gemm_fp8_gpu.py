"""fp8 GEMM with row-wise and DeepSeek-V3 block scales on the GPU (runtime/fp8.py): every such
variant of the bundle by name, the selection's choice on edge shapes (M from 1, N and K not
multiples of 128), CUDA-graph capture, the hot path with new scale tensors, the torch op, and bad
scales refused before any launch.  The row form runs on whichever family the bundle has for this
GPU (on an H100 without sm_90a builds: the mma.sync family's sm_90 build).  References: float32 products of the dequantized operands;
outputs NaN-poisoned."""

import pytest

from conftest import gpu_marks

pytestmark = gpu_marks()

ROW_SHAPES = [(1, 24, 16), (7, 200, 48), (129, 504, 1008), (300, 4096, 4096), (64, 7168, 2048), (1000, 1032, 1008),
              (1, 4104, 4096), (257, 136, 208)]
# K: one partial block, several with a partial last one, exact; N: under one block, partial last block.
BLOCK_SHAPES = [(1, 8, 144), (7, 200, 272), (129, 504, 1008), (300, 1032, 4160), (64, 2112, 7168),
                (1000, 7168, 1040), (4096, 512, 384), (33, 136, 128)]


@pytest.fixture(scope="module")
def bundle():
    from conftest import GPU_BUNDLE
    from factory.runtime import Bundle

    b = Bundle.open(GPU_BUNDLE)
    return b


def _entries(bundle, mode):
    out = [v for v in bundle.candidates("gemm") if v.get("scale_mode") == mode]
    if not out:
        pytest.skip(f"no {mode}-scaled fp8 gemm for this GPU in the bundle")
    return out


def _run(bundle, mode, M, N, K, **kw):
    import torch

    from factory import testing

    a, b, scales, ref = testing.fp8_scaled_problem(mode, M, N, K)
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    bundle.gemm(a, b, out, **scales, **kw)
    torch.cuda.synchronize()
    assert not torch.isnan(out).any(), (mode, M, N, K)
    err = testing.rel_error(out, ref)
    assert err < testing.TOLERANCE["e4m3"], (mode, M, N, K, err)
    return out


@pytest.mark.parametrize("mode", ["row", "block"])
def test_every_scaled_variant_by_name(bundle, mode, run_record):
    from factory import testing

    for e in _entries(bundle, mode):
        results = testing.smoke_gemm(bundle, e) + [testing.check_graph_capture(bundle, e)]
        run_record.add(bundle, e["name"], results)
        for r in results:
            assert r["ok"], r


@pytest.mark.parametrize("M,N,K", ROW_SHAPES)
def test_row_selected_matches_float32(bundle, M, N, K):
    _entries(bundle, "row")
    _run(bundle, "row", M, N, K)


@pytest.mark.parametrize("M,N,K", BLOCK_SHAPES)
def test_block_selected_matches_float32(bundle, M, N, K):
    _entries(bundle, "block")
    _run(bundle, "block", M, N, K)


def test_row_matches_torch_scaled_mm(bundle):
    """The row-wise form is torch._scaled_mm's (scale_a (M, 1), scale_b (1, N))."""
    import torch

    from factory import testing

    _entries(bundle, "row")
    M, N, K = 264, 1024, 2048
    a, b, sc, _ = testing.fp8_scaled_problem("row", M, N, K)
    sa, sb = sc["scale_a"][:, None], sc["scale_b"][None, :]
    ours = bundle.gemm(a, b, scale_a=sa, scale_b=sb)
    ref = torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
    assert testing.rel_error(ours, ref) < 1e-2


def test_hot_path_takes_new_scales_and_captures(bundle):
    """A repeated problem (the hot path) reads the scale tensors it is given on each call, also
    inside a CUDA graph."""
    import torch

    from factory import testing

    for mode in ("row", "block"):
        _entries(bundle, mode)
        M, N, K = 200, 520, 1040
        a, b, sc, ref = testing.fp8_scaled_problem(mode, M, N, K)
        out = bundle.gemm(a, b, **sc)
        sa2, sb2 = sc["scale_a"] * 2, sc["scale_b"] * 3
        out2 = bundle.gemm(a, b, scale_a=sa2, scale_b=sb2)  # the hot path: same key, other tensors
        torch.cuda.synchronize()
        assert testing.rel_error(out, ref) < 1e-2 and testing.rel_error(out2, ref * 6) < 1e-2, mode
        o = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
        g = testing.capture_on_side_stream(lambda: bundle.gemm(a, b, o, scale_a=sa2, scale_b=sb2))
        sa2.mul_(0.5)
        g.replay()
        torch.cuda.synchronize()
        assert testing.rel_error(o, ref * 3) < 1e-2, mode


def test_torch_op_and_fake(bundle):
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from factory import testing
    from factory.runtime import InputError

    _entries(bundle, "block")
    ops = bundle.torch_ops()
    a, b, sc, ref = testing.fp8_scaled_problem("block", 256, 384, 640)
    out = ops.gemm(a, b, None, sc["scale_a"], sc["scale_b"])
    assert testing.rel_error(out, ref) < 1e-2
    short = sc["scale_a"][:, :2]
    with FakeTensorMode() as mode:
        fa, fb = mode.from_tensor(a), mode.from_tensor(b)
        f = ops.gemm(fa, fb, None, mode.from_tensor(sc["scale_a"]), mode.from_tensor(sc["scale_b"]))
        assert f.shape == (256, 384) and f.dtype == torch.bfloat16
        with pytest.raises(InputError):
            ops.gemm(fa, fb, None, mode.from_tensor(short), mode.from_tensor(sc["scale_b"]))


def test_bad_scales_refused_then_the_process_still_works(bundle):
    import torch

    from factory import testing
    from factory.runtime import InputError

    _entries(bundle, "block")
    M, N, K = 136, 264, 528
    a, b, sc, ref = testing.fp8_scaled_problem("block", M, N, K)
    sa, sb = sc["scale_a"], sc["scale_b"]
    _, _, rs, _ = testing.fp8_scaled_problem("row", M, N, K)
    bad = [
        dict(scale_a=sa.contiguous(), scale_b=sb),  # K-major a scales
        dict(scale_a=sa[:, :2], scale_b=sb[:, :2]),  # too few k-blocks
        dict(scale_a=sa.double(), scale_b=sb),
        dict(scale_a=sa.cpu(), scale_b=sb),
        dict(scale_a=sa, scale_b=sb.t()),
        dict(scale_a=rs["scale_a"], scale_b=sb),  # row a with block b
        dict(scale_a=rs["scale_a"].half(), scale_b=rs["scale_b"]),
        dict(scale_a=rs["scale_a"], scale_b=rs["scale_b"][:-1]),
        dict(scale_a=torch.ones(2 * M, device="cuda")[::2], scale_b=rs["scale_b"]),
        dict(scale_a=sa, scale_b=sb, scale_mode="row"),
        dict(scale_a=sa, scale_b=sb, scale_mode="nonsense"),
        dict(scale_a=rs["scale_a"], scale_b=None),
    ]
    for kw in bad:
        with pytest.raises(InputError):
            bundle.gemm(a, b, **kw)
    with pytest.raises(InputError):  # batched operands take per-tensor scales only
        bundle.gemm(a[None], b[None], scale_a=rs["scale_a"], scale_b=rs["scale_b"])
    out = bundle.gemm(a, b, scale_a=sa, scale_b=sb)
    torch.cuda.synchronize()
    assert testing.rel_error(out, ref) < 1e-2


def test_row_torch_op_fake_and_bad_scales(bundle):
    """The row form through the torch op and its fake, bad row scales refused before any launch,
    then a good call still works."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from factory import testing
    from factory.runtime import InputError

    _entries(bundle, "row")
    ops = bundle.torch_ops()
    M, N, K = 136, 264, 528
    a, b, sc, ref = testing.fp8_scaled_problem("row", M, N, K)
    sa, sb = sc["scale_a"], sc["scale_b"]
    assert testing.rel_error(ops.gemm(a, b, None, sa, sb), ref) < 1e-2
    with FakeTensorMode() as mode:
        f = ops.gemm(mode.from_tensor(a), mode.from_tensor(b), None, mode.from_tensor(sa), mode.from_tensor(sb))
        assert f.shape == (M, N) and f.dtype == torch.bfloat16
    bad = [dict(scale_a=sa.half(), scale_b=sb), dict(scale_a=sa, scale_b=sb[:-1]), dict(scale_a=sa.cpu(), scale_b=sb),
           dict(scale_a=torch.ones(2 * M, device="cuda")[::2], scale_b=sb), dict(scale_a=sa, scale_b=None),
           dict(scale_a=sa[:, None].expand(M, 2), scale_b=sb), dict(scale_a=sa, scale_b=sb, scale_mode="block")]
    for kw in bad:
        with pytest.raises(InputError):
            bundle.gemm(a, b, **kw)
    out = bundle.gemm(a, b, scale_a=sa, scale_b=sb)
    torch.cuda.synchronize()
    assert testing.rel_error(out, ref) < 1e-2
