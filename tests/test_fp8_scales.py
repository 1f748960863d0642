"""fp8 row-wise and block scales without a GPU: the quantizers' layouts and error, the scale form
read from the shapes (runtime/fp8.py), the checks before launch, and the host library's selection
(``fx_gemm_scaled_select``) of a row- or block-scaled Hopper variant on a simulated H100."""

from __future__ import annotations

import pytest

from conftest import HAVE_DSL, Recorder

torch = pytest.importorskip("torch")

from factory.runtime import InputError, NoVariantError  # noqa: E402
from factory.runtime import fp8  # noqa: E402

H100 = {"name": "NVIDIA H100 80GB HBM3", "sm_count": 132}


def test_quantizers_write_the_layouts_the_gemm_takes():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(300, 1000, generator=g) * torch.linspace(0.01, 50, 1000)
    q, s = fp8.quantize_rowwise(x)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (300,) and s.is_contiguous()
    assert (fp8.dequantize_rowwise(q, s) - x).abs().max() <= s.max() * 16  # e4m3: 3 mantissa bits
    q, s = fp8.quantize_blockwise(x, (1, 128))
    assert q.shape == x.shape and s.shape == (300, 8) and s.stride() == (1, 300)  # M-major, 300 = 4·75
    q5, s5 = fp8.quantize_blockwise(x[:5], (1, 128))
    assert s5.stride() == (1, 8)  # TMA-aligned: M rounded up to 4 floats (16 bytes)
    d = fp8.dequantize_blockwise(q, s)
    rel = ((d - x).norm() / x.norm()).item()
    assert rel < 0.04
    qb, sb = fp8.quantize_blockwise(x, (128, 128))
    assert sb.shape == (3, 8) and sb.is_contiguous()
    assert ((fp8.dequantize_blockwise(qb, sb) - x).norm() / x.norm()).item() < 0.04
    # each block's largest magnitude maps to the e4m3 maximum (no saturation, full range)
    assert float(q[:, :128].float().abs().amax(dim=1).min()) == 448.0
    with pytest.raises(InputError):
        fp8.quantize_blockwise(x, (64, 128))


def test_blockwise_quantizer_in_slabs_matches_one_pass(monkeypatch):
    """quantize_blockwise works in slabs of whole row blocks (no float32 copy of a large tensor):
    slabs of one row block, of a few, and one slab give the same bits and layouts."""
    g = torch.Generator().manual_seed(1)
    for R, K in ((300, 1000), (129, 256), (3, 130)):
        x = (torch.randn(R, K, generator=g) * 3).to(torch.bfloat16)
        for block in ((1, 128), (128, 128)):
            q0, s0 = fp8.quantize_blockwise(x, block)
            for slab in ((1, 32768) if R < 8 else (32768,)):  # 1: one row (block) per slab
                monkeypatch.setattr(fp8, "SLAB_ELEMENTS", slab)
                q, s = fp8.quantize_blockwise(x, block)
                assert torch.equal(q.view(torch.uint8), q0.view(torch.uint8)) and torch.equal(s, s0), (R, K, block)
                assert s.stride() == s0.stride()
            monkeypatch.undo()


@pytest.mark.parametrize("sa,sb,M,N,K,mode", [
    ((1,), (1,), 64, 256, 512, "tensor"),
    ((64,), (256,), 64, 256, 512, "row"),
    ((64, 1), (1, 256), 64, 256, 512, "row"),
    ((64, 4), (2, 4), 64, 256, 512, "block"),
    ((1,), (256,), 1, 256, 512, "row"),
    ((64, 1), (1, 1), 64, 1, 128, "row"),  # one column, one k-block: row and block mean the same
    ((1, 1), (1, 1), 1, 8, 128, "tensor"),
])
def test_scale_form_from_shapes(sa, sb, M, N, K, mode):
    assert fp8.infer_mode(torch.ones(sa), torch.ones(sb), M, N, K) == mode


def test_ambiguous_or_unfit_scale_shapes_are_refused():
    # shapes that fit two forms only where both mean the same product: the first form
    assert fp8.infer_mode(torch.ones(64, 1), torch.ones(1, 1), 64, 1, 128) == "row"
    assert fp8.infer_mode(torch.ones(64, 1), torch.ones(1, 1), 64, 1, 128, "block") == "block"
    assert fp8.infer_mode(torch.ones(64, 2), torch.ones(1, 2), 64, 2, 256) == "block"
    with pytest.raises(InputError, match="fit no fp8 scale form"):
        fp8.infer_mode(torch.ones(64, 3), torch.ones(2, 4), 64, 256, 512)
    with pytest.raises(InputError, match="need both"):
        fp8.infer_mode(torch.ones(64), None, 64, 256, 512)
    with pytest.raises(InputError):
        fp8.infer_mode(None, None, 64, 256, 512, "sometimes")


@pytest.fixture(scope="module")
def scaled_bundle(tmp_path_factory):
    """A bundle of one row- and one block-scaled sm_90a variant, simulated on an H100."""
    if not HAVE_DSL:
        pytest.skip("nvidia-cutlass-dsl is not installed")
    from factory.compiler.builder import build
    from factory.runtime import Bundle

    out = tmp_path_factory.mktemp("fp8") / "b"
    build(out, ["sm_90a"], ["gemm"], tier="default", jobs=1, evidence=tmp_path_factory.mktemp("no-runs"),
          name_filter="*_t128x128x128_c1x1_coop_rm_sw1_sk1_pdl_[rb][ol][wk]sc*")
    b = Bundle.open(out, capability=(9, 0), device=H100)
    b.rec = Recorder()
    b.simulate(b.rec)
    return b


def _ops(M, N, K):
    return (torch.zeros(M, K, dtype=torch.float8_e4m3fn), torch.zeros(N, K, dtype=torch.float8_e4m3fn))


def test_selection_by_scale_form(scaled_bundle):
    b = scaled_bundle
    M, N, K = 300, 504, 1008  # neither N nor K a multiple of 128
    a, w = _ops(M, N, K)
    _, sa = fp8.quantize_rowwise(torch.randn(M, K))
    _, sb = fp8.quantize_rowwise(torch.randn(N, K))
    b.gemm(a, w, scale_a=sa, scale_b=sb)
    assert b.rec.launched[-1].endswith("_rowsc")
    b.gemm(a, w, scale_a=sa[:, None], scale_b=sb[None, :])
    assert b.rec.launched[-1].endswith("_rowsc")
    _, sa = fp8.quantize_blockwise(torch.randn(M, K))
    _, sb = fp8.quantize_blockwise(torch.randn(N, K), (128, 128))
    out = b.gemm(a, w, scale_a=sa, scale_b=sb)
    assert b.rec.launched[-1].endswith("_blksc_sbst") and out.shape == (M, N) and out.dtype == torch.bfloat16
    n = len(b.rec.launched)
    b.gemm(a, w, scale_a=sa, scale_b=sb)  # the hot path launches the same variant
    assert len(b.rec.launched) == n + 1 and b.rec.launched[-1].endswith("_blksc_sbst")
    with pytest.raises(NoVariantError):  # per tensor: none of this bundle's variants takes it
        b.gemm(a, w, scale_a=torch.ones(1), scale_b=torch.ones(1))


def test_bad_scales_are_refused_before_launch(scaled_bundle):
    b = scaled_bundle
    M, N, K = 136, 264, 528
    a, w = _ops(M, N, K)
    _, sa = fp8.quantize_blockwise(torch.randn(M, K))
    _, sb = fp8.quantize_blockwise(torch.randn(N, K), (128, 128))
    n = len(b.rec.launched)
    for kw in (dict(scale_a=sa.contiguous(), scale_b=sb), dict(scale_a=sa.double(), scale_b=sb),
               dict(scale_a=sa, scale_b=sb[:, :2]), dict(scale_a=sa, scale_b=sb, scale_mode="row"),
               dict(scale_a=torch.ones(2 * M)[::2], scale_b=torch.ones(N)),
               dict(scale_a=torch.ones(M), scale_b=torch.ones(N, dtype=torch.float16)),
               dict(scale_a=torch.ones(5, M + 2).t()[:M], scale_b=sb),  # k-block stride not a multiple of 4
               dict(scale_a=torch.ones(5 * M + 1)[1:].view(5, M).t(), scale_b=sb)):  # not 16-byte aligned
        with pytest.raises(InputError):
            b.gemm(a, w, **kw)
    with pytest.raises(InputError, match="2-D"):
        b.gemm(a[None], w[None], scale_a=torch.ones(M), scale_b=torch.ones(N))
    with pytest.raises(InputError, match="fp8 GEMMs only"):
        b.gemm(a.bfloat16(), w.bfloat16(), scale_a=torch.ones(M), scale_b=torch.ones(N))
    assert len(b.rec.launched) == n


def test_c_refuses_bad_scale_forms(scaled_bundle):
    """The host library's own checks (C callers do not pass through Python's)."""
    from factory.runtime.gemm import rkl_spec

    b = scaled_bundle
    M, N, K = 136, 264, 528
    a, w = _ops(M, N, K)
    c = torch.empty(M, N, dtype=torch.bfloat16)
    sa, sb = torch.ones(M, 5), torch.ones(3, 5)
    sel = b.selector
    problem = sel.gemm_problem(rkl_spec(a, "a"), rkl_spec(w, "b"), rkl_spec(c, "c"), "e4m3", "bf16",
                               [(sa.data_ptr(), (M, 5), (1, M)), (sb.data_ptr(), (3, 5), (5, 1))], False)
    assert sel.select_scaled(problem, (2, (1, M), (5, 1))).name.decode().endswith("_blksc_sbst")
    assert sel.select_scaled(problem, (1, (1, 0), (1, 0))).name.decode().endswith("_rowsc")
    for form, match in (((2, (5, 1), (5, 1)), "M-major"), ((2, (1, M - 1), (5, 1)), ">= m"),
                        ((2, (1, M), (1, 3)), "K-contiguous"), ((2, (1, M), (4, 1)), ">= ceil"),
                        ((1, (2, 0), (1, 0)), "contiguous"), ((7, (1, M), (5, 1)), "unknown scale mode"),
                        ((2, (1, -M), (5, 1)), "negative"), ((2, (1, M + 2), (5, 1)), "multiple of 4")):
        with pytest.raises(InputError, match=match):
            sel.select_scaled(problem, form)


def test_fake_checks_the_scales(test_bundle):
    """The torch op's fake refuses bad row / block scales word for word as the real op does (CPU
    tensors on a simulated H100 bundle; FakeTensors for the fake), and gives the output's shape."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from factory.runtime import Bundle

    H100 = {"name": "planned H100", "sm_count": 132}

    from conftest import Recorder

    b = Bundle.open(test_bundle, capability=(9, 0), device=H100)
    b.simulate(Recorder())
    kf = b.torch_ops()
    a = torch.randn(64, 512).to(torch.float8_e4m3fn)
    w = torch.randn(256, 512).to(torch.float8_e4m3fn)
    cases = [
        (torch.ones(64, 3), torch.ones(2, 4), None),                          # no form fits
        (torch.ones(64, dtype=torch.float16), torch.ones(256), None),          # row scales not float32
        (torch.ones(64, 4), torch.ones(2, 4), "nonsense"),                     # unknown scale_mode
        (torch.ones(1), torch.ones(256), None),                                # row form needs both
        (torch.ones(64, 4), torch.ones(2, 4), None),                           # block scale_a not M-major
    ]
    for sa, sb, mode in cases:
        try:
            kf.gemm(a, w, None, sa, sb, False, mode)
            real = None
        except Exception as e:  # noqa: BLE001 - compared below
            real = (type(e).__name__, str(e))
        assert real is not None and real[0] == "InputError", real
        with FakeTensorMode() as fm:
            try:
                kf.gemm(fm.from_tensor(a), fm.from_tensor(w), None, fm.from_tensor(sa), fm.from_tensor(sb), False, mode)
                fake = None
            except Exception as e:  # noqa: BLE001
                fake = (type(e).__name__, str(e))
        assert fake == real, (real, fake)
    # Well-formed block scales: the output's shape where the bundle has block-scaled variants for
    # this device, else the NoVariantError the real op's selection raises too.
    has_block = any(v.get("scale_mode") == "block" for v in b.candidates("gemm"))
    with FakeTensorMode() as fm:
        call = lambda: kf.gemm(fm.from_tensor(a), fm.from_tensor(w), None, fm.from_tensor(torch.ones(4, 64).t()),  # noqa: E731
                               fm.from_tensor(torch.ones(2, 4)))
        if has_block:
            f = call()
            assert f.shape == (64, 256) and f.dtype == torch.bfloat16
        else:
            from factory.runtime import NoVariantError

            with pytest.raises(NoVariantError, match="block fp8 scales"):
                call()
    if not has_block:
        from factory.runtime import NoVariantError

        with pytest.raises(NoVariantError):
            kf.gemm(a, w, None, torch.ones(4, 64).t(), torch.ones(2, 4))


@pytest.fixture(scope="module")
def row_tiles_bundle(tmp_path_factory):
    """The row-scaled 128x256 2x1 and 128x128 ping-pong tiles (1x2 plain and swizzled, 2x1) of the
    default tier, the 128x128 cooperative ones and the 128x128 / 128x192 2x1 tail splits, simulated
    on an H100."""
    if not HAVE_DSL:
        pytest.skip("nvidia-cutlass-dsl is not installed")
    from factory.compiler.builder import build
    from factory.runtime import Bundle

    out = tmp_path_factory.mktemp("fp8row") / "b"
    build(out, ["sm_90a"], ["gemm"], tier="default", jobs=1, evidence=tmp_path_factory.mktemp("no-runs"),
          name_filter="*_t128x[12][259][862]x128_c[12]x[12]_*_pdl_rowsc*")
    return Bundle.open(out, capability=(9, 0), device=H100)


def _row_pick(sel, M, N, K):
    a3, b3, c3 = (0, (M, K, 1), (K, 1, 0)), (0, (N, K, 1), (K, 1, 0)), (0, (M, N, 1), (N, 1, 0))
    problem = sel.gemm_problem(a3, b3, c3, "e4m3", "bf16", [(0, (M,), (1,)), (0, (N,), (1,))], False)
    return sel.select_scaled(problem, (1, (1, 0), (1, 0))).name.decode()


def test_row_selection_takes_the_pingpong_tiles_by_m(row_tiles_bundle):
    """The 128x128 fp8 ping-pong tiles are ranked by their own cost-model rate in the M ranges
    where they were timed on an H100: the 2x1 one at M 512..1024, the 1x2 ones above; of the 1x2
    pair the cost model's DRAM term takes the swizzled one where the plain raster streams A or B
    from DRAM many times (M 8192 with K >= 4096, N 2112) and the plain one elsewhere; below M 512
    the picks are the other tiles."""
    sel = row_tiles_bundle.selector
    names = set(row_tiles_bundle.manifest["variants"])
    pre = "gemm_sm90a_e4m3_obf16_ak_bk_t"
    pp = pre + "128x128x128_c1x2_pp_rm_sw1_fastacc_sk1_pdl_rowsc"
    swx = pre + "128x128x128_c1x2_pp_rm_sw8_swx_fastacc_sk1_pdl_rowsc"
    pp21 = pre + "128x128x128_c2x1_pp_rm_sw1_fastacc_sk1_pdl_rowsc"
    assert {pp, swx, pp21, pre + "128x256x128_c2x1_coop_rm_sw1_fastacc_sk1_pdl_rowsc"} <= names
    for M, N, K in ((8192, 7168, 2048), (8192, 24576, 1536), (4096, 14336, 4096), (2048, 7168, 2048),
                    (4096, 4096, 4096), (1025, 4096, 4096)):
        assert _row_pick(sel, M, N, K) == pp, (M, N, K)
    for M, N, K in ((8192, 14336, 4096), (8192, 4096, 14336), (8192, 4096, 4096), (8192, 2112, 7168),
                    (16384, 14336, 4096)):
        assert _row_pick(sel, M, N, K) == swx, (M, N, K)
    for M, N, K in ((512, 7168, 2048), (512, 14336, 4096), (512, 24576, 1536), (512, 4096, 4096),
                    (512, 2112, 7168), (768, 7168, 2048), (1024, 4096, 4096), (1024, 14336, 4096)):
        assert _row_pick(sel, M, N, K) == pp21, (M, N, K)
    for M, N, K in ((511, 14336, 4096), (256, 7168, 2048), (128, 4096, 4096)):
        assert _row_pick(sel, M, N, K) not in (pp, swx, pp21), (M, N, K)
    # the rate is a cost-model constant (fitting tools may set it): at the bf16 ping-pong rate the
    # 128x256 tile wins again at M 8192
    from factory.runtime import tuning

    sel.set_cost_model(sm90={**tuning.MODEL, "eff_pp_fp8": tuning.MODEL["eff_pp"]})
    try:
        assert _row_pick(sel, 8192, 14336, 4096) not in (pp, swx)
    finally:
        sel.set_cost_model()
    assert _row_pick(sel, 8192, 14336, 4096) == swx


def test_row_selection_takes_the_tail_split_where_the_last_round_is_short(row_tiles_bundle):
    """The fp8 tail splits (128x128 / 128x192, 2x1) compete from one whole round of cluster tiles up
    to four, where the last round leaves at least a quarter of the clusters idle: taken at 2048 x
    2112 x 7168 (by name on an H100: 52.9 us against the ping-pong pick's 61.2) and, the 128x128 one,
    at 1536 x 1536 x 14336 (the clusterless 128x192 tile takes most of its other shapes from M 384);
    the ping-pong picks stay where the grid runs many rounds, or one round exactly, or under one."""
    sel = row_tiles_bundle.selector
    pre = "gemm_sm90a_e4m3_obf16_ak_bk_t"
    t128 = pre + "128x128x128_c2x1_coop_rm_sw1_fastacc_sk1_pdl_rowsc_skw8_tail"
    t192 = pre + "128x192x128_c2x1_coop_rm_sw1_fastacc_sk1_pdl_rowsc_skw8_tail"
    assert {t128, t192} <= set(row_tiles_bundle.manifest["variants"])
    assert _row_pick(sel, 2048, 2112, 7168) == t192
    assert _row_pick(sel, 1536, 1536, 14336) == t128
    for M, N, K in ((8192, 2112, 7168), (4096, 2112, 7168), (2048, 7168, 16384), (8192, 7168, 2048),
                    (4096, 4096, 4096), (1536, 1408, 2048), (512, 2112, 7168), (128, 2112, 7168)):
        assert "tail" not in _row_pick(sel, M, N, K), (M, N, K)
    # the fix-up term is a cost-model constant: at the bfloat16 tails' 16 us the ping-pong tile stays
    from factory.runtime import tuning

    sel.set_cost_model(sm90={**tuning.MODEL, "tail_us_fp8": tuning.MODEL["tail_us"]})
    try:
        assert "tail" not in _row_pick(sel, 2048, 2112, 7168)
    finally:
        sel.set_cost_model()
    assert _row_pick(sel, 2048, 2112, 7168) == t192


def test_row_selection_takes_the_clusterless_128x192_tile_from_m_384(row_tiles_bundle):
    """The clusterless 128x192 fp8 tile is rated at the multicast tiles' rate and competes from M 384:
    taken where a 192-wide tile rounds the grid to fewer waves (by name on an H100 0.73-0.92x the
    earlier picks at the 11 such shapes timed, M 384..4096), never below M 384 (at M 16..256 it lost
    to the swapped, ping-pong or 2x1 tiles), and no pick of the 30 row-bench shapes moves."""
    sel = row_tiles_bundle.selector
    pre = "gemm_sm90a_e4m3_obf16_ak_bk_t"
    wide = pre + "128x192x128_c1x1_coop_rm_sw1_fastacc_sk1_pdl_rowsc"
    assert wide in row_tiles_bundle.manifest["variants"]
    for M, N, K in ((384, 14336, 4096), (384, 7168, 2048), (384, 24576, 1536), (384, 28672, 4096), (384, 8192, 8192),
                    (512, 6144, 4096), (768, 4096, 4096), (1024, 3072, 5120), (1024, 2112, 7168), (2048, 1536, 7168),
                    (4096, 576, 7168)):
        assert _row_pick(sel, M, N, K) == wide, (M, N, K)
    for M, N, K in ((16, 24576, 1536), (64, 24576, 1536), (128, 24576, 1536), (128, 18432, 7168),
                    (128, 57344, 8192), (192, 12288, 4096), (256, 24576, 1536), (383, 14336, 4096)):
        assert _row_pick(sel, M, N, K) != wide, (M, N, K)
    for N, K in ((4096, 4096), (14336, 4096), (4096, 14336), (2112, 7168), (7168, 2048), (24576, 1536)):
        for M in (16, 128, 512, 2048, 8192):
            assert _row_pick(sel, M, N, K) != wide, (M, N, K)
