"""Grouped GEMM on this GPU-less machine: the checks that refuse before launch (runtime/grouped.py),
the host library's choice and refusals (fx_gemm_grouped_select) on the test bundle, the torch ops'
schemas and fakes through a simulated bundle.  Values: tests/test_grouped_gemm_gpu.py and
tests/test_every_variant_gpu.py on a GPU."""

from __future__ import annotations

import pytest
import torch

from conftest import Recorder
from factory.runtime import Bundle, InputError, NoVariantError
from factory.runtime import grouped

H100 = {"name": "planned H100", "sm_count": 132}


def bf(*s):
    return torch.randn(*s, dtype=torch.bfloat16)


def w(E, N, K):
    """(E, K, N) K-contiguous: the transpose of (E, N, K) weights."""
    return bf(E, N, K).transpose(1, 2)


def i32(*v):
    return torch.tensor(v, dtype=torch.int32)


@pytest.fixture(scope="module")
def planned(test_bundle):
    b = Bundle.open(test_bundle, capability=(9, 0), device=H100)
    if not b.candidates("gemm_grouped"):
        pytest.skip("the test bundle has no gemm_grouped variant")
    return b


@pytest.mark.parametrize("args,kw,match", [
    ((bf(64, 128), w(4, 64, 128)), {}, "exactly one of offs"),
    ((bf(64, 128), w(4, 64, 128)), {"offs": i32(1, 2, 3, 4), "masked_m": i32(1, 2, 3, 4)}, "exactly one of offs"),
    ((bf(64, 128), w(4, 64, 128)), {"offs": i32(1, 2, 3)}, "4 elements"),
    ((bf(64, 128), w(4, 64, 128)), {"offs": torch.tensor([1, 2, 3, 4])}, "int32"),
    ((bf(64, 128), w(4, 64, 128)), {"offs": i32(1, 2, 3, 4, 5, 6, 7, 8)[::2]}, "contiguous"),
    ((bf(64, 128), w(4, 64, 120)), {"offs": i32(1, 2, 3, 4)}, "K"),
    ((bf(64, 128).half(), w(4, 64, 128)), {"offs": i32(1, 2, 3, 4)}, "one dtype"),
    ((bf(64, 128).float(), w(4, 64, 128).float()), {"offs": i32(1, 2, 3, 4)}, "bfloat16"),
    ((bf(64, 128), bf(4, 128, 64)), {"offs": i32(1, 2, 3, 4)}, "contiguous along K"),
    ((bf(64, 128), bf(64, 128)), {"offs": i32(1, 2, 3, 4)}, "3-D"),
    ((bf(2, 64, 128), w(4, 64, 128)), {"offs": i32(1, 2, 3, 4)}, "2-D"),
    ((bf(3, 64, 128), w(4, 64, 128)), {"masked_m": i32(1, 2, 3, 4)}, "E = 4"),
    ((bf(64, 128), w(4, 64, 128)), {"offs": i32(1, 2, 3, 4), "out": bf(64, 32)}, "out must have shape"),
    ((bf(64, 128), w(4, 64, 128)), {"offs": i32(1, 2, 3, 4), "out": bf(64, 64).half()}, "out must be"),
    ((bf(64, 128), w(4, 64, 128)), {"offs": i32(1, 2, 3, 4), "expected_m": -1}, "expected_m"),
    ((bf(64, 128), w(1025, 8, 128)), {"offs": torch.zeros(1025, dtype=torch.int32)}, "at most 1024"),
])
def test_check_refuses(args, kw, match):
    with pytest.raises(InputError, match=match):
        grouped.check(*args, kw.get("offs"), kw.get("masked_m"), kw.get("out"), kw.get("expected_m"))


def _specs(M, N, K, E, masked):
    L = E if masked else 1
    return [(0, (M, K, L), (K, 1, M * K if masked else 0)), (0, (N, K, E), (K, 1, N * K)),
            (0, (M, N, L), (N, 1, M * N if masked else 0)), (0, (E,), (1,))]


def test_choice_follows_rows_per_group(planned):
    """The rule of fx_select.c: the fewest predicted tile-waves x tile work; every variant taken
    matches the layout."""
    for masked in (False, True):
        for M, E, exp in ((65536, 8, None), (64, 64, None), (256, 64, 2)):
            name = grouped.select(planned, "bf16", masked, _specs(M, 4096, 7168, E, masked), M, 4096, 7168, E,
                                  E if masked else 1, exp, 0)
            entry = planned.manifest["variants"][name]
            assert entry["op"] == "gemm_grouped" and entry["grouped"] == ("masked" if masked else "contig")


def test_selection_refusals(planned):
    with pytest.raises(NoVariantError, match="multiple of 8"):  # K rows not whole 16-byte vectors
        grouped.select(planned, "bf16", False, _specs(64, 256, 250, 4, False), 64, 256, 250, 4, 1, None, 0)
    from factory.runtime.selector import DTYPE, GroupedProblem, _I64x3

    sel = planned.selector

    def problem(**kw):
        d = dict(ab=DTYPE["bf16"], c=DTYPE["bf16"], masked=0, m=64, n=256, k=512, e=4, a=0x10000, b=0x100000,
                 c_ptr=0x200000, offs=0x300000, masked_m=None, c_stride=(256, 1, 0))
        d.update(kw)
        return GroupedProblem(d["ab"], d["c"], d["masked"], d["m"], d["n"], d["k"], d["e"], d["a"],
                              _I64x3(512, 1, 0), d["b"], _I64x3(512, 1, 256 * 512), d["c_ptr"], _I64x3(*d["c_stride"]),
                              d["offs"], d["masked_m"], 0)

    assert sel.select("gemm_grouped", problem()).name
    for kw, match in ((dict(masked=2), "masked must be 0 or 1"), (dict(masked_m=0x300000), "not both"),
                      (dict(c_ptr=0x10000), "overlaps"), (dict(c_stride=(0, 1, 0)), "overlap"),
                      (dict(e=1025), "at most 1024"), (dict(c=DTYPE["f32"]), "one dtype"), (dict(k=0), "K must be"),
                      (dict(m=-1), "must not be negative")):
        with pytest.raises(InputError, match=match):
            sel.select("gemm_grouped", problem(**kw))
    assert sel.select("gemm_grouped", problem(m=0)).variant == -1  # empty: nothing to launch


@pytest.fixture
def ops(test_bundle):
    b = Bundle.open(test_bundle, capability=(9, 0), device=H100)
    if not b.candidates("gemm_grouped"):
        pytest.skip("the test bundle has no gemm_grouped variant")
    b.rec = Recorder()
    b.simulate(b.rec)
    return b, b.torch_ops()


def test_torch_ops(ops):
    b, kf = ops
    checks = ("test_schema", "test_autograd_registration", "test_faketensor")
    torch.library.opcheck(kf.grouped_gemm, (bf(64, 128), w(4, 256, 128), i32(10, 10, 40, 64)), test_utils=checks)
    torch.library.opcheck(kf.grouped_gemm_out, (bf(64, 128), w(4, 256, 128), bf(64, 256), i32(10, 10, 40, 64)),
                          test_utils=checks)
    assert any(n.startswith("gemm_grouped_") for n in b.rec.launched)
    # A repeated problem takes the hot path (no checks beyond pointers); a new out that overlaps
    # an input falls back to the checked path, which refuses it.
    a, wt, offs = bf(64, 128), w(4, 256, 128), i32(10, 10, 40, 64)
    n0 = len(b.rec.launched)
    for _ in range(3):
        assert b.grouped_gemm(a, wt, offs).shape == (64, 256)
    assert len(b.rec.launched) == n0 + 3
    big = bf(64, 512)
    b.grouped_gemm(a, wt, offs, out=big[:, :256])
    with pytest.raises(InputError, match="overlaps"):
        b.grouped_gemm(big[:, :128], wt, offs, out=big[:, 128:384])
    from torch._subclasses.fake_tensor import FakeTensorMode

    # torch.compile traces bundle.grouped_gemm as the op (dynamic sizes: the fake selects only on
    # concrete ones), no graph break
    fn = torch.compile(lambda x, o: b.grouped_gemm(x, wt, o) * 2, fullgraph=True, dynamic=True, backend="eager")
    assert fn(a, offs).shape == (64, 256) and fn(bf(96, 128), i32(10, 10, 40, 96)).shape == (96, 256)
    with FakeTensorMode():  # the fake refuses what the real op refuses, and says why
        with pytest.raises(InputError, match="int32"):
            kf.grouped_gemm(bf(64, 128), w(4, 256, 128), torch.zeros(4, dtype=torch.int64))
        with pytest.raises(NoVariantError):
            kf.grouped_gemm(bf(64, 124), w(4, 256, 124), i32(1, 2, 3, 4))
        out = kf.grouped_gemm(bf(64, 128), w(4, 256, 128), i32(1, 2, 3, 4))
        assert out.shape == (64, 256) and out.dtype == torch.bfloat16


# --- fp8 (e4m3 a and b, row or block scales) -------------------------------------------------------
def e4(*s):
    return torch.randn(*s).to(torch.float8_e4m3fn)


def f32(*s):
    return torch.rand(*s) + 0.5


def blk_a(M, KB, E=None):
    """M-major block scale_a: contiguous (M, KB) or masked (E, M, KB), rows padded to 4."""
    lead = -(-M // 4) * 4
    if E is None:
        return torch.rand(KB, lead)[:, :M].t()
    return torch.rand(E, KB, lead)[:, :, :M].transpose(1, 2)


def fp8_case(masked=False, form="block", E=4, M=64, N=256, K=256):
    a = e4(E, M, K) if masked else e4(M, K)
    b = e4(E, N, K).transpose(1, 2)
    KB, NB = -(-K // 128), -(-N // 128)
    if form == "block":
        sa, sb = blk_a(M, KB, E if masked else None), f32(E, NB, KB)
    else:
        sa, sb = (f32(E, M) if masked else f32(M)), f32(E, N)
    grp = i32(*([M // 2] * E)) if masked else i32(*[M * (g + 1) // E for g in range(E)])
    return a, b, grp, sa, sb


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("form", ["row", "block"])
def test_fp8_check_accepts(masked, form):
    a, b, grp, sa, sb = fp8_case(masked, form)
    r = grouped.check(a, b, None if masked else grp, grp if masked else None, None, None, sa, sb)
    assert r[6][0] == form and r[5] == ((4, 64, 256) if masked else (64, 256))


def _fp8_bad():
    a, b, offs, sa, sb = fp8_case()
    ar, br, _, sar, sbr = fp8_case(form="row")
    am, bm, mm, sam, sbm = fp8_case(masked=True)
    return [
        ((a, b, offs, None, None), "scale_a"),                            # scales missing
        ((a, b, offs, sa, None), "scale_b"),
        ((bf(64, 256), w(4, 256, 256), offs, sa, sb), "float8_e4m3fn grouped GEMM only"),
        ((a, b, offs, sa.double(), sb), "float32"),
        ((a, b, offs, sa, sb.double()), "float32"),
        ((a, b, offs, sa.contiguous(), sb), "M-major"),                   # (M, KB) row-major
        ((a, b, offs, torch.rand(2, 70)[:, :64].t(), sb), "multiple of 4"),  # k-block stride 70
        ((a, b, offs, sa, sb.transpose(1, 2).contiguous().transpose(1, 2)), "K-contiguous"),
        ((a, b, offs, sa[:32], sb), "fit no fp8 grouped form"),
        ((a, b, offs, sa, sb[:3]), "fit no fp8 grouped form"),
        ((ar, br, offs, torch.rand(128)[::2], sbr), "contiguous along the rows"),
        ((ar, br, offs, sar, torch.rand(4, 512)[:, ::2]), "contiguous along N"),
        ((am, bm, mm, torch.rand(520).as_strided((4, 64, 2), (130, 1, 64)), sbm), "group stride"),
    ]


@pytest.mark.parametrize("case", range(13))
def test_fp8_check_refuses(case):
    (a, b, grp, sa, sb), match = _fp8_bad()[case]
    masked = a.dim() == 3
    with pytest.raises(InputError, match=match):
        grouped.check(a, b, None if masked else grp, grp if masked else None, None, None, sa, sb)


def test_fp8_out_dtype():
    a, b, offs, sa, sb = fp8_case()
    with pytest.raises(InputError, match="out must be torch.bfloat16"):
        grouped.check(a, b, offs, None, torch.empty(64, 256, dtype=torch.float16), None, sa, sb)


def test_fp8_choice_and_c_refusals(planned):
    """fx_gemm_grouped_select takes the scale form: block and row scales each pick a variant of
    their form and layout; the host library refuses bad scale layouts on its own."""
    fp8_names = [v["name"] for v in planned.candidates("gemm_grouped") if v["dtypes"]["a"] == "e4m3"]
    if not fp8_names:
        pytest.skip("the test bundle has no fp8 gemm_grouped variant")
    for masked in (False, True):
        for form in ("row", "block"):
            a, b, grp, sa, sb = fp8_case(masked, form, E=8, M=256, N=512, K=640)
            _, E, M, N, K, want, scales = grouped.check(a, b, None if masked else grp, grp if masked else None,
                                                        None, None, sa, sb)
            stride = torch.empty(want, device="meta").stride()
            specs = grouped._specs(a, b, grp, stride, None, masked, M, N, K, E, scales)
            name = grouped.select(planned, "e4m3", masked, specs, M, N, K, E, E if masked else 1, None, 0,
                                  scales=scales)
            entry = planned.manifest["variants"][name]
            assert entry["scale_mode"] == form and entry["grouped"] == ("masked" if masked else "contig")
            assert entry["dtypes"] == {"a": "e4m3", "b": "e4m3", "c": "bf16", "acc": "f32"}
    from factory.runtime.selector import DTYPE, GroupedProblem, _I64x3

    def problem(**kw):
        d = dict(mode=2, sa=0x400000, sa_st=(1, 64, 0), sb=0x500000, sb_st=(2, 1, 4), ab=DTYPE["e4m3"],
                 c=DTYPE["bf16"])
        d.update(kw)
        p = GroupedProblem(d["ab"], d["c"], 0, 64, 256, 256, 2, 0x10000, _I64x3(256, 1, 0), 0x100000,
                           _I64x3(256, 1, 256 * 256), 0x200000, _I64x3(256, 1, 0), 0x300000, None, 0)
        p.scale_mode, p.scale_a, p.scale_b = d["mode"], d["sa"], d["sb"]
        p.scale_a_stride, p.scale_b_stride = _I64x3(*d["sa_st"]), _I64x3(*d["sb_st"])
        return p

    sel = planned.selector
    assert "blksc" in sel.select("gemm_grouped", problem()).name.decode()
    assert "rowsc" in sel.select("gemm_grouped", problem(mode=1, sa_st=(1, 0, 0), sb_st=(1, 0, 256))).name.decode()
    for kw, match in ((dict(mode=0), "scale_mode"), (dict(mode=3), "scale_mode"), (dict(sa=0x400004), "16-byte"),
                      (dict(sa_st=(1, 66, 0)), "multiple of 4"), (dict(sa_st=(2, 64, 0)), "M-major"),
                      (dict(sb_st=(1, 2, 4)), "K-contiguous"), (dict(sb=0x200000), "overlaps"),
                      (dict(c=DTYPE["f16"]), "e4m3"), (dict(ab=DTYPE["bf16"]), "scale_mode"),
                      (dict(mode=1, sa_st=(2, 0, 0), sb_st=(1, 0, 256)), "contiguous along the rows")):
        with pytest.raises(InputError, match=match):
            sel.select("gemm_grouped", problem(**kw))


def test_fp8_variants_sass(planned):
    """The fp8 grouped cubins: fp8 WGMMA (QGMMA E4M3) and no local-memory spills."""
    entries = [v for v in planned.candidates("gemm_grouped") if v["dtypes"]["a"] == "e4m3"]
    if not entries:
        pytest.skip("the test bundle has no fp8 gemm_grouped variant")
    for v in entries:
        assert v["sass"]["QGMMA"] > 0 and v["sass"]["HGMMA"] == 0, v["name"]
        assert v["sass"]["LDL"] == 0 and v["sass"]["STL"] == 0, v["name"]
        assert any("QGMMA" in r for r in v["sass_requirements"])


@pytest.mark.parametrize("form", ["row", "block"])
def test_fp8_quantizers_grouped(form):
    from factory.runtime import fp8

    x = torch.randn(3, 40, 300)
    q, s = fp8.quantize_grouped_a(x, form)
    assert q.dtype == torch.float8_e4m3fn and q.shape == x.shape
    if form == "block":
        assert s.shape == (3, 40, 3) and s.stride()[1] == 1 and s.stride()[2] % 4 == 0 and s.stride()[0] % 4 == 0
    assert torch.allclose(fp8.dequantize_grouped(q, s, form), x, rtol=0.07, atol=1e-3)
    q2, s2 = fp8.quantize_grouped_a(x[0], form)
    assert torch.allclose(fp8.dequantize_grouped(q2, s2, form), x[0], rtol=0.07, atol=1e-3)
    wt = torch.randn(3, 200, 300)
    qw, sw = fp8.quantize_grouped_b(wt, form)
    assert sw.shape == ((3, 200) if form == "row" else (3, 2, 3))
    assert torch.allclose(fp8.dequantize_grouped(qw, sw, form, weights=True), wt, rtol=0.07, atol=1e-3)
    # the grouped GEMM takes them as they come out (b = q.transpose(1, 2))
    offs = i32(10, 25, 40)
    r = grouped.check(q2, qw.transpose(1, 2), offs, None, None, None, s2, sw)
    assert r[6][0] == form


def test_fp8_torch_ops_and_reference(ops):
    """The ops with scales (schema, fake = real checks, the hot path keyed on the scales), and the
    float32 reference of the dequantized operands that the GPU tests judge by."""
    b, kf = ops
    if not any(v["dtypes"]["a"] == "e4m3" for v in b.candidates("gemm_grouped")):
        pytest.skip("the test bundle has no fp8 gemm_grouped variant")
    checks = ("test_autograd_registration", "test_faketensor")  # (test_schema multiplies e4m3 on the CPU)
    for masked, form in ((True, "block"), (False, "row")):
        a, wt, grp, sa, sb = fp8_case(masked, form)
        g = dict(masked_m=grp) if masked else dict(offs=grp)
        torch.library.opcheck(kf.grouped_gemm, (a, wt), dict(g, scale_a=sa, scale_b=sb), test_utils=checks)
        n0 = len(b.rec.launched)
        for _ in range(2):
            out = b.grouped_gemm(a, wt, **g, scale_a=sa, scale_b=sb)
            assert out.dtype == torch.bfloat16
        assert len(b.rec.launched) == n0 + 2 and "e4m3" in b.rec.launched[-1]
        with pytest.raises(InputError, match="scale_b"):
            b.grouped_gemm(a, wt, **g, scale_a=sa)
    # reference: block scales per k-block of a's rows and per 128x128 block of b[g]
    a, wt, offs, sa, sb = fp8_case(False, "block", E=2, M=8, N=256, K=256)
    ref = grouped.reference(a, wt, offs=offs, scale_a=sa, scale_b=sb)
    r, k, g = 5, 130, 1  # row 5 is group 1's (offs 4, 8); column 130 is n-block 1; k 130 is k-block 1
    want = sum(float(a[r, kk].float()) * float(sa[r, kk // 128]) * float(wt[g, kk, k].float()) * float(sb[g, 1, kk // 128])
               for kk in range(256))
    assert abs(float(ref[r, k]) - want) <= 1e-4 * max(1.0, abs(want))
    # group by group (no float32 copy of the expert stack): the product of the whole dequantized operands
    from factory.runtime import fp8
    for masked, form in ((False, "row"), (True, "block"), (True, "row")):
        a, wt, grp, sa, sb = fp8_case(masked, form, E=3, M=24, N=136, K=272)
        g = dict(masked_m=grp) if masked else dict(offs=grp)
        ref = grouped.reference(a, wt, **g, scale_a=sa, scale_b=sb)
        af = fp8.dequantize_grouped(a, sa.reshape(a.shape[:-1]) if form == "row" else sa, form)
        bf = fp8.dequantize_grouped(wt.transpose(1, 2), sb, form, weights=True).transpose(1, 2)
        want = grouped.reference(af, bf, **g)
        assert torch.equal(torch.isnan(ref), torch.isnan(want))
        assert torch.allclose(ref.nan_to_num(), want.nan_to_num(), rtol=1e-5, atol=1e-5), (masked, form)


def test_tail_forms_contract():
    """tail_half / tail_solo: only the 128-row coop bf16 tiles without a cluster take them (one form
    at a time); the full tier holds both on the contiguous 128x256 and 128x128 tiles, the default
    tier neither."""
    from factory.atoms.targets import get_target
    from factory.gemm.sm90_grouped import GemmGroupedSm90, enumerate_sm90_grouped

    base = dict(target="sm_90a", layout="contig", tile=(128, 256, 64), schedule="coop")
    assert GemmGroupedSm90(**base, tail_half=True).can_implement() is None
    assert GemmGroupedSm90(**base, tail_solo=True).can_implement() is None
    refused = [dict(base, tail_half=True, tail_solo=True), dict(base, tail_solo=True, pair=True),
               dict(base, tile=(64, 128, 64), schedule="ws", tail_half=True),
               dict(base, tile=(128, 128, 128), ab="e4m3", row_scale=True, tail_solo=True)]
    for kw in refused:
        assert GemmGroupedSm90(**kw).can_implement() is not None, kw
    tail = lambda tier: {v.name.rsplit("_", 1)[1] + str(v.tile[1])  # noqa: E731
                         for v in enumerate_sm90_grouped(get_target("sm_90a"), tier) if v.tail_half or v.tail_solo}
    assert tail("full") == {"th256", "ts256", "th128", "ts128"}
    assert tail("default") == set()
