"""The packed-weight decode GEMM (gemm/decode.py, runtime/packed.py): the packing, selection and
the launch path here (no GPU: a recording launcher), the SASS it must have, and on a GPU its
results against float32 (skipped without one)."""

from __future__ import annotations

import re

import pytest

import selection_lib as sl
import torch

from conftest import needs_gpu
from factory.runtime import Bundle, NoVariantError
from factory.runtime import packed as rpacked


def _fp8(*shape, gen=None, device="cpu"):
    return (torch.randn(*shape, generator=gen, device=device) * 4).to(torch.float8_e4m3fn)


def test_pack_b_layout_and_round_trip():
    """[nb, kc, 4 r + i, j] = B[8 nb + r, 64 kc + 16 i + j], as the manifest states."""
    gen = torch.Generator().manual_seed(0)
    b = _fp8(96, 256, gen=gen)
    p = rpacked.pack_b(b)
    assert p.data.shape == (12, 4, 32, 16) and p.data.is_contiguous() and p.shape == (96, 256)
    bu, pu = b.view(torch.uint8), p.data.view(torch.uint8)
    for nb, kc, r, i, j in [(0, 0, 0, 0, 0), (3, 1, 5, 2, 7), (11, 3, 7, 3, 15), (6, 2, 1, 0, 9)]:
        assert pu[nb, kc, 4 * r + i, j] == bu[8 * nb + r, 64 * kc + 16 * i + j]
    assert torch.equal(rpacked.unpack_b(p).view(torch.uint8), bu)
    with pytest.raises(ValueError):
        rpacked.pack_b(b.float())
    with pytest.raises(ValueError):
        rpacked.pack_b(b[:, :100])


def _entry(name, rows, ck, ctas_per_sm, early_b=False):
    return {"name": name, "op": "gemm", "family": "decode", "target": "sm_90", "max_m": 16, "rows_per_cta": rows,
            "cluster": [1, ck], "ctas_per_sm": ctas_per_sm, "config": {"early_b": early_b},
            "dtypes": {"a": "e4m3", "b": "e4m3", "c": "bf16", "acc": "f32"}, "layout": {"a": "k", "b": "k", "c": "n"}}


def test_pick_prefers_the_most_ctas_in_one_wave_and_early_b_in_one_wave():
    """The rule measured on the H100 (132 SMs; 2-CTA clusters of two 256-thread CTAs per SM:
    264 CTAs at once): N = 4096 -> 32-row CTAs (256 CTAs), 6144 and 8192 -> 64-row CTAs (192 and
    256; 32-row ones would be 384/512: two waves), 10240 -> nothing is one wave: the most CTAs.
    The host library's rule (fx_gemm_packed_select) on synthetic entries."""
    plain = [_entry("r32", 32, 2, 2), _entry("r64", 64, 2, 2)]
    lib = sl.Lib(plain, sm_count=132)
    for n, want in ((4096, "r32"), (2048, "r32"), (6144, "r64"), (8192, "r64"), (10240, "r32")):
        assert lib.packed(16, n, 2048) == want, n
        assert lib.packed(16, n, 2048, b_constant=True) == want, n  # no early_b variant built
    # b_constant: the early_b twin where the grid is one wave, not where it is several.
    both = sl.Lib(plain + [_entry("r32_eb", 32, 2, 2, True), _entry("r64_eb", 64, 2, 2, True)], sm_count=132)
    assert both.packed(16, 4096, 2048, b_constant=True) == "r32_eb"
    assert both.packed(16, 8192, 2048, b_constant=True) == "r64_eb"
    assert both.packed(16, 10240, 2048, b_constant=True) == "r32"
    assert both.packed(16, 4096, 2048) == "r32"  # never an early_b variant without b_constant
    one = sl.Lib(plain + [_entry("r64_eb", 64, 2, 2, True)], sm_count=132)
    assert one.packed(16, 4096, 2048, b_constant=True) == "r32"  # no twin: the variant itself
    # another device: 114 SMs hold 228 CTAs, so N = 4096 is one wave only for 64-row CTAs
    assert sl.Lib(plain, sm_count=114).packed(16, 4096, 2048) == "r64"


def test_packed_launch_path_without_a_gpu(test_bundle, monkeypatch):
    """bundle.gemm(a, bundle.pack_b(w)) selects a decode variant (its early_b twin with
    b_constant=True); the plain path never selects one; problems no decode variant takes raise
    NoVariantError naming the reason."""
    from factory.runtime import gemm as rgemm

    b = Bundle.open(test_bundle, capability=(9, 0), device={"name": "planned H100", "sm_count": 132})
    b.simulate(None)  # CPU tensors; launch itself is replaced below
    launched = []
    monkeypatch.setattr(Bundle, "launch", lambda self, name, args, stream=None, checked=False, device=None:
                        launched.append((name, args)))
    x8, w8 = _fp8(16, 2048), _fp8(256, 2048)
    sa, sb = torch.tensor([0.5]), torch.tensor([2.0])
    pw = b.pack_b(w8)
    out = b.gemm(x8, pw, scale_a=sa, scale_b=sb)
    assert out.shape == (16, 256) and out.dtype == torch.bfloat16
    name, args = launched[-1]
    entry = b.manifest["variants"][name]
    assert entry["family"] == "decode" and not entry["config"]["early_b"]
    assert [a[0] for a in args] == [x8.data_ptr(), pw.data.data_ptr(), out.data_ptr(), sa.data_ptr(), sb.data_ptr()]
    b.gemm(x8[:1], pw, scale_a=sa, scale_b=sb, b_constant=True)
    assert b.manifest["variants"][launched[-1][0]]["config"]["early_b"]
    # The plain path: never a decode variant (their B is packed).
    plain = rgemm.select(b, *(rgemm.rkl_spec(t, "x") for t in (x8, w8, out)), "e4m3", "bf16",
                         [(sa.data_ptr(), (1,), (1,))] * 2)
    assert b.manifest["variants"][plain]["family"] != "decode"
    with pytest.raises(NoVariantError, match="decode"):
        b.gemm(_fp8(17, 2048), pw)  # M > 16
    with pytest.raises(NoVariantError, match="K"):
        b.gemm(_fp8(4, 1024), b.pack_b(_fp8(256, 1024)))  # K not a multiple of the variant's batches
    with pytest.raises(ValueError):
        b.gemm(x8[:, :1024], pw)


def test_decode_sass(test_bundle):
    """Every decode cubin has its SASS requirements (HMMA from fp8 mma.sync, 16-byte loads, the
    PDL wait, DSMEM stores); the weight loads come before the PDL wait only in early_b ones."""
    from factory.compiler import cubin as cb
    from factory.gemm.decode import EARLY_LDG_SASS

    b = Bundle.open(test_bundle, capability=(9, 0))
    entries = [v for v in b.manifest["variants"].values() if v.get("family") == "decode"]
    assert {bool(v["config"]["early_b"]) for v in entries} == {False, True}
    for v in entries:
        sass = cb.disassemble(test_bundle / v["files"]["cubin"]["path"])
        for req in v["sass_requirements"]:
            assert re.search(req, sass), (v["name"], req)
        assert bool(re.search(EARLY_LDG_SASS, sass)) == v["config"]["early_b"], v["name"]
        assert v["sass"]["LDL"] == v["sass"]["STL"] == 0 and v["resources"]["registers"] <= 128


# --- on the GPU ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def gbundle(gpu_bundle):
    b = Bundle.open(gpu_bundle)
    if not any(v.get("family") == "decode" for v in b.candidates("gemm")):
        pytest.skip(f"no decode variant for this GPU in the bundle ({b.describe_contents('gemm')})")
    return b


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("M,N,K", [(1, 4096, 4096), (16, 4096, 4096), (5, 2048, 8192), (3, 6144, 4096),
                                   (16, 8192, 2048), (9, 256, 14336)])
@pytest.mark.parametrize("b_constant", [False, True])
def test_packed_matches_float32(gbundle, M, N, K, b_constant):
    from factory import testing

    gen = torch.Generator(device="cuda").manual_seed(M * 7 + N + K)
    a, w = _fp8(M, K, gen=gen, device="cuda"), _fp8(N, K, gen=gen, device="cuda")
    sa, sb = torch.rand(1, device="cuda") + 0.5, torch.rand(1, device="cuda") + 0.5
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    gbundle.gemm(a, gbundle.pack_b(w), out, scale_a=sa, scale_b=sb, b_constant=b_constant)
    torch.cuda.synchronize()
    ref = (a.float() @ w.float().t()) * float(sa * sb)
    assert not torch.isnan(out).any()
    assert testing.rel_error(out, ref) < testing.TOLERANCE["e4m3"]


@needs_gpu
@pytest.mark.gpu
def test_every_decode_variant_and_chained_calls(gbundle):
    """Every decode variant by name; then dependent calls back to back (PDL: the second reads
    the first's output, the third overwrites the first's input), eager and in a CUDA graph
    replayed on new data — the early_b variants load their weights before the wait, never the
    activations."""
    from factory import testing

    M, N, K = 16, 4096, 4096
    gen = torch.Generator(device="cuda").manual_seed(11)
    w1 = gbundle.pack_b(_fp8(N, K, gen=gen, device="cuda"))
    w2 = gbundle.pack_b(_fp8(K, N, gen=gen, device="cuda"))
    W1, W2 = rpacked.unpack_b(w1).float(), rpacked.unpack_b(w2).float()
    s = torch.full((1,), 1 / 64, device="cuda")  # keeps the chained values in e4m3 range
    for v in [v for v in gbundle.candidates("gemm") if v.get("family") == "decode"]:
        name = v["name"]
        x = _fp8(M, K, gen=gen, device="cuda")
        y1 = torch.full((M, N), float("nan"), dtype=torch.float8_e4m3fn, device="cuda")
        y2 = torch.full((M, K), float("nan"), dtype=torch.float8_e4m3fn, device="cuda")
        t1 = torch.empty((M, N), dtype=torch.bfloat16, device="cuda")
        t2 = torch.empty((M, K), dtype=torch.bfloat16, device="cuda")

        def chain():
            gbundle.gemm(x, w1, t1, scale_a=s, scale_b=s, variant=name)
            y1.copy_(t1)
            gbundle.gemm(y1, w2, t2, scale_a=s, scale_b=s, variant=name)  # reads y1
            y2.copy_(t2)
            gbundle.gemm(y2, w1, t1, scale_a=s, scale_b=s, variant=name)  # overwrites t1, reads y2

        def check(x0):
            r1 = ((x0.float() @ W1.t()) / 4096).to(torch.bfloat16).to(torch.float8_e4m3fn).float()
            r2 = (r1 @ W2.t()) / 4096
            assert testing.rel_error(t2, r2) < 3e-2, name
            assert testing.rel_error(t1, (y2.float() @ W1.t()) / 4096) < testing.TOLERANCE["e4m3"], name

        x0 = x.clone()
        chain()
        torch.cuda.synchronize()
        check(x0)
        g = testing.capture_on_side_stream(chain)
        for _ in range(2):
            x.copy_(_fp8(M, K, gen=gen, device="cuda"))
            t1.fill_(float("nan"))
            t2.fill_(float("nan"))
            x0 = x.clone()
            g.replay()
            torch.cuda.synchronize()
            check(x0)
